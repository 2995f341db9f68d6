// The two ops of torch.amp.GradScaler, registered on the mutating ops (they
// return one value per mutated tensor, in schema order):
//
// - _amp_foreach_non_finite_check_and_unscale_(grads[], found_inf, inv_scale):
//   every grad becomes grad * inv_scale (in the compute type, rounded once,
//   as the CPU and CUDA kernels do), and found_inf becomes 1.0 if any element
//   of any grad is inf or NaN (otherwise it keeps its value). One module for
//   the whole list; nothing is read back to the host.
// - _amp_update_scale_(scale, growth_tracker, found_inf, growth_factor,
//   backoff_factor, growth_interval): on found_inf the scale backs off and
//   the tracker resets; otherwise the tracker counts up and, at
//   growth_interval, the scale grows (if the grown scale is finite) and the
//   tracker resets. Device-side selects: no host sync.
#include <limits>
#include <string>
#include <vector>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

using K = Arg::Kind;

// A rank-0 bool: some element of `x` is inf or NaN (|x| < inf fails).
Value AnyNonFinite(Builder& b, Value x) {
  if (!hlo::IsFloat(x.dtype())) return b.ConstantInt(ElementType::Bool, 0);
  Value inf = b.Splat(x.dtype(), std::numeric_limits<double>::infinity(), x.shape());
  Value finite = b.Compare("LT", b.Unary("abs", x), inf);
  Value non_finite = b.Unary("not", finite);
  std::vector<int64_t> all;
  for (int64_t d = 0; d < x.rank(); ++d) all.push_back(d);
  return b.Reduce(non_finite, b.ConstantInt(ElementType::Bool, 0), all, "or");
}

// found_inf (any shape with one element) as a rank-0 f32 value.
Value Scalar0(Builder& b, Value x, ElementType t) {
  if (x.type.numel() != 1) throw Unsupported("GradScaler state that is not a one-element tensor");
  return b.Convert(b.Reshape(x, {}), t);
}

std::vector<Value> NonFiniteCheckAndUnscale(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  if (a.at(0).kind != K::TensorList) throw std::logic_error("_amp_foreach: expected a list");
  Value found_in = a.at(1).tensor, inv_scale_in = a.at(2).tensor;
  if (!hlo::IsFloat(found_in.dtype()) || !hlo::IsFloat(inv_scale_in.dtype()))
    throw Unsupported("_amp_foreach_non_finite_check_and_unscale_: non-float found_inf/inv_scale");
  Value inv_scale = Scalar0(b, inv_scale_in, ElementType::F32);
  std::vector<Value> out;
  Value any = b.ConstantInt(ElementType::Bool, 0);
  for (const Value& g : a[0].tensors) {
    if (!g.valid()) throw Unsupported("_amp_foreach_non_finite_check_and_unscale_: None grad");
    if (!hlo::IsFloat(g.dtype()))
      throw Unsupported("_amp_foreach_non_finite_check_and_unscale_ of a non-float grad");
    ElementType ct = ComputeType(g.dtype());
    Value x = b.Convert(g, ct);
    any = b.Binary("or", any, AnyNonFinite(b, x));
    Value s = b.BroadcastInDim(b.Convert(inv_scale, ct), x.shape(), {});
    out.push_back(b.Convert(b.Binary("multiply", x, s), g.dtype()));
  }
  Value found = b.Reshape(found_in, {});
  Value one = b.Constant(found.dtype(), 1);
  out.push_back(b.Reshape(b.Select(any, one, found), found_in.shape()));
  return out;
}

double Float(const Arg& a) { return a.kind == K::Int ? static_cast<double>(a.i) : a.d; }

std::vector<Value> UpdateScale(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value scale_in = a.at(0).tensor, tracker_in = a.at(1).tensor, found_in = a.at(2).tensor;
  if (!hlo::IsFloat(scale_in.dtype()) || !hlo::IsInteger(tracker_in.dtype()))
    throw Unsupported("_amp_update_scale_: expected a float scale and an integer growth tracker");
  ElementType st = scale_in.dtype(), tt = tracker_in.dtype();
  Value scale = Scalar0(b, scale_in, st);
  Value tracker = Scalar0(b, tracker_in, tt);
  Value found = b.Compare("NE", Scalar0(b, found_in, ElementType::F32),
                         b.Constant(ElementType::F32, 0));
  Value growth = b.Constant(st, Float(a.at(3)));
  Value backoff = b.Constant(st, Float(a.at(4)));
  Value interval = b.ConstantInt(tt, a.at(5).i);
  Value zero = b.ConstantInt(tt, 0);
  Value successful = b.Binary("add", tracker, b.ConstantInt(tt, 1));
  Value at_interval = b.Compare("EQ", successful, interval);
  Value grown = b.Binary("multiply", scale, growth);
  Value grown_finite = b.Compare("LT", b.Unary("abs", grown),
                                 b.Constant(st, std::numeric_limits<double>::infinity()));
  Value kept = b.Select(b.Binary("and", at_interval, grown_finite), grown, scale);
  Value new_scale = b.Select(found, b.Binary("multiply", scale, backoff), kept);
  Value new_tracker = b.Select(found, zero, b.Select(at_interval, zero, successful));
  return {b.Reshape(new_scale, scale_in.shape()), b.Reshape(new_tracker, tracker_in.shape())};
}

const bool registered = [] {
  Register("_amp_foreach_non_finite_check_and_unscale_", NonFiniteCheckAndUnscale);
  Register("_amp_update_scale_", UpdateScale);
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
