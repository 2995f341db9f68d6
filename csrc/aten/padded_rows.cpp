// Matrix products on padded rows (bounded dynamic shapes, strict eager).
//
// nn.Linear on a [b, s, h] activation reaches us as mm on its [b*s, h] view.
// When the activation's storage is padded in b and s (buffer [B, S, h], the
// real elements at the front of each dim), no bounded-dynamic read of that
// view exists: the real rows are not a prefix of the buffer's B*S rows. But
// mm treats rows independently, so the module multiplies all B*S buffer rows
// (padding rows are copies of real ones or zeros: finite) and the result's
// storage keeps the activation's layout, [b, s, n] padded to [B, S, n]. The
// key holds the buffer's padded sizes only: a new batch size or sequence
// length inside the buckets compiles nothing, and the next op reads the
// result as [b, s, n] from its padded layout (dynamic.cpp).
//
// Its weight gradient, mm(grad_output^T, input), contracts those rows: the
// module contracts all B*S buffer rows of both, each padding row zeroed
// first (a mask from the real row sizes, runtime parameters), and the
// [out, in] result is exact.
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

std::optional<RowFold> PaddedRows(const TensorIn& in, const runtime::DeviceStorage& s) {
  const auto& g = in.geometry;
  if (!s.padded() || !g.whole || g.sizes.size() != 2) return std::nullopt;
  return FoldOf(g.sizes[1], s);
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

std::unordered_map<std::string, pjrt::ExecutablePtr>& Executables() {
  static auto* m = new std::unordered_map<std::string, pjrt::ExecutablePtr>();
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

std::string BuildRowsModule(const Call& call, int input, int64_t rows) {
  const Plan& plan = call.plan;
  hlo::Builder b("rows_op");
  std::vector<Value> params;
  for (const auto& q : plan.params) params.push_back(b.Parameter(ParamType(plan, q)));
  const TensorIn& in = plan.inputs[input];
  std::vector<Value> reads(plan.inputs.size());
  reads[input] = b.Reshape(params[in.storage_param], {rows, in.geometry.sizes[1]});
  Call rows_call = call;
  rows_call.specs[0].sizes[0] = rows;
  rows_call.specs[0].strides = lowering::ContiguousStrides(rows_call.specs[0].sizes);
  Emitted e = EmitCall(rows_call, b, params, &reads);
  if (!e.checks.empty() || !e.written_values.empty()) throw lowering::Unsupported("rows: checks or writes");
  b.Return(e.fresh_values);
  return b.ToText();
}

// The executable `key`, built by `build` on a miss (nullptr: the rule cannot
// run that way).
pjrt::Executable* CachedExecutable(const Call& call, const std::string& key,
                                   const std::function<std::string()>& build) {
  auto& cache = Executables();
  auto found = cache.find(key);
  if (found != cache.end()) {
    CountDynamicHit();
    return found->second.get();
  }
  std::string text;
  try {
    text = build();
  } catch (const lowering::Unsupported&) {
    return nullptr;
  }
  pjrt::ExecutablePtr exe =
      GetOrCompileCounted(key, call.plan.device, [&] { return text; }, call.desc->name, true);
  CountDynamicExecutable();
  return (cache[key] = exe).get();
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

}  // namespace

void ClearPaddedRowsExecutables() { Executables().clear(); }

std::optional<std::vector<c10::IValue>> RunOnPaddedRows(const Call& call) {
  const Plan& plan = call.plan;
  int arg = call.desc->rule ? call.desc->rule->dynamic.independent_rows_arg : -1;
  if (arg < 0 || call.desc->variant != Variant::Functional || call.specs.size() != 1) return std::nullopt;
  if (plan.geometry_spans.size() != plan.inputs.size()) return std::nullopt;
  const ArgPlan& ap = plan.args.at(static_cast<size_t>(arg));
  if (ap.kind != lowering::Arg::Kind::Tensor || ap.tensors.empty() || ap.param >= 0) return std::nullopt;
  const int input = ap.tensors[0];
  const runtime::DeviceStorage& storage = *plan.storages[plan.inputs[input].storage];
  const std::optional<RowFold> fold = PaddedRows(plan.inputs[input], storage);
  if (!fold || call.specs[0].strides != lowering::ContiguousStrides(call.specs[0].sizes)) return std::nullopt;
  for (size_t i = 0; i < plan.inputs.size(); ++i)  // the other operands: read as exact ops read them
    if (static_cast<int>(i) != input && plan.inputs[i].storage == plan.inputs[input].storage) return std::nullopt;
  pjrt::Executable* exe = CachedExecutable(call, RowsKey(plan, {input}),
                                           [&] { return BuildRowsModule(call, input, fold->buffer_rows); });
  if (!exe) return std::nullopt;
  SettleRecordingFor(call);  // runs alone in fused eager
  runtime::Launch launch;
  launch.exe = exe;
  launch.device = plan.device;
  launch.op = &call.desc->name;
  for (const Param& q : plan.params) launch.params.push_back(LaunchValue(plan, q));
  std::vector<pjrt::BufferPtr> outs = runtime::Run(GetRuntime(), launch);
  at::Tensor t = FreshTensor(call, 0);
  // The result keeps the rows' layout: the input's row dims, then n.
  std::vector<int64_t> real(storage.real_shape.begin(), storage.real_shape.begin() + static_cast<long>(fold->dims));
  std::vector<int64_t> padded(storage.padded_shape.begin(), storage.padded_shape.begin() + static_cast<long>(fold->dims));
  real.push_back(call.specs[0].sizes[1]);
  padded.push_back(call.specs[0].sizes[1]);
  StorageOf(t)->SetPadded(outs.at(0), real, padded);
  CountNative(*call.desc);
  return std::vector<c10::IValue>{t};
}

std::optional<std::vector<c10::IValue>> RunOnContractedRows(const Call& call) {
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
  pjrt::Executable* exe = CachedExecutable(call, "contracted|" + RowsKey(plan, {a, bi}),
                                           [&] { return BuildContractedModule(call, a, bi, *fa); });
  if (!exe) return std::nullopt;
  SettleRecordingFor(call);  // runs alone in fused eager
  runtime::Launch launch;
  launch.exe = exe;
  launch.device = plan.device;
  launch.op = &call.desc->name;
  for (int input : {a, bi}) launch.params.push_back(LaunchValue(plan, plan.params[plan.inputs[input].storage_param]));
  for (size_t j = 0; j < fa->dims; ++j)
    launch.params.push_back(runtime::LaunchParam::Integer(sa.real_shape[j], hlo::ElementType::I32));
  std::vector<pjrt::BufferPtr> outs = runtime::Run(GetRuntime(), launch);
  at::Tensor t = FreshTensor(call, 0);
  StorageOf(t)->Set(outs.at(0));
  CountNative(*call.desc);
  return std::vector<c10::IValue>{t};
}

}  // namespace torch_tpu::aten
