// Weight normalization (torch.nn.utils.weight_norm and
// parametrizations.weight_norm, e.g. Wav2Vec2's positional convolution):
//
// - _weight_norm_interface(v, g, dim) -> (w, norms): norms = ||v|| over
//   every dim but `dim`, w = v * (g / norms), as ATen's kernel;
// - _weight_norm_interface_backward(grad_w, saved_v, saved_g, saved_norms,
//   dim) -> (grad_v, grad_g).
// Norms and products are computed in the compute type (f32 for 16-bit floats).
#include <string>
#include <vector>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

struct WeightNormParts {
  int64_t dim, k;
  std::vector<int64_t> others;  // reduced dims
  ElementType ct;
};
WeightNormParts WeightNormSetup(const Value& v, int64_t dim_arg, ElementType out_dtype,
                                const char* op) {
  if (v.rank() == 0) throw Unsupported(std::string(op) + " of a 0-d tensor");
  WeightNormParts p;
  p.dim = WrapDim(dim_arg, v.rank());
  p.k = v.shape()[p.dim];
  for (int64_t d = 0; d < v.rank(); ++d)
    if (d != p.dim) p.others.push_back(d);
  p.ct = ComputeType(out_dtype);
  return p;
}
Value SumOthers(Builder& b, Value x, const WeightNormParts& p) {
  return p.others.empty() ? x : b.Reduce(x, b.Constant(p.ct, 0), p.others, "add");
}
Value AlongDim(Builder& b, Value perdim, const Value& like, const WeightNormParts& p) {
  return b.BroadcastInDim(b.Reshape(perdim, {p.k}), like.shape(), {p.dim});
}

std::vector<Value> WeightNormRule(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = c.outputs.at(0);
  Value v = a.at(0).tensor;
  WeightNormParts p = WeightNormSetup(v, a.at(2).i, out.dtype, "_weight_norm_interface");
  Value vf = b.Convert(v, p.ct);
  Value norm = b.Unary("sqrt", SumOthers(b, b.Binary("multiply", vf, vf), p));  // [k]
  Value g = b.Reshape(b.Convert(a.at(1).tensor, p.ct), {p.k});
  Value w = b.Binary("multiply", vf, AlongDim(b, b.Binary("divide", g, norm), vf, p));
  const TensorType& norms = c.outputs.at(1);
  return {b.Convert(w, out.dtype), b.Convert(b.Reshape(norm, norms.shape), norms.dtype)};
}

// _weight_norm_interface_backward(grad_w, saved_v, saved_g, saved_norms, dim)
//   -> (grad_v, grad_g): grad_g = sum(grad_w * v) / norms,
//   grad_v = (g / norms) * (grad_w - v * (grad_g / norms)).
std::vector<Value> WeightNormBackwardRule(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = c.outputs.at(0);
  Value v = a.at(1).tensor;
  WeightNormParts p =
      WeightNormSetup(v, a.at(4).i, out.dtype, "_weight_norm_interface_backward");
  Value vf = b.Convert(v, p.ct);
  Value gw = b.Convert(a.at(0).tensor, p.ct);
  Value g = b.Reshape(b.Convert(a.at(2).tensor, p.ct), {p.k});
  Value norm = b.Reshape(b.Convert(a.at(3).tensor, p.ct), {p.k});
  Value grad_g = b.Binary("divide", SumOthers(b, b.Binary("multiply", gw, vf), p), norm);
  Value inner = b.Binary(
      "subtract", gw,
      b.Binary("multiply", vf, AlongDim(b, b.Binary("divide", grad_g, norm), vf, p)));
  Value grad_v = b.Binary("multiply", AlongDim(b, b.Binary("divide", g, norm), vf, p), inner);
  const TensorType& gout = c.outputs.at(1);
  return {b.Convert(grad_v, out.dtype), b.Convert(b.Reshape(grad_g, gout.shape), gout.dtype)};
}

const bool registered = [] {
  Register("_weight_norm_interface", WeightNormRule);
  Register("_weight_norm_interface_backward", WeightNormBackwardRule);
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
