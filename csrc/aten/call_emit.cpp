// Stage 3 of a call: the rule builds the op into a module. Inputs are read
// out of their storages' values (views: sliced at their runtime offsets);
// results are converted to PyTorch's dtypes and written back through the
// destinations' views (a fresh output becomes a flat storage value).
#include <ATen/EmptyTensor.h>

#include "aten/call.h"
#include "aten/call_args.h"

namespace torch_tpu::aten {

using hlo::ElementType;
using hlo::TensorType;
using hlo::Value;
using lowering::Arg;

namespace {

// Storage `s`'s layout: recorded with the plan, or the storage's own.
StorageLayout LayoutOf(const Plan& plan, size_t s) {
  if (!plan.layouts.empty()) return plan.layouts[s];
  const runtime::DeviceStorage& st = *plan.storages[s];
  return StorageLayout{st.real_shape, st.padded_shape};
}

int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Whether storage `s`'s parameter is its whole padded buffer (not a value of
// its numel() real elements, e.g. in a fused chain).
bool IsPaddedBuffer(const Plan& plan, const std::vector<Value>& params, size_t s) {
  if (plan.storage_param[s] < 0) return false;
  const StorageLayout st = LayoutOf(plan, s);
  if (st.padded.empty()) return false;
  const Value& v = params[plan.storage_param[s]];
  return v.rank() == 1 && v.shape()[0] == Elements(st.padded);
}

// Storage `s`'s value: its parameter, or the real elements of a padded one
// (runtime.h: the front of each dim of its padded shape), flat.
Value StorageValue(const Plan& plan, hlo::Builder& b, const std::vector<Value>& params, size_t s) {
  Value v = params[plan.storage_param[s]];
  if (!IsPaddedBuffer(plan, params, s)) return v;
  const StorageLayout st = LayoutOf(plan, s);
  std::vector<int64_t> start(st.real.size(), 0), step(st.real.size(), 1);
  v = b.Slice(b.Reshape(v, st.padded), start, st.real, step);
  return b.Reshape(v, {Elements(st.real)});
}

// The written value `flat` (numel() elements) laid back into storage `s`'s
// padded layout, so that the storage keeps its buffer and layout (the next
// call of the same op hits the same executable; a dynamic op reads it as is).
Value RepaddedValue(const Plan& plan, hlo::Builder& b, const std::vector<Value>& params, size_t s,
                    Value flat) {
  if (!IsPaddedBuffer(plan, params, s)) return flat;
  const StorageLayout st = LayoutOf(plan, s);
  Value whole = params[plan.storage_param[s]];
  std::vector<Value> origin(st.padded.size(), b.ConstantInt(ElementType::I64, 0));
  Value updated = b.DynamicUpdateSlice(b.Reshape(whole, st.padded), b.Reshape(flat, st.real), origin);
  return b.Reshape(updated, {Elements(st.padded)});
}

Value Read(const Plan& plan, hlo::Builder& b, const std::vector<Value>& params, int idx) {
  const TensorIn& in = plan.inputs[idx];
  if (in.buffer_geometry && IsPaddedBuffer(plan, params, in.storage))
    return lowering::ReadView(b, params[in.storage_param], params[in.buffer_offset_param], *in.buffer_geometry);
  Value storage = StorageValue(plan, b, params, in.storage);
  Value offset = in.offset_param >= 0 ? params[in.offset_param] : Value();
  return lowering::ReadView(b, storage, offset, in.geometry);
}

std::vector<Arg> RuleArgs(const Plan& plan, hlo::Builder& b, const std::vector<Value>& params,
                          const std::vector<Value>* reads) {
  auto read = [&](int idx) {
    if (reads && (*reads)[idx].valid()) return (*reads)[idx];
    return Read(plan, b, params, idx);
  };
  std::vector<Arg> rule_args;
  for (size_t i = 0; i < plan.args.size(); ++i)
    if (i >= plan.is_out.size() || !plan.is_out[i]) rule_args.push_back(RuleArg(plan.args[i], params, read));
  return rule_args;
}

// A rule may return every output in the op's order, including those the op
// leaves undefined for these arguments: keep the defined ones.
std::vector<Value> DefinedResults(const Call& call, std::vector<Value> results) {
  if (results.size() == call.undefined_outputs.size() && results.size() > call.specs.size()) {
    std::vector<Value> kept;
    for (size_t i = 0; i < results.size(); ++i)
      if (!call.undefined_outputs[i]) kept.push_back(results[i]);
    results = kept;
  }
  TORCH_CHECK(results.size() >= call.specs.size(), call.desc->name, ": lowering rule returned ",
              results.size(), " values, expected ", call.specs.size());
  return results;
}

// A fresh output as the flat value of its new storage.
Value FreshStorageValue(hlo::Builder& b, const OutputSpec& spec, Value v) {
  lowering::ViewGeometry g;
  g.sizes = spec.sizes;
  g.strides = spec.strides;
  int64_t n = static_cast<int64_t>(at::detail::computeStorageNbytes(spec.sizes, spec.strides, 1));
  g.storage_numel = n;
  g.whole = g.strides == lowering::ContiguousStrides(g.sizes) || v.type.numel() == n;
  if (v.type.numel() == n && g.strides != lowering::ContiguousStrides(g.sizes)) g.whole = false;
  if (g.whole) return b.Reshape(v, {n});
  return lowering::WriteView(b, b.Splat(v.dtype(), 0, {n}), b.ConstantInt(ElementType::I64, 0), g, v);
}

}  // namespace

Emitted EmitCall(const Call& call, hlo::Builder& b, const std::vector<Value>& params,
                 const std::vector<Value>* reads) {
  const Plan& plan = call.plan;
  const std::string& name = call.desc->name;
  lowering::Context ctx{b};
  ctx.op = name;
  ctx.fp32_highest = plan.fp32_highest;
  for (const auto& s : call.specs)
    ctx.outputs.push_back(TensorType{ToElementType(s.dtype, name.c_str()), s.sizes});
  std::vector<Value> results = DefinedResults(call, call.desc->rule->rule(ctx, RuleArgs(plan, b, params, reads)));
  std::vector<Value> current(plan.storages.size());
  for (size_t s : call.written)
    if (plan.storage_param[s] >= 0) current[s] = StorageValue(plan, b, params, s);
  Emitted e;
  for (size_t i = 0; i < call.specs.size(); ++i) {
    Value v = results[i];
    TORCH_CHECK(v.shape() == call.specs[i].sizes, name, ": lowering rule produced ", v.type.str(),
                " but PyTorch expects shape [", hlo::Ints(call.specs[i].sizes), "]");
    const Dest& d = plan.dests[i];
    v = b.Convert(v, d.dtype);
    if (d.fresh) {
      e.fresh_results.push_back(v);
      e.fresh_values.push_back(FreshStorageValue(b, call.specs[i], v));
      continue;
    }
    Value offset = d.offset_param >= 0 ? params[d.offset_param] : Value();
    current[d.storage] = lowering::WriteView(b, current[d.storage], offset, d.geometry, v);
  }
  for (size_t k : call.written) e.written_values.push_back(RepaddedValue(plan, b, params, k, current[k]));
  e.checks = ctx.checks;
  return e;
}

at::Tensor FreshTensor(const Call& call, size_t i) {
  const OutputSpec& spec = call.specs[i];
  // What our empty_strided kernel does, without the dispatcher round trip
  // (the allocator takes the current device: the call's).
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, call.plan.device));
  at::Tensor t = at::detail::empty_strided_generic(spec.sizes, spec.strides, DeviceAllocator(),
                                                   c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                   spec.dtype);
  StorageOf(t)->dtype = call.plan.dests[i].dtype;
  return t;
}

std::vector<c10::IValue> WithUndefined(const Call& call, std::vector<c10::IValue> results) {
  const auto& undefined = call.undefined_outputs;
  if (std::find(undefined.begin(), undefined.end(), true) == undefined.end()) return results;
  std::vector<c10::IValue> all;
  size_t k = 0;
  for (bool u : undefined) all.push_back(u ? c10::IValue(at::Tensor()) : results[k++]);
  return all;
}

std::string CheckMessage(const OpDesc& desc, const std::string& message) {
  const std::string& op = desc.name;
  const std::string base = op.substr(0, op.find('.'));  // "embedding" of "embedding.default"
  if (message.rfind(base + ":", 0) == 0 || message.rfind(base + " ", 0) == 0) return message;
  return op + ": " + message;
}

}  // namespace torch_tpu::aten
