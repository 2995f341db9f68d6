// Bit shifts: bitwise_left_shift / bitwise_right_shift (Tensor, Tensor_Scalar,
// Scalar_Tensor) and the operators __lshift__ / __rshift__ (+ __ilshift__ /
// __irshift__), integers only. Like CPU: shifting by a negative amount or by
// at least the bit width gives 0 (left, and right for unsigned or
// non-negative values) or -1 (right shift of a negative signed value):
// StableHLO's shifts read the amount as unsigned and saturate exactly so.
#include <string>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

Rule ShiftRule(bool left) {
  return [left](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = Out(c);
    if (!hlo::IsInteger(out.dtype))
      throw Unsupported(std::string(left ? "left" : "right") + " shift of a non-integer tensor");
    Value x = As(c.b, a.at(0), out.dtype, out.shape);
    Value n = As(c.b, a.at(1), out.dtype, out.shape);
    const char* op = left ? "shift_left"
                          : (hlo::IsSigned(out.dtype) ? "shift_right_arithmetic"
                                                      : "shift_right_logical");
    return One(c.b.Binary(op, x, n));
  };
}

const bool registered = [] {
  for (bool left : {true, false}) {
    std::string fn = left ? "bitwise_left_shift" : "bitwise_right_shift";
    for (const char* overload : {".Tensor", ".Tensor_Scalar", ".Scalar_Tensor"})
      Register(fn + overload, ShiftRule(left));
    std::string dunder = left ? "lshift__" : "rshift__";
    Register("__" + dunder + ".Tensor", ShiftRule(left), {"__i" + dunder + ".Tensor"});
    Register("__" + dunder + ".Scalar", ShiftRule(left), {"__i" + dunder + ".Scalar"});
  }
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
