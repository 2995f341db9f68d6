// Complex (Hermitian) Cholesky and triangular solves, on the same XLA ops as
// the real rules (linalg_decompositions.cpp): stablehlo.cholesky (XLA's
// expander conjugates for complex types) and stablehlo.triangular_solve.
//  - linalg_cholesky_ex / cholesky: the Hermitian matrix the lower (upper)
//    triangle stands for, with the diagonal's real part only (what LAPACK's
//    cpotrf reads); info from a complex elimination when it failed;
//  - linalg_solve_triangular / triangular_solve: as the real rules
//    (triangular_solve's transpose is a plain transpose, as cpotrs' 'T');
//  - _cholesky_solve_helper / cholesky_inverse: A = L L^H (U^H U); the L^H
//    solves are transposed solves with conj(L).
// QR, eigh and SVD: complex_qr_svd.cpp.
#include <cmath>
#include <string>

#include "lowering/complex_matrix.h"

namespace torch_tpu::lowering::linalg {
namespace {

using namespace complex_matrix;  // NOLINT(build/namespaces)
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

const bool registered = [] {
  RegisterComplex("linalg_cholesky_ex", CholeskyExRule);
  RegisterComplex("cholesky", CholeskyRule);
  RegisterComplex("linalg_solve_triangular", SolveTriangularRule);
  RegisterComplex("triangular_solve", TriangularSolveRule);
  RegisterComplex("_cholesky_solve_helper", CholeskySolveRule);
  RegisterComplex("cholesky_inverse", CholeskyInverseRule);
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering::linalg
