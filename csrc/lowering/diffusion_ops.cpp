// Rules for ops that Diffusers' schedulers and models reach and that used to
// fall back to the CPU:
//
// - lerp.Scalar / lerp.Tensor (+ in-place, out=): ATen's formula, exact at
//   both ends: self + w * (end - self) where |w| < 0.5, else
//   end - (end - self) * (1 - w); in the compute type (f32 for 16-bit floats),
//   broadcasting self, end and weight (KDPM2DiscreteScheduler, EMA updates).
// (linalg_lu_factor_ex / linalg_lu_solve, which torch.linalg.solve uses for
// UniPCMultistepScheduler, moved to linalg_lu.cpp and work at any size.)
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

const bool registered = [] {
  Register("lerp.Scalar", LerpRule);
  Register("lerp.Tensor", LerpRule);
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
