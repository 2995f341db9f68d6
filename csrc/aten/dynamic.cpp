// Bounded dynamic shapes in strict eager: new sizes of a known op signature
// stop compiling.
//
// Policy (like Dynamo's automatic dynamic shapes). The signature of a call is
// its exact-shape cache key with every input's geometry replaced by its rank
// and which dims are 1 (rule, dtypes, baked attributes, aliasing, scalar
// kinds, precision and device stay). The first sizes a signature sees compile
// static, exactly as before. A later call with another size in some dim makes
// that dim dynamic for the signature (sticky): the call runs on one
// executable bounded by the size's bucket, the real sizes passed as runtime
// i32 parameters; XLA's dynamic padder masks reductions and contractions.
// Sizes inside the bucket hit that executable; a size past it compiles the
// next bucket. Sizes already compiled static keep their static executable.
//
// Buckets: 16 for sizes up to 16, else the size rounded up to a multiple of
// 2^(floor(log2 s) - 3), i.e. 8 buckets per octave (16, 18, 20, ..., 30, 32,
// 36, 40, ...): a dynamic dim is padded by less than 12.5% (2 dynamic dims:
// < 26.6%).
//
// Storage: tensors keep exact PyTorch storages (nbytes, data_ptr, views
// untouched); the executable takes bucket-sized buffers. The padding is at
// the executable boundary: a storage a dynamic dim reads is copied into a
// zero-padded buffer of the bucket's sizes (real elements at the front of
// each dim), which the executable reshapes statically and marks with
// set_dimension_size (no data moves on device; a packed layout would need
// dynamic_reshape, which XLA's padder lowers with sorts: 0.2 s instead of
// 5 ms for a 2x35x256 exp on XLA:CPU). An output with dynamic dims is
// returned dynamic, which PJRT hands back packed: its real elements are the
// prefix of the bucket-sized buffer.
// This first step pads and cuts through the host (PJRT has no device-side
// copy without an executable, and one per size would compile per size): a
// synchronous round trip per dynamic tensor. Storages read only through
// static dims (weights, transposed views) are passed as they are.
//
// What runs dynamic: the functional ops of DynamicOps() (elementwise,
// reductions, softmax, matmul/linear) whose dynamic inputs are contiguous
// whole storages and whose outputs are fresh and contiguous. Everything else,
// in-place and out= variants, fused eager and compiled graphs keep exact
// shapes. A dynamic module XLA rejects turns its signature back to exact
// shapes (correct first).
//
// Controls: TORCH_TPU_DYNAMIC_SHAPES=0 (default: exact shapes), auto (the
// policy above), 1 (every dim of size > 1 dynamic from the first call);
// torch_tpu.dynamic.set_mode() at run time.
#include <algorithm>
#include <cstdlib>
#include <unordered_map>
#include <unordered_set>

#include "aten/call.h"
#include "aten/dynamic.h"

namespace torch_tpu::aten {

using hlo::ElementType;
using hlo::TensorType;
using hlo::Value;
using lowering::Arg;

namespace {

DynamicMode ParseMode(const std::string& v) {
  if (v == "auto") return DynamicMode::Auto;
  if (v == "1") return DynamicMode::All;
  if (v.empty() || v == "0") return DynamicMode::Off;
  throw std::invalid_argument("TORCH_TPU_DYNAMIC_SHAPES must be auto, 0 or 1, got '" + v + "'");
}

DynamicMode& ModeRef() {
  static DynamicMode mode = [] {
    const char* v = std::getenv("TORCH_TPU_DYNAMIC_SHAPES");
    return ParseMode(v ? v : "0");
  }();
  return mode;
}

// The op families of the first slice: rules the dynamic padder needs no
// help with (elementwise, reductions, softmax, matmul).
const std::unordered_set<std::string>& DynamicOps() {
  static const std::unordered_set<std::string> ops = {
      // unary
      "abs", "neg", "exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "sin", "cos", "tanh",
      "sigmoid", "relu", "gelu", "silu", "erf", "reciprocal", "sign", "floor", "ceil", "round",
      "pow.Tensor_Scalar", "leaky_relu", "hardtanh", "elu", "softplus", "clamp",
      // binary (broadcasting)
      "add.Tensor", "sub.Tensor", "mul.Tensor", "div.Tensor", "div.Tensor_mode", "maximum",
      "minimum", "pow.Tensor_Tensor", "where.self", "eq.Tensor", "ne.Tensor", "lt.Tensor",
      "le.Tensor", "gt.Tensor", "ge.Tensor", "eq.Scalar", "ne.Scalar", "lt.Scalar", "le.Scalar",
      "gt.Scalar", "ge.Scalar", "add.Scalar", "sub.Scalar", "mul.Scalar", "div.Scalar",
      // reductions
      "sum", "sum.dim_IntList", "mean", "mean.dim", "amax", "amin", "prod", "prod.dim_int",
      // softmax
      "_softmax", "_log_softmax",
      // matmul / linear
      "mm", "bmm", "addmm", "matmul", "linear",
  };
  return ops;
}

int64_t Bucket(int64_t s) {
  if (s <= 16) return 16;
  int64_t k = 0;
  while ((int64_t{1} << (k + 1)) <= s) ++k;  // k = floor(log2 s)
  int64_t step = int64_t{1} << (k - 3);
  return (s + step - 1) / step * step;
}

// What a signature has seen: the first sizes of each input, and which input
// dims are dynamic.
struct SignatureState {
  std::vector<std::vector<int64_t>> first;
  std::vector<std::vector<bool>> dynamic;
  bool exact_only = false;  // a dynamic module failed: exact shapes from now on
};

// A compiled bounded-dynamic executable and what launching it needs.
struct DynamicCompiled {
  pjrt::ExecutablePtr exe;
  std::vector<std::vector<bool>> out_dynamic;  // per output, per dim
  std::vector<std::vector<int64_t>> out_bucket;  // per output: its sizes in the executable
};

struct DynamicState {
  std::unordered_map<std::string, SignatureState> signatures;
  std::unordered_map<std::string, DynamicCompiled> executables;
  std::unordered_map<std::string, std::vector<OutputSpec>> specs;  // exact key -> real specs
  DynamicCounters counters;
  int64_t generation = -1;
};

DynamicState& State() {
  static auto* s = new DynamicState();
  return *s;
}

DynamicCounters& Counters() {
  DynamicState& s = State();
  int64_t g = GetRuntime().stats_generation();
  if (s.generation != g) {
    s.counters = DynamicCounters();
    s.generation = g;
  }
  return s.counters;
}

std::string Signature(const Plan& plan) {
  std::string sig;
  size_t at = 0;
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    auto [begin, end] = plan.geometry_spans[i];
    if (!plan.inputs[i].geometry.whole) continue;  // views (a transposed weight): sizes stay in
    sig.append(plan.key, at, begin - at);
    sig += "r";
    for (int64_t d : plan.inputs[i].geometry.sizes) sig += d == 1 ? '1' : (d == 0 ? '0' : 'x');
    at = end;
  }
  sig.append(plan.key, at, std::string::npos);
  return sig;
}

bool Eligible(const Call& call) {
  const Plan& plan = call.plan;
  if (call.desc->variant != Variant::Functional || plan.inputs.empty()) return false;
  if (!DynamicOps().count(call.desc->name) || plan.geometry_spans.size() != plan.inputs.size())
    return false;
  for (const auto& q : plan.params)
    if (q.kind == Param::Kind::Rng) return false;
  for (const auto& a : plan.args)
    if (a.kind == Arg::Kind::TensorList || a.kind == Arg::Kind::Generator) return false;
  for (bool u : call.undefined_outputs)
    if (u) return false;
  for (const auto& s : call.specs)
    if (s.strides != lowering::ContiguousStrides(s.sizes)) return false;
  return true;
}

// Updates the signature with this call's sizes; returns the dynamic dims of
// each input (all false: run with exact shapes).
std::vector<std::vector<bool>> Observe(SignatureState& st, const Plan& plan, DynamicMode mode) {
  const size_t n = plan.inputs.size();
  if (st.first.empty()) {
    for (const auto& in : plan.inputs) {
      st.first.push_back(in.geometry.sizes);
      st.dynamic.emplace_back(in.geometry.sizes.size(), false);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const auto& sizes = plan.inputs[i].geometry.sizes;
    for (size_t d = 0; d < sizes.size(); ++d)
      if (sizes[d] > 1 && (mode == DynamicMode::All || sizes[d] != st.first[i][d]))
        st.dynamic[i][d] = true;
  }
  return st.dynamic;
}

bool AnyDynamic(const std::vector<bool>& v) { return std::find(v.begin(), v.end(), true) != v.end(); }

// Per input: its sizes with dynamic dims at their bucket.
std::vector<std::vector<int64_t>> BucketSizes(const Plan& plan,
                                              const std::vector<std::vector<bool>>& dyn) {
  std::vector<std::vector<int64_t>> out;
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    std::vector<int64_t> s = plan.inputs[i].geometry.sizes;
    for (size_t d = 0; d < s.size(); ++d)
      if (dyn[i][d]) s[d] = Bucket(s[d]);
    out.push_back(s);
  }
  return out;
}

int64_t Numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// The (first) dynamic input reading padded storage `storage`.
size_t PaddedInputIndex(const Plan& plan, size_t storage) {
  for (size_t i = 0; i < plan.inputs.size(); ++i)
    if (plan.inputs[i].storage == storage) return i;
  throw std::logic_error("dynamic: padded storage without an input");
}

// Which storages the executable takes padded (read through a dynamic dim);
// false when such a storage is also read otherwise (exact shapes then).
bool PaddedStorages(const Plan& plan, const std::vector<std::vector<bool>>& dyn,
                    const std::vector<std::vector<int64_t>>& bucket, std::vector<int64_t>* capacity) {
  capacity->assign(plan.storages.size(), -1);
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    if (!AnyDynamic(dyn[i])) continue;
    const TensorIn& in = plan.inputs[i];
    if (!in.geometry.whole || Numel(bucket[i]) >= (int64_t{1} << 31)) return false;
    (*capacity)[in.storage] = Numel(bucket[i]);
  }
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    const TensorIn& in = plan.inputs[i];
    if ((*capacity)[in.storage] < 0) continue;
    if (!AnyDynamic(dyn[i]) || bucket[i] != bucket[PaddedInputIndex(plan, in.storage)]) return false;
  }
  return true;
}

std::string DynamicKey(const std::string& sig, const Plan& plan,
                       const std::vector<std::vector<bool>>& dyn,
                       const std::vector<std::vector<int64_t>>& bucket) {
  std::string key = "dyn|" + sig + "|";
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    if (!AnyDynamic(dyn[i])) {
      plan.inputs[i].geometry.AppendKey(&key);
    } else {
      for (size_t d = 0; d < bucket[i].size(); ++d)
        key += (dyn[i][d] ? "<" : "") + std::to_string(bucket[i][d]) + ",";
    }
    key += ";";
  }
  return key;
}

// Output specs with the inputs at `sizes` (meta kernel).
std::vector<OutputSpec> MetaSpecsAt(const Call& call, const c10::OperatorHandle& op,
                                    const std::vector<c10::IValue>& args,
                                    const std::vector<std::vector<int64_t>>& sizes) {
  torch::jit::Stack stack;
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = args[i];
    const ArgPlan& ap = call.plan.args[i];
    if (v.isTensor() && ap.kind == Arg::Kind::Tensor && !ap.tensors.empty() && ap.param < 0) {
      const at::Tensor& t = v.toTensor();
      stack.push_back(at::empty(sizes[ap.tensors[0]], t.options().device(at::kMeta)));
    } else if (v.isDevice()) {
      stack.push_back(c10::Device(at::kMeta));
    } else {
      stack.push_back(v);
    }
  }
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.callBoxed(stack);
  }
  std::vector<OutputSpec> out;
  for (const auto& r : stack) {
    if (!r.isTensor()) throw lowering::Unsupported("dynamic: a non-tensor result");
    const at::Tensor& t = r.toTensor();
    out.push_back({t.sizes().vec(), t.strides().vec(), t.scalar_type()});
  }
  return out;
}

Value I32(hlo::Builder& b, int64_t v) { return b.ConstantInt(ElementType::I32, v); }

// A dynamic input read out of its padded storage (the bucket's sizes, real
// elements at the front of each dim): a static reshape, then the runtime
// size of each dynamic dim (no data moves).
Value ReadDynamic(hlo::Builder& b, Value storage, const std::vector<int64_t>& bucket,
                  const std::vector<bool>& dyn, const std::vector<Value>& size_params, size_t* next) {
  Value v = b.Reshape(storage, bucket);
  for (size_t d = 0; d < bucket.size(); ++d)
    if (dyn[d]) v = b.SetDimensionSize(v, size_params[(*next)++], static_cast<int64_t>(d));
  return v;
}

struct DynamicLayout {
  std::vector<std::vector<bool>> in_dynamic;
  std::vector<std::vector<int64_t>> in_bucket;
  std::vector<int64_t> capacity;  // per storage, -1: passed as it is
};

std::string BuildDynamicModule(const Call& call, const DynamicLayout& lay,
                               const std::vector<OutputSpec>& bucket_specs,
                               const DynamicCompiled& dc) {
  const Plan& plan = call.plan;
  hlo::Builder b("dyn_op");
  std::vector<Value> params;
  for (const auto& q : plan.params) {
    TensorType t = ParamType(plan, q);
    if (q.kind == Param::Kind::Storage && lay.capacity[q.storage] >= 0)
      t.shape = {lay.capacity[q.storage]};
    params.push_back(b.Parameter(t));
  }
  std::vector<Value> sizes;
  for (const auto& dyn : lay.in_dynamic)
    for (bool d : dyn)
      if (d) sizes.push_back(b.Parameter({ElementType::I32, {}}));
  size_t next = 0;
  std::vector<Value> reads(plan.inputs.size());
  for (size_t i = 0; i < plan.inputs.size(); ++i)
    if (AnyDynamic(lay.in_dynamic[i]))
      reads[i] = ReadDynamic(b, params[plan.inputs[i].storage_param], lay.in_bucket[i],
                             lay.in_dynamic[i], sizes, &next);
  Call bucket_call = call;
  bucket_call.specs = bucket_specs;
  Emitted e = EmitCall(bucket_call, b, params, &reads);
  if (!e.checks.empty() || !e.written_values.empty())
    throw lowering::Unsupported("dynamic: op with device assertions or writes");
  std::vector<Value> outs;
  for (size_t k = 0; k < e.fresh_results.size(); ++k) {
    Value v = e.fresh_results[k];
    // A result with dynamic dims stays dynamic: PJRT hands it back packed
    // (its real elements in order: a prefix of the bucket-sized buffer).
    outs.push_back(v);
  }
  b.Return(outs);
  return b.ToText();
}

// Compiles the executable of `key` (nullptr: the signature stays exact).
DynamicCompiled* CompileDynamic(const std::string& key, const Call& call, const c10::OperatorHandle& op,
                                const std::vector<c10::IValue>& args, const DynamicLayout& lay) {
  // Output dims that follow the dynamic input dims: those that change when
  // the bucket sizes shrink by one.
  std::vector<std::vector<int64_t>> smaller = lay.in_bucket;
  for (size_t i = 0; i < smaller.size(); ++i)
    for (size_t d = 0; d < smaller[i].size(); ++d)
      if (lay.in_dynamic[i][d]) --smaller[i][d];
  std::vector<OutputSpec> bucket_specs = MetaSpecsAt(call, op, args, lay.in_bucket);
  std::vector<OutputSpec> smaller_specs = MetaSpecsAt(call, op, args, smaller);
  if (bucket_specs.size() != call.specs.size()) return nullptr;
  DynamicCompiled dc;
  for (size_t k = 0; k < bucket_specs.size(); ++k) {
    const auto& big = bucket_specs[k].sizes;
    if (smaller_specs[k].sizes.size() != big.size() || big.size() != call.specs[k].sizes.size())
      return nullptr;
    std::vector<bool> dyn(big.size());
    for (size_t d = 0; d < big.size(); ++d) dyn[d] = big[d] != smaller_specs[k].sizes[d];
    dc.out_dynamic.push_back(dyn);
    dc.out_bucket.push_back(big);
  }
  std::string text = BuildDynamicModule(call, lay, bucket_specs, dc);
  int64_t compiles = GetRuntime().stats().compiles;
  dc.exe = GetRuntime().GetOrCompile(key, call.plan.device, [&] { return text; });
  if (GetRuntime().stats().compiles != compiles) CountCompile(call.desc->name);
  ++Counters().executables;
  return &(State().executables[key] = std::move(dc));
}

// Host side of the boundary: a tensor of `sizes` with `real` at the front of
// each dim (zeros after) and the inverse, the front of `padded`.
at::Tensor Front(const at::Tensor& padded, const std::vector<int64_t>& real) {
  at::Tensor v = padded;
  for (size_t d = 0; d < real.size(); ++d) v = v.narrow(static_cast<int64_t>(d), 0, real[d]);
  return v;
}

// An input storage's value copied into a zero-padded buffer of the bucket's
// sizes (flat), through the host.
pjrt::BufferPtr PaddedCopy(const runtime::DeviceStorage* s, const std::vector<int64_t>& real,
                           const std::vector<int64_t>& bucket, int device) {
  auto& rt = GetRuntime();
  auto opts = at::TensorOptions().dtype(ToScalarType(s->dtype));
  at::Tensor value = at::empty(real, opts);
  rt.Download(*s->buffer, value.data_ptr(), s->nbytes);
  at::Tensor padded = at::zeros(bucket, opts);
  Front(padded, real).copy_(value);
  return rt.Upload(padded.data_ptr(), s->dtype, {padded.numel()}, device);
}

// An output's real elements: the packed prefix of the executable's
// bucket-sized (dynamic) result.
pjrt::BufferPtr Unpadded(const pjrt::BufferPtr& result, hlo::ElementType t,
                         const std::vector<int64_t>& bucket, int64_t numel, int device) {
  auto& rt = GetRuntime();
  std::vector<uint8_t> host(static_cast<size_t>(Numel(bucket)) * hlo::ByteSize(t));
  rt.Download(*result, host.data(), host.size());
  return rt.Upload(host.data(), t, {numel}, device);
}

std::vector<c10::IValue> LaunchDynamic(const Call& call, const DynamicCompiled& dc,
                                       const DynamicLayout& lay) {
  const Plan& plan = call.plan;
  auto& rt = GetRuntime();
  runtime::Launch launch;
  launch.exe = dc.exe.get();
  launch.device = plan.device;
  launch.op = &call.desc->name;
  for (const Param& q : plan.params) {
    if (q.kind == Param::Kind::Storage && lay.capacity[q.storage] >= 0)
      launch.params.push_back(runtime::LaunchParam::Of(PaddedCopy(
          plan.storages[q.storage], plan.inputs[PaddedInputIndex(plan, q.storage)].geometry.sizes,
          lay.in_bucket[PaddedInputIndex(plan, q.storage)], plan.device)));
    else
      launch.params.push_back(LaunchValue(plan, q));
  }
  for (size_t i = 0; i < plan.inputs.size(); ++i)
    for (size_t d = 0; d < lay.in_dynamic[i].size(); ++d)
      if (lay.in_dynamic[i][d])
        launch.params.push_back(runtime::LaunchParam::Integer(plan.inputs[i].geometry.sizes[d], ElementType::I32));
  std::vector<pjrt::BufferPtr> outs = runtime::Run(rt, launch);
  std::vector<c10::IValue> results;
  for (size_t k = 0; k < call.specs.size(); ++k) {
    at::Tensor t = FreshTensor(call, k);
    runtime::DeviceStorage* s = StorageOf(t);
    if (AnyDynamic(dc.out_dynamic[k])) {
      s->buffer = Unpadded(outs.at(k), s->dtype, dc.out_bucket[k], s->numel(), plan.device);
    } else {
      s->buffer = outs.at(k);
    }
    results.push_back(t);
  }
  CountNative(*call.desc);
  return WithUndefined(call, std::move(results));
}

}  // namespace

DynamicMode GetDynamicMode() { return ModeRef(); }
void SetDynamicMode(const std::string& mode) { ModeRef() = ParseMode(mode); }
DynamicCounters DynamicStats() { return Counters(); }
void CountCompile(const std::string& op) { ++Counters().compiles_by_op[op]; }
void ForgetDynamicSizes() { State().signatures.clear(); }

const std::vector<OutputSpec>* DynamicSpecs(const std::string& key) {
  if (ModeRef() == DynamicMode::Off) return nullptr;
  auto& specs = State().specs;
  auto it = specs.find(key);
  return it == specs.end() ? nullptr : &it->second;
}

std::optional<std::vector<c10::IValue>> RunDynamic(Call& call, const c10::OperatorHandle& op,
                                                   const std::vector<c10::IValue>& args) {
  DynamicMode mode = ModeRef();
  if (mode == DynamicMode::Off || !Eligible(call)) return std::nullopt;
  DynamicState& state = State();
  std::string sig = Signature(call.plan);
  SignatureState& st = state.signatures[sig];
  if (st.exact_only) return std::nullopt;
  DynamicLayout lay;
  lay.in_dynamic = Observe(st, call.plan, mode);
  if (std::none_of(lay.in_dynamic.begin(), lay.in_dynamic.end(), AnyDynamic)) return std::nullopt;
  lay.in_bucket = BucketSizes(call.plan, lay.in_dynamic);
  if (!PaddedStorages(call.plan, lay.in_dynamic, lay.in_bucket, &lay.capacity)) return std::nullopt;
  std::string key = DynamicKey(sig, call.plan, lay.in_dynamic, lay.in_bucket);
  DynamicCompiled* dc = nullptr;
  auto found = state.executables.find(key);
  if (found != state.executables.end()) {
    dc = &found->second;
    ++Counters().hits;
    ++GetRuntime().stats().cache_hits;
  } else {
    try {
      dc = CompileDynamic(key, call, op, args, lay);
    } catch (const lowering::Unsupported&) {
      dc = nullptr;
    } catch (const pjrt::Error&) {
      dc = nullptr;  // XLA cannot pad this module: exact shapes for the signature
    }
    if (!dc) {
      st.exact_only = true;
      ++Counters().exact_fallbacks;
      return std::nullopt;
    }
  }
  state.specs[call.plan.key] = call.cached();
  return LaunchDynamic(call, *dc, lay);
}

}  // namespace torch_tpu::aten
