// Embedding tables:
//
// - embedding_dense_backward(grad_output, indices, num_weights, padding_idx,
//   scale_grad_by_freq): rows of grad summed per index; padding_idx rows get
//   nothing; with scale_grad_by_freq each row is divided by its index's count.
// - embedding_renorm (+ in-place, out=): rows referenced by `indices` whose
//   norm exceeds max_norm are scaled by max_norm / (norm + 1e-7), each row
//   once however often it is referenced (nn.Embedding(max_norm=...)).
// Indices go through CheckedIndex: out-of-range ones raise IndexError.
#include <cmath>
#include <string>
#include <vector>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

using K = Arg::Kind;
using E = ElementType;

// embedding_dense_backward(grad_output, indices, num_weights, padding_idx,
// scale_grad_by_freq): rows of grad summed per index; padding_idx rows get
// nothing; with scale_grad_by_freq each row is divided by its index's count.
std::vector<Value> EmbeddingBackward(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  Builder& b = c.b;
  ElementType ct = ComputeType(out.dtype);
  int64_t num_weights = a[2].i, padding_idx = a[3].i;
  bool scale = a[4].i != 0;
  Value idx0 = a[1].tensor;
  int64_t dim = out.shape.at(1);
  if (idx0.type.numel() == 0 || out.numel() == 0) return One(Zeros(b, out));
  // The indices' own dims S index the rows (no flattening: a bounded-dynamic
  // dim of S stays one dim, and XLA's padder drops its padding's updates).
  const std::vector<int64_t>& s = idx0.shape();
  const int64_t r = idx0.rank();
  std::vector<int64_t> rows = s, at_shape = s;
  rows.push_back(dim);
  at_shape.push_back(1);
  Value idx = CheckedIndex(c, idx0, num_weights, false, "embedding_backward");
  Value at = b.BroadcastInDim(idx, at_shape, Range(r));  // [S..., 1]
  Value g = b.Reshape(b.Convert(a[0].tensor, ct), rows);  // grad [S..., dim] (rank-0 S: [dim])
  if (scale) {
    Value counts = b.Scatter(b.Splat(ct, 0, {num_weights}), at, b.Splat(ct, 1, s), {0}, "add");
    Value per = b.Gather(counts, at, {0});  // [S...]
    g = b.Binary("divide", g, b.BroadcastInDim(per, rows, Range(r)));
  }
  Value keep = b.Compare("NE", idx, b.Splat(E::I64, static_cast<double>(padding_idx), s));
  g = b.Select(b.BroadcastInDim(keep, rows, Range(r)), g, b.Splat(ct, 0, rows));
  Value result = b.Scatter(b.Splat(ct, 0, {num_weights, dim}), at, g, {0}, "add");
  return One(b.Convert(result, out.dtype));
}

// embedding_renorm(self, indices, float max_norm, float norm_type): the new weight.
std::vector<Value> EmbeddingRenorm(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value w = a.at(0).tensor;
  Value indices = a.at(1).tensor;
  const TensorType& out = c.outputs.at(0);
  if (w.rank() != 2)
    throw std::invalid_argument("embedding_renorm_: Expected 2-dimensional tensor, but got " +
                                std::to_string(w.rank()) + "-dimensional tensor for argument #1 'self'");
  if (indices.dtype() != E::I64 && indices.dtype() != E::I32)
    throw std::invalid_argument("embedding_renorm_: Expected tensor for argument #2 'indices' to "
                                "have one of the following scalar types: Long, Int");
  if (!hlo::IsFloat(w.dtype())) throw Unsupported("embedding_renorm_ of a non-float weight");
  double max_norm = a.at(2).kind == K::Int ? static_cast<double>(a.at(2).i) : a.at(2).d;
  double p = a.at(3).kind == K::Int ? static_cast<double>(a.at(3).i) : a.at(3).d;
  int64_t n = indices.type.numel();
  int64_t rows = w.shape()[0], d = w.shape()[1];
  if (n == 0 || rows == 0) return {b.Convert(w, out.dtype)};
  // Like the CPU kernel (self[i] selects), negative indices wrap.
  Value idx = CheckedIndex(c, b.Reshape(indices, {n}), rows, true, "embedding_renorm_");
  Value at = b.Reshape(idx, {n, 1});
  Value r = b.Gather(w, at, {0});  // [n, d]
  E ct = ComputeType(w.dtype());
  Value rc = b.Convert(r, ct);
  Value ar = b.Unary("abs", rc);
  std::vector<int64_t> shape{n, d};
  Value norm;
  if (std::isinf(p)) {
    norm = b.Reduce(ar, p > 0 ? b.MinValue(ct) : b.MaxValue(ct), {1}, p > 0 ? "maximum" : "minimum");
  } else if (p == 0) {
    norm = b.Reduce(b.Convert(b.Compare("NE", ar, b.Splat(ct, 0, shape)), ct), b.Constant(ct, 0),
                    {1}, "add");
  } else if (p == 1) {
    norm = b.Reduce(ar, b.Constant(ct, 0), {1}, "add");
  } else if (p == 2) {
    norm = b.Unary("sqrt", b.Reduce(b.Binary("multiply", rc, rc), b.Constant(ct, 0), {1}, "add"));
  } else {
    Value s = b.Reduce(b.Binary("power", ar, b.Splat(ct, p, shape)), b.Constant(ct, 0), {1}, "add");
    norm = b.Binary("power", s, b.Splat(ct, 1.0 / p, {n}));
  }
  // The norm is a tensor of the weight's dtype on the CPU.
  norm = b.Convert(b.Convert(norm, w.dtype()), ct);
  Value too_big = b.Compare("GT", norm, b.Splat(ct, max_norm, {n}));
  Value scale = b.Binary("divide", b.Splat(ct, max_norm, {n}),
                         b.Binary("add", norm, b.Splat(ct, 1e-7, {n})));
  scale = b.Select(too_big, scale, b.Splat(ct, 1, {n}));
  Value scaled = b.Convert(b.Binary("multiply", rc, b.BroadcastInDim(scale, shape, {0})), w.dtype());
  // Every copy of a repeated index writes the same row.
  Value result = b.Scatter(w, at, scaled, {0}, "assign");
  return {b.Convert(result, out.dtype)};
}

const bool registered = [] {
  // Bounded dynamic shapes: grad [S..., dim] keeps its embedding dim static.
  Register("embedding_dense_backward", EmbeddingBackward).Dynamic([](const std::vector<Arg>&, StaticDims& s) {
    s.Last(0, 1);
  });
  Register("embedding_renorm", EmbeddingRenorm);
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
