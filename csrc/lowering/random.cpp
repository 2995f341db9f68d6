// Random number rules: counter-based bits (random_bits.cpp: ThreeFry keyed
// by the generator's seed, counted from its offset), a runtime parameter, so a seeded
// program reproduces run to run and a new draw never recompiles. The stream
// differs from PyTorch's CPU stream (as CUDA's does).
// Rules: uniform_, normal_, random_ (.from, .to, plain), bernoulli_.float,
// and randperm.generator_out: the permutation that sorts n random 64-bit
// keys (on device, reproducible under torch.manual_seed, not PyTorch's CPU
// stream). FromBits, under Uniform01 and TwoUniform01 (lowering.h), is the
// one place random bits become uniform floats.
#include <cmath>
#include <limits>
#include <string>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {

using K = Arg::Kind;

RuleEntry& DrawsAtRealSizes(RuleEntry& e) {
  e.Dynamic();
  e.overwrites_destination = true;
  e.dynamic.draws_at_real_sizes = true;
  return e;
}

const Arg& GeneratorArg(const std::vector<Arg>& a) {
  for (const Arg& x : a)
    if (x.kind == K::Generator) return x;
  throw std::logic_error("random rule called without a generator state");
}

namespace {

// Uniform [0, 1) floats from random bits (u32 -> f32, u64 -> f64): the
// mantissa's bits under an exponent of 1, minus 1.
Value FromBits(Builder& b, Value bits) {
  const bool wide = bits.dtype() == ElementType::U64;
  const std::vector<int64_t>& shape = bits.shape();
  ElementType ut = bits.dtype();
  ElementType ft = wide ? ElementType::F64 : ElementType::F32;
  int shift = wide ? 12 : 9;
  uint64_t one = wide ? 0x3FF0000000000000ULL : 0x3F800000ULL;
  Value mantissa = b.Binary("shift_right_logical", bits,
                            b.BroadcastInDim(b.ConstantInt(ut, shift), shape, {}));
  Value f = b.BitcastConvert(
      b.Binary("or", mantissa, b.BroadcastInDim(b.ConstantBits(ut, one), shape, {})), ft);
  return b.Binary("subtract", f, b.Splat(ft, 1.0, shape));
}

}  // namespace

Value Uniform01(Builder& b, Value state, const std::vector<int64_t>& shape, bool wide,
                const std::vector<Value>& real) {
  return FromBits(b, RandomBits(b, state, {wide ? ElementType::U64 : ElementType::U32, shape}, real));
}

std::pair<Value, Value> TwoUniform01(Builder& b, Value state, const std::vector<int64_t>& shape, bool wide,
                                     const std::vector<Value>& real) {
  if (!wide) {
    auto [w0, w1] = RandomWords(b, state, shape, real);
    return {FromBits(b, w0), FromBits(b, w1)};
  }
  std::vector<int64_t> shape2 = shape;
  shape2.insert(shape2.begin(), 2);
  std::vector<Value> real2 = real;
  if (!real2.empty()) real2.insert(real2.begin(), Value{});
  Value u = Uniform01(b, state, shape2, true, real2);
  std::vector<int64_t> start(shape2.size(), 0), limit = shape2, strides(shape2.size(), 1);
  limit[0] = 1;
  Value u1 = b.Reshape(b.Slice(u, start, limit, strides), shape);
  start[0] = 1;
  limit[0] = 2;
  return {u1, b.Reshape(b.Slice(u, start, limit, strides), shape)};
}

namespace {

using E = ElementType;

bool Wide(ElementType t) { return t == ElementType::F64 || t == ElementType::I64 || t == ElementType::U64; }

double DoubleArg(const Arg& a, double fallback) {
  if (a.kind == K::Double) return a.d;
  if (a.kind == K::Int) return static_cast<double>(a.i);
  return fallback;
}

// randperm.generator_out(int n, *, Generator? generator, Tensor(a!) out)
std::vector<Value> RandPerm(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = c.outputs.at(0);
  int64_t n = out.numel();
  // As the CPU kernel: n - 1 must be representable in the result dtype.
  auto limit = [&]() -> std::pair<int64_t, const char*> {
    switch (out.dtype) {
      case E::I8: return {127, "int8_t"};
      case E::U8: return {255, "uint8_t"};
      case E::I16: return {32767, "int16_t"};
      case E::I32: return {2147483647, "int32_t"};
      case E::F16: return {(1 << 11) + 1, "Half"};
      case E::BF16: return {(1 << 8) + 1, "BFloat16"};
      case E::F32: return {(1 << 24) + 1, "Float"};
      case E::F64: return {(int64_t{1} << 53) + 1, "Double"};
      default: return {std::numeric_limits<int64_t>::max(), "int64_t"};
    }
  }();
  if (hlo::IsFloat(out.dtype) ? n > limit.first : n - 1 > limit.first)
    throw std::invalid_argument(std::string("randperm: n = ") + std::to_string(n) +
                                " is too large for the result type " + limit.second);
  if (out.dtype == E::Bool) throw std::invalid_argument("randperm not implemented for 'Bool'");
  if (n == 0) return {b.Splat(out.dtype, 0, out.shape)};
  Value keys = RandomBits(b, GeneratorArg(a).tensor, TensorType{E::U64, {n}});
  Value idx = b.Iota(TensorType{E::I64, {n}}, 0);
  // Stable: (astronomically unlikely) equal keys still give a permutation.
  auto r = b.Sort({keys, idx}, 0, /*stable=*/true,
                  [](Builder& b, const std::vector<Value>& v) { return b.Compare("LT", v[0], v[1]); });
  return {b.Reshape(b.Convert(r[1], out.dtype), out.shape)};
}

const bool registered = [] {
  // uniform_(self, float from=0, float to=1, *, Generator? generator)
  DrawsAtRealSizes(Register("uniform_", [](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = c.outputs.at(0);
    if (!hlo::IsFloat(out.dtype)) throw Unsupported("uniform_ on a non-float tensor");
    bool wide = out.dtype == ElementType::F64;
    ElementType ft = wide ? ElementType::F64 : ElementType::F32;
    double from = DoubleArg(a.at(1), 0), to = DoubleArg(a.at(2), 1);
    Value u = Uniform01(c.b, GeneratorArg(a).tensor, out.shape, wide, RealSizes(c.b, a.at(0).tensor));
    Value v = c.b.Binary("add", c.b.Binary("multiply", u, c.b.Splat(ft, to - from, out.shape)),
                         c.b.Splat(ft, from, out.shape));
    return std::vector<Value>{c.b.Convert(v, out.dtype)};
  }));
  // normal_(self, float mean=0, float std=1, *, Generator? generator)
  DrawsAtRealSizes(Register("normal_", [](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = c.outputs.at(0);
    if (!hlo::IsFloat(out.dtype)) throw Unsupported("normal_ on a non-float tensor");
    bool wide = out.dtype == ElementType::F64;
    ElementType ft = wide ? ElementType::F64 : ElementType::F32;
    double mean = DoubleArg(a.at(1), 0), std = DoubleArg(a.at(2), 1);
    // Box-Muller.
    auto [u1, u2] = TwoUniform01(c.b, GeneratorArg(a).tensor, out.shape, wide, RealSizes(c.b, a.at(0).tensor));
    Value one = c.b.Splat(ft, 1.0, out.shape);
    Value r = c.b.Unary("sqrt", c.b.Binary("multiply", c.b.Splat(ft, -2.0, out.shape),
                                            c.b.Unary("log", c.b.Binary("subtract", one, u1))));
    Value z = c.b.Binary("multiply", r,
                         c.b.Unary("cosine", c.b.Binary("multiply", u2,
                                                        c.b.Splat(ft, 2 * M_PI, out.shape))));
    Value v = c.b.Binary("add", c.b.Binary("multiply", z, c.b.Splat(ft, std, out.shape)),
                         c.b.Splat(ft, mean, out.shape));
    return std::vector<Value>{c.b.Convert(v, out.dtype)};
  }));
  // random_.from(self, int from, int? to, *, Generator?), random_.to, random_
  auto random_range = [](Context& c, const std::vector<Arg>& a, int64_t from, uint64_t range) {
    const TensorType& out = c.outputs.at(0);
    Value bits = RandomBits(c.b, GeneratorArg(a).tensor, {ElementType::U64, out.shape}, RealSizes(c.b, a.at(0).tensor));
    Value r = c.b.Binary("remainder", bits,
                         c.b.BroadcastInDim(c.b.ConstantBits(ElementType::U64, range), out.shape, {}));
    Value v = c.b.Binary("add", c.b.BitcastConvert(r, ElementType::I64),
                         c.b.BroadcastInDim(c.b.ConstantInt(ElementType::I64, from), out.shape, {}));
    return std::vector<Value>{c.b.Convert(v, out.dtype)};
  };
  auto default_to = [](ElementType t) -> uint64_t {
    switch (t) {
      case ElementType::F32: return (1ULL << 24) + 1;
      case ElementType::F64: return (1ULL << 53) + 1;
      case ElementType::F16: return (1ULL << 11) + 1;
      case ElementType::BF16: return (1ULL << 8) + 1;
      case ElementType::Bool: return 2;
      case ElementType::I8: return 128;
      case ElementType::U8: return 256;
      case ElementType::I16: return 1ULL << 15;
      case ElementType::I32: return 1ULL << 31;
      default: return 1ULL << 63;
    }
  };
  DrawsAtRealSizes(Register("random_.from", [=](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = c.outputs.at(0);
    int64_t from = a.at(1).i;
    uint64_t range = a.at(2).kind == K::Int ? static_cast<uint64_t>(a.at(2).i - from)
                                            : default_to(out.dtype) - static_cast<uint64_t>(from);
    if (range == 0) throw std::invalid_argument("random_ expects 'from' < 'to'");
    return random_range(c, a, from, range);
  }));
  DrawsAtRealSizes(Register("random_.to", [=](Context& c, const std::vector<Arg>& a) {
    if (a.at(1).i <= 0) throw std::invalid_argument("random_ expects 'from' < 'to'");
    return random_range(c, a, 0, static_cast<uint64_t>(a.at(1).i));
  }));
  DrawsAtRealSizes(Register("random_", [=](Context& c, const std::vector<Arg>& a) {
    return random_range(c, a, 0, default_to(c.outputs.at(0).dtype));
  }));
  // bernoulli_.float(self, float p=0.5, *, Generator?)
  DrawsAtRealSizes(Register("bernoulli_.float", [](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = c.outputs.at(0);
    Value u = Uniform01(c.b, GeneratorArg(a).tensor, out.shape, false, RealSizes(c.b, a.at(0).tensor));
    Value hit = c.b.Compare("LT", u, c.b.Splat(ElementType::F32, DoubleArg(a.at(1), 0.5), out.shape));
    return std::vector<Value>{c.b.Convert(hit, out.dtype)};
  }));
  RegisterRandom("randperm.generator_out", RandPerm);
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
