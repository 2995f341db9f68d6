// Scatter reductions (every index checked by CheckedIndex: out-of-range
// indices raise IndexError at the next sync instead of being clamped or
// dropped by XLA):
//
// - scatter_reduce.two(self, dim, index, src, reduce, *, include_self):
//   src's elements reduced (sum, prod, mean, amax, amin) into self at
//   `index` along dim; amax / amin propagate NaN as PyTorch does, mean
//   divides by the count of updates (floor division for integers).
// - index_reduce(self, dim, index, source, reduce, include_self): source's
//   slices reduced (prod, mean, amax, amin) into self's slices at `index`
//   along dim: scatter_reduce.two with index broadcast to source's shape.
#include <string>
#include <vector>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

using K = Arg::Kind;
using E = ElementType;

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
    // ones of the index's (dynamic) sizes, so that the padder drops the
    // padding's updates as it does the values' (a splat would be static)
    Value ones = b.Convert(b.Compare("EQ", idx, idx), E::I64);
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

std::vector<Value> IndexReduce(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  // (a 0-d self or source: the same on 1-element 1-d tensors)
  Value self = a.at(0).tensor, index = a.at(2).tensor, source = a.at(3).tensor;
  if (self.rank() == 0 || source.rank() == 0) {  // as 1-element 1-d tensors
    std::vector<Arg> one_d = a;
    one_d[0].tensor = b.Reshape(self, {self.type.numel()});
    one_d[3].tensor = b.Reshape(source, {source.type.numel()});
    Context sub{c.b};
    sub.outputs = {TensorType{Out(c).dtype, {self.type.numel()}}};
    Value r = IndexReduce(sub, one_d).at(0);
    for (auto& check : sub.checks) c.checks.push_back(std::move(check));
    return One(b.Reshape(r, Out(c).shape));
  }
  int64_t dim = WrapDim(a.at(1).i, self.rank());
  int64_t n = index.type.numel();
  if (source.shape().at(dim) != n)
    throw std::invalid_argument("index_reduce_(): Number of indices (" + std::to_string(n) +
                                ") should be equal to source.size(dim) (" +
                                std::to_string(source.shape()[dim]) + ")");
  Value idx = CheckedIndex(c, b.Reshape(index, {n}), self.shape()[dim], false, "index_reduce");
  Arg full = a[2];
  full.tensor = b.BroadcastInDim(idx, source.shape(), {dim});
  return ScatterReduce(c, {a[0], a[1], full, a[3], a.at(4), a.at(5)});
}

const bool registered = [] {
  Register("scatter_reduce.two", ScatterReduce)
      .Dynamic(IndexedDimStatic("the dim it scatters along (the indices' bound)"));
  Register("index_reduce", IndexReduce);
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
