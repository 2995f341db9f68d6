// The hit path of strict eager: a functional call whose signature has run
// before is launched straight from its arguments. The full path (plan, key,
// outputs, launch) costs several microseconds per op; most of it (the key
// text, the plan's vectors, the cached output specs copied per call) is the
// same for every call of one signature. So after a full-path cache hit the
// call's signature is remembered as a fingerprint (a few integers per
// argument: what the key says of it, minus runtime values) together with
// how each module parameter is taken from the arguments; a later call with
// the same fingerprint fills the parameters and launches. Anything the hit
// path does not know (in-place and out= ops, RNG, CPU tensors, tensor
// lists, pending fused values, padded storages, strings, runtime floats,
// calls without tpu tensors) takes the full path.
//
// Fused eager has its own entries: a functional call recorded into a chain
// by the full path is kept (fused.cpp: KeptCall) under its fingerprint, and a
// later call with the same fingerprint is recorded from it, its parameters
// taken from the arguments as here (a storage pending in the chain is read
// as its pending value), without planning it again.
#include <ATen/EmptyTensor.h>
#include <c10/util/SmallVector.h>

#include <cstring>
#include <unordered_map>

#include "aten/call.h"
#include "runtime/launch_queue.h"

namespace torch_tpu::aten {

using hlo::ElementType;
using lowering::Arg;
using runtime::DeviceStorage;

namespace {

using Storages = c10::SmallVector<DeviceStorage*, 8>;

// Where one module parameter comes from.
struct Source {
  enum class Kind { Buffer, Offset, Scalar } kind;
  size_t arg;
  ElementType dtype = ElementType::F32;  // Scalar: the parameter's type
};

struct FastEntry {
  std::vector<int64_t> fingerprint;
  pjrt::ExecutablePtr exe;
  std::vector<Source> sources;      // per module parameter
  std::vector<OutputSpec> outputs;  // the op's outputs, undefined ones included
  std::vector<ElementType> dtypes;  // per defined output: its storage dtype
  std::vector<std::string> checks;
};

std::unordered_map<uint64_t, FastEntry>& Entries() {
  static auto* m = new std::unordered_map<uint64_t, FastEntry>();
  return *m;
}

// A signature fused eager recorded before.
struct RecordEntry {
  std::vector<int64_t> fingerprint;
  std::shared_ptr<const KeptCall> kept;
  std::vector<Source> sources;  // per plan parameter
};

std::unordered_map<uint64_t, RecordEntry>& RecordEntries() {
  static auto* m = new std::unordered_map<uint64_t, RecordEntry>();
  return *m;
}

bool Same(const std::vector<int64_t>& a, const Fingerprint& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

int64_t ScalarCategory(const c10::Scalar& s) {
  if (s.isBoolean()) return 1;
  if (s.isIntegral(false)) return 2;
  if (s.isFloatingPoint()) return 3;
  return 4;
}

c10::TypeKind KindOf(const c10::Argument& a) {
  const c10::TypePtr& t = a.real_type();
  if (t->kind() == c10::TypeKind::OptionalType)
    return t->castRaw<c10::OptionalType>()->getElementType()->kind();
  return t->kind();
}

// StorageOf() without its launch-queue check: TryLaunch checked the queue
// once (the hit path runs only when nothing is queued).
DeviceStorage* StorageOfTensor(const at::Tensor& t) {
  auto* s = static_cast<DeviceStorage*>(t.storage().data_ptr().get_context());
  TORCH_CHECK(s != nullptr, "tensor on ", t.device(), " has no tpu storage");
  return s;
}

// Appends what the key says of one tpu tensor; false if the hit path
// cannot take it. `storages`: the call's storages so far (aliasing is part
// of the signature).
// `recording`: a storage pending in the fused chain is taken (its value is
// the chain's).
bool TensorPrint(const at::Tensor& t, const OpDesc& desc, bool recording, Storages& storages,
                 Fingerprint* fp) {
  if (t.device().type() != c10::DeviceType::PrivateUse1) return false;
  DeviceStorage* s = StorageOfTensor(t);
  ElementType dtype = ToElementType(t.scalar_type(), desc.name.c_str());
  if (s->padded() || s->dtype != dtype || !(s->pending() ? recording : s->buffer != nullptr)) return false;
  size_t index = std::find(storages.begin(), storages.end(), s) - storages.begin();
  if (index == storages.size()) storages.push_back(s);
  fp->push_back(static_cast<int64_t>(dtype));
  fp->push_back(static_cast<int64_t>(index));
  fp->push_back(t.device().index());
  fp->push_back(static_cast<int64_t>(s->nbytes));
  fp->push_back(t.storage_offset() == 0);
  fp->push_back(t.dim());
  for (int64_t d : t.sizes()) fp->push_back(d);
  for (int64_t d : t.strides()) fp->push_back(d);
  return true;
}

// Appends argument i's part of the signature; false if the hit path cannot take it.
bool ArgPrint(const OpDesc& desc, const c10::Argument& a, const c10::IValue& v, bool recording,
              Storages& storages, Fingerprint* fp) {
  if (v.isNone()) {
    fp->push_back(-1);
    return true;
  }
  c10::TypeKind kind = KindOf(a);
  fp->push_back(static_cast<int64_t>(kind));
  switch (kind) {
    case c10::TypeKind::TensorType:
      return v.isTensor() && v.toTensor().defined() && TensorPrint(v.toTensor(), desc, recording, storages, fp);
    case c10::TypeKind::NumberType:
      fp->push_back(ScalarCategory(v.toScalar()));
      return true;
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType:
    case c10::TypeKind::BoolType:
      if (!v.isInt() && !v.isBool()) return false;
      fp->push_back(v.isInt() ? v.toInt() : v.toBool());
      return true;
    case c10::TypeKind::FloatType: {
      if (desc.rule->runtime_floats) return false;
      double d = v.toDouble();
      int64_t bits;
      std::memcpy(&bits, &d, sizeof(bits));
      fp->push_back(bits);
      return true;
    }
    case c10::TypeKind::ListType:
      if (!v.isIntList()) return false;
      fp->push_back(static_cast<int64_t>(v.toListRef().size()));
      for (const c10::IValue& e : v.toListRef()) fp->push_back(e.toInt());
      return true;
    case c10::TypeKind::ScalarTypeType:
      fp->push_back(static_cast<int64_t>(v.toScalarType()));
      return true;
    case c10::TypeKind::MemoryFormatType:
      fp->push_back(static_cast<int64_t>(v.toMemoryFormat()));
      return true;
    case c10::TypeKind::LayoutType:
    case c10::TypeKind::DeviceObjType:
      return true;  // not part of the key either
    default:
      return false;
  }
}

uint64_t Hash(const Fingerprint& fp) {
  uint64_t h = 1469598103934665603ULL;
  for (int64_t x : fp) h = (h ^ static_cast<uint64_t>(x)) * 1099511628211ULL;
  return h;
}

// Which plan parameter comes from which argument; false if one comes from
// something else (an RNG state, a CPU tensor, a runtime float).
bool SourcesOf(const Plan& plan, std::vector<Source>* sources) {
  std::vector<bool> found(plan.params.size(), false);
  sources->assign(plan.params.size(), Source{Source::Kind::Buffer, 0});
  auto set = [&](int p, Source s) {
    (*sources)[p] = s;
    found[p] = true;
  };
  for (size_t i = 0; i < plan.args.size(); ++i) {
    const ArgPlan& a = plan.args[i];
    if (a.kind == Arg::Kind::Tensor && !a.tensors.empty()) {
      const TensorIn& in = plan.inputs[a.tensors[0]];
      set(in.storage_param, {Source::Kind::Buffer, i});
      if (in.offset_param >= 0) set(in.offset_param, {Source::Kind::Offset, i});
    } else if (a.kind == Arg::Kind::Scalar) {
      set(a.param, {Source::Kind::Scalar, i, plan.params[a.param].dtype});
    }
  }
  return std::find(found.begin(), found.end(), false) == found.end();
}

runtime::LaunchParam ParamFrom(const Source& src, const std::vector<c10::IValue>& args) {
  static const Plan no_storages;
  const c10::IValue& v = args[src.arg];
  switch (src.kind) {
    case Source::Kind::Buffer:
      return runtime::LaunchParam::Of(StorageOfTensor(v.toTensor())->buffer);
    case Source::Kind::Offset:
      return runtime::LaunchParam::Integer(v.toTensor().storage_offset(), ElementType::I64);
    case Source::Kind::Scalar:
      break;
  }
  Param q{Param::Kind::Scalar};
  q.scalar = v.toScalar();
  q.dtype = src.dtype;
  return LaunchValue(no_storages, q);
}

// Parameter `src` of a recorded call: the storage it reads, or its value.
KnownParam KnownFrom(const Source& src, const std::vector<c10::IValue>& args) {
  KnownParam p;
  if (src.kind == Source::Kind::Buffer) p.storage = StorageOfTensor(args[src.arg].toTensor());
  else p.value = ParamFrom(src, args);
  return p;
}

std::vector<c10::IValue> Record(const RecordEntry& e, const std::vector<c10::IValue>& args) {
  std::vector<KnownParam> params;
  params.reserve(e.sources.size());
  for (const Source& s : e.sources) params.push_back(KnownFrom(s, args));
  return RecordKnownCall(e.kept, params);
}

std::vector<c10::IValue> Launch(const OpDesc& desc, const FastEntry& e,
                                const std::vector<c10::IValue>& args, int device) {
  auto& rt = GetRuntime();
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, device));
  runtime::Launch launch;
  launch.exe = e.exe.get();
  launch.device = device;
  launch.op = &desc.name;
  launch.checks = &e.checks;
  launch.params.reserve(e.sources.size());
  for (const Source& s : e.sources) launch.params.push_back(ParamFrom(s, args));
  std::vector<c10::IValue> results;
  results.reserve(e.outputs.size());
  launch.results.reserve(e.dtypes.size());
  size_t k = 0;
  for (const OutputSpec& spec : e.outputs) {
    if (!spec.defined) {
      results.emplace_back(at::Tensor());
      continue;
    }
    at::Tensor t = at::detail::empty_strided_generic(
        spec.sizes, spec.strides, DeviceAllocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
        spec.dtype);
    DeviceStorage* s = StorageOfTensor(t);
    s->dtype = e.dtypes[k++];
    launch.results.push_back(s);
    results.emplace_back(std::move(t));
  }
  runtime::Run(rt, launch);
  ++rt.stats().cache_hits;
  CountNative(desc);
  return results;
}

}  // namespace

void ClearFastEntries() {
  Entries().clear();
  RecordEntries().clear();
}

std::optional<std::vector<c10::IValue>> FastCall::TryLaunch(const OpDesc& desc,
                                                            const c10::FunctionSchema& schema,
                                                            const std::vector<c10::IValue>& args) {
  eligible_ = false;
  // Launches are queued (compiles running in the background): this call
  // is queued behind them by the full path.
  if (runtime::launch_queue::Busy()) return std::nullopt;
  if (desc.variant != Variant::Functional || desc.rule->random()) return std::nullopt;
  recording_ = Recording();
  Storages storages;
  fingerprint_.clear();
  fingerprint_.push_back(reinterpret_cast<intptr_t>(&desc));
  fingerprint_.push_back(at::globalContext().float32MatmulPrecision() ==
                         at::Float32MatmulPrecision::HIGHEST);
  const auto& formals = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i)
    if (!ArgPrint(desc, formals[i], args[i], recording_, storages, &fingerprint_)) return std::nullopt;
  if (storages.empty()) return std::nullopt;  // scalars may key the output shape
  eligible_ = true;
  hash_ = Hash(fingerprint_);
  device_ = storages[0]->device;
  if (recording_) {
    auto& entries = RecordEntries();
    auto it = entries.find(hash_);
    if (it == entries.end() || !Same(it->second.fingerprint, fingerprint_)) return std::nullopt;
    return Record(it->second, args);
  }
  auto& entries = Entries();
  auto it = entries.find(hash_);
  if (it == entries.end() || !Same(it->second.fingerprint, fingerprint_) || !it->second.exe)
    return std::nullopt;
  return Launch(desc, it->second, args, device_);
}

void FastCall::RememberRecorded(const std::shared_ptr<const KeptCall>& kept) {
  if (!eligible_ || !recording_ || !kept || kept->call.plan.device != device_) return;
  const Call& call = kept->call;
  RecordEntry e;
  if (!call.written.empty() || !SourcesOf(call.plan, &e.sources)) return;
  e.fingerprint.assign(fingerprint_.begin(), fingerprint_.end());
  e.kept = kept;
  auto& entries = RecordEntries();
  if (entries.size() >= 8192) entries.clear();  // signatures that never repeat
  entries[hash_] = std::move(e);
}

void FastCall::Remember(const Call& call, const pjrt::ExecutablePtr& exe,
                        const std::vector<OutputSpec>& outputs, const std::vector<std::string>& checks) {
  if (!eligible_ || recording_ || call.plan.device != device_) return;
  FastEntry e;
  if (!SourcesOf(call.plan, &e.sources)) return;
  e.fingerprint.assign(fingerprint_.begin(), fingerprint_.end());
  e.exe = exe;
  e.outputs = outputs;
  for (const Dest& d : call.plan.dests) e.dtypes.push_back(d.dtype);
  size_t defined = 0;
  for (const OutputSpec& o : outputs) defined += o.defined;
  if (defined != e.dtypes.size() || !call.written.empty()) return;
  e.checks = checks;
  auto& entries = Entries();
  if (entries.size() >= 8192) entries.clear();  // signatures that never repeat
  entries[hash_] = std::move(e);
}

}  // namespace torch_tpu::aten
