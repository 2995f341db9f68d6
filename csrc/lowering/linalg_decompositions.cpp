// Matrix decompositions and triangular solves, on what XLA compiles itself
// (every plugin: these are HLO ops or custom calls that XLA's own passes
// expand, no LAPACK):
//
// - linalg_cholesky_ex / cholesky: stablehlo.cholesky (XLA's blocked
//   Cholesky) of the input symmetrized from the triangle LAPACK would read;
//   info is the 1-based index of the first diagonal entry that is not a
//   positive finite number (LAPACK's "leading minor not positive definite").
// - linalg_solve_triangular, triangular_solve, _cholesky_solve_helper
//   (cholesky_solve), cholesky_inverse: stablehlo.triangular_solve.
// - geqrf: custom call "Qr" (XLA's QrExpander: blocked Householder QR whose
//   packed reflectors and taus are LAPACK's geqrf format);
//   linalg_householder_product (orgqr): custom call
//   "ProductOfElementaryHouseholderReflectors"; linalg_qr: both of them;
//   ormqr: the product, then a matmul.
// - _linalg_eigh (eigh, eigvalsh): custom call "Eigh" (XLA's EighExpander:
//   cyclic Jacobi, eigenvalues sorted ascending).
// - _linalg_svd (svd, svdvals, and through them pinv, matrix_norm(2/nuc),
//   cond, matrix_rank): eigh of the Jordan-Wielandt matrix [[0, A], [A^T,
//   0]], whose eigenvalues are +-sigma (as accurate as eigh, unlike
//   eig(A^T A)); U and V are the halves of its top eigenvectors, made
//   exactly orthonormal (and completed for full_matrices) by a QR.
// - linalg_lstsq: QR for driver "gels" (what CUDA uses; full-rank A): tall
//   A solves R x = Q^T B, wide A gives the minimum-norm solution; the SVD
//   above for gelsy / gelss / gelsd: the minimum-norm
//   solution with singular values under rcond * max dropped, the rank.
// Float32 and float64 only.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "lowering/linalg_common.h"

namespace torch_tpu::lowering::linalg {
namespace {

using K = Arg::Kind;

Value Matrix(const std::vector<Arg>& a, size_t i, const std::string& op) {
  Value v = a.at(i).tensor;
  LinalgType(v.dtype(), op);
  if (v.rank() < 2) throw Unsupported(op + " of a tensor of rank < 2");
  return v;
}

int64_t Rows(const Value& v) { return v.shape()[v.rank() - 2]; }
int64_t Cols(const Value& v) { return v.shape()[v.rank() - 1]; }

// The symmetric matrix that the lower (or upper) triangle of x stands for.
Value Symmetrize(Builder& b, Value x, bool from_lower) {
  Value tri = Masked(b, TriangleMask(b, x.shape(), from_lower ? "GE" : "LE"), x);
  Value strict = Masked(b, TriangleMask(b, x.shape(), from_lower ? "GT" : "LT"), x);
  return b.Binary("add", tri, MT(b, strict));
}

Value SliceLast2(Builder& b, Value x, int64_t rows, int64_t cols) {
  int64_t r = x.rank();
  std::vector<int64_t> start(r, 0), limit = x.shape(), ones(r, 1);
  limit[r - 2] = rows;
  limit[r - 1] = cols;
  return b.Slice(x, start, limit, ones);
}

Value PadLast2(Builder& b, Value x, int64_t rows, int64_t cols) {
  int64_t r = x.rank();
  std::vector<int64_t> zero(r, 0), high(r, 0);
  high[r - 2] = rows - Rows(x);
  high[r - 1] = cols - Cols(x);
  return b.Pad(x, b.Constant(x.dtype(), 0), zero, high, zero);
}

// ---------------------------------------------------------------- Cholesky

// LAPACK potrf's info for symmetric s: the order (1-based) of the first
// leading minor that is not positive definite, 0 if none (Sylvester: the
// pivots of elimination without pivoting).
Value FirstNonPositiveMinor(Builder& b, Value s) {
  int64_t r = s.rank(), n = Rows(s);
  std::vector<int64_t> batch = BatchOf(s.shape());
  ElementType t = s.dtype();
  auto out = ForLoop(b, 0, n, {s, b.Splat(E::I32, 0, batch)},
                     [&](Value k, const std::vector<Value>& v) {
    Value m = v[0], info = v[1];
    const std::vector<int64_t>& shape = m.shape();
    Value row = b.Iota(TensorType{E::I64, shape}, r - 2);
    Value col = b.Iota(TensorType{E::I64, shape}, r - 1);
    Value row_k = MaskedSum(b, b.Compare("EQ", row, Bcast(b, k, shape)), m, r - 2);  // [..., n]
    Value d = TakeLast(b, row_k, k);
    Value ok = b.Compare("GT", d, b.Splat(t, 0, batch));  // false for NaN too
    Value first = b.Binary("and", b.Unary("not", ok), b.Compare("EQ", info, b.Splat(E::I32, 0, batch)));
    Value k1 = b.Convert(b.Binary("add", Bcast(b, k, batch), b.Splat(E::I64, 1, batch)), E::I32);
    info = b.Select(first, k1, info);
    Value l = b.Binary("divide", row_k, b.BroadcastInDim(d, row_k.shape(), Iota(r - 2)));
    Value outer = b.Binary("multiply", b.BroadcastInDim(row_k, shape, Without(r, r - 1)),
                           b.BroadcastInDim(l, shape, Without(r, r - 2)));
    Value trailing = b.Binary("and", b.Compare("GT", row, Bcast(b, k, shape)),
                              b.Compare("GT", col, Bcast(b, k, shape)));
    m = b.Select(trailing, b.Binary("subtract", m, outer), m);
    return std::vector<Value>{m, info};
  });
  return out[1];
}

// L (lower) or U (upper) with A = L L^T = U^T U, and LAPACK-style info
// (computed by elimination only when the factorization failed).
std::pair<Value, Value> CholeskyOf(Builder& b, Value a, bool upper) {
  Value s = Symmetrize(b, a, !upper);
  Value l = b.Cholesky(s, true);
  l = Masked(b, TriangleMask(b, l.shape(), "GE"), l);
  Value d = Diagonal(b, l);
  ElementType t = d.dtype();
  Value good = b.Binary("and", b.Compare("GT", d, b.Splat(t, 0, d.shape())),
                        b.Compare("LT", d, b.Splat(t, INFINITY, d.shape())));
  std::vector<int64_t> batch = BatchOf(a.shape());
  TensorType info_type{E::I32, batch};
  Value info = b.If(
      AllTrue(b, good), {info_type}, [&] { return std::vector<Value>{b.Splat(E::I32, 0, batch)}; },
      [&] { return std::vector<Value>{FirstNonPositiveMinor(b, s)}; })[0];
  return {upper ? MT(b, l) : l, info};
}

std::vector<Value> CholeskyExRule(Context& c, const std::vector<Arg>& a) {
  if (a.size() > 2 && a[2].i != 0) throw Unsupported("linalg_cholesky_ex with check_errors=True");
  Value m = Matrix(a, 0, "linalg_cholesky_ex");
  if (m.type.numel() == 0) return {Zeros(c.b, Out(c, 0)), Zeros(c.b, Out(c, 1))};
  auto [l, info] = CholeskyOf(c.b, m, a.size() > 1 && a[1].i != 0);
  return {l, info};
}

std::vector<Value> CholeskyRule(Context& c, const std::vector<Arg>& a) {
  Value m = Matrix(a, 0, "cholesky");
  if (m.type.numel() == 0) return {Zeros(c.b, Out(c, 0))};
  return {CholeskyOf(c.b, m, a.size() > 1 && a[1].i != 0).first};
}

// ---------------------------------------------------------------- triangular solves

// A broadcast to the batch of `out` ([..., n, n]) and B to out's shape.
std::pair<Value, Value> Broadcast2(Builder& b, Value A, Value B, const TensorType& out) {
  std::vector<int64_t> batch = BatchOf(out.shape);
  int64_t n = Rows(A);
  return {b.BroadcastTo(b.Convert(A, out.dtype), With(batch, {n, n})),
          b.BroadcastTo(b.Convert(B, out.dtype), out.shape)};
}

// linalg_solve_triangular(A, B, *, upper, left, unitriangular)
std::vector<Value> SolveTriangularRule(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  LinalgType(out.dtype, "linalg_solve_triangular");
  if (out.numel() == 0) return {Zeros(c.b, out)};
  bool upper = a.at(2).i != 0, left = a.at(3).i != 0, unit = a.at(4).i != 0;
  auto [A, B] = Broadcast2(c.b, a.at(0).tensor, a.at(1).tensor, out);
  return {c.b.TriangularSolve(A, B, left, !upper, unit, false)};
}

// triangular_solve(B, A, upper, transpose, unitriangular) -> (X, A clone)
std::vector<Value> TriangularSolveRule(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  LinalgType(out.dtype, "triangular_solve");
  bool upper = a.at(2).i != 0, transpose = a.at(3).i != 0, unit = a.at(4).i != 0;
  Value A = c.b.BroadcastTo(c.b.Convert(a.at(1).tensor, Out(c, 1).dtype), Out(c, 1).shape);
  if (out.numel() == 0) return {Zeros(c.b, out), A};
  auto [Ab, B] = Broadcast2(c.b, a.at(1).tensor, a.at(0).tensor, out);
  return {c.b.TriangularSolve(Ab, B, true, !upper, unit, transpose), A};
}

// _cholesky_solve_helper(B, L, upper): A x = B with A = L L^T (U^T U).
std::vector<Value> CholeskySolveRule(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  LinalgType(out.dtype, "cholesky_solve");
  if (out.numel() == 0) return {Zeros(c.b, out)};
  bool upper = a.at(2).i != 0;
  auto [L, B] = Broadcast2(c.b, a.at(1).tensor, a.at(0).tensor, out);
  // lower: L y = B, L^T x = y; upper: U^T y = B, U x = y.
  Value y = c.b.TriangularSolve(L, B, true, !upper, false, upper);
  return {c.b.TriangularSolve(L, y, true, !upper, false, !upper)};
}

std::vector<Value> CholeskyInverseRule(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  Value L = Matrix(a, 0, "cholesky_inverse");
  if (out.numel() == 0) return {Zeros(c.b, out)};
  bool upper = a.size() > 1 && a[1].i != 0;
  Value eye = Eye(c.b, L.dtype(), BatchOf(L.shape()), Rows(L));
  Value y = c.b.TriangularSolve(L, eye, true, !upper, false, upper);
  return {c.b.TriangularSolve(L, y, true, !upper, false, !upper)};
}

// ---------------------------------------------------------------- QR

struct Householder {
  Value a, taus;  // geqrf's packed reflectors [..., m, n] and taus [..., min(m, n)]
};

Householder Geqrf(Builder& b, Value x) {
  std::vector<int64_t> taus = With(BatchOf(x.shape()), {std::min(Rows(x), Cols(x))});
  auto r = b.CustomCall("Qr", {x}, {x.type, TensorType{x.dtype(), taus}});
  return {r[0], r[1]};
}

// The product of the reflectors: [..., m, cols] for packed [..., m, cols].
Value HouseholderProduct(Builder& b, Value a, Value taus) {
  return b.CustomCall("ProductOfElementaryHouseholderReflectors", {a, taus}, {a.type})[0];
}

// Q of a QR with `q_cols` columns (min(m, n) reduced, m complete).
Value QFrom(Builder& b, const Householder& h, int64_t q_cols) {
  int64_t m = Rows(h.a), k = h.taus.shape().back();
  Value a = SliceLast2(b, h.a, m, std::min(Cols(h.a), q_cols));
  if (Cols(a) < q_cols) a = PadLast2(b, a, m, q_cols);
  Value taus = h.taus;
  if (k < q_cols) {
    std::vector<int64_t> zero(taus.rank(), 0), high(taus.rank(), 0);
    high.back() = q_cols - k;
    taus = b.Pad(taus, b.Constant(taus.dtype(), 0), zero, high, zero);
  } else if (k > q_cols) {
    std::vector<int64_t> start(taus.rank(), 0), limit = taus.shape(), ones(taus.rank(), 1);
    limit.back() = q_cols;
    taus = b.Slice(taus, start, limit, ones);
  }
  return HouseholderProduct(b, a, taus);
}

std::vector<Value> GeqrfRule(Context& c, const std::vector<Arg>& a) {
  Value x = Matrix(a, 0, "geqrf");
  if (x.type.numel() == 0) return {Zeros(c.b, Out(c, 0)), Zeros(c.b, Out(c, 1))};
  Householder h = Geqrf(c.b, x);
  return {h.a, h.taus};
}

std::vector<Value> HouseholderProductRule(Context& c, const std::vector<Arg>& a) {
  Value x = Matrix(a, 0, "linalg_householder_product");
  Value taus = c.b.Convert(a.at(1).tensor, x.dtype());
  if (x.type.numel() == 0) return {Zeros(c.b, Out(c, 0))};
  return {QFrom(c.b, {x, taus}, Cols(x))};
}

// ormqr(A, tau, C, left, transpose): C multiplied by geqrf's Q ([m, m],
// from the reflectors of A [m, k]) on the left or right, transposed or not.
std::vector<Value> OrmqrRule(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  Value x = Matrix(a, 0, "ormqr");
  LinalgType(out.dtype, "ormqr");
  if (out.numel() == 0) return {Zeros(b, out)};
  bool left = a.at(3).i != 0, transpose = a.at(4).i != 0;
  std::vector<int64_t> batch = BatchOf(out.shape);
  int64_t m = Rows(x);
  Value taus = b.Convert(a.at(1).tensor, x.dtype());
  x = b.BroadcastTo(x, With(batch, {m, Cols(x)}));
  taus = b.BroadcastTo(taus, With(batch, {taus.shape().back()}));
  Value q = QFrom(b, {x, taus}, m);
  if (transpose) q = MT(b, q);
  Value other = b.BroadcastTo(b.Convert(a.at(2).tensor, out.dtype), out.shape);
  return {left ? MatMul(b, q, other) : MatMul(b, other, q)};
}

// linalg_qr(A, mode) -> (Q, R)
std::vector<Value> QrRule(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value x = Matrix(a, 0, "linalg_qr");
  std::string mode = a.size() > 1 && a[1].kind == K::String ? a[1].s : "reduced";
  if (x.type.numel() == 0) return {Zeros(b, Out(c, 0)), Zeros(b, Out(c, 1))};
  int64_t m = Rows(x), n = Cols(x), k = std::min(m, n);
  Householder h = Geqrf(b, x);
  int64_t r_rows = mode == "complete" ? m : k;
  Value r = SliceLast2(b, h.a, r_rows, n);
  r = Masked(b, TriangleMask(b, r.shape(), "LE"), r);
  Value q = mode == "r" ? Zeros(b, Out(c, 0)) : QFrom(b, h, mode == "complete" ? m : k);
  return {q, r};
}

// ---------------------------------------------------------------- eigh, SVD

// Eigenvalues ascending [..., n] and eigenvectors [..., n, n] of symmetric s.
std::pair<Value, Value> Eigh(Builder& b, Value s) {
  double eps = s.dtype() == E::F64 ? std::numeric_limits<double>::epsilon()
                                   : std::numeric_limits<float>::epsilon();
  char config[64];
  std::snprintf(config, sizeof(config), "1,1,100,%.17g", eps);
  std::vector<int64_t> w_shape = With(BatchOf(s.shape()), {Rows(s)});
  auto r = b.CustomCall("Eigh", {s}, {s.type, TensorType{s.dtype(), w_shape}}, config);
  return {r[1], r[0]};
}

// _linalg_eigh(A, UPLO, compute_v) -> (eigenvalues, eigenvectors)
std::vector<Value> EighRule(Context& c, const std::vector<Arg>& a) {
  Value x = Matrix(a, 0, "_linalg_eigh");
  if (Rows(x) != Cols(x)) throw Unsupported("_linalg_eigh of a non-square matrix");
  bool lower = !(a.size() > 1 && a[1].kind == K::String && a[1].s == "U");
  bool compute_v = !(a.size() > 2 && a[2].kind == K::Bool && a[2].i == 0);
  if (x.type.numel() == 0) return {Zeros(c.b, Out(c, 0)), Zeros(c.b, Out(c, 1))};
  auto [w, v] = Eigh(c.b, Symmetrize(c.b, x, lower));
  return {w, compute_v ? v : Zeros(c.b, Out(c, 1))};
}

// Columns of x scaled by +-1 so that a QR of them has a non-negative
// diagonal: Q * sign(diag R), exactly orthonormal, completed to `cols`.
Value Orthonormalize(Builder& b, Value x, int64_t cols) {
  Householder h = Geqrf(b, x);
  Value q = QFrom(b, h, cols);
  Value d = Diagonal(b, SliceLast2(b, h.a, Cols(x), Cols(x)));  // [..., k]
  ElementType t = d.dtype();
  Value sign = b.Select(b.Compare("LT", d, b.Splat(t, 0, d.shape())), b.Splat(t, -1, d.shape()),
                        b.Splat(t, 1, d.shape()));
  std::vector<int64_t> zero(sign.rank(), 0), high(sign.rank(), 0);
  high.back() = cols - Cols(x);
  sign = b.Pad(sign, b.Constant(t, 1), zero, high, zero);  // completed columns as they are
  std::vector<int64_t> dims = Iota(sign.rank() - 1);
  dims.push_back(q.rank() - 1);
  return b.Binary("multiply", q, b.BroadcastInDim(sign, q.shape(), dims));
}

// U, S, Vh of a non-empty x [..., m, n] (U and Vh invalid unless compute_uv).
std::vector<Value> Svd(Builder& b, Value x, bool full, bool compute_uv) {
  int64_t m = Rows(x), n = Cols(x), k = std::min(m, n), r = x.rank();
  ElementType t = x.dtype();
  std::vector<int64_t> batch = BatchOf(x.shape());
  // H = [[0, A], [A^T, 0]] ((m+n) x (m+n)).
  Value top = b.Concatenate({b.Splat(t, 0, With(batch, {m, m})), x}, r - 1);
  Value bottom = b.Concatenate({MT(b, x), b.Splat(t, 0, With(batch, {n, n}))}, r - 1);
  auto [w, v] = Eigh(b, b.Concatenate({top, bottom}, r - 2));
  // The k largest eigenvalues, descending: sigma_1 >= ... >= sigma_k.
  std::vector<int64_t> ws = w.shape(), start(w.rank(), 0), ones(w.rank(), 1);
  start.back() = m + n - k;
  Value s = b.Reverse(b.Slice(w, start, ws, ones), {w.rank() - 1});
  s = b.Binary("maximum", s, b.Splat(t, 0, s.shape()));
  if (!compute_uv) return {Value(), s, Value()};
  std::vector<int64_t> vs = v.shape(), vstart(r, 0), vones(r, 1);
  vstart[r - 1] = m + n - k;
  Value vecs = b.Reverse(b.Slice(v, vstart, vs, vones), {r - 1});  // [..., m+n, k]
  std::vector<int64_t> ustart(r, 0), ulimit = vecs.shape(), lstart(r, 0);
  ulimit[r - 2] = m;
  lstart[r - 2] = m;
  Value u_raw = b.Slice(vecs, ustart, ulimit, vones);
  Value v_raw = b.Slice(vecs, lstart, vecs.shape(), vones);
  Value u = Orthonormalize(b, u_raw, full ? m : k);
  Value vv = Orthonormalize(b, v_raw, full ? n : k);
  return {u, s, MT(b, vv)};
}

// _linalg_svd(A, full_matrices, compute_uv, driver) -> (U, S, Vh)
std::vector<Value> SvdRule(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value x = Matrix(a, 0, "_linalg_svd");
  bool full = a.size() > 1 && a[1].i != 0;
  bool compute_uv = !(a.size() > 2 && a[2].kind == K::Bool && a[2].i == 0);
  if (x.type.numel() == 0) return {Zeros(b, Out(c, 0)), Zeros(b, Out(c, 1)), Zeros(b, Out(c, 2))};
  std::vector<Value> usv = Svd(b, x, full, compute_uv);
  if (!compute_uv) return {Zeros(b, Out(c, 0)), usv[1], Zeros(b, Out(c, 2))};
  return usv;
}

// ---------------------------------------------------------------- lstsq

// The least-squares solution by QR (driver gels; A of full rank).
Value LstsqQr(Builder& b, Value A, Value B) {
  int64_t m = Rows(A), n = Cols(A);
  if (m >= n) {  // R x = (Q^T B)[:n]
    Householder h = Geqrf(b, A);
    Value q = QFrom(b, h, n);
    Value rr = SliceLast2(b, h.a, n, n);
    return b.TriangularSolve(rr, MatMul(b, MT(b, q), B), true, false, false, false);
  }
  // A^T = Q R: x = Q (R^T \ B), the minimum-norm solution
  Householder h = Geqrf(b, MT(b, A));
  Value q = QFrom(b, h, m);
  Value rr = SliceLast2(b, h.a, m, m);
  return MatMul(b, q, b.TriangularSolve(rr, B, true, false, false, true));
}

// The minimum-norm least-squares solution by SVD (drivers gelsy, gelss,
// gelsd): singular values at or below rcond * the largest count as zero;
// also the numerical rank (i64) and the singular values.
struct SvdSolution {
  Value x, rank, s;
};
SvdSolution LstsqSvd(Builder& b, Value A, Value B, double rcond) {
  std::vector<Value> usv = Svd(b, A, false, true);
  Value u = usv[0], s = usv[1], vh = usv[2];  // [.., m, k], [.., k], [.., k, n]
  ElementType t = s.dtype();
  int64_t kr = s.rank();
  Value top = b.Reduce(s, b.Constant(t, 0), {kr - 1}, "maximum");
  Value cut = b.BroadcastInDim(b.Binary("multiply", top, b.Splat(t, rcond, top.shape())), s.shape(),
                               Iota(kr - 1));
  Value kept = b.Compare("GT", s, cut);
  Value inv = b.Select(kept, b.Binary("divide", b.Splat(t, 1, s.shape()), s), b.Splat(t, 0, s.shape()));
  Value utb = MatMul(b, MT(b, u), B);  // [.., k, nrhs]
  Value scaled = b.Binary("multiply", utb, b.BroadcastInDim(inv, utb.shape(), Iota(kr)));
  Value rank = b.Reduce(b.Convert(kept, E::I64), b.ConstantInt(E::I64, 0), {kr - 1}, "add");
  return {MatMul(b, MT(b, vh), scaled), rank, s};
}

// The driver; None is gels, as on CUDA (PyTorch's default for non-CPU
// devices, which its meta kernel assumes; CPU's default is gelsy).
std::string LstsqDriver(const std::vector<Arg>& a) {
  std::string driver = a.size() > 3 && a[3].kind == K::String ? a[3].s : "gels";
  if (driver != "gels" && driver != "gelsy" && driver != "gelss" && driver != "gelsd")
    throw std::invalid_argument("linalg.lstsq: driver must be one of gels, gelsy, gelss, gelsd; got " + driver);
  return driver;
}

// CPU's output shapes for the driver (the meta kernel gives gels' for all):
// solution batch + [n, k] (vector B: batch + [n]); residuals batch + [k]
// (vector: batch + [1]) when m > n and the driver is not gelsy, else [0];
// rank batch (i64) unless gels; singular values batch + [min(m, n)] for
// gelss / gelsd.
std::vector<TensorType> LstsqTypes(const std::vector<Arg>& a) {
  Value A = a.at(0).tensor, B = a.at(1).tensor;
  std::string driver = LstsqDriver(a);
  int64_t m = Rows(A), n = Cols(A);
  std::vector<int64_t> a_rows(A.shape().begin(), A.shape().end() - 1);
  bool vector_rhs = B.rank() == 1 || (B.rank() == A.rank() - 1 && B.shape() == a_rows);
  std::vector<int64_t> b_batch(B.shape().begin(), B.shape().end() - (vector_rhs ? 1 : 2));
  std::vector<int64_t> batch = BroadcastShapes(BatchOf(A.shape()), b_batch);
  ElementType t = A.dtype(), real = hlo::RealPart(t);
  int64_t k = vector_rhs ? 1 : B.shape().back();
  std::vector<int64_t> solution = vector_rhs ? With(batch, {n}) : With(batch, {n, k});
  bool residuals = m > n && driver != "gelsy";
  bool sv = driver == "gelss" || driver == "gelsd";
  return {TensorType{t, solution},
          TensorType{real, residuals ? With(batch, {k}) : std::vector<int64_t>{0}},
          TensorType{E::I64, driver != "gels" ? batch : std::vector<int64_t>{0}},
          TensorType{real, sv ? With(batch, {std::min(m, n)}) : std::vector<int64_t>{0}}};
}

// Where the SVD finds a matrix of full rank, its QR solution (as accurate as
// LAPACK's; the eigh-based SVD's vectors carry eigh's tolerance).
Value FullRankByQr(Builder& b, Value A, Value B, const SvdSolution& sol) {
  int64_t k = std::min(Rows(A), Cols(A));
  Value full = b.Compare("EQ", sol.rank, b.Splat(E::I64, static_cast<double>(k), sol.rank.shape()));
  Value x = LstsqQr(b, A, B);
  return b.Select(b.BroadcastInDim(full, x.shape(), Iota(sol.rank.rank())), x, sol.x);
}

// linalg_lstsq(A, B, rcond, driver) -> (solution, residuals, rank, singular_values),
// with CPU's output shapes for the driver (LstsqTypes). Driver gels (and
// None, as CUDA): QR. gelsy / gelss / gelsd: SVD, with rank and singular values (gelsy's
// rank from the singular values, not a pivoted QR: the same but for
// matrices at the rcond threshold). Residuals are computed whenever the
// shapes have them (m > n, not gelsy); CPU leaves them empty for a
// rank-deficient A with gelss / gelsd (a data-dependent shape).
std::vector<Value> LstsqRule(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value A = Matrix(a, 0, "linalg_lstsq");
  std::string driver = LstsqDriver(a);
  const TensorType& out = Out(c);
  if (out.numel() == 0 || A.type.numel() == 0) {
    std::vector<Value> zeros;
    for (size_t i = 0; i < c.outputs.size(); ++i) zeros.push_back(Zeros(b, Out(c, i)));
    return zeros;
  }
  int64_t m = Rows(A), n = Cols(A);
  Value B = b.Convert(a.at(1).tensor, A.dtype());
  // The vector case (B of A's rank - 1): solution [..., n], residuals [..., 1].
  std::vector<int64_t> a_rows(A.shape().begin(), A.shape().end() - 1);
  bool vector_rhs = B.rank() == 1 || (B.rank() == A.rank() - 1 && B.shape() == a_rows);
  std::vector<int64_t> full = vector_rhs ? With(out.shape, {1}) : out.shape;
  if (vector_rhs) B = b.Reshape(B, With(B.shape(), {1}));
  std::vector<int64_t> batch = BatchOf(full);
  A = b.BroadcastTo(A, With(batch, {m, n}));
  B = b.BroadcastTo(B, With(batch, {m, full.back()}));
  const int64_t r = A.rank();
  bool wants_rank = c.outputs.size() > 2 && Out(c, 2).numel() > 0;
  bool by_svd = driver != "gels";
  SvdSolution sol;
  if (by_svd) {
    double eps = A.dtype() == E::F64 ? std::numeric_limits<double>::epsilon()
                                     : std::numeric_limits<float>::epsilon();
    bool given = a.size() > 2 && a[2].kind == K::Double;
    sol = LstsqSvd(b, A, B, given ? a[2].d : eps * static_cast<double>(std::max(m, n)));
    sol.x = FullRankByQr(b, A, B, sol);
  } else {
    if (wants_rank) throw Unsupported("linalg_lstsq: rank with driver gels");
    sol.x = LstsqQr(b, A, B);
  }
  std::vector<Value> results = {b.Reshape(sol.x, out.shape)};
  const TensorType& res = Out(c, 1);
  if (res.numel() > 0) {  // residuals: squared norms of A x - B per column
    Value diff = b.Binary("subtract", MatMul(b, A, sol.x), B);
    Value sq = b.Reduce(b.Binary("multiply", diff, diff), b.Constant(A.dtype(), 0), {r - 2}, "add");
    results.push_back(b.Reshape(b.Convert(sq, res.dtype), res.shape));
  } else {
    results.push_back(Zeros(b, res));
  }
  if (c.outputs.size() > 2)
    results.push_back(wants_rank ? b.Reshape(b.Convert(sol.rank, Out(c, 2).dtype), Out(c, 2).shape)
                                 : Zeros(b, Out(c, 2)));
  if (c.outputs.size() > 3) {
    const TensorType& sv = Out(c, 3);
    if (sv.numel() > 0 && !by_svd) throw Unsupported("linalg_lstsq: singular values with gels");
    results.push_back(sv.numel() > 0 ? b.Reshape(b.Convert(sol.s, sv.dtype), sv.shape) : Zeros(b, sv));
  }
  return results;
}

const bool registered = [] {
  Register("linalg_cholesky_ex", CholeskyExRule);
  Register("cholesky", CholeskyRule);
  Register("linalg_solve_triangular", SolveTriangularRule);
  Register("triangular_solve", TriangularSolveRule);
  Register("_cholesky_solve_helper", CholeskySolveRule);
  Register("cholesky_inverse", CholeskyInverseRule);
  Register("geqrf", GeqrfRule);
  Register("linalg_householder_product", HouseholderProductRule);
  Register("orgqr", HouseholderProductRule);
  Register("linalg_qr", QrRule);
  Register("ormqr", OrmqrRule);
  Register("_linalg_eigh", EighRule);
  Register("_linalg_svd", SvdRule);
  Register("linalg_lstsq", LstsqRule).output_types = LstsqTypes;
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering::linalg
