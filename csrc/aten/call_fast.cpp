// The hit path of strict eager: a functional call whose signature has run
// before is launched straight from its arguments. The full path (plan, key,
// outputs, launch) costs several microseconds per op; most of it (the key
// text, the plan's vectors, the cached output specs copied per call) is the
// same for every call of one signature. So after a full-path cache hit the
// call's signature is remembered as a fingerprint (a few integers per
// argument: what the key says of it, minus runtime values) together with
// how each module parameter is taken from the arguments; a later call with
// the same fingerprint fills the parameters and launches (a Python number,
// a wrapped CPU scalar, is a runtime scalar; a string is part of the
// fingerprint; a tensor list is its tensors; a call that draws random
// numbers advances its generator by what the full path's call drew).
// An in-place call is remembered the same way when it writes whole
// destinations (fill_, copy_, add_ on a tensor, not on a view of part of a
// storage): its written storages take the module's first results, their
// buffers donated, and it returns its destinations. A storage that has no
// buffer yet (a fresh torch.empty) gets its zeros first, as the full path's
// planning gives it. Anything the hit path does not know (out= ops, writes
// into part of a storage, other CPU tensors, lists of optional tensors,
// pending fused values, runtime floats, calls without tpu tensors, exact
// calls that write padded storages, random draws in fused eager) takes the
// full path. An exact functional call on padded storages is remembered with
// their layouts and view offsets in its fingerprint, which fix where the
// module reads each view in its buffer.
//
// A bounded-dynamic launch (dynamic.cpp, padded_rows.cpp) of a functional
// call, or of an in-place one that overwrites whole destinations its module
// does not read (fill_, copy_ into a fresh tensor: each destination's
// storage takes its result as its padded buffer), is remembered the same
// way: a later call with the same fingerprint
// (the same exact sizes, its padded storages in the same layouts) launches
// the same executable with the same runtime sizes, its results laid out as
// before. The fingerprint then says of each padded storage its layout and
// the view's offset; a call on padded storages takes no other entry. Not
// remembered: a launch that padded an input through the host (its next
// call finds the storage padded: another fingerprint), a call on a tensor
// with mark_dynamic hints (the full path reads them).
//
// Fused eager has its own entries: a functional call recorded into a chain
// by the full path is kept (fused.cpp: KeptCall) under its fingerprint, and a
// later call with the same fingerprint is recorded from it, its parameters
// taken from the arguments as here (a storage pending in the chain is read
// as its pending value), without planning it again.
#include <ATen/EmptyTensor.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "aten/call.h"
#include "aten/dynamic.h"
#include "runtime/launch_queue.h"

namespace torch_tpu::aten {

using hlo::ElementType;
using lowering::Arg;
using runtime::DeviceStorage;

namespace {

using Storages = c10::SmallVector<DeviceStorage*, 8>;

// Where one module parameter comes from.
struct Source {
  // BufferOffset: where an exact module reads a view of a padded storage in
  // its buffer (`offset`): the fingerprint's layout and view offset fix it.
  enum class Kind { Buffer, Offset, Scalar, Rng, BufferOffset } kind;
  size_t arg;
  ElementType dtype = ElementType::F32;  // Scalar: the parameter's type
  int64_t element = -1;  // Buffer, Offset: a tensor list's element (-1: a tensor arg)
  uint64_t draws = 0;    // Rng: how far the call advances its generator
  int64_t offset = 0;    // BufferOffset: its value
};

struct FastEntry {
  std::vector<int64_t> fingerprint;
  pjrt::ExecutablePtr exe;
  std::vector<Source> sources;      // per module parameter
  std::vector<OutputSpec> outputs;  // the op's outputs, undefined ones included
  std::vector<ElementType> dtypes;  // per defined output: its storage dtype
  std::vector<std::string> checks;
  // An in-place call: its outputs are its destinations, in order (their
  // storages, each once, take the module's first results); per parameter,
  // whether it is donated (its storage is written). `outputs` is empty.
  std::vector<Source> destinations;
  std::vector<bool> donated;
};

std::unordered_map<uint64_t, FastEntry>& Entries() {
  static auto* m = new std::unordered_map<uint64_t, FastEntry>();
  return *m;
}

// A bounded-dynamic launch of one signature at one set of exact sizes.
struct BoundedEntry {
  std::vector<int64_t> fingerprint;
  BoundedLaunch launch;
  std::vector<Source> sources;      // per module parameter
  std::vector<OutputSpec> outputs;  // the op's outputs, undefined ones included
  std::vector<ElementType> dtypes;  // per defined output: its storage dtype
  // An in-place call (a fill or copy that overwrites whole destinations the
  // module does not read): its destinations, in result order; `outputs` is empty.
  std::vector<Source> destinations;
};

std::unordered_map<uint64_t, BoundedEntry>& BoundedEntries() {
  static auto* m = new std::unordered_map<uint64_t, BoundedEntry>();
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

// What the fingerprint says of a padded storage read at `offset`: its
// layout and the offset (which window of it a dynamic op reads).
void PaddedPrint(const DeviceStorage& s, int64_t offset, Fingerprint* fp) {
  fp->push_back(-2);
  fp->push_back(offset);
  fp->push_back(static_cast<int64_t>(s.padded_shape.size()));
  for (int64_t d : s.real_shape) fp->push_back(d);
  for (int64_t d : s.padded_shape) fp->push_back(d);
  for (bool p : s.product_dims) fp->push_back(p);
}

// A storage's buffer and layout, hashed: whether a call changed them.
uint64_t LayoutHash(const DeviceStorage& s) {
  uint64_t h = reinterpret_cast<uintptr_t>(s.buffer.get()) * 1099511628211ULL;
  for (int64_t d : s.real_shape) h = (h ^ static_cast<uint64_t>(d)) * 1099511628211ULL;
  for (int64_t d : s.padded_shape) h = (h ^ static_cast<uint64_t>(d + 7)) * 1099511628211ULL;
  return h;
}

// What a call's fingerprint has met so far.
struct PrintState {
  bool recording = false;  // a storage pending in the fused chain is taken (its value is the chain's)
  bool any_padded = false, any_pending = false, any_hinted = false;
  Storages* storages = nullptr;  // the call's storages so far (aliasing is part of the signature)
  FastCall::Unfilled* unfilled = nullptr;  // storages without a buffer yet, and the dtype each is read as
};

// Appends what the key says of one tpu tensor; false if the hit path
// cannot take it.
bool TensorPrint(const at::Tensor& t, const OpDesc& desc, PrintState& ps, Fingerprint* fp) {
  if (t.device().type() != c10::DeviceType::PrivateUse1) return false;
  DeviceStorage* s = StorageOfTensor(t);
  ElementType dtype = ToElementType(t.scalar_type(), desc.name.c_str());
  const bool unfilled = !s->buffer && !s->pending() && !s->queued;  // planning gives it zeros of `dtype`
  if (unfilled) {
    ps.unfilled->emplace_back(s, dtype);
    fp->push_back(-5);
  } else if (s->dtype != dtype || !(s->pending() ? ps.recording : s->buffer != nullptr)) {
    return false;
  }
  Storages& storages = *ps.storages;
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
  ps.any_pending |= s->pending();
  ps.any_hinted |= CarriesDynamicHints(t);
  if (s->padded()) {
    ps.any_padded = true;
    PaddedPrint(*s, t.storage_offset(), fp);
  }
  return true;
}

// Appends argument i's part of the signature; false if the hit path cannot take it.
bool ArgPrint(const OpDesc& desc, const c10::Argument& a, const c10::IValue& v, PrintState& ps,
              Fingerprint* fp) {
  if (v.isNone()) {
    fp->push_back(-1);
    return true;
  }
  c10::TypeKind kind = KindOf(a);
  fp->push_back(static_cast<int64_t>(kind));
  switch (kind) {
    case c10::TypeKind::TensorType:
      if (!v.isTensor() || !v.toTensor().defined()) return false;
      if (v.toTensor().unsafeGetTensorImpl()->is_wrapped_number()) {  // a Python number: a runtime scalar
        fp->push_back(-3);
        fp->push_back(static_cast<int64_t>(v.toTensor().scalar_type()));
        return true;
      }
      return TensorPrint(v.toTensor(), desc, ps, fp);
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
      if (v.isTensorList()) {  // cat's, stack's tensors
        fp->push_back(-4);
        fp->push_back(static_cast<int64_t>(v.toListRef().size()));
        for (const c10::IValue& e : v.toListRef())
          if (!TensorPrint(e.toTensor(), desc, ps, fp)) return false;
        return true;
      }
      if (!v.isIntList()) return false;
      fp->push_back(static_cast<int64_t>(v.toListRef().size()));
      for (const c10::IValue& e : v.toListRef()) fp->push_back(e.toInt());
      return true;
    case c10::TypeKind::GeneratorType:  // an explicit generator: advanced at launch (Source::Kind::Rng)
      return v.isGenerator();
    case c10::TypeKind::StringType: {  // baked into the module (gelu's approximate, a reduction's name)
      const std::string& text = v.toStringRef();
      fp->push_back(static_cast<int64_t>(text.size()));
      for (size_t i = 0; i < text.size(); i += 8) {
        int64_t chunk = 0;
        std::memcpy(&chunk, text.data() + i, std::min<size_t>(8, text.size() - i));
        fp->push_back(chunk);
      }
      return true;
    }
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
// something else (an RNG state, a CPU tensor, a runtime float). `taken`:
// per plan parameter, whether the module takes it (all when empty); the
// sources of those alone.
bool SourcesOf(const Call& call, std::vector<Source>* sources, const std::vector<bool>& taken = {}) {
  const Plan& plan = call.plan;
  std::vector<bool> found(plan.params.size(), false);
  sources->assign(plan.params.size(), Source{Source::Kind::Buffer, 0});
  auto set = [&](int p, Source s) {
    (*sources)[p] = s;
    found[p] = true;
  };
  for (size_t i = 0; i < plan.args.size(); ++i) {
    const ArgPlan& a = plan.args[i];
    if ((a.kind == Arg::Kind::Tensor || a.kind == Arg::Kind::TensorList) && !a.tensors.empty()) {
      for (size_t j = 0; j < a.tensors.size(); ++j) {
        if (a.tensors[j] < 0) return false;  // None in a Tensor?[]
        const TensorIn& in = plan.inputs[a.tensors[j]];
        const int64_t element = a.kind == Arg::Kind::TensorList ? static_cast<int64_t>(j) : -1;
        set(in.storage_param, {Source::Kind::Buffer, i, ElementType::F32, element});
        if (in.offset_param >= 0) set(in.offset_param, {Source::Kind::Offset, i, ElementType::F32, element});
      }
    } else if (a.kind == Arg::Kind::Generator) {
      set(a.param, {Source::Kind::Rng, i, ElementType::U64, -1, RngDraws(call)});
    } else if (a.kind == Arg::Kind::Scalar) {
      set(a.param, {Source::Kind::Scalar, i, plan.params[a.param].dtype});
    }
  }
  for (size_t p = 0; p < plan.params.size(); ++p)
    if (!found[p] && plan.params[p].buffer_read)
      set(p, {Source::Kind::BufferOffset, 0, ElementType::I64, -1, 0, plan.params[p].offset});
  if (taken.empty()) return std::find(found.begin(), found.end(), false) == found.end();
  std::vector<Source> kept;
  for (size_t p = 0; p < found.size(); ++p) {
    if (!taken.at(p)) continue;
    if (!found[p]) return false;
    kept.push_back((*sources)[p]);
  }
  *sources = std::move(kept);
  return true;
}

// The tensor parameter `src` reads: a tensor arg, or an element of a tensor list.
const at::Tensor& TensorOf(const Source& src, const std::vector<c10::IValue>& args) {
  const c10::IValue& v = args[src.arg];
  return src.element < 0 ? v.toTensor() : v.toListRef()[src.element].toTensor();
}

runtime::LaunchParam ParamFrom(const Source& src, const std::vector<c10::IValue>& args, int device) {
  static const Plan no_storages;
  switch (src.kind) {
    case Source::Kind::Buffer:
      return runtime::LaunchParam::Of(StorageOfTensor(TensorOf(src, args))->buffer);
    case Source::Kind::Offset:
      return runtime::LaunchParam::Integer(TensorOf(src, args).storage_offset(), ElementType::I64);
    case Source::Kind::Rng: {  // the generator advanced as the full path advances it (FinishPlan)
      std::optional<at::Generator> gen;
      if (src.arg < args.size() && args[src.arg].isGenerator()) gen = args[src.arg].toGenerator();
      Param q{Param::Kind::Rng};
      std::tie(q.rng[0], q.rng[1]) = NextRngState(gen, device, src.draws);
      return LaunchValue(no_storages, q);
    }
    case Source::Kind::BufferOffset:
      return runtime::LaunchParam::Integer(src.offset, ElementType::I64);
    case Source::Kind::Scalar:
      break;
  }
  const c10::IValue& v = args[src.arg];
  Param q{Param::Kind::Scalar};
  q.scalar = v.isTensor() ? v.toTensor().item() : v.toScalar();  // a wrapped Python number, or a Scalar
  q.dtype = src.dtype;
  return LaunchValue(no_storages, q);
}

// Parameter `src` of a recorded call: the storage it reads, or its value.
KnownParam KnownFrom(const Source& src, const std::vector<c10::IValue>& args, int device) {
  KnownParam p;
  if (src.kind == Source::Kind::Buffer) p.storage = StorageOfTensor(TensorOf(src, args));
  else p.value = ParamFrom(src, args, device);
  return p;
}

std::vector<c10::IValue> Record(const RecordEntry& e, const std::vector<c10::IValue>& args) {
  std::vector<KnownParam> params;
  params.reserve(e.sources.size());
  for (const Source& s : e.sources) params.push_back(KnownFrom(s, args, e.kept->call.plan.device));
  return RecordKnownCall(e.kept, params);
}

// A fresh tpu tensor for an output, its storage of `dtype` (not yet written).
at::Tensor FreshOutput(const OutputSpec& spec, ElementType dtype) {
  at::Tensor t = at::detail::empty_strided_generic(
      spec.sizes, spec.strides, DeviceAllocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), spec.dtype);
  StorageOfTensor(t)->dtype = dtype;
  return t;
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
  for (size_t p = 0; p < e.sources.size(); ++p) {
    launch.params.push_back(ParamFrom(e.sources[p], args, device));
    launch.params.back().donate = !e.donated.empty() && e.donated[p];
  }
  std::vector<c10::IValue> results;
  results.reserve(e.outputs.size());
  launch.results.reserve(e.destinations.size() + e.dtypes.size());
  for (const Source& d : e.destinations) {  // as FinishPlan lists the written storages
    results.emplace_back(TensorOf(d, args));
    DeviceStorage* s = StorageOfTensor(results.back().toTensor());
    if (std::find(launch.results.begin(), launch.results.end(), s) == launch.results.end())
      launch.results.push_back(s);
  }
  size_t k = 0;
  for (const OutputSpec& spec : e.outputs) {
    results.emplace_back(spec.defined ? FreshOutput(spec, e.dtypes[k++]) : at::Tensor());
    if (spec.defined) launch.results.push_back(StorageOfTensor(results.back().toTensor()));
  }
  runtime::Run(rt, launch);
  ++rt.stats().cache_hits;
  ++rt.stats().hit_path_hits;
  CountNative(desc);
  return results;
}

std::vector<c10::IValue> LaunchBounded(const OpDesc& desc, const BoundedEntry& e,
                                       const std::vector<c10::IValue>& args, int device) {
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, device));
  const BoundedLaunch& b = e.launch;
  runtime::Launch launch;
  launch.exe = b.exe.get();
  launch.device = device;
  launch.op = &desc.name;
  launch.checks = &b.checks;
  launch.params.reserve(e.sources.size() + b.sizes.size());
  for (const Source& s : e.sources) launch.params.push_back(ParamFrom(s, args, device));
  for (int64_t size : b.sizes) launch.params.push_back(runtime::LaunchParam::Integer(size, ElementType::I32));
  std::vector<pjrt::BufferPtr> outs = runtime::Run(GetRuntime(), launch);
  std::vector<c10::IValue> results;
  results.reserve(e.outputs.size() + e.destinations.size());
  size_t k = 0;
  for (const Source& d : e.destinations) {  // each takes its result as its (padded) buffer
    results.emplace_back(TensorOf(d, args));
    b.results[k].Apply(StorageOfTensor(results.back().toTensor()), outs.at(k));
    ++k;
  }
  for (const OutputSpec& spec : e.outputs) {
    results.emplace_back(spec.defined ? FreshOutput(spec, e.dtypes[k]) : at::Tensor());
    if (!spec.defined) continue;
    b.results[k].Apply(StorageOfTensor(results.back().toTensor()), outs.at(k));
    ++k;
  }
  CountDynamicHit(/*hit_path=*/true);
  ++GetRuntime().stats().hit_path_hits;
  CountNative(desc);
  return results;
}

// An in-place call's destinations as the hit path launches them: every
// output is a destination written whole (no fresh output, no window of a
// storage: its offset would be a parameter no argument gives), each an
// argument in the order planning took them (desc.mutable_args). False: the
// full path keeps the call.
bool WholeDestinations(const Call& call, std::vector<Source>* dests) {
  const Plan& plan = call.plan;
  for (size_t i : call.desc->mutable_args) {
    if (i >= plan.args.size()) return false;
    const ArgPlan& a = plan.args[i];
    if (a.kind == Arg::Kind::Tensor && a.tensors.size() == 1) dests->push_back({Source::Kind::Buffer, i});
    else return false;
  }
  if (dests->size() != plan.dests.size() || call.specs.size() != dests->size()) return false;
  for (const Dest& d : plan.dests)
    if (!d.tensor.defined() || !d.geometry.whole || d.offset_param >= 0) return false;
  return true;
}

// An exact in-place call's entry (`e`): its whole destinations, the
// parameters whose storages it writes donated.
bool WholeWrites(const Call& call, FastEntry* e) {
  std::vector<Source> dests;
  if (!WholeDestinations(call, &dests)) return false;
  for (const Param& q : call.plan.params) e->donated.push_back(Donated(call, q));
  e->destinations = std::move(dests);
  e->outputs.clear();  // the destinations are all of them
  return true;
}

// An in-place bounded launch the hit path can repeat (into `dests`, their
// storages in `storages`): whole destinations (WholeDestinations), each a
// storage of its own which the module does not read (a fill, or a copy
// into a fresh tensor: its old buffer, or its zeros, matter to nobody),
// each given a layout (no window of a padded storage written in place).
bool OverwrittenDestinations(const Call& call, const BoundedLaunch& launch, std::vector<Source>* dests,
                             std::vector<const DeviceStorage*>* storages) {
  const Plan& plan = call.plan;
  if (!WholeDestinations(call, dests) || launch.results.size() != plan.dests.size()) return false;
  for (const Dest& d : plan.dests) {
    const int param = plan.storage_param[d.storage];
    if (param >= 0 && launch.taken.at(param)) return false;  // the module reads it
    const DeviceStorage* s = plan.storages[d.storage];
    if (std::find(storages->begin(), storages->end(), s) != storages->end()) return false;
    storages->push_back(s);
  }
  return true;
}

}  // namespace

void ClearFastEntries() {
  Entries().clear();
  RecordEntries().clear();
  BoundedEntries().clear();
}

void ClearBoundedFastEntries() { BoundedEntries().clear(); }

std::optional<std::vector<c10::IValue>> FastCall::TryLaunch(const OpDesc& desc,
                                                            const c10::FunctionSchema& schema,
                                                            const std::vector<c10::IValue>& args) {
  eligible_ = false;
  // Launches are queued (compiles running in the background): this call
  // is queued behind them by the full path.
  if (runtime::launch_queue::Busy()) return std::nullopt;
  if (desc.variant == Variant::Out) return std::nullopt;
  recording_ = Recording();
  storages_.clear();
  unfilled_.clear();
  PrintState ps;
  ps.recording = recording_;
  ps.storages = &storages_;
  ps.unfilled = &unfilled_;
  fingerprint_.clear();
  fingerprint_.push_back(reinterpret_cast<intptr_t>(&desc));
  fingerprint_.push_back(at::globalContext().float32MatmulPrecision() ==
                         at::Float32MatmulPrecision::HIGHEST);
  const auto& formals = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i)
    if (!ArgPrint(desc, formals[i], args[i], ps, &fingerprint_)) return std::nullopt;
  if (storages_.empty()) return std::nullopt;  // scalars may key the output shape
  eligible_ = true;
  any_padded_ = ps.any_padded;
  any_pending_ = ps.any_pending;
  any_hinted_ = ps.any_hinted;
  hash_ = Hash(fingerprint_);
  device_ = storages_[0]->device;
  if (auto results = TryKnown(desc, args)) return results;
  // The full path runs: RememberBounded compares the storages' layouts after it.
  layouts_.clear();
  for (const DeviceStorage* s : storages_) layouts_.push_back(LayoutHash(*s));
  return std::nullopt;
}

std::optional<std::vector<c10::IValue>> FastCall::TryKnown(const OpDesc& desc, const std::vector<c10::IValue>& args) {
  if (!any_padded_ && recording_) {
    auto& entries = RecordEntries();
    auto it = entries.find(hash_);
    if (it != entries.end() && Same(it->second.fingerprint, fingerprint_)) {
      FillUnfilled(desc, args);
      return Record(it->second, args);
    }
  } else if (!recording_) {
    auto& entries = Entries();
    auto it = entries.find(hash_);
    if (it != entries.end() && Same(it->second.fingerprint, fingerprint_) && it->second.exe) {
      FillUnfilled(desc, args);
      return Launch(desc, it->second, args, device_);
    }
  }
  if (!DynamicShapesActive() || any_pending_ || any_hinted_) return std::nullopt;
  auto& bounded = BoundedEntries();
  auto it = bounded.find(hash_);
  if (it == bounded.end() || !Same(it->second.fingerprint, fingerprint_)) return std::nullopt;
  // An overwrite while fused eager records: the full path runs the chain first
  // when it holds the storage (SettleRecordingFor).
  if (recording_ && !it->second.destinations.empty()) return std::nullopt;
  FillUnfilled(desc, args);
  return LaunchBounded(desc, it->second, args, device_);
}

void FastCall::FillUnfilled(const OpDesc& desc, const std::vector<c10::IValue>& args) {
  if (!unfilled_.empty()) GiveOverwrittenDestinationsBuffers(desc, args);
  for (const auto& [s, dtype] : unfilled_) PrepareStorage(s, dtype, /*keep_capacity=*/true);
}

void FastCall::RememberRecorded(const std::shared_ptr<const KeptCall>& kept) {
  if (!eligible_ || any_padded_ || !recording_ || !kept || kept->call.plan.device != device_) return;
  const Call& call = kept->call;
  RecordEntry e;
  if (!call.written.empty() || !SourcesOf(call, &e.sources)) return;
  for (const Source& s : e.sources)
    if (s.kind == Source::Kind::Rng) return;  // a chain draws at its own launch
  e.fingerprint.assign(fingerprint_.begin(), fingerprint_.end());
  e.kept = kept;
  auto& entries = RecordEntries();
  if (entries.size() >= 8192) entries.clear();  // signatures that never repeat
  entries[hash_] = std::move(e);
}

void FastCall::Remember(const Call& call, const pjrt::ExecutablePtr& exe,
                        const std::vector<OutputSpec>& outputs, const std::vector<std::string>& checks) {
  if (!eligible_ || recording_ || call.plan.device != device_) return;
  // An exact call on padded storages: the functional ones that left every layout as it was.
  if (any_padded_ && (call.desc->variant != Variant::Functional || !LayoutsKept())) return;
  FastEntry e;
  if (!SourcesOf(call, &e.sources)) return;
  e.fingerprint.assign(fingerprint_.begin(), fingerprint_.end());
  e.exe = exe;
  e.outputs = outputs;
  if (call.desc->variant == Variant::InPlace) {
    if (!WholeWrites(call, &e)) return;
  } else {
    for (const Dest& d : call.plan.dests) e.dtypes.push_back(d.dtype);
    size_t defined = 0;
    for (const OutputSpec& o : outputs) defined += o.defined;
    if (defined != e.dtypes.size() || !call.written.empty()) return;
  }
  e.checks = checks;
  auto& entries = Entries();
  if (entries.size() >= 8192) entries.clear();  // signatures that never repeat
  entries[hash_] = std::move(e);
}

bool FastCall::LayoutsKept(const std::vector<const DeviceStorage*>& written) const {
  if (layouts_.size() != storages_.size()) return false;
  for (size_t i = 0; i < storages_.size(); ++i)
    if (LayoutHash(*storages_[i]) != layouts_[i] &&
        std::find(written.begin(), written.end(), storages_[i]) == written.end())
      return false;
  return true;
}

void FastCall::RememberBounded(const Call& call, BoundedLaunch launch) {
  if (!eligible_ || any_pending_ || any_hinted_ || !DynamicShapesActive()) return;
  if (call.plan.device != device_) return;
  BoundedEntry e;
  std::vector<const DeviceStorage*> overwritten;
  if (call.desc->variant == Variant::InPlace) {
    if (!OverwrittenDestinations(call, launch, &e.destinations, &overwritten)) return;
  } else if (!call.written.empty()) {
    return;
  }
  // Padded through the host: the next call reads it as it is now.
  if (!LayoutsKept(overwritten)) return;
  if (!SourcesOf(call, &e.sources, launch.taken)) return;
  for (const Dest& d : call.plan.dests) e.dtypes.push_back(d.dtype);
  if (e.destinations.empty()) {
    e.outputs = call.cached();
    size_t defined = 0;
    for (const OutputSpec& o : e.outputs) defined += o.defined;
    if (defined != e.dtypes.size()) return;
  }
  if (launch.results.size() != e.dtypes.size()) return;
  e.fingerprint.assign(fingerprint_.begin(), fingerprint_.end());
  e.launch = std::move(launch);
  auto& entries = BoundedEntries();
  if (entries.size() >= 8192) entries.clear();  // sizes that never repeat
  entries[hash_] = std::move(e);
}

}  // namespace torch_tpu::aten
