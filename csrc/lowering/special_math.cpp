// Elementwise special functions and NaN-aware binary math that compose from
// StableHLO / CHLO ops: polygamma, zeta, erfc, sinc, ndtri, xlogy, xlog1py,
// entr, logaddexp(2), heaviside, fmax / fmin, the float predicates
// isposinf / isneginf / signbit, and nan_to_num (NaN and infinities
// replaced). Each follows the CPU kernel's special cases (ATen's native/cpu and native/Math.h); inputs are converted to the compute
// type of the output (f32 for 16-bit floats) and broadcast to its shape.
#include <cmath>
#include <limits>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

using E = ElementType;
using K = Arg::Kind;
using Fn1 = std::function<Value(Builder&, Value)>;
using Fn2 = std::function<Value(Builder&, Value, Value)>;

Value Like(Builder& b, const Value& x, double v) { return b.Splat(x.dtype(), v, x.shape()); }
Value IsNan(Builder& b, Value x) { return b.Compare("NE", x, x); }

// f(x) in the compute type of the output.
Rule Unary(Fn1 f) {
  return [f](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = Out(c);
    Value x = As(c.b, a.at(0), ComputeType(out.dtype), out.shape);
    return One(c.b.Convert(f(c.b, x), out.dtype));
  };
}

// f(x, y) in the compute type of the output (Tensor or Scalar operands).
Rule BinaryRule(Fn2 f) {
  return [f](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = Out(c);
    ElementType ct = ComputeType(out.dtype);
    Value x = As(c.b, a.at(0), ct, out.shape), y = As(c.b, a.at(1), ct, out.shape);
    return One(c.b.Convert(f(c.b, x, y), out.dtype));
  };
}

// Registers a binary function under its Tensor-Tensor schema and, where
// given, its Scalar-operand overloads.
// Each is elementwise: bounded-dynamic on the buckets' arrays.
void RegisterBinary(const std::string& tensor, const std::vector<std::string>& scalar_overloads, Fn2 f) {
  Register(tensor, BinaryRule(f)).DynamicElementwise();
  for (const auto& name : scalar_overloads) Register(name, BinaryRule(f)).DynamicElementwise();
}

// trigamma as ATen's CPU kernel: the reflection formula below 0.5, six
// recurrence steps, then the asymptotic series.
Value Trigamma(Builder& b, Value x) {
  Value reflect = b.Compare("LT", x, Like(b, x, 0.5));
  Value sin_pi_x = b.Unary("sine", b.Binary("multiply", Like(b, x, M_PI), x));
  Value pole = b.Binary("divide", Like(b, x, M_PI * M_PI), b.Binary("multiply", sin_pi_x, sin_pi_x));
  Value result = b.Select(reflect, b.Unary("negate", pole), Like(b, x, 0));
  x = b.Select(reflect, b.Binary("subtract", Like(b, x, 1), x), x);
  for (int i = 0; i < 6; ++i) {
    result = b.Binary("add", result, b.Binary("divide", Like(b, x, 1), b.Binary("multiply", x, x)));
    x = b.Binary("add", x, Like(b, x, 1));
  }
  Value ixx = b.Binary("divide", Like(b, x, 1), b.Binary("multiply", x, x));
  auto sub = [&](double v, Value t) { return b.Binary("subtract", Like(b, x, v), t); };
  Value series = sub(1.0 / 30, b.Binary("multiply", ixx, Like(b, x, 1.0 / 42)));
  series = sub(1.0 / 6, b.Binary("multiply", ixx, series));
  series = b.Binary("add", b.Binary("add", Like(b, x, 1), b.Binary("divide", Like(b, x, 1),
                                                                   b.Binary("multiply", Like(b, x, 2), x))),
                    b.Binary("multiply", ixx, series));
  result = b.Binary("add", result, b.Binary("divide", series, x));
  return b.Select(reflect, b.Unary("negate", result), result);
}

// Hurwitz zeta(s, q) as cephes (ATen's CPU kernel): inf for s == 1 and at
// the poles (q a nonpositive integer, -0 and -inf included), NaN for s < 1
// or q < 0 with s not an integer. The first terms 1 / (q + k)^s are summed
// directly while q + k < 9, up to 24 of them (q >= -15), with Kahan
// compensation (the terms of opposite signs cancel; ATen sums in double);
// then CHLO's zeta (accurate from q >= 9) adds the rest. `int_s` > 0: s is
// that integer, and the powers are products (exact where pow's exp / log
// would be off by ulps that the cancellation magnifies).
Value Zeta(Builder& b, Value s, Value q, int64_t int_s = 0) {
  Value zero = Like(b, q, 0), one = Like(b, q, 1);
  Value s_int = b.Compare("EQ", b.Unary("floor", s), s);
  Value odd = b.Binary("and", s_int, b.Compare("NE", b.Unary("floor", b.Binary("multiply", s, Like(b, s, 0.5))),
                                                 b.Binary("multiply", s, Like(b, s, 0.5))));
  Value pole = b.Binary("and", b.Compare("LE", q, zero), b.Compare("EQ", b.Unary("floor", q), q));
  Value acc = zero, comp = zero, x = q;
  for (int k = 0; k < 24; ++k) {
    Value below = b.Compare("LT", x, Like(b, x, 9));
    // |x|^-s with the sign of x^-s for an integer s.
    Value ax = b.Unary("abs", x), mag = ax;
    if (int_s > 0) {
      for (int64_t i = 1; i < int_s; ++i) mag = b.Binary("multiply", mag, ax);
      mag = b.Binary("divide", one, mag);
    } else {
      mag = b.Binary("power", ax, b.Unary("negate", s));
    }
    Value negative = b.Binary("and", b.Compare("LT", x, zero), odd);
    Value term = b.Select(negative, b.Unary("negate", mag), mag);
    Value y = b.Binary("subtract", term, comp);
    Value t = b.Binary("add", acc, y);
    Value next_comp = b.Binary("subtract", b.Binary("subtract", t, acc), y);
    acc = b.Select(below, t, acc);
    comp = b.Select(below, next_comp, comp);
    x = b.Select(below, b.Binary("add", x, one), x);
  }
  Value rest = b.Chlo("zeta", {s, x});
  Value r = b.Binary("add", acc, b.Binary("subtract", rest, comp));
  Value inf = Like(b, q, INFINITY), nan = Like(b, q, NAN);
  // s == inf: 1 / q^s is 0 for q > 1, 1 for q == 1, inf below.
  Value at_inf = b.Select(b.Compare("GT", q, one), zero, b.Select(b.Compare("EQ", q, one), one, inf));
  r = b.Select(b.Compare("EQ", s, inf), at_inf, r);
  r = b.Select(b.Binary("and", b.Compare("LT", q, zero), b.Unary("not", s_int)), nan, r);
  r = b.Select(pole, inf, r);
  r = b.Select(b.Compare("LT", s, one), nan, r);
  return b.Select(b.Compare("EQ", s, one), inf, r);
}

// polygamma(n, x): digamma for n == 0 (the digamma rule, with its signed-zero
// poles), trigamma for n == 1, else (-1)^(n+1) n! zeta(n + 1, x), as ATen.
std::vector<Value> Polygamma(Context& c, const std::vector<Arg>& a) {
  int64_t n = a.at(0).i;
  if (n < 0) throw std::invalid_argument("polygamma(n, x) does not support negative n.");
  if (n == 0) return Find("digamma")->rule(c, {a.at(1)});
  Builder& b = c.b;
  const TensorType& out = Out(c);
  Value x = As(b, a.at(1), ComputeType(out.dtype), out.shape);
  if (n == 1) return One(b.Convert(Trigamma(b, x), out.dtype));
  double factor = (n % 2 ? 1.0 : -1.0) * std::exp(std::lgamma(static_cast<double>(n) + 1.0));
  Value z = Zeta(b, Like(b, x, static_cast<double>(n + 1)), x, n <= 16 ? n + 1 : 0);
  return One(b.Convert(b.Binary("multiply", Like(b, x, factor), z), out.dtype));
}

// sinc(x) = sin(pi x) / (pi x), 1 at 0 (the product rounded to the compute
// type first, as the CPU kernel).
Value Sinc(Builder& b, Value x) {
  Value px = b.Binary("multiply", x, Like(b, x, M_PI));
  Value r = b.Binary("divide", b.Unary("sine", px), px);
  return b.Select(b.Compare("EQ", x, Like(b, x, 0)), Like(b, x, 1), r);
}

// ndtri(p) = sqrt(2) erfinv(2p - 1): the normal quantile.
Value Ndtri(Builder& b, Value p) {
  Value t = b.Binary("subtract", b.Binary("multiply", p, Like(b, p, 2)), Like(b, p, 1));
  return b.Binary("multiply", b.Chlo("erf_inv", {t}), Like(b, p, M_SQRT2));
}

// x * log(y) (log1p(y) for xlog1py): NaN when y is NaN, else 0 when x == 0.
Fn2 XLog(const std::string& log) {
  return [log](Builder& b, Value x, Value y) {
    Value r = b.Binary("multiply", x, b.Unary(log, y));
    r = b.Select(b.Compare("EQ", x, Like(b, x, 0)), Like(b, x, 0), r);
    return b.Select(IsNan(b, y), y, r);
  };
}

// entr(x) = -x log(x); 0 at 0, -inf below 0, NaN for NaN.
Value Entr(Builder& b, Value x) {
  Value r = b.Unary("negate", b.Binary("multiply", x, b.Unary("log", x)));
  r = b.Select(b.Compare("EQ", x, Like(b, x, 0)), Like(b, x, 0), r);
  r = b.Select(b.Compare("LT", x, Like(b, x, 0)), Like(b, x, -INFINITY), r);
  return b.Select(IsNan(b, x), x, r);
}

// logaddexp(x, y) = max + log1p(exp(-|x - y|)) (base 2: exp2 / log1p / ln 2);
// x when both are the same infinity (the difference would be NaN).
Fn2 LogAddExp(bool base2) {
  return [base2](Builder& b, Value x, Value y) {
    Value m = MaxMin(b, x, y, true);
    Value d = b.Unary("negate", b.Unary("abs", b.Binary("subtract", x, y)));
    Value r;
    if (base2) {
      Value e = b.Binary("power", Like(b, d, 2), d);
      r = b.Binary("add", m, b.Binary("divide", b.Unary("log_plus_one", e), Like(b, m, M_LN2)));
    } else {
      r = b.Binary("add", m, b.Unary("log_plus_one", b.Unary("exponential", d)));
    }
    Value same_inf = b.Binary("and", b.Compare("EQ", x, y),
                              b.Compare("EQ", b.Unary("abs", x), Like(b, x, INFINITY)));
    return b.Select(same_inf, x, r);
  };
}

// heaviside(x, values): values where x == 0, else (x > 0) (0 for NaN x).
Value Heaviside(Builder& b, Value x, Value values) {
  Value step = b.Convert(b.Compare("GT", x, Like(b, x, 0)), x.dtype());
  return b.Select(b.Compare("EQ", x, Like(b, x, 0)), values, step);
}

// fmax / fmin: the other operand where one is NaN (NaN only if both are).
Fn2 FMaxMin(bool is_max) {
  return [is_max](Builder& b, Value x, Value y) {
    Value m = MaxMin(b, x, y, is_max);
    if (!hlo::IsFloat(x.dtype())) return m;
    return b.Select(IsNan(b, x), y, b.Select(IsNan(b, y), x, m));
  };
}

// isposinf / isneginf / signbit on the input's own dtype; bool result.
Rule Predicate(std::function<Value(Builder&, Value)> on_float, bool int_is_negative) {
  return [on_float, int_is_negative](Context& c, const std::vector<Arg>& a) {
    Builder& b = c.b;
    const TensorType& out = Out(c);
    Value x = b.BroadcastTo(a.at(0).tensor, out.shape);
    Value r;
    if (hlo::IsFloat(x.dtype())) {
      r = on_float(b, x);
    } else if (int_is_negative && x.dtype() != E::Bool && !hlo::IsUnsigned(x.dtype())) {
      r = b.Compare("LT", x, Like(b, x, 0));
    } else {
      r = b.Splat(E::Bool, 0, out.shape);
    }
    return One(b.Convert(r, out.dtype));
  };
}

// The sign bit, through the same-width integer (true for -0.0 and -NaN).
Value SignBit(Builder& b, Value x) {
  int bytes = hlo::ByteSize(x.dtype());
  E it = bytes == 2 ? E::I16 : bytes == 4 ? E::I32 : E::I64;
  Value bits = b.BitcastConvert(x, it);
  return b.Compare("LT", bits, b.Splat(it, 0, bits.shape()));
}

// nan_to_num(self, nan?, posinf?, neginf?): NaN -> nan (0), +inf -> posinf
// (the dtype's largest finite value), -inf -> neginf (its lowest); other
// dtypes unchanged.
double LargestFinite(ElementType t) {
  switch (t) {
    case ElementType::F16: return 65504.0;
    case ElementType::BF16: return 3.3895313892515355e38;
    case ElementType::F32: return 3.4028234663852886e38;
    default: return 1.7976931348623157e308;
  }
}

std::vector<Value> NanToNum(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = c.outputs.at(0);
  Value x = b.Convert(a.at(0).tensor, out.dtype);
  if (!hlo::IsFloat(out.dtype)) return {x};
  auto value = [&](size_t i, double fallback) {
    return a.size() > i && a[i].kind == K::Double ? a[i].d : fallback;
  };
  const std::vector<int64_t>& shape = out.shape;
  double big = LargestFinite(out.dtype);
  Value inf = b.Splat(out.dtype, std::numeric_limits<double>::infinity(), shape);
  Value r = b.Select(b.Compare("NE", x, x), b.Splat(out.dtype, value(1, 0.0), shape), x);
  r = b.Select(b.Compare("EQ", x, inf), b.Splat(out.dtype, value(2, big), shape), r);
  r = b.Select(b.Compare("EQ", x, b.Unary("negate", inf)), b.Splat(out.dtype, value(3, -big), shape), r);
  return {r};
}

const bool registered = [] {
  Register("polygamma", Polygamma).DynamicElementwise();
  RegisterBinary("special_zeta", {"special_zeta.self_scalar", "special_zeta.other_scalar"},
                 [](Builder& b, Value s, Value q) { return Zeta(b, s, q); });
  Register("erfc", Unary([](Builder& b, Value x) { return b.Chlo("erfc", {x}); })).DynamicElementwise();
  Register("sinc", Unary(Sinc)).DynamicElementwise();
  Register("special_ndtri", Unary(Ndtri)).DynamicElementwise();
  Register("special_entr", Unary(Entr)).DynamicElementwise();
  RegisterBinary("xlogy.Tensor", {"xlogy.Scalar_Self", "xlogy.Scalar_Other"}, XLog("log"));
  RegisterBinary("special_xlog1py", {"special_xlog1py.self_scalar", "special_xlog1py.other_scalar"},
                 XLog("log_plus_one"));
  RegisterBinary("logaddexp", {}, LogAddExp(false));
  RegisterBinary("logaddexp2", {}, LogAddExp(true));
  RegisterBinary("heaviside", {}, Heaviside);
  RegisterBinary("fmax", {}, FMaxMin(true));
  RegisterBinary("fmin", {}, FMaxMin(false));
  Register("isposinf", Predicate([](Builder& b, Value x) {
             return b.Compare("EQ", x, Like(b, x, INFINITY));
           }, false)).DynamicElementwise();
  Register("isneginf", Predicate([](Builder& b, Value x) {
             return b.Compare("EQ", x, Like(b, x, -INFINITY));
           }, false)).DynamicElementwise();
  Register("signbit", Predicate(SignBit, true)).DynamicElementwise();
  Register("nan_to_num", NanToNum).DynamicElementwise();
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
