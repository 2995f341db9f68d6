// Fused optimizer steps: _fused_adam_, _fused_adamw_, _fused_sgd_ (and their
// tensor_lr overloads). One module updates every parameter of the group.
// The rules are registered on the mutating ops: they return one value per
// mutated tensor, lists flattened in schema order (params, grads, then the
// state lists). The math follows torch.optim's single-tensor (non-fused)
// algorithms operation by operation, in the compute type (f32 for 16-bit
// parameters), so results match them to rounding. Like the CPU and CUDA
// kernels: grads are unscaled in place when grad_scale is given, and nothing
// changes when found_inf is 1.
#include <cmath>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

using K = Arg::Kind;

const std::vector<Value>& List(const std::vector<Arg>& a, size_t i) {
  if (a.at(i).kind != K::TensorList) throw std::logic_error("fused optimizer: expected a list");
  for (const Value& v : a[i].tensors)
    if (!v.valid()) throw Unsupported("fused optimizer: None inside a tensor list");
  return a[i].tensors;
}

double Double(const std::vector<Arg>& a, size_t i) {
  if (a.at(i).kind == K::Double) return a[i].d;
  if (a[i].kind == K::Int) return static_cast<double>(a[i].i);
  throw std::logic_error("fused optimizer: expected a float argument");
}

bool Flag(const std::vector<Arg>& a, size_t i) {
  return a.at(i).kind == K::Bool && a[i].i != 0;
}

// A float hyperparameter: baked (float overload) or a runtime tensor (the
// tensor_lr overloads), as a rank-0 value of type `t`.
struct Hyper {
  bool is_tensor = false;
  double d = 0;
  Value v;  // rank 0, when is_tensor
};

Hyper HyperArg(Builder& b, const Arg& a, ElementType t) {
  Hyper h;
  if (a.kind == K::Tensor || a.kind == K::Scalar) {
    if (a.tensor.type.numel() != 1)
      throw std::invalid_argument("fused optimizer: lr must be a one-element tensor");
    h.is_tensor = true;
    h.v = b.Convert(b.Reshape(a.tensor, {}), t);
  } else if (a.kind == K::Double && a.tensor.valid()) {  // a runtime float
    h.is_tensor = true;
    h.v = b.Convert(a.tensor, t);
  } else if (a.kind == K::Double) {
    h.d = a.d;
  } else {
    throw std::logic_error("fused optimizer: expected lr");
  }
  return h;
}

// Shorthands over one parameter's shape in the compute type.
struct Math {
  Builder& b;
  ElementType t;
  std::vector<int64_t> shape;
  Value C(double v) const { return b.Splat(t, v, shape); }
  Value Full(Value scalar) const { return b.BroadcastInDim(b.Convert(scalar, t), shape, {}); }
  Value H(const Hyper& h) const { return h.is_tensor ? Full(h.v) : C(h.d); }
  Value Add(Value x, Value y) const { return b.Binary("add", x, y); }
  Value Sub(Value x, Value y) const { return b.Binary("subtract", x, y); }
  Value Mul(Value x, Value y) const { return b.Binary("multiply", x, y); }
  Value Div(Value x, Value y) const { return b.Binary("divide", x, y); }
  Value Neg(Value x) const { return b.Unary("negate", x); }
  Value Sqrt(Value x) const { return b.Unary("sqrt", x); }
};

// `x` rounded to the dtype its state is stored in (and back): the next
// operations see the stored value, as in the single-tensor algorithms.
Value Round(Builder& b, Value x, ElementType stored) {
  return b.Convert(b.Convert(x, stored), x.dtype());
}

// found_inf == 1: every output keeps its old value.
struct SkipIfInf {
  Value apply;  // rank-0 bool (found_inf != 1), invalid when found_inf is None
  Value operator()(Builder& b, Value updated, Value old) const {
    if (!apply.valid()) return updated;
    return b.Select(b.BroadcastInDim(apply, updated.shape(), {}), updated, old);
  }
};

SkipIfInf FoundInf(Builder& b, const Arg& found_inf) {
  SkipIfInf s;
  if (found_inf.kind != K::Tensor) return s;
  Value f = b.Reshape(b.Convert(found_inf.tensor, ElementType::F32), {});
  s.apply = b.Compare("NE", f, b.Constant(ElementType::F32, 1));
  return s;
}

// The grad as the kernels see it: unscaled by grad_scale when given (that
// value is also written back to grads).
Value Unscale(const Math& m, Value g, const Arg& grad_scale) {
  if (grad_scale.kind != K::Tensor) return g;
  return m.Div(g, m.Full(m.b.Reshape(grad_scale.tensor, {})));
}

// self + w * (end - self) for |w| < 0.5, else end - (end - self) * (1 - w):
// ATen's lerp with a baked weight.
Value Lerp(const Math& m, Value self, Value end, double w) {
  Value diff = m.Sub(end, self);
  if (std::abs(w) < 0.5) return m.Add(self, m.Mul(m.C(w), diff));
  return m.Sub(end, m.Mul(diff, m.C(1 - w)));
}

// 1 - beta ** step, accurate for beta close to 1: -expm1(step * log(beta)).
Value BiasCorrection(const Math& m, Value step, double beta) {
  if (beta == 0) return m.C(1);
  Value e = m.Mul(step, m.C(std::log(beta)));
  return m.Neg(m.b.Unary("exponential_minus_one", e));
}

// _fused_adam(w)_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs,
// state_steps, *, lr, beta1, beta2, weight_decay, eps, amsgrad, maximize,
// grad_scale, found_inf).
Rule AdamRule(bool decoupled) {
  return [decoupled](Context& c, const std::vector<Arg>& a) {
    Builder& b = c.b;
    const auto& params = List(a, 0);
    const auto& grads = List(a, 1);
    const auto& exp_avgs = List(a, 2);
    const auto& exp_avg_sqs = List(a, 3);
    const auto& max_exp_avg_sqs = List(a, 4);
    const auto& steps = List(a, 5);
    double beta1 = Double(a, 7), beta2 = Double(a, 8), weight_decay = Double(a, 9),
           eps = Double(a, 10);
    bool amsgrad = Flag(a, 11), maximize = Flag(a, 12);
    const Arg& grad_scale = a.at(13);
    SkipIfInf keep = FoundInf(b, a.at(14));
    size_t n = params.size();
    auto check = [&](size_t size, const char* what) {
      if (size != n)
        throw std::invalid_argument(std::string("fused adam: ") + what +
                                    " must have as many tensors as params");
    };
    check(grads.size(), "grads");
    check(exp_avgs.size(), "exp_avgs");
    check(exp_avg_sqs.size(), "exp_avg_sqs");
    check(steps.size(), "state_steps");
    if (amsgrad) check(max_exp_avg_sqs.size(), "max_exp_avg_sqs");
    size_t n_max = amsgrad ? n : max_exp_avg_sqs.size();
    if (c.outputs.size() != 4 * n + n_max)
      throw std::logic_error("fused adam: unexpected number of outputs");

    std::vector<Value> new_p(n), new_g(n), new_m(n), new_v(n), new_vmax(n_max);
    for (size_t i = 0; i < n; ++i) {
      ElementType pt = c.outputs[i].dtype;
      if (!hlo::IsFloat(pt)) throw std::invalid_argument("fused adam: params must be floats");
      Math m{b, ComputeType(pt), params[i].shape()};
      Hyper lr = HyperArg(b, a.at(6), m.t);
      Value p = b.Convert(params[i], m.t);
      Value g = Unscale(m, b.Convert(grads[i], m.t), grad_scale);
      Value ea = b.Convert(exp_avgs[i], m.t);
      Value eas = b.Convert(exp_avg_sqs[i], m.t);
      Value step = m.Full(b.Reshape(steps[i], {}));

      Value grad = maximize ? m.Neg(g) : g;
      if (weight_decay != 0) {
        if (decoupled) {
          // param.mul_(1 - lr * weight_decay)
          Value factor = lr.is_tensor ? m.Sub(m.C(1), m.Mul(m.H(lr), m.C(weight_decay)))
                                      : m.C(1 - lr.d * weight_decay);
          p = m.Mul(p, factor);
        } else {
          // grad = grad.add(param, alpha=weight_decay)
          grad = m.Add(grad, m.Mul(m.C(weight_decay), p));
        }
      }
      // exp_avg.lerp_(grad, 1 - beta1)
      ea = Round(b, Lerp(m, ea, grad, 1 - beta1), exp_avgs[i].dtype());
      // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
      eas = m.Add(m.Mul(eas, m.C(beta2)), m.Mul(m.Mul(m.C(1 - beta2), grad), grad));
      eas = Round(b, eas, exp_avg_sqs[i].dtype());

      Value bc1 = BiasCorrection(m, step, beta1);
      Value bc2_sqrt = m.Sqrt(BiasCorrection(m, step, beta2));
      Value step_size = m.Div(m.H(lr), bc1);
      Value second = eas;
      if (amsgrad) {
        Value old = b.Convert(max_exp_avg_sqs[i], m.t);
        // torch.maximum: a NaN in either operand wins.
        Value mx = b.Binary("maximum", old, eas);
        mx = b.Select(b.Compare("NE", eas, eas), eas, mx);
        mx = b.Select(b.Compare("NE", old, old), old, mx);
        second = Round(b, mx, max_exp_avg_sqs[i].dtype());
        new_vmax[i] = keep(b, b.Convert(mx, max_exp_avg_sqs[i].dtype()), max_exp_avg_sqs[i]);
      }
      // denom = (sqrt(v) / sqrt(bc2)) + eps; param.addcdiv_(exp_avg, denom, -step_size)
      Value denom = m.Add(m.Div(m.Sqrt(second), bc2_sqrt), m.C(eps));
      p = m.Sub(p, m.Div(m.Mul(step_size, ea), denom));

      new_p[i] = keep(b, b.Convert(p, pt), params[i]);
      new_g[i] = keep(b, b.Convert(g, grads[i].dtype()), grads[i]);
      new_m[i] = keep(b, b.Convert(ea, exp_avgs[i].dtype()), exp_avgs[i]);
      new_v[i] = keep(b, b.Convert(eas, exp_avg_sqs[i].dtype()), exp_avg_sqs[i]);
    }
    if (!amsgrad)
      for (size_t i = 0; i < n_max; ++i) new_vmax[i] = max_exp_avg_sqs[i];
    std::vector<Value> out;
    for (auto* list : {&new_p, &new_g, &new_m, &new_v, &new_vmax})
      out.insert(out.end(), list->begin(), list->end());
    return out;
  };
}

// _fused_sgd_(params, grads, momentum_buffer_list, *, weight_decay, momentum,
// lr, dampening, nesterov, maximize, is_first_step, grad_scale, found_inf).
std::vector<Value> SgdRule(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const auto& params = List(a, 0);
  const auto& grads = List(a, 1);
  const auto& bufs = List(a, 2);
  double weight_decay = Double(a, 3), momentum = Double(a, 4), dampening = Double(a, 6);
  bool nesterov = Flag(a, 7), maximize = Flag(a, 8), is_first_step = Flag(a, 9);
  const Arg& grad_scale = a.at(10);
  SkipIfInf keep = FoundInf(b, a.at(11));
  size_t n = params.size();
  if (grads.size() != n)
    throw std::invalid_argument("fused sgd: grads must have as many tensors as params");
  bool has_momentum = momentum != 0;
  if (has_momentum && bufs.size() != n)
    throw std::invalid_argument(
        "fused sgd: momentum_buffer_list must have as many tensors as params");
  if (c.outputs.size() != 2 * n + bufs.size())
    throw std::logic_error("fused sgd: unexpected number of outputs");

  std::vector<Value> new_p(n), new_g(n), new_buf(bufs.begin(), bufs.end());
  for (size_t i = 0; i < n; ++i) {
    ElementType pt = c.outputs[i].dtype;
    if (!hlo::IsFloat(pt)) throw std::invalid_argument("fused sgd: params must be floats");
    Math m{b, ComputeType(pt), params[i].shape()};
    Hyper lr = HyperArg(b, a.at(5), m.t);
    Value p = b.Convert(params[i], m.t);
    Value g = Unscale(m, b.Convert(grads[i], m.t), grad_scale);
    Value grad = maximize ? m.Neg(g) : g;
    // grad = grad.add(param, alpha=weight_decay)
    if (weight_decay != 0) grad = m.Add(grad, m.Mul(m.C(weight_decay), p));
    if (has_momentum) {
      Value buf;
      if (is_first_step) {
        buf = grad;  // torch.clone(grad)
      } else {
        // buf.mul_(momentum).add_(grad, alpha=1 - dampening)
        Value old = b.Convert(bufs[i], m.t);
        buf = m.Add(m.Mul(old, m.C(momentum)), m.Mul(m.C(1 - dampening), grad));
      }
      new_buf[i] = keep(b, b.Convert(buf, bufs[i].dtype()), bufs[i]);
      buf = Round(b, buf, bufs[i].dtype());
      grad = nesterov ? m.Add(grad, m.Mul(m.C(momentum), buf)) : buf;
    }
    // param.add_(grad, alpha=-lr)
    Value neg_lr = lr.is_tensor ? m.Neg(m.H(lr)) : m.C(-lr.d);
    p = m.Add(p, m.Mul(neg_lr, grad));
    new_p[i] = keep(b, b.Convert(p, pt), params[i]);
    new_g[i] = keep(b, b.Convert(g, grads[i].dtype()), grads[i]);
  }
  std::vector<Value> out;
  for (auto* list : {&new_p, &new_g, &new_buf}) out.insert(out.end(), list->begin(), list->end());
  return out;
}

// PyTorch has no Meta kernel for _fused_sgd_ (either overload) nor for the
// tensor_lr overloads of _fused_adam(w)_, and the dispatcher validates every
// in-place call through the meta kernel on a cache miss, which raises
// NotImplementedError for them. Until it skips that validation for ops
// without a Meta kernel, those stay on the CPU fallback (set this to true
// then; the rules were checked against CPU with a Meta kernel registered
// from Python).
constexpr bool kRegisterOpsWithoutMeta = true;

const bool registered = [] {
  // lr is a runtime parameter: a learning-rate schedule never recompiles.
  RegisterRuntimeFloats("_fused_adam_", AdamRule(false), {"lr"});
  RegisterRuntimeFloats("_fused_adamw_", AdamRule(true), {"lr"});
  if (kRegisterOpsWithoutMeta) {
    Register("_fused_adam_.tensor_lr", AdamRule(false));
    Register("_fused_adamw_.tensor_lr", AdamRule(true));
    RegisterRuntimeFloats("_fused_sgd_", SgdRule, {"lr"});
    Register("_fused_sgd_.tensor_lr", SgdRule);
  }
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
