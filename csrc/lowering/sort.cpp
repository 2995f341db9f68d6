// Sorting rules: sort.stable (sort, argsort and argsort.stable reach it),
// topk, kthvalue, median (full and .dim). One stablehlo.sort over two
// operands (values and an i64 iota) carries the indices; the sort is always
// stable, so ties keep their original order as on the CPU. NaN sorts as the
// largest value (PyTorch's order): last ascending, first descending.
#include <cmath>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

using K = Arg::Kind;
using E = ElementType;

// (sorted values, i64 indices) of x along dim. Bools sort as ui8.
std::pair<Value, Value> SortAlong(Builder& b, Value x, int64_t dim, bool descending) {
  E t = x.dtype();
  Value xv = t == E::Bool ? b.Convert(x, E::U8) : x;
  Value idx = b.Iota(TensorType{E::I64, x.shape()}, dim);
  bool is_float = hlo::IsFloat(xv.dtype());
  auto r = b.Sort({xv, idx}, dim, /*stable=*/true, [&](Builder& b, const std::vector<Value>& a) {
        Value lhs = a[0], rhs = a[1];
        Value before = b.Compare(descending ? "GT" : "LT", lhs, rhs);
        if (is_float) {
          Value lnan = b.Compare("NE", lhs, lhs), rnan = b.Compare("NE", rhs, rhs);
          // ascending: a number comes before NaN; descending: NaN comes first.
          Value special = descending ? b.Binary("and", lnan, b.Unary("not", rnan))
                                     : b.Binary("and", b.Unary("not", lnan), rnan);
          before = b.Binary("or", before, special);
        }
        return before;
      });
  return {b.Convert(r[0], t), r[1]};
}

Value AtLeast1d(Builder& b, Value x) { return x.rank() == 0 ? b.Reshape(x, {1}) : x; }

Value SliceDim(Builder& b, Value x, int64_t dim, int64_t start, int64_t limit) {
  std::vector<int64_t> lo(x.rank(), 0), hi = x.shape(), st(x.rank(), 1);
  lo[dim] = start;
  hi[dim] = limit;
  return b.Slice(x, lo, hi, st);
}

Value Finish(Context& c, Value v, size_t i) {
  const TensorType& out = c.outputs.at(i);
  return c.b.Reshape(c.b.Convert(v, out.dtype), out.shape);
}

// sort.stable(self, *, bool? stable, int dim=-1, bool descending=False)
std::vector<Value> Sort(Context& c, const std::vector<Arg>& a) {
  Value x0 = a[0].tensor;
  int64_t dim = WrapDim(a[2].i, x0.rank());
  bool descending = a[3].i != 0;
  if (c.outputs[0].numel() == 0)
    return {c.b.Splat(c.outputs[0].dtype, 0, c.outputs[0].shape),
            c.b.Splat(c.outputs[1].dtype, 0, c.outputs[1].shape)};
  auto [v, i] = SortAlong(c.b, AtLeast1d(c.b, x0), dim, descending);
  return {Finish(c, v, 0), Finish(c, i, 1)};
}

// topk(self, k, dim=-1, largest=True, sorted=True): the first k of a stable
// sort (always sorted).
std::vector<Value> TopK(Context& c, const std::vector<Arg>& a) {
  Value x = AtLeast1d(c.b, a[0].tensor);
  int64_t k = a[1].i;
  int64_t dim = WrapDim(a[2].i, a[0].tensor.rank());
  bool largest = a[3].i != 0;
  if (k < 0 || k > x.shape()[dim])
    throw std::out_of_range("selected index k out of range");
  if (c.outputs[0].numel() == 0)
    return {c.b.Splat(c.outputs[0].dtype, 0, c.outputs[0].shape),
            c.b.Splat(c.outputs[1].dtype, 0, c.outputs[1].shape)};
  auto [v, i] = SortAlong(c.b, x, dim, largest);
  return {Finish(c, SliceDim(c.b, v, dim, 0, k), 0), Finish(c, SliceDim(c.b, i, dim, 0, k), 1)};
}

// The element at sorted position `pos` along dim (ascending).
std::pair<Value, Value> Pick(Builder& b, Value x, int64_t dim, int64_t pos) {
  auto [v, i] = SortAlong(b, x, dim, false);
  return {SliceDim(b, v, dim, pos, pos + 1), SliceDim(b, i, dim, pos, pos + 1)};
}

// kthvalue(self, k, dim=-1, keepdim=False)
std::vector<Value> KthValue(Context& c, const std::vector<Arg>& a) {
  Value x = AtLeast1d(c.b, a[0].tensor);
  int64_t k = a[1].i;
  int64_t dim = WrapDim(a[2].i, a[0].tensor.rank());
  if (k < 1 || k > x.shape()[dim])
    throw std::out_of_range("kthvalue(): selected number k out of range for dimension " +
                            std::to_string(dim));
  auto [v, i] = Pick(c.b, x, dim, k - 1);
  return {Finish(c, v, 0), Finish(c, i, 1)};
}

// median: the lower median; NaN if the slice holds a NaN (the first NaN's
// index, as the CPU kernel returns).
std::pair<Value, Value> Median(Builder& b, Value x, int64_t dim) {
  int64_t n = x.shape()[dim];
  auto [v, i] = SortAlong(b, x, dim, false);
  Value mv = SliceDim(b, v, dim, (n - 1) / 2, (n - 1) / 2 + 1);
  Value mi = SliceDim(b, i, dim, (n - 1) / 2, (n - 1) / 2 + 1);
  if (!hlo::IsFloat(x.dtype())) return {mv, mi};
  // Number of non-NaN values = sorted position of the first NaN.
  Value isnum = b.Convert(b.Compare("EQ", x, x), E::I64);
  Value count = b.Reshape(b.Reduce(isnum, b.ConstantInt(E::I64, 0), {dim}, "add"), mv.shape());
  Value has_nan = b.Compare("LT", count, b.Splat(E::I64, static_cast<double>(n), mv.shape()));
  // The first NaN in sorted order sits at position `count`: its index.
  Value pos = b.Clamp(b.ConstantInt(E::I64, 0), count, b.ConstantInt(E::I64, n - 1));
  Value iota = b.Iota(TensorType{E::I64, x.shape()}, dim);
  Value at = b.Compare("EQ", iota, b.BroadcastTo(pos, x.shape()));
  Value sel = b.Select(at, i, b.Splat(E::I64, -1, x.shape()));
  Value nan_idx = b.Reshape(b.Reduce(sel, b.MinValue(E::I64), {dim}, "maximum"), mv.shape());
  Value nan = b.Splat(x.dtype(), NAN, mv.shape());
  return {b.Select(has_nan, nan, mv), b.Select(has_nan, nan_idx, mi)};
}

// median.dim(self, dim, keepdim=False)
std::vector<Value> MedianDim(Context& c, const std::vector<Arg>& a) {
  Value x = AtLeast1d(c.b, a[0].tensor);
  int64_t dim = WrapDim(a[1].i, a[0].tensor.rank());
  if (x.shape()[dim] == 0)
    throw std::out_of_range("median(): Expected reduction dim " + std::to_string(dim) +
                            " to have non-zero size.");
  auto [v, i] = Median(c.b, x, dim);
  return {Finish(c, v, 0), Finish(c, i, 1)};
}

// median(self): over all elements; NaN (an empty input gives NaN too).
std::vector<Value> MedianAll(Context& c, const std::vector<Arg>& a) {
  Value x = a[0].tensor;
  int64_t n = x.type.numel();
  if (n == 0) return {c.b.Splat(c.outputs[0].dtype, NAN, c.outputs[0].shape)};
  auto [v, i] = Median(c.b, c.b.Reshape(x, {n}), 0);
  (void)i;
  return {Finish(c, v, 0)};
}

const bool registered = [] {
  Register("sort.stable", Sort);
  Register("topk", TopK);
  Register("kthvalue", KthValue);
  Register("median.dim", MedianDim);
  Register("median", MedianAll);
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
