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

// For nll_loss: self [N, C] (or [C]), target [N] (or []); for nll_loss2d
// (and any rank > 2): self [N, C, d1...], target [N, d1...], seen as M =
// N*d1*... rows of C classes. Returns self as [M, C] rows (compute type), the
// one-hot selection [M, C] (with class weights and the ignore mask applied)
// and the per-row weights [M]. With `check`, an out-of-range target (neither
// in [0, C) nor ignore_index) fails at the next sync, as CPU raises for it.
struct NllTerms {
  Value rows;            // [M, C]
  Value picked_weights;  // [M, C]
  Value sample_weights;  // [M]
  std::vector<int64_t> nc;
};

// x [N, C, d1...] -> [N, d1..., C] (classes last).
std::vector<int64_t> ClassesLast(int64_t rank) {
  std::vector<int64_t> perm{0};
  for (int64_t d = 2; d < rank; ++d) perm.push_back(d);
  perm.push_back(1);
  return perm;
}

NllTerms Nll(Context& ctx, const std::vector<Arg>& a, ElementType ct, bool check) {
  Builder& b = ctx.b;
  Value self = a.at(0).tensor, target = a.at(1).tensor;
  NllTerms t;
  int64_t c = self.rank() >= 2 ? self.shape()[1] : self.shape()[0];
  int64_t n = 1;
  for (int64_t d = 0; d < self.rank(); ++d)
    if (d != (self.rank() >= 2 ? 1 : 0)) n *= self.shape()[d];
  t.nc = {n, c};
  Value x = b.Convert(self, ct);
  if (self.rank() > 2) x = b.Transpose(x, ClassesLast(self.rank()));
  t.rows = b.Reshape(x, {n, c});
  Value tgt = b.Reshape(b.Convert(target, ElementType::I64), {n});
  int64_t ignore_index = a.at(4).i;
  Value keep = b.Compare("NE", tgt, b.Splat(ElementType::I64, static_cast<double>(ignore_index), {n}));
  if (check && n > 0) {
    Value in_range = b.Binary(
        "and", b.Compare("GE", tgt, b.Splat(ElementType::I64, 0, {n})),
        b.Compare("LT", tgt, b.Splat(ElementType::I64, static_cast<double>(c), {n})));
    Value ok = b.Binary("or", in_range, b.Unary("not", keep));
    ctx.Require(b.Reduce(ok, b.ConstantInt(ElementType::Bool, 1), {0}, "and"),
                "nll_loss: Target is out of bounds (must be in [0, " + std::to_string(c) +
                    ") or ignore_index)");
  }
  Value classes = b.Iota(TensorType{ElementType::I64, {n, c}}, 1);
  Value onehot = b.Compare("EQ", classes, b.BroadcastInDim(tgt, {n, c}, {0}));
  Value w = a.at(2).kind == K::Tensor
                ? b.BroadcastInDim(b.Convert(a.at(2).tensor, ct), {n, c}, {1})
                : b.Splat(ct, 1.0, {n, c});
  Value zero = b.Splat(ct, 0.0, {n, c});
  Value picked = b.Select(b.Binary("and", onehot, b.BroadcastInDim(keep, {n, c}, {0})), w, zero);
  t.picked_weights = picked;
  t.sample_weights = b.Reduce(picked, b.Constant(ct, 0), {1}, "add");
  return t;
}

// nll_loss(2d)_forward(self, target, weight?, int reduction, SymInt ignore_index)
//   -> (output, total_weight)
std::vector<Value> NllForward(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = c.outputs.at(0);
  ElementType ct = ComputeType(out.dtype);
  NllTerms t = Nll(c, a, ct, true);
  Value losses = c.b.Unary("negate", c.b.Reduce(c.b.Binary("multiply", t.rows, t.picked_weights),
                                                 c.b.Constant(ct, 0), {1}, "add"));  // [M]
  Value total = SumAll(c.b, t.sample_weights);
  Value loss;
  switch (a[3].i) {
    case kNone: loss = c.b.Reshape(losses, out.shape); break;
    case kSum: loss = SumAll(c.b, losses); break;
    default: loss = c.b.Binary("divide", SumAll(c.b, losses), total); break;
  }
  return {c.b.Convert(loss, out.dtype),
          c.b.Convert(c.b.Reshape(total, c.outputs.at(1).shape), c.outputs.at(1).dtype)};
}

// nll_loss(2d)_backward(grad_output, self, target, weight?, reduction,
//   ignore_index, total_weight)
std::vector<Value> NllBackward(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = c.outputs.at(0);
  ElementType ct = ComputeType(out.dtype);
  std::vector<Arg> fwd{a[1], a[2], a[3], a[4], a[5]};
  NllTerms t = Nll(c, fwd, ct, false);
  int64_t n = t.nc[0], cls = t.nc[1];
  Value g = c.b.Convert(a[0].tensor, ct);
  Value scale;
  if (a[4].i == kNone) {
    scale = c.b.BroadcastInDim(c.b.Reshape(g, {n}), {n, cls}, {0});
  } else {
    Value s = c.b.Reshape(g, {});
    if (a[4].i == kMean) s = c.b.Binary("divide", s, c.b.Reshape(c.b.Convert(a[6].tensor, ct), {}));
    scale = c.b.BroadcastInDim(s, {n, cls}, {});
  }
  Value grad = c.b.Unary("negate", c.b.Binary("multiply", t.picked_weights, scale));
  int64_t rank = a[1].tensor.rank();
  if (rank > 2) {  // [M, C] -> [N, d1..., C] -> [N, C, d1...]
    std::vector<int64_t> last = ClassesLast(rank), shape, inverse(rank);
    for (int64_t d : last) shape.push_back(out.shape[d]);
    for (int64_t i = 0; i < rank; ++i) inverse[last[i]] = i;
    grad = c.b.Transpose(c.b.Reshape(grad, shape), inverse);
  }
  return {c.b.Convert(c.b.Reshape(grad, out.shape), out.dtype)};
}


const bool registered = [] {
  Register("threshold_backward", [](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = c.outputs.at(0);
    ElementType ct = ComputeType(out.dtype);
    Value g = As(c.b, a[0], ct, out.shape), x = As(c.b, a[1], ct, out.shape);
    Value th = As(c.b, a[2], ct, out.shape);
    Value r = c.b.Select(c.b.Compare("LE", x, th), c.b.Splat(ct, 0, out.shape), g);
    return std::vector<Value>{c.b.Convert(r, out.dtype)};
  }).DynamicElementwise();
  Register("tanh_backward", [](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = c.outputs.at(0);
    ElementType ct = ComputeType(out.dtype);
    Value g = As(c.b, a[0], ct, out.shape), y = As(c.b, a[1], ct, out.shape);
    Value r = c.b.Binary("multiply", g,
                         c.b.Binary("subtract", Splat(c.b, y, 1), c.b.Binary("multiply", y, y)));
    return std::vector<Value>{c.b.Convert(r, out.dtype)};
  }).DynamicElementwise();
  Register("sigmoid_backward", [](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = c.outputs.at(0);
    ElementType ct = ComputeType(out.dtype);
    Value g = As(c.b, a[0], ct, out.shape), y = As(c.b, a[1], ct, out.shape);
    Value r = c.b.Binary("multiply", g,
                         c.b.Binary("multiply", y, c.b.Binary("subtract", Splat(c.b, y, 1), y)));
    return std::vector<Value>{c.b.Convert(r, out.dtype)};
  }).DynamicElementwise();
  // Bounded dynamic shapes: the classes stay static (the target range check),
  // in self ([N, C] or [C]) and in the class weights.
  auto classes_static = [](size_t self) {
    return [self](const std::vector<Arg>&, StaticDims& s) {
      s.From(self, s.Rank(self) >= 2 ? 1 : 0);
      s.All(self + 2);
    };
  };
  // On rows ([b*s, C] logits of a causal LM, DynamicShapes::rows_args): the
  // padding rows' targets become ignore_index, so they add no loss, no weight
  // and no gradient.
  RuleEntry& fwd = Register("nll_loss_forward", NllForward).Dynamic(classes_static(0));  // (self, target, weight, reduction, ignore_index)
  fwd.dynamic.rows_args = {0, 1};
  fwd.dynamic.neutral_rows = {1, 4};
  fwd.dynamic.rows_when = [](const std::vector<Arg>& a) { return a.at(0).tensor.rank() == 2; };
  // (grad, self, target, weight, reduction, ignore_index, total_weight)
  RuleEntry& bwd = Register("nll_loss_backward", NllBackward).Dynamic(classes_static(1));
  bwd.dynamic.rows_args = {0, 1, 2};
  bwd.dynamic.neutral_rows = {2, 5};
  bwd.dynamic.rows_when = [](const std::vector<Arg>& a) { return a.at(1).tensor.rank() == 2; };
  Register("nll_loss2d_forward", NllForward);
  Register("nll_loss2d_backward", NllBackward);
  // mse_loss(self, target, int reduction=Mean). Bounded dynamic shapes: a
  // mean counts the real elements (BroadcastCount); XLA masks the sum.
  Register("mse_loss", [](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = c.outputs.at(0);
    ElementType ct = ComputeType(out.dtype);
    std::vector<int64_t> shape = BroadcastShapes(a[0].tensor.shape(), a[1].tensor.shape());
    Value d = c.b.Binary("subtract", As(c.b, a[0], ct, shape), As(c.b, a[1], ct, shape));
    Value sq = c.b.Binary("multiply", d, d);
    Value r = sq;
    if (a[2].i == kSum) r = SumAll(c.b, sq);
    if (a[2].i == kMean) r = c.b.Binary("divide", SumAll(c.b, sq), BroadcastCount(c.b, a[0].tensor, a[1].tensor, shape, ct));
    return std::vector<Value>{c.b.Convert(c.b.Reshape(r, out.shape), out.dtype)};
  }).Dynamic();
  // mse_loss_backward(grad_output, self, target, int reduction)
  Register("mse_loss_backward", [](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = c.outputs.at(0);
    ElementType ct = ComputeType(out.dtype);
    Value d = c.b.Binary("subtract", As(c.b, a[1], ct, out.shape), As(c.b, a[2], ct, out.shape));
    Value g = As(c.b, a[0], ct, out.shape);
    Value scale = c.b.Constant(ct, 2.0);
    if (a[3].i == kMean) {
      Value n = c.b.Binary("maximum", BroadcastCount(c.b, a[1].tensor, a[2].tensor, out.shape, ct), c.b.Constant(ct, 1));
      scale = c.b.Binary("divide", scale, n);
    }
    Value r = c.b.Binary("multiply", c.b.Binary("multiply", d, g), c.b.BroadcastInDim(scale, out.shape, {}));
    return std::vector<Value>{c.b.Convert(r, out.dtype)};
  }).Dynamic();
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
