// nanmedian: the lower median of the non-NaN values, as the CPU kernel:
// with c non-NaN values along the slice, the value at sorted position
// (c - 1) / 2 (C++ division: 0 when every value is NaN, which gives NaN).
// One stable sort (NaN last) carries the indices; the position differs per
// slice, so the value and index there are selected by a mask and reduced.
// Ties (equal values, an all-NaN slice) take the first index in the input's
// order; CPU's nth_element may return another of the tied indices.
#include <cmath>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

using E = ElementType;

Value SliceAt(Builder& b, Value x, int64_t dim, int64_t pos) {
  std::vector<int64_t> lo(x.rank(), 0), hi = x.shape(), st(x.rank(), 1);
  lo[dim] = pos;
  hi[dim] = pos + 1;
  return b.Slice(x, lo, hi, st);
}

// (values, i64 indices) of x sorted ascending along dim, NaN last.
std::pair<Value, Value> SortNanLast(Builder& b, Value x, int64_t dim) {
  Value idx = b.Iota(TensorType{E::I64, x.shape()}, dim);
  bool is_float = hlo::IsFloat(x.dtype());
  auto r = b.Sort({x, idx}, dim, /*stable=*/true, [&](Builder& b, const std::vector<Value>& a) {
    Value before = b.Compare("LT", a[0], a[1]);
    if (!is_float) return before;
    Value lnan = b.Compare("NE", a[0], a[0]), rnan = b.Compare("NE", a[1], a[1]);
    return b.Binary("or", before, b.Binary("and", b.Unary("not", lnan), rnan));
  });
  return {r[0], r[1]};
}

// (value, index) of the nanmedian along dim, each with dim kept as size 1.
std::pair<Value, Value> NanMedian(Builder& b, Value x, int64_t dim) {
  auto [v, i] = SortNanLast(b, x, dim);
  if (!hlo::IsFloat(x.dtype())) {  // no NaN: the plain lower median
    int64_t pos = (x.shape()[dim] - 1) / 2;
    return {SliceAt(b, v, dim, pos), SliceAt(b, i, dim, pos)};
  }
  std::vector<int64_t> kept = x.shape();
  kept[dim] = 1;
  Value isnum = b.Convert(b.Compare("EQ", x, x), E::I64);
  Value count = b.Reshape(b.Reduce(isnum, b.ConstantInt(E::I64, 0), {dim}, "add"), kept);
  Value one = b.Splat(E::I64, 1, kept), two = b.Splat(E::I64, 2, kept);
  Value zero = b.Splat(E::I64, 0, kept);
  Value pos = b.Select(b.Compare("EQ", count, zero), zero,
                       b.Binary("divide", b.Binary("subtract", count, one), two));
  Value iota = b.Iota(TensorType{E::I64, x.shape()}, dim);
  Value at = b.Compare("EQ", iota, b.BroadcastTo(pos, x.shape()));
  // Exactly one position per slice is selected: a sum picks it out. The
  // others are masked to -0.0, the identity of + that keeps a -0.0 median.
  Value vsel = b.Select(at, v, b.Splat(x.dtype(), -0.0, x.shape()));
  Value isel = b.Select(at, i, b.Splat(E::I64, 0, x.shape()));
  Value value = b.Reshape(b.Reduce(vsel, b.Constant(x.dtype(), -0.0), {dim}, "add"), kept);
  Value index = b.Reshape(b.Reduce(isel, b.ConstantInt(E::I64, 0), {dim}, "add"), kept);
  return {value, index};
}

Value Finish(Context& c, Value v, size_t i) {
  const TensorType& out = c.outputs.at(i);
  return c.b.Reshape(c.b.Convert(v, out.dtype), out.shape);
}

// nanmedian.dim(self, dim, keepdim=False) -> (values, indices)
std::vector<Value> NanMedianDim(Context& c, const std::vector<Arg>& a) {
  Value x = a.at(0).tensor;
  if (x.rank() == 0) x = c.b.Reshape(x, {1});
  int64_t dim = WrapDim(a.at(1).i, a[0].tensor.rank());
  if (x.shape()[dim] == 0)
    throw std::out_of_range("nanmedian(): Expected reduction dim " + std::to_string(dim) +
                            " to have non-zero size.");
  auto [v, i] = NanMedian(c.b, x, dim);
  return {Finish(c, v, 0), Finish(c, i, 1)};
}

// nanmedian(self): over all elements (an empty input gives NaN).
std::vector<Value> NanMedianAll(Context& c, const std::vector<Arg>& a) {
  Value x = a.at(0).tensor;
  int64_t n = x.type.numel();
  if (n == 0) return {c.b.Splat(c.outputs.at(0).dtype, NAN, c.outputs.at(0).shape)};
  return {Finish(c, NanMedian(c.b, c.b.Reshape(x, {n}), 0).first, 0)};
}

const Registrar dim_rule("nanmedian.dim", NanMedianDim, {"nanmedian.dim_values"});
const Registrar all_rule("nanmedian", NanMedianAll);

}  // namespace
}  // namespace torch_tpu::lowering
