// logaddexp and logcumsumexp of complex values, with ATen's CPU helper
// (native/cpu/LogAddExp.h, _log_add_exp_helper) term by term:
//   (min, max) by real part (a NaN in y, else in x, is both);
//   a NaN part in min: NaN + NaN i;
//   equal infinite real parts: min when -inf, log(exp(min) + exp(max)) when +inf;
//   else log1p(exp(min - max)) + max (the phase is not wrapped to (-pi, pi]).
// logcumsumexp is CPU's sequential scan acc = helper(x_i, acc) from -inf,
// a loop over the scanned dim: a log-depth scan would group the terms
// differently and could land on another branch of the phase. exp and log
// with C99's special values (complex_special_values.cpp).
#include <cmath>

#include "lowering/complex_common.h"
#include "lowering/linalg_common.h"

namespace torch_tpu::lowering {
namespace {

Value IsNan(Builder& b, Value z) {
  return b.Binary("or", b.Compare("NE", b.Real(z), b.Real(z)), b.Compare("NE", b.Imag(z), b.Imag(z)));
}

Value LogAddExpHelper(Builder& b, Value x, Value y) {
  const auto& shape = x.shape();
  Value xr = b.Real(x), yr = b.Real(y);
  ElementType pt = xr.dtype();
  Value y_nan = IsNan(b, y), x_nan = IsNan(b, x);
  Value x_smaller = b.Compare("LT", xr, yr);
  Value mn = b.Select(y_nan, y, b.Select(x_nan, x, b.Select(x_smaller, x, y)));
  Value mx = b.Select(y_nan, y, b.Select(x_nan, x, b.Select(x_smaller, y, x)));
  Value mn_r = b.Real(mn), mx_r = b.Real(mx);
  Value nan = b.Complex(b.Splat(pt, NAN, shape), b.Splat(pt, NAN, shape));
  Value inf_tie = b.Binary("and", b.Unary("not", b.IsFinite(mn_r)), b.Compare("EQ", mn_r, mx_r));
  Value neg = b.Compare("LT", mn_r, b.Splat(pt, 0, shape));
  Value pos_inf = complex_parts::LogC99(b, b.Binary("add", complex_parts::ExpC99(b, mn),
                                                    complex_parts::ExpC99(b, mx)));
  Value general = b.Binary(
      "add", b.Unary("log_plus_one", complex_parts::ExpC99(b, b.Binary("subtract", mn, mx))), mx);
  Value r = b.Select(inf_tie, b.Select(neg, mn, pos_inf), general);
  return b.Select(IsNan(b, mn), nan, r);
}

std::vector<Value> ComplexLogAddExp(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  return One(LogAddExpHelper(c.b, As(c.b, a.at(0), out.dtype, out.shape),
                             As(c.b, a.at(1), out.dtype, out.shape)));
}

// _logcumsumexp(self, dim)
std::vector<Value> ComplexLogCumSumExp(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  Value x = b.Convert(a.at(0).tensor, out.dtype);
  if (x.rank() == 0) x = b.Reshape(x, {1});
  int64_t dim = WrapDim(a.at(1).i, x.rank()), n = x.shape()[dim];
  if (x.type.numel() == 0) return One(Zeros(b, out));
  std::vector<int64_t> row = x.shape();
  row[dim] = 1;
  ElementType pt = hlo::RealPart(out.dtype);
  Value init = b.Complex(b.Splat(pt, -INFINITY, row), b.Splat(pt, 0, row));
  auto zero_i64 = [&] { return b.ConstantInt(ElementType::I64, 0); };
  auto result = linalg::ForLoop(b, 0, n, {init, Zeros(b, x.type)}, [&](Value i, const std::vector<Value>& v) {
    std::vector<Value> starts(x.rank());
    for (int64_t d = 0; d < x.rank(); ++d) starts[d] = d == dim ? i : zero_i64();
    Value acc = LogAddExpHelper(b, b.DynamicSlice(x, starts, row), v[0]);
    return std::vector<Value>{acc, b.DynamicUpdateSlice(v[1], acc, starts)};
  });
  return One(b.Reshape(result[1], out.shape));
}

const bool registered = [] {
  RegisterComplex("logaddexp", ComplexLogAddExp);
  RegisterComplex("_logcumsumexp", ComplexLogCumSumExp);
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
