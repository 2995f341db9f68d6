// Training basics: activation backward ops and the classic losses
// (nll_loss, mse_loss) with their backward ops.
#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

using K = Arg::Kind;

enum Reduction { kNone = 0, kMean = 1, kSum = 2 };

Value Splat(Builder& b, const Value& like, double v) {
  return b.Splat(like.dtype(), v, like.shape());
}

Value SumAll(Builder& b, Value x) {
  std::vector<int64_t> dims(x.rank());
  for (int64_t i = 0; i < x.rank(); ++i) dims[i] = i;
  return b.Reduce(x, b.Constant(x.dtype(), 0), dims, "add");
}

// For nll_loss: self [N, C] (or [C]), target [N] (or []). Returns the
// one-hot selection [N, C] (as compute type, with class weights and the
// ignore mask applied) and the per-sample weights [N].
struct NllTerms {
  Value picked_weights;  // [N, C]
  Value sample_weights;  // [N]
  std::vector<int64_t> nc;
};

NllTerms Nll(Builder& b, const std::vector<Arg>& a, ElementType ct) {
  Value self = a.at(0).tensor, target = a.at(1).tensor;
  NllTerms t;
  int64_t n = self.rank() == 2 ? self.shape()[0] : 1;
  int64_t c = self.shape().back();
  t.nc = {n, c};
  if (self.rank() > 2) throw Unsupported("nll_loss over spatial dims (nll_loss2d)");
  Value tgt = b.Reshape(b.Convert(target, ElementType::I64), {n});
  Value classes = b.Iota(TensorType{ElementType::I64, {n, c}}, 1);
  Value onehot = b.Compare("EQ", classes, b.BroadcastInDim(tgt, {n, c}, {0}));
  int64_t ignore_index = a.at(4).i;
  Value keep = b.Compare("NE", tgt, b.Splat(ElementType::I64, static_cast<double>(ignore_index), {n}));
  Value w = a.at(2).kind == K::Tensor
                ? b.BroadcastInDim(b.Convert(a.at(2).tensor, ct), {n, c}, {1})
                : b.Splat(ct, 1.0, {n, c});
  Value zero = b.Splat(ct, 0.0, {n, c});
  Value picked = b.Select(b.Binary("and", onehot, b.BroadcastInDim(keep, {n, c}, {0})), w, zero);
  t.picked_weights = picked;
  t.sample_weights = b.Reduce(picked, b.Constant(ct, 0), {1}, "add");
  return t;
}

const bool registered = [] {
  Register("threshold_backward", [](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = c.outputs.at(0);
    ElementType ct = ComputeType(out.dtype);
    Value g = As(c.b, a[0], ct, out.shape), x = As(c.b, a[1], ct, out.shape);
    Value th = As(c.b, a[2], ct, out.shape);
    Value r = c.b.Select(c.b.Compare("LE", x, th), c.b.Splat(ct, 0, out.shape), g);
    return std::vector<Value>{c.b.Convert(r, out.dtype)};
  });
  Register("tanh_backward", [](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = c.outputs.at(0);
    ElementType ct = ComputeType(out.dtype);
    Value g = As(c.b, a[0], ct, out.shape), y = As(c.b, a[1], ct, out.shape);
    Value r = c.b.Binary("multiply", g,
                         c.b.Binary("subtract", Splat(c.b, y, 1), c.b.Binary("multiply", y, y)));
    return std::vector<Value>{c.b.Convert(r, out.dtype)};
  });
  Register("sigmoid_backward", [](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = c.outputs.at(0);
    ElementType ct = ComputeType(out.dtype);
    Value g = As(c.b, a[0], ct, out.shape), y = As(c.b, a[1], ct, out.shape);
    Value r = c.b.Binary("multiply", g,
                         c.b.Binary("multiply", y, c.b.Binary("subtract", Splat(c.b, y, 1), y)));
    return std::vector<Value>{c.b.Convert(r, out.dtype)};
  });
  // nll_loss_forward(self, target, weight?, int reduction, SymInt ignore_index)
  //   -> (output, total_weight)
  Register("nll_loss_forward", [](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = c.outputs.at(0);
    ElementType ct = ComputeType(out.dtype);
    NllTerms t = Nll(c.b, a, ct);
    Value self = c.b.Reshape(c.b.Convert(a[0].tensor, ct), t.nc);
    Value losses = c.b.Unary("negate", c.b.Reduce(c.b.Binary("multiply", self, t.picked_weights),
                                                   c.b.Constant(ct, 0), {1}, "add"));  // [N]
    Value total = SumAll(c.b, t.sample_weights);
    Value loss;
    switch (a[3].i) {
      case kNone: loss = c.b.Reshape(losses, out.shape); break;
      case kSum: loss = SumAll(c.b, losses); break;
      default: loss = c.b.Binary("divide", SumAll(c.b, losses), total); break;
    }
    return std::vector<Value>{c.b.Convert(loss, out.dtype),
                              c.b.Convert(c.b.Reshape(total, c.outputs.at(1).shape),
                                          c.outputs.at(1).dtype)};
  });
  // nll_loss_backward(grad_output, self, target, weight?, reduction, ignore_index, total_weight)
  Register("nll_loss_backward", [](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = c.outputs.at(0);
    ElementType ct = ComputeType(out.dtype);
    std::vector<Arg> fwd{a[1], a[2], a[3], a[4], a[5]};
    NllTerms t = Nll(c.b, fwd, ct);
    int64_t n = t.nc[0], cls = t.nc[1];
    Value g = c.b.Convert(a[0].tensor, ct);
    Value scale;
    if (a[4].i == kNone) {
      scale = c.b.BroadcastInDim(c.b.Reshape(g, {n}), {n, cls}, {0});
    } else {
      Value s = c.b.Reshape(g, {});
      if (a[4].i == kMean)
        s = c.b.Binary("divide", s, c.b.Reshape(c.b.Convert(a[6].tensor, ct), {}));
      scale = c.b.BroadcastInDim(s, {n, cls}, {});
    }
    Value grad = c.b.Unary("negate", c.b.Binary("multiply", t.picked_weights, scale));
    return std::vector<Value>{c.b.Convert(c.b.Reshape(grad, out.shape), out.dtype)};
  });
  // mse_loss(self, target, int reduction=Mean)
  Register("mse_loss", [](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = c.outputs.at(0);
    ElementType ct = ComputeType(out.dtype);
    std::vector<int64_t> shape = BroadcastShapes(a[0].tensor.shape(), a[1].tensor.shape());
    Value d = c.b.Binary("subtract", As(c.b, a[0], ct, shape), As(c.b, a[1], ct, shape));
    Value sq = c.b.Binary("multiply", d, d);
    Value r = sq;
    int64_t numel = 1;
    for (int64_t s : shape) numel *= s;
    if (a[2].i == kSum) r = SumAll(c.b, sq);
    if (a[2].i == kMean)
      r = c.b.Binary("divide", SumAll(c.b, sq), c.b.Constant(ct, static_cast<double>(numel)));
    return std::vector<Value>{c.b.Convert(c.b.Reshape(r, out.shape), out.dtype)};
  });
  // mse_loss_backward(grad_output, self, target, int reduction)
  Register("mse_loss_backward", [](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = c.outputs.at(0);
    ElementType ct = ComputeType(out.dtype);
    Value d = c.b.Binary("subtract", As(c.b, a[1], ct, out.shape), As(c.b, a[2], ct, out.shape));
    Value g = As(c.b, a[0], ct, out.shape);
    double scale = 2.0;
    if (a[3].i == kMean) {
      int64_t numel = 1;
      for (int64_t s : out.shape) numel *= s;
      scale /= static_cast<double>(std::max<int64_t>(numel, 1));
    }
    Value r = c.b.Binary("multiply", c.b.Binary("multiply", d, g), c.b.Splat(ct, scale, out.shape));
    return std::vector<Value>{c.b.Convert(r, out.dtype)};
  });
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
