// Extra rules: index_copy, isin (three overloads), round.decimals,
// scatter_reduce.two and multinomial.
//
// Indices are checked (CheckedIndex): out-of-range indices raise IndexError
// at the next sync instead of being clamped / dropped by XLA.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

using K = Arg::Kind;
using E = ElementType;

Value AtLeast1d(Builder& b, Value x) { return x.rank() == 0 ? b.Reshape(x, {1}) : x; }

std::vector<int64_t> Range(int64_t n) {
  std::vector<int64_t> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// Elementwise scatter (full coordinates over all dims) whose combiner
// propagates NaN for maximum / minimum (as PyTorch's scatter_reduce does).
Value ScatterNan(Builder& b, Value x, Value coords, Value updates, const std::string& combiner) {
  bool nan_wins = hlo::IsFloat(x.dtype()) && (combiner == "maximum" || combiner == "minimum");
  return b.Scatter(x, coords, updates, Range(x.rank()), [&](Builder& b, Value old, Value update) {
    Value r = b.Binary(combiner, old, update);
    if (nan_wins) {
      r = b.Select(b.Compare("NE", update, update), update, r);
      r = b.Select(b.Compare("NE", old, old), old, r);
    }
    return r;
  });
}

// ---------------------------------------------------------------- index_copy

// index_copy(self, dim, index, source): out.select(dim, index[i]) =
// source.select(dim, i).
std::vector<Value> IndexCopy(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  Builder& b = c.b;
  Value x = AtLeast1d(b, b.Convert(a[0].tensor, out.dtype));
  Value idx = a[2].tensor;
  int64_t n = idx.type.numel();
  if (n == 0 || out.numel() == 0) return One(b.Reshape(x, out.shape));
  int64_t dim = WrapDim(a[1].i, x.rank());
  idx = CheckedIndexInDim(c, idx, x, dim, "index_copy");
  Value src = b.Convert(a[3].tensor, out.dtype);
  std::vector<int64_t> src_shape = x.shape();
  src_shape[dim] = n;
  src = b.Reshape(src, src_shape);
  std::vector<int64_t> perm{dim};
  for (int64_t i = 0; i < x.rank(); ++i)
    if (i != dim) perm.push_back(i);
  Value u = b.Transpose(src, perm);
  Value r = b.Scatter(x, b.Reshape(idx, {n, 1}), u, {dim}, "assign");
  return One(b.Reshape(r, out.shape));
}

// ---------------------------------------------------------------- isin

// elements (shape S) vs test elements: [N, M] equality, any over M.
Value IsIn(Context& c, Value elements, Value test, ElementType t, bool invert) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  int64_t n = elements.type.numel(), m = test.type.numel();
  if (n == 0) return Zeros(b, out);
  if (m == 0) {
    Value v = b.Splat(E::Bool, invert ? 1 : 0, out.shape);
    return b.Convert(v, out.dtype);
  }
  Value e = b.Reshape(b.Convert(elements, t), {n});
  Value s = b.Reshape(b.Convert(test, t), {m});
  Value eq = b.Compare("EQ", b.BroadcastInDim(e, {n, m}, {0}), b.BroadcastInDim(s, {n, m}, {1}));
  Value any = b.Reduce(eq, b.ConstantInt(E::Bool, 0), {1}, "or");
  if (invert) any = b.Unary("not", any);
  return b.Reshape(b.Convert(any, out.dtype), out.shape);
}

std::vector<Value> IsInRule(Context& c, const std::vector<Arg>& a) {
  ElementType t = ResultType({&a[0], &a[1]}, c.default_float);
  if (t == E::Bool) t = E::U8;
  bool invert = a.size() > 3 && a[3].kind == K::Bool && a[3].i != 0;
  Value e = a[0].kind == K::Scalar ? c.b.Reshape(a[0].tensor, {}) : a[0].tensor;
  Value s = a[1].kind == K::Scalar ? c.b.Reshape(a[1].tensor, {}) : a[1].tensor;
  return One(IsIn(c, e, s, t, invert));
}

// ---------------------------------------------------------------- round

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

// ---------------------------------------------------------------- scatter_reduce

// scatter_reduce.two(self, dim, index, src, reduce, *, include_self).
std::vector<Value> ScatterReduce(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  Builder& b = c.b;
  const std::string& reduce = a[4].s;
  bool include_self = a.size() <= 5 || a[5].kind != K::Bool || a[5].i != 0;
  if (out.dtype == E::Bool) throw Unsupported("scatter_reduce on bool");
  bool minmax = reduce == "amax" || reduce == "amin";
  if (!minmax && reduce != "sum" && reduce != "prod" && reduce != "mean")
    throw Unsupported("scatter_reduce reduce=" + reduce);
  ElementType t = minmax ? out.dtype : ComputeType(out.dtype);
  Value x = AtLeast1d(b, b.Convert(a[0].tensor, t));
  Value idx = AtLeast1d(b, a[2].tensor);
  if (idx.type.numel() == 0 || out.numel() == 0)
    return One(b.Reshape(b.Convert(x, out.dtype), out.shape));
  int64_t dim = WrapDim(a[1].i, x.rank());
  idx = CheckedIndex(c, idx, x.shape()[dim], false, "scatter_reduce");
  Value u = AtLeast1d(b, b.Convert(a[3].tensor, t));
  if (u.shape() != idx.shape())
    u = b.Slice(u, std::vector<int64_t>(u.rank(), 0), idx.shape(),
                std::vector<int64_t>(u.rank(), 1));
  Value coords = Coordinates(b, idx, dim);
  std::vector<int64_t> dims = Range(x.rank());

  std::string combiner;
  Value init;
  if (reduce == "sum" || reduce == "mean") {
    combiner = "add";
    init = b.ConstantInt(t, 0);
  } else if (reduce == "prod") {
    combiner = "multiply";
    init = b.ConstantInt(t, 1);
  } else if (reduce == "amax") {
    combiner = "maximum";
    init = b.MinValue(t);
  } else {
    combiner = "minimum";
    init = b.MaxValue(t);
  }
  // Count of updates per position (i32 is enough: bounded by index numel).
  bool need_count = !include_self || reduce == "mean";
  Value count;
  if (need_count) {
    Value zeros = b.Splat(E::I64, 0, x.shape());
    Value ones = b.Splat(E::I64, 1, idx.shape());
    count = b.Scatter(zeros, coords, ones, dims, "add");
  }
  Value base = include_self ? x : b.BroadcastInDim(init, x.shape(), {});
  Value r = ScatterNan(b, base, coords, u, combiner);
  if (reduce == "mean") {
    Value cnt = include_self ? b.Binary("add", count, b.Splat(E::I64, 1, x.shape())) : count;
    Value zero_cnt = b.Compare("EQ", cnt, b.Splat(E::I64, 0, x.shape()));
    cnt = b.Select(zero_cnt, b.Splat(E::I64, 1, x.shape()), cnt);
    Value cf = b.Convert(cnt, t);
    if (hlo::IsFloat(t)) {
      r = b.Binary("divide", r, cf);
    } else {
      // floor division (count > 0).
      Value q = b.Binary("divide", r, cf);
      Value rem = b.Binary("remainder", r, cf);
      Value zero = b.Splat(t, 0, x.shape());
      Value adjust = b.Binary("and", b.Compare("NE", rem, zero), b.Compare("LT", r, zero));
      r = b.Select(adjust, b.Binary("subtract", q, b.Splat(t, 1, x.shape())), q);
    }
  }
  if (!include_self) {
    Value hit = b.Compare("GT", count, b.Splat(E::I64, 0, x.shape()));
    r = b.Select(hit, r, x);
  }
  return One(b.Reshape(b.Convert(r, out.dtype), out.shape));
}

// ---------------------------------------------------------------- multinomial

// Inclusive cumulative sum along the last dim of a [B, C] f32 value.
Value CumsumLast(Builder& b, Value x) {
  int64_t rows = x.shape()[0], cols = x.shape()[1];
  return b.ReduceWindow({x}, {b.ConstantInt(x.dtype(), 0)}, {rows, cols}, {1, cols}, {1, 1}, {1, 1},
                        {0, cols - 1}, {0, 0}, [](Builder& b, const std::vector<Value>& v) {
                          return std::vector<Value>{b.Binary("add", v[0], v[1])};
                        })[0];
}

// multinomial(self, num_samples, replacement, *, generator). self is [C] or
// [B, C] non-negative weights. With replacement: inverse CDF (the number of
// cdf entries <= u); without: Gumbel-top-k.
std::vector<Value> Multinomial(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  Builder& b = c.b;
  Value p0 = a[0].tensor;
  if (p0.rank() < 1 || p0.rank() > 2) throw Unsupported("multinomial: rank must be 1 or 2");
  int64_t cats = p0.shape().back();
  int64_t rows = p0.rank() == 2 ? p0.shape()[0] : 1;
  int64_t n = a[1].i;
  bool replacement = a[2].kind == K::Bool && a[2].i != 0;
  if (!replacement && n > cats)
    throw std::invalid_argument(
        "cannot sample n_sample > prob_dist.size(-1) samples without replacement");
  if (out.numel() == 0 || cats == 0) return One(Zeros(b, out));
  Value state = GeneratorArg(a).tensor;
  Value p = b.Reshape(b.Convert(p0, E::F32), {rows, cats});
  Value zero = b.Splat(E::F32, 0, {rows, cats});
  // Validity: non-negative, finite, positive sum.
  Value ok_elem = b.Binary("and", b.Compare("GE", p, zero),
                           b.Compare("LT", p, b.BroadcastInDim(b.MaxValue(E::F32), {rows, cats}, {})));
  Value ok = b.Reduce(ok_elem, b.ConstantInt(E::Bool, 1), {0, 1}, "and");
  Value nonzero = b.Compare("GT", p, zero);
  Value nz_count = b.Reduce(b.Convert(nonzero, E::I64), b.ConstantInt(E::I64, 0), {1}, "add");
  Value min_nz = b.Reduce(nz_count, b.MaxValue(E::I64), {0}, "minimum");
  Value need = b.ConstantInt(E::I64, replacement ? 1 : n);
  c.Require(b.Binary("and", ok, b.Compare("GE", min_nz, need)),
            "invalid multinomial distribution (negative, inf or NaN "
            "probabilities, or not enough non-zero categories)");
  std::vector<int64_t> rs{rows, n, cats};
  Value iota_c = b.Iota(TensorType{E::I64, {rows, cats}}, 1);
  Value r;
  if (replacement) {
    Value cdf = CumsumLast(b, p);
    Value total = b.Slice(cdf, {0, cats - 1}, {rows, cats}, {1, 1});  // [rows, 1]
    cdf = b.Binary("divide", cdf, b.BroadcastInDim(b.Reshape(total, {rows}), {rows, cats}, {0}));
    Value u = Uniform01(b, state, {rows, n});
    Value le = b.Compare("LE", b.BroadcastInDim(cdf, rs, {0, 2}), b.BroadcastInDim(u, rs, {0, 1}));
    Value cnt = b.Reduce(b.Convert(le, E::I64), b.ConstantInt(E::I64, 0), {2}, "add");
    // Never past the last category of non-zero weight (float rounding).
    Value last = b.Reduce(b.Select(nonzero, iota_c, b.Splat(E::I64, -1, {rows, cats})),
                          b.ConstantInt(E::I64, -1), {1}, "maximum");
    r = b.Binary("minimum", cnt, b.BroadcastInDim(last, {rows, n}, {0}));
  } else {
    Value u = Uniform01(b, state, {rows, cats});
    u = b.Binary("maximum", u, b.Splat(E::F32, 1e-30, {rows, cats}));
    Value g = b.Unary("negate", b.Unary("log", b.Unary("negate", b.Unary("log", u))));
    Value keys = b.Binary("add", b.Unary("log", p), g);
    // Zero weights: -inf keys, never chosen (sort puts them last).
    keys = b.Select(nonzero, keys, b.BroadcastInDim(b.MinValue(E::F32), {rows, cats}, {}));
    auto sorted = b.Sort({keys, iota_c}, 1, /*stable=*/true,
                         [](Builder& b, const std::vector<Value>& v) { return b.Compare("GT", v[0], v[1]); });
    r = b.Slice(sorted[1], {0, 0}, {rows, n}, {1, 1});
  }
  return One(b.Reshape(b.Convert(r, out.dtype), out.shape));
}

const bool registered = [] {
  Register("index_copy", IndexCopy);
  Register("isin.Tensor_Tensor", IsInRule);
  Register("isin.Tensor_Scalar", IsInRule);
  Register("isin.Scalar_Tensor", IsInRule);
  Register("round.decimals", RoundDecimals);
  Register("scatter_reduce.two", ScatterReduce);
  RegisterRandom("multinomial", Multinomial);
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
