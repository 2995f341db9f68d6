// The op table: every ATen op with a lowering rule (its functional form and
// the in-place / out= variants computing the same function) is registered
// for PrivateUse1 with the one boxed eager kernel (eager.cpp). What the
// dispatcher needs to know of an op (variant, out= args, mutated args) is
// read from its schema and its rule entry, never from its name.
#include <torch/library.h>

#include <unordered_map>

#include "aten/call.h"

namespace torch_tpu::aten {

void EagerKernel(const OpDesc& desc, const c10::OperatorHandle& op,
                 torch::jit::Stack* stack);  // eager.cpp

namespace {

// The kernel registered for one op: it holds the op's entry, so a call
// finds it without a lookup.
class OpKernel final : public c10::OperatorKernel {
 public:
  explicit OpKernel(const OpDesc* desc) : desc_(desc) {}
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    EagerKernel(*desc_, op, stack);
  }

 private:
  const OpDesc* desc_;
};

std::unordered_map<c10::OperatorName, OpDesc>& Ops() {
  static auto* ops = new std::unordered_map<c10::OperatorName, OpDesc>();
  return *ops;
}

std::string FullName(const c10::FunctionSchema& s) {
  std::string n = s.name().substr(s.name().find("::") + 2);
  return s.overload_name().empty() ? n : n + "." + s.overload_name();
}

bool IsOutArg(const c10::Argument& a) {
  return a.kwarg_only() && a.alias_info() && a.alias_info()->isWrite();
}

OpDesc Describe(const c10::FunctionSchema& schema, const lowering::RuleEntry* rule) {
  OpDesc d;
  d.name = FullName(schema);
  d.rule = rule;
  for (size_t i = 0; i < schema.arguments().size(); ++i)
    if (IsOutArg(schema.arguments()[i])) d.out_args.push_back(i);
  if (!d.out_args.empty()) {
    d.variant = Variant::Out;
  } else {
    for (size_t i = 0; i < schema.arguments().size(); ++i) {
      const auto& arg = schema.arguments()[i];
      if (arg.alias_info() && arg.alias_info()->isWrite()) d.mutable_args.push_back(i);
    }
    // Args the op writes although its schema does not say so: the rule says.
    if (rule)
      for (size_t i : rule->extra_mutated_args) d.mutable_args.push_back(i);
    if (!d.mutable_args.empty()) d.variant = Variant::InPlace;
  }
  return d;
}

// Same argument names and types, ignoring out= args.
bool SameFunctionalArgs(const c10::FunctionSchema& a, const c10::FunctionSchema& b) {
  std::vector<const c10::Argument*> x, y;
  for (const auto& arg : a.arguments())
    if (!IsOutArg(arg)) x.push_back(&arg);
  for (const auto& arg : b.arguments())
    if (!IsOutArg(arg)) y.push_back(&arg);
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i)
    if (x[i]->name() != y[i]->name() || x[i]->type()->str() != y[i]->type()->str()) return false;
  return true;
}

std::vector<std::unique_ptr<torch::Library>>& Libraries() {
  static auto* libs = new std::vector<std::unique_ptr<torch::Library>>();
  return *libs;
}

}  // namespace

void CountNative(const OpDesc& desc) {
  auto& rt = GetRuntime();
  if (desc.stats_generation != rt.stats_generation() || !desc.native_count) {
    desc.native_count = &rt.stats().native_ops[desc.name];
    desc.stats_generation = rt.stats_generation();
  }
  ++*desc.native_count;
}

OpDesc InternalOp(const std::string& name, Variant variant, std::vector<size_t> mutable_args) {
  OpDesc d;
  d.name = name;
  d.rule = lowering::FindInternal(name);
  TORCH_CHECK(d.rule, "no internal tpu rule ", name);
  d.variant = variant;
  d.mutable_args = std::move(mutable_args);
  return d;
}

void RegisterNativeRules() {
  auto& dispatcher = c10::Dispatcher::singleton();
  // Group all schemas by base name once, to find in-place and out= variants.
  std::unordered_map<std::string, std::vector<c10::OperatorName>> by_base;
  for (const auto& op_name : dispatcher.getAllOpNames()) {
    if (op_name.name.rfind("aten::", 0) != 0) continue;
    std::string base = op_name.name.substr(6);
    if (!base.empty() && base.back() == '_') base.pop_back();
    by_base[base].push_back(op_name);
  }
  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                              c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  auto add = [&](const c10::OperatorName& name, const lowering::RuleEntry* rule) {
    if (Ops().count(name)) return;
    auto handle = dispatcher.findOp(name);
    if (!handle) return;
    // A tpu kernel for a CompositeImplicitAutograd op without its own autograd
    // formula (where.ScalarOther, ...) would take the op out of autograd
    // (gradients silently stop there); such ops decompose into native ones.
    if (handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) &&
        !handle->hasKernelForDispatchKey(c10::DispatchKey::Autograd))
      return;
    Ops()[name] = Describe(handle->schema(), rule);
    std::string full = FullName(handle->schema());
    lib->impl(full.c_str(),
              torch::CppFunction::makeFromBoxedFunctor(std::make_unique<OpKernel>(&Ops()[name])));
  };
  for (const lowering::RuleEntry* rule : lowering::AllRules()) {
    if (rule->scope != lowering::Scope::Everywhere) continue;  // graph-only, internal
    std::string base = rule->name.substr(0, rule->name.find('.'));
    std::string overload =
        rule->name.find('.') == std::string::npos ? "" : rule->name.substr(rule->name.find('.') + 1);
    auto handle = dispatcher.findSchema({"aten::" + base, overload});
    TORCH_CHECK(handle, "torch_tpu: lowering rule for unknown op aten::", rule->name);
    add(handle->operator_name(), rule);
    for (const auto& variant : rule->variants) {
      auto dot = variant.find('.');
      auto v = dispatcher.findSchema({"aten::" + variant.substr(0, dot),
                                      dot == std::string::npos ? "" : variant.substr(dot + 1)});
      TORCH_CHECK(v, "torch_tpu: lowering rule variant for unknown op aten::", variant);
      add(v->operator_name(), rule);
    }
    std::string stem = base;
    if (!stem.empty() && stem.back() == '_') stem.pop_back();
    if (handle->schema().is_mutable()) continue;  // rule is itself a variant
    for (const auto& other : by_base[stem]) {
      auto h = dispatcher.findOp(other);
      if (!h || other == handle->operator_name()) continue;
      const auto& s = h->schema();
      bool inplace = other.name == "aten::" + stem + "_" && other.overload_name == overload;
      bool out = !Describe(s, rule).out_args.empty() && other.name == "aten::" + stem &&
                 SameFunctionalArgs(s, handle->schema()) &&
                 s.returns().size() == handle->schema().returns().size();
      if (inplace || out) add(other, rule);
    }
  }
  Libraries().push_back(std::move(lib));
}

}  // namespace torch_tpu::aten
