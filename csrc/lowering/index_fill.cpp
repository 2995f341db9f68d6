// index_fill: self with the slices at `index` along `dim` set to `value`.
// Negative indices wrap (as on CPU); out-of-range ones raise (CheckedIndex).
#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

std::vector<Value> IndexFill(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = c.outputs.at(0);
  Value self = b.Convert(a.at(0).tensor, out.dtype);
  Value x = self.rank() == 0 ? b.Reshape(self, {1}) : self;
  int64_t dim = WrapDim(a.at(1).i, x.rank());
  int64_t size = x.shape()[dim];
  Value index = a.at(2).tensor;
  int64_t n = index.type.numel();
  if (n == 0 || out.numel() == 0) return {b.Reshape(x, out.shape)};
  Value idx = CheckedIndex(c, b.Reshape(index, {n}), size, true, "index_fill");
  // hit[p]: some index equals p.
  Value positions = b.Iota(TensorType{ElementType::I64, {size, n}}, 0);
  Value eq = b.Compare("EQ", positions, b.BroadcastInDim(idx, {size, n}, {1}));
  Value hit = b.Reduce(eq, b.ConstantInt(ElementType::Bool, 0), {1}, "or");
  Value mask = b.BroadcastInDim(hit, x.shape(), {dim});
  Value value = As(b, a.at(3), out.dtype, x.shape());
  return {b.Reshape(b.Select(mask, value, x), out.shape)};
}

const Registrar scalar_rule("index_fill.int_Scalar", IndexFill);
const Registrar tensor_rule("index_fill.int_Tensor", IndexFill);

}  // namespace
}  // namespace torch_tpu::lowering
