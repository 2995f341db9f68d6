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
//
// Hints (torch_tpu.mark_dynamic / mark_static), in every mode: a marked
// dynamic dim (size > 1) runs bounded from the first call, at `max` when
// given and the size fits, else at its bucket; a marked static dim never runs
// dynamic (nor counts as a second size). The hints live on the TensorImpl
// (its BackendMeta slot); the results of a call a hint made dynamic carry
// the hint on the dims that follow it, so a chain of ops stays dynamic.
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
    // Not "auto" yet: under auto an int64 pow sample of the OpInfo sweep
    // sends XLA's algebraic simplifier into an exponential recursion
    // (IsNonNegative) while compiling its bounded-dynamic module.
    return ParseMode(v ? v : "0");
  }();
  return mode;
}

bool g_any_hints = false;  // some tensor was ever marked

void UpdateActive() { g_dynamic_active = ModeRef() != DynamicMode::Off || g_any_hints; }

// One dim's hint.
struct DimHint {
  bool dynamic = false;  // false: static
  int64_t min = -1, max = -1;  // -1: none
};

// The hints of one tensor, in its TensorImpl's BackendMeta slot (cloned with
// the impl's extra meta, e.g. by detach()).
struct DynamicHints : c10::BackendMeta {
  std::map<int64_t, DimHint> dims;
  c10::intrusive_ptr<c10::BackendMeta> clone(const c10::intrusive_ptr<c10::BackendMeta>& ptr) const override {
    auto copy = c10::make_intrusive<DynamicHints>();
    copy->dims = static_cast<const DynamicHints*>(ptr.get())->dims;
    return copy;
  }
};

const DynamicHints* HintsOf(const at::Tensor& t) {
  if (!g_any_hints) return nullptr;
  return dynamic_cast<const DynamicHints*>(t.unsafeGetTensorImpl()->get_backend_meta());
}

DynamicHints& MutableHints(const at::Tensor& t) {
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (auto* h = dynamic_cast<DynamicHints*>(impl->get_backend_meta())) return *h;
  auto h = c10::make_intrusive<DynamicHints>();
  DynamicHints* raw = h.get();
  impl->set_backend_meta(std::move(h));
  g_any_hints = true;
  UpdateActive();
  return *raw;
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
// Per input, per dim, of one call: the hints of its tensor (none: default).
using CallHints = std::vector<std::vector<std::optional<DimHint>>>;

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
  std::unordered_set<std::string> failed;  // dynamic keys of hinted layouts XLA or meta refused
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
// Hinted dims: a static hint is never dynamic nor observed, a dynamic one
// (size > 1) is dynamic from the first call; in mode 0 nothing else is.
std::vector<std::vector<bool>> Observe(SignatureState& st, const Plan& plan, DynamicMode mode,
                                       const CallHints& hints) {
  const size_t n = plan.inputs.size();
  if (st.first.empty()) {
    for (const auto& in : plan.inputs) {
      st.first.push_back(in.geometry.sizes);
      st.dynamic.emplace_back(in.geometry.sizes.size(), false);
    }
  }
  std::vector<std::vector<bool>> dyn(n);
  for (size_t i = 0; i < n; ++i) {
    const auto& sizes = plan.inputs[i].geometry.sizes;
    dyn[i].assign(sizes.size(), false);
    for (size_t d = 0; d < sizes.size(); ++d) {
      const std::optional<DimHint>& h = hints[i][d];
      if (h && !h->dynamic) continue;
      if (mode != DynamicMode::Off && sizes[d] > 1 &&
          (mode == DynamicMode::All || sizes[d] != st.first[i][d]))
        st.dynamic[i][d] = true;
      dyn[i][d] = (mode != DynamicMode::Off && st.dynamic[i][d]) || (h && sizes[d] > 1);
    }
  }
  return dyn;
}

// The hints of each input's tensor (all empty when no tensor has any).
CallHints HintsOfCall(const Plan& plan, const std::vector<c10::IValue>& args, bool* any) {
  CallHints hints(plan.inputs.size());
  for (size_t i = 0; i < plan.inputs.size(); ++i) hints[i].resize(plan.inputs[i].geometry.sizes.size());
  *any = false;
  if (!g_any_hints) return hints;
  for (size_t a = 0; a < args.size() && a < plan.args.size(); ++a) {
    const ArgPlan& ap = plan.args[a];
    if (!args[a].isTensor() || ap.kind != Arg::Kind::Tensor || ap.tensors.empty() || ap.param >= 0) continue;
    const DynamicHints* h = HintsOf(args[a].toTensor());
    if (!h) continue;
    auto& row = hints[ap.tensors[0]];
    for (const auto& [d, hint] : h->dims)
      if (d < static_cast<int64_t>(row.size())) {
        row[d] = hint;
        *any = true;
      }
  }
  return hints;
}

bool AnyDynamic(const std::vector<bool>& v) { return std::find(v.begin(), v.end(), true) != v.end(); }

// Per input: its sizes with dynamic dims at their bucket.
// A hinted dim's bound is its max when the size fits under it.
std::vector<std::vector<int64_t>> BucketSizes(const Plan& plan, const std::vector<std::vector<bool>>& dyn,
                                              const CallHints& hints) {
  std::vector<std::vector<int64_t>> out;
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    std::vector<int64_t> s = plan.inputs[i].geometry.sizes;
    for (size_t d = 0; d < s.size(); ++d) {
      if (!dyn[i][d]) continue;
      const std::optional<DimHint>& h = hints[i][d];
      s[d] = h && h->max >= s[d] ? h->max : Bucket(s[d]);
    }
    out.push_back(s);
  }
  return out;
}

struct DynamicLayout {
  std::vector<std::vector<bool>> in_dynamic;
  std::vector<std::vector<int64_t>> in_bucket;
  std::vector<int64_t> capacity;  // per storage, -1: passed as it is
  bool hinted = false;   // some input dim is dynamic by a mark_dynamic hint
  bool bounded = false;  // ... with a max
};

// A hint makes one tensor's dim dynamic; the same size in the other whole
// inputs (a broadcast partner, mm's contraction) must follow at the same
// bound, or the op's shapes disagree at the bucket. Those dims turn dynamic
// too (a coincidentally equal size is padded and masked: still exact).
void UnifyHintedSizes(const Plan& plan, const CallHints& hints, DynamicLayout* lay) {
  std::map<int64_t, int64_t> bound;  // hinted size -> its bucket
  for (size_t i = 0; i < hints.size(); ++i)
    for (size_t d = 0; d < hints[i].size(); ++d)
      if (hints[i][d] && hints[i][d]->dynamic && lay->in_dynamic[i][d])
        bound.emplace(plan.inputs[i].geometry.sizes[d], lay->in_bucket[i][d]);
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    if (!plan.inputs[i].geometry.whole) continue;
    const auto& sizes = plan.inputs[i].geometry.sizes;
    for (size_t d = 0; d < sizes.size(); ++d) {
      auto b = bound.find(sizes[d]);
      if (b == bound.end() || lay->in_dynamic[i][d] || (hints[i][d] && !hints[i][d]->dynamic)) continue;
      lay->in_dynamic[i][d] = true;
      lay->in_bucket[i][d] = b->second;
    }
  }
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
      AppendCapacityKey(*plan.storages[plan.inputs[i].storage], &key);
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

// A dynamic input read out of its storage buffer (runtime.h: the bucket's
// sizes, the real elements at the front of each dim): a static reshape, then
// the runtime size of each dynamic dim (no data moves).
Value ReadDynamic(hlo::Builder& b, Value storage, const std::vector<int64_t>& bucket,
                  const std::vector<bool>& dyn, const std::vector<Value>& size_params, size_t* next) {
  Value v = b.Reshape(storage, bucket);
  for (size_t d = 0; d < bucket.size(); ++d)
    if (dyn[d]) v = b.SetDimensionSize(v, size_params[(*next)++], static_cast<int64_t>(d));
  return v;
}

// A dynamic result as its storage keeps it: static at the bucket's sizes
// (the real elements at the front of each dim, as read above), flat. XLA:CPU
// returns a dynamic result with its sizes appended to the buffer, which no
// executable then takes as a parameter (nor can one declare a dynamic
// parameter: PadToStatic is missing there); gathering a dynamic dim's
// indices 0..bound-1 one at a time makes it static without moving the real
// elements (XLA's dynamic-dimension inference drops a dim gathered with
// slice size 1).
Value PadDynamic(hlo::Builder& b, Value v, const std::vector<bool>& dyn) {
  for (size_t d = 0; d < dyn.size(); ++d) {
    if (!dyn[d]) continue;
    Value rows = b.Iota(hlo::TensorType{ElementType::I32, {v.shape()[d], 1}}, 0);
    Value g = b.Gather(v, rows, {static_cast<int64_t>(d)});  // dim d first
    std::vector<int64_t> perm;
    for (size_t i = 0; i < dyn.size(); ++i)
      perm.push_back(i < d ? static_cast<int64_t>(i) + 1 : (i == d ? 0 : static_cast<int64_t>(i)));
    v = b.Transpose(g, perm);
  }
  return b.Reshape(v, {v.type.numel()});
}

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
    outs.push_back(PadDynamic(b, e.fresh_results[k], dc.out_dynamic[k]));
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
  if (GetRuntime().stats().compiles != compiles) CountCompile(call.desc->name, true);
  ++Counters().executables;
  return &(State().executables[key] = std::move(dc));
}

// A padded layout (real sizes at the front of each padded dim) as runs of
// (real, padded) elements: size-1 dims dropped, an unpadded dim folded into
// the one outside it (its rows stay contiguous in both).
std::vector<std::pair<int64_t, int64_t>> LayoutRuns(const std::vector<int64_t>& real,
                                                    const std::vector<int64_t>& padded) {
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (size_t d = 0; d < real.size(); ++d) {
    if (padded[d] == 1) continue;
    if (real[d] == padded[d] && !runs.empty()) {
      runs.back().first *= real[d];
      runs.back().second *= padded[d];
    } else {
      runs.emplace_back(real[d], padded[d]);
    }
  }
  return runs;
}

// Whether two padded layouts put every real element at the same place (a
// reshape that splits or merges unpadded dims: a linear's [b, s, h*d] result
// read as [b, s, h, d] heads).
bool SameLayout(const std::vector<int64_t>& real_a, const std::vector<int64_t>& padded_a,
                const std::vector<int64_t>& real_b, const std::vector<int64_t>& padded_b) {
  if (padded_a.empty() || padded_b.empty()) return false;
  return LayoutRuns(real_a, padded_a) == LayoutRuns(real_b, padded_b);
}

// A dynamic input's storage parameter: its buffer when it already holds the
// input padded to the bucket (a dynamic op's result). Otherwise (the first
// dynamic op of a chain) the storage is padded first, through the host: an
// exact buffer's type changes with every size, so a device-side pad would
// compile per size. The storage stays padded for its next readers.
runtime::LaunchParam PaddedParam(runtime::DeviceStorage* s, const std::vector<int64_t>& real,
                                 const std::vector<int64_t>& bucket, int device) {
  bool exact_fits = !s->padded() && real == bucket;  // sizes at their bucket: the buffer as it is
  if (!exact_fits && !SameLayout(s->real_shape, s->padded_shape, real, bucket)) {
    auto opts = at::TensorOptions().dtype(ToScalarType(s->dtype));
    at::Tensor value = at::empty(real, opts);
    DownloadStorage(*s, value.data_ptr());
    at::Tensor padded = at::zeros(bucket, opts);
    at::Tensor front = padded;
    for (size_t d = 0; d < real.size(); ++d) front = front.narrow(static_cast<int64_t>(d), 0, real[d]);
    front.copy_(value);
    s->SetPadded(GetRuntime().Upload(padded.data_ptr(), s->dtype, {padded.numel()}, device), real, bucket);
  }
  return runtime::LaunchParam::Of(s->buffer);
}

// The results of a call a hint made dynamic carry it on the dims that follow
// the dynamic inputs (bounded at their bucket when the hint had a max).
void PropagateHints(const at::Tensor& t, const std::vector<bool>& dyn, const std::vector<int64_t>& bucket,
                    bool bounded) {
  for (size_t d = 0; d < dyn.size(); ++d) {
    if (!dyn[d]) continue;
    DynamicHints& h = MutableHints(t);
    if (h.dims.count(static_cast<int64_t>(d))) continue;
    h.dims[static_cast<int64_t>(d)] = DimHint{true, -1, bounded ? bucket[d] : -1};
  }
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
      launch.params.push_back(PaddedParam(plan.storages[q.storage],
                                          plan.inputs[PaddedInputIndex(plan, q.storage)].geometry.sizes,
                                          lay.in_bucket[PaddedInputIndex(plan, q.storage)], plan.device));
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
    if (AnyDynamic(dc.out_dynamic[k]))
      s->SetPadded(outs.at(k), call.specs[k].sizes, dc.out_bucket[k]);
    else
      s->Set(outs.at(k));
    if (lay.hinted) PropagateHints(t, dc.out_dynamic[k], dc.out_bucket[k], lay.bounded);
    results.push_back(t);
  }
  CountNative(*call.desc);
  return WithUndefined(call, std::move(results));
}

}  // namespace

bool g_dynamic_active = ModeRef() != DynamicMode::Off;

DynamicMode GetDynamicMode() { return ModeRef(); }
void SetDynamicMode(const std::string& mode) {
  ModeRef() = ParseMode(mode);
  UpdateActive();
}

void MarkDims(const at::Tensor& t, const std::vector<int64_t>& dims, bool dynamic, int64_t min,
              int64_t max) {
  DynamicHints& h = MutableHints(t);
  for (int64_t d : dims) {
    TORCH_CHECK(d >= 0 && d < t.dim(), "mark_dynamic: dim ", d, " out of range for a ", t.dim(), "-d tensor");
    h.dims[d] = DimHint{dynamic, min, max};
  }
}

std::vector<std::string> DimHintsOf(const at::Tensor& t) {
  std::vector<std::string> out(static_cast<size_t>(t.dim()));
  if (const DynamicHints* h = HintsOf(t))
    for (const auto& [d, hint] : h->dims)
      if (d < t.dim()) out[d] = hint.dynamic ? "dynamic" : "static";
  return out;
}
DynamicCounters DynamicStats() { return Counters(); }
void CountCompile(const std::string& op, bool dynamic) {
  DynamicCounters& c = Counters();
  ++c.compiles_by_op[op];
  if (dynamic) ++c.dynamic_compiles_by_op[op];
}
void ForgetDynamicSizes() { State().signatures.clear(); }

const std::vector<OutputSpec>* DynamicSpecs(const std::string& key) {
  if (!g_dynamic_active) return nullptr;
  auto& specs = State().specs;
  auto it = specs.find(key);
  return it == specs.end() ? nullptr : &it->second;
}

std::optional<std::vector<c10::IValue>> RunDynamic(Call& call, const c10::OperatorHandle& op,
                                                   const std::vector<c10::IValue>& args) {
  DynamicMode mode = ModeRef();
  if (!g_dynamic_active || !Eligible(call)) return std::nullopt;
  bool hinted = false;
  CallHints hints = HintsOfCall(call.plan, args, &hinted);
  if (mode == DynamicMode::Off && !hinted) return std::nullopt;
  DynamicState& state = State();
  std::string sig = Signature(call.plan);
  SignatureState& st = state.signatures[sig];
  if (st.exact_only) return std::nullopt;
  DynamicLayout lay;
  lay.in_dynamic = Observe(st, call.plan, mode, hints);
  if (std::none_of(lay.in_dynamic.begin(), lay.in_dynamic.end(), AnyDynamic)) return std::nullopt;
  for (size_t i = 0; i < hints.size(); ++i)
    for (size_t d = 0; d < hints[i].size(); ++d)
      if (hints[i][d] && hints[i][d]->dynamic && lay.in_dynamic[i][d]) {
        lay.hinted = true;
        lay.bounded |= hints[i][d]->max > 0;
      }
  lay.in_bucket = BucketSizes(call.plan, lay.in_dynamic, hints);
  if (lay.hinted) UnifyHintedSizes(call.plan, hints, &lay);
  if (!PaddedStorages(call.plan, lay.in_dynamic, lay.in_bucket, &lay.capacity)) return std::nullopt;
  std::string key = DynamicKey(sig, call.plan, lay.in_dynamic, lay.in_bucket);
  if (state.failed.count(key)) return std::nullopt;
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
    } catch (const c10::Error&) {
      dc = nullptr;  // the meta kernel refuses the bucket's sizes
    }
    if (!dc) {
      // A hint's layout failing leaves the signature's automatic policy alone.
      if (lay.hinted) state.failed.insert(key); else st.exact_only = true;
      ++Counters().exact_fallbacks;
      return std::nullopt;
    }
  }
  state.specs[call.plan.key] = call.cached();
  return LaunchDynamic(call, *dc, lay);
}

}  // namespace torch_tpu::aten
