// put / put_(self, index, source, accumulate): self flattened, with
// source's elements written (or, with accumulate, added) at `index`, the
// inverse of take. Negative indices wrap (as on CPU); out-of-range ones
// raise (CheckedIndex). Without accumulate, a repeated index keeps one of
// its values (CPU: unspecified). Data movement only, so complex dtypes use
// this rule as written.
#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

std::vector<Value> Put(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  Value x = a.at(0).tensor, index = a.at(1).tensor, source = a.at(2).tensor;
  bool accumulate = a.at(3).i != 0;
  int64_t n = index.type.numel(), size = x.type.numel();
  if (source.type.numel() != n)
    throw std::invalid_argument("put_: expected source and index to have the same number of "
                                "elements, but got " + std::to_string(source.type.numel()) +
                                " and " + std::to_string(n));
  Value flat = b.Reshape(b.Convert(x, out.dtype), {size});
  if (n == 0) return One(b.Reshape(flat, out.shape));
  if (size == 0) throw std::out_of_range("put_: tried to put into an empty tensor");
  Value idx = CheckedIndex(c, b.Reshape(index, {n}), size, true, "put_");
  Value src = b.Reshape(b.Convert(source, out.dtype), {n});
  std::string combiner = !accumulate ? "assign" : out.dtype == ElementType::Bool ? "or" : "add";
  Value r = b.Scatter(flat, b.Reshape(idx, {n, 1}), src, {0}, combiner);
  return One(b.Reshape(r, out.shape));
}

const bool registered = [] {
  Register("put", Put, {"put_", "put.out"});
  MarkComplexCapable({"put"});
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
