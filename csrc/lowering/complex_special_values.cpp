// abs, exp, log and sqrt of complex values with C99's special values (Annex
// G), which PyTorch's CPU kernels get from std::abs / exp / log / sqrt:
// StableHLO's complex forms compute exp(x) (cos y + i sin y), log|z| + i
// arg z and a sqrt that ignore the sign of a zero and give NaN where C99
// has infinities, and XLA:CPU's abs of x + NaN i is finite (|x| sqrt 2):
//  - abs:  an infinite part: +inf; else a NaN part: NaN (hypot);
//  - exp:  exp(x +- 0i) = exp(x) +- 0i; exp(+inf + i(inf|NaN)) = +inf + NaN i;
//          exp(-inf + i(inf|NaN)) = 0;
//  - log:  an infinite part with a NaN one: +inf + NaN i; other NaNs: NaN + NaN i;
//          log2 / log10 divide its parts by ln 2 / ln 10;
//  - sqrt: real part >= 0, the imaginary part has the sign of im(z) (the cut
//          along the negative reals: sqrt(-2 - 0i) = -1.414i); sqrt(x +- inf i)
//          = +inf +- inf i; sqrt(-inf + NaN i) = NaN + inf i; sqrt(+inf + NaN i)
//          = +inf + NaN i; other NaNs: NaN + NaN i.
// The complex rules of logsumexp / logaddexp / logcumsumexp use ExpC99 and
// LogC99 too.
#include <cmath>

#include "lowering/complex_common.h"

namespace torch_tpu::lowering::complex_parts {
namespace {

struct Parts {
  Value x, y;
  ElementType t;
  std::vector<int64_t> shape;
};

Parts Split(Builder& b, Value z) {
  Value x = b.Real(z);
  return {x, b.Imag(z), x.dtype(), x.shape()};
}

Value IsNan(Builder& b, Value v) { return b.Compare("NE", v, v); }
Value IsInf(Builder& b, Value v) {
  return b.Compare("EQ", b.Unary("abs", v), b.Splat(v.dtype(), INFINITY, v.shape()));
}
Value Equals(Builder& b, Value v, double c) { return b.Compare("EQ", v, b.Splat(v.dtype(), c, v.shape())); }
Value Or(Builder& b, Value p, Value q) { return b.Binary("or", p, q); }
Value And(Builder& b, Value p, Value q) { return b.Binary("and", p, q); }

// Whether x's sign bit is set (-0 included).
Value SignBit(Builder& b, Value x) {
  ElementType bits = x.dtype() == ElementType::F64 ? ElementType::I64 : ElementType::I32;
  return b.Compare("LT", b.BitcastConvert(x, bits), b.BroadcastInDim(b.ConstantInt(bits, 0), x.shape(), {}));
}

}  // namespace

Value AbsC99(Builder& b, Value z) {
  Parts p = Split(b, z);
  Value r = b.Abs(z);
  r = b.Select(Or(b, IsNan(b, p.x), IsNan(b, p.y)), b.Splat(p.t, NAN, p.shape), r);
  return b.Select(Or(b, IsInf(b, p.x), IsInf(b, p.y)), b.Splat(p.t, INFINITY, p.shape), r);
}

Value ExpC99(Builder& b, Value z) {
  Parts p = Split(b, z);
  Value w = b.Unary("exponential", z);
  Value y_not_finite = b.Unary("not", b.IsFinite(p.y));
  Value real_axis = b.Complex(b.Unary("exponential", p.x), p.y);
  Value pos = b.Complex(b.Splat(p.t, INFINITY, p.shape), b.Splat(p.t, NAN, p.shape));
  w = b.Select(And(b, Equals(b, p.x, INFINITY), y_not_finite), pos, w);
  w = b.Select(And(b, Equals(b, p.x, -INFINITY), y_not_finite), b.Splat(z.dtype(), 0, p.shape), w);
  return b.Select(Equals(b, p.y, 0), real_axis, w);
}

Value LogC99(Builder& b, Value z) {
  Parts p = Split(b, z);
  Value w = b.Unary("log", z);
  Value any_nan = Or(b, IsNan(b, p.x), IsNan(b, p.y));
  Value any_inf = Or(b, IsInf(b, p.x), IsInf(b, p.y));
  Value nan = b.Splat(p.t, NAN, p.shape);
  w = b.Select(any_nan, b.Complex(nan, nan), w);
  return b.Select(And(b, any_nan, any_inf), b.Complex(b.Splat(p.t, INFINITY, p.shape), nan), w);
}

Value SqrtC99(Builder& b, Value z) {
  Parts p = Split(b, z);
  Value w = b.Unary("sqrt", z);
  Value im = b.Unary("abs", b.Imag(w));
  Value signed_w = b.Complex(b.Unary("abs", b.Real(w)), b.Select(SignBit(b, p.y), b.Unary("negate", im), im));
  Value inf = b.Splat(p.t, INFINITY, p.shape), nan = b.Splat(p.t, NAN, p.shape);
  Value y_nan = IsNan(b, p.y);
  w = b.Select(Or(b, IsNan(b, p.x), y_nan), b.Complex(nan, nan), signed_w);
  w = b.Select(And(b, Equals(b, p.x, INFINITY), y_nan), b.Complex(inf, nan), w);
  w = b.Select(And(b, Equals(b, p.x, -INFINITY), y_nan), b.Complex(nan, inf), w);
  return b.Select(IsInf(b, p.y), b.Complex(inf, p.y), w);
}

namespace {

// log2 / log10: log(z) with each part divided by ln(base), as std::log10
// (a complex divided by a real divides its parts).
template <int kBase>
Value LogBase(Builder& b, Value z) {
  Value w = LogC99(b, z);
  Value re = b.Real(w);
  Value ln = b.Splat(re.dtype(), std::log(static_cast<double>(kBase)), re.shape());
  return b.Complex(b.Binary("divide", re, ln), b.Binary("divide", b.Imag(w), ln));
}

Rule Unary(Value (*f)(Builder&, Value)) {
  return [f](Context& c, const std::vector<Arg>& a) {
    return One(f(c.b, As(c.b, a.at(0), Out(c).dtype, Out(c).shape)));
  };
}

const bool registered = [] {
  RegisterComplex("exp", Unary(ExpC99));
  RegisterComplex("log", Unary(LogC99));
  RegisterComplex("sqrt", Unary(SqrtC99));
  RegisterComplex("log2", Unary(LogBase<2>));
  RegisterComplex("log10", Unary(LogBase<10>));
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering::complex_parts
