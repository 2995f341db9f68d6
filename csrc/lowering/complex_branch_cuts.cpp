// asin / acos / asinh / acosh of complex values: CHLO's complex forms with
// the signs C99 (and so PyTorch's CPU, through std::) gives on and off the
// branch cuts. CHLO ignores the sign of a zero on a cut (asinh(-0 - 2i):
// CHLO +1.317 - 1.571i, CPU -1.317 - 1.571i); the principal values' signs
// follow from the symmetries f(conj z) = conj f(z) of all four and:
//  - asin, asinh are odd: the result lies in z's quadrant (each part has the
//    sign of z's part, zeros included);
//  - acos: real part in [0, pi], imaginary part of the sign of -im(z);
//  - acosh: real part >= 0, imaginary part of the sign of im(z).
// So the rule takes CHLO's magnitudes and sets these signs, then C99's
// values for NaN inputs (NanCases).
#include <cmath>
#include <string>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

// Whether x's sign bit is set (-0 and negative NaNs included).
Value SignBit(Builder& b, Value x) {
  ElementType bits = x.dtype() == ElementType::F64 ? ElementType::I64 : ElementType::I32;
  Value i = b.BitcastConvert(x, bits);
  return b.Compare("LT", i, b.BroadcastInDim(b.ConstantInt(bits, 0), x.shape(), {}));
}

// |m| with the sign bit `negative`.
Value WithSign(Builder& b, Value m, Value negative) {
  Value a = b.Unary("abs", m);
  return b.Select(negative, b.Unary("negate", a), a);
}

enum class Sign { OfRe, OfIm, OfNegIm, Positive };

Value Signed(Builder& b, Value part, Value z, Sign s) {
  switch (s) {
    case Sign::OfRe: return WithSign(b, part, SignBit(b, b.Real(z)));
    case Sign::OfIm: return WithSign(b, part, SignBit(b, b.Imag(z)));
    case Sign::OfNegIm: return WithSign(b, part, b.Unary("not", SignBit(b, b.Imag(z))));
    case Sign::Positive: return b.Unary("abs", part);
  }
  return part;
}

// A NaN part and no infinite one: C99 gives NaN + NaN i except where the
// other part is a zero (asinh(NaN + 0i) = NaN + 0i, asin(0 + NaN i) =
// 0 + NaN i, acos(0 + NaN i) = pi/2 + NaN i, acosh(0 + NaN i) = NaN + pi/2 i);
// CHLO gives NaN + NaN i there, and finite parts for NaN + 1e30i.
enum class NanZero { Im, Re, ReHalfPi, ImHalfPi };

Value NanCases(Builder& b, Value z, Value w, NanZero which) {
  Value x = b.Real(z), y = b.Imag(z);
  ElementType pt = x.dtype();
  const auto& shape = x.shape();
  Value nan = b.Splat(pt, NAN, shape), zero = b.Splat(pt, 0, shape);
  auto is_nan = [&](Value v) { return b.Compare("NE", v, v); };
  auto is_inf = [&](Value v) { return b.Compare("EQ", b.Unary("abs", v), b.Splat(pt, INFINITY, shape)); };
  Value nan_in = b.Binary("and", b.Binary("or", is_nan(x), is_nan(y)),
                          b.Unary("not", b.Binary("or", is_inf(x), is_inf(y))));
  Value re = nan, im = nan;
  switch (which) {
    case NanZero::Im: im = b.Select(b.Compare("EQ", y, zero), y, nan); break;
    case NanZero::Re: re = b.Select(b.Compare("EQ", x, zero), x, nan); break;
    case NanZero::ReHalfPi: re = b.Select(b.Compare("EQ", x, zero), b.Splat(pt, M_PI_2, shape), nan); break;
    case NanZero::ImHalfPi: im = b.Select(b.Compare("EQ", x, zero), b.Splat(pt, M_PI_2, shape), nan); break;
  }
  return b.Select(nan_in, b.Complex(re, im), w);
}

Rule InverseFunction(const std::string& chlo_op, Sign re_sign, Sign im_sign, NanZero nan_zero) {
  return [=](Context& c, const std::vector<Arg>& a) {
    Builder& b = c.b;
    Value z = As(b, a.at(0), Out(c).dtype, Out(c).shape);
    Value w = b.Chlo(chlo_op, {z});
    Value re = b.Real(w), im = b.Imag(w);
    w = b.Complex(Signed(b, re, z, re_sign), Signed(b, im, z, im_sign));
    return One(NanCases(b, z, w, nan_zero));
  };
}

const bool registered = [] {
  RegisterComplex("asin", InverseFunction("asin", Sign::OfRe, Sign::OfIm, NanZero::Re));
  RegisterComplex("asinh", InverseFunction("asinh", Sign::OfRe, Sign::OfIm, NanZero::Im));
  RegisterComplex("acos", InverseFunction("acos", Sign::Positive, Sign::OfNegIm, NanZero::ReHalfPi));
  RegisterComplex("acosh", InverseFunction("acosh", Sign::Positive, Sign::OfIm, NanZero::ImHalfPi));
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
