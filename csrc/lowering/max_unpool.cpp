// max_unpool2d / max_unpool3d(self, indices, output_size, ...): zeros of the
// output size with self's values written at `indices` (flat positions in each
// output plane, as max_pool returns them). Out-of-range indices raise (as the
// CPU kernel's "Found an invalid max index"); duplicate indices keep one of
// the values (the CPU kernel keeps the last; pooling indices never repeat).
#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

std::vector<Value> MaxUnpool(Context& c, const std::vector<Arg>& a, int64_t spatial) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  Value x = a.at(0).tensor, indices = a.at(1).tensor;
  if (x.rank() != spatial + 1 && x.rank() != spatial + 2)
    throw std::invalid_argument("max_unpool: expected a " + std::to_string(spatial + 1) + "-d or " +
                                std::to_string(spatial + 2) + "-d input");
  if (indices.shape() != x.shape())
    throw std::invalid_argument("max_unpool: expected indices of the input's shape");
  int64_t plane = 1, in_plane = 1;
  for (int64_t d = out.rank() - spatial; d < out.rank(); ++d) plane *= out.shape[d];
  for (int64_t d = x.rank() - spatial; d < x.rank(); ++d) in_plane *= x.shape()[d];
  int64_t planes = x.type.numel() / std::max<int64_t>(in_plane, 1);
  if (out.numel() == 0 || x.type.numel() == 0) return One(Zeros(b, out));
  Value idx = CheckedIndex(c, b.Reshape(indices, {planes, in_plane}), plane, false, "max_unpool");
  Value values = b.Reshape(x, {planes, in_plane});
  Value target = b.Splat(x.dtype(), 0, {planes, plane});
  Value written = b.Scatter(target, Coordinates(b, idx, 1), values, {0, 1},
                            [](Builder&, Value, Value update) { return update; });
  return One(b.Reshape(written, out.shape));
}

const bool registered = [] {
  Register("max_unpool2d", [](Context& c, const std::vector<Arg>& a) { return MaxUnpool(c, a, 2); });
  Register("max_unpool3d", [](Context& c, const std::vector<Arg>& a) { return MaxUnpool(c, a, 3); });
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
