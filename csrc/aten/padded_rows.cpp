// Ops on padded rows (bounded dynamic shapes, strict eager).
//
// nn.Linear on a [b, s, h] activation reaches us as mm on its [b*s, h] view.
// When the activation's storage is padded in b and s (buffer [B, S, h], the
// real elements at the front of each dim), no bounded-dynamic read of that
// view exists: the real rows are not a prefix of the buffer's B*S rows. But
// mm treats rows independently, so the module multiplies all B*S buffer rows
// and the result's storage keeps the activation's layout, [b, s, n] padded
// to [B, S, n]. The key holds the buffer's padded sizes only: a new batch
// size or sequence length inside the buckets compiles nothing, and the next
// op reads the result as [b, s, n] from its padded layout (dynamic.cpp).
// The same for every op the lowering table gives rows args
// (DynamicShapes::rows_args): a causal LM's loss on its [b*s, V] logits
// (log_softmax and its backward on all the buffer's rows; nll_loss with the
// padding rows' targets set to ignore_index, so they add nothing).
//
// Its weight gradient, mm(grad_output^T, input), contracts those rows: the
// module contracts all B*S buffer rows of both, each padding row zeroed
// first (a mask from the real row sizes, runtime parameters), and the
// [out, in] result is exact.
#include <algorithm>
#include <functional>

#include "aten/call.h"
#include "aten/dynamic.h"

namespace torch_tpu::aten {

using hlo::Value;

namespace {

// How a whole [r, k] view folds a padded storage's dims: its first `dims`
// dims hold the r rows (`buffer_rows` of them in the buffer), the others the
// k unpadded elements of a row.
struct RowFold {
  size_t dims = 0;
  int64_t buffer_rows = 1;
};

// The fold when two or more row dims are not 1 (with one, dynamic.cpp reads
// the view: a padded dim merged with the unpadded ones inside it, also when
// the sizes sit at their bucket); nullopt otherwise.
std::optional<RowFold> FoldOf(int64_t k, const runtime::DeviceStorage& s) {
  int64_t inner = 1;
  size_t d = s.real_shape.size();
  while (d > 0 && inner < k) {
    --d;
    if (s.real_shape[d] != s.padded_shape[d]) return std::nullopt;
    inner *= s.real_shape[d];
  }
  if (inner != k || d == 0) return std::nullopt;
  RowFold fold{d, 1};
  int64_t row_dims = 0;
  for (size_t j = 0; j < d; ++j) {
    fold.buffer_rows *= s.padded_shape[j];
    row_dims += s.padded_shape[j] > 1;
  }
  return row_dims >= 2 ? std::optional<RowFold>(fold) : std::nullopt;
}

// The fold of a whole [r, k] view, or of a whole [r] one (k = 1).
std::optional<RowFold> PaddedRows(const TensorIn& in, const runtime::DeviceStorage& s) {
  const auto& g = in.geometry;
  if (!s.padded() || !g.whole || g.sizes.empty() || g.sizes.size() > 2) return std::nullopt;
  return FoldOf(g.sizes.size() == 2 ? g.sizes[1] : 1, s);
}

// Whether two folds read the same rows, padded alike.
bool SameRows(const runtime::DeviceStorage& a, const RowFold& fa, const runtime::DeviceStorage& b,
              const RowFold& fb) {
  if (fa.dims != fb.dims) return false;
  for (size_t j = 0; j < fa.dims; ++j)
    if (a.real_shape[j] != b.real_shape[j] || a.padded_shape[j] != b.padded_shape[j]) return false;
  return true;
}

// The fold of a [k, r] view that is a whole [r, k] fold transposed (strides
// [1, k], offset 0: grad_output.t() in a linear's weight gradient).
std::optional<RowFold> TransposedPaddedRows(const Plan& plan, const TensorIn& in, const runtime::DeviceStorage& s) {
  const auto& g = in.geometry;
  if (!s.padded() || g.sizes.size() != 2 || g.strides != std::vector<int64_t>{1, g.sizes[0]}) return std::nullopt;
  if (g.storage_numel != g.sizes[0] * g.sizes[1]) return std::nullopt;
  if (in.offset_param >= 0 && plan.params[in.offset_param].offset != 0) return std::nullopt;
  return FoldOf(g.sizes[0], s);
}

// A compiled rows module and its device assertions' messages (its first
// results).
struct RowsExecutable {
  pjrt::ExecutablePtr exe;
  std::vector<std::string> checks;
};

std::unordered_map<std::string, RowsExecutable>& Executables() {
  static auto* m = new std::unordered_map<std::string, RowsExecutable>();
  return *m;
}

// The call's key with the rows inputs' geometries (real sizes) replaced by
// their padded buffers' sizes (`inputs` in increasing order).
std::string RowsKey(const Plan& plan, const std::vector<int>& inputs) {
  std::string key = "rows|";
  size_t from = 0;
  for (int input : inputs) {
    auto [begin, end] = plan.geometry_spans.at(input);
    const auto& s = *plan.storages[plan.inputs[input].storage];
    key += plan.key.substr(from, begin - from) + "P" + hlo::Ints(s.padded_shape);
    from = end;
  }
  return key + plan.key.substr(from);
}

// The executable `key`, built by `build` on a miss (it fills the checks'
// messages; nullptr: the rule cannot run that way).
const RowsExecutable* CachedExecutable(const Call& call, const std::string& key,
                                       const std::function<std::string(std::vector<std::string>*)>& build) {
  auto& cache = Executables();
  auto found = cache.find(key);
  if (found != cache.end()) {
    CountDynamicHit();
    return &found->second;
  }
  RowsExecutable entry;
  std::string text;
  try {
    text = build(&entry.checks);
  } catch (const lowering::Unsupported&) {
    return nullptr;
  }
  entry.exe = GetOrCompileCounted(key, call.plan.device, [&] { return text; }, call.desc->name, true);
  CountDynamicExecutable();
  return &(cache[key] = std::move(entry));
}

// Whether each of the buffer's rows is a real one: [rows] i1 from the real
// sizes of the fold's row dims (rank-0 i32 parameters).
Value RealRows(hlo::Builder& b, const runtime::DeviceStorage& s, const RowFold& fold,
               const std::vector<Value>& real) {
  std::vector<int64_t> dims(s.padded_shape.begin(), s.padded_shape.begin() + static_cast<long>(fold.dims));
  Value mask;
  for (size_t j = 0; j < fold.dims; ++j) {
    Value index = b.Iota(hlo::TensorType{hlo::ElementType::I32, dims}, static_cast<int64_t>(j));
    Value in = b.Compare("LT", index, b.BroadcastInDim(real[j], dims, {}));
    mask = j == 0 ? in : b.Binary("and", mask, in);
  }
  return b.Reshape(mask, {fold.buffer_rows});
}

// `rows` ([R, k]) with its padding rows zeroed.
Value ZeroPaddingRows(hlo::Builder& b, Value rows, Value real_rows) {
  const hlo::TensorType& t = rows.type;
  Value zeros = b.BroadcastInDim(b.Constant(t.dtype, 0), t.shape, {});
  return b.Select(b.BroadcastInDim(real_rows, t.shape, {0}), rows, zeros);
}

// mm(a, b) with a the transposed fold and b the fold of storages padded
// alike: all buffer rows contracted, the padding rows zeroed first (they
// may hold anything finite or not). The result is exact ([k, n]).
std::string BuildContractedModule(const Call& call, int a, int bi, const RowFold& fold) {
  const Plan& plan = call.plan;
  const runtime::DeviceStorage& s = *plan.storages[plan.inputs[a].storage];
  hlo::Builder b("contracted_rows_op");
  // Parameters: the two buffers, then the real row sizes (the plan's other
  // parameters, offsets of views the module does not read, are not passed).
  std::vector<Value> params(plan.params.size());
  for (int input : {a, bi}) {
    const int q = plan.inputs[input].storage_param;
    params[q] = b.Parameter(ParamType(plan, plan.params[q]));
  }
  std::vector<Value> real;
  for (size_t j = 0; j < fold.dims; ++j) real.push_back(b.Parameter(hlo::TensorType{hlo::ElementType::I32, {}}));
  Value real_rows = RealRows(b, s, fold, real);
  auto rows = [&](int input, int64_t width) {
    Value v = b.Reshape(params[plan.inputs[input].storage_param], {fold.buffer_rows, width});
    return ZeroPaddingRows(b, v, real_rows);
  };
  std::vector<Value> reads(plan.inputs.size());
  reads[a] = b.Transpose(rows(a, plan.inputs[a].geometry.sizes[0]), {1, 0});
  reads[bi] = rows(bi, plan.inputs[bi].geometry.sizes[1]);
  Emitted e = EmitCall(call, b, params, &reads);
  if (!e.checks.empty() || !e.written_values.empty()) throw lowering::Unsupported("rows: checks or writes");
  b.Return(e.fresh_values);
  return b.ToText();
}

// The plan inputs of a matrix product's two tensor args, when each is one
// plain tensor of its own storage and no other argument is a parameter.
std::optional<std::pair<int, int>> ProductInputs(const Plan& plan) {
  int found[2] = {-1, -1};
  size_t n = 0;
  for (const ArgPlan& ap : plan.args) {
    if (ap.param >= 0) return std::nullopt;
    if (ap.kind != lowering::Arg::Kind::Tensor) continue;
    if (n == 2 || ap.tensors.size() != 1) return std::nullopt;
    found[n++] = ap.tensors[0];
  }
  if (n != 2 || plan.inputs.size() != 2) return std::nullopt;
  if (plan.inputs[found[0]].storage == plan.inputs[found[1]].storage) return std::nullopt;
  return std::make_pair(found[0], found[1]);
}

// The plan inputs of a rule's rows args and the fold they share.
struct RowsInputs {
  std::vector<int> inputs;  // increasing
  RowFold fold;
  const runtime::DeviceStorage* storage = nullptr;  // the first one's
  int neutral = -1;  // the input whose padding rows take the neutral value
};

// The call's rows inputs (DynamicShapes::rows_args): each a fold of a padded
// storage, all the same rows padded alike, no storage read by another input;
// nullopt when the call does not run on rows.
std::optional<RowsInputs> FindRowsInputs(const Call& call) {
  if (!call.desc->rule) return std::nullopt;
  const lowering::DynamicShapes& dyn = call.desc->rule->dynamic;
  const Plan& plan = call.plan;
  if (dyn.rows_args.empty() || call.desc->variant != Variant::Functional) return std::nullopt;
  if (plan.geometry_spans.size() != plan.inputs.size()) return std::nullopt;
  if (dyn.rows_when && !dyn.rows_when(AbstractArgs(plan))) return std::nullopt;
  RowsInputs rows;
  for (size_t arg : dyn.rows_args) {
    const ArgPlan& ap = plan.args.at(arg);
    if (ap.kind != lowering::Arg::Kind::Tensor || ap.tensors.empty() || ap.tensors[0] < 0 || ap.param >= 0) continue;
    const int input = ap.tensors[0];
    if (plan.inputs[input].geometry.sizes.empty()) continue;  // a 0-d tensor: not rows
    const runtime::DeviceStorage& s = *plan.storages[plan.inputs[input].storage];
    std::optional<RowFold> fold = PaddedRows(plan.inputs[input], s);
    if (!fold || (rows.storage && !SameRows(*rows.storage, rows.fold, s, *fold))) return std::nullopt;
    if (!rows.storage) {
      rows.storage = &s;
      rows.fold = *fold;
    }
    if (static_cast<int>(arg) == dyn.neutral_rows.first) rows.neutral = input;
    rows.inputs.push_back(input);
  }
  if (rows.inputs.empty() || (dyn.neutral_rows.first >= 0 && rows.neutral < 0)) return std::nullopt;
  std::sort(rows.inputs.begin(), rows.inputs.end());
  for (size_t i = 0; i < plan.inputs.size(); ++i)  // the other operands: read as exact ops read them
    for (int r : rows.inputs)
      if (static_cast<int>(i) != r && plan.inputs[i].storage == plan.inputs[r].storage) return std::nullopt;
  return rows;
}

// Per result: whether its first dim is the rows (it keeps their layout);
// the others are exact. nullopt when a rows result is not dense.
std::optional<std::vector<bool>> RowsOutputs(const Call& call, const RowsInputs& rows) {
  const int64_t r = call.plan.inputs[rows.inputs[0]].geometry.sizes[0];
  std::vector<bool> out;
  for (const OutputSpec& spec : call.specs) {
    out.push_back(!spec.sizes.empty() && spec.sizes[0] == r);
    if (out.back() && spec.strides != lowering::ContiguousStrides(spec.sizes)) return std::nullopt;
  }
  return out;
}

// A rows result's storage layout: the fold's row dims, then its other dims
// (`padded`: the buffer's sizes, else the real ones).
std::vector<int64_t> RowsLayout(const RowsInputs& rows, const OutputSpec& spec, bool padded) {
  const auto& shape = padded ? rows.storage->padded_shape : rows.storage->real_shape;
  std::vector<int64_t> dims(shape.begin(), shape.begin() + static_cast<long>(rows.fold.dims));
  dims.insert(dims.end(), spec.sizes.begin() + 1, spec.sizes.end());
  return dims;
}

// The rows inputs read as all the buffer's rows; for an op that reduces
// across them (neutral rows), their padding rows zeroed and the neutral
// input's set to its neutral value (real row sizes: i32 parameters appended).
std::vector<Value> ReadRows(hlo::Builder& b, const Call& call, const RowsInputs& rows,
                            const std::vector<Value>& params) {
  const Plan& plan = call.plan;
  const lowering::DynamicShapes& dyn = call.desc->rule->dynamic;
  Value real_rows;
  if (rows.neutral >= 0) {
    std::vector<Value> real;
    for (size_t j = 0; j < rows.fold.dims; ++j) real.push_back(b.Parameter(hlo::TensorType{hlo::ElementType::I32, {}}));
    real_rows = RealRows(b, *rows.storage, rows.fold, real);
  }
  std::vector<Value> reads(plan.inputs.size());
  for (int input : rows.inputs) {
    std::vector<int64_t> shape = plan.inputs[input].geometry.sizes;
    shape[0] = rows.fold.buffer_rows;
    Value v = b.Reshape(params[plan.inputs[input].storage_param], shape);
    if (real_rows.valid()) v = ZeroPaddingRows(b, v, real_rows);
    if (input == rows.neutral) {
      const int64_t value = plan.args.at(static_cast<size_t>(dyn.neutral_rows.second)).literal.i;
      Value fill = b.Splat(v.dtype(), static_cast<double>(value), v.shape());
      v = b.Select(b.BroadcastInDim(real_rows, v.shape(), {0}), v, fill);
    }
    reads[input] = v;
  }
  return reads;
}

// The call on all the buffer's rows: results whose first dim is the rows at
// the buffer's row count, after the device assertions (their messages in
// `checks`).
std::string BuildRowsModule(const Call& call, const RowsInputs& rows, const std::vector<bool>& rows_out,
                            std::vector<std::string>* checks) {
  const Plan& plan = call.plan;
  hlo::Builder b("rows_op");
  std::vector<Value> params;
  for (const auto& q : plan.params) params.push_back(b.Parameter(ParamType(plan, q)));
  std::vector<Value> reads = ReadRows(b, call, rows, params);
  Call rows_call = call;
  for (size_t k = 0; k < rows_call.specs.size(); ++k) {
    if (!rows_out[k]) continue;
    rows_call.specs[k].sizes[0] = rows.fold.buffer_rows;
    rows_call.specs[k].strides = lowering::ContiguousStrides(rows_call.specs[k].sizes);
  }
  Emitted e = EmitCall(rows_call, b, params, &reads);
  if (!e.written_values.empty()) throw lowering::Unsupported("rows: writes");
  std::vector<Value> outs;
  for (const auto& check : e.checks) {
    outs.push_back(check.ok);
    checks->push_back(CheckMessage(*call.desc, check.message));
  }
  outs.insert(outs.end(), e.fresh_values.begin(), e.fresh_values.end());
  b.Return(outs);
  return b.ToText();
}

// Launches a rows module: the plan parameters it takes, then its runtime
// sizes; its results in their layouts.
std::vector<c10::IValue> LaunchRows(const Call& call, const BoundedLaunch& rows) {
  const Plan& plan = call.plan;
  runtime::Launch launch;
  launch.exe = rows.exe.get();
  launch.device = plan.device;
  launch.op = &call.desc->name;
  launch.checks = &rows.checks;
  for (size_t p = 0; p < plan.params.size(); ++p)
    if (rows.taken[p]) launch.params.push_back(LaunchValue(plan, plan.params[p]));
  for (int64_t size : rows.sizes) launch.params.push_back(runtime::LaunchParam::Integer(size, hlo::ElementType::I32));
  std::vector<pjrt::BufferPtr> outs = runtime::Run(GetRuntime(), launch);
  std::vector<c10::IValue> results;
  for (size_t k = 0; k < call.specs.size(); ++k) {
    at::Tensor t = FreshTensor(call, k);
    rows.results.at(k).Apply(StorageOf(t), outs.at(k));
    results.push_back(t);
  }
  CountNative(*call.desc);
  return WithUndefined(call, std::move(results));
}

// The layout result k of a rows call keeps: its rows padded like the
// input's (`rows_out`), their product buckets kept (dynamic.cpp).
ResultLayout RowsResultLayout(const Call& call, const RowsInputs& rows, size_t k, bool rows_out) {
  ResultLayout r;
  if (!rows_out) return r;
  r.real = RowsLayout(rows, call.specs[k], false);
  r.padded = RowsLayout(rows, call.specs[k], true);
  if (!rows.storage->product_dims.empty()) {
    r.product.assign(r.padded.size(), false);
    for (size_t j = 0; j < rows.fold.dims && j < rows.storage->product_dims.size(); ++j)
      r.product[j] = rows.storage->product_dims[j];
  }
  return r;
}

}  // namespace

void ClearPaddedRowsExecutables() { Executables().clear(); }

std::optional<std::vector<c10::IValue>> RunOnPaddedRows(const Call& call, FastCall& fast) {
  std::optional<RowsInputs> rows = FindRowsInputs(call);
  if (!rows) return std::nullopt;
  const Plan& plan = call.plan;
  const bool neutral = rows->neutral >= 0;
  const std::optional<std::vector<bool>> found_out = RowsOutputs(call, *rows);
  if (!found_out) return std::nullopt;
  const std::vector<bool>& rows_out = *found_out;
  const RowsExecutable* exe = CachedExecutable(call, (neutral ? "rows|n|" : "rows|") + RowsKey(plan, rows->inputs),
                                               [&](std::vector<std::string>* checks) {
                                                 return BuildRowsModule(call, *rows, rows_out, checks);
                                               });
  if (!exe) return std::nullopt;
  SettleRecordingFor(call);  // runs alone in fused eager
  BoundedLaunch again{exe->exe, exe->checks, std::vector<bool>(plan.params.size(), true), {}, {}};
  if (neutral)
    for (size_t j = 0; j < rows->fold.dims; ++j) again.sizes.push_back(rows->storage->real_shape[j]);
  for (size_t k = 0; k < call.specs.size(); ++k) again.results.push_back(RowsResultLayout(call, *rows, k, rows_out[k]));
  std::vector<c10::IValue> results = LaunchRows(call, again);
  fast.RememberBounded(call, std::move(again));
  return results;
}

std::optional<std::vector<c10::IValue>> RunOnContractedRows(const Call& call, FastCall& fast) {
  const Plan& plan = call.plan;
  if (!call.desc->rule || !call.desc->rule->dynamic.contracts_rows) return std::nullopt;
  if (call.desc->variant != Variant::Functional || call.specs.size() != 1) return std::nullopt;
  if (plan.geometry_spans.size() != plan.inputs.size()) return std::nullopt;
  auto inputs = ProductInputs(plan);
  if (!inputs) return std::nullopt;
  auto [a, bi] = *inputs;
  const runtime::DeviceStorage& sa = *plan.storages[plan.inputs[a].storage];
  const runtime::DeviceStorage& sb = *plan.storages[plan.inputs[bi].storage];
  const std::optional<RowFold> fa = TransposedPaddedRows(plan, plan.inputs[a], sa);
  const std::optional<RowFold> fb = PaddedRows(plan.inputs[bi], sb);
  if (!fa || !fb || fa->dims != fb->dims) return std::nullopt;
  for (size_t j = 0; j < fa->dims; ++j)  // the same rows, padded alike
    if (sa.real_shape[j] != sb.real_shape[j] || sa.padded_shape[j] != sb.padded_shape[j]) return std::nullopt;
  if (call.specs[0].strides != lowering::ContiguousStrides(call.specs[0].sizes)) return std::nullopt;
  const RowsExecutable* exe = CachedExecutable(call, "contracted|" + RowsKey(plan, {a, bi}), [&](std::vector<std::string>*) {
    return BuildContractedModule(call, a, bi, *fa);
  });
  if (!exe) return std::nullopt;
  SettleRecordingFor(call);  // runs alone in fused eager
  BoundedLaunch again{exe->exe, exe->checks, std::vector<bool>(plan.params.size(), false), {}, {ResultLayout{}}};
  for (int input : {a, bi}) again.taken[plan.inputs[input].storage_param] = true;
  for (size_t j = 0; j < fa->dims; ++j) again.sizes.push_back(sa.real_shape[j]);
  std::vector<c10::IValue> results = LaunchRows(call, again);
  fast.RememberBounded(call, std::move(again));
  return results;
}

}  // namespace torch_tpu::aten
