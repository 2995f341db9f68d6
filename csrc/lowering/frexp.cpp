// frexp(x) -> (mantissa, exponent): x = mantissa * 2^exponent with
// |mantissa| in [0.5, 1), as std::frexp, from the f32 bit pattern:
// exponent = biased exponent field - 126, mantissa = x's sign and fraction
// under the exponent field of 0.5. A subnormal's fraction is normalized by
// its leading zeros (integer ops only). 0, inf and NaN give themselves with exponent
// 0 (CPU's values). 16-bit floats go through f32 exactly; f64 stays on the
// CPU kernel.
#include <cmath>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

using E = ElementType;

std::vector<Value> Frexp(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& mt = Out(c, 0);
  const TensorType& et = Out(c, 1);
  if (!hlo::IsFloat(mt.dtype) || mt.dtype == E::F64)
    throw Unsupported("frexp: only 16/32-bit floats are lowered");
  Value x = b.Convert(a.at(0).tensor, E::F32);
  if (x.rank() == 0) x = b.Reshape(x, {1});
  auto i = [&](int64_t v) { return b.BroadcastTo(b.ConstantInt(E::I32, v), x.shape()); };
  // Integer arithmetic only: XLA may flush subnormal floats to zero.
  Value bits = b.BitcastConvert(x, E::I32);
  Value field = b.Binary("and", b.Binary("shift_right_logical", bits, i(23)), i(0xff));
  Value frac = b.Binary("and", bits, i(0x7fffff));
  Value no_field = b.Compare("EQ", field, i(0)), no_frac = b.Compare("EQ", frac, i(0));
  Value subnormal = b.Binary("and", no_field, b.Unary("not", no_frac));
  // A subnormal's fraction shifted up until its top bit is the implicit one.
  Value shift = b.Select(subnormal, b.Binary("subtract", b.Unary("count_leading_zeros", frac), i(8)), i(0));
  frac = b.Binary("and", b.Binary("shift_left", frac, shift), i(0x7fffff));
  Value exponent = b.Select(subnormal, b.Binary("subtract", i(-125), shift),
                            b.Binary("subtract", field, i(126)));
  Value sign = b.Binary("and", bits, i(INT32_MIN));
  Value mbits = b.Binary("or", b.Binary("or", sign, i(0x3f000000)), frac);
  Value mantissa = b.BitcastConvert(mbits, E::F32);
  // (+-0 from the fields: a test of the bits against 0x7fffffff may be
  // rewritten into a float compare, which counts subnormals as zero.)
  Value plain = b.Binary("or", b.Binary("and", no_field, no_frac), b.Compare("EQ", field, i(0xff)));
  mantissa = b.Select(plain, x, mantissa);
  exponent = b.Select(plain, i(0), exponent);
  return {b.Reshape(b.Convert(mantissa, mt.dtype), mt.shape),
          b.Reshape(b.Convert(exponent, et.dtype), et.shape)};
}

const Registrar rule("frexp.Tensor", Frexp, {"frexp.Tensor_out"});

}  // namespace
}  // namespace torch_tpu::lowering
