// Stage 1 of a call: how its arguments map onto module parameters and
// storage writes, and its cache key. Computed for every call (cheap); the
// module is built from it only on a cache miss.
#include <ATen/core/dispatch/Dispatcher.h>

#include "aten/call.h"
#include "aten/call_args.h"
#include "aten/dynamic.h"
#include "aten/padded_layout.h"

namespace torch_tpu::aten {

using hlo::ElementType;
using hlo::TensorType;
using lowering::Arg;
using runtime::DeviceStorage;

namespace {

// A storage about to be read or written by the call: a pending fused value
// stays pending when the op is recorded too; otherwise it gets a buffer.
void PrepareForOp(DeviceStorage* s, ElementType t) {
  if (PendingUsable(s, t)) return;
  // A padded buffer stays padded: strict eager and a recorded call read its
  // real elements, a dynamic op reads it whole; a recorded call compacts the
  // ones it writes first (CompactForRecording).
  PrepareStorage(s, t, /*keep_capacity=*/true);
}

size_t StorageIndex(Plan& p, DeviceStorage* s) {
  for (size_t i = 0; i < p.storages.size(); ++i)
    if (p.storages[i] == s) return i;
  p.storages.push_back(s);
  p.storage_param.push_back(-1);
  return p.storages.size() - 1;
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

// A window of a padded storage is read in the buffer's own elements: its key
// and module do not change as the storage's real sizes grow.
bool ReadsBuffer(Plan& p, const DeviceStorage& s, int64_t offset, TensorIn* in) {
  if (!s.padded() || in->geometry.whole) return false;
  std::optional<BufferRead> r = ReadInBuffer(in->geometry, offset, {s.real_shape, s.padded_shape});
  if (!r) return false;
  in->buffer_geometry = r->geometry;
  Param q{Param::Kind::Offset};
  q.offset = r->offset;
  q.buffer_read = true;
  in->buffer_offset_param = AddParam(p, q);
  return true;
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
  p.key += 'T';
  p.key += std::to_string(in.storage);
  p.key += hlo::Name(dtype);
  size_t span_begin = p.key.size();
  if (!ReadsBuffer(p, *s, t.storage_offset(), &in)) {
    in.geometry.AppendKey(&p.key);
    AppendCapacityKey(*s, &p.key);
  } else {
    in.buffer_geometry->AppendKey(&p.key);
    p.key += 'B';
    p.key += hlo::Ints(s->padded_shape);
  }
  if (DynamicShapesActive())  // dynamic.h: only dynamic.cpp's signatures read the spans
    p.geometry_spans.emplace_back(span_begin, p.key.size());
  p.inputs.push_back(std::move(in));
  return static_cast<int>(p.inputs.size()) - 1;
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
  if (t.unsafeGetTensorImpl()->is_wrapped_number()) return DecodeScalar(p, t.item());
  a.kind = Arg::Kind::Tensor;
  a.literal.is_cpu_scalar = true;
  Param q{Param::Kind::CpuTensor};
  q.cpu = t;
  q.dtype = ToElementType(t.scalar_type(), op.c_str());
  a.param = AddParam(p, q);
  p.key += std::string("C") + hlo::Name(q.dtype);
  return a;
}

// Eager tensors are views of storages (or CPU scalars).
class StorageReads final : public TensorSource {
 public:
  explicit StorageReads(const std::string& op) : op_(op) {}
  ArgPlan Tensor(Plan& p, const c10::IValue& v) override { return TensorArg(p, v.toTensor(), op_); }

 private:
  const std::string& op_;
};

// Writes into existing tensors (in-place self, out= tensors).
void PlanDestinations(Plan& plan, const OpDesc& desc, const std::vector<c10::IValue>& args) {
  const std::string& name = desc.name;
  if (desc.variant == Variant::InPlace) {
    for (size_t i : desc.mutable_args) {
      if (args[i].isTensor()) {
        if (args[i].toTensor().defined()) plan.dest_tensors.push_back(args[i].toTensor());
      } else if (args[i].isTensorList()) {
        for (const at::Tensor& t : args[i].toTensorVector()) plan.dest_tensors.push_back(t);
      }
    }
  } else if (desc.variant == Variant::Out) {
    for (size_t i : desc.out_args) {
      const at::Tensor& t = args[i].toTensor();
      TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1, name,
                  ": out= tensor must be on tpu, got ", t.device());
      CheckDevice(plan, t, name);
      plan.dest_tensors.push_back(t);
    }
  }
  if (plan.device < 0) plan.device = CurrentDevice();
  plan.dest_span.first = plan.key.size();
  for (const auto& t : plan.dest_tensors)
    plan.key += "O" + std::to_string(static_cast<int>(t.scalar_type())) + hlo::Ints(t.sizes().vec()) +
                "/" + hlo::Ints(t.strides().vec());
  for (const at::Tensor& t : plan.dest_tensors) {
    Dest d;
    d.tensor = t;
    d.fresh = false;
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
    plan.key += 'W';
    plan.key += std::to_string(d.storage);
    d.geometry.AppendKey(&plan.key);
    AppendCapacityKey(*s, &plan.key);  // the module writes its real elements back
    plan.dests.push_back(d);
  }
  plan.dest_span.second = plan.key.size();
}

// The parts of the key that are not arguments: matmul precision, the float
// width of scalars, the device, and (without tensor inputs) scalar values.
void FinishKey(Plan& plan) {
  // fp32 matmul precision is baked into dot_general.
  plan.fp32_highest = at::globalContext().float32MatmulPrecision() == at::Float32MatmulPrecision::HIGHEST;
  plan.key += plan.fp32_highest ? "|hi" : "|lo";
  // Without tensor inputs (arange.out and the like) scalars can decide the
  // output shape, which meta computes once per key: make them part of it.
  if (plan.inputs.empty()) {
    for (const auto& q : plan.params)
      if (q.kind == Param::Kind::Scalar) plan.key += "=" + ExactString(q.scalar) + ";";
  }
  SetScalarWidths(plan);
  plan.key += plan.any_f64 ? "|f64" : "|f32";
  // Executables are compiled for one device: the same op on another device
  // is another entry (device 0 keeps the plain key).
  if (plan.device != 0) plan.key += "|@" + std::to_string(plan.device);
}

}  // namespace

void GiveOverwrittenDestinationsBuffers(const OpDesc& desc, const std::vector<c10::IValue>& args) {
  const bool overwrites = desc.variant == Variant::Out ||  // an out= op writes every element of its out tensors
                          (desc.variant == Variant::InPlace && desc.rule && desc.rule->overwrites_destination);
  if (!overwrites) return;
  for (size_t i : desc.variant == Variant::Out ? desc.out_args : desc.mutable_args) {
    if (i >= args.size() || !args[i].isTensor()) continue;
    const at::Tensor& t = args[i].toTensor();
    if (!t.defined() || t.device().type() != c10::DeviceType::PrivateUse1 || !GeometryOf(t).whole) continue;
    GiveBufferToOverwrite(StorageOf(t), ToElementType(t.scalar_type(), desc.name.c_str()));
  }
}

Plan PlanCall(const OpDesc& desc, const c10::FunctionSchema& schema,
              const std::vector<c10::IValue>& args) {
  GiveOverwrittenDestinationsBuffers(desc, args);  // before its inputs are read (zero-filled otherwise)
  Plan plan;
  plan.key.reserve(256);
  plan.key = desc.name;
  plan.key += '|';
  plan.is_out.assign(args.size() + 1, false);
  plan.args.reserve(args.size() + 1);  // one more: a rule's own generator
  plan.params.reserve(args.size() + 1);
  plan.inputs.reserve(args.size());
  if (DynamicShapesActive()) plan.geometry_spans.reserve(args.size());
  plan.storages.reserve(args.size());
  plan.storage_param.reserve(args.size());
  for (size_t i : desc.out_args) plan.is_out[i] = true;
  StorageReads tensors(desc.name);
  DecodeArgs(plan, *desc.rule, schema.arguments(), args, tensors, desc.name);
  PlanDestinations(plan, desc, args);
  DecodeGenerators(plan, *desc.rule, schema.arguments());
  FinishKey(plan);
  return plan;
}

std::vector<Arg> AbstractArgs(const Plan& plan) {
  std::vector<Arg> out;
  auto typed = [&](int input) {
    hlo::Value v;
    if (input < 0) return v;
    const TensorIn& in = plan.inputs[input];
    v.type = TensorType{in.dtype, in.geometry.sizes};
    return v;
  };
  for (size_t i = 0; i < plan.args.size(); ++i) {
    if (i < plan.is_out.size() && plan.is_out[i]) continue;
    const ArgPlan& ap = plan.args[i];
    Arg a = ap.literal;
    a.kind = ap.kind;
    if (ap.kind == Arg::Kind::Tensor && !ap.tensors.empty()) a.tensor = typed(ap.tensors[0]);
    if (ap.kind == Arg::Kind::Tensor && ap.param >= 0)
      a.tensor.type = TensorType{plan.params[ap.param].dtype, {}};
    if (ap.kind == Arg::Kind::TensorList)
      for (int t : ap.tensors) a.tensors.push_back(typed(t));
    out.push_back(a);
  }
  return out;
}

void FinishPlan(Call& call, const std::vector<c10::IValue>& args) {
  Plan& plan = call.plan;
  const OpDesc& desc = *call.desc;
  if (desc.variant == Variant::Functional) {
    plan.dests.reserve(call.specs.size());
    for (const auto& spec : call.specs) {
      Dest d;
      d.dtype = ToElementType(spec.dtype, desc.name.c_str());
      plan.dests.push_back(d);
    }
  }
  // RNG: advance the generator by the number of values the call draws.
  bool any_generator = false;
  for (const auto& a : plan.args) any_generator |= a.kind == Arg::Kind::Generator;
  if (any_generator) {
    const uint64_t draws = RngDraws(call);
    for (size_t i = 0; i < plan.args.size(); ++i) {
      if (plan.args[i].kind != Arg::Kind::Generator) continue;
      std::optional<at::Generator> gen;
      if (i < args.size() && args[i].isGenerator()) gen = args[i].toGenerator();
      auto [seed, offset] = NextRngState(gen, plan.device, draws);
      plan.params[plan.args[i].param].rng[0] = seed;
      plan.params[plan.args[i].param].rng[1] = offset;
    }
  }
  // Which storages are written, in order: they are the module's first results.
  for (const auto& d : plan.dests)
    if (d.tensor.defined() &&
        std::find(call.written.begin(), call.written.end(), d.storage) == call.written.end())
      call.written.push_back(d.storage);
}

bool Donated(const Call& call, const Param& q) {
  return q.kind == Param::Kind::Storage &&
         std::find(call.written.begin(), call.written.end(), q.storage) != call.written.end();
}

uint64_t RngDraws(const Call& call) {
  std::vector<TensorType> outputs;
  for (const auto& s : call.specs)
    outputs.push_back({s.defined ? ToElementType(s.dtype, call.desc->name.c_str()) : ElementType::F32, s.sizes});
  std::vector<Arg> abstract = AbstractArgs(call.plan);
  return call.desc->rule->random() ? call.desc->rule->draws(abstract, outputs)
                                   : lowering::DrawPerOutputElement(abstract, outputs);
}

void AppendCapacityKey(const DeviceStorage& s, std::string* key) {
  if (!s.padded()) return;
  *key += 'c';
  *key += hlo::Ints(s.real_shape);
  *key += '/';
  *key += hlo::Ints(s.padded_shape);
}

TensorType ParamType(const Plan& plan, const Param& q) {
  switch (q.kind) {
    case Param::Kind::Storage:
      return {plan.storages[q.storage]->dtype, {plan.storages[q.storage]->buffer_numel()}};
    case Param::Kind::Offset:
      return {ElementType::I64, {}};
    case Param::Kind::Rng:
      return {ElementType::U64, {2}};
    default:
      return {q.dtype, {}};
  }
}

runtime::LaunchParam LaunchValue(const Plan& plan, const Param& q) {
  using runtime::LaunchParam;
  switch (q.kind) {
    case Param::Kind::Offset:
      return LaunchParam::Integer(q.offset, ElementType::I64);
    case Param::Kind::Scalar:
      if (q.dtype == ElementType::F32 || q.dtype == ElementType::F64)
        return LaunchParam::Floating(q.scalar.toDouble(), q.dtype);
      if (q.dtype == ElementType::C128) {  // complex Python scalars
        c10::complex<double> z = q.scalar.toComplexDouble();
        return LaunchParam::Raw(&z, sizeof(z), q.dtype);
      }
      if (q.dtype == ElementType::C64) {
        c10::complex<float> z = q.scalar.toComplexFloat();
        return LaunchParam::Raw(&z, sizeof(z), q.dtype);
      }
      return LaunchParam::Integer(q.dtype == ElementType::Bool ? q.scalar.toBool() : q.scalar.toLong(),
                                  q.dtype);
    case Param::Kind::CpuTensor: {
      at::Tensor c = q.cpu.contiguous();
      return LaunchParam::Raw(c.data_ptr(), c.nbytes(), q.dtype);
    }
    case Param::Kind::Rng:
      return LaunchParam::Raw(q.rng, sizeof(q.rng), ElementType::U64, 2);
    case Param::Kind::Storage:
      break;
  }
  return LaunchParam::Of(plan.storages[q.storage]->buffer);
}

}  // namespace torch_tpu::aten
