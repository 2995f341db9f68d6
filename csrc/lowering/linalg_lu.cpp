// LU-based linear algebra at any size (loops are stablehlo.while, so the
// module does not grow with n):
//
// - linalg_lu_factor_ex(A, pivot=True, check_errors=False) -> (LU, pivots,
//   info): LAPACK getrf's partial pivoting on [..., m, n] (the pivot is the
//   first row of largest magnitude; a zero pivot leaves its column unscaled
//   and sets info to its 1-based step); pivots are 1-based int32.
// - linalg_lu_solve(LU, pivots, B, left, adjoint): getrs: B's rows swapped,
//   then two stablehlo.triangular_solve; adjoint solves with the transposed
//   factors and swaps back; left=False solves the transposed system.
// - linalg_lu(A, pivot=True) -> (P, L, U), lu_unpack(LU, pivots) -> (P, L, U).
// - linalg_inv_ex(A) -> (inverse, info): LU, then a solve against I.
// These are what torch.linalg.solve / inv / det / slogdet / logdet call
// (csrc/aten/linalg_solve.cpp and linalg_det.cpp compose solve and det from
// the first two), so all of them run natively, with PyTorch's backward
// formulas.
// Pivots out of [1, n] given to lu_solve / lu_unpack are a device-side
// IndexError. Float32 and float64; linalg_lu_factor_ex also complex64/128.
#include <cmath>
#include <string>
#include <vector>

#include "lowering/linalg_common.h"

namespace torch_tpu::lowering::linalg {

// ---------------------------------------------------------------- helpers

ElementType LinalgType(ElementType t, const std::string& op) {
  if (t != E::F32 && t != E::F64)
    throw Unsupported(op + " of a tensor that is not float32/float64");
  return t;
}

std::vector<int64_t> BatchOf(const std::vector<int64_t>& shape) {
  return std::vector<int64_t>(shape.begin(), shape.end() - 2);
}

std::vector<int64_t> With(std::vector<int64_t> batch, std::initializer_list<int64_t> extra) {
  batch.insert(batch.end(), extra.begin(), extra.end());
  return batch;
}

std::vector<int64_t> Without(int64_t rank, int64_t skip) {
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < rank; ++d)
    if (d != skip) dims.push_back(d);
  return dims;
}

std::vector<int64_t> Iota(int64_t n) {
  std::vector<int64_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

Value MT(Builder& b, Value x) {
  std::vector<int64_t> perm = Iota(x.rank());
  std::swap(perm[x.rank() - 1], perm[x.rank() - 2]);
  return b.Transpose(x, perm);
}

Value MatMul(Builder& b, Value x, Value y) {
  int64_t r = x.rank();
  std::vector<int64_t> batch = Iota(r - 2);
  return b.DotGeneral(x, y, batch, batch, {r - 1}, {r - 2}, x.dtype(), true);
}

Value Eye(Builder& b, ElementType t, const std::vector<int64_t>& batch, int64_t n) {
  std::vector<int64_t> shape = With(batch, {n, n});
  return b.Convert(TriangleMask(b, shape, "EQ"), t);
}

Value TriangleMask(Builder& b, const std::vector<int64_t>& shape, const std::string& cmp,
                   int64_t offset) {
  int64_t r = static_cast<int64_t>(shape.size());
  Value row = b.Iota(TensorType{E::I64, shape}, r - 2);
  Value col = b.Iota(TensorType{E::I64, shape}, r - 1);
  return b.Compare(cmp, b.Binary("subtract", row, col), b.Splat(E::I64, offset, shape));
}

Value Masked(Builder& b, Value mask, Value x) {
  return b.Select(mask, x, b.Splat(x.dtype(), 0, x.shape()));
}

Value MaskedSum(Builder& b, Value mask, Value x, int64_t dim) {
  Value init = hlo::IsFloat(x.dtype()) ? b.Constant(x.dtype(), 0) : b.ConstantInt(x.dtype(), 0);
  return b.Reduce(Masked(b, mask, x), init, {dim}, "add");
}

Value Diagonal(Builder& b, Value x) {
  int64_t r = x.rank();
  int64_t k = std::min(x.shape()[r - 2], x.shape()[r - 1]);
  std::vector<int64_t> start(r, 0), limit = x.shape(), ones(r, 1);
  limit[r - 2] = limit[r - 1] = k;
  Value sq = b.Slice(x, start, limit, ones);
  return MaskedSum(b, TriangleMask(b, sq.shape(), "EQ"), sq, r - 1);
}

Value Bcast(Builder& b, Value scalar, const std::vector<int64_t>& shape) {
  return b.BroadcastInDim(scalar, shape, {});
}

Value TakeLast(Builder& b, Value x, Value i) {
  int64_t r = x.rank();
  Value pos = b.Iota(TensorType{E::I64, x.shape()}, r - 1);
  return MaskedSum(b, b.Compare("EQ", pos, Bcast(b, i, x.shape())), x, r - 1);
}

Value AllTrue(Builder& b, Value x) {
  return b.Reduce(x, b.ConstantInt(E::Bool, 1), Iota(x.rank()), "and");
}

std::vector<Value> ForLoop(
    Builder& b, int64_t start, int64_t stop, const std::vector<Value>& init,
    const std::function<std::vector<Value>(Value, const std::vector<Value>&)>& body) {
  std::vector<Value> carried = {b.ConstantInt(E::I64, start)};
  carried.insert(carried.end(), init.begin(), init.end());
  auto out = b.While(
      carried,
      [&](const std::vector<Value>& v) {
        return b.Compare("LT", v[0], b.ConstantInt(E::I64, stop));
      },
      [&](const std::vector<Value>& v) {
        std::vector<Value> rest(v.begin() + 1, v.end());
        std::vector<Value> next = {b.Binary("add", v[0], b.ConstantInt(E::I64, 1))};
        auto updated = body(v[0], rest);
        next.insert(next.end(), updated.begin(), updated.end());
        return next;
      });
  return std::vector<Value>(out.begin() + 1, out.end());
}

// Rows i and j of x [..., m, c] exchanged; i, j are [...] i64 (per matrix).
Value SwapRows(Builder& b, Value x, Value i, Value j) {
  int64_t r = x.rank();
  const std::vector<int64_t>& shape = x.shape();
  std::vector<int64_t> batch_dims = Iota(r - 2);
  Value row = b.Iota(TensorType{E::I64, shape}, r - 2);
  Value is_i = b.Compare("EQ", row, b.BroadcastInDim(i, shape, batch_dims));
  Value is_j = b.Compare("EQ", row, b.BroadcastInDim(j, shape, batch_dims));
  std::vector<int64_t> row_dims = Without(r, r - 2);
  Value row_i = b.BroadcastInDim(MaskedSum(b, is_i, x, r - 2), shape, row_dims);
  Value row_j = b.BroadcastInDim(MaskedSum(b, is_j, x, r - 2), shape, row_dims);
  return b.Select(is_i, row_j, b.Select(is_j, row_i, x));
}

Value ApplySwaps(Builder& b, Value x, Value pivots, bool reverse) {
  int64_t k = pivots.shape().back();
  std::vector<int64_t> batch(pivots.shape().begin(), pivots.shape().end() - 1);
  Value piv = b.Convert(pivots, E::I64);
  return ForLoop(b, 0, k, {x}, [&](Value step, const std::vector<Value>& v) {
    Value j = reverse ? b.Binary("subtract", b.ConstantInt(E::I64, k - 1), step) : step;
    Value p = b.Binary("subtract", TakeLast(b, piv, j), b.Splat(E::I64, 1, batch));
    return std::vector<Value>{SwapRows(b, v[0], Bcast(b, j, batch), p)};
  })[0];
}

// |x|; for complex values |re| + |im|, the magnitude LAPACK's i?amax
// compares (so the pivots are the ones CPU's zgetrf/cgetrf choose).
static Value PivotMagnitude(Builder& b, Value x) {
  if (!hlo::IsComplex(x.dtype())) return b.Unary("abs", x);
  return b.Binary("add", b.Unary("abs", b.Real(x)), b.Unary("abs", b.Imag(x)));
}

// One elimination step k of getrf on m [..., rows, cols].
std::vector<Value> LuStep(Builder& b, Value k, Value m, Value piv, Value info) {
  int64_t r = m.rank();
  const std::vector<int64_t> shape = m.shape();
  ElementType t = m.dtype();
  std::vector<int64_t> batch = BatchOf(shape);
  int64_t rows = shape[r - 2];
  std::vector<int64_t> vec = With(batch, {rows});
  std::vector<int64_t> batch_dims = Iota(r - 2);
  Value vec_iota = b.Iota(TensorType{E::I64, vec}, r - 2);
  // Pivot row: first row >= k of largest |M[i, k]| (NaNs: row k).
  Value colk = TakeLast(b, m, k);  // [..., rows]
  Value below = b.Compare("GE", vec_iota, Bcast(b, k, vec));
  Value size = PivotMagnitude(b, colk);
  ElementType st = size.dtype();
  Value mag = b.Select(below, size, b.Splat(st, -1, vec));
  Value top = b.Reduce(mag, b.MinValue(st), {r - 2}, "maximum");
  Value is_top = b.Compare("EQ", mag, b.BroadcastInDim(top, vec, batch_dims));
  Value none = b.Splat(E::I64, rows, vec);
  Value p = b.Reduce(b.Select(is_top, vec_iota, none), b.ConstantInt(E::I64, rows), {r - 2},
                     "minimum");
  Value kb = Bcast(b, k, batch);
  p = b.Select(b.Compare("EQ", p, b.Splat(E::I64, rows, batch)), kb, p);
  std::vector<int64_t> pshape = piv.shape();
  Value at_step = b.Compare("EQ", b.Iota(TensorType{E::I64, pshape}, r - 2), Bcast(b, k, pshape));
  Value p1 = b.Convert(b.Binary("add", p, b.Splat(E::I64, 1, batch)), E::I32);
  piv = b.Select(at_step, b.BroadcastInDim(p1, pshape, batch_dims), piv);
  m = SwapRows(b, m, kb, p);
  // Multipliers below the pivot (a zero pivot leaves them as they are).
  Value row_iota = b.Iota(TensorType{E::I64, shape}, r - 2);
  Value col_iota = b.Iota(TensorType{E::I64, shape}, r - 1);
  Value is_k_row = b.Compare("EQ", row_iota, Bcast(b, k, shape));
  Value row_k = MaskedSum(b, is_k_row, m, r - 2);  // [..., cols]
  Value pivot = TakeLast(b, row_k, k);             // [...]
  Value zero_pivot = b.Compare("EQ", pivot, b.Splat(t, 0, batch));
  Value first_zero =
      b.Binary("and", zero_pivot, b.Compare("EQ", info, b.Splat(E::I32, 0, batch)));
  Value step1 = b.Convert(b.Binary("add", kb, b.Splat(E::I64, 1, batch)), E::I32);
  info = b.Select(first_zero, step1, info);
  colk = TakeLast(b, m, k);
  Value l = b.Select(b.BroadcastInDim(zero_pivot, vec, batch_dims), colk,
                     b.Binary("divide", colk, b.BroadcastInDim(pivot, vec, batch_dims)));
  // Trailing update: M[i, j] -= l[i] * M[k, j] for i, j > k; column k below k = l.
  Value lower = b.Compare("GT", row_iota, Bcast(b, k, shape));
  Value right = b.Compare("GT", col_iota, Bcast(b, k, shape));
  Value at_k = b.Compare("EQ", col_iota, Bcast(b, k, shape));
  Value l_b = b.BroadcastInDim(l, shape, Without(r, r - 1));
  Value u_b = b.BroadcastInDim(row_k, shape, Without(r, r - 2));
  Value updated = b.Binary("subtract", m, b.Binary("multiply", l_b, u_b));
  m = b.Select(b.Binary("and", lower, right), updated, m);
  m = b.Select(b.Binary("and", lower, at_k), l_b, m);
  return {m, piv, info};
}

LuResult LuFactor(Builder& b, Value a) {
  const std::vector<int64_t>& shape = a.shape();
  int64_t r = a.rank();
  int64_t k = std::min(shape[r - 2], shape[r - 1]);
  std::vector<int64_t> batch = BatchOf(shape);
  Value piv = b.Splat(E::I32, 0, With(batch, {k}));
  Value info = b.Splat(E::I32, 0, batch);
  auto out = ForLoop(b, 0, k, {a, piv, info}, [&](Value step, const std::vector<Value>& v) {
    return LuStep(b, step, v[0], v[1], v[2]);
  });
  return {out[0], out[1], out[2]};
}

Value LuSolve(Builder& b, Value lu, Value pivots, Value rhs, bool adjoint) {
  if (!adjoint) {  // L U x = P b
    Value y = b.TriangularSolve(lu, ApplySwaps(b, rhs, pivots, false), true, true, true, false);
    return b.TriangularSolve(lu, y, true, false, false, false);
  }
  // A^T = U^T L^T P: U^T z = b, L^T w = z, x = P^T w.
  Value z = b.TriangularSolve(lu, rhs, true, false, false, true);
  Value w = b.TriangularSolve(lu, z, true, true, true, true);
  return ApplySwaps(b, w, pivots, true);
}

namespace {

// float32/float64, or complex64/complex128 (only the rules marked complex
// capable at the bottom of this file are given complex values).
ElementType LuType(ElementType t, const std::string& op) {
  return t == E::C64 || t == E::C128 ? t : LinalgType(t, op);
}

Value Conj(Builder& b, Value x) {
  if (!hlo::IsComplex(x.dtype())) return x;
  return b.Complex(b.Real(x), b.Unary("negate", b.Imag(x)));
}

Value Input(const std::vector<Arg>& a, size_t i, const std::string& op, int64_t min_rank = 2) {
  Value v = a.at(i).tensor;
  LuType(v.dtype(), op);
  if (v.rank() < min_rank) throw Unsupported(op + " of a tensor of rank < 2");
  return v;
}

Value SquareInput(const std::vector<Arg>& a, size_t i, const std::string& op) {
  Value v = Input(a, i, op);
  if (v.shape()[v.rank() - 1] != v.shape()[v.rank() - 2])
    throw Unsupported(op + " of a non-square matrix");
  return v;
}

bool Empty(const Value& v) { return v.type.numel() == 0; }

// Pivots must be in [1, rows]: a device-side IndexError otherwise.
void CheckPivots(Context& c, Value pivots, int64_t rows, const std::string& op) {
  Builder& b = c.b;
  if (Empty(pivots)) return;
  Value p = b.Convert(pivots, E::I64);
  Value ok = b.Binary("and", b.Compare("GE", p, b.Splat(E::I64, 1, p.shape())),
                      b.Compare("LE", p, b.Splat(E::I64, rows, p.shape())));
  c.Require(AllTrue(b, ok), op + ": pivots must be in [1, " + std::to_string(rows) + "]");
}

std::vector<Value> LuFactorOf(Context& c, const std::vector<Arg>& a, Value m) {
  if (Empty(m)) return {Zeros(c.b, Out(c, 0)), Zeros(c.b, Out(c, 1)), Zeros(c.b, Out(c, 2))};
  LuResult lu = LuFactor(c.b, m);
  return {lu.lu, lu.pivots, lu.info};
}

void CheckLuFactorArgs(const std::vector<Arg>& a) {
  if (a.at(1).i == 0) throw Unsupported("linalg_lu_factor_ex without pivoting");
  if (a.at(2).i != 0) throw Unsupported("linalg_lu_factor_ex with check_errors=True");
}

std::vector<Value> LuFactorRule(Context& c, const std::vector<Arg>& a) {
  CheckLuFactorArgs(a);
  return LuFactorOf(c, a, Input(a, 0, "linalg_lu_factor_ex"));
}

std::vector<Value> LuSolveRule(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  LuType(out.dtype, "linalg_lu_solve");
  bool left = a.at(3).i != 0, adjoint = a.at(4).i != 0;
  // Complex A^H: A^T conj(x) = conj(b) (also for left=False's transposed
  // system), so `adjoint` below is a plain transpose.
  const bool conj = adjoint && hlo::IsComplex(out.dtype);
  if (out.rank() < 2) throw Unsupported("linalg_lu_solve of a tensor of rank < 2");
  if (out.numel() == 0) return {Zeros(b, out)};
  std::vector<int64_t> batch = BatchOf(out.shape);
  int64_t n = a.at(0).tensor.shape().back();
  Value lu = As(b, a.at(0), out.dtype, With(batch, {n, n}));
  Value piv = b.BroadcastTo(a.at(1).tensor, With(batch, {n}));
  CheckPivots(c, piv, n, "linalg_lu_solve");
  Value rhs = b.BroadcastTo(b.Convert(a.at(2).tensor, out.dtype), out.shape);
  if (conj) rhs = Conj(b, rhs);
  if (!left) {  // X A = B  <=>  A^T X^T = B^T
    rhs = MT(b, rhs);
    adjoint = !adjoint;
  }
  Value x = LuSolve(b, lu, piv, rhs, adjoint);
  if (conj) x = Conj(b, x);
  return {left ? x : MT(b, x)};
}

// P (with A = P L U), L (unit lower, [..., m, k]), U ([..., k, n]).
std::vector<Value> Unpack(Builder& b, Value lu, Value pivots, const Context& c) {
  const std::vector<int64_t>& shape = lu.shape();
  int64_t r = lu.rank(), m = shape[r - 2], n = shape[r - 1], k = std::min(m, n);
  std::vector<int64_t> batch = BatchOf(shape), ones(r, 1), zero(r, 0);
  std::vector<int64_t> lim_l = shape, lim_u = shape;
  lim_l[r - 1] = k;
  lim_u[r - 2] = k;
  Value l_part = b.Slice(lu, zero, lim_l, ones);
  Value l = b.Binary("add", Masked(b, TriangleMask(b, l_part.shape(), "GT"), l_part),
                     b.Convert(TriangleMask(b, l_part.shape(), "EQ"), lu.dtype()));
  Value u_part = b.Slice(lu, zero, lim_u, ones);
  Value u = Masked(b, TriangleMask(b, u_part.shape(), "LE"), u_part);
  Value p = MT(b, ApplySwaps(b, Eye(b, lu.dtype(), batch, m), pivots, false));
  (void)c;
  return {p, l, u};
}

std::vector<Value> LinalgLuRule(Context& c, const std::vector<Arg>& a) {
  if (a.size() > 1 && a[1].kind == Arg::Kind::Bool && a[1].i == 0)
    throw Unsupported("linalg_lu without pivoting");
  Value m = Input(a, 0, "linalg_lu");
  if (Empty(m)) return {Zeros(c.b, Out(c, 0)), Zeros(c.b, Out(c, 1)), Zeros(c.b, Out(c, 2))};
  LuResult lu = LuFactor(c.b, m);
  return Unpack(c.b, lu.lu, lu.pivots, c);
}

std::vector<Value> LuUnpackRule(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value lu = Input(a, 0, "lu_unpack");
  bool unpack_data = a.at(2).i != 0, unpack_pivots = a.at(3).i != 0;
  if (Empty(lu)) return {Zeros(b, Out(c, 0)), Zeros(b, Out(c, 1)), Zeros(b, Out(c, 2))};
  int64_t m = lu.shape()[lu.rank() - 2];
  Value piv = a.at(1).tensor;
  if (unpack_pivots) CheckPivots(c, piv, m, "lu_unpack");
  auto plu = Unpack(b, lu, b.BroadcastTo(piv, With(BatchOf(lu.shape()), {piv.shape().back()})), c);
  return {unpack_pivots ? plu[0] : Zeros(b, Out(c, 0)), unpack_data ? plu[1] : Zeros(b, Out(c, 1)),
          unpack_data ? plu[2] : Zeros(b, Out(c, 2))};
}

std::vector<Value> InvRule(Context& c, const std::vector<Arg>& a) {
  if (a.size() > 1 && a[1].i != 0) throw Unsupported("linalg_inv_ex with check_errors=True");
  Value m = SquareInput(a, 0, "linalg_inv_ex");
  if (Empty(m)) return {Zeros(c.b, Out(c, 0)), Zeros(c.b, Out(c, 1))};
  int64_t n = m.shape().back();
  LuResult lu = LuFactor(c.b, m);
  Value eye = Eye(c.b, m.dtype(), BatchOf(m.shape()), n);
  return {LuSolve(c.b, lu.lu, lu.pivots, eye, false), lu.info};
}

const bool registered = [] {
  Register("linalg_lu_factor_ex", LuFactorRule);
  // Complex: the same elimination (field operations; the pivot magnitude is
  // LAPACK's, see PivotMagnitude), solves and unpacking.
  MarkComplexCapable({"linalg_lu_factor_ex", "linalg_lu_solve", "linalg_lu", "lu_unpack",
                      "linalg_inv_ex"});
  Register("linalg_lu_solve", LuSolveRule);
  Register("linalg_lu", LinalgLuRule);
  Register("lu_unpack", LuUnpackRule);
  Register("linalg_inv_ex", InvRule);
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering::linalg
