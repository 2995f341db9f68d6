// searchsorted (Tensor, Scalar) and bucketize (Tensor, Scalar) as counts:
// for a sorted row bd, the left insertion point of v is #{bd < v} and the
// right one #{bd <= v} (what CPU's binary search returns). Each value is
// compared with its whole row ([..., M, N] comparisons): fine for the
// boundary tables these ops take (bins, CDFs). `sorter` is applied first
// (a gather along the row).
// isin (Tensor_Tensor, Tensor_Scalar, Scalar_Tensor; invert): the same
// comparison of every element with every test element, any over the tests.
#include <string>
#include <vector>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

using K = Arg::Kind;
using E = ElementType;

// Insertion points of `values` (any shape, or [..., M] matching a batched
// `seq` [..., N]) in `seq`.
Value InsertionPoints(Builder& b, Value seq, Value values, bool right, ElementType out) {
  ElementType t = PromoteTypes(seq.dtype(), values.dtype());
  seq = b.Convert(seq, t);
  values = b.Convert(values, t);
  int64_t n = seq.shape().back();
  std::vector<int64_t> big = values.shape();
  big.push_back(n);
  int64_t r = values.rank();
  std::vector<int64_t> vdims, sdims;
  for (int64_t d = 0; d < r; ++d) vdims.push_back(d);
  if (seq.rank() == 1) {
    sdims = {r};
  } else {
    for (int64_t d = 0; d < r - 1; ++d) sdims.push_back(d);
    sdims.push_back(r);
  }
  Value vb = b.BroadcastInDim(values, big, vdims), sb = b.BroadcastInDim(seq, big, sdims);
  Value before = b.Compare(right ? "LE" : "LT", sb, vb);
  Value ones = b.Convert(before, out);
  return b.Reduce(ones, b.ConstantInt(out, 0), {r}, "add");
}

bool RightSide(const std::vector<Arg>& a, size_t right_i, size_t side_i) {
  if (side_i < a.size() && a[side_i].kind == K::String) return a[side_i].s == "right";
  return right_i < a.size() && a[right_i].kind == K::Bool && a[right_i].i != 0;
}

Value ValuesOf(Builder& b, const Arg& arg, ElementType seq_type) {
  if (arg.kind == K::Tensor) return arg.tensor;
  return b.Convert(arg.tensor, seq_type);  // a Scalar: rank 0
}

// searchsorted(sorted_sequence, self, out_int32, right, side, sorter)
std::vector<Value> SearchSortedRule(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  Value seq = a.at(0).tensor;
  if (seq.dtype() == ElementType::Bool) throw Unsupported("searchsorted of bool");
  if (out.numel() == 0 || seq.shape().back() == 0) return {Zeros(b, out)};
  if (a.size() > 5 && a[5].kind == K::Tensor) {
    Value sorter = CheckedIndex(c, a[5].tensor, seq.shape().back(), false, "searchsorted sorter");
    seq = seq.rank() == 1 ? b.Gather(seq, b.Reshape(sorter, {sorter.type.numel(), 1}), {0})
                          : throw Unsupported("searchsorted: sorter with a batched sequence");
  }
  Value values = ValuesOf(b, a.at(1), seq.dtype());
  Value r = InsertionPoints(b, seq, values, RightSide(a, 3, 4), out.dtype);
  return {b.Reshape(r, out.shape)};
}

// bucketize(self, boundaries, out_int32, right)
std::vector<Value> BucketizeRule(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  Value seq = a.at(1).tensor;
  if (seq.dtype() == ElementType::Bool) throw Unsupported("bucketize of bool");
  Value values = ValuesOf(b, a.at(0), seq.dtype());
  if (out.numel() == 0 || seq.shape().back() == 0) return {Zeros(b, out)};
  Value r = InsertionPoints(b, seq, values, RightSide(a, 3, 99), out.dtype);
  return {b.Reshape(r, out.shape)};
}

// elements (shape S) vs test elements (shape T): S x T equality, any over T.
Value IsIn(Context& c, Value elements, Value test, ElementType t, bool invert) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  int64_t n = elements.type.numel(), m = test.type.numel();
  if (n == 0) return Zeros(b, out);
  if (m == 0) {
    Value v = b.Splat(E::Bool, invert ? 1 : 0, out.shape);
    return b.Convert(v, out.dtype);
  }
  // elements' dims, then test's: no reshape, so a bounded-dynamic dim of
  // either stays one dim for XLA's padder (which cannot split a merged one).
  const int64_t r = elements.rank(), q = test.rank();
  std::vector<int64_t> both = elements.shape();
  both.insert(both.end(), test.shape().begin(), test.shape().end());
  std::vector<int64_t> test_dims = Range(r + q);
  test_dims.erase(test_dims.begin(), test_dims.begin() + r);
  Value eq = b.Compare("EQ", b.BroadcastInDim(b.Convert(elements, t), both, Range(r)),
                       b.BroadcastInDim(b.Convert(test, t), both, test_dims));
  Value any = q == 0 ? eq : b.Reduce(eq, b.ConstantInt(E::Bool, 0), test_dims, "or");
  if (invert) any = b.Unary("not", any);
  return b.Convert(any, out.dtype);
}

std::vector<Value> IsInRule(Context& c, const std::vector<Arg>& a) {
  ElementType t = ResultType({&a[0], &a[1]}, c.default_float);
  if (t == E::Bool) t = E::U8;
  bool invert = a.size() > 3 && a[3].kind == K::Bool && a[3].i != 0;
  Value e = a[0].kind == K::Scalar ? c.b.Reshape(a[0].tensor, {}) : a[0].tensor;
  Value s = a[1].kind == K::Scalar ? c.b.Reshape(a[1].tensor, {}) : a[1].tensor;
  return One(IsIn(c, e, s, t, invert));
}

const bool registered = [] {
  Register("searchsorted.Tensor", SearchSortedRule);
  Register("searchsorted.Scalar", SearchSortedRule);
  Register("bucketize.Tensor", BucketizeRule);
  Register("bucketize.Scalar", BucketizeRule);
  Register("isin.Tensor_Tensor", IsInRule).Dynamic();
  Register("isin.Tensor_Scalar", IsInRule).Dynamic();
  Register("isin.Scalar_Tensor", IsInRule);
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
