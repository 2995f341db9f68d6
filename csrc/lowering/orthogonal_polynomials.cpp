// torch.special's orthogonal polynomials of degree n (a tensor, truncated to
// an integer as the CPU kernels do): Chebyshev T/U/V/W and their shifted
// forms, Hermite H/He, Laguerre L, Legendre P. As ATen's CPU kernels
// (ATen/native/Math.h): the three-term recurrence, run per element for its
// own n (a stablehlo.while up to the largest n), then the kernels' special
// cases (n < 0, |x| == 1, and the closed trigonometric forms they use for
// large n inside (-1, 1)).
#include <cmath>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

using E = ElementType;

struct Poly {
  // q = P_1(x) (P_0 = 1).
  std::function<Value(Builder&, Value)> first;
  // P_{j+1} from p = P_{j-1}, q = P_j, for step j = 1, 2, ... (j a float splat).
  std::function<Value(Builder&, Value, Value, Value, Value)> next;
  // The kernel's special cases over the recurrence's result r (n: float degree).
  std::function<Value(Builder&, Value, Value, Value)> special;
};

Value Like(Builder& b, const Value& x, double v) { return b.Splat(x.dtype(), v, x.shape()); }
Value Add(Builder& b, Value x, Value y) { return b.Binary("add", x, y); }
Value Sub(Builder& b, Value x, Value y) { return b.Binary("subtract", x, y); }
Value Mul(Builder& b, Value x, Value y) { return b.Binary("multiply", x, y); }
Value Div(Builder& b, Value x, Value y) { return b.Binary("divide", x, y); }
Value Eq(Builder& b, Value x, double v) { return b.Compare("EQ", x, Like(b, x, v)); }
Value And(Builder& b, Value x, Value y) { return b.Binary("and", x, y); }
Value Or(Builder& b, Value x, Value y) { return b.Binary("or", x, y); }
Value Even(Builder& b, Value n) {
  return b.Compare("EQ", Mul(b, b.Unary("floor", Mul(b, n, Like(b, n, 0.5))), Like(b, n, 2)), n);
}
Value Acos(Builder& b, Value x) { return b.Chlo("acos", {x}); }
Value Where(Builder& b, Value c, Value t, Value f) { return b.Select(c, t, f); }

// P_n(x) by the recurrence, for every element's own n >= 0 (1 for n == 0).
Value Recurrence(Builder& b, const Poly& poly, Value x, Value n) {
  Value q0 = poly.first(b, x);
  Value steps = b.Convert(n, E::I64);  // the recurrence runs n - 1 steps
  Value max_n = b.Reduce(steps, b.ConstantInt(E::I64, 0), [&] {
    std::vector<int64_t> d(steps.rank());
    for (int64_t i = 0; i < steps.rank(); ++i) d[i] = i;
    return d;
  }(), "maximum");
  std::vector<Value> init = {b.ConstantInt(E::I64, 1), Like(b, x, 1), q0};
  auto out = b.While(
      init, [&](const std::vector<Value>& v) { return b.Compare("LT", v[0], max_n); },
      [&](const std::vector<Value>& v) {
        Value j = b.BroadcastInDim(b.Convert(v[0], x.dtype()), x.shape(), {});
        Value active = b.Compare("LT", j, n);
        Value r = poly.next(b, j, x, v[1], v[2]);
        return std::vector<Value>{Add(b, v[0], b.ConstantInt(E::I64, 1)), Where(b, active, v[2], v[1]),
                                  Where(b, active, r, v[2])};
      });
  return Where(b, b.Compare("LT", n, Like(b, n, 1)), Like(b, x, 1), out[2]);
}

Rule PolyRule(Poly poly) {
  return [poly](Context& c, const std::vector<Arg>& a) {
    Builder& b = c.b;
    const TensorType& out = Out(c);
    if (!hlo::IsFloat(out.dtype)) throw Unsupported("orthogonal polynomial with an integer result");
    E ct = ComputeType(out.dtype);
    Value x = As(b, a.at(0), ct, out.shape);
    // The degree truncated toward zero, as static_cast<int64_t>(n).
    Value n = b.Convert(b.Convert(As(b, a.at(1), ct, out.shape), E::I64), ct);
    Value r = poly.special(b, x, n, Recurrence(b, poly, x, n));
    r = Where(b, b.Compare("LT", n, Like(b, n, 0)), Like(b, x, 0), r);
    return One(b.Convert(r, out.dtype));
  };
}

// Chebyshev recurrences: P_{j+1} = 2 y P_j - P_{j-1} with y = x (or 2x - 1 shifted).
Value ChebNext(Builder& b, Value y, Value p, Value q) { return Sub(b, Mul(b, Add(b, y, y), q), p); }

Poly ChebyshevT(bool shifted) {
  return {[shifted](Builder& b, Value x) { return shifted ? Sub(b, Add(b, x, x), Like(b, x, 1)) : x; },
          [shifted](Builder& b, Value, Value x, Value p, Value q) {
            return ChebNext(b, shifted ? Sub(b, Add(b, x, x), Like(b, x, 1)) : x, p, q);
          },
          [shifted](Builder& b, Value x, Value n, Value r) {
            Value y = shifted ? Sub(b, Add(b, x, x), Like(b, x, 1)) : x;
            Value one = Like(b, x, 1), sign = Where(b, Even(b, n), one, Like(b, x, -1));
            Value trig = b.Unary("cosine", Mul(b, n, Acos(b, y)));
            r = Where(b, And(b, b.Compare("GT", n, Like(b, n, 6)),
                             b.Compare("LT", b.Unary("abs", y), one)), trig, r);
            if (shifted) return Where(b, Eq(b, x, 1), one, Where(b, Eq(b, x, 0), sign, r));
            Value at_one = Where(b, b.Compare("GT", x, Like(b, x, 0)), one, sign);
            return Where(b, Eq(b, b.Unary("abs", x), 1), at_one, r);
          }};
}

Poly ChebyshevU(bool shifted) {
  auto y_of = [shifted](Builder& b, Value x) { return shifted ? Sub(b, Add(b, x, x), Like(b, x, 1)) : x; };
  return {[y_of](Builder& b, Value x) { Value y = y_of(b, x); return Add(b, y, y); },
          [y_of](Builder& b, Value, Value x, Value p, Value q) { return ChebNext(b, y_of(b, x), p, q); },
          [shifted, y_of](Builder& b, Value x, Value n, Value r) {
            Value y = y_of(b, x), one = Like(b, x, 1), n1 = Add(b, n, one);
            Value signed_n1 = Where(b, Even(b, n), n1, b.Unary("negate", n1));
            Value t = Acos(b, y), s = b.Unary("sine", t);
            Value trig = Where(b, Eq(b, s, 0), Div(b, Mul(b, n1, b.Unary("cosine", Mul(b, n1, t))), y),
                               Div(b, b.Unary("sine", Mul(b, n1, t)), s));
            r = Where(b, And(b, b.Compare("GT", n, Like(b, n, shifted ? 6 : 8)),
                             b.Compare("LT", b.Unary("abs", y), one)), trig, r);
            if (shifted) return Where(b, Eq(b, x, 1), n1, Where(b, Eq(b, x, 0), signed_n1, r));
            Value at_one = Where(b, b.Compare("GT", x, Like(b, x, 0)), n1, signed_n1);
            return Where(b, Eq(b, b.Unary("abs", x), 1), at_one, r);
          }};
}

// V (w = false) and W (w = true): P_1 = 2y -+ 1.
Poly ChebyshevVW(bool w, bool shifted) {
  auto y_of = [shifted](Builder& b, Value x) { return shifted ? Sub(b, Add(b, x, x), Like(b, x, 1)) : x; };
  return {[w, y_of](Builder& b, Value x) {
            Value y = y_of(b, x);
            return Add(b, Add(b, y, y), Like(b, x, w ? 1 : -1));
          },
          [y_of](Builder& b, Value, Value x, Value p, Value q) { return ChebNext(b, y_of(b, x), p, q); },
          [w, shifted, y_of](Builder& b, Value x, Value n, Value r) {
            Value y = y_of(b, x), one = Like(b, x, 1), half = Like(b, x, 0.5);
            Value odd_n = Add(b, Add(b, n, n), one);  // 2n + 1
            Value signed_odd = Where(b, Even(b, n), odd_n, b.Unary("negate", odd_n));
            Value sign = Where(b, Even(b, n), one, Like(b, x, -1));
            Value t = Acos(b, y), nt = Mul(b, Add(b, n, half), t);
            Value trig = w ? Div(b, b.Unary("sine", nt), b.Unary("sine", Mul(b, t, half)))
                           : Div(b, b.Unary("cosine", nt), b.Unary("cosine", Mul(b, t, half)));
            Value degenerate = w ? Eq(b, b.Unary("cosine", Mul(b, t, half)), 1)
                                 : Eq(b, b.Unary("sine", Mul(b, t, half)), 1);
            Value at_plus = w ? odd_n : one, at_minus = w ? sign : signed_odd;
            Value positive = b.Compare("GT", y, Like(b, y, 0));
            trig = Where(b, degenerate, Where(b, positive, at_plus, at_minus), trig);
            r = Where(b, And(b, b.Compare("GT", n, Like(b, n, shifted ? 6 : 8)),
                             b.Compare("LT", b.Unary("abs", y), one)), trig, r);
            if (shifted) return Where(b, Eq(b, x, 1), at_plus, Where(b, Eq(b, x, 0), at_minus, r));
            return Where(b, Eq(b, b.Unary("abs", x), 1),
                         Where(b, b.Compare("GT", x, Like(b, x, 0)), at_plus, at_minus), r);
          }};
}

auto NoSpecial = [](Builder&, Value, Value, Value r) { return r; };

const bool registered = [] {
  Register("special_chebyshev_polynomial_t", PolyRule(ChebyshevT(false)));
  Register("special_chebyshev_polynomial_u", PolyRule(ChebyshevU(false)));
  Register("special_chebyshev_polynomial_v", PolyRule(ChebyshevVW(false, false)));
  Register("special_chebyshev_polynomial_w", PolyRule(ChebyshevVW(true, false)));
  Register("special_shifted_chebyshev_polynomial_t", PolyRule(ChebyshevT(true)));
  Register("special_shifted_chebyshev_polynomial_u", PolyRule(ChebyshevU(true)));
  Register("special_shifted_chebyshev_polynomial_v", PolyRule(ChebyshevVW(false, true)));
  Register("special_shifted_chebyshev_polynomial_w", PolyRule(ChebyshevVW(true, true)));
  // H_{j+1} = 2x H_j - 2j H_{j-1}; He_{j+1} = x He_j - j He_{j-1}.
  Register("special_hermite_polynomial_h", PolyRule({
      [](Builder& b, Value x) { return Add(b, x, x); },
      [](Builder& b, Value j, Value x, Value p, Value q) {
        return Sub(b, Mul(b, Add(b, x, x), q), Mul(b, Add(b, j, j), p));
      }, NoSpecial}));
  Register("special_hermite_polynomial_he", PolyRule({
      [](Builder&, Value x) { return x; },
      [](Builder& b, Value j, Value x, Value p, Value q) { return Sub(b, Mul(b, x, q), Mul(b, j, p)); },
      NoSpecial}));
  // L_{j+1} = ((2j + 1 - x) L_j - j L_{j-1}) / (j + 1); 1 at x == 0.
  Register("special_laguerre_polynomial_l", PolyRule({
      [](Builder& b, Value x) { return Sub(b, Like(b, x, 1), x); },
      [](Builder& b, Value j, Value x, Value p, Value q) {
        Value a = Add(b, Add(b, j, j), Sub(b, Like(b, x, 1), x));
        return Div(b, Sub(b, Mul(b, a, q), Mul(b, j, p)), Add(b, j, Like(b, j, 1)));
      },
      [](Builder& b, Value x, Value, Value r) { return Where(b, Eq(b, x, 0), Like(b, x, 1), r); }}));
  // P_{j+1} = ((2j + 1) x P_j - j P_{j-1}) / (j + 1); +-1 at |x| == 1.
  Register("special_legendre_polynomial_p", PolyRule({
      [](Builder&, Value x) { return x; },
      [](Builder& b, Value j, Value x, Value p, Value q) {
        Value a = Mul(b, Add(b, Add(b, j, j), Like(b, j, 1)), x);
        return Div(b, Sub(b, Mul(b, a, q), Mul(b, j, p)), Add(b, j, Like(b, j, 1)));
      },
      [](Builder& b, Value x, Value n, Value r) {
        Value one = Like(b, x, 1);
        Value at_one = Where(b, Or(b, b.Compare("GT", x, Like(b, x, 0)), Even(b, n)), one, Like(b, x, -1));
        return Where(b, Eq(b, b.Unary("abs", x), 1), at_one, r);
      }}));
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
