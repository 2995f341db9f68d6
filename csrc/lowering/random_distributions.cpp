// Random distributions built on the uniform / normal draws of random.cpp:
// exponential_, cauchy_, geometric_, log_normal_, bernoulli_ with a tensor of
// probabilities, and normal with tensor mean / std. Each inverts the CDF of
// its distribution over u ~ U[0, 1) (computed in f32, f64 for f64 outputs);
// the stream differs from CPU's, the distribution is the same.
// multinomial (categorical draws from [C] or [B, C] weights, with or without
// replacement) too: inverse CDF with replacement, Gumbel-top-k without.
#include <algorithm>
#include <cmath>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

using K = Arg::Kind;
using E = ElementType;

bool Wide(const TensorType& t) { return t.dtype == ElementType::F64; }
ElementType FloatType(const TensorType& t) { return Wide(t) ? ElementType::F64 : ElementType::F32; }
Value Like(Builder& b, const Value& x, double v) { return b.Splat(x.dtype(), v, x.shape()); }

void RequireFloat(const TensorType& out, const std::string& op) {
  if (!hlo::IsFloat(out.dtype)) throw Unsupported(op + " on a non-float tensor");
}

// 1 - u: in (0, 1], so its log is finite.
Value OneMinusU(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  Value u = Uniform01(c.b, GeneratorArg(a).tensor, out.shape, Wide(out), RealSizes(c.b, a.at(0).tensor));
  return c.b.Binary("subtract", Like(c.b, u, 1), u);
}

// Standard normal draws of the output's shape (normal_'s rule, Box-Muller),
// float type, drawn at the real sizes of `like` (a value of the output's
// shape, bounded-dynamic where the output is).
Value StandardNormal(Context& c, const std::vector<Arg>& a, const Value& like) {
  const TensorType& out = Out(c);
  Context sub{c.b};
  sub.outputs = {TensorType{FloatType(out), out.shape}};
  Arg self, zero, one;
  self.kind = K::Tensor;
  self.tensor = like;
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
  Value z = StandardNormal(c, a, a.at(0).tensor);
  Value r = b.Unary("exponential", b.Binary("add", Like(b, z, a.at(1).d),
                                            b.Binary("multiply", Like(b, z, a.at(2).d), z)));
  return One(b.Convert(r, Out(c).dtype));
}

// bernoulli_.Tensor(self, p): 1 where u < p.
std::vector<Value> BernoulliTensor(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  Builder& b = c.b;
  Value u = Uniform01(b, GeneratorArg(a).tensor, out.shape, Wide(out), RealSizes(b, a.at(0).tensor));
  Value p = As(b, a.at(1), u.dtype(), out.shape);
  return One(b.Convert(b.Compare("LT", u, p), out.dtype));
}

// A value of the output's shape bounded-dynamic where a tensor arg is: each
// dim takes the runtime size of the first tensor arg (aligned at the right,
// as they broadcast) that has it dynamic and not of size 1 there.
Value BroadcastRealSizes(Builder& b, const TensorType& out, const std::vector<Arg>& args) {
  const int64_t rank = static_cast<int64_t>(out.shape.size());
  std::vector<Value> real(out.shape.size());
  for (const Arg& x : args) {
    if (x.kind != K::Tensor) continue;
    const std::vector<Value> own = RealSizes(b, x.tensor);
    const int64_t offset = rank - x.tensor.rank();
    for (int64_t i = 0; i < x.tensor.rank(); ++i)
      if (own[i].valid() && !real[i + offset].valid() && x.tensor.shape()[i] == out.shape[i + offset])
        real[i + offset] = own[i];
  }
  return WithRealSizes(b, b.Splat(FloatType(out), 0, out.shape), real);
}

// normal(mean, std) with either or both a tensor: mean + std * z, z drawn
// at the real sizes of mean and std broadcast.
std::vector<Value> NormalTensors(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  RequireFloat(out, "normal");
  Builder& b = c.b;
  auto operand = [&](const Arg& x) {
    return x.kind == K::Double ? b.Splat(FloatType(out), x.d, out.shape) : As(b, x, FloatType(out), out.shape);
  };
  Value mean = operand(a.at(0)), std = operand(a.at(1));
  Value z = StandardNormal(c, a, BroadcastRealSizes(b, out, {a.at(0), a.at(1)}));
  Value r = b.Binary("add", mean, b.Binary("multiply", std, z));
  return One(b.Convert(r, out.dtype));
}

// Inclusive cumulative sum along the last dim of a [B, C] f32 value.
Value CumsumLast(Builder& b, Value x) {
  int64_t rows = x.shape()[0], cols = x.shape()[1];
  return b.ReduceWindow({x}, {b.ConstantInt(x.dtype(), 0)}, {rows, cols}, {1, cols}, {1, 1}, {1, 1},
                        {0, cols - 1}, {0, 0}, [](Builder& b, const std::vector<Value>& v) {
                          return std::vector<Value>{b.Binary("add", v[0], v[1])};
                        })[0];
}

// multinomial(self, num_samples, replacement, *, generator). self is [C] or
// [B, C] non-negative weights. With replacement: inverse CDF (the number of
// cdf entries <= u); without: Gumbel-top-k.
std::vector<Value> Multinomial(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  Builder& b = c.b;
  Value p0 = a[0].tensor;
  if (p0.rank() < 1 || p0.rank() > 2) throw Unsupported("multinomial: rank must be 1 or 2");
  int64_t cats = p0.shape().back();
  int64_t rows = p0.rank() == 2 ? p0.shape()[0] : 1;
  int64_t n = a[1].i;
  bool replacement = a[2].kind == K::Bool && a[2].i != 0;
  if (!replacement && n > cats)
    throw std::invalid_argument(
        "cannot sample n_sample > prob_dist.size(-1) samples without replacement");
  if (out.numel() == 0 || cats == 0) return One(Zeros(b, out));
  Value state = GeneratorArg(a).tensor;
  // A bounded-dynamic batch of rows draws at its real rows (the exact shape's draws).
  std::vector<Value> real_rows{p0.rank() == 2 ? RealSizes(b, p0)[0] : Value{}, Value{}};
  Value p = b.Reshape(b.Convert(p0, E::F32), {rows, cats});
  Value zero = b.Splat(E::F32, 0, {rows, cats});
  // Validity: non-negative, finite, positive sum.
  Value ok_elem = b.Binary("and", b.Compare("GE", p, zero),
                           b.Compare("LT", p, b.BroadcastInDim(b.MaxValue(E::F32), {rows, cats}, {})));
  Value ok = b.Reduce(ok_elem, b.ConstantInt(E::Bool, 1), {0, 1}, "and");
  Value nonzero = b.Compare("GT", p, zero);
  Value nz_count = b.Reduce(b.Convert(nonzero, E::I64), b.ConstantInt(E::I64, 0), {1}, "add");
  Value min_nz = b.Reduce(nz_count, b.MaxValue(E::I64), {0}, "minimum");
  Value need = b.ConstantInt(E::I64, replacement ? 1 : n);
  c.Require(b.Binary("and", ok, b.Compare("GE", min_nz, need)),
            "invalid multinomial distribution (negative, inf or NaN "
            "probabilities, or not enough non-zero categories)");
  std::vector<int64_t> rs{rows, n, cats};
  Value iota_c = b.Iota(TensorType{E::I64, {rows, cats}}, 1);
  Value r;
  if (replacement) {
    Value cdf = CumsumLast(b, p);
    Value total = b.Slice(cdf, {0, cats - 1}, {rows, cats}, {1, 1});  // [rows, 1]
    cdf = b.Binary("divide", cdf, b.BroadcastInDim(b.Reshape(total, {rows}), {rows, cats}, {0}));
    Value u = Uniform01(b, state, {rows, n}, false, real_rows);
    Value le = b.Compare("LE", b.BroadcastInDim(cdf, rs, {0, 2}), b.BroadcastInDim(u, rs, {0, 1}));
    Value cnt = b.Reduce(b.Convert(le, E::I64), b.ConstantInt(E::I64, 0), {2}, "add");
    // Never past the last category of non-zero weight (float rounding).
    Value last = b.Reduce(b.Select(nonzero, iota_c, b.Splat(E::I64, -1, {rows, cats})),
                          b.ConstantInt(E::I64, -1), {1}, "maximum");
    r = b.Binary("minimum", cnt, b.BroadcastInDim(last, {rows, n}, {0}));
  } else {
    Value u = Uniform01(b, state, {rows, cats}, false, real_rows);
    u = b.Binary("maximum", u, b.Splat(E::F32, 1e-30, {rows, cats}));
    Value g = b.Unary("negate", b.Unary("log", b.Unary("negate", b.Unary("log", u))));
    Value keys = b.Binary("add", b.Unary("log", p), g);
    // Zero weights: -inf keys, never chosen (sort puts them last).
    keys = b.Select(nonzero, keys, b.BroadcastInDim(b.MinValue(E::F32), {rows, cats}, {}));
    auto sorted = b.Sort({keys, iota_c}, 1, /*stable=*/true,
                         [](Builder& b, const std::vector<Value>& v) { return b.Compare("GT", v[0], v[1]); });
    r = b.Slice(sorted[1], {0, 0}, {rows, n}, {1, 1});
  }
  return One(b.Reshape(b.Convert(r, out.dtype), out.shape));
}

const bool registered = [] {
  DrawsAtRealSizes(Register("exponential_", Exponential));
  DrawsAtRealSizes(Register("cauchy_", Cauchy));
  DrawsAtRealSizes(Register("geometric_", Geometric));
  DrawsAtRealSizes(Register("log_normal_", LogNormal));
  DrawsAtRealSizes(Register("bernoulli_.Tensor", BernoulliTensor));
  // Bounded dynamic: the draws at the real sizes of mean and std broadcast.
  for (const char* name : {"normal.Tensor_float", "normal.float_Tensor", "normal.Tensor_Tensor"})
    Register(name, NormalTensors).Dynamic().dynamic.draws_at_real_sizes = true;
  // Without replacement it draws a key per category: more than its samples.
  // Bounded dynamic in its rows (sampling generate() at a new batch size),
  // drawn at the real rows; the categories stay static.
  RuleEntry& multinomial =
      RegisterRandom("multinomial", Multinomial, [](const std::vector<Arg>& a, const std::vector<TensorType>& outputs) {
        uint64_t cats = a[0].tensor.rank() > 0 ? static_cast<uint64_t>(a[0].tensor.shape().back()) : 1;
        uint64_t rows = a[0].tensor.rank() == 2 ? static_cast<uint64_t>(a[0].tensor.shape()[0]) : 1;
        return std::max(DrawPerOutputElement(a, outputs), rows * cats + 1);
      }).Dynamic([](const std::vector<Arg>&, StaticDims& s) {
        if (s.Rank(0) > 0) s.Dim(0, s.Rank(0) - 1);
        s.Because("the categories");
      });
  multinomial.dynamic.draws_at_real_sizes = true;
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
