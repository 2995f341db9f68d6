// Fused eager (TORCH_TPU_DEFER_AND_FUSE=1 or torch_tpu.fused()): calls are
// recorded into one module instead of running one by one, and the chain
// runs as one executable when a value is needed (a sync point, a CPU
// fallback, TORCH_TPU_FUSE_MAX_OPS ops). Storage values produced by recorded
// calls are `pending` values of the module; storages read before being
// written are parameters bound to their buffers at record time.
#include <algorithm>
#include <atomic>
#include <unordered_map>

#include "aten/call.h"
#include "aten/fused.h"

namespace torch_tpu::aten {

using hlo::Value;
using runtime::DeviceStorage;

namespace {

struct Recorder {
  std::unique_ptr<hlo::Builder> b;
  int device = -1;
  std::string key;
  size_t num_ops = 0;
  std::vector<runtime::LaunchParam> args;                 // per parameter
  std::vector<Value> param_values;                        // per parameter
  std::unordered_map<DeviceStorage*, int> storage_param;  // storage -> parameter
  std::vector<DeviceStorage*> pending;                    // storages with new values
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

Value PendingValue(const DeviceStorage* s) {
  Value v;
  v.id = s->pending_value;
  v.type = hlo::TensorType{s->dtype, {s->numel()}};
  return v;
}

void MarkPending(Recorder& rec, DeviceStorage* s, Value v) {
  if (!s->pending()) rec.pending.push_back(s);
  s->pending_value = v.id;
}

// The chain's parameter holding the storage's buffer. A storage whose buffer
// was replaced outside the chain since it was bound (read as another dtype:
// its bytes reinterpreted) gets a new parameter: the old one holds the old
// buffer, of the old type.
int StorageParameter(Recorder& rec, DeviceStorage* s, const hlo::TensorType& type) {
  auto it = rec.storage_param.find(s);
  if (it != rec.storage_param.end() && rec.args[it->second].buffer == s->buffer) return it->second;
  int index = rec.b->num_parameters();
  rec.storage_param[s] = index;
  rec.param_values.push_back(rec.b->Parameter(type));
  rec.args.push_back(runtime::LaunchParam::Of(s->buffer));
  return index;
}

// The module parameter (or pending value) for each plan parameter.
std::vector<Value> BindParams(Recorder& rec, const Plan& plan, std::string* key) {
  std::vector<Value> params;
  for (const Param& q : plan.params) {
    if (q.kind == Param::Kind::Storage) {
      DeviceStorage* st = plan.storages[q.storage];
      if (st->pending()) {
        params.push_back(PendingValue(st));
        *key += "v" + std::to_string(st->pending_value) + ",";
        continue;
      }
      int index = StorageParameter(rec, st, ParamType(plan, q));
      params.push_back(rec.param_values[index]);
      *key += "p" + std::to_string(index) + ",";
      continue;
    }
    int index = rec.b->num_parameters();
    rec.param_values.push_back(rec.b->Parameter(ParamType(plan, q)));
    params.push_back(rec.param_values.back());
    rec.args.push_back(LaunchValue(plan, q));
    *key += "p" + std::to_string(index) + ",";
  }
  return params;
}

void ClearPending(const std::vector<DeviceStorage*>& storages) {
  for (DeviceStorage* s : storages) s->pending_value = -1;
}

// The chain's value of each input: its pending value, or a parameter bound
// to its buffer (compacted, of the input's dtype). Prepares every storage
// first: preparing one may flush the chain, after which none is pending.
std::vector<Value> BindInputs(Recorder& rec, const std::vector<at::Tensor>& inputs, std::string* key) {
  std::vector<hlo::ElementType> types;
  for (const at::Tensor& t : inputs) {
    types.push_back(ToElementType(t.scalar_type(), "fused chain input"));
    if (!PendingUsable(StorageOf(t), types.back())) PrepareStorage(StorageOf(t), types.back());
  }
  std::vector<Value> values;
  for (size_t i = 0; i < inputs.size(); ++i) {
    DeviceStorage* s = StorageOf(inputs[i]);
    if (PendingUsable(s, types[i])) {
      values.push_back(PendingValue(s));
      *key += "v" + std::to_string(s->pending_value) + ",";
      continue;
    }
    PrepareStorage(s, types[i]);  // not pending: never flushes
    if (!rec.b) rec.b = std::make_unique<hlo::Builder>("fused");
    int index = StorageParameter(rec, s, hlo::TensorType{s->dtype, {s->buffer_numel()}});
    values.push_back(rec.param_values[index]);
    *key += "p" + std::to_string(index) + ",";
  }
  return values;
}

// Runs a taken recording: results are the pending storages' new values
// (each aliased to its parameter, which is donated), then the assertions.
void RunRecording(Recorder& r) {
  auto& rt = GetRuntime();
  std::vector<Value> outs;
  std::string key = r.key + "|out:";
  for (size_t k = 0; k < r.pending.size(); ++k) {
    DeviceStorage* s = r.pending[k];
    outs.push_back(PendingValue(s));
    key += std::to_string(s->pending_value) + ",";
    auto it = r.storage_param.find(s);
    if (it != r.storage_param.end()) {
      r.b->SetParameterAttrs(it->second, "tf.aliasing_output = " + std::to_string(k) + " : i32");
      r.args[it->second].donate = true;
      key += "a" + std::to_string(it->second) + ",";
    }
  }
  std::vector<std::string> messages;
  for (const auto& c : r.checks) {
    outs.push_back(c.first);
    messages.push_back(c.second);
  }
  if (outs.empty()) return ClearPending(r.pending);
  r.b->Return(outs);
  static const std::string op = "fused chain";
  runtime::Launch launch;
  launch.device = r.device;
  launch.op = &op;
  launch.params = std::move(r.args);
  launch.checks = &messages;
  for (DeviceStorage* s : r.pending) {
    launch.results.push_back(s);
    launch.result_types.push_back(s->dtype);
  }
  try {
    auto exe = rt.GetOrCompile(key, r.device, [&] { return r.b->ToText(); });
    launch.exe = exe.get();
    runtime::Run(rt, launch);
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
  if (!rec.b) return;
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

std::vector<c10::IValue> RecordCall(Call& call) {
  const Plan& plan = call.plan;
  Recorder& rec = Rec();
  if (rec.b && rec.device != plan.device) FlushPending();
  if (!rec.b) {
    rec.b = std::make_unique<hlo::Builder>("fused");
    rec.device = plan.device;
  }
  std::string key = plan.key + "#";
  std::vector<Value> params = BindParams(rec, plan, &key);
  Emitted e = EmitCall(call, *rec.b, params);
  rec.key += key + ";";
  ++rec.num_ops;
  for (size_t k = 0; k < call.written.size(); ++k)
    MarkPending(rec, plan.storages[call.written[k]], e.written_values[k]);
  for (const auto& c : e.checks) rec.checks.emplace_back(c.ok, call.desc->name + ": " + c.message);
  CountNative(*call.desc);
  std::vector<c10::IValue> results;
  size_t fresh = 0;
  for (size_t i = 0; i < call.specs.size(); ++i) {
    if (plan.dests[i].tensor.defined()) {
      results.push_back(plan.dests[i].tensor);
      continue;
    }
    at::Tensor t = FreshTensor(call, i);
    MarkPending(rec, StorageOf(t), e.fresh_values[fresh++]);
    results.push_back(t);
  }
  if (rec.num_ops >= MaxChain()) FlushPending();
  return WithUndefined(call, std::move(results));
}

std::optional<std::vector<at::Tensor>> RecordModule(const RecordedModule& m) {
  if (!Recording()) return std::nullopt;
  Recorder& rec = Rec();
  if (rec.b && rec.device != m.device) FlushPending();
  std::string key = m.key + "#";
  std::vector<Value> inputs = BindInputs(rec, m.inputs, &key);
  if (!rec.b) rec.b = std::make_unique<hlo::Builder>("fused");
  rec.device = m.device;
  std::vector<Value> outs = m.emit(*rec.b, inputs);
  rec.key += key + ";";
  ++rec.num_ops;
  std::vector<at::Tensor> results;
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, m.device));
  for (size_t i = 0; i < m.outputs.size(); ++i) {
    const hlo::TensorType& type = m.outputs[i];
    at::Tensor t = at::detail::empty_generic(type.shape, DeviceAllocator(),
                                             c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                             ToScalarType(type.dtype), std::nullopt);
    StorageOf(t)->dtype = type.dtype;
    MarkPending(rec, StorageOf(t), outs.at(i));
    results.push_back(t);
  }
  if (rec.num_ops >= MaxChain()) FlushPending();
  return results;
}

void SetFusion(bool enabled) {
  DrainLaunches();  // recorded calls read buffers: none may be stale
  if (!enabled) FlushPending();
  g_fusion_override = enabled ? 1 : 0;
}

bool FusionEnabled() {
  int v = g_fusion_override.load();
  return v >= 0 ? v == 1 : FusionFromEnv();
}

bool ForgetStorage(DeviceStorage* s) {
  Recorder& rec = Rec();
  if (!rec.b) return false;
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
  if (!rec.b) return;
  // Take the recording first: anything below may re-enter (allocations).
  Recorder r = std::move(rec);
  rec = Recorder();
  struct Release {  // after the counters peaked with the chain's inputs and results
    ~Release() { SettleDeferredStorages(), ReleaseRecordingBuffers(); }
  } release;
  RunRecording(r);
}

}  // namespace torch_tpu::aten
