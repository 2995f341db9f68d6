// Sorting rules: sort.stable (sort, argsort and argsort.stable reach it),
// topk, kthvalue, median (full and .dim) and mode. One stablehlo.sort over
// two operands (values and an i64 iota) carries the indices; the sort is
// always stable, so ties keep their original order as on the CPU. NaN sorts
// as the largest value (PyTorch's order): last ascending, first descending.
//
// mode(self, dim, keepdim): the most frequent value of each slice, from one
// sort. Ties between values go to the smallest value; the index is the LAST
// occurrence of that value in the slice. That is what the CPU kernel returns
// whenever it is deterministic (slices of <= 16 elements, where std::sort is
// an insertion sort); for longer slices the CPU's index depends on its
// unstable sort (any occurrence of the mode). A NaN is never equal to
// anything (as on the CPU), so each NaN counts once; NaNs sort last.
#include <cmath>
#include <limits>

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

// x shifted by `k` along dim (k > 0: towards higher positions), filled with `fill`.
Value Shift(Builder& b, Value x, int64_t dim, int64_t k, Value fill) {
  int64_t r = x.rank();
  std::vector<int64_t> zeros(r, 0), ones(r, 1), low(r, 0), high(r, 0);
  if (k > 0) {
    low[dim] = k;
    Value padded = b.Pad(x, fill, low, zeros, zeros);
    return b.Slice(padded, zeros, x.shape(), ones);
  }
  high[dim] = -k;
  Value padded = b.Pad(x, fill, zeros, high, zeros);
  std::vector<int64_t> start(r, 0), limit = padded.shape();
  start[dim] = -k;
  return b.Slice(padded, start, limit, ones);
}

// Inclusive running maximum along dim (Hillis-Steele, log2(n) steps).
Value CumMax(Builder& b, Value x, int64_t dim) {
  Value lowest = b.MinValue(x.dtype());
  for (int64_t k = 1; k < x.shape()[dim]; k *= 2)
    x = b.Binary("maximum", x, Shift(b, x, dim, k, lowest));
  return x;
}

// mode(self, int dim=-1, bool keepdim=False) -> (values, indices)
std::vector<Value> Mode(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value x0 = a.at(0).tensor;
  int64_t dim = WrapDim(a.at(1).i, x0.rank());
  const TensorType& vo = c.outputs.at(0);
  const TensorType& io = c.outputs.at(1);
  Value x = AtLeast1d(b, x0);
  int64_t n = x.shape()[dim];
  if (vo.numel() == 0 || n == 0) {
    if (n == 0 && vo.numel() != 0)
      throw std::out_of_range("mode(): Expected reduction dim " + std::to_string(dim) +
                              " to have non-zero size.");
    return {b.Splat(vo.dtype, 0, vo.shape), b.Splat(io.dtype, 0, io.shape)};
  }
  E t = x.dtype();
  Value xv = t == E::Bool ? b.Convert(x, E::U8) : x;
  auto [s, p] = SortAlong(b, xv, dim, /*descending=*/false);
  const auto& shape = s.shape();
  // same[i]: s[i] == s[i-1] (false at i = 0; NaN equals nothing).
  Value prev = Shift(b, s, dim, 1, b.ConstantInt(s.dtype(), 0));
  Value pos = b.Iota(TensorType{E::I64, shape}, dim);
  Value first = b.Compare("EQ", pos, b.Splat(E::I64, 0, shape));
  Value same = b.Binary("and", b.Compare("EQ", s, prev), b.Unary("not", first));
  // Start of each element's run, then the run length at its last element.
  Value start = CumMax(b, b.Select(same, b.Splat(E::I64, 0, shape), pos), dim);
  Value freq = b.Binary("add", b.Binary("subtract", pos, start), b.Splat(E::I64, 1, shape));
  Value same_next = Shift(b, same, dim, -1, b.ConstantInt(E::Bool, 0));
  Value score = b.Select(same_next, b.Splat(E::I64, 0, shape), freq);  // run ends only
  // Highest count, then lowest sorted position (the smallest value); carry
  // the value and its original index (the run's last = highest index).
  auto r = b.ReduceN(
      {score, pos, s, p},
      {b.ConstantInt(E::I64, -1), b.ConstantInt(E::I64, std::numeric_limits<int64_t>::max()),
       b.ConstantInt(s.dtype(), 0), b.ConstantInt(E::I64, 0)},
      {dim}, [](Builder& rb, const std::vector<Value>& v) {
        Value fa = v[0], ia = v[1], fb = v[4], ib = v[5];
        Value pick_a = rb.Binary(
            "or", rb.Compare("GT", fa, fb),
            rb.Binary("and", rb.Compare("EQ", fa, fb), rb.Compare("LT", ia, ib)));
        std::vector<Value> out;
        for (int k = 0; k < 4; ++k) out.push_back(rb.Select(pick_a, v[k], v[k + 4]));
        return out;
      });
  Value values = b.Convert(r[2], vo.dtype);
  return {b.Reshape(values, vo.shape), b.Reshape(b.Convert(r[3], io.dtype), io.shape)};
}

// The dim a sort or topk runs along (schema arg `dim_arg`, -1 when absent).
int64_t SortedDim(const std::vector<Arg>& a, size_t dim_arg, int64_t rank) {
  const int64_t d = dim_arg < a.size() && a[dim_arg].kind == K::Int ? a[dim_arg].i : -1;
  return WrapDim(d, rank);
}

// Bounded dynamic shapes for a sort along one dim: every other dim is rows,
// independent (a new token count of Mixtral's router, topk over the experts
// of each token, compiles nothing). `sorted_dim_dynamic`: the dim it sorts
// along may be dynamic too (sort: XLA's dynamic padder sorts the padding
// after the real elements, through an in-bounds key ahead of the values);
// else it stays static (topk's first k would be cut from a padded dim).
RuleEntry& DynamicRows(RuleEntry& e, size_t dim_arg, bool sorted_dim_dynamic = false) {
  e.Dynamic([dim_arg, sorted_dim_dynamic](const std::vector<Arg>& a, StaticDims& s) {
    const int64_t rank = static_cast<int64_t>(s.Rank(0));
    if (rank == 0 || sorted_dim_dynamic) return;
    s.Dim(0, static_cast<size_t>(SortedDim(a, dim_arg, rank)));
    s.Because("the dim it sorts along");
  });
  e.dynamic.independent_dims = [dim_arg](const std::vector<Arg>& a, StaticDims& s) {
    const int64_t rank = static_cast<int64_t>(s.Rank(0));
    for (int64_t d = 0; d < rank; ++d)
      if (d != SortedDim(a, dim_arg, rank)) s.Dim(0, static_cast<size_t>(d));
  };
  return e;
}

const bool registered = [] {
  DynamicRows(Register("sort.stable", Sort), 2, true);  // (self, stable, dim, descending)
  DynamicRows(Register("topk", TopK), 2);         // (self, k, dim, largest, sorted)
  Register("kthvalue", KthValue);
  Register("median.dim", MedianDim);
  Register("median", MedianAll);
  Register("mode", Mode);
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
