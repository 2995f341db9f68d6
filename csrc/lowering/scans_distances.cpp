// _logcumsumexp (torch.logcumsumexp) and _cdist_forward (torch.cdist).
//
// - _logcumsumexp(x, dim): an inclusive Hillis-Steele scan along dim (log2(n)
//   shifted combines, in the compute type) of (running max, scaled sum)
//   pairs, the result rounded once (see LogCumSumExpRule).
// - _cdist_forward(x1, x2, p, compute_mode) and _cdist_backward: ||x1[..., i, :] - x2[..., j, :]||_p
//   by broadcasting the difference ([..., P, R, M]) and reducing it (p = 0:
//   count of nonzeros, p = inf: max |d|). For p = 2 the CPU kernel may use the
//   matmul formulation for large inputs (compute_mode); the direct difference
//   is exact-er and used always.
#include <cmath>
#include <string>
#include <vector>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

// Running (max m, sum s of exp(x - m)) pairs: combining an earlier (m1, s1)
// with a later (m2, s2) gives (M, s1 e^(m1 - M) + s2 e^(m2 - M)), M =
// max(m1, m2) (a term whose m equals M contributes s exactly, which also
// covers equal infinities). The result m + log(s) rounds once at the end, so
// a large value (x = 1e4, where one f32 ulp is 1e-3) comes out as close as
// CPU's double accumulator gets it; gradients through it stay as accurate.
std::vector<Value> LogCumSumExpRule(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  if (!hlo::IsFloat(out.dtype)) throw Unsupported("logcumsumexp of a non-float tensor");
  ElementType ct = ComputeType(out.dtype);
  Value x = b.Convert(a.at(0).tensor, ct);
  if (x.rank() == 0 || out.numel() == 0) return {b.Convert(b.Reshape(x, out.shape), out.dtype)};
  int64_t dim = WrapDim(a.at(1).i, x.rank());
  int64_t n = x.shape()[dim];
  int64_t r = x.rank();
  auto shifted = [&](Value v, int64_t k, double pad) {
    std::vector<int64_t> low(r, 0), high(r, 0), interior(r, 0), start(r, 0), ones(r, 1);
    low[dim] = k;
    return b.Slice(b.Pad(v, b.Constant(ct, pad), low, high, interior), start, v.shape(), ones);
  };
  auto scaled = [&](Value s, Value m, Value big) {
    Value factor = b.Unary("exponential", b.Binary("subtract", m, big));
    return b.Select(b.Compare("EQ", m, big), s, b.Binary("multiply", s, factor));
  };
  Value m = x, s = b.Splat(ct, 1.0, x.shape());
  for (int64_t k = 1; k < n; k *= 2) {
    Value pm = shifted(m, k, -INFINITY), ps = shifted(s, k, 0.0);
    Value big = MaxMin(b, pm, m, true);
    s = b.Binary("add", scaled(ps, pm, big), scaled(s, m, big));
    m = big;
  }
  return {b.Convert(b.Binary("add", m, b.Unary("log", s)), out.dtype)};
}

std::vector<Value> CdistRule(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);  // [..., P, R]
  if (!hlo::IsFloat(out.dtype)) throw Unsupported("cdist of a non-float tensor");
  ElementType ct = ComputeType(out.dtype);
  double p = a.at(2).d;
  Value x1 = a.at(0).tensor, x2 = a.at(1).tensor;
  int64_t m = x1.shape().back();
  std::vector<int64_t> batch(out.shape.begin(), out.shape.end() - 2);
  int64_t P = out.shape[out.rank() - 2], R = out.shape[out.rank() - 1];
  if (out.numel() == 0) return {Zeros(b, out)};
  std::vector<int64_t> big = batch;
  big.insert(big.end(), {P, R, m});
  int64_t nb = static_cast<int64_t>(batch.size());
  std::vector<int64_t> d1, d2;
  for (int64_t d = 0; d < nb; ++d) {
    d1.push_back(d);
    d2.push_back(d);
  }
  d1.insert(d1.end(), {nb, nb + 2});
  d2.insert(d2.end(), {nb + 1, nb + 2});
  auto expand = [&](Value x, const std::vector<int64_t>& dims) {
    std::vector<int64_t> full = batch;
    full.push_back(x.shape()[x.rank() - 2]);
    full.push_back(m);
    return b.BroadcastInDim(b.BroadcastTo(b.Convert(x, ct), full), big, dims);
  };
  Value diff = b.Unary("abs", b.Binary("subtract", expand(x1, d1), expand(x2, d2)));
  Value zero = b.Constant(ct, 0);
  Value result;
  if (p == 0) {
    Value nz = b.Convert(b.Compare("NE", diff, b.Splat(ct, 0, big)), ct);
    result = b.Reduce(nz, zero, {nb + 2}, "add");
  } else if (std::isinf(p)) {
    result = b.Reduce(diff, zero, {nb + 2}, "maximum");
  } else if (p == 1) {
    result = b.Reduce(diff, zero, {nb + 2}, "add");
  } else if (p == 2) {
    result = b.Unary("sqrt", b.Reduce(b.Binary("multiply", diff, diff), zero, {nb + 2}, "add"));
  } else {
    Value pw = b.Binary("power", diff, b.Splat(ct, p, big));
    Value s = b.Reduce(pw, zero, {nb + 2}, "add");
    result = b.Binary("power", s, b.Splat(ct, 1.0 / p, s.shape()));
  }
  return {b.Convert(result, out.dtype)};
}

// _cdist_backward(grad, x1, x2, p, cdist) -> grad_x1: sum over j of
// grad[i, j] * d|x1_i - x2_j|_p / dx1_i, with d = x1_i - x2_j:
// p = 1: sign(d); p = 2: d / dist; p = inf: sign(d) where |d| = dist;
// else sign(d) |d|^(p-1) / dist^(p-1); zero where dist = 0 (and for p = 0).
std::vector<Value> CdistBackwardRule(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);  // x1's shape [..., P, M]
  if (!hlo::IsFloat(out.dtype)) throw Unsupported("cdist backward of a non-float tensor");
  ElementType ct = ComputeType(out.dtype);
  double p = a.at(3).d;
  Value grad = b.Convert(a.at(0).tensor, ct), dist = b.Convert(a.at(4).tensor, ct);
  std::vector<int64_t> gshape = grad.shape();  // [..., P, R]
  int64_t nb = static_cast<int64_t>(gshape.size()) - 2;
  int64_t m = out.shape.back();
  if (out.numel() == 0 || grad.type.numel() == 0 || p == 0) return {Zeros(b, out)};
  std::vector<int64_t> batch(gshape.begin(), gshape.end() - 2);
  std::vector<int64_t> big = gshape;
  big.push_back(m);
  std::vector<int64_t> d1 = [&] { std::vector<int64_t> d; for (int64_t i = 0; i < nb; ++i) d.push_back(i); return d; }();
  std::vector<int64_t> d2 = d1, dg = d1;
  d1.insert(d1.end(), {nb, nb + 2});
  d2.insert(d2.end(), {nb + 1, nb + 2});
  dg.insert(dg.end(), {nb, nb + 1});
  auto expand = [&](Value x, const std::vector<int64_t>& dims) {
    std::vector<int64_t> full = batch;
    full.push_back(x.shape()[x.rank() - 2]);
    full.push_back(m);
    return b.BroadcastInDim(b.BroadcastTo(b.Convert(x, ct), full), big, dims);
  };
  Value d = b.Binary("subtract", expand(a.at(1).tensor, d1), expand(a.at(2).tensor, d2));
  Value g = b.BroadcastInDim(grad, big, dg), dd = b.BroadcastInDim(dist, big, dg);
  Value zeros = b.Splat(ct, 0, big);
  Value sign = b.Unary("sign", d);
  Value term;
  if (p == 1) {
    term = sign;
  } else if (p == 2) {
    term = b.Binary("divide", d, dd);
  } else if (std::isinf(p)) {
    term = b.Select(b.Compare("EQ", b.Unary("abs", d), dd), sign, zeros);
  } else {
    Value pm1 = b.Splat(ct, p - 1, big);
    term = b.Binary("divide", b.Binary("multiply", sign, b.Binary("power", b.Unary("abs", d), pm1)),
                    b.Binary("power", dd, pm1));
  }
  term = b.Select(b.Compare("EQ", dd, zeros), zeros, term);
  Value gx = b.Reduce(b.Binary("multiply", g, term), b.Constant(ct, 0), {nb + 1}, "add");
  return {b.Convert(b.Reshape(gx, out.shape), out.dtype)};
}

const bool registered = [] {
  Register("_cdist_backward", CdistBackwardRule);
  Register("_logcumsumexp", LogCumSumExpRule).Dynamic(ComplexExact).dynamic.independent_dims = KeptDims(1);
  Register("_cdist_forward", CdistRule);
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
