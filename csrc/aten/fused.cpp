// Fused eager (TORCH_TPU_DEFER_AND_FUSE=1 or torch_tpu.fused()): calls are
// recorded into a chain instead of running one by one, and the chain runs as
// one executable when a value is needed (a sync point, a CPU fallback,
// TORCH_TPU_FUSE_MAX_OPS ops). Storage values produced by recorded calls are
// `pending`: numbered values (slots) of the chain; storages read before
// being written are parameters bound to their buffers at record time.
//
// Recording keeps each call's plan and keys it; it emits nothing. The chain's
// key (its calls' keys and how their inputs are bound) names its executable:
// only a chain never seen before is emitted into a module (each call through
// its rule, as strict eager emits it) and compiled. A warm chain costs its
// calls' plans and one launch, not a module's text per call.
#include <algorithm>
#include <atomic>
#include <unordered_map>
#include <unordered_set>

#include "aten/call.h"
#include "aten/fused.h"

namespace torch_tpu::aten {

using hlo::Value;
using runtime::DeviceStorage;

namespace {

using ModuleEmitter = std::function<std::vector<Value>(hlo::Builder&, const std::vector<Value>&)>;

// Where a recorded op's input comes from: a value the chain computed before
// it (a slot), or one of the chain's parameters.
struct Source {
  bool computed = false;
  int index = 0;
};

// One recorded op: an ATen call, emitted by its rule, or a module (a jax_op).
struct RecordedOp {
  std::shared_ptr<const KeptCall> call;
  ModuleEmitter emit;
  std::vector<Source> inputs;  // per plan parameter (a call) or input (a module)
  std::vector<int> results;    // slots: written storages then fresh outputs; or the module's outputs
};

struct Recorder {
  bool open = false;
  int device = -1;
  std::string key;
  std::vector<RecordedOp> ops;
  int slots = 0;                                          // values computed so far
  std::vector<runtime::LaunchParam> args;                 // per parameter
  std::vector<hlo::TensorType> param_types;               // per parameter
  std::unordered_map<DeviceStorage*, int> storage_param;  // storage -> parameter
  std::vector<DeviceStorage*> pending;                    // storages with new values
};

Recorder& Rec() {
  static auto* r = new Recorder();
  return *r;
}

// A chain's executable and the messages of its device assertions (results
// after the pending storages' values). exe null: the chain has no results.
struct Chain {
  pjrt::ExecutablePtr exe;
  std::vector<std::string> checks;
};

std::unordered_map<std::string, Chain>& Chains() {
  static auto* m = new std::unordered_map<std::string, Chain>();
  return *m;
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

void Open(Recorder& rec, int device) {
  if (rec.open) return;
  rec.open = true;
  rec.device = device;
}

// The storage's new value is the next slot.
int MarkPending(Recorder& rec, DeviceStorage* s) {
  if (!s->pending()) rec.pending.push_back(s);
  s->pending_value = rec.slots++;
  return s->pending_value;
}

// The chain's parameter holding the storage's buffer. A storage whose buffer
// was replaced outside the chain since it was bound (read as another dtype:
// its bytes reinterpreted) gets a new parameter: the old one holds the old
// buffer, of the old type.
int StorageParameter(Recorder& rec, DeviceStorage* s, const hlo::TensorType& type) {
  auto it = rec.storage_param.find(s);
  if (it != rec.storage_param.end() && rec.args[it->second].buffer == s->buffer) return it->second;
  int index = static_cast<int>(rec.args.size());
  rec.storage_param[s] = index;
  rec.param_types.push_back(type);
  rec.args.push_back(runtime::LaunchParam::Of(s->buffer));
  return index;
}

Source Computed(const DeviceStorage* s, std::string* key) {
  *key += "v" + std::to_string(s->pending_value) + ",";
  return Source{true, s->pending_value};
}

Source Parameter(int index, std::string* key) {
  *key += "p" + std::to_string(index) + ",";
  return Source{false, index};
}

// Where each plan parameter comes from: a pending value or a chain parameter.
std::vector<Source> BindParams(Recorder& rec, const KeptCall& kept, const std::vector<KnownParam>& params,
                               std::string* key) {
  std::vector<Source> sources;
  sources.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    DeviceStorage* st = params[i].storage;
    if (st) {
      sources.push_back(st->pending() ? Computed(st, key) : Parameter(StorageParameter(rec, st, kept.param_types[i]), key));
      continue;
    }
    rec.param_types.push_back(kept.param_types[i]);
    rec.args.push_back(params[i].value);
    sources.push_back(Parameter(static_cast<int>(rec.args.size()) - 1, key));
  }
  return sources;
}

void ClearPending(const std::vector<DeviceStorage*>& storages) {
  for (DeviceStorage* s : storages) s->pending_value = -1;
}

// Where each input comes from: its pending value, or a parameter bound to
// its buffer (compacted, of the input's dtype). Prepares every storage
// first: preparing one may flush the chain, after which none is pending.
std::vector<Source> BindInputs(Recorder& rec, const std::vector<at::Tensor>& inputs, std::string* key) {
  std::vector<hlo::ElementType> types;
  for (const at::Tensor& t : inputs) {
    types.push_back(ToElementType(t.scalar_type(), "fused chain input"));
    if (!PendingUsable(StorageOf(t), types.back())) PrepareStorage(StorageOf(t), types.back());
  }
  std::vector<Source> sources;
  for (size_t i = 0; i < inputs.size(); ++i) {
    DeviceStorage* s = StorageOf(inputs[i]);
    if (PendingUsable(s, types[i])) {
      sources.push_back(Computed(s, key));
      continue;
    }
    PrepareStorage(s, types[i]);  // not pending: never flushes
    sources.push_back(Parameter(StorageParameter(rec, s, hlo::TensorType{s->dtype, {s->buffer_numel()}}), key));
  }
  return sources;
}

// Rules a chain has emitted before: later calls of the same key are only
// recorded (their emission cannot raise: no CPU fallback is lost).
std::unordered_set<std::string>& EmittedKeys() {
  static auto* keys = new std::unordered_set<std::string>();
  return *keys;
}

// The first call of a key is emitted alone, at once, as strict eager would
// compile it, so that a rule that cannot lower these arguments raises here
// (the op falls back to the CPU) and not when the chain runs.
void CheckEmits(const Call& call) {
  if (EmittedKeys().count(call.plan.key)) return;
  hlo::Builder b("check");
  std::vector<Value> params;
  for (const Param& q : call.plan.params) params.push_back(b.Parameter(ParamType(call.plan, q)));
  EmitCall(call, b, params);
  EmittedKeys().insert(call.plan.key);
}

// The call as the chain keeps it: its storages' layouts and parameter
// types recorded, no tensors held (a destination freed before the chain runs
// is no result).
std::shared_ptr<const KeptCall> Keep(Call call) {
  auto kept = std::make_shared<KeptCall>();
  for (const Param& q : call.plan.params) kept->param_types.push_back(ParamType(call.plan, q));
  for (DeviceStorage* s : call.plan.storages) call.plan.layouts.push_back(StorageLayout{s->real_shape, s->padded_shape});
  for (Dest& d : call.plan.dests) d.tensor = at::Tensor();
  call.plan.dest_tensors.clear();
  call.cached_specs = nullptr;
  call.computed_specs.clear();
  kept->call = std::move(call);
  return kept;
}

// The plan's parameters as a recorded call binds them.
std::vector<KnownParam> ParamsOf(const Plan& plan) {
  std::vector<KnownParam> params(plan.params.size());
  for (size_t i = 0; i < plan.params.size(); ++i) {
    const Param& q = plan.params[i];
    if (q.kind == Param::Kind::Storage) params[i].storage = plan.storages[q.storage];
    else params[i].value = LaunchValue(plan, q);
  }
  return params;
}

// Records the kept call with these parameters: `written` storages take new
// values, then each result is `dests[i]` (an existing tensor written through
// its view) or, undefined, a fresh tensor with a new value.
std::vector<c10::IValue> Record(const std::shared_ptr<const KeptCall>& kept, const std::vector<KnownParam>& params,
                                const std::vector<DeviceStorage*>& written, const std::vector<at::Tensor>& dests) {
  const Call& call = kept->call;
  Recorder& rec = Rec();
  if (rec.open && rec.device != call.plan.device) FlushPending();
  Open(rec, call.plan.device);
  RecordedOp op;
  op.call = kept;
  // Straight into the chain's key (binding never runs the chain).
  rec.key += call.plan.key;
  rec.key += '#';
  op.inputs = BindParams(rec, *kept, params, &rec.key);
  rec.key += ';';
  for (DeviceStorage* s : written) op.results.push_back(MarkPending(rec, s));
  CountNative(*call.desc);
  std::vector<c10::IValue> results;
  for (size_t i = 0; i < call.specs.size(); ++i) {
    if (i < dests.size() && dests[i].defined()) {
      results.push_back(dests[i]);
      continue;
    }
    at::Tensor t = FreshTensor(call, i);
    op.results.push_back(MarkPending(rec, StorageOf(t)));
    results.push_back(t);
  }
  rec.ops.push_back(std::move(op));
  results = WithUndefined(call, std::move(results));
  if (rec.ops.size() >= MaxChain()) FlushPending();
  return results;
}

// Emits one recorded op, its results into their slots.
void EmitOp(hlo::Builder& b, const RecordedOp& op, const std::vector<Value>& params, std::vector<Value>* slots,
            std::vector<std::pair<Value, std::string>>* checks) {
  std::vector<Value> inputs;
  for (const Source& s : op.inputs) inputs.push_back(s.computed ? (*slots)[s.index] : params[s.index]);
  std::vector<Value> results;
  if (op.call) {
    Emitted e = EmitCall(op.call->call, b, inputs);
    results = e.written_values;
    results.insert(results.end(), e.fresh_values.begin(), e.fresh_values.end());
    for (const auto& c : e.checks) checks->emplace_back(c.ok, CheckMessage(*op.call->call.desc, c.message));
  } else {
    results = op.emit(b, inputs);
  }
  for (size_t k = 0; k < op.results.size(); ++k) (*slots)[op.results[k]] = results.at(k);
}

// The chain's module: its ops in order; results: the pending storages'
// values (each aliased to its storage's parameter, aliases[k] >= 0), then
// the assertions. Returns "" when it has no results.
std::string EmitChain(const Recorder& r, const std::vector<int>& aliases, std::vector<std::string>* messages) {
  hlo::Builder b("fused");
  std::vector<Value> params;
  for (const hlo::TensorType& t : r.param_types) params.push_back(b.Parameter(t));
  std::vector<Value> slots(static_cast<size_t>(r.slots));
  std::vector<std::pair<Value, std::string>> checks;
  for (const RecordedOp& op : r.ops) EmitOp(b, op, params, &slots, &checks);
  std::vector<Value> outs;
  for (size_t k = 0; k < r.pending.size(); ++k) {
    outs.push_back(slots[static_cast<size_t>(r.pending[k]->pending_value)]);
    if (aliases[k] >= 0) b.SetParameterAttrs(aliases[k], "tf.aliasing_output = " + std::to_string(k) + " : i32");
  }
  for (const auto& c : checks) {
    outs.push_back(c.first);
    messages->push_back(c.second);
  }
  if (outs.empty()) return "";
  b.Return(outs);
  return b.ToText();
}

// The chain's executable: known, or emitted and compiled (or loaded).
const Chain& ChainFor(const Recorder& r, const std::string& key, const std::vector<int>& aliases) {
  auto& rt = GetRuntime();
  auto& chains = Chains();
  auto found = chains.find(key);
  if (found != chains.end()) {
    ++rt.stats().cache_hits;
    return found->second;
  }
  Chain chain;
  std::string text = EmitChain(r, aliases, &chain.checks);
  if (!text.empty()) chain.exe = rt.GetOrCompile(key, r.device, [&] { return std::move(text); });
  // Keys of chains that never repeat (exact shapes in a growing decode loop)
  // are long: bound the map; a chain dropped here is emitted again, and its
  // executable found in the runtime's cache.
  if (chains.size() >= 4096) chains.clear();
  return chains[key] = std::move(chain);
}

// Runs a taken recording: results are the pending storages' new values
// (each aliased to its parameter, which is donated), then the assertions.
void RunRecording(Recorder& r) {
  // A call's key names its device (call_plan.cpp), a module's does not.
  std::string key = r.key + "|@" + std::to_string(r.device) + "|out:";
  std::vector<int> aliases;
  for (DeviceStorage* s : r.pending) {
    key += std::to_string(s->pending_value) + ",";
    auto it = r.storage_param.find(s);
    aliases.push_back(it == r.storage_param.end() ? -1 : it->second);
    if (aliases.back() < 0) continue;
    r.args[it->second].donate = true;
    key += "a" + std::to_string(it->second) + ",";
  }
  static const std::string op = "fused chain";
  try {
    const Chain& chain = ChainFor(r, key, aliases);
    if (chain.exe) {
      runtime::Launch launch;
      launch.exe = chain.exe.get();
      launch.device = r.device;
      launch.op = &op;
      launch.params = std::move(r.args);
      launch.checks = &chain.checks;
      for (DeviceStorage* s : r.pending) {
        launch.results.push_back(s);
        launch.result_types.push_back(s->dtype);
      }
      runtime::Run(GetRuntime(), launch);
    }
  } catch (...) {
    ClearPending(r.pending);
    throw;
  }
  ClearPending(r.pending);
}

}  // namespace

bool Recording() { return FusionEnabled() && !GetRuntime().launch_blocking(); }

bool PendingUsable(const DeviceStorage* s, hlo::ElementType t) {
  return s->pending() && s->dtype == t && s->device == Rec().device && Recording();
}

void SettleRecordingFor(const Call& call) {
  const Plan& plan = call.plan;
  Recorder& rec = Rec();
  if (!rec.open) return;
  bool settle = std::any_of(plan.storages.begin(), plan.storages.end(),
                            [](const DeviceStorage* s) { return s->pending(); });
  for (size_t w : call.written) settle |= rec.storage_param.count(plan.storages[w]) > 0;
  if (settle) FlushPending();
}

bool CompactForRecording(const Call& call) {
  bool compacted = false;
  for (size_t w : call.written) {
    DeviceStorage* s = call.plan.storages[w];
    if (!s->padded()) continue;
    CompactStorage(s);
    compacted = true;
  }
  return compacted;
}

std::vector<c10::IValue> RecordCall(Call& call, std::shared_ptr<const KeptCall>* kept) {
  CheckEmits(call);
  std::vector<KnownParam> params = ParamsOf(call.plan);
  std::vector<DeviceStorage*> written;
  for (size_t w : call.written) written.push_back(call.plan.storages[w]);
  std::vector<at::Tensor> dests;
  for (const Dest& d : call.plan.dests) dests.push_back(d.fresh ? at::Tensor() : d.tensor);
  std::shared_ptr<const KeptCall> k = Keep(std::move(call));
  if (kept) *kept = k;
  return Record(k, params, written, dests);
}

std::vector<c10::IValue> RecordKnownCall(const std::shared_ptr<const KeptCall>& kept,
                                         const std::vector<KnownParam>& params) {
  return Record(kept, params, {}, {});
}

std::optional<std::vector<at::Tensor>> RecordModule(const RecordedModule& m) {
  if (!Recording()) return std::nullopt;
  Recorder& rec = Rec();
  if (rec.open && rec.device != m.device) FlushPending();
  RecordedOp op;
  std::string key = m.key + "#";
  op.inputs = BindInputs(rec, m.inputs, &key);  // may run the chain recorded so far
  Open(rec, m.device);
  op.emit = m.emit;
  rec.key += key + ";";
  std::vector<at::Tensor> results;
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, m.device));
  for (const hlo::TensorType& type : m.outputs) {
    at::Tensor t = at::detail::empty_generic(type.shape, DeviceAllocator(),
                                             c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                             ToScalarType(type.dtype), std::nullopt);
    StorageOf(t)->dtype = type.dtype;
    op.results.push_back(MarkPending(rec, StorageOf(t)));
    results.push_back(t);
  }
  rec.ops.push_back(std::move(op));
  if (rec.ops.size() >= MaxChain()) FlushPending();
  return results;
}

void SetFusion(bool enabled) {
  DrainLaunches();  // recorded calls read buffers: none may be stale
  if (!enabled) FlushPending();
  g_fusion_override = enabled ? 1 : 0;
}

void ClearChainExecutables() { Chains().clear(); }

bool FusionEnabled() {
  int v = g_fusion_override.load();
  return v >= 0 ? v == 1 : FusionFromEnv();
}

bool ForgetStorage(DeviceStorage* s) {
  Recorder& rec = Rec();
  if (!rec.open && rec.args.empty()) return false;
  bool held = rec.storage_param.erase(s) > 0;  // its buffer stays alive in rec.args
  if (s->pending()) rec.pending.erase(std::find(rec.pending.begin(), rec.pending.end(), s));
  return held;
}

void FlushPending() {
  DrainLaunches();  // launches queued while their executables compiled
  struct Settle {  // memory counters: what was allocated meanwhile now holds buffers
    ~Settle() { SettleDeferredStorages(); }
  } settle;
  Recorder& rec = Rec();
  if (!rec.open) return;
  // Take the recording first: anything below may re-enter (allocations).
  Recorder r = std::move(rec);
  rec = Recorder();
  struct Release {  // after the counters peaked with the chain's inputs and results
    ~Release() { SettleDeferredStorages(), ReleaseRecordingBuffers(); }
  } release;
  RunRecording(r);
}

}  // namespace torch_tpu::aten
