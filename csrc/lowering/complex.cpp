// Complex numbers: which generic rules take complex values as they are, the
// rules whose complex form differs (abs, angle, sgn, pow, conj_physical),
// and the constructors (complex, polar). See RegisterComplex in lowering.h:
// a generic rule not listed here sends a complex op to the CPU fallback.
#include <cmath>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

using K = Arg::Kind;

// The output dtype's value of arg i, broadcast to the output shape.
Value In(Context& c, const Arg& a, size_t out = 0) {
  return As(c.b, a, Out(c, out).dtype, Out(c, out).shape);
}

Value Abs(Builder& b, Value x) {
  if (!hlo::IsComplex(x.dtype())) return b.Unary("abs", x);
  return b.Op1("stablehlo.abs", {x}, TensorType{hlo::RealPart(x.dtype()), x.shape()});
}

std::vector<Value> AbsRule(Context& c, const std::vector<Arg>& a) {
  Value x = a[0].tensor;
  return One(c.b.Convert(Abs(c.b, x), Out(c).dtype));
}

// angle: atan2(imag, real) for complex; for real x, pi where x < 0, NaN
// stays NaN, else 0 (ATen's angle_impl).
std::vector<Value> AngleRule(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value x = a[0].tensor;
  const TensorType& out = Out(c);
  if (hlo::IsComplex(x.dtype())) return One(b.Convert(b.Binary("atan2", b.Imag(x), b.Real(x)), out.dtype));
  ElementType ct = ComputeType(out.dtype);
  Value xf = As(b, x, ct, out.shape);
  Value zero = b.Splat(ct, 0, out.shape);
  Value r = b.Select(b.Compare("LT", xf, zero), b.Splat(ct, M_PI, out.shape), zero);
  r = b.Select(b.Compare("NE", xf, xf), xf, r);
  return One(b.Convert(r, out.dtype));
}

// sgn(z) = z / |z|, 0 at 0.
std::vector<Value> ComplexSgn(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value z = In(c, a[0]);
  Value r = Abs(b, z);
  Value zero = b.Splat(r.dtype(), 0, r.shape());
  Value unit = b.Binary("divide", z, b.Complex(r, zero));
  return One(b.Select(b.Compare("EQ", r, zero), b.Splat(z.dtype(), 0, z.shape()), unit));
}

std::vector<Value> ComplexPow(Context& c, const std::vector<Arg>& a) {
  return One(c.b.Binary("power", In(c, a[0]), In(c, a[1])));
}

// conj_physical: re - i im; real values are their own conjugate.
std::vector<Value> ConjPhysical(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value x = In(c, a[0]);
  if (!hlo::IsComplex(x.dtype())) return One(x);
  return One(b.Complex(b.Real(x), b.Unary("negate", b.Imag(x))));
}

// complex(real, imag) and polar(abs, angle): parts in the output's part type.
std::vector<Value> ComplexFromParts(Context& c, const std::vector<Arg>& a) {
  ElementType part = hlo::RealPart(Out(c).dtype);
  const auto& shape = Out(c).shape;
  return One(c.b.Complex(As(c.b, a[0], part, shape), As(c.b, a[1], part, shape)));
}

std::vector<Value> Polar(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  ElementType part = hlo::RealPart(Out(c).dtype);
  const auto& shape = Out(c).shape;
  Value r = As(b, a[0], part, shape), theta = As(b, a[1], part, shape);
  return One(b.Complex(b.Binary("multiply", r, b.Unary("cosine", theta)),
                       b.Binary("multiply", r, b.Unary("sine", theta))));
}

const bool registered = [] {
  // Generic rules that are right for complex values as written: copies,
  // data movement, +-*/, the unary math StableHLO defines on complex
  // numbers, matmuls and sums.
  MarkComplexCapable({
      "_tpu_copy", "clone", "cat", "stack", "index_select", "gather", "flip", "roll",
      "repeat", "constant_pad_nd", "where.self", "where.ScalarOther", "where.ScalarSelf",
      "fill.Scalar", "fill.Tensor", "zero", "zeros_like", "ones_like", "full_like",
      "masked_fill.Scalar", "masked_fill.Tensor", "index_put", "index_copy", "index_add",
      "scatter.src", "scatter_add", "tril", "triu", "diagonal_scatter", "slice_scatter",
      "select_scatter", "_unsafe_index.Tensor", "_unsafe_index_put", "_index_put_impl",
      "masked_scatter",
      "add.Tensor", "add.Scalar", "sub.Tensor", "sub.Scalar", "rsub.Tensor", "rsub.Scalar",
      "mul.Tensor", "mul.Scalar", "div.Tensor", "div.Scalar", "neg", "reciprocal",
      "exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh",
      "sigmoid", "log2", "log10", "eq.Tensor", "eq.Scalar", "ne.Tensor", "ne.Scalar",
      "mm", "bmm", "addmm", "baddbmm", "dot", "mv", "addmv",
      "sum", "sum.dim_IntList", "mean", "mean.dim", "prod", "prod.dim_int",
  });
  RegisterComplex("abs", AbsRule);
  RegisterComplex("sgn", ComplexSgn);
  for (const char* name : {"pow.Tensor_Tensor", "pow.Tensor_Scalar", "pow.Scalar"})
    RegisterComplex(name, ComplexPow);
  Register("angle", AngleRule, {"angle.out"});
  Register("conj_physical", ConjPhysical, {"conj_physical.out", "conj_physical_", "_conj_physical"});
  Register("complex", ComplexFromParts, {"complex.out"});
  Register("polar", Polar, {"polar.out"});
  MarkComplexCapable({"angle", "conj_physical", "complex", "polar"});
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
