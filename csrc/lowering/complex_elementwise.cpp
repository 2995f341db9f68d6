// Complex forms of elementwise rules whose real form compares, tests the
// dtype or evaluates in another type, each as ATen's CPU kernel computes
// it on c10::complex:
//  - addcdiv: self + value * t1 / t2;
//  - lerp: self + w (end - self) where |w| < 0.5, else end - (end - self)(1 - w);
//  - sinc: sin(pi z) / (pi z), 1 at 0;
//  - linspace: the real rule on each part (step = (end - start) / (steps - 1)
//    and step * i are componentwise for a real divisor and index);
//    logspace: base ** that (complex power).
// Marked capable (their generic rules only add, multiply and move values):
// linalg_cross (no conjugation, as CPU), scatter.reduce / value_reduce
// (sum and prod), addbmm.
#include <cmath>

#include "lowering/complex_common.h"

namespace torch_tpu::lowering {
namespace {

using complex_parts::Delegate;
using complex_parts::PartOf;
using complex_parts::PartType;

// A complex constant re + 0i of type t broadcast to shape.
Value ComplexSplat(Builder& b, ElementType t, double re, const std::vector<int64_t>& shape) {
  return b.BroadcastInDim(b.ConstantComplex(t, re, 0), shape, {});
}

Value In(Context& c, const Arg& a) { return As(c.b, a, Out(c).dtype, Out(c).shape); }

std::vector<Value> ComplexAddcdiv(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value term = b.Binary("divide", b.Binary("multiply", In(c, a.at(3)), In(c, a.at(1))), In(c, a.at(2)));
  return One(b.Binary("add", In(c, a.at(0)), term));
}

std::vector<Value> ComplexLerp(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  Value x = In(c, a.at(0)), y = In(c, a.at(1)), w = In(c, a.at(2));
  Value diff = b.Binary("subtract", y, x);
  Value from_self = b.Binary("add", x, b.Binary("multiply", w, diff));
  Value one_minus_w = b.Binary("subtract", ComplexSplat(b, out.dtype, 1, out.shape), w);
  Value from_end = b.Binary("subtract", y, b.Binary("multiply", diff, one_minus_w));
  Value small = b.Compare("LT", complex_parts::AbsC99(b, w), b.Splat(hlo::RealPart(out.dtype), 0.5, out.shape));
  return One(b.Select(small, from_self, from_end));
}

std::vector<Value> ComplexSinc(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  Value z = In(c, a.at(0));
  Value pz = b.Binary("multiply", ComplexSplat(b, out.dtype, M_PI, out.shape), z);
  Value q = b.Binary("divide", b.Unary("sine", pz), pz);
  Value zero = b.Compare("EQ", z, ComplexSplat(b, out.dtype, 0, out.shape));
  return One(b.Select(zero, ComplexSplat(b, out.dtype, 1, out.shape), q));
}

// linspace.out(start, end, steps): complex(linspace(re), linspace(im)).
Value ComplexLinspaceValue(Context& c, const std::vector<Arg>& a) {
  std::vector<TensorType> outs{PartType(Out(c))};
  auto part = [&](bool imag) {
    return Delegate(c, "linspace.out", outs,
                    {PartOf(c.b, a.at(0), imag), PartOf(c.b, a.at(1), imag), a.at(2)})[0];
  };
  return c.b.Complex(part(false), part(true));
}

std::vector<Value> ComplexLinspace(Context& c, const std::vector<Arg>& a) {
  return One(ComplexLinspaceValue(c, a));
}

// logspace.out(start, end, steps, base): base ** linspace(start, end, steps).
std::vector<Value> ComplexLogspace(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  Value exponent = ComplexLinspaceValue(c, a);
  return One(b.Binary("power", ComplexSplat(b, out.dtype, a.at(3).d, out.shape), exponent));
}

const bool registered = [] {
  RegisterComplex("addcdiv", ComplexAddcdiv);
  RegisterComplex("lerp.Scalar", ComplexLerp);
  RegisterComplex("lerp.Tensor", ComplexLerp);
  RegisterComplex("sinc", ComplexSinc);
  RegisterComplex("linspace.out", ComplexLinspace);
  RegisterComplex("logspace.out", ComplexLogspace);
  MarkComplexCapable({"linalg_cross", "scatter.reduce", "scatter.value_reduce", "addbmm"});
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
