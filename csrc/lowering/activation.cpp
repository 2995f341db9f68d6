// Activation rules (forward and backward) and dropout. Each computes in the
// compute type of its output (f32 for 16-bit floats) with the formulas of
// PyTorch's CPU kernels, then converts back.
#include <cmath>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

using K = Arg::Kind;

// The op's first output, its compute type, and helpers bound to them.
struct Ew {
  Context& c;
  Builder& b;
  TensorType out;
  ElementType ct;
  explicit Ew(Context& ctx, size_t i = 0)
      : c(ctx), b(ctx.b), out(ctx.outputs.at(i)), ct(ComputeType(out.dtype)) {}
  Value In(const Arg& a) const { return As(b, a, ct, out.shape); }
  Value K_(double v) const { return b.Splat(ct, v, out.shape); }
  Value Add(Value x, Value y) const { return b.Binary("add", x, y); }
  Value Sub(Value x, Value y) const { return b.Binary("subtract", x, y); }
  Value Mul(Value x, Value y) const { return b.Binary("multiply", x, y); }
  Value Div(Value x, Value y) const { return b.Binary("divide", x, y); }
  Value Lt(Value x, Value y) const { return b.Compare("LT", x, y); }
  Value Le(Value x, Value y) const { return b.Compare("LE", x, y); }
  Value Gt(Value x, Value y) const { return b.Compare("GT", x, y); }
  Value Ge(Value x, Value y) const { return b.Compare("GE", x, y); }
  Value Sel(Value p, Value x, Value y) const { return b.Select(p, x, y); }
  // min(max(x, lo), hi) with NaN passing through.
  Value Clip(Value x, double lo, double hi) const {
    Value r = Sel(Lt(x, K_(lo)), K_(lo), x);
    return Sel(Gt(r, K_(hi)), K_(hi), r);
  }
  Value Exp(Value x) const { return b.Unary("exponential", x); }
  Value Log1p(Value x) const { return b.Unary("log_plus_one", x); }
  Value Tanh(Value x) const { return b.Unary("tanh", x); }
  // 1 / (1 + exp(-x)), as ATen's CPU kernels.
  Value Sigmoid(Value x) const {
    return Div(K_(1), Add(K_(1), Exp(b.Unary("negate", x))));
  }
  std::vector<Value> Ret(Value r) const { return {b.Convert(r, out.dtype)}; }
};

void RequireFloat(const TensorType& t, const char* op) {
  if (!hlo::IsFloat(t.dtype)) throw Unsupported(std::string(op) + " on a non-float tensor");
}

Value Gelu(const Ew& e, Value x, const std::string& approximate) {
  if (approximate == "tanh") {
    const double beta = M_SQRT2 * M_2_SQRTPI * 0.5, kappa = 0.044715;
    Value cube = e.Mul(e.Mul(x, x), x);
    Value inner = e.Mul(e.K_(beta), e.Add(x, e.Mul(e.K_(kappa), cube)));
    return e.Mul(e.Mul(e.K_(0.5), x), e.Add(e.K_(1), e.Tanh(inner)));
  }
  Value erf = e.b.Chlo("erf", {e.Mul(x, e.K_(M_SQRT1_2))});
  return e.Mul(e.Mul(x, e.K_(0.5)), e.Add(e.K_(1), erf));
}

Value GeluBackward(const Ew& e, Value dy, Value x, const std::string& approximate) {
  if (approximate == "tanh") {
    const double beta = M_SQRT2 * M_2_SQRTPI * 0.5, kappa = 0.044715;
    Value x_sq = e.Mul(x, x);
    Value x_cube = e.Mul(x_sq, x);
    Value inner = e.Mul(e.K_(beta), e.Add(x, e.Mul(e.K_(kappa), x_cube)));
    Value t = e.Tanh(inner);
    Value left = e.Mul(e.K_(0.5), x);
    Value right = e.Add(e.K_(1), t);
    Value left_d = e.Mul(e.K_(0.5), right);
    Value tanh_d = e.Sub(e.K_(1), e.Mul(t, t));
    Value inner_d = e.Mul(e.K_(beta), e.Add(e.K_(1), e.Mul(e.K_(3 * kappa), x_sq)));
    Value right_d = e.Mul(tanh_d, inner_d);
    return e.Mul(dy, e.Add(left_d, e.Mul(left, right_d)));
  }
  const double alpha = M_2_SQRTPI * M_SQRT1_2 * 0.5;  // 1 / sqrt(2 pi)
  Value cdf = e.Mul(e.K_(0.5),
                    e.Add(e.K_(1), e.b.Chlo("erf", {e.Mul(x, e.K_(M_SQRT1_2))})));
  Value pdf = e.Mul(e.Exp(e.Mul(e.K_(-0.5), e.Mul(x, x))), e.K_(alpha));
  return e.Mul(dy, e.Add(cdf, e.Mul(x, pdf)));
}

std::string StringArg(const std::vector<Arg>& a, size_t i, const std::string& fallback) {
  return i < a.size() && a[i].kind == K::String ? a[i].s : fallback;
}

// glu's halves of x (compute type) along dim: the first half and the
// sigmoid of the second.
struct Glu {
  Value first, sigmoid;
  int64_t dim;
};
Glu GluHalves(Builder& b, Value x, int64_t dim_arg) {
  int64_t dim = WrapDim(dim_arg, x.rank());
  int64_t half = x.shape()[dim] / 2;
  std::vector<int64_t> start(x.rank(), 0), limit = x.shape(), strides(x.rank(), 1);
  limit[dim] = half;
  Value first = b.Slice(x, start, limit, strides);
  start[dim] = half;
  limit[dim] = 2 * half;
  Value second = b.Slice(x, start, limit, strides);
  Value one = b.Splat(x.dtype(), 1, first.shape());
  Value s = b.Binary("divide", one,
                     b.Binary("add", one, b.Unary("exponential", b.Unary("negate", second))));
  return {first, s, dim};
}

const bool registered = [] {
  // gelu(self, *, approximate="none")
  Register("gelu", [](Context& c, const std::vector<Arg>& a) {
    Ew e(c);
    RequireFloat(e.out, "gelu");
    std::string approx = StringArg(a, 1, "none");
    if (approx != "none" && approx != "tanh")
      throw std::invalid_argument("approximate argument must be either none or tanh.");
    return e.Ret(Gelu(e, e.In(a[0]), approx));
  }).DynamicElementwise();
  // gelu_backward(grad_output, self, *, approximate="none")
  Register("gelu_backward", [](Context& c, const std::vector<Arg>& a) {
    Ew e(c);
    RequireFloat(e.out, "gelu_backward");
    std::string approx = StringArg(a, 2, "none");
    if (approx != "none" && approx != "tanh")
      throw std::invalid_argument("approximate argument must be either none or tanh.");
    return e.Ret(GeluBackward(e, e.In(a[0]), e.In(a[1]), approx));
  }).DynamicElementwise();
  // silu_backward(grad_output, self)
  Register("silu_backward", [](Context& c, const std::vector<Arg>& a) {
    Ew e(c);
    Value dy = e.In(a[0]), x = e.In(a[1]);
    Value s = e.Sigmoid(x);
    return e.Ret(e.Mul(e.Mul(dy, s), e.Add(e.K_(1), e.Mul(x, e.Sub(e.K_(1), s)))));
  }).DynamicElementwise();
  // mish(self) = x * tanh(log1p(exp(x)))
  Register("mish", [](Context& c, const std::vector<Arg>& a) {
    Ew e(c);
    Value x = e.In(a[0]);
    return e.Ret(e.Mul(x, e.Tanh(e.Log1p(e.Exp(x)))));
  }).DynamicElementwise();
  Register("mish_backward", [](Context& c, const std::vector<Arg>& a) {
    Ew e(c);
    Value dy = e.In(a[0]), x = e.In(a[1]);
    Value s = e.Sigmoid(x);
    Value t = e.Tanh(e.Log1p(e.Exp(x)));
    return e.Ret(e.Mul(dy, e.Add(t, e.Mul(e.Mul(x, s), e.Sub(e.K_(1), e.Mul(t, t))))));
  }).DynamicElementwise();
  // softplus(self, beta, threshold): x*beta > threshold ? x : log1p(exp(x*beta)) / beta
  Register("softplus", [](Context& c, const std::vector<Arg>& a) {
    Ew e(c);
    Value x = e.In(a[0]), beta = e.In(a[1]), th = e.In(a[2]);
    Value xb = e.Mul(x, beta);
    return e.Ret(e.Sel(e.Gt(xb, th), x, e.Div(e.Log1p(e.Exp(xb)), beta)));
  }).DynamicElementwise();
  // softplus_backward(grad_output, self, beta, threshold)
  Register("softplus_backward", [](Context& c, const std::vector<Arg>& a) {
    Ew e(c);
    Value dy = e.In(a[0]), x = e.In(a[1]), beta = e.In(a[2]), th = e.In(a[3]);
    Value xb = e.Mul(x, beta);
    Value z = e.Exp(xb);
    return e.Ret(e.Sel(e.Gt(xb, th), dy, e.Div(e.Mul(dy, z), e.Add(z, e.K_(1)))));
  }).DynamicElementwise();
  // elu(self, alpha, scale, input_scale):
  //   x <= 0 ? expm1(x * input_scale) * alpha * scale : x * scale
  Register("elu", [](Context& c, const std::vector<Arg>& a) {
    Ew e(c);
    RequireFloat(e.out, "elu");
    Value x = e.In(a[0]), alpha = e.In(a[1]), scale = e.In(a[2]), iscale = e.In(a[3]);
    Value neg = e.Mul(e.b.Unary("exponential_minus_one", e.Mul(x, iscale)), e.Mul(alpha, scale));
    return e.Ret(e.Sel(e.Le(x, e.K_(0)), neg, e.Mul(x, scale)));
  }).DynamicElementwise();
  // elu_backward(grad_output, alpha, scale, input_scale, is_result, self_or_result)
  Register("elu_backward", [](Context& c, const std::vector<Arg>& a) {
    Ew e(c);
    RequireFloat(e.out, "elu_backward");
    Value dy = e.In(a[0]), alpha = e.In(a[1]), scale = e.In(a[2]), iscale = e.In(a[3]);
    bool is_result = a.at(4).i != 0;
    Value x = e.In(a[5]);
    Value negcoef = e.Mul(alpha, scale);
    Value neg = is_result ? e.Mul(e.Mul(dy, iscale), e.Add(x, negcoef))
                          : e.Mul(e.Mul(e.Mul(dy, iscale), negcoef), e.Exp(e.Mul(x, iscale)));
    return e.Ret(e.Sel(e.Le(x, e.K_(0)), neg, e.Mul(dy, scale)));
  }).DynamicElementwise();
  // leaky_relu(self, negative_slope)
  Register("leaky_relu", [](Context& c, const std::vector<Arg>& a) {
    Ew e(c);
    RequireFloat(e.out, "leaky_relu");
    Value x = e.In(a[0]), slope = e.In(a[1]);
    return e.Ret(e.Sel(e.Gt(x, e.K_(0)), x, e.Mul(x, slope)));
  }).DynamicElementwise();
  // leaky_relu_backward(grad_output, self, negative_slope, self_is_result)
  Register("leaky_relu_backward", [](Context& c, const std::vector<Arg>& a) {
    Ew e(c);
    Value dy = e.In(a[0]), x = e.In(a[1]), slope = e.In(a[2]);
    return e.Ret(e.Sel(e.Gt(x, e.K_(0)), dy, e.Mul(dy, slope)));
  }).DynamicElementwise();
  // hardswish(self) = x * min(max(x + 3, 0), 6) / 6
  Register("hardswish", [](Context& c, const std::vector<Arg>& a) {
    Ew e(c);
    Value x = e.In(a[0]);
    Value r = e.Clip(e.Add(x, e.K_(3)), 0, 6);
    return e.Ret(e.Div(e.Mul(x, r), e.K_(6)));
  }).DynamicElementwise();
  Register("hardswish_backward", [](Context& c, const std::vector<Arg>& a) {
    Ew e(c);
    Value dy = e.In(a[0]), x = e.In(a[1]);
    Value mid = e.Mul(dy, e.Add(e.Div(x, e.K_(3)), e.K_(0.5)));
    return e.Ret(e.Sel(e.Le(x, e.K_(-3)), e.K_(0), e.Sel(e.Lt(x, e.K_(3)), mid, dy)));
  }).DynamicElementwise();
  // hardsigmoid(self) = min(max(x + 3, 0), 6) / 6
  Register("hardsigmoid", [](Context& c, const std::vector<Arg>& a) {
    Ew e(c);
    Value x = e.In(a[0]);
    return e.Ret(e.Div(e.Clip(e.Add(x, e.K_(3)), 0, 6), e.K_(6)));
  }).DynamicElementwise();
  Register("hardsigmoid_backward", [](Context& c, const std::vector<Arg>& a) {
    Ew e(c);
    Value dy = e.In(a[0]), x = e.In(a[1]);
    Value inside = e.b.Binary("and", e.Gt(x, e.K_(-3)), e.Lt(x, e.K_(3)));
    return e.Ret(e.Sel(inside, e.Div(dy, e.K_(6)), e.K_(0)));
  }).DynamicElementwise();
  // hardtanh(self, min_val, max_val): a clamp (NaN propagates).
  Register("hardtanh", [](Context& c, const std::vector<Arg>& a) {
    Ew e(c);
    if (e.out.dtype == ElementType::Bool) throw Unsupported("hardtanh on bool");
    Value x = e.In(a[0]), lo = e.In(a[1]), hi = e.In(a[2]);
    Value r = e.Sel(e.Lt(x, lo), lo, x);
    r = e.Sel(e.Gt(r, hi), hi, r);
    return e.Ret(r);
  }).DynamicElementwise();
  Register("hardtanh_backward", [](Context& c, const std::vector<Arg>& a) {
    Ew e(c);
    Value dy = e.In(a[0]), x = e.In(a[1]), lo = e.In(a[2]), hi = e.In(a[3]);
    Value outside = e.b.Binary("or", e.Le(x, lo), e.Ge(x, hi));
    return e.Ret(e.Sel(outside, e.K_(0), dy));
  }).DynamicElementwise();
  // log_sigmoid_forward(self) -> (output, buffer):
  //   min(x, 0) - log1p(exp(-|x|)), buffer = exp(-|x|) (where CPU keeps one)
  Register("log_sigmoid_forward", [](Context& c, const std::vector<Arg>& a) {
    Ew e(c);
    RequireFloat(e.out, "log_sigmoid_forward");
    Value x = e.In(a[0]);
    Value z = e.Exp(e.b.Unary("negate", e.b.Unary("abs", x)));
    Value mn = e.Sel(e.Lt(x, e.K_(0)), x, e.K_(0));
    mn = e.Sel(e.b.Compare("NE", x, x), x, mn);
    Value out = e.Sub(mn, e.Log1p(z));
    const TensorType& buf = c.outputs.at(1);
    Value buffer = buf.shape == e.out.shape ? c.b.Convert(z, buf.dtype) : c.b.Splat(buf.dtype, 0, buf.shape);
    return std::vector<Value>{c.b.Convert(out, e.out.dtype), buffer};
  }).Dynamic();
  // log_sigmoid_backward(grad_output, self, buffer)
  Register("log_sigmoid_backward", [](Context& c, const std::vector<Arg>& a) {
    Ew e(c);
    Value dy = e.In(a[0]), x = e.In(a[1]);
    Value neg = e.Lt(x, e.K_(0));
    Value max_deriv = e.Sel(neg, e.K_(1), e.K_(0));
    Value sign = e.Sel(neg, e.K_(1), e.K_(-1));
    Value z = e.Exp(e.b.Unary("negate", e.b.Unary("abs", x)));
    return e.Ret(e.Mul(dy, e.Sub(max_deriv, e.Mul(sign, e.Div(z, e.Add(e.K_(1), z))))));
  }).Dynamic();
  // logit(self, eps?) = log(x / (1 - x)), x clamped to [eps, 1 - eps] when eps >= 0
  Register("logit", [](Context& c, const std::vector<Arg>& a) {
    Ew e(c);
    Value x = e.In(a[0]);
    if (a.size() > 1 && a[1].kind == K::Double && a[1].d >= 0) {
      Value lo = e.K_(a[1].d), hi = e.K_(1 - a[1].d);
      x = e.Sel(e.Lt(x, lo), lo, e.Sel(e.Gt(x, hi), hi, x));
    }
    return e.Ret(e.b.Unary("log", e.Div(x, e.Sub(e.K_(1), x))));
  }).DynamicElementwise();
  // logit_backward(grad_output, self, eps?)
  Register("logit_backward", [](Context& c, const std::vector<Arg>& a) {
    Ew e(c);
    Value dy = e.In(a[0]), x = e.In(a[1]);
    Value g = e.Div(dy, e.Mul(x, e.Sub(e.K_(1), x)));
    Value r;
    if (a.size() > 2 && a[2].kind == K::Double && a[2].d >= 0) {
      Value outside = e.b.Binary("or", e.Lt(x, e.K_(a[2].d)), e.Gt(x, e.K_(1 - a[2].d)));
      r = e.Sel(outside, e.K_(0), g);
    } else {
      Value outside = e.b.Binary("or", e.Lt(x, e.K_(0)), e.Gt(x, e.K_(1)));
      r = e.Sel(outside, e.K_(NAN), g);
    }
    return e.Ret(r);
  }).DynamicElementwise();
  // glu(self, dim) = a * sigmoid(b), (a, b) the halves of self along dim
  Register("glu", [](Context& c, const std::vector<Arg>& a) {
    Builder& b = c.b;
    const TensorType& out = c.outputs.at(0);
    Glu g = GluHalves(b, b.Convert(a.at(0).tensor, ComputeType(out.dtype)), a.at(1).i);
    return std::vector<Value>{b.Convert(b.Binary("multiply", g.first, g.sigmoid), out.dtype)};
  }).Dynamic(NamedDimsStatic(1, "the dim it halves"));
  // glu_backward(grad_output, self, dim)
  Register("glu_backward", [](Context& c, const std::vector<Arg>& a) {
    Builder& b = c.b;
    const TensorType& out = c.outputs.at(0);
    ElementType ct = ComputeType(out.dtype);
    Glu g = GluHalves(b, b.Convert(a.at(1).tensor, ct), a.at(2).i);
    Value dy = b.Convert(a.at(0).tensor, ct);
    Value one = b.Splat(ct, 1, g.first.shape());
    Value ga = b.Binary("multiply", dy, g.sigmoid);
    Value gb = b.Binary("multiply", b.Binary("multiply", ga, g.first),
                        b.Binary("subtract", one, g.sigmoid));
    return std::vector<Value>{b.Convert(b.Concatenate({ga, gb}, g.dim), out.dtype)};
  }).Dynamic([](const std::vector<Arg>& a, StaticDims& s) {  // (grad_output, self, dim)
    const int64_t rank = static_cast<int64_t>(s.Rank(1));
    if (rank == 0) return;
    const size_t d = static_cast<size_t>(WrapDim(a.at(2).i, rank));
    s.Dim(0, d);
    s.Dim(1, d);
    s.Because("the dim it halves");
  });
  // _prelu_kernel(self, weight): x > 0 ? x : w * x (weight broadcasts)
  Register("_prelu_kernel", [](Context& c, const std::vector<Arg>& a) {
    Ew e(c);
    Value x = e.In(a[0]), w = e.In(a[1]);
    return e.Ret(e.Sel(e.Gt(x, e.K_(0)), x, e.Mul(w, x)));
  });
  // _prelu_kernel_backward(grad_output, self, weight) -> (grad_self, grad_weight),
  // both of the broadcast shape (autograd sums grad_weight down).
  Register("_prelu_kernel_backward", [](Context& c, const std::vector<Arg>& a) {
    Ew e(c);
    Value dy = e.In(a[0]), x = e.In(a[1]), w = e.In(a[2]);
    Value pos = e.Gt(x, e.K_(0));
    Value gx = e.Sel(pos, dy, e.Mul(w, dy));
    Value gw = e.Sel(pos, e.K_(0), e.Mul(x, dy));
    const TensorType& wt = c.outputs.at(1);
    if (wt.shape != e.out.shape) throw Unsupported("_prelu_kernel_backward: unexpected shapes");
    return std::vector<Value>{c.b.Convert(gx, e.out.dtype), c.b.Convert(gw, wt.dtype)};
  });

  // native_dropout(input, p, train?) -> (output, mask): keep with
  // probability 1 - p, output = input * mask * (1 / (1 - p)) (0 when p == 1).
  RegisterRandom("native_dropout", [](Context& c, const std::vector<Arg>& a) {
    Builder& b = c.b;
    const TensorType& out = c.outputs.at(0);
    const TensorType& mask_t = c.outputs.at(1);
    Value x = a.at(0).tensor;
    double p = a.at(1).d;
    bool train = a.at(2).kind != K::Bool || a[2].i != 0;
    if (!train) {
      return std::vector<Value>{b.Convert(x, out.dtype), b.Splat(mask_t.dtype, 1, mask_t.shape)};
    }
    double p1m = 1.0 - p;
    double scale = p1m == 0 ? 0.0 : 1.0 / p1m;
    Value u = Uniform01(b, GeneratorArg(a).tensor, out.shape, /*wide=*/false, RealSizes(b, x));
    Value keep = b.Compare("LT", u, b.Splat(ElementType::F32, p1m, out.shape));
    ElementType ct = ComputeType(out.dtype);
    Value kept = b.Binary("multiply", x, b.Convert(keep, x.dtype()));  // input.mul(mask)
    Value y = b.Binary("multiply", b.Convert(kept, ct), b.Splat(ct, scale, out.shape));
    if (scale == 0) {  // p == 1: x * 0 * 0, NaN for non-finite x (XLA folds x * 0 to 0)
      Value finite = b.IsFinite(b.Convert(x, ct));
      y = b.Select(finite, b.Splat(ct, 0, out.shape), b.Splat(ct, NAN, out.shape));
    }
    return std::vector<Value>{b.Convert(y, out.dtype), b.Convert(keep, mask_t.dtype)};
  }).Dynamic().dynamic.draws_at_real_sizes = true;
  // native_dropout_backward(grad_output, mask, scale) = grad * mask * scale
  Register("native_dropout_backward", [](Context& c, const std::vector<Arg>& a) {
    Builder& b = c.b;
    const TensorType& out = c.outputs.at(0);
    ElementType ct = ComputeType(out.dtype);
    Value g = As(b, a.at(0), out.dtype, out.shape);
    Value m = As(b, a.at(1), out.dtype, out.shape);
    Value kept = b.Binary("multiply", g, m);
    Value y = b.Binary("multiply", b.Convert(kept, ct), b.Splat(ct, a.at(2).d, out.shape));
    return std::vector<Value>{b.Convert(y, out.dtype)};
  }).DynamicElementwise();
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
