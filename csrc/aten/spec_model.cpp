// Output specs of a dynamic signature's new sizes without PyTorch's meta
// kernel.
//
// A new size of a signature that runs bounded-dynamic launches a compiled
// executable at once, but its exact output specs (sizes, strides, dtype)
// came from PyTorch's meta kernel: about 45 us of a 68 us first call on the
// 2-core host, for an `x * 2`. The outputs of the ops that run dynamic
// follow their inputs' sizes affinely (a sequence length, a batch, a
// concatenation's sum), so after one call through the meta kernel a
// signature learns how (a SpecModel) and later sizes derive their specs.
//
// A model groups the call's input dims of size > 1 that are not a
// parameter's by size: its classes (a dim and the dims equal to it, add's
// two sequence dims). Each class is moved by +1 through the meta kernel: how
// much each output dim changes is its slope in that class. A class the
// kernel refuses to move alone (grouped-query attention's head count, tied
// to its KV heads) or one equal to a parameter's dim stays fixed. Two more
// points (every free class +2, then +7) must agree with the slopes and with
// each output's dense order, else the signature keeps its meta kernel (a
// size int that multiplies two dims, a strided window).
//
// A later call takes the model only when its dims group the same way: each
// class equal inside, the classes apart from each other and from the
// parameters' dims, the fixed classes at their size, every derived size
// positive. Otherwise the meta kernel runs, and raises what it raises: the
// derived specs never skip one of its errors (two sequence lengths that
// must agree are one class; a call where they differ groups otherwise).
//
// A rule may state its results itself (DynamicShapes::derived_outputs:
// attention, whose meta kernel is a Python function and whose logsumexp's
// rows step by 32); a call with no cached specs takes them at any size.
//
// Not modelled (the meta kernel every time): rules whose outputs step
// (convolution, pooling: DynamicShapes::stepped_outputs) or scale their
// size ints, rules with their own output_types (no meta kernel to skip),
// out= variants, in-place calls with fresh outputs.
#include <algorithm>
#include <cstdlib>
#include <unordered_map>

#include "aten/call.h"
#include "aten/dynamic.h"

namespace torch_tpu::aten {

namespace {

struct SpecModel {
  std::vector<std::vector<int>> dim_class;  // per input, per dim: its class, -1 none
  std::vector<int64_t> fit;                 // per class: its size when the model was fit
  std::vector<bool> free;                   // per class: may take other sizes
  std::vector<int64_t> fixed_sizes;         // the parameters' dims > 1 (no free class takes one)
  std::vector<OutputSpec> specs;            // the cached specs at the fit (undefined ones too)
  std::vector<std::vector<int64_t>> order;  // per defined spec: its dims outermost first
  std::vector<std::vector<std::vector<int64_t>>> slope;  // per defined spec, per dim, per class
  bool usable = false;
};

constexpr size_t kMaxModels = 8;  // per signature (its size families and groupings)

struct SpecModels {
  std::unordered_map<std::string, std::vector<SpecModel>> by_signature;
  // Compare every derived spec with the meta kernel's (tests; also
  // TORCH_TPU_CHECK_DERIVED_SPECS=1 for a whole run).
  bool check = std::getenv("TORCH_TPU_CHECK_DERIVED_SPECS") != nullptr;
};

SpecModels& Models() {
  static auto* m = new SpecModels();
  return *m;
}

// The dense order of a spec (padded_layout.h: StorageOrder) when the order
// gives back all its strides, size-1 dims' included; nullopt otherwise.
std::optional<std::vector<int64_t>> DenseOrder(const OutputSpec& s) {
  std::optional<std::vector<int64_t>> order = StorageOrder(s.sizes, s.strides);
  if (!order || DenseStrides(s.sizes, *order) != s.strides) return std::nullopt;
  return order;
}

std::vector<OutputSpec> Defined(const std::vector<OutputSpec>& specs) {
  std::vector<OutputSpec> out;
  for (const OutputSpec& s : specs)
    if (s.defined) out.push_back(s);
  return out;
}

// Whether the rule's calls can have a model at all.
bool Modelled(const Call& call) {
  const lowering::RuleEntry* rule = call.desc->rule;
  if (!rule || !rule->dynamic.enabled || rule->dynamic.stepped_outputs || rule->output_types) return false;
  for (const lowering::SizeInt& s : rule->dynamic.size_ints)
    if (s.scale_arg >= 0) return false;
  if (call.desc->variant == Variant::Out) return false;
  return call.plan.geometry_spans.size() == call.plan.inputs.size();
}

// Per class, its size in `plan` when the plan groups its dims as the model
// does (see the file comment); nullopt otherwise.
std::optional<std::vector<int64_t>> ClassSizes(const SpecModel& m, const Plan& plan) {
  if (m.dim_class.size() != plan.inputs.size()) return std::nullopt;
  std::vector<int64_t> now(m.fit.size(), -1);
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    const auto& sizes = plan.inputs[i].geometry.sizes;
    if (m.dim_class[i].size() != sizes.size()) return std::nullopt;
    for (size_t d = 0; d < sizes.size(); ++d) {
      const int c = m.dim_class[i][d];
      if (c < 0) continue;
      if (now[c] < 0) now[c] = sizes[d];
      else if (now[c] != sizes[d]) return std::nullopt;
    }
  }
  for (size_t c = 0; c < now.size(); ++c) {
    if (!m.free[c] && now[c] != m.fit[c]) return std::nullopt;
    if (m.free[c] && std::find(m.fixed_sizes.begin(), m.fixed_sizes.end(), now[c]) != m.fixed_sizes.end())
      return std::nullopt;
    for (size_t e = 0; e < c; ++e)
      if (now[e] == now[c]) return std::nullopt;
  }
  return now;
}

// The model's specs at class sizes `now`; nullopt when a size would not be
// positive (the meta kernel says why).
std::optional<std::vector<OutputSpec>> SpecsAt(const SpecModel& m, const std::vector<int64_t>& now) {
  std::vector<OutputSpec> out = m.specs;
  size_t k = 0;
  for (OutputSpec& s : out) {
    if (!s.defined) continue;
    for (size_t d = 0; d < s.sizes.size(); ++d) {
      int64_t size = s.sizes[d];
      for (size_t c = 0; c < now.size(); ++c) size += m.slope[k][d][c] * (now[c] - m.fit[c]);
      if (size < 0 || (size == 0 && s.sizes[d] != 0)) return std::nullopt;
      s.sizes[d] = size;
    }
    s.strides = DenseStrides(s.sizes, m.order[k]);
    ++k;
  }
  return out;
}

// The call's input sizes with every dim of class c in `moves` moved by its delta.
std::vector<std::vector<int64_t>> Moved(const SpecModel& m, const Plan& plan, const std::vector<int64_t>& moves) {
  std::vector<std::vector<int64_t>> sizes;
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    sizes.push_back(plan.inputs[i].geometry.sizes);
    for (size_t d = 0; d < sizes[i].size(); ++d)
      if (m.dim_class[i][d] >= 0) sizes[i][d] += moves[m.dim_class[i][d]];
  }
  return sizes;
}

// The classes of the call's dims (see the file comment).
SpecModel Grouped(const Plan& plan, const std::vector<bool>& fixed) {
  SpecModel m;
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    const auto& sizes = plan.inputs[i].geometry.sizes;
    m.dim_class.emplace_back(sizes.size(), -1);
    for (size_t d = 0; d < sizes.size(); ++d) {
      if (sizes[d] <= 1) continue;
      if (fixed[i]) {
        m.fixed_sizes.push_back(sizes[d]);
        continue;
      }
      auto at = std::find(m.fit.begin(), m.fit.end(), sizes[d]);
      m.dim_class[i][d] = static_cast<int>(at - m.fit.begin());
      if (at == m.fit.end()) m.fit.push_back(sizes[d]);
    }
  }
  m.free.resize(m.fit.size());
  for (size_t c = 0; c < m.fit.size(); ++c)
    m.free[c] = std::find(m.fixed_sizes.begin(), m.fixed_sizes.end(), m.fit[c]) == m.fixed_sizes.end();
  return m;
}

// Whether specs `got` have the rank and dtype of the model's defined specs.
bool SameKinds(const std::vector<OutputSpec>& got, const std::vector<OutputSpec>& base) {
  if (got.size() != base.size()) return false;
  for (size_t k = 0; k < got.size(); ++k)
    if (got[k].sizes.size() != base[k].sizes.size() || got[k].dtype != base[k].dtype) return false;
  return true;
}

// Fits the slopes of the model's classes and checks them at two more
// points; false: the signature keeps the meta kernel for this grouping.
bool Fit(SpecModel& m, const Call& call, const c10::OperatorHandle& op, const std::vector<c10::IValue>& args) {
  const bool in_place = call.desc->variant == Variant::InPlace;
  const std::vector<OutputSpec> base = Defined(m.specs);
  for (const OutputSpec& s : base) {
    std::optional<std::vector<int64_t>> order = DenseOrder(s);
    if (!order) return false;
    m.order.push_back(*order);
    m.slope.emplace_back(s.sizes.size(), std::vector<int64_t>(m.fit.size(), 0));
  }
  for (size_t c = 0; c < m.fit.size(); ++c) {
    if (!m.free[c]) continue;
    std::vector<int64_t> moves(m.fit.size(), 0);
    moves[c] = 1;
    std::vector<OutputSpec> got;
    try {
      got = MetaSpecsAt(call, op, args, Moved(m, call.plan, moves));
    } catch (const std::exception&) {  // the kernel ties this class to another: fixed
      m.free[c] = false;
      continue;
    }
    if (in_place) continue;
    if (!SameKinds(got, base)) return false;
    for (size_t k = 0; k < base.size(); ++k)
      for (size_t d = 0; d < base[k].sizes.size(); ++d) m.slope[k][d][c] = got[k].sizes[d] - base[k].sizes[d];
  }
  for (int64_t delta : {2, 7}) {
    std::vector<int64_t> moves(m.fit.size(), 0), now = m.fit;
    for (size_t c = 0; c < m.fit.size(); ++c)
      if (m.free[c]) {
        moves[c] = delta;
        now[c] += delta;
      }
    std::vector<OutputSpec> got;
    try {
      got = MetaSpecsAt(call, op, args, Moved(m, call.plan, moves));
    } catch (const std::exception&) {
      return false;
    }
    if (in_place) continue;
    std::optional<std::vector<OutputSpec>> want = SpecsAt(m, now);
    if (!want) return false;
    const std::vector<OutputSpec> derived = Defined(*want);
    if (!SameKinds(got, derived)) return false;
    for (size_t k = 0; k < got.size(); ++k)
      if (got[k].sizes != derived[k].sizes || got[k].strides != derived[k].strides) return false;
  }
  return true;
}

}  // namespace

// The results a rule states itself (DynamicShapes::derived_outputs), dense
// in their orders; nullopt where it does not vouch for the args.
std::optional<std::vector<OutputSpec>> RuleDerivedSpecs(const Call& call) {
  const lowering::DerivedOutputs& derive = call.desc->rule->dynamic.derived_outputs;
  if (!derive || call.desc->variant != Variant::Functional) return std::nullopt;
  std::optional<std::vector<lowering::OutputLayout>> layouts = derive(AbstractArgs(call.plan));
  if (!layouts) return std::nullopt;
  std::vector<OutputSpec> specs;
  for (const lowering::OutputLayout& l : *layouts)
    specs.push_back({l.type.shape, DenseStrides(l.type.shape, l.order), ToScalarType(l.type.dtype)});
  return specs;
}

std::optional<std::vector<OutputSpec>> DerivedSpecs(const Call& call, const c10::OperatorHandle& op,
                                                    const std::vector<c10::IValue>& args) {
  if (!DynamicShapesActive() || !call.desc->rule) return std::nullopt;
  if (std::optional<std::vector<OutputSpec>> specs = RuleDerivedSpecs(call)) {
    if (Models().check) CheckDerivedSpecs(call, op, args, *specs);
    CountDerivedSpecs();
    return specs;
  }
  if (!Modelled(call)) return std::nullopt;
  auto found = Models().by_signature.find(DynamicSignature(call, args));
  if (found == Models().by_signature.end()) return std::nullopt;
  for (const SpecModel& m : found->second) {
    std::optional<std::vector<int64_t>> now = ClassSizes(m, call.plan);
    if (!now) continue;
    if (!m.usable) return std::nullopt;
    std::optional<std::vector<OutputSpec>> specs = SpecsAt(m, *now);
    if (specs && Models().check) CheckDerivedSpecs(call, op, args, *specs);
    if (specs) CountDerivedSpecs();
    return specs;
  }
  return std::nullopt;
}

void LearnSpecs(const Call& call, const c10::OperatorHandle& op, const std::vector<c10::IValue>& args) {
  if (!Modelled(call) || (call.desc->variant == Variant::InPlace && !call.cached().empty())) return;
  std::vector<bool> fixed;
  std::vector<SpecModel>& models = Models().by_signature[DynamicSignature(call, args, &fixed)];
  if (models.size() >= kMaxModels) return;
  for (const SpecModel& m : models)
    if (ClassSizes(m, call.plan)) return;  // this grouping is known (usable or not)
  SpecModel m = Grouped(call.plan, fixed);
  m.specs = call.cached();
  m.usable = Fit(m, call, op, args);
  models.push_back(std::move(m));
}

void SetCheckDerivedSpecs(bool on) { Models().check = on; }

void ForgetSpecModels() { Models().by_signature.clear(); }

}  // namespace torch_tpu::aten
