// Complex (Hermitian) Cholesky and triangular solves, on the same XLA ops as
// the real rules (linalg_decompositions.cpp): stablehlo.cholesky (XLA's
// expander conjugates for complex types) and stablehlo.triangular_solve.
//  - linalg_cholesky_ex / cholesky: the Hermitian matrix the lower (upper)
//    triangle stands for, with the diagonal's real part only (what LAPACK's
//    cpotrf reads); info from a complex elimination when it failed;
//  - linalg_solve_triangular / triangular_solve: as the real rules
//    (triangular_solve's transpose is a plain transpose, as cpotrs' 'T');
//  - _cholesky_solve_helper / cholesky_inverse: A = L L^H (U^H U); the L^H
//    solves are transposed solves with conj(L);
//  - geqrf / linalg_householder_product (orgqr) / linalg_qr / ormqr: XLA's
//    "Qr" and "ProductOfElementaryHouseholderReflectors" custom calls.
#include <algorithm>
#include <cmath>
#include <string>

#include "lowering/linalg_common.h"

namespace torch_tpu::lowering::linalg {
namespace {

int64_t Rows(const Value& v) { return v.shape()[v.rank() - 2]; }

Value Conj(Builder& b, Value x) { return b.Complex(b.Real(x), b.Unary("negate", b.Imag(x))); }

// A complex64 / complex128 matrix arg, else Unsupported.
Value ComplexMatrix(const Value& v, const std::string& op) {
  if (v.dtype() != E::C64 && v.dtype() != E::C128) throw Unsupported(op + ": complex64/128 only");
  if (v.rank() < 2) throw Unsupported(op + " of a tensor of rank < 2");
  return v;
}

// The Hermitian matrix of x's lower (upper) triangle; the diagonal real.
Value Hermitian(Builder& b, Value x, bool from_lower) {
  Value strict = Masked(b, TriangleMask(b, x.shape(), from_lower ? "GT" : "LT"), x);
  Value diag = Masked(b, TriangleMask(b, x.shape(), "EQ"), b.Real(x));
  Value d = b.Complex(diag, b.Splat(diag.dtype(), 0, diag.shape()));
  return b.Binary("add", b.Binary("add", strict, Conj(b, MT(b, strict))), d);
}

// cpotrf's info for Hermitian h: the order (1-based) of the first leading
// minor that is not positive definite, 0 if none (elimination pivots).
Value FirstNonPositiveMinor(Builder& b, Value h) {
  int64_t r = h.rank(), n = Rows(h);
  std::vector<int64_t> batch = BatchOf(h.shape());
  ElementType pt = hlo::RealPart(h.dtype());
  auto out = ForLoop(b, 0, n, {h, b.Splat(E::I32, 0, batch)}, [&](Value k, const std::vector<Value>& v) {
    Value m = v[0], info = v[1];
    const std::vector<int64_t>& shape = m.shape();
    Value row = b.Iota(TensorType{E::I64, shape}, r - 2);
    Value col = b.Iota(TensorType{E::I64, shape}, r - 1);
    Value row_k = MaskedSum(b, b.Compare("EQ", row, Bcast(b, k, shape)), m, r - 2);  // m[k, :]
    Value d = b.Real(TakeLast(b, row_k, k));
    Value ok = b.Compare("GT", d, b.Splat(pt, 0, batch));  // false for NaN too
    Value first = b.Binary("and", b.Unary("not", ok), b.Compare("EQ", info, b.Splat(E::I32, 0, batch)));
    Value k1 = b.Convert(b.Binary("add", Bcast(b, k, batch), b.Splat(E::I64, 1, batch)), E::I32);
    info = b.Select(first, k1, info);
    Value dc = b.Complex(d, b.Splat(pt, 0, batch));
    Value l = b.Binary("divide", row_k, b.BroadcastInDim(dc, row_k.shape(), Iota(r - 2)));
    // m[i, j] -= conj(m[k, i]) m[k, j] / m[k, k]
    Value outer = b.Binary("multiply", b.BroadcastInDim(Conj(b, row_k), shape, Without(r, r - 1)),
                           b.BroadcastInDim(l, shape, Without(r, r - 2)));
    Value trailing = b.Binary("and", b.Compare("GT", row, Bcast(b, k, shape)),
                              b.Compare("GT", col, Bcast(b, k, shape)));
    m = b.Select(trailing, b.Binary("subtract", m, outer), m);
    return std::vector<Value>{m, info};
  });
  return out[1];
}

// L (lower) or U (upper) with A = L L^H = U^H U, and cpotrf's info.
std::pair<Value, Value> ComplexCholeskyOf(Builder& b, Value a, bool upper) {
  Value h = Hermitian(b, a, !upper);
  Value l = Masked(b, TriangleMask(b, h.shape(), "GE"), b.Cholesky(h, true));
  Value d = b.Real(Diagonal(b, l));
  ElementType pt = d.dtype();
  Value good = b.Binary("and", b.Compare("GT", d, b.Splat(pt, 0, d.shape())),
                        b.Compare("LT", d, b.Splat(pt, INFINITY, d.shape())));
  std::vector<int64_t> batch = BatchOf(a.shape());
  Value info = b.If(
      AllTrue(b, good), {TensorType{E::I32, batch}},
      [&] { return std::vector<Value>{b.Splat(E::I32, 0, batch)}; },
      [&] { return std::vector<Value>{FirstNonPositiveMinor(b, h)}; })[0];
  return {upper ? Conj(b, MT(b, l)) : l, info};
}

std::vector<Value> CholeskyExRule(Context& c, const std::vector<Arg>& a) {
  if (a.size() > 2 && a[2].i != 0) throw Unsupported("linalg_cholesky_ex with check_errors=True");
  Value m = ComplexMatrix(a.at(0).tensor, "linalg_cholesky_ex");
  if (m.type.numel() == 0) return {Zeros(c.b, Out(c, 0)), Zeros(c.b, Out(c, 1))};
  auto [l, info] = ComplexCholeskyOf(c.b, m, a.size() > 1 && a[1].i != 0);
  return {l, info};
}

std::vector<Value> CholeskyRule(Context& c, const std::vector<Arg>& a) {
  Value m = ComplexMatrix(a.at(0).tensor, "cholesky");
  if (m.type.numel() == 0) return {Zeros(c.b, Out(c, 0))};
  return {ComplexCholeskyOf(c.b, m, a.size() > 1 && a[1].i != 0).first};
}

// A broadcast to the batch of `out` ([..., n, n]) and B to out's shape.
std::pair<Value, Value> Broadcast2(Builder& b, Value A, Value B, const TensorType& out) {
  int64_t n = Rows(A);
  return {b.BroadcastTo(b.Convert(A, out.dtype), With(BatchOf(out.shape), {n, n})),
          b.BroadcastTo(b.Convert(B, out.dtype), out.shape)};
}

// linalg_solve_triangular(A, B, *, upper, left, unitriangular)
std::vector<Value> SolveTriangularRule(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  ComplexMatrix(a.at(0).tensor, "linalg_solve_triangular");
  if (out.numel() == 0) return {Zeros(c.b, out)};
  bool upper = a.at(2).i != 0, left = a.at(3).i != 0, unit = a.at(4).i != 0;
  auto [A, B] = Broadcast2(c.b, a.at(0).tensor, a.at(1).tensor, out);
  return {c.b.TriangularSolve(A, B, left, !upper, unit, false)};
}

// triangular_solve(B, A, upper, transpose, unitriangular) -> (X, A clone)
std::vector<Value> TriangularSolveRule(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  ComplexMatrix(a.at(1).tensor, "triangular_solve");
  bool upper = a.at(2).i != 0, transpose = a.at(3).i != 0, unit = a.at(4).i != 0;
  Value A = c.b.BroadcastTo(c.b.Convert(a.at(1).tensor, Out(c, 1).dtype), Out(c, 1).shape);
  if (out.numel() == 0) return {Zeros(c.b, out), A};
  auto [Ab, B] = Broadcast2(c.b, a.at(1).tensor, a.at(0).tensor, out);
  return {c.b.TriangularSolve(Ab, B, true, !upper, unit, transpose), A};
}

// Solves (L L^H) x = rhs (lower) or (U^H U) x = rhs (upper).
Value CholeskySolve(Builder& b, Value L, Value rhs, bool upper) {
  Value lc = Conj(b, L);
  if (!upper) {  // L y = rhs, L^H x = y (L^H = conj(L)^T)
    Value y = b.TriangularSolve(L, rhs, true, true, false, false);
    return b.TriangularSolve(lc, y, true, true, false, true);
  }
  // U^H y = rhs (U^H = conj(U)^T), U x = y
  Value y = b.TriangularSolve(lc, rhs, true, false, false, true);
  return b.TriangularSolve(L, y, true, false, false, false);
}

// _cholesky_solve_helper(B, L, upper)
std::vector<Value> CholeskySolveRule(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  ComplexMatrix(a.at(1).tensor, "cholesky_solve");
  if (out.numel() == 0) return {Zeros(c.b, out)};
  auto [L, B] = Broadcast2(c.b, a.at(1).tensor, a.at(0).tensor, out);
  return {CholeskySolve(c.b, L, B, a.at(2).i != 0)};
}

std::vector<Value> CholeskyInverseRule(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  Value L = ComplexMatrix(a.at(0).tensor, "cholesky_inverse");
  if (out.numel() == 0) return {Zeros(c.b, out)};
  Value eye = Eye(c.b, L.dtype(), BatchOf(L.shape()), Rows(L));
  return {CholeskySolve(c.b, L, eye, a.size() > 1 && a[1].i != 0)};
}


// ---------------------------------------------------------------- QR
// XLA's QrExpander writes LAPACK's cgeqrf format for complex types too
// (H_i = I - tau_i v_i v_i^H, real diagonal of R); ormqr's transpose is the
// conjugate transpose (torch.ormqr: "Q is conjugate transposed").

int64_t Cols(const Value& v) { return v.shape()[v.rank() - 1]; }

Value SliceLast(Builder& b, Value x, int64_t rows, int64_t cols) {
  int64_t r = x.rank();
  std::vector<int64_t> start(r, 0), limit = x.shape(), ones(r, 1);
  limit[r - 2] = rows;
  limit[r - 1] = cols;
  return b.Slice(x, start, limit, ones);
}

// Resizes the last dim of x to n: sliced, or padded with zeros.
Value ResizeLast(Builder& b, Value x, int64_t n) {
  int64_t r = x.rank(), have = x.shape().back();
  if (have == n) return x;
  std::vector<int64_t> zero(r, 0);
  if (have > n) {
    std::vector<int64_t> limit = x.shape(), ones(r, 1);
    limit.back() = n;
    return b.Slice(x, zero, limit, ones);
  }
  std::vector<int64_t> high(r, 0);
  high.back() = n - have;
  return b.Pad(x, b.Constant(x.dtype(), 0), zero, high, zero);
}

std::pair<Value, Value> GeqrfOf(Builder& b, Value x) {
  std::vector<int64_t> taus = With(BatchOf(x.shape()), {std::min(Rows(x), Cols(x))});
  auto r = b.CustomCall("Qr", {x}, {x.type, TensorType{x.dtype(), taus}});
  return {r[0], r[1]};
}

// Q with q_cols columns from packed reflectors a [..., m, n] and taus.
Value QOf(Builder& b, Value a, Value taus, int64_t q_cols) {
  Value v = ResizeLast(b, SliceLast(b, a, Rows(a), std::min(Cols(a), q_cols)), q_cols);
  return b.CustomCall("ProductOfElementaryHouseholderReflectors", {v, ResizeLast(b, taus, q_cols)},
                      {v.type})[0];
}

std::vector<Value> GeqrfRule(Context& c, const std::vector<Arg>& a) {
  Value x = ComplexMatrix(a.at(0).tensor, "geqrf");
  if (x.type.numel() == 0) return {Zeros(c.b, Out(c, 0)), Zeros(c.b, Out(c, 1))};
  auto [packed, taus] = GeqrfOf(c.b, x);
  return {packed, taus};
}

std::vector<Value> HouseholderProductRule(Context& c, const std::vector<Arg>& a) {
  Value x = ComplexMatrix(a.at(0).tensor, "linalg_householder_product");
  if (x.type.numel() == 0) return {Zeros(c.b, Out(c, 0))};
  return {QOf(c.b, x, c.b.Convert(a.at(1).tensor, x.dtype()), Cols(x))};
}

// linalg_qr(A, mode) -> (Q, R)
std::vector<Value> QrRule(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value x = ComplexMatrix(a.at(0).tensor, "linalg_qr");
  std::string mode = a.size() > 1 && a[1].kind == Arg::Kind::String ? a[1].s : "reduced";
  if (x.type.numel() == 0) return {Zeros(b, Out(c, 0)), Zeros(b, Out(c, 1))};
  int64_t m = Rows(x), n = Cols(x), k = std::min(m, n);
  auto [packed, taus] = GeqrfOf(b, x);
  Value r = SliceLast(b, packed, mode == "complete" ? m : k, n);
  r = Masked(b, TriangleMask(b, r.shape(), "LE"), r);
  Value q = mode == "r" ? Zeros(b, Out(c, 0)) : QOf(b, packed, taus, mode == "complete" ? m : k);
  return {q, r};
}

// ormqr(A, tau, C, left, transpose): Q (or Q^H) times C, or C times it.
std::vector<Value> OrmqrRule(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  Value x = ComplexMatrix(a.at(0).tensor, "ormqr");
  if (out.numel() == 0) return {Zeros(b, out)};
  bool left = a.at(3).i != 0, transpose = a.at(4).i != 0;
  std::vector<int64_t> batch = BatchOf(out.shape);
  int64_t m = Rows(x);
  Value taus = b.Convert(a.at(1).tensor, x.dtype());
  x = b.BroadcastTo(x, With(batch, {m, Cols(x)}));
  taus = b.BroadcastTo(taus, With(batch, {taus.shape().back()}));
  Value q = QOf(b, x, taus, m);
  if (transpose) q = Conj(b, MT(b, q));
  Value other = b.BroadcastTo(b.Convert(a.at(2).tensor, out.dtype), out.shape);
  return {left ? MatMul(b, q, other) : MatMul(b, other, q)};
}

const bool registered = [] {
  RegisterComplex("linalg_cholesky_ex", CholeskyExRule);
  RegisterComplex("cholesky", CholeskyRule);
  RegisterComplex("linalg_solve_triangular", SolveTriangularRule);
  RegisterComplex("triangular_solve", TriangularSolveRule);
  RegisterComplex("_cholesky_solve_helper", CholeskySolveRule);
  RegisterComplex("cholesky_inverse", CholeskyInverseRule);
  RegisterComplex("geqrf", GeqrfRule);
  RegisterComplex("linalg_householder_product", HouseholderProductRule);
  RegisterComplex("orgqr", HouseholderProductRule);
  RegisterComplex("linalg_qr", QrRule);
  RegisterComplex("ormqr", OrmqrRule);
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering::linalg
