// Random complex tensors distributed as ATen's CPU kernels draw them:
// normal_ and uniform_ of a complex tensor fill view_as_real(self), i.e. the
// real and imaginary parts are independent draws, normal_ with std divided by
// sqrt(2) (so that E|z - mean|^2 = std^2). randn / rand / randn_like /
// normal.in_place reach these two ops. Each draws 2 uniforms per element,
// what the generator advances by for one output element (no counter is
// reused by the next call).
#include <cmath>

#include "lowering/complex_common.h"

namespace torch_tpu::lowering {
namespace {

using complex_parts::Delegate;
using complex_parts::TensorArg;
using K = Arg::Kind;

// Real values [..., 2] (parts last) as a complex tensor of `shape`.
Value FromParts(Builder& b, Value parts, const std::vector<int64_t>& shape) {
  int64_t r = static_cast<int64_t>(shape.size());
  std::vector<int64_t> start(r + 1, 0), limit = parts.shape(), step(r + 1, 1);
  auto part = [&](int64_t i) {
    start[r] = i;
    limit[r] = i + 1;
    return b.Reshape(b.Slice(parts, start, limit, step), shape);
  };
  return b.Complex(part(0), part(1));
}

// uniform_(self, from, to): the real rule over the [..., 2] parts (2 values
// per element: the generator's per-element offsets cover them).
std::vector<Value> ComplexUniform(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  ElementType pt = hlo::RealPart(out.dtype);
  std::vector<int64_t> shape = out.shape;
  shape.push_back(2);
  std::vector<Arg> args = a;
  std::vector<Value> real = RealSizes(b, a.at(0).tensor);  // bounded dynamic: the parts drawn at self's real sizes
  real.emplace_back();
  args[0] = TensorArg(WithRealSizes(b, b.Splat(pt, 0, shape), real));
  return One(FromParts(b, Delegate(c, "uniform_", {TensorType{pt, shape}}, args)[0], out.shape));
}

double DoubleArg(const Arg& a, double fallback) {
  if (a.kind == K::Double) return a.d;
  if (a.kind == K::Int) return static_cast<double>(a.i);
  return fallback;
}

// normal_(self, mean, std): both outputs of one Box-Muller transform per
// element, r cos(t) and r sin(t) (independent standard normals), scaled by
// std / sqrt(2): the same two uniforms per element as the real rule draws,
// so consecutive calls never reuse the generator's counters.
std::vector<Value> ComplexNormal(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  ElementType pt = hlo::RealPart(out.dtype);
  bool wide = pt == ElementType::F64;
  ElementType ft = wide ? ElementType::F64 : ElementType::F32;
  double mean = DoubleArg(a.at(1), 0), std = DoubleArg(a.at(2), 1) / std::sqrt(2.0);
  auto [u1, u2] = TwoUniform01(b, GeneratorArg(a).tensor, out.shape, wide, RealSizes(b, a.at(0).tensor));
  auto splat = [&](double v) { return b.Splat(ft, v, out.shape); };
  Value r = b.Unary("sqrt", b.Binary("multiply", splat(-2.0),
                                     b.Unary("log", b.Binary("subtract", splat(1.0), u1))));
  Value t = b.Binary("multiply", u2, splat(2 * M_PI));
  auto scaled = [&](Value z) {
    return b.Convert(b.Binary("add", b.Binary("multiply", z, splat(std)), splat(mean)), pt);
  };
  return One(b.Complex(scaled(b.Binary("multiply", r, b.Unary("cosine", t))),
                       scaled(b.Binary("multiply", r, b.Unary("sine", t)))));
}

const bool registered = [] {
  RegisterComplex("normal_", ComplexNormal);
  RegisterComplex("uniform_", ComplexUniform);
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
