// The argument decoder (call_args.h): schema arguments to ArgPlans, module
// parameters and cache-key text, for eager calls and graph nodes alike.
#include "aten/call_args.h"

#include <cstdio>

namespace torch_tpu::aten {

using hlo::ElementType;
using lowering::Arg;

namespace {

ElementType ScalarCategory(const c10::Scalar& s) {
  if (s.isBoolean()) return ElementType::Bool;
  if (s.isIntegral(false)) return ElementType::I64;
  if (s.isFloatingPoint()) return ElementType::F64;
  return ElementType::C128;  // complex: c10::Scalar holds a complex<double>
}

c10::TypePtr Unwrap(const c10::TypePtr& t) {
  if (t->kind() == c10::TypeKind::OptionalType) return t->castRaw<c10::OptionalType>()->getElementType();
  return t;
}

bool IsNone(const c10::IValue& v) { return v.isNone() || (v.isTensor() && !v.toTensor().defined()); }

int64_t IntOf(const c10::IValue& v) { return v.isInt() ? v.toInt() : v.toSymInt().expect_int(); }

std::vector<int64_t> IntList(const c10::IValue& v) {
  if (v.isIntList()) return v.toIntVector();
  std::vector<int64_t> out;
  for (const auto& e : v.toListRef()) out.push_back(IntOf(e));
  return out;
}

ArgPlan DoubleArg(Plan& p, double d, bool runtime) {
  ArgPlan a;
  a.kind = Arg::Kind::Double;
  a.literal.d = d;
  if (runtime) {  // also a runtime parameter; the value stays out of the key
    Param q{Param::Kind::Scalar};
    q.scalar = d;
    q.dtype = ElementType::F64;
    a.param = AddParam(p, q);
    p.key += "d";
  } else {
    p.key += "D" + ExactString(c10::Scalar(d));
  }
  return a;
}

ArgPlan TensorListArg(Plan& p, const c10::IValue& v, TensorSource& tensors, const std::string& op) {
  ArgPlan a;
  a.kind = Arg::Kind::TensorList;
  p.key += "[";
  for (const auto& e : v.toListRef()) {
    if (IsNone(e)) {
      a.tensors.push_back(-1);
      p.key += "N";
      continue;
    }
    ArgPlan t = tensors.Tensor(p, e);
    if (t.kind != Arg::Kind::Tensor || t.tensors.empty())
      throw lowering::Unsupported(op + ": CPU tensors inside a tensor list");
    a.tensors.push_back(t.tensors[0]);
  }
  p.key += "]";
  return a;
}

// list arguments other than Tensor[]; kind None if the element type is not one of ours.
// `size_ints`: the elements keyed without their values (lowering::SizeInt).
ArgPlan ListArg(Plan& p, c10::TypeKind elem, const c10::IValue& v, const std::vector<int64_t>& size_ints) {
  ArgPlan a;
  if (elem == c10::TypeKind::IntType || elem == c10::TypeKind::SymIntType) {
    a.kind = Arg::Kind::IntList;
    a.literal.ints = IntList(v);
    if (!size_ints.empty()) {
      std::vector<int64_t> keyed = a.literal.ints;
      for (int64_t e : size_ints) keyed.at(e) = -1;
      p.key += "L" + hlo::Ints(keyed) + "~";
    } else {
      p.key += "L" + hlo::Ints(a.literal.ints);
    }
  } else if (elem == c10::TypeKind::NumberType) {  // Scalar[]: runtime params
    a.kind = Arg::Kind::ScalarList;
    p.key += "[";
    for (const auto& e : v.toListRef()) {
      ArgPlan sa = DecodeScalar(p, e.toScalar());
      a.tensors.push_back(sa.param);
      a.literal.ints.push_back(static_cast<int64_t>(sa.literal.scalar_type));
    }
    p.key += "]";
  } else if (elem == c10::TypeKind::BoolType) {
    a.kind = Arg::Kind::IntList;
    for (const auto& e : v.toListRef()) a.literal.ints.push_back(e.toBool());
    p.key += "L" + hlo::Ints(a.literal.ints);
  }
  return a;
}

// `size_ints`: arg is one of the rule's size ints (lowering::SizeInt; for an
// int list, its elements; {-1}: an int arg), keyed without its value.
ArgPlan DecodeArg(Plan& p, const c10::Argument& arg, const c10::IValue& v, bool runtime_float,
                  const std::vector<int64_t>& size_ints, TensorSource& tensors, const std::string& op) {
  ArgPlan a;
  if (IsNone(v)) {
    p.key += "N";
    return a;
  }
  c10::TypePtr type = Unwrap(arg.real_type());
  switch (type->kind()) {
    case c10::TypeKind::TensorType:
      return tensors.Tensor(p, v);
    case c10::TypeKind::NumberType:
      return DecodeScalar(p, v.toScalar());
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType:
      a.kind = Arg::Kind::Int;
      a.literal.i = IntOf(v);
      p.key += !size_ints.empty() ? std::string("I~") : "I" + std::to_string(a.literal.i);
      return a;
    case c10::TypeKind::FloatType:
      return DoubleArg(p, v.toDouble(), runtime_float);
    case c10::TypeKind::BoolType:
      a.kind = Arg::Kind::Bool;
      a.literal.i = v.toBool();
      p.key += a.literal.i ? "B1" : "B0";
      return a;
    case c10::TypeKind::StringType:
      a.kind = Arg::Kind::String;
      a.literal.s = v.toStringRef();
      p.key += "s" + a.literal.s;
      return a;
    case c10::TypeKind::ScalarTypeType:
      a.kind = Arg::Kind::ScalarType;
      a.literal.dtype = ToElementType(v.toScalarType(), op.c_str());
      p.key += std::string("t") + hlo::Name(a.literal.dtype);
      return a;
    case c10::TypeKind::MemoryFormatType:
      p.key += "m" + std::to_string(static_cast<int>(v.toMemoryFormat()));
      return a;
    case c10::TypeKind::LayoutType:
    case c10::TypeKind::DeviceObjType:
      return a;
    case c10::TypeKind::GeneratorType:
      a.kind = Arg::Kind::Generator;
      a.param = AddParam(p, Param{Param::Kind::Rng});  // its state is drawn once numel is known
      p.key += "G";
      return a;
    case c10::TypeKind::ListType: {
      c10::TypePtr elem = Unwrap(type->castRaw<c10::ListType>()->getElementType());
      if (elem->kind() == c10::TypeKind::TensorType) return TensorListArg(p, v, tensors, op);
      a = ListArg(p, elem->kind(), v, size_ints);
      if (a.kind != Arg::Kind::None) return a;
      break;
    }
    default:
      break;
  }
  throw lowering::Unsupported(op + ": argument '" + arg.name() + "' of type " + type->str() +
                              " is not supported natively");
}

void AddGenerator(Plan& plan, ArgPlan& a) {
  a.kind = Arg::Kind::Generator;
  a.param = AddParam(plan, Param{Param::Kind::Rng});
  plan.key += "G";
}

}  // namespace

int AddParam(Plan& p, Param param) {
  p.params.push_back(std::move(param));
  return static_cast<int>(p.params.size()) - 1;
}

std::string ExactString(const c10::Scalar& s) {
  if (s.isFloatingPoint()) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%a", s.toDouble());
    return buf;
  }
  if (s.isBoolean()) return s.toBool() ? "true" : "false";
  if (s.isComplex()) {
    char buf[96];
    auto z = s.toComplexDouble();
    std::snprintf(buf, sizeof(buf), "(%a,%a)", z.real(), z.imag());
    return buf;
  }
  return std::to_string(s.toLong());
}

ArgPlan DecodeScalar(Plan& p, const c10::Scalar& s) {
  ArgPlan a;
  a.kind = Arg::Kind::Scalar;
  a.literal.scalar_type = ScalarCategory(s);
  Param q{Param::Kind::Scalar};
  q.scalar = s;
  q.dtype = a.literal.scalar_type;
  a.param = AddParam(p, q);
  p.key += std::string("S") + hlo::Name(q.dtype);
  return a;
}

namespace {
// Whether schema arg i is one of the rule's size ints with the value its
// tensor's sizes give (lowering::SizeInt), keyed without its value: the
// int list elements ({-1}: an int arg), else none.
std::vector<int64_t> SizeIntsOf(const Plan& plan, const lowering::RuleEntry& rule, const std::vector<c10::IValue>& args,
                                 size_t i) {
  const c10::IValue& v = args[i];
  std::vector<int64_t> keyed;
  for (const lowering::SizeInt& s : rule.dynamic.size_ints) {
    if (s.arg != i || s.tensor_arg >= plan.args.size()) continue;
    double scale = 1.0;
    if (s.scale_arg >= 0) {
      if (static_cast<size_t>(s.scale_arg) >= args.size() || !args[s.scale_arg].isDouble()) continue;
      scale = args[s.scale_arg].toDouble();
    }
    const ArgPlan& t = plan.args[s.tensor_arg];
    if (t.kind != Arg::Kind::Tensor || t.tensors.empty() || t.tensors[0] < 0 || t.param >= 0) continue;
    int64_t value = 0;
    if (s.element < 0 && (v.isInt() || v.isSymInt())) {
      value = IntOf(v);
    } else if (s.element >= 0 && v.isList()) {
      std::vector<int64_t> ints = IntList(v);
      if (static_cast<size_t>(s.element) >= ints.size()) continue;
      value = ints[s.element];
    } else {
      continue;
    }
    if (s.Of(plan.inputs[t.tensors[0]].geometry.sizes, scale) == value) keyed.push_back(s.element);
  }
  return keyed;
}
}  // namespace

void DecodeArgs(Plan& plan, const lowering::RuleEntry& rule, const std::vector<c10::Argument>& schema,
                const std::vector<c10::IValue>& args, TensorSource& tensors, const std::string& op) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (plan.is_out[i]) {
      plan.args.emplace_back();
      continue;
    }
    plan.args.push_back(DecodeArg(plan, schema[i], args[i], rule.IsRuntimeFloat(schema[i].name()),
                                  SizeIntsOf(plan, rule, args, i), tensors, op));
  }
}

void DecodeGenerators(Plan& plan, const lowering::RuleEntry& rule, const std::vector<c10::Argument>& schema) {
  bool has_generator = false;
  for (size_t i = 0; i < plan.args.size(); ++i) {
    if (plan.args[i].kind == Arg::Kind::Generator) has_generator = true;
    if (plan.args[i].kind != Arg::Kind::None || plan.is_out[i]) continue;
    if (Unwrap(schema[i].real_type())->kind() != c10::TypeKind::GeneratorType) continue;
    AddGenerator(plan, plan.args[i]);
    has_generator = true;
  }
  if (rule.random() && !has_generator) {
    plan.args.emplace_back();
    AddGenerator(plan, plan.args.back());
  }
}

void SetScalarWidths(Plan& plan) {
  if (plan.any_f64) return;
  for (auto& q : plan.params) {
    if (q.kind != Param::Kind::Scalar) continue;
    if (q.dtype == ElementType::F64) q.dtype = ElementType::F32;
    else if (q.dtype == ElementType::C128) q.dtype = ElementType::C64;
  }
}

}  // namespace torch_tpu::aten
