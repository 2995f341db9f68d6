// nextafter(x, y): the next representable value after x toward y, in x's
// own format (bf16 steps by bf16 ulps, as CPU's c10 kernel). Integer ops on
// an ordered key of the bit pattern (key = bits for +, INT_MIN - bits for -:
// monotonic in the value, +0 and -0 both 0), so subnormals step exactly
// (XLA:CPU flushes subnormal floats in float arithmetic): NaN in gives NaN,
// x == y gives y, else key(x) +- 1 turned back into bits.
#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

using E = ElementType;

E BitsType(E t) {
  switch (t) {
    case E::BF16: case E::F16: return E::I16;
    case E::F32: return E::I32;
    case E::F64: return E::I64;
    default: throw Unsupported("nextafter of a non-float tensor");
  }
}

std::vector<Value> NextAfter(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  E it = BitsType(out.dtype);
  Value x = As(b, a.at(0), out.dtype, out.shape), y = As(b, a.at(1), out.dtype, out.shape);
  if (out.rank() == 0) x = b.Reshape(x, {1}), y = b.Reshape(y, {1});
  auto k = [&](int64_t v) { return b.BroadcastTo(b.ConstantInt(it, v), x.shape()); };
  int64_t lowest = it == E::I16 ? INT16_MIN : it == E::I32 ? INT32_MIN : INT64_MIN;
  Value zero = k(0), low = k(lowest);
  // key <-> bits: the same map both ways (an involution on each half).
  auto flip = [&](Value v) { return b.Select(b.Compare("LT", v, zero), b.Binary("subtract", low, v), v); };
  Value kx = flip(b.BitcastConvert(x, it)), ky = flip(b.BitcastConvert(y, it));
  Value step = b.Select(b.Compare("LT", kx, ky), k(1), k(-1));
  Value kr = b.Binary("add", kx, step);
  // Key 0 is +-0: stepping up from the negative side lands on -0 (CPU's).
  Value bits = b.Select(b.Binary("and", b.Compare("EQ", kr, zero), b.Compare("LT", kx, zero)), low, flip(kr));
  Value r = b.BitcastConvert(bits, out.dtype);
  Value nan = b.Binary("or", b.Compare("NE", x, x), b.Compare("NE", y, y));
  r = b.Select(b.Compare("EQ", kx, ky), y, r);
  r = b.Select(nan, b.Binary("add", x, y), r);
  return {b.Reshape(r, out.shape)};
}

const Registrar rule("nextafter", NextAfter, {"nextafter.out", "nextafter_"});

}  // namespace
}  // namespace torch_tpu::lowering
