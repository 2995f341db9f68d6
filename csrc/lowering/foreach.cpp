// _foreach_* rules: one module for the whole list. Each element is computed
// by the elementwise (or reduction) rule of the matching single-tensor op, so
// type promotion, opmath and NaN semantics are exactly those of the
// single-tensor op; lerp, addcmul and addcdiv (no single-tensor rule yet)
// are written here. The in-place `_foreach_x_` variants are derived from the
// functional schemas (one value per list element); `_foreach_zero_` and
// `_foreach_copy_` exist only in place and are registered as such.
#include <cmath>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

using K = Arg::Kind;

// Element i of a Tensor[] argument, as a Tensor argument.
Arg TensorAt(const Arg& list, size_t i) {
  if (list.kind != K::TensorList) throw std::logic_error("foreach: expected a tensor list");
  if (i >= list.tensors.size())
    throw std::invalid_argument("Tensor lists must have the same number of tensors");
  Arg t;
  t.kind = K::Tensor;
  t.tensor = list.tensors[i];
  if (!t.tensor.valid()) throw Unsupported("foreach: None inside a tensor list");
  return t;
}

// Element i of a Scalar[] argument: the dispatcher passes Scalar[] as a
// ScalarList of rank-0 runtime values, with each number's category in `ints`.
Arg ScalarAt(const Arg& list, size_t i) {
  if (list.kind != K::ScalarList && list.kind != K::TensorList)
    throw Unsupported("foreach: Scalar[] argument");
  if (i >= list.tensors.size())
    throw std::invalid_argument("Tensor list must have same number of elements as scalar list");
  Arg s;
  s.kind = K::Scalar;
  s.tensor = list.tensors[i];
  if (!s.tensor.valid() || s.tensor.rank() != 0)
    throw std::logic_error("foreach: a Scalar[] element must be a rank-0 value");
  if (list.kind == K::ScalarList && i < list.ints.size()) {
    s.scalar_type = static_cast<ElementType>(list.ints[i]);
    return s;
  }
  ElementType t = s.tensor.dtype();
  s.scalar_type = hlo::IsFloat(t) ? ElementType::F64 : t;
  return s;
}

// The arguments of element i's single-tensor call. `pattern` has one letter
// per foreach argument: L = element of a Tensor[], S = element of a
// Scalar[], = = the argument itself, - = dropped.
std::vector<Arg> Pick(const std::vector<Arg>& a, const std::string& pattern, size_t i) {
  std::vector<Arg> out;
  for (size_t k = 0; k < pattern.size() && k < a.size(); ++k) {
    switch (pattern[k]) {
      case 'L': out.push_back(TensorAt(a[k], i)); break;
      case 'S': out.push_back(ScalarAt(a[k], i)); break;
      case '=': out.push_back(a[k]); break;
      default: break;
    }
  }
  return out;
}

// Runs the rule registered as `name` for output `out` of `c`.
Value Delegate(Context& c, const std::string& name, size_t out, const std::vector<Arg>& args) {
  const RuleEntry* e = Find(name);
  if (!e) throw std::logic_error("foreach: no rule for " + name);
  Context sub{c.b};
  sub.outputs = {c.outputs.at(out)};
  sub.fp32_highest = c.fp32_highest;
  sub.op = c.op;
  sub.default_float = c.default_float;
  std::vector<Value> r = e->rule(sub, args);
  for (auto& check : sub.checks) c.checks.push_back(std::move(check));
  if (r.empty()) throw std::logic_error("foreach: rule " + name + " returned no value");
  return r[0];
}

// Checks that every Tensor[] argument has as many tensors as there are
// outputs (PyTorch's check_foreach_api_restrictions).
void CheckLists(const Context& c, const std::vector<Arg>& a) {
  for (const Arg& x : a)
    if (x.kind == K::TensorList && x.tensors.size() != c.outputs.size())
      throw std::invalid_argument("Tensor lists must have the same number of tensors, got " +
                                  std::to_string(c.outputs.size()) + " and " +
                                  std::to_string(x.tensors.size()));
}

// f(element i's args) through the single-tensor rule `name`.
Rule ForEach(const std::string& name, const std::string& pattern) {
  return [name, pattern](Context& c, const std::vector<Arg>& a) {
    CheckLists(c, a);
    std::vector<Value> out;
    for (size_t i = 0; i < c.outputs.size(); ++i)
      out.push_back(Delegate(c, name, i, Pick(a, pattern, i)));
    return out;
  };
}

// ---------------------------------------------------------------- pointwise

// ATen's lerp: weight < 0.5 in magnitude interpolates from self, else from
// end (exact at both ends).
Value Lerp(Builder& b, Value x, Value y, Value w) {
  Value diff = b.Binary("subtract", y, x);
  Value one = b.Splat(x.dtype(), 1, x.shape());
  Value from_self = b.Binary("add", x, b.Binary("multiply", w, diff));
  Value from_end = b.Binary("subtract", y, b.Binary("multiply", diff, b.Binary("subtract", one, w)));
  Value small = b.Compare("LT", b.Unary("abs", w), b.Splat(x.dtype(), 0.5, x.shape()));
  return b.Select(small, from_self, from_end);
}

// lerp(self[i], end[i], weight): weight is a Tensor[] ('L'), Scalar[] ('S')
// or Scalar ('=').
Rule LerpRule(char weight) {
  return [weight](Context& c, const std::vector<Arg>& a) {
    CheckLists(c, a);
    std::vector<Value> out;
    for (size_t i = 0; i < c.outputs.size(); ++i) {
      const TensorType& t = c.outputs[i];
      if (!hlo::IsFloat(t.dtype)) throw Unsupported("lerp of a non-float tensor");
      ElementType ct = ComputeType(t.dtype);
      Value x = As(c.b, TensorAt(a[0], i), ct, t.shape);
      Value y = As(c.b, TensorAt(a[1], i), ct, t.shape);
      Arg w = weight == 'L' ? TensorAt(a[2], i) : weight == 'S' ? ScalarAt(a[2], i) : a[2];
      Value r = Lerp(c.b, x, y, As(c.b, w, ct, t.shape));
      out.push_back(c.b.Convert(r, t.dtype));
    }
    return out;
  };
}

// addcmul / addcdiv(self[i], t1[i], t2[i], value): self + value * t1 (* or /)
// t2, in that order (ATen's CPU kernel), in the compute type.
Rule PointwiseRule(bool divide, char value) {
  return [divide, value](Context& c, const std::vector<Arg>& a) {
    CheckLists(c, a);
    std::vector<Value> out;
    for (size_t i = 0; i < c.outputs.size(); ++i) {
      const TensorType& t = c.outputs[i];
      if (t.dtype == ElementType::Bool) throw Unsupported("addcmul/addcdiv of bool tensors");
      if (divide && !hlo::IsFloat(t.dtype))
        throw std::invalid_argument(
            "Integer division with addcdiv is no longer supported, and in a future release "
            "addcdiv will perform a true division of tensor1 and tensor2.");
      ElementType ct = ComputeType(t.dtype);
      Value x = As(c.b, TensorAt(a[0], i), ct, t.shape);
      Value t1 = As(c.b, TensorAt(a[1], i), ct, t.shape);
      Value t2 = As(c.b, TensorAt(a[2], i), ct, t.shape);
      Value v;
      if (value == 'S') {
        v = As(c.b, ScalarAt(a[3], i), ct, t.shape);
      } else if (a.size() > 3 && a[3].kind == K::Scalar) {
        v = As(c.b, a[3], ct, t.shape);
      } else {
        v = c.b.Splat(ct, 1, t.shape);
      }
      Value prod = c.b.Binary("multiply", v, t1);
      prod = c.b.Binary(divide ? "divide" : "multiply", prod, t2);
      out.push_back(c.b.Convert(c.b.Binary("add", x, prod), t.dtype));
    }
    return out;
  };
}

// ---------------------------------------------------------------- registration

// Registers _foreach_<op>.<overload> as element-wise calls of `rule`.
void RegisterForEach(const std::string& op, const std::string& overload, const std::string& rule,
                     const std::string& pattern) {
  std::string name = "_foreach_" + op + (overload.empty() ? "" : "." + overload);
  Register(name, ForEach(rule, pattern));
}

const bool registered = [] {
  // ---- binary arithmetic: List, Scalar, ScalarList, Tensor overloads.
  // add.List(self, other, *, alpha), add.Tensor(self, Tensor other, *, alpha)
  for (const char* op : {"add", "sub"}) {
    std::string s(op);
    RegisterForEach(s, "List", s + ".Tensor", "LL=");
    RegisterForEach(s, "Scalar", s + ".Scalar", "L=");
    RegisterForEach(s, "ScalarList", s + ".Scalar", "LS");
  }
  RegisterForEach("add", "Tensor", "add.Tensor", "L==");
  for (const char* op : {"mul", "div"}) {
    std::string s(op);
    RegisterForEach(s, "List", s + ".Tensor", "LL");
    RegisterForEach(s, "Scalar", s + ".Scalar", "L=");
    RegisterForEach(s, "ScalarList", s + ".Scalar", "LS");
    RegisterForEach(s, "Tensor", s + ".Tensor", "L=");
  }
  // maximum / minimum with a scalar are clamp_min / clamp_max (as in ATen).
  const std::pair<const char*, const char*> extremes[] = {
      {"maximum", "clamp_min"}, {"minimum", "clamp_max"},
      {"clamp_min", "clamp_min"}, {"clamp_max", "clamp_max"}};
  for (const auto& [op, clamp] : extremes) {
    std::string s(op), cl(clamp);
    RegisterForEach(s, "List", s == "maximum" || s == "minimum" ? s : cl + ".Tensor", "LL");
    RegisterForEach(s, "Scalar", cl, "L=");
    RegisterForEach(s, "ScalarList", cl, "LS");
  }
  RegisterForEach("pow", "List", "pow.Tensor_Tensor", "LL");
  RegisterForEach("pow", "Scalar", "pow.Tensor_Scalar", "L=");
  RegisterForEach("pow", "ScalarList", "pow.Tensor_Scalar", "LS");
  RegisterForEach("pow", "ScalarAndTensor", "pow.Scalar", "=L");

  // ---- unary math
  for (const char* op :
       {"abs", "acos", "asin", "atan", "ceil", "cos", "cosh", "erf", "exp", "expm1", "floor",
        "frac", "lgamma", "log", "log10", "log1p", "log2", "neg", "reciprocal", "round",
        "rsqrt", "sigmoid", "sign", "sin", "sinh", "sqrt", "tan", "tanh", "trunc"})
    RegisterForEach(op, "", op, "L");

  // ---- pointwise with three operands
  Register("_foreach_lerp.List", LerpRule('L'));
  Register("_foreach_lerp.Scalar", LerpRule('='));
  Register("_foreach_lerp.ScalarList", LerpRule('S'));
  Register("_foreach_addcmul.Scalar", PointwiseRule(false, '='));
  Register("_foreach_addcmul.ScalarList", PointwiseRule(false, 'S'));
  Register("_foreach_addcdiv.Scalar", PointwiseRule(true, '='));
  Register("_foreach_addcdiv.ScalarList", PointwiseRule(true, 'S'));
  // The .Tensor overloads of addcmul/addcdiv take a 1-D CPU tensor of scalars,
  // which the dispatcher refuses: they are left to the CPU fallback.

  // ---- reductions
  // _foreach_norm.Scalar(self, ord, dtype) = linalg_vector_norm(self[i], ord,
  // dim=None, keepdim=False, dtype).
  Register("_foreach_norm.Scalar", [](Context& c, const std::vector<Arg>& a) {
    CheckLists(c, a);
    Arg ord;
    if (a.size() > 1 && !a[1].is_none()) ord = a[1];
    if (ord.is_none()) {
      ord.kind = K::Double;
      ord.d = 2;
    }
    Arg keepdim;
    keepdim.kind = K::Bool;
    keepdim.i = 0;
    Arg dtype = a.size() > 2 ? a[2] : Arg();
    std::vector<Value> out;
    for (size_t i = 0; i < c.outputs.size(); ++i)
      out.push_back(Delegate(c, "linalg_vector_norm", i,
                             {TensorAt(a[0], i), ord, Arg(), keepdim, dtype}));
    return out;
  });
  RegisterForEach("max", "", "max", "L");

  // ---- in place only
  Register("_foreach_zero_", [](Context& c, const std::vector<Arg>& a) {
    CheckLists(c, a);
    std::vector<Value> out;
    for (const TensorType& t : c.outputs) out.push_back(c.b.Splat(t.dtype, 0, t.shape));
    return out;
  });
  Register("_foreach_copy_", [](Context& c, const std::vector<Arg>& a) {
    CheckLists(c, a);
    std::vector<Value> out;
    for (size_t i = 0; i < c.outputs.size(); ++i) {
      const TensorType& t = c.outputs[i];
      out.push_back(As(c.b, TensorAt(a[1], i), t.dtype, t.shape));
    }
    return out;
  });
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
