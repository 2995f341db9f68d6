// Stage 2 of a call: the types of what the op returns. A rule that states
// its output types (RuleEntry::output_types) gives them; otherwise PyTorch's
// meta kernel does (once per cache key: the specs are cached with the
// executable). In-place ops return their fresh outputs (batch norm's mean
// and rstd) first, then the mutated tensors.
#include <ATen/native/Resize.h>

#include <algorithm>
#include <numeric>

#include "aten/call.h"

namespace torch_tpu::aten {

using hlo::ElementType;
using lowering::Arg;

namespace {

// Output specs from PyTorch's meta kernel for this call.
std::vector<OutputSpec> MetaOutputs(const c10::OperatorHandle& op,
                                    const std::vector<c10::IValue>& args) {
  auto to_meta = [](const c10::IValue& v) -> c10::IValue {
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined() || t.device().type() != c10::DeviceType::PrivateUse1) return v;
      return at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta));
    }
    if (v.isTensorList()) {
      std::vector<at::Tensor> out;
      for (const at::Tensor& t : v.toTensorVector())
        out.push_back(t.device().type() == c10::DeviceType::PrivateUse1
                          ? at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta))
                          : t);
      return out;
    }
    if (v.isList()) {
      auto list = v.toList();
      if (list.elementType()->kind() == c10::TypeKind::OptionalType) {
        c10::List<std::optional<at::Tensor>> out;
        for (const auto& e : list) {
          c10::IValue ev = e;
          if (ev.isNone() || (ev.isTensor() && !ev.toTensor().defined())) {
            out.push_back(std::nullopt);
          } else {
            const at::Tensor& t = ev.toTensor();
            out.push_back(t.device().type() == c10::DeviceType::PrivateUse1
                              ? at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta))
                              : t);
          }
        }
        return out;
      }
    }
    if (v.isGenerator()) return c10::IValue();
    if (v.isDevice()) return c10::IValue(c10::Device(at::kMeta));
    return v;
  };
  torch::jit::Stack stack;
  for (const auto& v : args) stack.push_back(to_meta(v));
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.callBoxed(stack);
  }
  std::vector<OutputSpec> outs;
  for (const auto& r : stack) {
    if (r.isTensor()) {
      const at::Tensor& t = r.toTensor();
      if (!t.defined()) {
        outs.push_back({{}, {}, at::kFloat, false});
        continue;
      }
      outs.push_back({t.sizes().vec(), t.strides().vec(), t.scalar_type()});
    } else if (r.isNone()) {
      outs.push_back({{}, {}, at::kFloat, false});
    } else if (r.isTensorList()) {
      for (const at::Tensor& t : r.toTensorVector())
        outs.push_back({t.sizes().vec(), t.strides().vec(), t.scalar_type()});
    } else {
      throw lowering::Unsupported("op returns a non-tensor value");
    }
  }
  return outs;
}

// A spec whose strides leave gaps (or overlap), made dense in its dims'
// order by stride (RuleEntry::dense_outputs).
void MakeDense(OutputSpec& s) {
  if (!s.defined || StorageOrder(s.sizes, s.strides)) return;
  std::vector<int64_t> order(s.sizes.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return s.strides[a] > s.strides[b]; });
  s.strides = DenseStrides(s.sizes, order);
}

std::vector<OutputSpec> Fresh(const Call& call, const c10::OperatorHandle& op,
                              const std::vector<c10::IValue>& args) {
  if (call.desc->rule->output_types) return RuleOutputSpecs(call);
  std::vector<OutputSpec> specs = MetaOutputs(op, args);
  if (call.desc->rule->dense_outputs) std::for_each(specs.begin(), specs.end(), MakeDense);
  return specs;
}

// Mutating ops: the returns that are not aliases of a mutated argument are
// fresh outputs. Meta runs once per signature (it also raises the same
// errors as CPU).
std::vector<OutputSpec> InPlaceFresh(const Call& call, const c10::OperatorHandle& op,
                                     const std::vector<c10::IValue>& args) {
  std::vector<OutputSpec> meta;
  const auto& schema = op.schema();
  try {
    meta = Fresh(call, op, args);
  } catch (const c10::NotImplementedError&) {
    // No meta kernel at all (_fused_sgd_): fine for an op that returns
    // nothing (no fresh outputs to size); the rule validates.
    if (!schema.returns().empty()) throw;
  }
  std::vector<OutputSpec> specs;
  const auto& returns = schema.returns();
  for (size_t j = 0; j < returns.size() && j < meta.size(); ++j)
    if (!returns[j].alias_info()) specs.push_back(meta[j]);
  return specs;
}

}  // namespace

std::vector<OutputSpec> RuleOutputSpecs(const Call& call) {
  std::vector<OutputSpec> out;
  for (const hlo::TensorType& t : call.desc->rule->output_types(AbstractArgs(call.plan)))
    out.push_back({t.shape, lowering::ContiguousStrides(t.shape), ToScalarType(t.dtype)});
  return out;
}

void CheckDerivedSpecs(const Call& call, const c10::OperatorHandle& op, const std::vector<c10::IValue>& args,
                       const std::vector<OutputSpec>& derived) {
  const std::vector<OutputSpec> meta =
      call.desc->variant == Variant::InPlace ? InPlaceFresh(call, op, args) : Fresh(call, op, args);
  bool same = meta.size() == derived.size();
  for (size_t k = 0; same && k < meta.size(); ++k)
    same = meta[k].defined == derived[k].defined &&
           (!meta[k].defined || (meta[k].sizes == derived[k].sizes && meta[k].strides == derived[k].strides &&
                                 meta[k].dtype == derived[k].dtype));
  TORCH_CHECK(same, call.desc->name, ": internal: output specs derived for a new size differ from the meta "
              "kernel's (spec_model.cpp); please report this");
}

bool ComputeOutputs(Call& call, const c10::OperatorHandle& op, const std::vector<c10::IValue>& args,
                    const std::vector<OutputSpec>* cached) {
  Plan& plan = call.plan;
  const OpDesc& desc = *call.desc;
  if (desc.variant == Variant::InPlace) {
    call.cached_specs = cached;
    if (!cached) call.computed_specs = InPlaceFresh(call, op, args);
    call.specs = call.cached();
    std::vector<Dest> fresh(call.specs.size());
    for (size_t j = 0; j < call.specs.size(); ++j)
      fresh[j].dtype = ToElementType(call.specs[j].dtype, desc.name.c_str());
    plan.dests.insert(plan.dests.begin(), fresh.begin(), fresh.end());
    for (const at::Tensor& t : plan.dest_tensors)
      call.specs.push_back({t.sizes().vec(), t.strides().vec(), t.scalar_type()});
  } else {
    call.cached_specs = cached;
    if (!cached) call.computed_specs = Fresh(call, op, args);
    call.specs = call.cached();
    // Undefined outputs: remembered for the results, invisible to the rule.
    for (const auto& s : call.specs) call.undefined_outputs.push_back(!s.defined);
    call.specs.erase(std::remove_if(call.specs.begin(), call.specs.end(),
                                    [](const OutputSpec& o) { return !o.defined; }),
                     call.specs.end());
  }
  // Out= tensors take the result's shape (resize like ATen does).
  if (desc.variant == Variant::Out) {
    for (size_t i = 0; i < plan.dest_tensors.size() && i < call.specs.size(); ++i) {
      if (plan.dest_tensors[i].sizes().vec() != call.specs[i].sizes) {
        at::native::resize_output(plan.dest_tensors[i], call.specs[i].sizes);
        return false;
      }
    }
  }
  TORCH_CHECK(desc.variant == Variant::Functional || plan.dests.size() == call.specs.size(), desc.name,
              ": expected ", plan.dests.size(), " results, meta gave ", call.specs.size());
  return true;
}

}  // namespace torch_tpu::aten
