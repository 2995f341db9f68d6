// Elementwise rules: arithmetic, comparison, logical, bitwise, unary math,
// where, clamp, round.decimals. Inputs are converted to the compute type (PyTorch's opmath:
// f32 for 16-bit floats) and broadcast to the output shape the meta kernel
// computed; the result is converted to the output dtype.
#include <cmath>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

using K = Arg::Kind;
using E = ElementType;
using Fn1 = std::function<Value(Builder&, Value)>;
using Fn2 = std::function<Value(Builder&, Value, Value)>;

// f(x) computed in ComputeType(out dtype).
Rule UnaryRule(Fn1 f) {
  return [f](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = Out(c);
    ElementType ct = ComputeType(out.dtype);
    Value x = As(c.b, a[0], ct, out.shape);
    return std::vector<Value>{c.b.Convert(f(c.b, x), out.dtype)};
  };
}

// Float-only unary math: integer inputs compute in the (float) output type;
// a StableHLO op, or a CHLO one (`chlo`).
Rule MathRule(const std::string& op, bool chlo) {
  return UnaryRule([op, chlo](Builder& b, Value x) {
    return chlo ? b.Chlo(op, {x}) : b.Unary(op, x);
  });
}

// f(a, b) in the compute type of the output dtype; `alpha` (arg 2, if a
// Scalar) scales b.
Rule ArithRule(Fn2 f, bool has_alpha = false) {
  return [f, has_alpha](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = Out(c);
    ElementType ct = ComputeType(out.dtype);
    Value x = As(c.b, a[0], ct, out.shape);
    Value y = As(c.b, a[1], ct, out.shape);
    if (has_alpha && a.size() > 2 && a[2].kind == K::Scalar)
      y = c.b.Binary(ct == ElementType::Bool ? "and" : "multiply", y,
                     As(c.b, a[2], ct, out.shape));
    return std::vector<Value>{c.b.Convert(f(c.b, x, y), out.dtype)};
  };
}

// ATen's sub_check, which PyTorch's meta kernels skip: no bool operands.
Rule NoBoolSubtraction(Rule rule) {
  return [rule](Context& c, const std::vector<Arg>& a) {
    for (size_t i = 0; i < 2 && i < a.size(); ++i) {
      bool is_bool = (a[i].kind == K::Tensor && a[i].tensor.dtype() == ElementType::Bool) ||
                     (a[i].kind == K::Scalar && a[i].scalar_type == ElementType::Bool);
      if (is_bool)
        throw std::invalid_argument(
            "Subtraction, the `-` operator, with a bool tensor is not supported. If you are "
            "trying to invert a mask, use the `~` or `logical_not()` operator instead.");
    }
    return rule(c, a);
  };
}

// Comparison in the promoted type of both operands.
Rule CompareRule(const std::string& direction) {
  return [direction](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = Out(c);
    ElementType ct = ResultType({&a[0], &a[1]}, c.default_float);
    Value x = As(c.b, a[0], ct, out.shape), y = As(c.b, a[1], ct, out.shape);
    return std::vector<Value>{c.b.Convert(c.b.Compare(direction, x, y), out.dtype)};
  };
}

Rule LogicalRule(const std::string& op) {
  return [op](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = Out(c);
    Value x = As(c.b, a[0], ElementType::Bool, out.shape);
    Value y = As(c.b, a[1], ElementType::Bool, out.shape);
    return std::vector<Value>{c.b.Convert(c.b.Binary(op, x, y), out.dtype)};
  };
}

Value Zeros(Builder& b, const Value& like) { return b.Splat(like.dtype(), 0, like.shape()); }

// Python-style remainder: sign follows the divisor.
Value Remainder(Builder& b, Value x, Value y) {
  Value r = b.Binary("remainder", x, y);
  if (x.dtype() == ElementType::Bool || hlo::IsUnsigned(x.dtype())) return r;
  Value zero = Zeros(b, r);
  Value fix = b.Binary("and", b.Compare("NE", r, zero),
                       b.Compare("NE", b.Compare("LT", r, zero), b.Compare("LT", y, zero)));
  return b.Select(fix, b.Binary("add", r, y), r);
}

Value FloorDivide(Builder& b, Value x, Value y) {
  if (!hlo::IsFloat(x.dtype())) {
    Value q = b.Binary("divide", x, y);
    if (hlo::IsUnsigned(x.dtype())) return q;
    Value zero = Zeros(b, q);
    Value r = b.Binary("remainder", x, y);
    Value fix = b.Binary("and", b.Compare("NE", r, zero),
                         b.Compare("NE", b.Compare("LT", r, zero), b.Compare("LT", y, zero)));
    return b.Select(fix, b.Binary("subtract", q, b.Splat(q.dtype(), 1, q.shape())), q);
  }
  // ATen's div_floor_floating: exact for representable quotients.
  Value mod = b.Binary("remainder", x, y);
  Value zero = Zeros(b, x);
  Value div = b.Binary("divide", b.Binary("subtract", x, mod), y);
  Value adjust = b.Binary("and", b.Compare("NE", mod, zero),
                          b.Compare("NE", b.Compare("LT", y, zero), b.Compare("LT", mod, zero)));
  div = b.Select(adjust, b.Binary("subtract", div, b.Splat(x.dtype(), 1, x.shape())), div);
  Value floordiv = b.Unary("floor", div);
  Value half = b.Splat(x.dtype(), 0.5, x.shape());
  floordiv = b.Select(b.Compare("GT", b.Binary("subtract", div, floordiv), half),
                      b.Binary("add", floordiv, b.Splat(x.dtype(), 1, x.shape())), floordiv);
  // div == 0: a signed zero with the sign of x / y.
  Value signed_zero = b.Binary("multiply", zero, b.Binary("divide", x, y));
  Value result = b.Select(b.Compare("EQ", div, zero), signed_zero, floordiv);
  // y == 0: x / y (inf or nan), as PyTorch.
  return b.Select(b.Compare("EQ", y, zero), b.Binary("divide", x, y), result);
}

Value Trunc(Builder& b, Value x) {
  if (!hlo::IsFloat(x.dtype())) return x;
  Value r = b.Unary("floor", b.Unary("abs", x));
  return b.Select(b.Compare("LT", x, Zeros(b, x)), b.Unary("negate", r), r);
}

Value Div(Builder& b, Value x, Value y, const std::string& mode) {
  if (mode == "trunc") {
    if (!hlo::IsFloat(x.dtype())) return b.Binary("divide", x, y);
    return Trunc(b, b.Binary("divide", x, y));
  }
  if (mode == "floor") return FloorDivide(b, x, y);
  return b.Binary("divide", x, y);
}

Value Clamp(Builder& b, Value x, const Value* lo, const Value* hi) {
  if (lo) x = MaxMin(b, x, *lo, true);
  if (hi) x = MaxMin(b, x, *hi, false);
  return x;
}

// Integer x ** y as ATen's powi: binary exponentiation with wrapping
// multiplies (XLA's integer power differs once the result overflows); a
// negative exponent gives 1 for x == 1, +-1 for x == -1, else 0.
Value IntPow(Builder& b, Value x, Value y) {
  ElementType t = x.dtype();
  if (t == ElementType::Bool) return b.Binary("or", x, b.Unary("not", y));
  auto splat = [&](double v) { return b.Splat(t, v, x.shape()); };
  Value one = splat(1), zero = splat(0);
  Value result = one, base = x;
  int bits = 8 * hlo::ByteSize(t);
  for (int i = 0; i < bits; ++i) {
    Value bit = b.Binary("and", b.Binary("shift_right_logical", y, splat(i)), one);
    result = b.Select(b.Compare("NE", bit, zero), b.Binary("multiply", result, base), result);
    if (i + 1 < bits) base = b.Binary("multiply", base, base);
  }
  if (hlo::IsUnsigned(t)) return result;
  Value odd = b.Compare("NE", b.Binary("and", y, one), zero);
  Value minus_one = splat(-1);
  Value negative = b.Select(b.Compare("EQ", x, one), one,
                            b.Select(b.Compare("EQ", x, minus_one),
                                     b.Select(odd, minus_one, one), zero));
  return b.Select(b.Compare("LT", y, zero), negative, result);
}

Value Sigmoid(Builder& b, Value x) { return b.Unary("logistic", x); }

// Elementwise rules run bounded-dynamic (RuleEntry::Dynamic): the padding's
// elements are computed and never read.
RuleEntry& RegisterUnary(const std::string& name, Fn1 f) {
  return Register(name, UnaryRule(std::move(f))).DynamicElementwise();
}
void RegisterMath(const std::string& name, const std::string& op, bool chlo) {
  Register(name, MathRule(op, chlo)).DynamicElementwise();
}
void RegisterArith(const std::string& base, Fn2 f, bool alpha = false) {
  Register(base + ".Tensor", ArithRule(f, alpha)).DynamicElementwise();
  Register(base + ".Scalar", ArithRule(f, alpha)).DynamicElementwise();
}

// round.decimals(self, decimals): PyTorch's formula in the dtype (opmath for
// 16-bit floats): nearbyint(x * 10^d) / 10^d, or nearbyint(x / 10^-d) *
// 10^-d for negative d.
std::vector<Value> RoundDecimals(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  Builder& b = c.b;
  if (!hlo::IsFloat(out.dtype)) throw Unsupported("round.decimals on a non-float tensor");
  ElementType ct = ComputeType(out.dtype);
  Value x = b.Convert(a[0].tensor, ct);
  int64_t d = a[1].i;
  if (d == 0) return One(b.Convert(b.Unary("round_nearest_even", x), out.dtype));
  bool neg = d < 0;
  double p = std::pow(10.0, static_cast<double>(neg ? -d : d));
  if (ct == E::F32) p = static_cast<float>(p);
  // Behind an optimization barrier: XLA would turn a division by a constant
  // into a multiplication by its (inexact) reciprocal.
  Value ten = b.BroadcastInDim(
      b.OptimizationBarrier(b.Constant(ct, p)), x.shape(),
      {});
  Value r;
  if (neg) {
    r = b.Binary("multiply", b.Unary("round_nearest_even", b.Binary("divide", x, ten)), ten);
  } else {
    r = b.Binary("divide", b.Unary("round_nearest_even", b.Binary("multiply", x, ten)), ten);
  }
  return One(b.Convert(r, out.dtype));
}

const bool registered = [] {
  // ---- arithmetic
  auto add = [](Builder& b, Value x, Value y) {
    return b.Binary(x.dtype() == ElementType::Bool ? "or" : "add", x, y);
  };
  auto sub = [](Builder& b, Value x, Value y) { return b.Binary("subtract", x, y); };
  auto mul = [](Builder& b, Value x, Value y) {
    return b.Binary(x.dtype() == ElementType::Bool ? "and" : "multiply", x, y);
  };
  auto div = [](Builder& b, Value x, Value y) { return b.Binary("divide", x, y); };
  RegisterArith("add", add, true);
  Register("sub.Tensor", NoBoolSubtraction(ArithRule(sub, true))).DynamicElementwise();
  Register("sub.Scalar", NoBoolSubtraction(ArithRule(sub, true))).DynamicElementwise();
  // rsub(self, other, alpha) = other - alpha * self = sub(other, self, alpha).
  for (const char* name : {"rsub.Tensor", "rsub.Scalar"}) {
    Rule rule = NoBoolSubtraction(ArithRule(sub, true));
    Register(name, [rule](Context& c, const std::vector<Arg>& a) {
      std::vector<Arg> swapped = a;
      std::swap(swapped[0], swapped[1]);
      return rule(c, swapped);
    }).DynamicElementwise();
  }
  RegisterArith("mul", mul);
  RegisterArith("div", div);
  for (const char* overload : {"div.Tensor_mode", "div.Scalar_mode"}) {
    RuleEntry& e = Register(overload, [](Context& c, const std::vector<Arg>& a) {
      const TensorType& out = Out(c);
      ElementType ct = ComputeType(out.dtype);
      std::string mode = a[2].kind == K::String ? a[2].s : "";
      Value x = As(c.b, a[0], ct, out.shape), y = As(c.b, a[1], ct, out.shape);
      if (mode == "trunc" && ct != out.dtype) {
        // PyTorch's CPU kernel rounds the 16-bit quotient before truncating.
        Value q = c.b.Convert(c.b.Convert(c.b.Binary("divide", x, y), out.dtype), ct);
        return std::vector<Value>{c.b.Convert(Trunc(c.b, q), out.dtype)};
      }
      return std::vector<Value>{c.b.Convert(Div(c.b, x, y, mode), out.dtype)};
    });
    if (e.name == "div.Tensor_mode") e.DynamicElementwise();
  }
  Register("floor_divide", ArithRule(FloorDivide)).DynamicElementwise();
  Register("floor_divide.Scalar", ArithRule(FloorDivide)).DynamicElementwise();
  RegisterArith("remainder", Remainder);
  Register("remainder.Scalar_Tensor", ArithRule(Remainder)).DynamicElementwise();
  RegisterArith("fmod", [](Builder& b, Value x, Value y) { return b.Binary("remainder", x, y); });
  auto pow = [](Builder& b, Value x, Value y) {
    return hlo::IsFloat(x.dtype()) ? b.Binary("power", x, y) : IntPow(b, x, y);
  };
  for (const char* name : {"pow.Tensor_Tensor", "pow.Tensor_Scalar"})
    Register(name, ArithRule(pow)).DynamicElementwise().dynamic.integers_exact = true;
  Register("pow.Scalar", ArithRule(pow)).DynamicElementwise().dynamic.integers_exact = true;
  auto larger = [](Builder& b, Value x, Value y) { return MaxMin(b, x, y, true); };
  Register("maximum", ArithRule(larger)).DynamicElementwise();
  Register("minimum", ArithRule([](Builder& b, Value x, Value y) { return MaxMin(b, x, y, false); })).DynamicElementwise();
  Register("atan2", ArithRule([](Builder& b, Value x, Value y) { return b.Binary("atan2", x, y); })).DynamicElementwise();
  Register("hypot", ArithRule([](Builder& b, Value x, Value y) {
             return b.Unary("sqrt", b.Binary("add", b.Binary("multiply", x, x),
                                              b.Binary("multiply", y, y)));
           })).DynamicElementwise();
  Register("copysign.Tensor", ArithRule([](Builder& b, Value x, Value y) {
             Value ax = b.Unary("abs", x);
             Value neg = b.Compare("LT", b.Unary("sign", y), Zeros(b, y));
             // sign of -0.0 and -nan: test the sign bit through 1/y for zeros
             Value y_neg_zero = b.Binary("and", b.Compare("EQ", y, Zeros(b, y)),
                                         b.Compare("LT", b.Binary("divide", b.Splat(y.dtype(), 1, y.shape()), y), Zeros(b, y)));
             return b.Select(b.Binary("or", neg, y_neg_zero), b.Unary("negate", ax), ax);
           })).DynamicElementwise();

  // ---- comparison
  const std::pair<const char*, const char*> comparisons[] = {
      {"eq", "EQ"}, {"ne", "NE"}, {"lt", "LT"}, {"le", "LE"}, {"gt", "GT"}, {"ge", "GE"}};
  for (const auto& [name, dir] : comparisons) {
    Register(std::string(name) + ".Tensor", CompareRule(dir)).DynamicElementwise();
    Register(std::string(name) + ".Scalar", CompareRule(dir)).DynamicElementwise();
  }

  // ---- logical and bitwise
  for (const char* op : {"and", "or", "xor"}) Register(std::string("logical_") + op, LogicalRule(op)).DynamicElementwise();
  Register("logical_not", [](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = Out(c);
    Value x = As(c.b, a[0], ElementType::Bool, out.shape);
    return std::vector<Value>{c.b.Convert(c.b.Unary("not", x), out.dtype)};
  }).DynamicElementwise();
  for (const char* op : {"and", "or", "xor"}) {
    Fn2 f = [op](Builder& b, Value x, Value y) {
      if (hlo::IsFloat(x.dtype())) throw Unsupported("bitwise op on floats");
      return b.Binary(op, x, y);
    };
    Register(std::string("bitwise_") + op + ".Tensor", ArithRule(f)).DynamicElementwise();
    Register(std::string("bitwise_") + op + ".Scalar", ArithRule(f)).DynamicElementwise();
  }
  RegisterUnary("bitwise_not", [](Builder& b, Value x) { return b.Unary("not", x); });

  // ---- unary math
  const std::pair<const char*, const char*> math[] = {
      {"exp", "exponential"}, {"log", "log"}, {"log1p", "log_plus_one"},
      {"expm1", "exponential_minus_one"}, {"sqrt", "sqrt"}, {"rsqrt", "rsqrt"},
      {"sin", "sine"}, {"cos", "cosine"}, {"tan", "tan"}, {"tanh", "tanh"},
      {"sigmoid", "logistic"}};
  for (const auto& [name, op] : math) RegisterMath(name, op, false);
  const std::pair<const char*, const char*> chlo_math[] = {
      {"erf", "erf"}, {"erfinv", "erf_inv"}, {"asin", "asin"}, {"acos", "acos"},
      {"atan", "atan"}, {"sinh", "sinh"}, {"cosh", "cosh"}, {"asinh", "asinh"},
      {"acosh", "acosh"}, {"atanh", "atanh"}, {"lgamma", "lgamma"}};
  for (const auto& [name, op] : chlo_math) RegisterMath(name, op, true);
  RegisterUnary("digamma", [](Builder& b, Value x) {
    // PyTorch: digamma(+-0) = -+inf (chlo gives nan).
    Value r = b.Chlo("digamma", {x});
    Value zero = Zeros(b, x);
    Value neg_zero = b.Compare("LT", b.Binary("divide", b.Splat(x.dtype(), 1, x.shape()), x), zero);
    Value inf = b.Select(neg_zero, b.Splat(x.dtype(), INFINITY, x.shape()),
                         b.Splat(x.dtype(), -INFINITY, x.shape()));
    return b.Select(b.Compare("EQ", x, zero), inf, r);
  });
  RegisterUnary("exp2", [](Builder& b, Value x) {
    return b.Unary("exponential", b.Binary("multiply", x, b.Splat(x.dtype(), M_LN2, x.shape())));
  });
  RegisterUnary("log2", [](Builder& b, Value x) {
    return b.Binary("divide", b.Unary("log", x), b.Splat(x.dtype(), M_LN2, x.shape()));
  });
  RegisterUnary("log10", [](Builder& b, Value x) {
    return b.Binary("divide", b.Unary("log", x), b.Splat(x.dtype(), M_LN10, x.shape()));
  });
  RegisterUnary("reciprocal", [](Builder& b, Value x) {
    return b.Binary("divide", b.Splat(x.dtype(), 1, x.shape()), x);
  });
  RegisterUnary("neg", [](Builder& b, Value x) { return b.Unary("negate", x); });
  RegisterUnary("abs", [](Builder& b, Value x) {
    return x.dtype() == ElementType::Bool || hlo::IsUnsigned(x.dtype()) ? x : b.Unary("abs", x);
  });
  // (0 < x) - (x < 0), as ATen: sign(nan) = 0 and sign(-0.0) = +0.
  auto sign = [](Builder& b, Value x) {
    if (x.dtype() == ElementType::Bool) return x;
    Value zero = Zeros(b, x);
    Value pos = b.Convert(b.Compare("GT", x, zero), x.dtype());
    if (hlo::IsUnsigned(x.dtype())) return pos;
    return b.Binary("subtract", pos, b.Convert(b.Compare("LT", x, zero), x.dtype()));
  };
  RegisterUnary("sign", sign);
  RegisterUnary("sgn", sign);
  auto rounding = [](const char* op) {
    return [op](Builder& b, Value x) { return hlo::IsFloat(x.dtype()) ? b.Unary(op, x) : x; };
  };
  RegisterUnary("floor", rounding("floor"));
  RegisterUnary("ceil", rounding("ceil"));
  RegisterUnary("round", rounding("round_nearest_even"));
  Register("round.decimals", RoundDecimals).DynamicElementwise();
  RegisterUnary("trunc", Trunc);
  RegisterUnary("frac", [](Builder& b, Value x) { return b.Binary("subtract", x, Trunc(b, x)); });
  RegisterUnary("relu", [](Builder& b, Value x) {
    if (x.dtype() == ElementType::Bool) throw Unsupported("relu on bool");
    return b.Binary("maximum", x, Zeros(b, x));
  });
  RegisterUnary("silu", [](Builder& b, Value x) { return b.Binary("multiply", x, Sigmoid(b, x)); });
  // Not a UnaryRule: that would convert the input to the (bool) output first.
  Register("isnan", [](Context& c, const std::vector<Arg>& a) {
    Value x = a[0].tensor;
    if (!hlo::IsFloat(x.dtype()))
      return std::vector<Value>{c.b.Splat(ElementType::Bool, 0, x.shape())};
    return std::vector<Value>{c.b.Compare("NE", x, x)};
  }).DynamicElementwise();
  Register("isinf", [](Context& c, const std::vector<Arg>& a) {
    Value x = a[0].tensor;
    if (!hlo::IsFloat(x.dtype()))
      return std::vector<Value>{c.b.Splat(ElementType::Bool, 0, x.shape())};
    Value ax = c.b.Unary("abs", x);
    return std::vector<Value>{c.b.Compare("EQ", ax, c.b.Splat(x.dtype(), INFINITY, x.shape()))};
  }).DynamicElementwise();
  Register("isfinite", [](Context& c, const std::vector<Arg>& a) {
    Value x = a[0].tensor;
    if (!hlo::IsFloat(x.dtype()))
      return std::vector<Value>{c.b.Splat(ElementType::Bool, 1, x.shape())};
    return std::vector<Value>{
        c.b.IsFinite(x)};
  }).DynamicElementwise();

  // ---- where, clamp
  Register("where.self", [](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = Out(c);
    Value cond = As(c.b, a[0], ElementType::Bool, out.shape);
    Value x = As(c.b, a[1], out.dtype, out.shape), y = As(c.b, a[2], out.dtype, out.shape);
    return std::vector<Value>{c.b.Select(cond, x, y)};
  }).DynamicElementwise();
  Register("where.ScalarOther", [](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = Out(c);
    Value cond = As(c.b, a[0], ElementType::Bool, out.shape);
    Value x = As(c.b, a[1], out.dtype, out.shape), y = As(c.b, a[2], out.dtype, out.shape);
    return std::vector<Value>{c.b.Select(cond, x, y)};
  }).DynamicElementwise();
  Register("where.ScalarSelf", [](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = Out(c);
    Value cond = As(c.b, a[0], ElementType::Bool, out.shape);
    Value x = As(c.b, a[1], out.dtype, out.shape), y = As(c.b, a[2], out.dtype, out.shape);
    return std::vector<Value>{c.b.Select(cond, x, y)};
  }).DynamicElementwise();
  auto clamp = [](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = Out(c);
    ElementType ct = ComputeType(out.dtype);
    Value x = As(c.b, a[0], ct, out.shape);
    Value lo, hi;
    if (!a[1].is_none()) lo = As(c.b, a[1], ct, out.shape);
    if (a.size() > 2 && !a[2].is_none()) hi = As(c.b, a[2], ct, out.shape);
    Value r = Clamp(c.b, x, lo.valid() ? &lo : nullptr, hi.valid() ? &hi : nullptr);
    return std::vector<Value>{c.b.Convert(r, out.dtype)};
  };
  Register("clamp", clamp).DynamicElementwise();
  Register("clamp.Tensor", clamp).DynamicElementwise();
  auto clamp_max = [](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = Out(c);
    ElementType ct = ComputeType(out.dtype);
    Value x = As(c.b, a[0], ct, out.shape), hi = As(c.b, a[1], ct, out.shape);
    return std::vector<Value>{c.b.Convert(Clamp(c.b, x, nullptr, &hi), out.dtype)};
  };
  Register("clamp_min", ArithRule(larger)).DynamicElementwise();
  Register("clamp_min.Tensor", ArithRule(larger)).DynamicElementwise();
  Register("clamp_max", clamp_max).DynamicElementwise();
  Register("clamp_max.Tensor", clamp_max).DynamicElementwise();
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
