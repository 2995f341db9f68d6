// index_reduce(self, dim, index, source, reduce, include_self): source's slices
// reduced (prod, mean, amax, amin) into self's slices at `index` along dim.
// It is scatter_reduce.two with index broadcast to source's shape (the
// scatter_reduce rule: include_self, mean's counts, NaN propagation).
#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

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
  return Find("scatter_reduce.two")->rule(c, {a[0], a[1], full, a[3], a.at(4), a.at(5)});
}

const Registrar rule("index_reduce", IndexReduce);

}  // namespace
}  // namespace torch_tpu::lowering
