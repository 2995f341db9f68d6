// Complex QR, eigh and SVD on XLA's expanders (custom calls, as the real
// rules of linalg_decompositions.cpp):
//  - geqrf / linalg_householder_product (orgqr) / linalg_qr / ormqr: "Qr" and
//    "ProductOfElementaryHouseholderReflectors" (LAPACK's cgeqrf format);
//  - _linalg_eigh without eigenvectors (eigvalsh, matrix_rank(hermitian))
//    and _linalg_svd (svd, svdvals, pinv, matrix_rank, cond, nuclear norm,
//    svd/pca_lowrank): "Eigh" on Hermitian matrices, the SVD from
//    [[0, A], [A^H, 0]] as the real rule;
//  - linalg_lstsq: driver gels by QR, R x = Q^H B (tall) or the minimum-norm
//    x = Q (R^H \ B) from A^H = Q R (wide); gelsy / gelss / gelsd by the SVD
//    (minimum norm, singular values under rcond * max dropped, the rank).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "lowering/complex_matrix.h"

namespace torch_tpu::lowering::linalg {
namespace {

using namespace complex_matrix;  // NOLINT(build/namespaces)
// ---------------------------------------------------------------- QR
// XLA's QrExpander writes LAPACK's cgeqrf format for complex types too
// (H_i = I - tau_i v_i v_i^H, real diagonal of R); ormqr's transpose is the
// conjugate transpose (torch.ormqr: "Q is conjugate transposed").

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

// ---------------------------------------------------------------- eigh, SVD
// XLA's "Eigh" expander (cyclic Jacobi) takes Hermitian complex matrices:
// eigenvalues real ascending, eigenvectors complex.

std::pair<Value, Value> EighOf(Builder& b, Value h) {
  ElementType pt = hlo::RealPart(h.dtype());
  double eps = pt == E::F64 ? std::numeric_limits<double>::epsilon()
                            : std::numeric_limits<float>::epsilon();
  char config[64];
  std::snprintf(config, sizeof(config), "1,1,100,%.17g", eps);
  std::vector<int64_t> w_shape = With(BatchOf(h.shape()), {Rows(h)});
  auto r = b.CustomCall("Eigh", {h}, {h.type, TensorType{pt, w_shape}}, config);
  return {r[1], r[0]};
}

// _linalg_eigh(A, UPLO, compute_v): eigenvalues only (eigvalsh,
// matrix_rank(hermitian=True)). Eigenvectors are unique up to a phase per
// column and LAPACK's cheevd picks its own: with compute_v the op stays on
// the CPU fallback, so that eigh's vectors equal CPU's.
std::vector<Value> EighRule(Context& c, const std::vector<Arg>& a) {
  Value x = ComplexMatrix(a.at(0).tensor, "_linalg_eigh");
  if (Rows(x) != Cols(x)) throw Unsupported("_linalg_eigh of a non-square matrix");
  bool lower = !(a.size() > 1 && a[1].kind == Arg::Kind::String && a[1].s == "U");
  bool compute_v = !(a.size() > 2 && a[2].kind == Arg::Kind::Bool && a[2].i == 0);
  if (compute_v) throw Unsupported("_linalg_eigh: complex eigenvectors (LAPACK's phases) on CPU");
  if (x.type.numel() == 0) return {Zeros(c.b, Out(c, 0)), Zeros(c.b, Out(c, 1))};
  return {EighOf(c.b, Hermitian(c.b, x, lower)).first, Zeros(c.b, Out(c, 1))};
}

// x's columns times the phases of the diagonal of R in x = Q R: Q with
// R's diagonal made real positive, exactly orthonormal, completed to cols.
Value Orthonormalize(Builder& b, Value x, int64_t cols) {
  auto [packed, taus] = GeqrfOf(b, x);
  Value q = QOf(b, packed, taus, cols);
  Value d = Diagonal(b, SliceLast(b, packed, Cols(x), Cols(x)));  // [..., k]
  Value mag = b.Abs(d);
  ElementType pt = mag.dtype();
  Value zero = b.Compare("EQ", mag, b.Splat(pt, 0, mag.shape()));
  Value safe = b.Select(zero, b.Splat(pt, 1, mag.shape()), mag);
  Value phase = b.Binary("divide", d, b.Complex(safe, b.Splat(pt, 0, mag.shape())));
  phase = b.Select(zero, b.Splat(d.dtype(), 1, d.shape()), phase);
  std::vector<int64_t> lo(phase.rank(), 0), hi(phase.rank(), 0);
  hi.back() = cols - Cols(x);
  phase = b.Pad(phase, b.Constant(d.dtype(), 1), lo, hi, lo);  // completed columns as they are
  std::vector<int64_t> dims = Iota(phase.rank() - 1);
  dims.push_back(q.rank() - 1);
  return b.Binary("multiply", q, b.BroadcastInDim(phase, q.shape(), dims));
}

// _linalg_svd(A, full_matrices, compute_uv, driver) -> (U, S, Vh): eigh of
// the Hermitian H = [[0, A], [A^H, 0]] (eigenvalues +-sigma; the top
// eigenvectors are [u; v] / sqrt(2) with A v = sigma u), as the real rule.
// U, S, Vh of a non-empty x (U, Vh invalid unless compute_uv).
std::vector<Value> Svd(Builder& b, Value x, bool full, bool compute_uv) {
  int64_t m = Rows(x), n = Cols(x), k = std::min(m, n), r = x.rank();
  ElementType t = x.dtype();
  std::vector<int64_t> batch = BatchOf(x.shape());
  Value top = b.Concatenate({b.Splat(t, 0, With(batch, {m, m})), x}, r - 1);
  Value bottom = b.Concatenate({Conj(b, MT(b, x)), b.Splat(t, 0, With(batch, {n, n}))}, r - 1);
  auto [w, v] = EighOf(b, b.Concatenate({top, bottom}, r - 2));
  std::vector<int64_t> ws = w.shape(), start(w.rank(), 0), ones(w.rank(), 1);
  start.back() = m + n - k;
  Value s = b.Reverse(b.Slice(w, start, ws, ones), {w.rank() - 1});
  s = b.Binary("maximum", s, b.Splat(s.dtype(), 0, s.shape()));
  if (!compute_uv) return {Value(), s, Value()};
  std::vector<int64_t> vstart(r, 0), vones(r, 1);
  vstart[r - 1] = m + n - k;
  Value vecs = b.Reverse(b.Slice(v, vstart, v.shape(), vones), {r - 1});  // [..., m+n, k]
  std::vector<int64_t> ustart(r, 0), ulimit = vecs.shape(), lstart(r, 0);
  ulimit[r - 2] = m;
  lstart[r - 2] = m;
  Value u = Orthonormalize(b, b.Slice(vecs, ustart, ulimit, vones), full ? m : k);
  Value vv = Orthonormalize(b, b.Slice(vecs, lstart, vecs.shape(), vones), full ? n : k);
  return {u, s, Conj(b, MT(b, vv))};
}

std::vector<Value> SvdRule(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value x = ComplexMatrix(a.at(0).tensor, "_linalg_svd");
  bool full = a.size() > 1 && a[1].i != 0;
  bool compute_uv = !(a.size() > 2 && a[2].kind == Arg::Kind::Bool && a[2].i == 0);
  if (x.type.numel() == 0) return {Zeros(b, Out(c, 0)), Zeros(b, Out(c, 1)), Zeros(b, Out(c, 2))};
  std::vector<Value> usv = Svd(b, x, full, compute_uv);
  if (!compute_uv) return {Zeros(b, Out(c, 0)), usv[1], Zeros(b, Out(c, 2))};
  return usv;
}

// ---------------------------------------------------------------- lstsq

// Minimizes |A x - B| (A [..., m, n] full rank) by QR: R x = (Q^H B)[:n]
// when m >= n, else x = Q (R^H \ B) from A^H = Q R (the minimum-norm one).
Value LeastSquares(Builder& b, Value A, Value B) {
  int64_t m = Rows(A), n = Cols(A);
  if (m >= n) {
    auto [packed, taus] = GeqrfOf(b, A);
    Value q = QOf(b, packed, taus, n);
    Value r = SliceLast(b, packed, n, n);
    return b.TriangularSolve(r, MatMul(b, Conj(b, MT(b, q)), B), true, false, false, false);
  }
  auto [packed, taus] = GeqrfOf(b, Conj(b, MT(b, A)));
  Value q = QOf(b, packed, taus, m);
  Value r = SliceLast(b, packed, m, m);  // R^H y = B: conj(R)^T y = B
  return MatMul(b, q, b.TriangularSolve(Conj(b, r), B, true, false, false, true));
}

// The minimum-norm solution by SVD (drivers gelsy, gelss, gelsd): singular
// values at or below rcond * the largest count as zero. Also the rank and
// the singular values.
std::vector<Value> SvdLeastSquares(Builder& b, Value A, Value B, double rcond) {
  std::vector<Value> usv = Svd(b, A, false, true);
  Value u = usv[0], s = usv[1], vh = usv[2];
  ElementType pt = s.dtype();
  int64_t kr = s.rank();
  Value top = b.Reduce(s, b.Constant(pt, 0), {kr - 1}, "maximum");
  Value cut = b.BroadcastInDim(b.Binary("multiply", top, b.Splat(pt, rcond, top.shape())), s.shape(),
                               Iota(kr - 1));
  Value kept = b.Compare("GT", s, cut);
  Value inv = b.Select(kept, b.Binary("divide", b.Splat(pt, 1, s.shape()), s), b.Splat(pt, 0, s.shape()));
  Value uhb = MatMul(b, Conj(b, MT(b, u)), B);
  Value scale = b.Convert(b.BroadcastInDim(inv, uhb.shape(), Iota(kr)), uhb.dtype());
  Value x = MatMul(b, Conj(b, MT(b, vh)), b.Binary("multiply", uhb, scale));
  Value rank = b.Reduce(b.Convert(kept, ElementType::I64), b.ConstantInt(ElementType::I64, 0),
                        {kr - 1}, "add");
  return {x, rank, s};
}

// linalg_lstsq(A, B, rcond, driver) -> (solution, residuals, rank, singular_values),
// CPU's shapes for the driver (the real rule's output types): gels (and
// None, as CUDA) by QR, gelsy / gelss / gelsd by SVD.
std::vector<Value> LstsqRule(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value A = ComplexMatrix(a.at(0).tensor, "linalg_lstsq");
  std::string driver = a.size() > 3 && a[3].kind == Arg::Kind::String ? a[3].s : "gels";
  const TensorType& out = Out(c);
  if (out.numel() == 0 || A.type.numel() == 0) {
    std::vector<Value> zeros;
    for (size_t i = 0; i < c.outputs.size(); ++i) zeros.push_back(Zeros(b, Out(c, i)));
    return zeros;
  }
  int64_t m = Rows(A), n = Cols(A);
  Value B = b.Convert(a.at(1).tensor, A.dtype());
  std::vector<int64_t> a_rows(A.shape().begin(), A.shape().end() - 1);
  bool vector_rhs = B.rank() == 1 || (B.rank() == A.rank() - 1 && B.shape() == a_rows);
  std::vector<int64_t> full = vector_rhs ? With(out.shape, {1}) : out.shape;
  if (vector_rhs) B = b.Reshape(B, With(B.shape(), {1}));
  std::vector<int64_t> batch = BatchOf(full);
  A = b.BroadcastTo(A, With(batch, {m, n}));
  B = b.BroadcastTo(B, With(batch, {m, full.back()}));
  std::vector<Value> sol{Value(), Value(), Value()};
  if (driver == "gels") {
    sol[0] = LeastSquares(b, A, B);
  } else {
    double eps = A.dtype() == ElementType::C128 ? std::numeric_limits<double>::epsilon()
                                               : std::numeric_limits<float>::epsilon();
    bool given = a.size() > 2 && a[2].kind == Arg::Kind::Double;
    sol = SvdLeastSquares(b, A, B, given ? a[2].d : eps * static_cast<double>(std::max(m, n)));
    // full rank: the QR solution (as accurate as LAPACK's; the eigh-based
    // SVD's vectors carry eigh's tolerance)
    Value full = b.Compare("EQ", sol[1], b.Splat(ElementType::I64, static_cast<double>(std::min(m, n)),
                                                  sol[1].shape()));
    Value qr = LeastSquares(b, A, B);
    sol[0] = b.Select(b.BroadcastInDim(full, qr.shape(), Iota(sol[1].rank())), qr, sol[0]);
  }
  Value x = sol[0];
  std::vector<Value> results = {b.Reshape(x, out.shape)};
  const TensorType& res = Out(c, 1);
  if (res.numel() > 0) {  // residuals: squared moduli of A x - B summed per column
    Value diff = b.Abs(b.Binary("subtract", MatMul(b, A, x), B));  // finite unless A, B are not
    Value sq = b.Reduce(b.Binary("multiply", diff, diff), b.Constant(diff.dtype(), 0),
                        {A.rank() - 2}, "add");
    results.push_back(b.Reshape(b.Convert(sq, res.dtype), res.shape));
  } else {
    results.push_back(Zeros(b, res));
  }
  for (size_t i = 2; i < c.outputs.size(); ++i) {
    const TensorType& t = Out(c, i);
    if (t.numel() > 0 && !sol[i - 1].valid())
      throw Unsupported("linalg_lstsq: rank/singular values with driver gels");
    results.push_back(t.numel() > 0 ? b.Reshape(b.Convert(sol[i - 1], t.dtype), t.shape) : Zeros(b, t));
  }
  return results;
}

const bool registered = [] {
  RegisterComplex("geqrf", GeqrfRule);
  RegisterComplex("linalg_householder_product", HouseholderProductRule);
  RegisterComplex("orgqr", HouseholderProductRule);
  RegisterComplex("linalg_qr", QrRule);
  RegisterComplex("ormqr", OrmqrRule);
  RegisterComplex("_linalg_eigh", EighRule);
  RegisterComplex("_linalg_svd", SvdRule);
  RegisterComplex("linalg_lstsq", LstsqRule);
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering::linalg
