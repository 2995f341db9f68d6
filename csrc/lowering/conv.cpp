// Convolutions: `convolution` (1d/2d/3d, strided, padded, dilated, grouped,
// transposed) and `convolution_backward`, all as stablehlo.convolution.
// 16-bit floats accumulate in f32 (the op's result type is f32); f32 asks for
// HIGHEST precision when torch.get_float32_matmul_precision() is "highest".
//
// The backward formulas are the usual adjoints (as in JAX's conv transpose
// rules): the input gradient is a convolution of the lhs-dilated gradient
// with the flipped, in/out-swapped kernel; the weight gradient convolves the
// input (batch and feature roles swapped) with the gradient as the kernel,
// grouped by batch_group_count. A transposed convolution is the input
// gradient of the matching forward convolution, and vice versa.
#include <string>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

using K = Arg::Kind;

std::vector<int64_t> Expand(const std::vector<int64_t>& v, size_t n, int64_t dflt) {
  if (v.empty()) return std::vector<int64_t>(n, dflt);
  if (v.size() == 1) return std::vector<int64_t>(n, v[0]);
  return v;
}

// "[b, f, 0, 1]": `first` and `second` name dims 0 and 1, then n spatial dims.
std::string Spec(const char* first, const char* second, int64_t n) {
  std::string s = std::string("[") + first + ", " + second;
  for (int64_t i = 0; i < n; ++i) s += ", " + std::to_string(i);
  return s + "]";
}

struct Geometry {
  int64_t n = 0;  // spatial dims
  std::vector<int64_t> stride, padding, dilation, output_padding;
  int64_t groups = 1;
};

// The accumulation type of a convolution of `t` inputs.
ElementType AccType(ElementType t) { return ComputeType(t); }

// One stablehlo.convolution; `out` is the result shape (known from meta or
// from the caller's geometry), the result type AccType(lhs).
Value Conv(Context& c, Value lhs, Value rhs, const std::string& lhs_spec,
           const std::string& rhs_spec, const std::string& out_spec,
           const std::vector<int64_t>& out, const std::vector<int64_t>& window_strides,
           const std::vector<int64_t>& pad_lo, const std::vector<int64_t>& pad_hi,
           const std::vector<int64_t>& lhs_dilation, const std::vector<int64_t>& rhs_dilation,
           int64_t feature_groups, int64_t batch_groups) {
  ElementType et = lhs.dtype();
  hlo::Builder::ConvGeometry g;
  g.lhs_spec = lhs_spec;
  g.rhs_spec = rhs_spec;
  g.out_spec = out_spec;
  g.window_strides = window_strides;
  g.pad_lo = pad_lo;
  g.pad_hi = pad_hi;
  g.lhs_dilation = lhs_dilation;
  g.rhs_dilation = rhs_dilation;
  g.feature_groups = feature_groups;
  g.batch_groups = batch_groups;
  g.highest_precision = et == ElementType::F32 && c.fp32_highest;
  return c.b.Convolution(lhs, rhs, TensorType{AccType(et), out}, g);
}

int64_t Dilated(int64_t size, int64_t dilation) {
  return size == 0 ? 0 : 1 + dilation * (size - 1);
}

bool AnyEmpty(const std::vector<Value>& vs) {
  for (const auto& v : vs)
    if (v.type.numel() == 0) return true;
  return false;
}

// y = conv(x, w): x [N, G*I, ...], w [G*O, I, k...] -> `out` shape.
Value ConvForward(Context& c, Value x, Value w, const Geometry& g,
                  const std::vector<int64_t>& out) {
  ElementType acc = AccType(x.dtype());
  if (AnyEmpty({x, w}) || TensorType{acc, out}.numel() == 0) return c.b.Splat(acc, 0, out);
  std::vector<int64_t> ones(g.n, 1);
  // High padding that gives exactly `out`: at most g.padding (trailing padding
  // no window reaches is dropped; same result). For the input gradient of a
  // transposed convolution whose output_padding is >= stride (allowed when
  // dilation > stride) it is negative: x's unreachable tail is sliced off.
  std::vector<int64_t> hi, limit(x.shape());
  bool crop = false;
  for (int64_t i = 0; i < g.n; ++i) {
    int64_t h = (out[2 + i] - 1) * g.stride[i] + Dilated(w.shape()[2 + i], g.dilation[i]) -
                x.shape()[2 + i] - g.padding[i];
    if (h < 0) {
      limit[2 + i] += h;
      crop = true;
      h = 0;
    }
    hi.push_back(h);
  }
  if (crop) x = c.b.Slice(x, std::vector<int64_t>(x.rank(), 0), limit, std::vector<int64_t>(x.rank(), 1));
  return Conv(c, x, w, Spec("b", "f", g.n), Spec("o", "i", g.n), Spec("b", "f", g.n), out,
              g.stride, g.padding, hi, ones, g.dilation, g.groups, 1);
}

// The gradient of ConvForward with respect to x, of shape `in`: also the
// transposed convolution of `gy` with `w`.
Value ConvInputGrad(Context& c, Value gy, Value w, const Geometry& g,
                    const std::vector<int64_t>& in) {
  Builder& b = c.b;
  ElementType acc = AccType(gy.dtype());
  if (AnyEmpty({gy, w}) || TensorType{acc, in}.numel() == 0) return b.Splat(acc, 0, in);
  // w [G*O, I, k...] -> [G*I, O, k...], spatially flipped.
  int64_t go = w.shape()[0], ig = w.shape()[1], og = go / g.groups;
  std::vector<int64_t> k(w.shape().begin() + 2, w.shape().end());
  std::vector<int64_t> split{g.groups, og, ig};
  split.insert(split.end(), k.begin(), k.end());
  std::vector<int64_t> perm{0, 2, 1}, flip;
  for (int64_t i = 0; i < g.n; ++i) {
    perm.push_back(3 + i);
    flip.push_back(2 + i);
  }
  std::vector<int64_t> merged{g.groups * ig, og};
  merged.insert(merged.end(), k.begin(), k.end());
  Value wt = b.Reshape(b.Transpose(b.Reshape(w, split), perm), merged);
  wt = b.Reverse(wt, flip);
  std::vector<int64_t> lo, hi, ones(g.n, 1);
  for (int64_t i = 0; i < g.n; ++i) {
    int64_t dk = Dilated(k[i], g.dilation[i]);
    int64_t out_dil = Dilated(gy.shape()[2 + i], g.stride[i]);
    int64_t before = dk - 1 - g.padding[i];
    lo.push_back(before);
    hi.push_back(in[2 + i] + dk - 1 - out_dil - before);
  }
  return Conv(c, gy, wt, Spec("b", "f", g.n), Spec("o", "i", g.n), Spec("b", "f", g.n), in,
              ones, lo, hi, g.stride, g.dilation, g.groups, 1);
}

// The gradient of ConvForward(x, w) with respect to w (shape `wshape`).
Value ConvWeightGrad(Context& c, Value x, Value gy, const Geometry& g,
                     const std::vector<int64_t>& wshape) {
  ElementType acc = AccType(x.dtype());
  if (AnyEmpty({x, gy}) || TensorType{acc, wshape}.numel() == 0)
    return c.b.Splat(acc, 0, wshape);
  std::vector<int64_t> lo, hi, ones(g.n, 1);
  for (int64_t i = 0; i < g.n; ++i) {
    int64_t in = x.shape()[2 + i];
    int64_t dk = Dilated(wshape[2 + i], g.dilation[i]);
    int64_t out_dil = Dilated(gy.shape()[2 + i], g.stride[i]);
    lo.push_back(g.padding[i]);
    hi.push_back(out_dil - in + dk - g.padding[i] - 1);
  }
  // lhs: x with batch/feature roles swapped; rhs: gy (in = N, out = G*O);
  // result [G*O, I, k...] = weight layout.
  return Conv(c, x, gy, Spec("f", "b", g.n), Spec("i", "o", g.n), Spec("f", "b", g.n), wshape,
              g.dilation, lo, hi, ones, g.stride, 1, g.groups);
}

Geometry ReadGeometry(const std::vector<Arg>& a, size_t stride_arg, int64_t n,
                      size_t output_padding_arg, size_t groups_arg) {
  Geometry g;
  g.n = n;
  g.stride = Expand(a.at(stride_arg).ints, n, 1);
  g.padding = Expand(a.at(stride_arg + 1).ints, n, 0);
  g.dilation = Expand(a.at(stride_arg + 2).ints, n, 1);
  g.output_padding = Expand(a.at(output_padding_arg).ints, n, 0);
  g.groups = a.at(groups_arg).i;
  return g;
}

// The forward convolution's output size along spatial dim i for an input of size `in`.
int64_t ForwardSize(const Geometry& g, int64_t i, int64_t in, int64_t k) {
  return (in + 2 * g.padding[i] - Dilated(k, g.dilation[i])) / g.stride[i] + 1;
}

// The gradient `gy` (zeros past its real elements) cut or zero-padded to the
// forward convolution's output at the spatial sizes of `x` (bucket sizes:
// the gradient's bucket may be larger or smaller than the bucket's output).
Value FitGradient(Builder& b, Value gy, const Value& x, const Value& w, const Geometry& g) {
  std::vector<int64_t> fit = gy.shape();
  for (int64_t i = 0; i < g.n; ++i) fit[2 + i] = ForwardSize(g, i, x.shape()[2 + i], w.shape()[2 + i]);
  if (fit == gy.shape()) return gy;
  std::vector<int64_t> zeros(gy.rank(), 0), cut(gy.rank()), grow(gy.rank(), 0), ones(gy.rank(), 1);
  for (int64_t d = 0; d < gy.rank(); ++d) {
    cut[d] = std::min(fit[d], gy.shape()[d]);
    grow[d] = fit[d] - cut[d];
  }
  gy = b.Slice(gy, zeros, cut, ones);
  return b.Pad(gy, b.Constant(gy.dtype(), 0), zeros, grow, zeros);
}

void CheckTypes(const Value& x, const Value& w) {
  if (!hlo::IsFloat(x.dtype()) || x.dtype() != w.dtype())
    throw Unsupported("convolution of non-float or mixed-dtype tensors");
  if (x.rank() != w.rank() || x.rank() < 3)
    throw Unsupported("convolution of unbatched or mismatched-rank tensors");
}

// convolution(input, weight, bias?, stride, padding, dilation, transposed,
//   output_padding, groups)
std::vector<Value> Convolution(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = c.outputs.at(0);
  // Dynamic spatial dims: the convolution runs static at the bucket on the
  // input's zero-filled padding (its real output elements are the exact ones).
  Value x = StaticFilled(b, a.at(0).tensor, 0), w = a.at(1).tensor;
  CheckTypes(x, w);
  int64_t n = w.rank() - 2;
  Geometry g = ReadGeometry(a, 3, n, 7, 8);
  bool transposed = a.at(6).i != 0;
  Value y = transposed ? ConvInputGrad(c, x, w, g, out.shape) : ConvForward(c, x, w, g, out.shape);
  if (a.at(2).kind == K::Tensor && out.numel() != 0) {
    Value bias = b.Convert(a[2].tensor, y.dtype());
    y = b.Binary("add", y, b.BroadcastInDim(bias, out.shape, {1}));
  }
  return {b.Convert(y, out.dtype)};
}

// convolution_backward(grad_output, input, weight, bias_sizes?, stride,
//   padding, dilation, transposed, output_padding, groups, output_mask)
//   -> (grad_input, grad_weight, grad_bias)
std::vector<Value> ConvolutionBackward(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  // Dynamic dims: static at the buckets, zeros past the real elements (as
  // the forward); the forward's output at the input's bucket may differ
  // from the gradient's bucket.
  const bool dynamic = a.at(0).tensor.type.is_dynamic() || a.at(1).tensor.type.is_dynamic();
  Value gy = StaticFilled(b, a.at(0).tensor, 0), x = StaticFilled(b, a.at(1).tensor, 0), w = a.at(2).tensor;
  CheckTypes(x, w);
  if (gy.dtype() != x.dtype()) throw Unsupported("convolution_backward of mixed dtypes");
  int64_t n = w.rank() - 2;
  Geometry g = ReadGeometry(a, 4, n, 8, 9);
  bool transposed = a.at(7).i != 0;
  if (dynamic && transposed) x = FitGradient(b, x, gy, w, g);  // x is the forward's output here
  else if (dynamic) gy = FitGradient(b, gy, x, w, g);
  std::vector<int64_t> mask = a.at(10).ints;
  mask.resize(3, 1);
  // The dispatcher lists only the defined results (all three when it
  // cannot tell): compute those, in order.
  bool all = c.outputs.size() == 3;
  std::vector<Value> results;
  if (all || mask[0]) {
    Value gi = transposed ? ConvForward(c, gy, w, g, x.shape()) : ConvInputGrad(c, gy, w, g, x.shape());
    results.push_back(b.Convert(gi, x.dtype()));
  }
  if (all || mask[1]) {
    Value gw = transposed ? ConvWeightGrad(c, gy, x, g, w.shape())
                          : ConvWeightGrad(c, x, gy, g, w.shape());
    results.push_back(b.Convert(gw, w.dtype()));
  }
  if (all || mask[2]) {
    ElementType ct = ComputeType(gy.dtype());
    std::vector<int64_t> dims{0};
    for (int64_t i = 2; i < gy.rank(); ++i) dims.push_back(i);
    Value gb = b.Reduce(b.Convert(gy, ct), b.Constant(ct, 0), dims, "add");
    std::vector<int64_t> bshape = c.outputs.at(results.size()).shape;
    results.push_back(b.Reshape(b.Convert(gb, c.outputs.at(results.size()).dtype), bshape));
  }
  for (size_t i = 0; i < results.size() && i < c.outputs.size(); ++i)
    results[i] = b.Convert(results[i], c.outputs[i].dtype);
  return results;
}

const bool registered = [] {
  // Bounded dynamic shapes: batch and spatial dims (a new image size runs
  // static at its bucket on zero-filled padding); channels and weights static.
  Register("convolution", Convolution).Dynamic([](const std::vector<Arg>&, StaticDims& s) {
    s.Dim(0, 1);  // (input, weight, bias?, ...)
    s.All(1);
    s.All(2);
    s.Because("a convolution's channel dims are static");
  }).dynamic.stepped_outputs = true;
  Register("convolution_backward", ConvolutionBackward).Dynamic([](const std::vector<Arg>&, StaticDims& s) {
    s.Dim(0, 1);  // (grad_output, input, weight, ...)
    s.Dim(1, 1);
    s.All(2);
    s.Because("a convolution's channel dims are static");
  }).dynamic.stepped_outputs = true;
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
