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
std::optional<RowFold> PaddedRows(const TensorIn& in, const runtime::DeviceStorage& s) {
  const auto& g = in.geometry;
  if (!s.padded() || !g.whole || g.sizes.size() != 2) return std::nullopt;
  int64_t inner = 1;
  size_t d = s.real_shape.size();
  while (d > 0 && inner < g.sizes[1]) {
    --d;
    if (s.real_shape[d] != s.padded_shape[d]) return std::nullopt;
    inner *= s.real_shape[d];
  }
  if (inner != g.sizes[1] || d == 0) return std::nullopt;
  RowFold fold{d, 1};
  int64_t row_dims = 0;
  for (size_t j = 0; j < d; ++j) {
    fold.buffer_rows *= s.padded_shape[j];
    row_dims += s.padded_shape[j] > 1;
  }
  return row_dims >= 2 ? std::optional<RowFold>(fold) : std::nullopt;
}

std::unordered_map<std::string, pjrt::ExecutablePtr>& Executables() {
  static auto* m = new std::unordered_map<std::string, pjrt::ExecutablePtr>();
  return *m;
}

// The call's key with the rows input's geometry (real sizes) replaced by the
// padded buffer's sizes.
std::string RowsKey(const Plan& plan, int input) {
  auto [begin, end] = plan.geometry_spans.at(input);
  const auto& s = *plan.storages[plan.inputs[input].storage];
  return "rows|" + plan.key.substr(0, begin) + "P" + hlo::Ints(s.padded_shape) + plan.key.substr(end);
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

// The executable of the call on `rows` buffer rows of input `input`
// (nullptr: the rule cannot run that way).
pjrt::Executable* RowsExecutable(const Call& call, int input, int64_t rows) {
  std::string key = RowsKey(call.plan, input);
  auto& cache = Executables();
  auto found = cache.find(key);
  if (found != cache.end()) {
    CountDynamicHit();
    return found->second.get();
  }
  std::string text;
  try {
    text = BuildRowsModule(call, input, rows);
  } catch (const lowering::Unsupported&) {
    return nullptr;
  }
  pjrt::ExecutablePtr exe =
      GetOrCompileCounted(key, call.plan.device, [&] { return text; }, call.desc->name, true);
  CountDynamicExecutable();
  return (cache[key] = exe).get();
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
  pjrt::Executable* exe = RowsExecutable(call, input, fold->buffer_rows);
  if (!exe) return std::nullopt;
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

}  // namespace torch_tpu::aten
