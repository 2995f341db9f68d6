// Random complex tensors as ATen's CPU kernels draw them: normal_ and
// uniform_ of a complex tensor fill view_as_real(self), i.e. the real and
// imaginary parts are independent draws of the real rule, normal_ with std
// divided by sqrt(2) (so that E|z - mean|^2 = std^2). randn / rand /
// randn_like / normal.in_place reach these two ops.
#include <cmath>

#include "lowering/complex_common.h"

namespace torch_tpu::lowering {
namespace {

using complex_parts::Delegate;
using complex_parts::TensorArg;
using K = Arg::Kind;

// The real rule `op` over the [..., 2] parts of the output; `scale_std`
// divides arg 2 (normal_'s std) by sqrt(2).
Rule OverParts(const std::string& op, bool scale_std) {
  return [op, scale_std](Context& c, const std::vector<Arg>& a) {
    Builder& b = c.b;
    const TensorType& out = Out(c);
    ElementType pt = hlo::RealPart(out.dtype);
    std::vector<int64_t> shape = out.shape;
    shape.push_back(2);
    std::vector<Arg> args = a;
    args[0] = TensorArg(b.Splat(pt, 0, shape));
    if (scale_std) {
      Arg& s = args.at(2);
      double std = s.kind == K::Double ? s.d : s.kind == K::Int ? static_cast<double>(s.i) : 1.0;
      s.kind = K::Double;
      s.d = std / std::sqrt(2.0);
    }
    Value parts = Delegate(c, op, {TensorType{pt, shape}}, args)[0];
    int64_t r = out.rank();
    std::vector<int64_t> start(r + 1, 0), limit = shape, step(r + 1, 1);
    auto part = [&](int64_t i) {
      start[r] = i;
      limit[r] = i + 1;
      return b.Reshape(b.Slice(parts, start, limit, step), out.shape);
    };
    return One(b.Complex(part(0), part(1)));
  };
}

const bool registered = [] {
  RegisterComplex("normal_", OverParts("normal_", true));
  RegisterComplex("uniform_", OverParts("uniform_", false));
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
