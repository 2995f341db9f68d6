// Random distributions built on the uniform / normal draws of random.cpp:
// exponential_, cauchy_, geometric_, log_normal_, bernoulli_ with a tensor of
// probabilities, and normal with tensor mean / std. Each inverts the CDF of
// its distribution over u ~ U[0, 1) (computed in f32, f64 for f64 outputs);
// the stream differs from CPU's, the distribution is the same.
#include <cmath>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

using K = Arg::Kind;

bool Wide(const TensorType& t) { return t.dtype == ElementType::F64; }
ElementType FloatType(const TensorType& t) { return Wide(t) ? ElementType::F64 : ElementType::F32; }
Value Like(Builder& b, const Value& x, double v) { return b.Splat(x.dtype(), v, x.shape()); }

void RequireFloat(const TensorType& out, const std::string& op) {
  if (!hlo::IsFloat(out.dtype)) throw Unsupported(op + " on a non-float tensor");
}

// 1 - u: in (0, 1], so its log is finite.
Value OneMinusU(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  Value u = Uniform01(c.b, GeneratorArg(a).tensor, out.shape, Wide(out));
  return c.b.Binary("subtract", Like(c.b, u, 1), u);
}

// Standard normal draws of the output's shape (normal_'s rule, Box-Muller), float type.
Value StandardNormal(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  Context sub{c.b};
  sub.outputs = {TensorType{FloatType(out), out.shape}};
  Arg self, zero, one;
  self.kind = K::Tensor;
  self.tensor = c.b.Splat(FloatType(out), 0, out.shape);
  zero.kind = one.kind = K::Double;
  one.d = 1;
  return Find("normal_")->rule(sub, {self, zero, one, GeneratorArg(a)}).at(0);
}

std::vector<Value> Exponential(Context& c, const std::vector<Arg>& a) {
  RequireFloat(Out(c), "exponential_");
  Builder& b = c.b;
  Value v = OneMinusU(c, a);
  Value r = b.Binary("divide", b.Unary("negate", b.Unary("log", v)), Like(b, v, a.at(1).d));
  return One(b.Convert(r, Out(c).dtype));
}

std::vector<Value> Cauchy(Context& c, const std::vector<Arg>& a) {
  RequireFloat(Out(c), "cauchy_");
  Builder& b = c.b;
  Value v = OneMinusU(c, a);
  Value angle = b.Binary("multiply", Like(b, v, M_PI), b.Binary("subtract", v, Like(b, v, 0.5)));
  Value r = b.Binary("add", Like(b, v, a.at(1).d),
                     b.Binary("multiply", Like(b, v, a.at(2).d), b.Unary("tan", angle)));
  return One(b.Convert(r, Out(c).dtype));
}

// geometric_(p): the number of Bernoulli(p) trials up to the first success (>= 1).
std::vector<Value> Geometric(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value v = OneMinusU(c, a);
  Value r = b.Unary("ceil", b.Binary("divide", b.Unary("log", v), Like(b, v, std::log1p(-a.at(1).d))));
  r = MaxMin(b, r, Like(b, r, 1), true);
  return One(b.Convert(r, Out(c).dtype));
}

std::vector<Value> LogNormal(Context& c, const std::vector<Arg>& a) {
  RequireFloat(Out(c), "log_normal_");
  Builder& b = c.b;
  Value z = StandardNormal(c, a);
  Value r = b.Unary("exponential", b.Binary("add", Like(b, z, a.at(1).d),
                                            b.Binary("multiply", Like(b, z, a.at(2).d), z)));
  return One(b.Convert(r, Out(c).dtype));
}

// bernoulli_.Tensor(self, p): 1 where u < p.
std::vector<Value> BernoulliTensor(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  Builder& b = c.b;
  Value u = Uniform01(b, GeneratorArg(a).tensor, out.shape, Wide(out));
  Value p = As(b, a.at(1), u.dtype(), out.shape);
  return One(b.Convert(b.Compare("LT", u, p), out.dtype));
}

// normal(mean, std) with either or both a tensor: mean + std * z.
std::vector<Value> NormalTensors(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  RequireFloat(out, "normal");
  Builder& b = c.b;
  Value z = StandardNormal(c, a);
  auto operand = [&](const Arg& x) {
    return x.kind == K::Double ? Like(b, z, x.d) : As(b, x, z.dtype(), out.shape);
  };
  Value r = b.Binary("add", operand(a.at(0)), b.Binary("multiply", operand(a.at(1)), z));
  return One(b.Convert(r, out.dtype));
}

const bool registered = [] {
  Register("exponential_", Exponential);
  Register("cauchy_", Cauchy);
  Register("geometric_", Geometric);
  Register("log_normal_", LogNormal);
  Register("bernoulli_.Tensor", BernoulliTensor);
  Register("normal.Tensor_float", NormalTensors);
  Register("normal.float_Tensor", NormalTensors);
  Register("normal.Tensor_Tensor", NormalTensors);
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
