// Elementwise compounds of three operands, each in ATen's order of
// operations and in the compute type (f32 for 16-bit floats, as the CPU's
// opmath), broadcasting every operand to the output shape:
//
// - lerp.Scalar / lerp.Tensor (+ in-place, out=): ATen's formula, exact at
//   both ends: self + w * (end - self) where |w| < 0.5, else
//   end - (end - self) * (1 - w) (KDPM2DiscreteScheduler, EMA updates).
// - addcmul, addcdiv (+ in-place, out=): self + value * tensor1 * tensor2
//   and self + value * tensor1 / tensor2 (Adam-style optimizer updates).
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

// addcmul(self, tensor1, tensor2, *, value=1) = self + value * tensor1 * tensor2
// addcdiv(...) = self + value * tensor1 / tensor2, in ATen's order of
// operations, 16-bit floats in float32 (opmath) as the CPU kernel.
Rule Addc(bool div) {
  return [div](Context& c, const std::vector<Arg>& a) -> std::vector<Value> {
    const TensorType& out = c.outputs.at(0);
    Builder& b = c.b;
    if (div && !hlo::IsFloat(out.dtype))
      throw Unsupported("addcdiv of integer tensors (PyTorch raises for them too)");
    ElementType ct = hlo::IsFloat(out.dtype) ? ComputeType(out.dtype) : out.dtype;
    Value self = As(b, a.at(0), ct, out.shape);
    Value t1 = As(b, a.at(1), ct, out.shape);
    Value t2 = As(b, a.at(2), ct, out.shape);
    Value value = As(b, a.at(3), ct, out.shape);
    Value term = b.Binary(div ? "divide" : "multiply", b.Binary("multiply", value, t1), t2);
    return {b.Convert(b.Binary("add", self, term), out.dtype)};
  };
}

const bool registered = [] {
  Register("lerp.Scalar", LerpRule).DynamicElementwise();
  Register("lerp.Tensor", LerpRule).DynamicElementwise();
  Register("addcmul", Addc(false)).DynamicElementwise();
  Register("addcdiv", Addc(true)).DynamicElementwise();
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
