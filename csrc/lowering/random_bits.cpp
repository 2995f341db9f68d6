// Counter-based random bits: every element's bits are ThreeFry-2x32 (20
// rounds, Salmon et al. 2011, as JAX's threefry_2x32) of the generator's
// seed as key and (its offset + the element's counter) as counter, where
// the counter comes from the element's row-major index among the real
// elements. So a draw does not depend on the shape it was computed at: a
// bounded-dynamic module (its dims at a bucket, the real sizes at run time)
// draws for the real elements exactly the bits the exact-shape module draws,
// and the padding's draws are never read. One counter gives 64 bits: a
// 64-bit element takes counter j, a 32-bit one word j % 2 of counter j / 2,
// so a call of n 32-bit (or n / 2 64-bit) elements uses counters
// offset .. offset + n / 2 (DrawPerOutputElement's n + 1 covers them);
// RandomWords gives both words of counter j to element j (a Box-Muller pair).
#include "lowering/lowering.h"

namespace torch_tpu::lowering {

namespace {

using E = ElementType;

Value U32(Builder& b, uint32_t v, const std::vector<int64_t>& shape) {
  return b.BroadcastInDim(b.ConstantBits(E::U32, v), shape, {});
}

Value U64(Builder& b, uint64_t v, const std::vector<int64_t>& shape) {
  return b.BroadcastInDim(b.ConstantBits(E::U64, v), shape, {});
}

Value RotateLeft(Builder& b, Value x, int r) {
  const auto& s = x.shape();
  return b.Binary("or", b.Binary("shift_left", x, U32(b, r, s)),
                  b.Binary("shift_right_logical", x, U32(b, 32 - r, s)));
}

// The low and high 32-bit words of u64 `x`.
std::pair<Value, Value> Words(Builder& b, Value x) {
  Value hi = b.Binary("shift_right_logical", x, U64(b, 32, x.shape()));
  return {b.Convert(x, E::U32), b.Convert(hi, E::U32)};
}

// ThreeFry-2x32-20 of counters `ctr` (u64, any shape) under the scalar u64
// key `key`: the two output words.
std::pair<Value, Value> ThreeFry(Builder& b, Value key, Value ctr) {
  const std::vector<int64_t>& shape = ctr.shape();
  auto [k0s, k1s] = Words(b, key);
  Value ks[3] = {b.BroadcastInDim(k0s, shape, {}), b.BroadcastInDim(k1s, shape, {}), Value{}};
  ks[2] = b.Binary("xor", b.Binary("xor", ks[0], ks[1]), U32(b, 0x1BD11BDA, shape));
  auto [x0, x1] = Words(b, ctr);
  x0 = b.Binary("add", x0, ks[0]);
  x1 = b.Binary("add", x1, ks[1]);
  static const int kRotations[2][4] = {{13, 15, 26, 6}, {17, 29, 16, 24}};
  for (int i = 0; i < 5; ++i) {
    for (int r : kRotations[i % 2]) {
      x0 = b.Binary("add", x0, x1);
      x1 = b.Binary("xor", RotateLeft(b, x1, r), x0);
    }
    x0 = b.Binary("add", x0, ks[(i + 1) % 3]);
    x1 = b.Binary("add", b.Binary("add", x1, ks[(i + 2) % 3]), U32(b, i + 1, shape));
  }
  return {x0, x1};
}

// Each element's row-major index among the real elements (u64): dim d's
// index times the product of the later dims' real sizes.
Value FlatIndex(Builder& b, const std::vector<int64_t>& shape, const std::vector<Value>& real) {
  TensorType t{E::U64, shape};
  Value flat = U64(b, 0, shape);
  Value stride = b.ConstantBits(E::U64, 1);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    flat = b.Binary("add", flat, b.Binary("multiply", b.Iota(t, d), b.BroadcastInDim(stride, shape, {})));
    const bool dynamic = d < static_cast<int64_t>(real.size()) && real[d].valid();
    Value size = dynamic ? b.Convert(real[d], E::U64) : b.ConstantBits(E::U64, static_cast<uint64_t>(shape[d]));
    stride = b.Binary("multiply", stride, size);
  }
  return flat;
}

// The two words of counter offset + `counter` (u64 of the result's shape).
std::pair<Value, Value> WordsAt(Builder& b, Value state, Value counter) {
  Value seed = b.Reshape(b.Slice(state, {0}, {1}, {1}), {});
  Value offset = b.BroadcastInDim(b.Reshape(b.Slice(state, {1}, {2}, {1}), {}), counter.shape(), {});
  return ThreeFry(b, seed, b.Binary("add", offset, counter));
}

}  // namespace

std::pair<Value, Value> RandomWords(Builder& b, Value state, const std::vector<int64_t>& shape,
                                    const std::vector<Value>& real) {
  return WordsAt(b, state, FlatIndex(b, shape, real));
}

Value RandomBits(Builder& b, Value state, const TensorType& type, const std::vector<Value>& real) {
  const bool wide = type.dtype == E::U64;
  if (!wide && type.dtype != E::U32) throw std::logic_error("RandomBits: u32 or u64 bits only");
  Value j = FlatIndex(b, type.shape, real);
  auto [x0, x1] = WordsAt(b, state, wide ? j : b.Binary("shift_right_logical", j, U64(b, 1, type.shape)));
  if (wide) {
    Value hi = b.Binary("shift_left", b.Convert(x1, E::U64), U64(b, 32, type.shape));
    return b.Binary("or", hi, b.Convert(x0, E::U64));
  }
  Value odd = b.Compare("EQ", b.Binary("and", j, U64(b, 1, type.shape)), U64(b, 1, type.shape));
  return b.Select(odd, x1, x0);
}

}  // namespace torch_tpu::lowering
