// Rules for ops that Diffusers' schedulers and models reach and that used to
// fall back to the CPU:
//
// - lerp.Scalar / lerp.Tensor (+ in-place, out=): ATen's formula, exact at
//   both ends: self + w * (end - self) where |w| < 0.5, else
//   end - (end - self) * (1 - w); in the compute type (f32 for 16-bit floats),
//   broadcasting self, end and weight (KDPM2DiscreteScheduler, EMA updates).
// - linalg_lu_factor_ex (pivot=True, check_errors=False): LAPACK getrf's
//   partial pivoting (the pivot is the first row of largest magnitude; a zero
//   pivot leaves its column unscaled and sets info to its 1-based step), for
//   square f32/f64 matrices up to kMaxLu, unrolled; pivots are 1-based int32.
// - linalg_lu_solve(LU, pivots, B, left, adjoint): getrs: B's rows permuted,
//   then two stablehlo.triangular_solve (unit lower, upper); adjoint solves
//   with the transposed factors and permutes back; left=False solves the
//   transposed system. Pivots out of [1, n] are a device-side IndexError.
// Together they serve torch.linalg.solve (csrc/aten/linalg_solve.cpp calls
// them the way ATen's CPU kernel does), which UniPCMultistepScheduler uses.
#include <string>
#include <vector>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

Value LerpValue(Builder& b, Value x, Value y, Value w) {
  const std::vector<int64_t>& shape = x.shape();
  ElementType t = x.dtype();
  Value diff = b.Binary("subtract", y, x);
  Value from_self = b.Binary("add", x, b.Binary("multiply", w, diff));
  Value from_end = b.Binary(
      "subtract", y, b.Binary("multiply", diff, b.Binary("subtract", b.Splat(t, 1, shape), w)));
  Value small = b.Compare("LT", b.Unary("abs", w), b.Splat(t, 0.5, shape));
  return b.Select(small, from_self, from_end);
}

// lerp(self, end, weight) with weight a Scalar or a Tensor.
std::vector<Value> LerpRule(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = c.outputs.at(0);
  if (!hlo::IsFloat(out.dtype)) throw Unsupported("lerp of a non-float tensor");
  ElementType ct = ComputeType(out.dtype);
  Value x = As(c.b, a.at(0), ct, out.shape);
  Value y = As(c.b, a.at(1), ct, out.shape);
  Value w = As(c.b, a.at(2), ct, out.shape);
  return {c.b.Convert(LerpValue(c.b, x, y, w), out.dtype)};
}

// ---------------------------------------------------------------- LU

using E = ElementType;

// Unrolled elimination: larger matrices run on the CPU (counted fallback).
constexpr int64_t kMaxLu = 64;

std::vector<int64_t> Without(int64_t rank, int64_t skip) {
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < rank; ++d)
    if (d != skip) dims.push_back(d);
  return dims;
}

// x[..., idx] along the last dim (static idx), as a [...] value.
Value TakeLast(Builder& b, Value x, int64_t idx) {
  int64_t r = x.rank();
  std::vector<int64_t> start(r, 0), limit = x.shape(), ones(r, 1);
  start[r - 1] = idx;
  limit[r - 1] = idx + 1;
  std::vector<int64_t> shape(x.shape().begin(), x.shape().end() - 1);
  return b.Reshape(b.Slice(x, start, limit, ones), shape);
}

// Sum over `dim` of `x` where `mask` holds (other entries are exact zeros).
Value MaskedSum(Builder& b, Value mask, Value x, int64_t dim) {
  Value zero = b.Splat(x.dtype(), 0, x.shape());
  Value init = hlo::IsFloat(x.dtype()) ? b.Constant(x.dtype(), 0) : b.ConstantInt(x.dtype(), 0);
  return b.Reduce(b.Select(mask, x, zero), init, {dim}, "add");
}

ElementType LinalgType(ElementType t, const char* what) {
  if (t != E::F32 && t != E::F64)
    throw Unsupported(std::string(what) + " of a tensor that is not float32/float64");
  return t;
}

// linalg_lu_factor_ex(A, *, pivot, check_errors) -> (LU, pivots, info)
std::vector<Value> LuFactorRule(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  if (a.at(1).i == 0) throw Unsupported("linalg_lu_factor_ex without pivoting");
  if (a.at(2).i != 0) throw Unsupported("linalg_lu_factor_ex with check_errors=True");
  Value m = a.at(0).tensor;
  ElementType t = LinalgType(m.dtype(), "linalg_lu_factor_ex");
  const std::vector<int64_t> shape = m.shape();
  int64_t r = m.rank();
  if (r < 2) throw Unsupported("linalg_lu_factor_ex of a tensor of rank < 2");
  int64_t n = shape[r - 1];
  if (shape[r - 2] != n) throw Unsupported("linalg_lu_factor_ex of a non-square matrix");
  if (n == 0 || n > kMaxLu) throw Unsupported("linalg_lu_factor_ex: matrix size out of range");
  std::vector<int64_t> batch(shape.begin(), shape.end() - 2);
  std::vector<int64_t> vec = batch;
  vec.push_back(n);
  const int64_t rows = r - 2, cols = r - 1;
  std::vector<int64_t> batch_dims = Without(r, rows);
  batch_dims.pop_back();  // [0, r-2): the batch dims of a [...] value inside [..., n, n]

  Value row_iota = b.Iota(TensorType{E::I64, shape}, rows);
  Value col_iota = b.Iota(TensorType{E::I64, shape}, cols);
  Value vec_iota = b.Iota(TensorType{E::I64, vec}, r - 2);
  Value info = b.Splat(E::I32, 0, batch);
  std::vector<Value> pivots;
  for (int64_t k = 0; k < n; ++k) {
    // Pivot row: first row >= k of largest |M[i, k]|.
    Value colk = TakeLast(b, m, k);  // [..., n] over rows
    Value below = b.Compare("GE", vec_iota, b.Splat(E::I64, k, vec));
    Value mag = b.Select(below, b.Unary("abs", colk), b.Splat(t, -1, vec));
    Value top = b.Reduce(mag, b.MinValue(t), {r - 2}, "maximum");
    Value is_top = b.Compare("EQ", mag, b.BroadcastInDim(top, vec, batch_dims));
    Value p = b.Reduce(b.Select(is_top, vec_iota, b.Splat(E::I64, n, vec)), b.ConstantInt(E::I64, n),
                       {r - 2}, "minimum");
    p = b.Select(b.Compare("EQ", p, b.Splat(E::I64, n, batch)), b.Splat(E::I64, k, batch), p);  // NaNs
    pivots.push_back(b.Reshape(b.Convert(b.Binary("add", p, b.Splat(E::I64, 1, batch)), E::I32),
                               [&] { auto s1 = batch; s1.push_back(1); return s1; }()));
    // Swap rows k and p.
    Value is_p = b.Compare("EQ", row_iota, b.BroadcastInDim(p, shape, batch_dims));
    Value is_k = b.Compare("EQ", row_iota, b.Splat(E::I64, k, shape));
    Value row_p = MaskedSum(b, is_p, m, rows);  // [..., n] over cols
    Value row_k = MaskedSum(b, is_k, m, rows);
    std::vector<int64_t> row_dims = Without(r, rows);
    m = b.Select(is_k, b.BroadcastInDim(row_p, shape, row_dims),
                 b.Select(is_p, b.BroadcastInDim(row_k, shape, row_dims), m));
    // Multipliers below the pivot (a zero pivot leaves them as they are).
    Value piv = TakeLast(b, row_p, k);  // [...]
    Value piv_zero = b.Compare("EQ", piv, b.Splat(t, 0, batch));
    Value first_zero = b.Binary("and", piv_zero, b.Compare("EQ", info, b.Splat(E::I32, 0, batch)));
    info = b.Select(first_zero, b.Splat(E::I32, k + 1, batch), info);
    colk = TakeLast(b, m, k);
    Value piv_v = b.BroadcastInDim(piv, vec, batch_dims);
    Value l = b.Select(b.BroadcastInDim(piv_zero, vec, batch_dims), colk, b.Binary("divide", colk, piv_v));
    // Trailing update: M[i, j] -= l[i] * M[k, j] for i, j > k; column k below k = l.
    Value lower = b.Compare("GT", row_iota, b.Splat(E::I64, k, shape));
    Value right = b.Compare("GT", col_iota, b.Splat(E::I64, k, shape));
    Value at_k = b.Compare("EQ", col_iota, b.Splat(E::I64, k, shape));
    Value l_b = b.BroadcastInDim(l, shape, Without(r, cols));
    Value u_b = b.BroadcastInDim(row_p, shape, row_dims);
    Value updated = b.Binary("subtract", m, b.Binary("multiply", l_b, u_b));
    m = b.Select(b.Binary("and", lower, right), updated, m);
    m = b.Select(b.Binary("and", lower, at_k), l_b, m);
  }
  Value piv_all = pivots.size() == 1 ? pivots[0] : b.Concatenate(pivots, r - 2);
  return {m, piv_all, info};
}

Value TriangularSolve(Builder& b, Value a, Value rhs, bool lower, bool unit, bool transpose) {
  return b.TriangularSolve(a, rhs, /*left_side=*/true, lower, unit, transpose);
}

// out[..., i, :] = x[..., perm[..., i], :] (gather), or with scatter=true
// out[..., perm[..., i], :] = x[..., i, :].
Value PermuteRows(Builder& b, Value x, Value perm, bool scatter) {
  int64_t r = x.rank();  // [..., n, k]
  std::vector<int64_t> shape = x.shape();
  int64_t n = shape[r - 2];
  std::vector<int64_t> big(shape.begin(), shape.end() - 1);  // [..., n(i), n(j), k]
  big.push_back(n);
  big.push_back(shape[r - 1]);
  std::vector<int64_t> perm_dims, x_dims;
  for (int64_t d = 0; d < r - 2; ++d) {
    perm_dims.push_back(d);
    x_dims.push_back(d);
  }
  // Gathering: big is [..., i, j, k], summed over j; scattering: [..., j, i,
  // k], summed over i. x's rows run along dim r-1 either way.
  perm_dims.push_back(scatter ? r - 1 : r - 2);
  x_dims.push_back(r - 1);
  x_dims.push_back(r);
  Value pb = b.BroadcastInDim(perm, big, perm_dims);
  Value other = b.Iota(TensorType{E::I64, big}, scatter ? r - 2 : r - 1);
  Value xb = b.BroadcastInDim(x, big, x_dims);
  return MaskedSum(b, b.Compare("EQ", pb, other), xb, r - 1);
}

// linalg_lu_solve(LU, pivots, B, *, left, adjoint)
std::vector<Value> LuSolveRule(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = c.outputs.at(0);
  ElementType t = LinalgType(out.dtype, "linalg_lu_solve");
  bool left = a.at(3).i != 0, adjoint = a.at(4).i != 0;
  int64_t r = out.rank();
  if (r < 2) throw Unsupported("linalg_lu_solve of a tensor of rank < 2");
  std::vector<int64_t> batch(out.shape.begin(), out.shape.end() - 2);
  int64_t n = a.at(0).tensor.shape().back();
  if (n == 0 || n > kMaxLu) throw Unsupported("linalg_lu_solve: matrix size out of range");
  std::vector<int64_t> sq = batch, vec = batch;
  sq.push_back(n);
  sq.push_back(n);
  vec.push_back(n);
  std::vector<int64_t> swap(r);
  for (int64_t d = 0; d < r; ++d) swap[d] = d;
  std::swap(swap[r - 1], swap[r - 2]);
  Value lu = As(b, a.at(0), t, sq);
  Value rhs = b.Convert(a.at(2).tensor, t);
  if (!left) {  // X A = B  <=>  A^T X^T = B^T
    rhs = b.Transpose(b.BroadcastTo(rhs, out.shape), swap);
    adjoint = !adjoint;
  }
  std::vector<int64_t> rhs_shape = batch;
  rhs_shape.push_back(n);
  rhs_shape.push_back(rhs.shape().back());
  rhs = b.BroadcastTo(rhs, rhs_shape);
  Value piv = b.BroadcastTo(b.Convert(a.at(1).tensor, E::I64), vec);
  Value ok = b.Binary("and", b.Compare("GE", piv, b.Splat(E::I64, 1, vec)),
                      b.Compare("LE", piv, b.Splat(E::I64, n, vec)));
  std::vector<int64_t> all(piv.rank());
  for (int64_t d = 0; d < piv.rank(); ++d) all[d] = d;
  c.Require(b.Reduce(ok, b.ConstantInt(E::Bool, 1), all, "and"),
            "pivots must be in [1, " + std::to_string(n) + "]");
  // The row permutation of getrf's sequential swaps: (P A)[i] = A[perm[i]].
  int64_t pr = piv.rank();
  std::vector<int64_t> vbatch_dims;
  for (int64_t d = 0; d < pr - 1; ++d) vbatch_dims.push_back(d);
  Value iota = b.Iota(TensorType{E::I64, vec}, pr - 1);
  Value perm = iota;
  for (int64_t k = 0; k < n; ++k) {
    Value p = b.Binary("subtract", TakeLast(b, piv, k), b.Splat(E::I64, 1, batch));
    Value pv = b.BroadcastInDim(p, vec, vbatch_dims);
    Value is_p = b.Compare("EQ", iota, pv);
    Value is_k = b.Compare("EQ", iota, b.Splat(E::I64, k, vec));
    Value at_p = b.BroadcastInDim(MaskedSum(b, is_p, perm, pr - 1), vec, vbatch_dims);
    Value at_k = b.BroadcastInDim(TakeLast(b, perm, k), vec, vbatch_dims);
    perm = b.Select(is_k, at_p, b.Select(is_p, at_k, perm));
  }
  Value x;
  if (!adjoint) {  // L U x = P b
    Value y = TriangularSolve(b, lu, PermuteRows(b, rhs, perm, false), true, true, false);
    x = TriangularSolve(b, lu, y, false, false, false);
  } else {  // U^T L^T (P x) = b
    Value z = TriangularSolve(b, lu, rhs, false, false, true);
    Value w = TriangularSolve(b, lu, z, true, true, true);
    x = PermuteRows(b, w, perm, true);
  }
  if (!left) x = b.Transpose(x, swap);
  return {b.Convert(x, out.dtype)};
}

const bool registered = [] {
  Register("lerp.Scalar", LerpRule);
  Register("lerp.Tensor", LerpRule);
  Register("linalg_lu_factor_ex", LuFactorRule);
  Register("linalg_lu_solve", LuSolveRule);
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
