// Modified Bessel functions of the first kind, orders 0 and 1, plain and
// exponentially scaled: i0, special_i0e, special_i1, special_i1e.
//
// Computed for |x| from two expansions of the functions themselves (no
// coefficient tables): for |x| <= kSeriesLimit the power series
//   I_v(x) = (x/2)^v sum_k (x^2/4)^k / (k! (k+v)!)
// (positive terms, kSeriesTerms of them: relative error a few f32 ulps),
// beyond it Hankel's asymptotic expansion
//   I_v(x) e^-x ~ 1/sqrt(2 pi x) sum_k (-1)^k a_k(v) / x^k,
//   a_k(v) = prod_{j<=k} (4v^2 - (2j-1)^2) / (k! 8^k),
// to kAsymptoticTerms (the first omitted term is below f32's ulp there).
// I0 is even, I1 odd. In f32 (16-bit floats compute in f32, as on CPU);
// f64 inputs go to the CPU kernel (these truncations are f32-accurate only).
#include <cmath>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

using E = ElementType;

constexpr double kSeriesLimit = 15.0;
constexpr int kSeriesTerms = 45;
constexpr int kAsymptoticTerms = 9;

Value Like(Builder& b, Value x, double v) { return b.Splat(x.dtype(), v, x.shape()); }
Value Mul(Builder& b, Value x, Value y) { return b.Binary("multiply", x, y); }
Value Add(Builder& b, Value x, Value y) { return b.Binary("add", x, y); }

// I_v(a) for a = |x| <= kSeriesLimit (larger a: clamped, the result unused).
// Nested (Horner) form 1 + r_1 (1 + r_2 (1 + ...)), r_k = q / (k (k + v)):
// no long product chain for the compiler to reassociate into an overflow.
Value Series(Builder& b, Value a, int v) {
  a = b.Binary("minimum", a, Like(b, a, kSeriesLimit));
  Value half = Mul(b, a, Like(b, a, 0.5));
  Value q = Mul(b, half, half);
  Value sum = Like(b, a, 1.0);
  for (int k = kSeriesTerms - 1; k >= 1; --k) {
    Value r = Mul(b, q, Like(b, a, 1.0 / (static_cast<double>(k) * (k + v))));
    sum = Add(b, Like(b, a, 1.0), Mul(b, r, sum));
  }
  return v == 0 ? sum : Mul(b, half, sum);
}

// I_v(a) e^-a for a = |x| > kSeriesLimit (smaller a: clamped, the result
// unused), in the same nested form.
Value Asymptotic(Builder& b, Value a, int v) {
  a = b.Binary("maximum", a, Like(b, a, kSeriesLimit));
  Value inv8a = b.Binary("divide", Like(b, a, 0.125), a);
  Value sum = Like(b, a, 1.0);
  double mu = 4.0 * v * v;
  for (int k = kAsymptoticTerms - 1; k >= 1; --k) {
    double odd = 2.0 * k - 1.0;
    Value r = Mul(b, inv8a, Like(b, a, -(mu - odd * odd) / k));
    sum = Add(b, Like(b, a, 1.0), Mul(b, r, sum));
  }
  Value norm = b.Unary("rsqrt", Mul(b, a, Like(b, a, 2.0 * M_PI)));
  return Mul(b, sum, norm);
}

// I_v(x), or I_v(x) e^-|x| when scaled.
Value Bessel(Builder& b, Value x, int v, bool scaled) {
  Value a = b.Unary("abs", x);
  Value small = b.Compare("LE", a, Like(b, a, kSeriesLimit));
  Value series = Series(b, a, v), asym = Asymptotic(b, a, v);
  Value r;
  if (scaled) {
    r = b.Select(small, Mul(b, series, b.Unary("exponential", b.Unary("negate", a))), asym);
  } else {
    // e^a overflows to inf past ~88.7 as CPU's does; split as e^(a/2)^2 so
    // the product reaches inf only where the function itself does.
    Value e_half = b.Unary("exponential", Mul(b, a, Like(b, a, 0.5)));
    r = b.Select(small, series, Mul(b, Mul(b, asym, e_half), e_half));
  }
  if (v == 1) r = Mul(b, r, b.Unary("sign", x));  // odd; sign(0) = 0 keeps I1(0) = 0
  // NaN in, NaN out (the clamps above turned it into a number).
  return b.Select(b.Compare("NE", x, x), x, r);
}

Rule BesselRule(int v, bool scaled, const char* name) {
  return [v, scaled, name](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = Out(c);
    if (!hlo::IsFloat(out.dtype)) throw Unsupported(std::string(name) + " of a non-float result");
    if (out.dtype == E::F64) throw Unsupported(std::string(name) + " in float64 (f32-accurate only)");
    Value x = As(c.b, a.at(0), ComputeType(out.dtype), out.shape);
    if (out.rank() == 0) x = c.b.Reshape(x, {1});
    return One(c.b.Reshape(c.b.Convert(Bessel(c.b, x, v, scaled), out.dtype), out.shape));
  };
}

const bool registered = [] {
  Register("i0", BesselRule(0, false, "i0"), {"i0.out", "i0_"}).DynamicElementwise();
  Register("special_i0e", BesselRule(0, true, "special_i0e"), {"special_i0e.out"}).DynamicElementwise();
  Register("special_i1", BesselRule(1, false, "special_i1"), {"special_i1.out"}).DynamicElementwise();
  Register("special_i1e", BesselRule(1, true, "special_i1e"), {"special_i1e.out"}).DynamicElementwise();
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
