#include "runtime/scalar_bytes.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

namespace torch_tpu::runtime {

namespace {

using E = hlo::ElementType;

template <typename T>
ScalarBytes Bytes(T v) {
  ScalarBytes b;
  std::memcpy(b.data, &v, sizeof(T));
  b.size = sizeof(T);
  return b;
}

// A binary float format with `exp_bits` exponent and `man_bits` mantissa
// bits. `finite_only`: no infinities, the all-ones pattern is NaN, the top
// exponent holds finite values (float8_e4m3fn).
struct FloatFormat {
  int exp_bits, man_bits;
  bool finite_only;
};

uint32_t EncodeFloat(double v, FloatFormat f) {
  const uint32_t sign = std::signbit(v) ? 1u << (f.exp_bits + f.man_bits) : 0u;
  const uint32_t exp_all = (1u << f.exp_bits) - 1;
  const uint32_t man_all = (1u << f.man_bits) - 1;
  if (std::isnan(v)) return f.finite_only ? sign | (exp_all << f.man_bits) | man_all
                                          : (exp_all << f.man_bits) | (1u << (f.man_bits - 1));
  const int bias = (1 << (f.exp_bits - 1)) - 1;
  // Largest finite value: exponent field and mantissa of the top pattern.
  const int top_exp = f.finite_only ? static_cast<int>(exp_all) - bias : static_cast<int>(exp_all) - 1 - bias;
  const uint32_t top_man = f.finite_only ? man_all - 1 : man_all;
  const double max_finite = std::ldexp(1.0 + static_cast<double>(top_man) / (1u << f.man_bits), top_exp);
  const uint32_t inf_or_max = f.finite_only
                                  ? sign | (static_cast<uint32_t>(top_exp + bias) << f.man_bits) | top_man
                                  : sign | (exp_all << f.man_bits);
  double a = std::fabs(v);
  if (std::isinf(a)) return inf_or_max;
  if (a == 0) return sign;
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  e = std::max(e - 1, 1 - bias);  // the binade (subnormals share the lowest)
  double q = std::nearbyint(std::ldexp(a, f.man_bits - e));  // ties to even
  if (std::ldexp(q, e - f.man_bits) > max_finite) return inf_or_max;
  if (q >= static_cast<double>(2u << f.man_bits)) {  // rounded up into the next binade
    ++e;
    q /= 2;
  }
  uint32_t mant = static_cast<uint32_t>(q);
  if (mant < (1u << f.man_bits)) return sign | mant;  // subnormal
  return sign | (static_cast<uint32_t>(e + bias) << f.man_bits) | (mant & man_all);
}

// The float types; false for the others.
bool EncodeAsFloat(double v, E t, ScalarBytes* out) {
  switch (t) {
    case E::F64: *out = Bytes(v); return true;
    case E::F32: *out = Bytes(static_cast<float>(v)); return true;
    case E::F16: *out = Bytes(static_cast<uint16_t>(EncodeFloat(v, {5, 10, false}))); return true;
    case E::BF16: *out = Bytes(static_cast<uint16_t>(EncodeFloat(v, {8, 7, false}))); return true;
    case E::F8E5M2: *out = Bytes(static_cast<uint8_t>(EncodeFloat(v, {5, 2, false}))); return true;
    case E::F8E4M3FN: *out = Bytes(static_cast<uint8_t>(EncodeFloat(v, {4, 3, true}))); return true;
    default: return false;
  }
}

// Bool and the integer types; false for the others.
bool EncodeAsInteger(int64_t v, E t, ScalarBytes* out) {
  switch (t) {
    case E::Bool: *out = Bytes(static_cast<uint8_t>(v != 0)); return true;
    case E::I8: *out = Bytes(static_cast<int8_t>(v)); return true;
    case E::I16: *out = Bytes(static_cast<int16_t>(v)); return true;
    case E::I32: *out = Bytes(static_cast<int32_t>(v)); return true;
    case E::I64: *out = Bytes(v); return true;
    case E::U8: *out = Bytes(static_cast<uint8_t>(v)); return true;
    case E::U16: *out = Bytes(static_cast<uint16_t>(v)); return true;
    case E::U32: *out = Bytes(static_cast<uint32_t>(v)); return true;
    case E::U64: *out = Bytes(static_cast<uint64_t>(v)); return true;
    default: return false;
  }
}

[[noreturn]] void NoEncoding(E t) {
  throw std::invalid_argument(std::string("no scalar parameter of element type ") + hlo::Name(t));
}

}  // namespace

ScalarBytes EncodeScalar(double v, hlo::ElementType t) {
  ScalarBytes b;
  if (EncodeAsFloat(v, t, &b)) return b;
  if (t == E::Bool) return Bytes(static_cast<uint8_t>(v != 0));
  if (EncodeAsInteger(static_cast<int64_t>(v), t, &b)) return b;
  NoEncoding(t);
}

ScalarBytes EncodeScalar(int64_t v, hlo::ElementType t) {
  ScalarBytes b;
  if (EncodeAsInteger(v, t, &b)) return b;
  if (EncodeAsFloat(static_cast<double>(v), t, &b)) return b;
  NoEncoding(t);
}

}  // namespace torch_tpu::runtime
