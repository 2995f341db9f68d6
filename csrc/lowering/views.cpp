// Graph-only rules: ATen view ops (view, permute, slice, select, ...),
// conversions (_to_copy) and factories (full, zeros, arange, ...) as they
// appear in torch.compile FX graphs. Eager mode never runs these: views are
// native (storage, offset, sizes, strides) there and factories are native
// kernels. They are registered with Scope::Graph: the eager dispatcher does
// not register them as kernels; the graph builder looks them up first.
//
// In a graph every tensor is a value, so a view is just a reshape, transpose
// or slice of its input's value; strided views that are not expressible that
// way (as_strided, unfold, diagonal) read the input as a contiguous buffer.
#include <algorithm>
#include <numeric>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

using K = Arg::Kind;
using E = ElementType;

int64_t Numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

int64_t IntOr(const std::vector<Arg>& a, size_t i, int64_t dflt) {
  return i < a.size() && a[i].kind == K::Int ? a[i].i : dflt;
}

// Reads (sizes, strides, offset) out of x taken as a contiguous buffer.
Value StridedRead(Builder& b, Value x, const std::vector<int64_t>& sizes,
                  const std::vector<int64_t>& strides, int64_t offset) {
  int64_t n = x.type.numel();
  if (Numel(sizes) == 0) return b.Splat(x.dtype(), 0, sizes);
  ViewGeometry g;
  g.sizes = sizes;
  g.strides = strides;
  g.storage_numel = n;
  g.whole = offset == 0 && Numel(sizes) == n && strides == ContiguousStrides(sizes);
  Value flat = b.Reshape(x, {n});
  return ReadView(b, flat, b.ConstantInt(E::I64, offset), g);
}

// Shape-only views: the value reshaped to the output shape.
std::vector<Value> ReshapeRule(Context& c, const std::vector<Arg>& a) {
  return One(c.b.Reshape(a.at(0).tensor, Out(c).shape));
}

std::vector<Value> Expand(Context& c, const std::vector<Arg>& a) {
  return One(c.b.BroadcastTo(a.at(0).tensor, Out(c).shape));
}

std::vector<Value> Permute(Context& c, const std::vector<Arg>& a) {
  Value x = a.at(0).tensor;
  std::vector<int64_t> perm;
  for (int64_t d : a.at(1).ints) perm.push_back(WrapDim(d, x.rank()));
  return One(c.b.Transpose(x, perm));
}

std::vector<Value> TransposeRule(Context& c, const std::vector<Arg>& a) {
  Value x = a.at(0).tensor;
  int64_t r = x.rank();
  if (r == 0) return One(x);
  int64_t d0 = WrapDim(a.at(1).i, r), d1 = WrapDim(a.at(2).i, r);
  std::vector<int64_t> perm(r);
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[d0], perm[d1]);
  return One(c.b.Transpose(x, perm));
}

std::vector<Value> T(Context& c, const std::vector<Arg>& a) {
  Value x = a.at(0).tensor;
  if (x.rank() < 2) return One(x);
  return One(c.b.Transpose(x, {1, 0}));
}

// slice.Tensor(self, dim=0, start=None, end=None, step=1)
std::vector<Value> SliceRule(Context& c, const std::vector<Arg>& a) {
  Value x = a.at(0).tensor;
  int64_t r = x.rank();
  int64_t dim = WrapDim(IntOr(a, 1, 0), r);
  int64_t n = x.shape()[dim];
  int64_t start = IntOr(a, 2, 0), end = IntOr(a, 3, n), step = IntOr(a, 4, 1);
  if (step <= 0) throw Unsupported("slice step must be positive");
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  std::vector<int64_t> lo(r, 0), hi = x.shape(), st(r, 1);
  lo[dim] = start;
  hi[dim] = end;
  st[dim] = step;
  Value v = c.b.Slice(x, lo, hi, st);
  if (v.shape() != Out(c).shape) throw std::logic_error("slice: unexpected result shape");
  return One(v);
}

// select.int(self, dim, index)
std::vector<Value> Select(Context& c, const std::vector<Arg>& a) {
  Value x = a.at(0).tensor;
  int64_t r = x.rank();
  int64_t dim = WrapDim(a.at(1).i, r);
  int64_t n = x.shape()[dim];
  int64_t index = a.at(2).i;
  if (index < -n || index >= n)
    throw std::out_of_range("select(): index " + std::to_string(index) +
                            " out of range for tensor of size " + std::to_string(n) +
                            " at dimension " + std::to_string(dim));
  if (index < 0) index += n;
  std::vector<int64_t> lo(r, 0), hi = x.shape(), st(r, 1);
  lo[dim] = index;
  hi[dim] = index + 1;
  return One(c.b.Reshape(c.b.Slice(x, lo, hi, st), Out(c).shape));
}

// as_strided(self, size, stride, storage_offset=None): the input is taken as
// a contiguous tensor at offset 0 (the graph builder checks that).
std::vector<Value> AsStrided(Context& c, const std::vector<Arg>& a) {
  return One(StridedRead(c.b, a.at(0).tensor, a.at(1).ints, a.at(2).ints, IntOr(a, 3, 0)));
}

// unfold(self, dimension, size, step)
std::vector<Value> Unfold(Context& c, const std::vector<Arg>& a) {
  Value x = a.at(0).tensor;
  std::vector<int64_t> sizes = x.shape(), strides = ContiguousStrides(x.shape());
  if (x.rank() == 0) {
    sizes = {};
    strides = {};
  }
  const std::vector<int64_t>& out = Out(c).shape;
  std::vector<int64_t> out_strides;
  if (x.rank() == 0) {
    out_strides = {1};
  } else {
    int64_t dim = WrapDim(a.at(1).i, x.rank());
    out_strides = strides;
    out_strides[dim] = strides[dim] * a.at(3).i;
    out_strides.push_back(strides[dim]);
  }
  return One(StridedRead(c.b, x, out, out_strides, 0));
}

// diagonal(self, offset=0, dim1=0, dim2=1)
std::vector<Value> Diagonal(Context& c, const std::vector<Arg>& a) {
  Value x = a.at(0).tensor;
  int64_t r = x.rank();
  int64_t offset = IntOr(a, 1, 0);
  int64_t d1 = WrapDim(IntOr(a, 2, 0), r), d2 = WrapDim(IntOr(a, 3, 1), r);
  std::vector<int64_t> strides = ContiguousStrides(x.shape()), out_strides;
  for (int64_t d = 0; d < r; ++d)
    if (d != d1 && d != d2) out_strides.push_back(strides[d]);
  out_strides.push_back(strides[d1] + strides[d2]);
  int64_t start = offset >= 0 ? offset * strides[d2] : -offset * strides[d1];
  if (Numel(Out(c).shape) == 0) start = 0;
  return One(StridedRead(c.b, x, Out(c).shape, out_strides, start));
}

// split.Tensor / split_with_sizes / unbind.int: consecutive pieces along dim
// whose sizes come from the outputs.
Rule Pieces(size_t dim_arg, bool squeeze) {
  return [dim_arg, squeeze](Context& c, const std::vector<Arg>& a) {
    Value x = a.at(0).tensor;
    int64_t r = x.rank();
    int64_t dim = WrapDim(IntOr(a, dim_arg, 0), r);
    std::vector<Value> outs;
    int64_t pos = 0;
    for (const TensorType& t : c.outputs) {
      int64_t len = squeeze ? 1 : t.shape.at(dim);
      std::vector<int64_t> lo(r, 0), hi = x.shape(), st(r, 1);
      lo[dim] = pos;
      hi[dim] = pos + len;
      outs.push_back(c.b.Reshape(c.b.Slice(x, lo, hi, st), t.shape));
      pos += len;
    }
    return outs;
  };
}

// _to_copy / copy / clone-like conversions: the value in the output type.
std::vector<Value> ToCopy(Context& c, const std::vector<Arg>& a) {
  return One(As(c.b, a.at(0).tensor, Out(c).dtype, Out(c).shape));
}

std::vector<Value> CopyRule(Context& c, const std::vector<Arg>& a) {  // copy(self, src)
  return One(As(c.b, a.at(1), Out(c).dtype, Out(c).shape));
}

// Factories: a Scalar (arg `i`) or a constant, broadcast to the output.
Rule FillFrom(size_t i) {
  return [i](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = Out(c);
    const Arg& s = a.at(i);
    if (s.kind != K::Scalar && s.kind != K::Tensor) throw Unsupported("fill value is not a scalar");
    Value v = c.b.Convert(c.b.Reshape(s.tensor, {}), out.dtype);
    return One(c.b.BroadcastInDim(v, out.shape, {}));
  };
}

Rule Constant(double v) {
  return [v](Context& c, const std::vector<Arg>&) {
    const TensorType& out = Out(c);
    return One(c.b.Splat(out.dtype, v, out.shape));
  };
}

Arg ScalarConst(Builder& b, int64_t v) {
  Arg s;
  s.kind = K::Scalar;
  s.scalar_type = E::I64;
  s.tensor = b.ConstantInt(E::I64, v);
  return s;
}

// arange.start_step(start, end, step) / arange.start(start, end) /
// arange.default(end): the eager arange.start_out rule.
Rule ArangeRule(int form) {
  return [form](Context& c, const std::vector<Arg>& a) {
    const RuleEntry* e = Find("arange.start_out");
    if (!e) throw Unsupported("no arange rule");
    std::vector<Arg> args;
    if (form == 0) {  // arange(end)
      args = {ScalarConst(c.b, 0), a.at(0), ScalarConst(c.b, 1)};
    } else if (form == 1) {  // arange.start(start, end)
      args = {a.at(0), a.at(1), ScalarConst(c.b, 1)};
    } else {
      args = {a.at(0), a.at(1), a.at(2)};
    }
    return e->rule(c, args);
  };
}

void G(const std::string& name, Rule r) { Register(name, std::move(r), {}, Scope::Graph); }

struct Registration {
  Registration() {
    for (const char* n : {"view", "_unsafe_view", "reshape", "alias", "detach", "lift_fresh_copy",
                          "squeeze", "squeeze.dim", "squeeze.dims", "unsqueeze", "view_as",
                          "flatten.using_ints", "_reshape_copy", "view_copy", "alias_copy",
                          "squeeze_copy.dims", "unsqueeze_copy", "_reshape_alias"})
      G(n, ReshapeRule);
    G("expand", Expand);
    G("expand_copy", Expand);
    G("permute", Permute);
    G("permute_copy", Permute);
    G("transpose.int", TransposeRule);
    G("t", T);
    G("numpy_T", T);
    G("slice.Tensor", SliceRule);
    G("slice_copy.Tensor", SliceRule);
    G("select.int", Select);
    G("select_copy.int", Select);
    G("as_strided", AsStrided);
    G("unfold", Unfold);
    G("diagonal", Diagonal);
    G("split.Tensor", Pieces(2, false));
    G("split_with_sizes", Pieces(2, false));
    G("split_with_sizes_copy", Pieces(2, false));
    G("unbind.int", Pieces(1, true));
    G("_to_copy", ToCopy);
    G("prims::convert_element_type", ToCopy);  // left by decompositions of symbolic graphs
    G("copy", CopyRule);
    G("full", FillFrom(1));
    G("full_like", FillFrom(1));
    G("new_full", FillFrom(2));
    G("scalar_tensor", FillFrom(0));
    for (const char* n : {"zeros", "zeros_like", "new_zeros", "empty.memory_format", "empty_like",
                          "new_empty", "empty_strided", "new_empty_strided"})
      G(n, Constant(0));
    for (const char* n : {"ones", "ones_like", "new_ones"}) G(n, Constant(1));
    G("arange.default", ArangeRule(0));
    G("arange.start", ArangeRule(1));
    G("arange.start_step", ArangeRule(2));
  }
} registration;

}  // namespace
}  // namespace torch_tpu::lowering
