// Piecewise pointwise functions and the losses built on them: hardshrink,
// softshrink, threshold, huber_loss, smooth_l1_loss, binary_cross_entropy,
// and the losses' backward.
// Special cases follow ATen's CPU kernels (NaN inputs pass through; losses
// reduce as `reduction` says: 0 none, 1 mean, 2 sum, in the compute type).
#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

Value Like(Builder& b, const Value& x, double v) { return b.Splat(x.dtype(), v, x.shape()); }

// The elementwise loss `l` of input and target (args 0 and 1) reduced as
// `reduction`, converted to the output. Bounded dynamic: XLA masks the sum,
// and a mean counts the real elements.
Value Reduced(Context& c, const std::vector<Arg>& a, Value l, int64_t reduction) {
  Builder& b = c.b;
  if (reduction != 0) {
    std::vector<int64_t> dims(l.rank());
    for (int64_t i = 0; i < l.rank(); ++i) dims[i] = i;
    std::vector<int64_t> shape = l.shape();
    l = b.Reduce(l, b.Constant(l.dtype(), 0), dims, "add");
    if (reduction == 1) l = b.Binary("divide", l, BroadcastCount(b, a.at(0).tensor, a.at(1).tensor, shape, l.dtype()));
  }
  return b.Convert(b.Reshape(l, Out(c).shape), Out(c).dtype);
}

// hardshrink(x, lambd): 0 inside [-lambd, lambd], else x.
std::vector<Value> Hardshrink(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  ElementType ct = ComputeType(out.dtype);
  Value x = As(b, a.at(0), ct, out.shape), l = As(b, a.at(1), ct, out.shape);
  Value inside = b.Binary("and", b.Compare("GE", x, b.Unary("negate", l)), b.Compare("LE", x, l));
  return One(b.Convert(b.Select(inside, Like(b, x, 0), x), out.dtype));
}

// softshrink(x, lambd): x - lambd above lambd, x + lambd below -lambd, else x * 0.
std::vector<Value> Softshrink(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  ElementType ct = ComputeType(out.dtype);
  Value x = As(b, a.at(0), ct, out.shape), l = As(b, a.at(1), ct, out.shape);
  Value r = b.Binary("multiply", x, Like(b, x, 0));
  r = b.Select(b.Compare("LT", x, b.Unary("negate", l)), b.Binary("add", x, l), r);
  r = b.Select(b.Compare("GT", x, l), b.Binary("subtract", x, l), r);
  return One(b.Convert(r, out.dtype));
}

// threshold(x, threshold, value): value where x <= threshold, else x.
std::vector<Value> Threshold(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  ElementType ct = ComputeType(out.dtype);
  Value x = As(b, a.at(0), ct, out.shape);
  Value t = As(b, a.at(1), ct, out.shape), v = As(b, a.at(2), ct, out.shape);
  return One(b.Convert(b.Select(b.Compare("LE", x, t), v, x), out.dtype));
}

// |input - target| of the broadcast operands, in the compute type.
Value AbsDiff(Context& c, const std::vector<Arg>& a, ElementType ct) {
  Builder& b = c.b;
  auto shape = BroadcastShapes(a.at(0).tensor.shape(), a.at(1).tensor.shape());
  return b.Unary("abs", b.Binary("subtract", As(b, a[0], ct, shape), As(b, a[1], ct, shape)));
}

// huber_loss(input, target, reduction, delta): 0.5 z^2 below delta, else delta (z - delta / 2).
std::vector<Value> HuberLoss(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value z = AbsDiff(c, a, ComputeType(Out(c).dtype));
  double delta = a.at(3).d;
  Value quad = b.Binary("multiply", Like(b, z, 0.5), b.Binary("multiply", z, z));
  Value lin = b.Binary("multiply", Like(b, z, delta), b.Binary("subtract", z, Like(b, z, 0.5 * delta)));
  return One(Reduced(c, a, b.Select(b.Compare("LT", z, Like(b, z, delta)), quad, lin), a.at(2).i));
}

// smooth_l1_loss(input, target, reduction, beta): 0.5 z^2 / beta below beta, else z - beta / 2.
std::vector<Value> SmoothL1Loss(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value z = AbsDiff(c, a, ComputeType(Out(c).dtype));
  double beta = a.at(3).d;
  Value l = z;
  if (beta != 0) {
    Value quad = b.Binary("divide", b.Binary("multiply", Like(b, z, 0.5), b.Binary("multiply", z, z)),
                          Like(b, z, beta));
    l = b.Select(b.Compare("LT", z, Like(b, z, beta)), quad, b.Binary("subtract", z, Like(b, z, 0.5 * beta)));
  }
  return One(Reduced(c, a, l, a.at(2).i));
}

// binary_cross_entropy(input, target, weight?, reduction):
// -w (t max(log x, -100) + (1 - t) max(log(1 - x), -100)).
std::vector<Value> BinaryCrossEntropy(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  ElementType ct = ComputeType(a.at(0).tensor.dtype());
  auto shape = a[0].tensor.shape();
  Value x = As(b, a[0], ct, shape), t = As(b, a.at(1), ct, shape);
  Value floor = Like(b, x, -100);
  Value log_x = MaxMin(b, b.Unary("log", x), floor, true);
  Value log_1mx = MaxMin(b, b.Unary("log", b.Binary("subtract", Like(b, x, 1), x)), floor, true);
  Value l = b.Binary("add", b.Binary("multiply", t, log_x),
                     b.Binary("multiply", b.Binary("subtract", Like(b, t, 1), t), log_1mx));
  l = b.Unary("negate", l);
  if (a.at(2).kind == Arg::Kind::Tensor) l = b.Binary("multiply", l, As(b, a[2], ct, shape));
  return One(Reduced(c, a, l, a.at(3).i));
}

// A loss's backward (grad_output, self, target, ...): `local`, the derivative
// of each element's loss by its input, times grad_output, divided by the
// real element count under a mean, converted to the output.
Value LossGradient(Context& c, const std::vector<Arg>& a, Value local, int64_t reduction) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  Value g = b.Binary("multiply", local, As(b, a.at(0), local.dtype(), out.shape));
  if (reduction == 1) {
    Value n = BroadcastCount(b, a.at(1).tensor, a.at(2).tensor, out.shape, local.dtype());
    g = b.Binary("divide", g, b.BroadcastInDim(n, out.shape, {}));
  }
  return b.Convert(g, out.dtype);
}

// self - target at the gradient's shape, in the compute type.
Value Difference(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  ElementType ct = ComputeType(out.dtype);
  return b.Binary("subtract", As(b, a.at(1), ct, out.shape), As(b, a.at(2), ct, out.shape));
}

// huber_loss_backward(grad_output, self, target, reduction, delta): the
// difference clamped to [-delta, delta].
std::vector<Value> HuberLossBackward(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value x = Difference(c, a);
  Value delta = Like(b, x, a.at(4).d);
  Value local = b.Select(b.Compare("LE", x, b.Unary("negate", delta)), b.Unary("negate", delta),
                         b.Select(b.Compare("GE", x, delta), delta, x));
  return One(LossGradient(c, a, local, a.at(3).i));
}

// smooth_l1_loss_backward(grad_output, self, target, reduction, beta):
// difference / beta inside (-beta, beta), else its sign (beta <= 0: the sign).
std::vector<Value> SmoothL1LossBackward(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value x = Difference(c, a);
  const double beta = a.at(4).d;
  Value local = b.Unary("sign", x);
  if (beta > 0) {
    Value inside = b.Binary("and", b.Compare("GT", x, Like(b, x, -beta)), b.Compare("LT", x, Like(b, x, beta)));
    local = b.Select(inside, b.Binary("divide", x, Like(b, x, beta)), local);
  }
  return One(LossGradient(c, a, local, a.at(3).i));
}

// binary_cross_entropy_backward(grad_output, self, target, weight?, reduction):
// w (x - t) / max((1 - x) x, 1e-12), as ATen's CPU kernel.
std::vector<Value> BinaryCrossEntropyBackward(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  Value x = As(b, a.at(1), ComputeType(out.dtype), out.shape);
  Value denom = b.Binary("maximum", b.Binary("multiply", b.Binary("subtract", Like(b, x, 1), x), x), Like(b, x, 1e-12));
  Value local = b.Binary("divide", Difference(c, a), denom);
  if (a.at(3).kind == Arg::Kind::Tensor) local = b.Binary("multiply", local, As(b, a[3], x.dtype(), out.shape));
  return One(LossGradient(c, a, local, a.at(4).i));
}

const bool registered = [] {
  Register("hardshrink", Hardshrink).DynamicElementwise();
  Register("softshrink", Softshrink).DynamicElementwise();
  Register("threshold", Threshold).DynamicElementwise();
  Register("huber_loss", HuberLoss).Dynamic();
  Register("smooth_l1_loss", SmoothL1Loss).Dynamic();
  Register("binary_cross_entropy", BinaryCrossEntropy).Dynamic();
  Register("huber_loss_backward", HuberLossBackward, {"huber_loss_backward.out"}).Dynamic();
  Register("smooth_l1_loss_backward", SmoothL1LossBackward, {"smooth_l1_loss_backward.grad_input"}).Dynamic();
  Register("binary_cross_entropy_backward", BinaryCrossEntropyBackward, {"binary_cross_entropy_backward.grad_input"}).Dynamic();
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
