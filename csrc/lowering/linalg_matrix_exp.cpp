// linalg_matrix_exp(A [..., n, n]): scaling and squaring with the [13/13]
// Pade approximant (Higham, "The scaling and squaring method for the matrix
// exponential revisited", 2005, Algorithm 2.3): each matrix is scaled by
// 2^-s, where s = max(0, ceil(log2(|A|_1 / theta_13))) (theta_13 = 5.37),
// so that r(X) = (V - U)^-1 (V + U) is exact to float64 rounding; then
// squared s times (a stablehlo.while as long as the batch's largest s, each
// matrix squared only its own s times). The arithmetic is float64
// (complex128) whatever the input type, rounded once at the end: on op_db's
// samples (norms ~28) the float32 result's total error against the exact
// exponential is 3-20x below CPU's (Taylor sums of degree up to 18 in
// float32), where float32 arithmetic here was 5x above it. The solve is the
// LU solve of linalg_lu.cpp. The backward (linalg_matrix_exp_differential)
// is the exponential of a block matrix, so it runs through this rule too.
// Non-finite input gives NaNs.
#include <cmath>

#include "lowering/linalg_common.h"

namespace torch_tpu::lowering::linalg {
namespace {

constexpr int64_t kMaxSquarings = 64;
constexpr double kTheta13 = 5.371920351148152;
constexpr double kPade13[] = {
    64764752532480000.0, 32382376266240000.0, 7771770303897600.0, 1187353796428800.0,
    129060195264000.0,   10559470521600.0,    670442572800.0,     33522128640.0,
    1323241920.0,        40840800.0,          960960.0,           16380.0,
    182.0,               1.0};

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
  // float64 (complex128) arithmetic for every type: the result is rounded
  // once, and so closer to the exact exponential than CPU's float32 Taylor
  // sums (norm 27: 1e-6 relative in float32 arithmetic vs CPU's 2e-7).
  ElementType t = hlo::IsComplex(x.dtype()) ? E::C128 : E::F64;
  x = b.Convert(x, t);
  Value s = Squarings(b, x, kTheta13);
  Value r = Square(b, Pade13(b, ScaleDown(b, x, s)), s);
  return One(b.Convert(r, out.dtype));
}

const bool registered = [] {
  Register("linalg_matrix_exp", MatrixExpRule, {"linalg_matrix_exp.out"});
  MarkComplexCapable({"linalg_matrix_exp"});
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering::linalg
