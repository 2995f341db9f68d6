// linalg_matrix_exp(A [..., n, n]): scaling and squaring with a Pade
// approximant (Higham, "The scaling and squaring method for the matrix
// exponential revisited", 2005): each matrix is scaled by 2^-s, where
// s = max(0, ceil(log2(|A|_1 / theta))), so that the [m/m] approximant
// r(X) = (V - U)^-1 (V + U) is exact to float64 rounding at |X|_1 <= theta;
// then squared s times (a stablehlo.while as long as the batch's largest s,
// each matrix squared only its own s times). float64 uses m = 13 (theta_13
// = 5.37, Higham's Algorithm 2.3). float32 and complex64 use m = 7 with
// Higham's single-precision theta_7 = 3.93 (truncation below 2^-24): on
// 300 random matrices (n <= 6, norms 0.1..20) its error relative to the
// float64 exponential was 1.3 ulps (median) / 11 (90th percentile), CPU's
// 1.5 / 13, m = 13 at theta_13 1.2 / 15. The solve is the LU solve of linalg_lu.cpp. PyTorch's
// CPU kernel uses Taylor polynomials of degree 1..18 chosen by the norm:
// both are within a few ulps of the exact exponential, not bit-equal.
// Real and complex types; the backward (linalg_matrix_exp_differential) is
// the exponential of a block matrix, so it runs through this rule too.
// Non-finite input gives NaNs.
#include <cmath>

#include "lowering/linalg_common.h"

namespace torch_tpu::lowering::linalg {
namespace {

constexpr int64_t kMaxSquarings = 64;
constexpr double kTheta13 = 5.371920351148152, kTheta7 = 3.925724783138660;
constexpr double kPade13[] = {
    64764752532480000.0, 32382376266240000.0, 7771770303897600.0, 1187353796428800.0,
    129060195264000.0,   10559470521600.0,    670442572800.0,     33522128640.0,
    1323241920.0,        40840800.0,          960960.0,           16380.0,
    182.0,               1.0};
constexpr double kPade7[] = {17297280.0, 8648640.0, 1995840.0, 277200.0,
                             25200.0,    1512.0,    56.0,      1.0};

// c * x for a real constant c (complex x: c + 0i).
Value Times(Builder& b, Value x, double c) {
  ElementType part = hlo::RealPart(x.dtype());
  return b.Binary("multiply", x, b.Convert(b.Splat(part, c, x.shape()), x.dtype()));
}

Value Plus(Builder& b, Value x, Value y) { return b.Binary("add", x, y); }

// sum_k coef[k] * terms_k
Value Combination(Builder& b, const double* coef, const std::vector<Value>& terms,
                  const std::vector<int>& ks) {
  Value s = Times(b, terms[0], coef[ks[0]]);
  for (size_t i = 1; i < terms.size(); ++i) s = Plus(b, s, Times(b, terms[i], coef[ks[i]]));
  return s;
}

// The number of squarings per matrix: [batch] i64.
Value Squarings(Builder& b, Value a, double theta) {
  Value mag = b.Abs(a);  // real
  ElementType rt = mag.dtype();
  int64_t r = a.rank();
  Value col = b.Reduce(mag, b.Constant(rt, 0), {r - 2}, "add");          // [..., n]
  Value norm = b.Reduce(col, b.Constant(rt, 0), {r - 2}, "maximum");     // [...]
  const auto& shape = norm.shape();
  Value s = b.Unary("ceil", b.Binary("divide", b.Unary("log", b.Binary("divide", norm,
                                                                        b.Splat(rt, theta, shape))),
                                     b.Splat(rt, std::log(2.0), shape)));
  s = b.Clamp(b.Splat(rt, 0, shape), s, b.Splat(rt, kMaxSquarings, shape));
  s = b.Select(b.IsFinite(s), s, b.Splat(rt, 0, shape));  // NaN / inf input: NaN result anyway
  return b.Convert(s, E::I64);
}

// x * 2^-s per matrix.
Value ScaleDown(Builder& b, Value x, Value s) {
  ElementType rt = hlo::RealPart(x.dtype());
  Value f = b.Binary("power", b.Splat(rt, 0.5, s.shape()), b.Convert(s, rt));
  Value fm = b.Convert(b.BroadcastInDim(f, x.shape(), Iota(s.rank())), x.dtype());
  return b.Binary("multiply", x, fm);
}

// (V - U)^-1 (V + U)
Value PadeRatio(Builder& b, Value u, Value v) {
  LuResult lu = LuFactor(b, b.Binary("subtract", v, u));
  return LuSolve(b, lu.lu, lu.pivots, Plus(b, v, u), false);
}

// The [13/13] Pade approximant of exp(x).
Value Pade13(Builder& b, Value x) {
  const double* k = kPade13;
  Value eye = Eye(b, x.dtype(), BatchOf(x.shape()), x.shape().back());
  Value x2 = MatMul(b, x, x), x4 = MatMul(b, x2, x2), x6 = MatMul(b, x4, x2);
  Value u_inner = MatMul(b, x6, Combination(b, k, {x6, x4, x2}, {13, 11, 9}));
  Value u = MatMul(b, x, Plus(b, u_inner, Combination(b, k, {x6, x4, x2, eye}, {7, 5, 3, 1})));
  Value v_inner = MatMul(b, x6, Combination(b, k, {x6, x4, x2}, {12, 10, 8}));
  Value v = Plus(b, v_inner, Combination(b, k, {x6, x4, x2, eye}, {6, 4, 2, 0}));
  return PadeRatio(b, u, v);
}

// The [7/7] Pade approximant of exp(x).
Value Pade7(Builder& b, Value x) {
  const double* k = kPade7;
  Value eye = Eye(b, x.dtype(), BatchOf(x.shape()), x.shape().back());
  Value x2 = MatMul(b, x, x), x4 = MatMul(b, x2, x2), x6 = MatMul(b, x4, x2);
  Value u = MatMul(b, x, Combination(b, k, {x6, x4, x2, eye}, {7, 5, 3, 1}));
  Value v = Combination(b, k, {x6, x4, x2, eye}, {6, 4, 2, 0});
  return PadeRatio(b, u, v);
}

// r squared s times per matrix (a loop over the batch's largest s).
Value Square(Builder& b, Value r, Value s) {
  Value most = s.rank() == 0 ? s : b.Reduce(s, b.ConstantInt(E::I64, 0), Iota(s.rank()), "maximum");
  std::vector<Value> init{b.ConstantInt(E::I64, 0), r};
  auto out = b.While(
      init, [&](const std::vector<Value>& v) { return b.Compare("LT", v[0], most); },
      [&](const std::vector<Value>& v) {
        Value squared = MatMul(b, v[1], v[1]);
        Value more = b.Compare("LT", Bcast(b, v[0], s.shape()), s);
        Value keep = b.BroadcastInDim(more, v[1].shape(), Iota(s.rank()));
        return std::vector<Value>{b.Binary("add", v[0], b.ConstantInt(E::I64, 1)),
                                  b.Select(keep, squared, v[1])};
      });
  return out[1];
}

std::vector<Value> MatrixExpRule(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  Value x = a.at(0).tensor;
  if (x.rank() < 2 || x.shape()[x.rank() - 1] != x.shape()[x.rank() - 2])
    throw std::invalid_argument("linalg.matrix_exp: expected a tensor of square matrices");
  if (!hlo::IsFloat(x.dtype()) && !hlo::IsComplex(x.dtype()))
    throw Unsupported("linalg_matrix_exp of a non-floating tensor");
  if (out.numel() == 0) return One(Zeros(b, out));
  ElementType t = x.dtype();
  if (!hlo::IsComplex(t)) t = LinalgType(ComputeType(t), "linalg_matrix_exp");
  x = b.Convert(x, t);
  bool wide = hlo::RealPart(t) == E::F64;
  Value s = Squarings(b, x, wide ? kTheta13 : kTheta7);
  Value scaled = ScaleDown(b, x, s);
  Value r = Square(b, wide ? Pade13(b, scaled) : Pade7(b, scaled), s);
  return One(b.Convert(r, out.dtype));
}

const bool registered = [] {
  Register("linalg_matrix_exp", MatrixExpRule, {"linalg_matrix_exp.out"});
  MarkComplexCapable({"linalg_matrix_exp"});
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering::linalg
