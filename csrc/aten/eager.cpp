// The generic eager dispatcher: every op with a lowering rule is registered
// for PrivateUse1 with one boxed kernel that turns the ATen call into
// (rule, abstract inputs), builds a one-op module on a cache miss, and runs
// it. Scalars, view offsets and RNG states are runtime parameters, so they
// never cause a recompile.
#include <ATen/MemoryOverlap.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <torch/library.h>

#include <atomic>
#include <unordered_map>

#include "aten/tpu.h"

namespace torch_tpu::aten {

using hlo::ElementType;
using hlo::TensorType;
using hlo::Value;
using lowering::Arg;
using runtime::DeviceStorage;

void ResolveTensorInputs(std::vector<c10::IValue>& args, const std::vector<size_t>& mutable_args,
                     const std::vector<size_t>& out_args, const std::string& op);  // complex.cpp

namespace {

enum class Variant { Functional, InPlace, Out };

struct OpDesc {
  std::string name;  // "add.Tensor"
  const lowering::RuleEntry* rule = nullptr;
  Variant variant = Variant::Functional;
  std::vector<size_t> out_args;  // schema indices of out= tensors
  // InPlace: schema indices of the mutated (non-out) Tensor / Tensor[] args.
  // The rule returns one value per mutated tensor, lists flattened.
  std::vector<size_t> mutable_args;
};

std::unordered_map<c10::OperatorName, OpDesc>& Ops() {
  static auto* ops = new std::unordered_map<c10::OperatorName, OpDesc>();
  return *ops;
}

std::string FullName(const c10::FunctionSchema& s) {
  std::string n = s.name().substr(s.name().find("::") + 2);
  return s.overload_name().empty() ? n : n + "." + s.overload_name();
}

// ---------------------------------------------------------------- the plan

// How one call maps onto module parameters and storage writes. Computed for
// every call (cheap); the module is built from it only on a cache miss.
struct Param {
  enum class Kind { Storage, Offset, Scalar, Rng, CpuTensor } kind;
  size_t storage = 0;        // Storage: index into storages
  int64_t offset = 0;        // Offset
  c10::Scalar scalar;        // Scalar
  ElementType dtype = ElementType::F32;
  uint64_t rng[2] = {0, 0};  // Rng
  at::Tensor cpu;            // CpuTensor
};

struct TensorIn {
  size_t storage;  // index into storages
  ElementType dtype;
  lowering::ViewGeometry geometry;
  int offset_param = -1;
  int storage_param = -1;
};

struct ArgPlan {
  Arg::Kind kind = Arg::Kind::None;
  std::vector<int> tensors;  // indices into inputs (-1: None in Tensor?[])
  int param = -1;            // Scalar / Rng / CpuTensor
  Arg literal;
};

struct Dest {
  at::Tensor tensor;  // undefined for fresh functional outputs
  size_t storage = 0;
  lowering::ViewGeometry geometry;
  int offset_param = -1;
  ElementType dtype;
};

struct Plan {
  std::vector<DeviceStorage*> storages;
  std::vector<int> storage_param;  // per storage, -1 if not a parameter
  std::vector<Param> params;
  std::vector<TensorIn> inputs;
  std::vector<ArgPlan> args;
  std::string key;
  int device = -1;
  bool any_f64 = false;
};

// ---------------------------------------------------------------- fused eager

// The module being recorded in fused mode. Storage values produced by
// recorded ops are `pending` Values in it; storages read before being
// written are parameters bound to their current buffers.
struct Recorder {
  std::unique_ptr<hlo::Builder> b;
  int device = -1;
  std::string key;
  size_t num_ops = 0;
  std::vector<pjrt::BufferPtr> args;                       // per parameter
  std::vector<Value> param_values;                         // per parameter
  std::unordered_map<DeviceStorage*, int> storage_param;   // storage -> parameter
  std::vector<DeviceStorage*> pending;                     // storages with new values
  std::vector<std::pair<Value, std::string>> checks;
};

Recorder& Rec() {
  static auto* r = new Recorder();
  return *r;
}

// Process-wide (autograd runs backward ops on its own device thread, and they
// must join the same recording). -1: follow the environment.
std::atomic<int> g_fusion_override{-1};

bool FusionFromEnv() {
  static const bool on = [] {
    const char* v = std::getenv("TORCH_TPU_DEFER_AND_FUSE");
    return v && std::string(v) == "1";
  }();
  return on;
}

size_t MaxChain() {
  static const size_t n = [] {
    const char* v = std::getenv("TORCH_TPU_FUSE_MAX_OPS");
    return v ? static_cast<size_t>(std::stoul(v)) : size_t{512};
  }();
  return n;
}

void PrepareForOp(DeviceStorage* s, ElementType t) {
  if (s->pending && s->dtype == t && s->device == Rec().device && FusionEnabled() &&
      !GetRuntime().launch_blocking())
    return;  // stays pending: the op is recorded too
  PrepareStorage(s, t);
}

size_t StorageIndex(Plan& p, DeviceStorage* s) {
  for (size_t i = 0; i < p.storages.size(); ++i)
    if (p.storages[i] == s) return i;
  p.storages.push_back(s);
  p.storage_param.push_back(-1);
  return p.storages.size() - 1;
}

int AddParam(Plan& p, Param param) {
  p.params.push_back(std::move(param));
  return static_cast<int>(p.params.size()) - 1;
}

int StorageParam(Plan& p, size_t storage) {
  if (p.storage_param[storage] < 0) {
    Param q{Param::Kind::Storage};
    q.storage = storage;
    q.dtype = p.storages[storage]->dtype;
    p.storage_param[storage] = AddParam(p, q);
  }
  return p.storage_param[storage];
}

void CheckDevice(Plan& p, const at::Tensor& t, const std::string& op) {
  int d = t.device().index();
  if (p.device < 0) p.device = d;
  TORCH_CHECK(p.device == d, "Expected all tensors to be on the same device, but found at "
              "least two devices, tpu:", p.device, " and tpu:", d, "! (when checking ",
              op, ")");
}

int AddTensor(Plan& p, const at::Tensor& t, const std::string& op) {
  CheckDevice(p, t, op);
  ElementType dtype = ToElementType(t.scalar_type(), op.c_str());
  if (dtype == ElementType::F64 || dtype == ElementType::C128) p.any_f64 = true;
  DeviceStorage* s = StorageOf(t);
  PrepareForOp(s, dtype);
  TensorIn in{StorageIndex(p, s), dtype, GeometryOf(t)};
  in.storage_param = StorageParam(p, in.storage);
  if (!in.geometry.whole) {
    Param q{Param::Kind::Offset};
    q.offset = t.storage_offset();
    in.offset_param = AddParam(p, q);
  }
  p.key += "T" + std::to_string(in.storage) + hlo::Name(dtype) + in.geometry.key();
  p.inputs.push_back(in);
  return static_cast<int>(p.inputs.size()) - 1;
}

ElementType ScalarCategory(const c10::Scalar& s) {
  if (s.isBoolean()) return ElementType::Bool;
  if (s.isIntegral(false)) return ElementType::I64;
  if (s.isFloatingPoint()) return ElementType::F64;
  return ElementType::C128;  // complex: c10::Scalar holds a complex<double>
}

// A scalar's exact value as text (hex floats), for cache keys.
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

ArgPlan ScalarArg(Plan& p, const c10::Scalar& s) {
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

ArgPlan TensorArg(Plan& p, const at::Tensor& t, const std::string& op) {
  ArgPlan a;
  if (t.device().type() == c10::DeviceType::PrivateUse1) {
    a.kind = Arg::Kind::Tensor;
    a.tensors.push_back(AddTensor(p, t, op));
    return a;
  }
  TORCH_CHECK(t.device().is_cpu() && t.dim() == 0,
              "Expected all tensors to be on the same device, but found at least two "
              "devices, tpu and ", t.device(), "! (when checking argument for ", op, ")");
  if (t.unsafeGetTensorImpl()->is_wrapped_number()) return ScalarArg(p, t.item());
  a.kind = Arg::Kind::Tensor;
  a.literal.is_cpu_scalar = true;
  Param q{Param::Kind::CpuTensor};
  q.cpu = t;
  q.dtype = ToElementType(t.scalar_type(), op.c_str());
  a.param = AddParam(p, q);
  p.key += std::string("C") + hlo::Name(q.dtype);
  return a;
}

c10::TypePtr Unwrap(const c10::TypePtr& t) {
  if (t->kind() == c10::TypeKind::OptionalType) return t->castRaw<c10::OptionalType>()->getElementType();
  return t;
}

std::vector<int64_t> IntList(const c10::IValue& v) {
  if (v.isIntList()) return v.toIntVector();
  std::vector<int64_t> out;
  for (const auto& e : v.toListRef()) out.push_back(e.isInt() ? e.toInt() : e.toSymInt().expect_int());
  return out;
}

ArgPlan PlanArg(Plan& p, const c10::Argument& arg, const c10::IValue& v, const std::string& op,
                bool runtime_floats) {
  ArgPlan a;
  if (v.isNone() || (v.isTensor() && !v.toTensor().defined())) {
    p.key += "N";
    return a;
  }
  c10::TypePtr type = Unwrap(arg.real_type());
  switch (type->kind()) {
    case c10::TypeKind::TensorType:
      return TensorArg(p, v.toTensor(), op);
    case c10::TypeKind::NumberType:
      return ScalarArg(p, v.toScalar());
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType:
      a.kind = Arg::Kind::Int;
      a.literal.i = v.isInt() ? v.toInt() : v.toSymInt().expect_int();
      p.key += "I" + std::to_string(a.literal.i);
      return a;
    case c10::TypeKind::FloatType:
      a.kind = Arg::Kind::Double;
      a.literal.d = v.toDouble();
      if (runtime_floats) {  // also a runtime parameter; the value stays out of the key
        Param q{Param::Kind::Scalar};
        q.scalar = v.toDouble();
        q.dtype = ElementType::F64;
        a.param = AddParam(p, q);
        p.key += "d";
      } else {
        p.key += "D" + ExactString(c10::Scalar(a.literal.d));
      }
      return a;
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
    case c10::TypeKind::GeneratorType: {
      a.kind = Arg::Kind::Generator;
      Param q{Param::Kind::Rng};
      a.param = AddParam(p, q);  // filled in Run() once numel is known
      p.key += "G";
      return a;
    }
    case c10::TypeKind::ListType: {
      c10::TypePtr elem = Unwrap(type->castRaw<c10::ListType>()->getElementType());
      if (elem->kind() == c10::TypeKind::TensorType) {
        a.kind = Arg::Kind::TensorList;
        p.key += "[";
        for (const auto& e : v.toListRef()) {
          if (e.isNone() || (e.isTensor() && !e.toTensor().defined())) {
            a.tensors.push_back(-1);
            p.key += "N";
            continue;
          }
          ArgPlan t = TensorArg(p, e.toTensor(), op);
          if (t.kind != Arg::Kind::Tensor || t.tensors.empty())
            throw lowering::Unsupported(op + ": CPU tensors inside a tensor list");
          a.tensors.push_back(t.tensors[0]);
        }
        p.key += "]";
        return a;
      }
      if (elem->kind() == c10::TypeKind::IntType || elem->kind() == c10::TypeKind::SymIntType) {
        a.kind = Arg::Kind::IntList;
        a.literal.ints = IntList(v);
        p.key += "L" + hlo::Ints(a.literal.ints);
        return a;
      }
      if (elem->kind() == c10::TypeKind::NumberType) {  // Scalar[]: runtime params
        a.kind = Arg::Kind::ScalarList;
        p.key += "[";
        for (const auto& e : v.toListRef()) {
          ArgPlan sa = ScalarArg(p, e.toScalar());
          a.tensors.push_back(sa.param);
          a.literal.ints.push_back(static_cast<int64_t>(sa.literal.scalar_type));
        }
        p.key += "]";
        return a;
      }
      if (elem->kind() == c10::TypeKind::BoolType) {
        a.kind = Arg::Kind::IntList;
        for (bool b : v.toBoolList()) a.literal.ints.push_back(b);
        p.key += "L" + hlo::Ints(a.literal.ints);
        return a;
      }
      break;
    }
    default:
      break;
  }
  throw lowering::Unsupported(op + ": argument '" + arg.name() + "' of type " + type->str() +
                              " is not supported natively");
}

// ---------------------------------------------------------------- cache

struct OutputSpec {
  std::vector<int64_t> sizes, strides;
  at::ScalarType dtype;
  // An output the op does not produce for these arguments (e.g.
  // convolution_backward with output_mask false): returned undefined, not
  // listed in the rule's ctx.outputs.
  bool defined = true;
};

struct Compiled {
  pjrt::ExecutablePtr exe;
  std::vector<OutputSpec> outputs;  // functional results (meta)
  std::vector<std::string> checks;  // device-side assertions, last outputs
};

std::unordered_map<std::string, Compiled>& Compiled_() {
  static auto* m = new std::unordered_map<std::string, Compiled>();
  return *m;
}

// _grouped_mm's meta kernel accepts bf16 operands only, while PyTorch's CPU
// kernel and our rule also take f32 and f16: their output spec is computed
// here, with the CPU kernel's checks. Empty for every other call.
std::optional<std::vector<OutputSpec>> GroupedMmOutputs(const c10::OperatorHandle& op,
                                                        const std::vector<c10::IValue>& args) {
  if (op.schema().name() != "aten::_grouped_mm" || args.size() < 5) return std::nullopt;
  const at::Tensor& a = args[0].toTensor();
  const at::Tensor& b = args[1].toTensor();
  if (a.scalar_type() == at::kBFloat16 && b.scalar_type() == at::kBFloat16) return std::nullopt;
  TORCH_CHECK(a.scalar_type() == at::kFloat || a.scalar_type() == at::kHalf ||
                  a.scalar_type() == at::kBFloat16,
              "Expected mat_a to be Float32, BFloat16 or Float16 matrix, got ", a.scalar_type());
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "expected mat_a and mat_b to have the same dtype, but got: ",
              a.scalar_type(), " != ", b.scalar_type());
  TORCH_CHECK((a.dim() == 2 || a.dim() == 3) && (b.dim() == 2 || b.dim() == 3),
              "Multiplicands must be 2D or 3D but got mat_a.dim()=", a.dim(), " and mat_b.dim()=", b.dim());
  TORCH_CHECK(a.size(-1) == b.size(-2), "contraction dimension of mat_a and mat_b must match");
  bool has_offs = args[2].isTensor() && args[2].toTensor().defined();
  if (a.dim() == 2 || b.dim() == 2) {
    TORCH_CHECK(has_offs, "Offsets tensor not provided, but is needed for ", a.dim(), "D/", b.dim(),
                "D multiplicand layouts.");
    const at::Tensor& offs = args[2].toTensor();
    TORCH_CHECK(offs.dim() == 1, "Offsets tensor must be 1D, but got offs.dim()=", offs.dim(), ".");
    TORCH_CHECK(offs.scalar_type() == at::kInt, "Offsets have to be int32");
  } else {
    TORCH_CHECK(!has_offs, "Offsets tensor provided, but is not needed for 3D/3D multiplicand layouts.");
    TORCH_CHECK(a.size(0) == b.size(0), "batch sizes of mat_a and mat_b must match");
  }
  TORCH_CHECK(!(args[3].isTensor() && args[3].toTensor().defined()),
              "Bias tensor provided, but it is not supported yet.");
  TORCH_CHECK(args[4].isNone() || args[4].toScalarType() == a.scalar_type(),
              "Grouped gemm output dtype must match `mat_a` dtype");
  std::vector<int64_t> sizes;
  if (a.dim() == 2 && b.dim() == 3) sizes = {a.size(0), b.size(2)};
  else if (a.dim() == 3 && b.dim() == 2) sizes = {a.size(1), b.size(1)};
  else if (a.dim() == 2) sizes = {args[2].toTensor().size(0), a.size(0), b.size(1)};
  else sizes = {a.size(0), a.size(1), b.size(2)};
  OutputSpec out{sizes, lowering::ContiguousStrides(sizes), a.scalar_type()};
  return std::vector<OutputSpec>{out};
}

// Output specs from PyTorch's meta kernel for this call.
std::vector<OutputSpec> MetaOutputs(const c10::OperatorHandle& op,
                                    const std::vector<c10::IValue>& args) {
  if (auto special = GroupedMmOutputs(op, args)) return *special;
  auto to_meta = [](const c10::IValue& v) -> c10::IValue {
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined() || t.device().type() != c10::DeviceType::PrivateUse1) return v;
      return at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta));
    }
    if (v.isTensorList()) {
      std::vector<at::Tensor> out;
      for (const at::Tensor& t : v.toTensorVector())
        out.push_back(t.device().type() == c10::DeviceType::PrivateUse1
                          ? at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta))
                          : t);
      return out;
    }
    if (v.isList()) {
      auto list = v.toList();
      if (list.elementType()->kind() == c10::TypeKind::OptionalType) {
        c10::List<std::optional<at::Tensor>> out;
        for (const auto& e : list) {
          c10::IValue ev = e;
          if (ev.isNone() || (ev.isTensor() && !ev.toTensor().defined())) {
            out.push_back(std::nullopt);
          } else {
            const at::Tensor& t = ev.toTensor();
            out.push_back(t.device().type() == c10::DeviceType::PrivateUse1
                              ? at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta))
                              : t);
          }
        }
        return out;
      }
    }
    if (v.isGenerator()) return c10::IValue();
    if (v.isDevice()) return c10::IValue(c10::Device(at::kMeta));
    return v;
  };
  torch::jit::Stack stack;
  for (const auto& v : args) stack.push_back(to_meta(v));
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.callBoxed(stack);
  }
  std::vector<OutputSpec> outs;
  for (const auto& r : stack) {
    if (r.isTensor()) {
      const at::Tensor& t = r.toTensor();
      if (!t.defined()) {
        outs.push_back({{}, {}, at::kFloat, false});
        continue;
      }
      outs.push_back({t.sizes().vec(), t.strides().vec(), t.scalar_type()});
    } else if (r.isNone()) {
      outs.push_back({{}, {}, at::kFloat, false});
    } else if (r.isTensorList()) {
      for (const at::Tensor& t : r.toTensorVector())
        outs.push_back({t.sizes().vec(), t.strides().vec(), t.scalar_type()});
    } else {
      throw lowering::Unsupported("op returns a non-tensor value");
    }
  }
  return outs;
}

std::string PrefixedMessage(const std::string& op, const char* what) {
  return op + ": " + what;
}

// ---------------------------------------------------------------- run

// Runs `desc` on `args` (the op's arguments, in schema order) and returns
// the op's results.
std::vector<c10::IValue> Run(const OpDesc& desc, const c10::OperatorHandle& op,
                             const std::vector<c10::IValue>& args) {
  auto& rt = GetRuntime();
  const auto& schema = op.schema();
  const std::string& name = desc.name;
  Plan plan;
  plan.key = name + "|";
  std::vector<bool> is_out(args.size() + 1, false);
  for (size_t i : desc.out_args) is_out[i] = true;
  for (size_t i = 0; i < args.size(); ++i) {
    if (is_out[i]) {
      plan.args.emplace_back();
      continue;
    }
    plan.args.push_back(PlanArg(plan, schema.arguments()[i], args[i], name,
                                desc.rule->IsRuntimeFloat(schema.arguments()[i].name())));
  }

  // Destinations: self for in-place, out= tensors, or fresh tensors.
  std::vector<at::Tensor> dest_tensors;
  if (desc.variant == Variant::InPlace) {
    for (size_t i : desc.mutable_args) {
      if (args[i].isTensor()) {
        if (args[i].toTensor().defined()) dest_tensors.push_back(args[i].toTensor());
      } else if (args[i].isTensorList()) {
        for (const at::Tensor& t : args[i].toTensorVector()) dest_tensors.push_back(t);
      }
    }
  } else if (desc.variant == Variant::Out) {
    for (size_t i : desc.out_args) {
      const at::Tensor& t = args[i].toTensor();
      TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1, name,
                  ": out= tensor must be on tpu, got ", t.device());
      CheckDevice(plan, t, name);
      dest_tensors.push_back(t);
    }
  }
  if (plan.device < 0) plan.device = CurrentDevice();
  for (const auto& t : dest_tensors)
    plan.key += "O" + std::to_string(static_cast<int>(t.scalar_type())) + hlo::Ints(t.sizes().vec()) +
                "/" + hlo::Ints(t.strides().vec());

  // Writes into existing tensors (in-place self, out= tensors).
  std::vector<Dest> dests;
  for (const at::Tensor& t : dest_tensors) {
    Dest d;
    d.tensor = t;
    d.dtype = ToElementType(t.scalar_type(), name.c_str());
    DeviceStorage* s = StorageOf(t);
    PrepareForOp(s, d.dtype);
    d.storage = StorageIndex(plan, s);
    d.geometry = GeometryOf(t);
    if (!d.geometry.whole) {  // a partial write needs the old storage value
      StorageParam(plan, d.storage);
      Param q{Param::Kind::Offset};
      q.offset = t.storage_offset();
      d.offset_param = AddParam(plan, q);
    }
    plan.key += "W" + std::to_string(d.storage) + d.geometry.key();
    dests.push_back(d);
  }
  // Generators appear as None when not given: they still need a state param.
  for (size_t i = 0; i < plan.args.size(); ++i) {
    if (plan.args[i].kind != Arg::Kind::None || is_out[i]) continue;
    if (Unwrap(schema.arguments()[i].real_type())->kind() != c10::TypeKind::GeneratorType) continue;
    plan.args[i].kind = Arg::Kind::Generator;
    plan.args[i].param = AddParam(plan, Param{Param::Kind::Rng});
    plan.key += "G";
  }
  // Random rules of ops without a generator argument (native_dropout, ...)
  // draw from the default generator: an extra, last argument.
  if (desc.rule->random) {
    bool has_generator = false;
    for (const auto& a : plan.args) has_generator |= a.kind == Arg::Kind::Generator;
    if (!has_generator) {
      ArgPlan g;
      g.kind = Arg::Kind::Generator;
      g.param = AddParam(plan, Param{Param::Kind::Rng});
      plan.args.push_back(g);
      plan.key += "G";
    }
  }
  // fp32 matmul precision is baked into dot_general.
  plan.key += at::globalContext().float32MatmulPrecision() == at::Float32MatmulPrecision::HIGHEST
                  ? "|hi"
                  : "|lo";
  // Without tensor inputs (arange.out and the like) scalars can decide the
  // output shape, which meta computes once per key: make them part of it.
  if (plan.inputs.empty()) {
    for (const auto& q : plan.params)
      if (q.kind == Param::Kind::Scalar) plan.key += "=" + ExactString(q.scalar) + ";";
  }
  // Float scalars run in f32 unless an f64 tensor takes part.
  for (auto& q : plan.params)
    if (q.kind == Param::Kind::Scalar && q.dtype == ElementType::F64 && !plan.any_f64)
      q.dtype = ElementType::F32;
    else if (q.kind == Param::Kind::Scalar && q.dtype == ElementType::C128 && !plan.any_f64)
      q.dtype = ElementType::C64;
  plan.key += plan.any_f64 ? "|f64" : "|f32";

  // Executables are compiled for one device: the same op on another device
  // is another entry (device 0 keeps the plain key).
  if (plan.device != 0) plan.key += "|@" + std::to_string(plan.device);

  // Output specs: cached with the executable (meta only runs on a miss).
  auto& cache = Compiled_();
  auto hit = cache.find(plan.key);
  const bool was_hit = hit != cache.end();
  std::vector<OutputSpec> specs;
  std::vector<bool> undefined_outputs;  // per meta output (functional ops)
  if (desc.variant == Variant::InPlace) {
    // Mutating ops: the returns that are not aliases of a mutated argument
    // are fresh outputs (batch norm's out, mean, rstd) and come first; then
    // the mutated tensors themselves. Meta runs once per signature (it also
    // raises the same errors as CPU).
    if (was_hit) {
      specs = hit->second.outputs;
    } else {
      std::vector<OutputSpec> meta;
      try {
        meta = MetaOutputs(op, args);
      } catch (const c10::NotImplementedError&) {
        // No meta kernel at all (_fused_sgd_): fine for an op that returns
        // nothing (no fresh outputs to size); the rule validates.
        if (!schema.returns().empty()) throw;
      }
      const auto& returns = schema.returns();
      for (size_t j = 0; j < returns.size() && j < meta.size(); ++j)
        if (!returns[j].alias_info()) specs.push_back(meta[j]);
    }
    std::vector<Dest> fresh(specs.size());
    for (size_t j = 0; j < specs.size(); ++j)
      fresh[j].dtype = ToElementType(specs[j].dtype, name.c_str());
    dests.insert(dests.begin(), fresh.begin(), fresh.end());
    for (const at::Tensor& t : dest_tensors)
      specs.push_back({t.sizes().vec(), t.strides().vec(), t.scalar_type()});
  } else {
    specs = was_hit ? hit->second.outputs : MetaOutputs(op, args);
    // Undefined outputs: remembered for the results, invisible to the rule.
    for (size_t i = 0; i < specs.size(); ++i) undefined_outputs.push_back(!specs[i].defined);
    specs.erase(std::remove_if(specs.begin(), specs.end(),
                               [](const OutputSpec& o) { return !o.defined; }),
                specs.end());
  }

  // Out= tensors take the result's shape (resize like ATen does).
  if (desc.variant == Variant::Out) {
    for (size_t i = 0; i < dest_tensors.size() && i < specs.size(); ++i) {
      if (dest_tensors[i].sizes().vec() != specs[i].sizes) {
        at::native::resize_output(dest_tensors[i], specs[i].sizes);
        return Run(desc, op, args);  // new geometry: plan again
      }
    }
  }
  TORCH_CHECK(desc.variant == Variant::Functional || dests.size() == specs.size(), name,
              ": expected ", dests.size(), " results, meta gave ", specs.size());
  if (desc.variant == Variant::Functional) {
    for (const auto& spec : specs) {
      Dest d;
      d.dtype = ToElementType(spec.dtype, name.c_str());
      dests.push_back(d);
    }
  }

  // RNG: advance the generator by the number of values drawn. Ops whose only
  // randomness is dropout (the SDPA kernels) draw nothing at dropout_p == 0,
  // as on CPU and CUDA: the generator stays where it was.
  auto draws = [&]() -> uint64_t {
    for (size_t i = 0; i < args.size() && i < schema.arguments().size(); ++i)
      if (schema.arguments()[i].name() == "dropout_p" && args[i].isDouble() &&
          args[i].toDouble() == 0.0)
        return 0;
    int64_t numel = 1;
    for (const auto& s : specs)
      for (int64_t n : s.sizes) numel *= n;
    return static_cast<uint64_t>(numel) + 1;
  };
  for (size_t i = 0; i < plan.args.size(); ++i) {
    if (plan.args[i].kind != Arg::Kind::Generator) continue;
    std::optional<at::Generator> gen;
    if (i < args.size() && args[i].isGenerator()) gen = args[i].toGenerator();
    auto [seed, offset] = NextRngState(gen, plan.device, draws());
    plan.params[plan.args[i].param].rng[0] = seed;
    plan.params[plan.args[i].param].rng[1] = offset;
  }

  // Which storages are written, in order: they are the module's results.
  std::vector<size_t> written;  // storage indices (existing) ; fresh outputs appended
  for (const auto& d : dests)
    if (d.tensor.defined() &&
        std::find(written.begin(), written.end(), d.storage) == written.end())
      written.push_back(d.storage);

  // Emits the op into `b` given a Value per plan parameter. Returns the new
  // values of the written storages, then the fresh outputs (flat storage
  // values), and the device assertions.
  struct Emitted {
    std::vector<Value> written_values, fresh_values;
    std::vector<lowering::Context::Check> checks;
  };
  auto emit = [&](hlo::Builder& b, const std::vector<Value>& params) -> Emitted {
    auto read = [&](int idx) {
      const TensorIn& in = plan.inputs[idx];
      Value storage = params[plan.storage_param[in.storage]];
      Value offset = in.offset_param >= 0 ? params[in.offset_param] : Value();
      return lowering::ReadView(b, storage, offset, in.geometry);
    };
    std::vector<Arg> rule_args;
    for (size_t i = 0; i < plan.args.size(); ++i) {
      const ArgPlan& ap = plan.args[i];
      if (is_out[i]) continue;
      Arg a = ap.literal;
      a.kind = ap.kind;
      if (ap.kind == Arg::Kind::Tensor) {
        a.tensor = ap.param >= 0 ? params[ap.param] : read(ap.tensors[0]);
      } else if (ap.kind == Arg::Kind::TensorList) {
        for (int t : ap.tensors) a.tensors.push_back(t >= 0 ? read(t) : Value());
      } else if (ap.kind == Arg::Kind::Scalar || ap.kind == Arg::Kind::Generator) {
        a.tensor = params[ap.param];
      } else if (ap.kind == Arg::Kind::Double && ap.param >= 0) {
        a.tensor = params[ap.param];
      } else if (ap.kind == Arg::Kind::ScalarList) {
        for (size_t k = 0; k < ap.tensors.size(); ++k) a.tensors.push_back(params[ap.tensors[k]]);
        a.ints = ap.literal.ints;  // each element's category (ElementType)
      }
      rule_args.push_back(a);
    }
    lowering::Context ctx{b};
    ctx.op = name;
    ctx.fp32_highest = at::globalContext().float32MatmulPrecision() == at::Float32MatmulPrecision::HIGHEST;
    for (const auto& s : specs)
      ctx.outputs.push_back(TensorType{ToElementType(s.dtype, name.c_str()), s.sizes});
    std::vector<Value> results = desc.rule->rule(ctx, rule_args);
    // A rule may return every output in the op's order, including those the
    // op leaves undefined for these arguments: keep the defined ones.
    if (results.size() == undefined_outputs.size() && results.size() > specs.size()) {
      std::vector<Value> kept;
      for (size_t i = 0; i < results.size(); ++i)
        if (!undefined_outputs[i]) kept.push_back(results[i]);
      results = kept;
    }
    TORCH_CHECK(results.size() >= specs.size(), name, ": lowering rule returned ",
                results.size(), " values, expected ", specs.size());
    std::vector<Value> current(plan.storages.size());
    for (size_t s = 0; s < plan.storages.size(); ++s)
      if (plan.storage_param[s] >= 0) current[s] = params[plan.storage_param[s]];
    Emitted e;
    for (size_t i = 0; i < specs.size(); ++i) {
      Value v = results[i];
      TORCH_CHECK(v.shape() == specs[i].sizes, name, ": lowering rule produced ",
                  v.type.str(), " but PyTorch expects shape [", hlo::Ints(specs[i].sizes), "]");
      v = b.Convert(v, dests[i].dtype);
      if (!dests[i].tensor.defined()) {
        lowering::ViewGeometry g;
        g.sizes = specs[i].sizes;
        g.strides = specs[i].strides;
        int64_t n = static_cast<int64_t>(
            at::detail::computeStorageNbytes(specs[i].sizes, specs[i].strides, 1));
        g.storage_numel = n;
        g.whole = g.strides == lowering::ContiguousStrides(g.sizes) || v.type.numel() == n;
        if (v.type.numel() == n && g.strides != lowering::ContiguousStrides(g.sizes)) g.whole = false;
        Value base = g.whole ? Value() : b.Splat(v.dtype(), 0, {n});
        Value zero = g.whole ? Value() : b.ConstantInt(ElementType::I64, 0);
        e.fresh_values.push_back(g.whole ? b.Reshape(v, {n}) : lowering::WriteView(b, base, zero, g, v));
        continue;
      }
      Value offset = dests[i].offset_param >= 0 ? params[dests[i].offset_param] : Value();
      current[dests[i].storage] =
          lowering::WriteView(b, current[dests[i].storage], offset, dests[i].geometry, v);
    }
    for (size_t k = 0; k < written.size(); ++k) e.written_values.push_back(current[written[k]]);
    e.checks = ctx.checks;
    return e;
  };

  // Runtime values of the non-storage parameters.
  auto upload = [&](const Param& q) -> pjrt::BufferPtr {
    switch (q.kind) {
      case Param::Kind::Offset:
        return rt.UploadInt(q.offset, ElementType::I64, plan.device);
      case Param::Kind::Scalar:
        if (q.dtype == ElementType::F32 || q.dtype == ElementType::F64)
          return rt.UploadScalar(q.scalar.toDouble(), q.dtype, plan.device);
        if (hlo::IsComplex(q.dtype)) {  // complex Python scalars
          at::Tensor c = at::scalar_tensor(q.scalar, ToScalarType(q.dtype));
          return rt.Upload(c.data_ptr(), q.dtype, {}, plan.device);
        }
        return rt.UploadInt(q.dtype == ElementType::Bool ? q.scalar.toBool() : q.scalar.toLong(),
                            q.dtype, plan.device);
      case Param::Kind::CpuTensor: {
        at::Tensor c = q.cpu.contiguous();
        return rt.Upload(c.data_ptr(), q.dtype, {}, plan.device);
      }
      case Param::Kind::Rng:
        return rt.Upload(q.rng, ElementType::U64, {2}, plan.device);
      case Param::Kind::Storage:
        break;
    }
    return plan.storages[q.storage]->buffer;
  };
  auto param_type = [&](const Param& q) -> TensorType {
    switch (q.kind) {
      case Param::Kind::Storage:
        return {plan.storages[q.storage]->dtype, {plan.storages[q.storage]->numel()}};
      case Param::Kind::Offset:
        return {ElementType::I64, {}};
      case Param::Kind::Rng:
        return {ElementType::U64, {2}};
      default:
        return {q.dtype, {}};
    }
  };
  std::vector<OutputSpec> cached_specs = specs;  // InPlace: only the fresh ones
  if (desc.variant == Variant::InPlace) cached_specs.resize(specs.size() - dest_tensors.size());
  if (!undefined_outputs.empty()) {  // put the undefined ones back, in place
    std::vector<OutputSpec> all;
    size_t k = 0;
    for (bool undefined : undefined_outputs)
      all.push_back(undefined ? OutputSpec{{}, {}, at::kFloat, false} : cached_specs[k++]);
    cached_specs = all;
  }
  // Results in the op's order, with undefined tensors where it has none.
  auto with_undefined = [&](std::vector<c10::IValue> results) {
    if (std::find(undefined_outputs.begin(), undefined_outputs.end(), true) ==
        undefined_outputs.end())
      return results;
    std::vector<c10::IValue> all;
    size_t k = 0;
    for (bool undefined : undefined_outputs)
      all.push_back(undefined ? c10::IValue(at::Tensor()) : results[k++]);
    return all;
  };
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, plan.device));
  auto fresh_tensor = [&](size_t i) {
    at::Tensor t = at::empty_strided(
        specs[i].sizes, specs[i].strides,
        at::TensorOptions().dtype(specs[i].dtype).device(c10::DeviceType::PrivateUse1, plan.device));
    StorageOf(t)->dtype = dests[i].dtype;
    return t;
  };

  // ---- fused eager: record into the pending module.
  if (FusionEnabled() && !rt.launch_blocking()) {
    Recorder& rec = Rec();
    if (rec.b && rec.device != plan.device) FlushPending();
    if (!rec.b) {
      rec.b = std::make_unique<hlo::Builder>("fused");
      rec.device = plan.device;
    }
    if (!was_hit) cache[plan.key] = Compiled{nullptr, cached_specs, {}};
    std::string key = plan.key + "#";
    std::vector<Value> params;
    for (const Param& q : plan.params) {
      if (q.kind == Param::Kind::Storage) {
        DeviceStorage* st = plan.storages[q.storage];
        if (st->pending) {
          params.push_back(st->pending_value);
          key += "v" + std::to_string(st->pending_value.id) + ",";
          continue;
        }
        auto it = rec.storage_param.find(st);
        if (it == rec.storage_param.end()) {
          it = rec.storage_param.emplace(st, rec.b->num_parameters()).first;
          rec.param_values.push_back(rec.b->Parameter(param_type(q)));
          rec.args.push_back(st->buffer);
        }
        params.push_back(rec.param_values[it->second]);
        key += "p" + std::to_string(it->second) + ",";
        continue;
      }
      int index = rec.b->num_parameters();
      rec.param_values.push_back(rec.b->Parameter(param_type(q)));
      params.push_back(rec.param_values.back());
      rec.args.push_back(upload(q));
      key += "p" + std::to_string(index) + ",";
    }
    Emitted e = emit(*rec.b, params);
    rec.key += key + ";";
    ++rec.num_ops;
    auto mark = [&](DeviceStorage* st, Value v) {
      if (!st->pending) rec.pending.push_back(st);
      st->pending = true;
      st->pending_value = v;
    };
    for (size_t k = 0; k < written.size(); ++k) mark(plan.storages[written[k]], e.written_values[k]);
    for (const auto& c : e.checks) rec.checks.emplace_back(c.ok, name + ": " + c.message);
    ++rt.stats().native_ops[name];
    std::vector<c10::IValue> results;
    size_t fresh = 0;
    for (size_t i = 0; i < specs.size(); ++i) {
      if (dests[i].tensor.defined()) {
        results.push_back(dests[i].tensor);
        continue;
      }
      at::Tensor t = fresh_tensor(i);
      mark(StorageOf(t), e.fresh_values[fresh++]);
      results.push_back(t);
    }
    if (rec.num_ops >= MaxChain()) FlushPending();
    return with_undefined(std::move(results));
  }

  // ---- strict eager: one module per op.
  std::vector<std::string> check_messages;
  auto build = [&]() -> std::string {
    hlo::Builder b(name == "_tpu_copy" ? "copy" : "op");
    std::vector<Value> params;
    for (const auto& q : plan.params) params.push_back(b.Parameter(param_type(q)));
    Emitted e = emit(b, params);
    std::vector<Value> outs = e.written_values;
    for (size_t k = 0; k < written.size(); ++k) {
      int p = plan.storage_param[written[k]];
      if (p >= 0) b.SetParameterAttrs(p, "tf.aliasing_output = " + std::to_string(k) + " : i32");
    }
    outs.insert(outs.end(), e.fresh_values.begin(), e.fresh_values.end());
    for (const auto& check : e.checks) {
      outs.push_back(check.ok);
      check_messages.push_back(check.message);
    }
    b.Return(outs);
    return b.ToText();
  };

  pjrt::ExecutablePtr exe;
  if (was_hit && hit->second.exe) {
    exe = hit->second.exe;
    ++rt.stats().cache_hits;
  } else {
    exe = rt.GetOrCompile(plan.key, plan.device, build);
    cache[plan.key] = Compiled{exe, cached_specs, check_messages};
  }

  // Arguments.
  std::vector<pjrt::BufferPtr> keep;
  std::vector<PJRT_Buffer*> buffers;
  std::vector<int64_t> non_donatable;
  for (size_t i = 0; i < plan.params.size(); ++i) {
    const Param& q = plan.params[i];
    keep.push_back(upload(q));
    buffers.push_back(keep.back()->raw());
    bool donated = q.kind == Param::Kind::Storage &&
                   std::find(written.begin(), written.end(), q.storage) != written.end();
    if (!donated) non_donatable.push_back(static_cast<int64_t>(i));
  }
  auto outs = rt.Execute(*exe, buffers, non_donatable, name);
  ++rt.stats().native_ops[name];
  const std::vector<std::string>& checks = cache.at(plan.key).checks;
  for (size_t i = 0; i < checks.size(); ++i)
    rt.AddAssertion(outs[outs.size() - checks.size() + i], name + ": " + checks[i]);

  for (size_t k = 0; k < written.size(); ++k) plan.storages[written[k]]->buffer = outs[k];
  std::vector<c10::IValue> results;
  size_t fresh = written.size();
  for (size_t i = 0; i < specs.size(); ++i) {
    if (dests[i].tensor.defined()) {
      results.push_back(dests[i].tensor);
      continue;
    }
    at::Tensor t = fresh_tensor(i);
    StorageOf(t)->buffer = outs[fresh++];
    results.push_back(t);
  }
  return with_undefined(std::move(results));
}

void PushResults(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                 std::vector<c10::IValue> results) {
  const auto& returns = op.schema().returns();
  if (returns.size() == 1 && returns[0].real_type()->kind() == c10::TypeKind::ListType) {
    std::vector<at::Tensor> list;
    for (auto& r : results) list.push_back(r.toTensor());
    stack->push_back(list);
    return;
  }
  TORCH_CHECK(returns.size() == results.size() || returns.empty(), "internal: ", returns.size(),
              " returns expected, got ", results.size());
  if (returns.empty()) return;
  for (auto& r : results) stack->push_back(std::move(r));
}

// Run() returns fresh outputs then mutated tensors; a mutating op returns, in
// schema order, fresh outputs and aliases of its mutated arguments.
std::vector<c10::IValue> MutatingReturns(const OpDesc& desc, const c10::OperatorHandle& op,
                                         const std::vector<c10::IValue>& args,
                                         std::vector<c10::IValue> results) {
  const auto& schema = op.schema();
  std::vector<c10::IValue> out;
  size_t fresh = 0;
  for (const auto& r : schema.returns()) {
    if (!r.alias_info()) {
      out.push_back(results.at(fresh++));
      continue;
    }
    for (size_t i : desc.mutable_args) {
      if (*schema.arguments()[i].alias_info() == *r.alias_info()) {
        out.push_back(args[i]);
        break;
      }
    }
  }
  return out;
}

void GenericKernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  auto it = Ops().find(op.operator_name());
  TORCH_INTERNAL_ASSERT(it != Ops().end());
  const OpDesc& desc = it->second;
  size_t n = op.schema().arguments().size();
  std::vector<c10::IValue> args(stack->end() - n, stack->end());
  // x.conj() / _neg_view() inputs of ops the math-bit fallbacks let through
  // (mm, clone, _to_copy, ...) and a storage read with two dtypes (z * z.real):
  // resolved into plain tensors (complex.cpp).
  ResolveTensorInputs(args, desc.mutable_args, desc.out_args, desc.name);
  // Like TensorIterator on the CPU: no writes through a tensor whose elements
  // alias each other (expand()ed), except fills, which are idempotent.
  if (desc.variant != Variant::Functional && desc.name.rfind("fill", 0) != 0 &&
      desc.name.rfind("zero", 0) != 0) {
    for (size_t i : desc.mutable_args)
      if (args[i].isTensor() && args[i].toTensor().defined())
        at::assert_no_internal_overlap(args[i].toTensor());
    for (size_t i : desc.out_args) at::assert_no_internal_overlap(args[i].toTensor());
  }
  try {
    auto results = Run(desc, op, args);
    if (desc.variant == Variant::InPlace) results = MutatingReturns(desc, op, args, results);
    torch::jit::drop(*stack, n);
    PushResults(op, stack, std::move(results));
  } catch (const lowering::Unsupported& e) {
    RecordFallback(desc.name);
    CpuFallback(op, stack);
  } catch (const pjrt::Error& e) {
    TORCH_CHECK(false, PrefixedMessage(desc.name, e.what()));
  } catch (const std::out_of_range& e) {
    TORCH_CHECK_INDEX(false, PrefixedMessage(desc.name, e.what()));
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK(false, PrefixedMessage(desc.name, e.what()));
  } catch (const std::logic_error& e) {
    TORCH_CHECK(false, PrefixedMessage(desc.name, e.what()), " (torch_tpu lowering bug)");
  }
}

// ---------------------------------------------------------------- registration

bool IsOutArg(const c10::Argument& a) {
  return a.kwarg_only() && a.alias_info() && a.alias_info()->isWrite();
}

OpDesc Describe(const c10::FunctionSchema& schema, const lowering::RuleEntry* rule) {
  OpDesc d;
  d.name = FullName(schema);
  d.rule = rule;
  for (size_t i = 0; i < schema.arguments().size(); ++i)
    if (IsOutArg(schema.arguments()[i])) d.out_args.push_back(i);
  if (!d.out_args.empty()) {
    d.variant = Variant::Out;
  } else {
    for (size_t i = 0; i < schema.arguments().size(); ++i) {
      const auto& arg = schema.arguments()[i];
      if (arg.alias_info() && arg.alias_info()->isWrite()) d.mutable_args.push_back(i);
    }
    // native_batch_norm updates running_mean/running_var (args 3, 4) in
    // training although its schema has no alias annotation: its rule returns
    // their new values after the three outputs.
    if (d.name == "native_batch_norm") d.mutable_args = {3, 4};
    if (!d.mutable_args.empty()) d.variant = Variant::InPlace;
  }
  return d;
}

// Same argument names and types, ignoring out= args.
bool SameFunctionalArgs(const c10::FunctionSchema& a, const c10::FunctionSchema& b) {
  std::vector<const c10::Argument*> x, y;
  for (const auto& arg : a.arguments())
    if (!IsOutArg(arg)) x.push_back(&arg);
  for (const auto& arg : b.arguments())
    if (!IsOutArg(arg)) y.push_back(&arg);
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i)
    if (x[i]->name() != y[i]->name() || x[i]->type()->str() != y[i]->type()->str()) return false;
  return true;
}

std::vector<std::unique_ptr<torch::Library>>& Libraries() {
  static auto* libs = new std::vector<std::unique_ptr<torch::Library>>();
  return *libs;
}

}  // namespace

void SetFusion(bool enabled) {
  if (!enabled) FlushPending();
  g_fusion_override = enabled ? 1 : 0;
}

bool FusionEnabled() {
  int v = g_fusion_override.load();
  return v >= 0 ? v == 1 : FusionFromEnv();
}

void ForgetStorage(DeviceStorage* s) {
  Recorder& rec = Rec();
  if (!rec.b) return;
  rec.storage_param.erase(s);  // its buffer stays alive in rec.args
  if (s->pending) rec.pending.erase(std::find(rec.pending.begin(), rec.pending.end(), s));
}

void FlushPending() {
  Recorder& rec = Rec();
  if (!rec.b) return;
  // Take the recording first: anything below may re-enter (allocations).
  Recorder r = std::move(rec);
  rec = Recorder();
  auto& rt = GetRuntime();
  std::vector<Value> outs;
  std::string key = r.key + "|out:";
  for (size_t k = 0; k < r.pending.size(); ++k) {
    DeviceStorage* s = r.pending[k];
    outs.push_back(s->pending_value);
    key += std::to_string(s->pending_value.id) + ",";
    auto it = r.storage_param.find(s);
    if (it != r.storage_param.end()) {
      r.b->SetParameterAttrs(it->second, "tf.aliasing_output = " + std::to_string(k) + " : i32");
      key += "a" + std::to_string(it->second) + ",";
    }
  }
  for (const auto& c : r.checks) outs.push_back(c.first);
  if (outs.empty()) {
    for (DeviceStorage* s : r.pending) s->pending = false;
    return;
  }
  r.b->Return(outs);
  std::vector<int64_t> non_donatable;
  std::vector<bool> donated(r.args.size(), false);
  for (DeviceStorage* s : r.pending) {
    auto it = r.storage_param.find(s);
    if (it != r.storage_param.end()) donated[it->second] = true;
  }
  std::vector<PJRT_Buffer*> buffers;
  for (size_t i = 0; i < r.args.size(); ++i) {
    buffers.push_back(r.args[i]->raw());
    if (!donated[i]) non_donatable.push_back(static_cast<int64_t>(i));
  }
  std::vector<pjrt::BufferPtr> results;
  try {
    auto exe = rt.GetOrCompile(key, r.device, [&] { return r.b->ToText(); });
    results = rt.Execute(*exe, buffers, non_donatable, "fused chain");
  } catch (...) {
    for (DeviceStorage* s : r.pending) s->pending = false;
    throw;
  }
  for (size_t k = 0; k < r.pending.size(); ++k) {
    r.pending[k]->buffer = results[k];
    r.pending[k]->pending = false;
  }
  for (size_t i = 0; i < r.checks.size(); ++i)
    rt.AddAssertion(results[r.pending.size() + i], r.checks[i].second);
}

void RunInto(const std::string& name, const std::vector<c10::IValue>& inputs,
             const at::Tensor& dst) {
  const lowering::RuleEntry* rule = lowering::Find(name);
  TORCH_CHECK(rule, "no tpu rule ", name);
  // A synthetic out= call: rule(inputs) written into dst.
  static c10::OperatorHandle copy_op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::copy_", "");
  OpDesc desc;
  desc.name = name;
  desc.rule = rule;
  desc.variant = Variant::InPlace;
  desc.mutable_args = {0};
  // copy_(Tensor(a!) self, Tensor src, bool non_blocking): self is dst.
  std::vector<c10::IValue> args{dst, inputs.at(0), false};
  // The meta result of copy_ is dst's own shape and dtype: what we need.
  std::vector<c10::IValue> results;
  try {
    results = Run(desc, copy_op, args);
  } catch (const pjrt::Error& e) {
    TORCH_CHECK(false, PrefixedMessage(name, e.what()));
  }
}

void RegisterNativeRules() {
  auto& dispatcher = c10::Dispatcher::singleton();
  // Group all schemas by base name once, to find in-place and out= variants.
  std::unordered_map<std::string, std::vector<c10::OperatorName>> by_base;
  for (const auto& op_name : dispatcher.getAllOpNames()) {
    if (op_name.name.rfind("aten::", 0) != 0) continue;
    std::string base = op_name.name.substr(6);
    if (!base.empty() && base.back() == '_') base.pop_back();
    by_base[base].push_back(op_name);
  }
  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                              c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  auto add = [&](const c10::OperatorName& name, const lowering::RuleEntry* rule) {
    if (Ops().count(name)) return;
    auto handle = dispatcher.findOp(name);
    if (!handle) return;
    // A tpu kernel for a CompositeImplicitAutograd op without its own autograd
    // formula (where.ScalarOther, ...) would take the op out of autograd
    // (gradients silently stop there); such ops decompose into native ones.
    if (handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) &&
        !handle->hasKernelForDispatchKey(c10::DispatchKey::Autograd))
      return;
    Ops()[name] = Describe(handle->schema(), rule);
    std::string full = FullName(handle->schema());
    lib->impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&GenericKernel>());
  };
  for (const lowering::RuleEntry* rule : lowering::AllRules()) {
    if (rule->name.rfind("_tpu_", 0) == 0) continue;  // internal
    std::string base = rule->name.substr(0, rule->name.find('.'));
    std::string overload =
        rule->name.find('.') == std::string::npos ? "" : rule->name.substr(rule->name.find('.') + 1);
    auto handle = dispatcher.findSchema({"aten::" + base, overload});
    TORCH_CHECK(handle, "torch_tpu: lowering rule for unknown op aten::", rule->name);
    add(handle->operator_name(), rule);
    for (const auto& variant : rule->variants) {
      auto dot = variant.find('.');
      auto v = dispatcher.findSchema({"aten::" + variant.substr(0, dot),
                                      dot == std::string::npos ? "" : variant.substr(dot + 1)});
      TORCH_CHECK(v, "torch_tpu: lowering rule variant for unknown op aten::", variant);
      add(v->operator_name(), rule);
    }
    std::string stem = base;
    if (!stem.empty() && stem.back() == '_') stem.pop_back();
    if (handle->schema().is_mutable()) continue;  // rule is itself a variant
    for (const auto& other : by_base[stem]) {
      auto h = dispatcher.findOp(other);
      if (!h || other == handle->operator_name()) continue;
      const auto& s = h->schema();
      bool inplace = other.name == "aten::" + stem + "_" && other.overload_name == overload;
      bool out = !Describe(s, rule).out_args.empty() && other.name == "aten::" + stem &&
                 SameFunctionalArgs(s, handle->schema()) &&
                 s.returns().size() == handle->schema().returns().size();
      if (inplace || out) add(other, rule);
    }
  }
  Libraries().push_back(std::move(lib));
}

// ---------------------------------------------------------------- internal rules

namespace {
const lowering::Registrar copy_rule(
    "_tpu_copy", [](lowering::Context& c, const std::vector<Arg>& a) {
      const TensorType& out = c.outputs.at(0);
      return std::vector<Value>{lowering::As(c.b, a.at(1), out.dtype, out.shape)};
    });
}  // namespace

}  // namespace torch_tpu::aten
