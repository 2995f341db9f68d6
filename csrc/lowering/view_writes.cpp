// Graph-only rules: the functional forms of writes into views, as
// AOTAutograd emits them for slice assignment and index writes into KV
// caches and buffers (`cache[:, :, t:t+1] = k`, `x[i] = v`): one
// dynamic_update_slice, which XLA performs in place in the (donated) buffer.
#include <algorithm>
#include <stdexcept>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {


// slice_scatter(self, src, dim=0, start=None, end=None, step=1)
std::vector<Value> SliceScatter(Context& c, const std::vector<Arg>& a) {
  Value x = a.at(0).tensor, src = a.at(1).tensor;
  int64_t r = x.rank();
  auto int_or = [&](size_t i, int64_t dflt) {
    return i < a.size() && a[i].kind == Arg::Kind::Int ? a[i].i : dflt;
  };
  int64_t dim = WrapDim(int_or(2, 0), r);
  int64_t n = x.shape()[dim];
  int64_t start = int_or(3, 0), step = int_or(5, 1);
  if (step != 1) throw Unsupported("slice_scatter with a step");
  if (start < 0) start += n;
  start = std::clamp<int64_t>(start, 0, n);
  std::vector<int64_t> want = x.shape();
  want[dim] = src.shape()[dim];
  if (src.shape() != want || start + want[dim] > n)
    throw Unsupported("slice_scatter: unexpected source shape");
  std::vector<Value> starts;
  for (int64_t d = 0; d < r; ++d)
    starts.push_back(c.b.ConstantInt(ElementType::I64, d == dim ? start : 0));
  return {c.b.DynamicUpdateSlice(x, c.b.Convert(src, x.dtype()), starts)};
}

// select_scatter(self, src, dim, index)
std::vector<Value> SelectScatter(Context& c, const std::vector<Arg>& a) {
  Value x = a.at(0).tensor, src = a.at(1).tensor;
  int64_t r = x.rank();
  int64_t dim = WrapDim(a.at(2).i, r);
  int64_t n = x.shape()[dim], index = a.at(3).i;
  if (index < -n || index >= n) throw std::out_of_range("select_scatter: index out of range");
  if (index < 0) index += n;
  std::vector<int64_t> shape = x.shape();
  shape[dim] = 1;
  std::vector<Value> starts;
  for (int64_t d = 0; d < r; ++d)
    starts.push_back(c.b.ConstantInt(ElementType::I64, d == dim ? index : 0));
  Value update = c.b.Reshape(c.b.Convert(src, x.dtype()), shape);
  return {c.b.DynamicUpdateSlice(x, update, starts)};
}

// as_strided_scatter(self, src, size, stride, storage_offset=None): self is
// taken as a dense buffer (compile_graph.py checks that its value is contiguous
// with offset 0, as for as_strided), src is written through the view.
std::vector<Value> AsStridedScatter(Context& c, const std::vector<Arg>& a) {
  Value x = a.at(0).tensor, src = a.at(1).tensor;
  ViewGeometry g;
  g.sizes = a.at(2).ints;
  g.strides = a.at(3).ints;
  g.storage_numel = x.type.numel();
  int64_t offset = a.size() > 4 && a[4].kind == Arg::Kind::Int ? a[4].i : 0;
  if (src.shape() != g.sizes) throw Unsupported("as_strided_scatter: source shape");
  Value flat = c.b.Reshape(x, {g.storage_numel});
  Value out = WriteView(c.b, flat, c.b.ConstantInt(ElementType::I64, offset), g,
                                  c.b.Convert(src, x.dtype()));
  return {c.b.Reshape(out, x.shape())};
}

const bool registered = [] {
  Register("as_strided_scatter", AsStridedScatter, {}, Scope::Graph);
  Register("slice_scatter", SliceScatter, {}, Scope::Graph);
  Register("select_scatter", SelectScatter, {}, Scope::Graph);
  return true;
}();


}  // namespace
}  // namespace torch_tpu::lowering
