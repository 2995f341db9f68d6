// The argument decoder: ONE reading of an op's schema arguments, shared by
// eager calls (call_plan.cpp) and graph nodes (graph.cpp). Given the schema
// and the boxed values, it decides per argument what the rule gets (a
// tensor, a runtime scalar, an int list, a generator...), adds the module
// parameters scalars and generators need, and writes the cache key. What
// differs between the two modes is said by the caller:
// - how a tensor argument resolves (TensorSource): eager reads a view out
//   of a storage, a graph takes one of its values;
// - which scalars are runtime parameters: Scalar and Scalar[] arguments
//   always, float arguments when the rule says so (RuleEntry::IsRuntimeFloat),
//   in both modes, so a changing lr or alpha never recompiles.
#pragma once

#include <string>
#include <vector>

#include "aten/call.h"

namespace torch_tpu::aten {

// How a tensor argument (never None) becomes part of the plan.
class TensorSource {
 public:
  // Returns its ArgPlan: a read (kind Tensor, tensors = {index}: the
  // source's own index, a plan input or a graph value) or a number
  // (DecodeScalar: a wrapped Python number).
  virtual ArgPlan Tensor(Plan& plan, const c10::IValue& v) = 0;

 protected:
  ~TensorSource() = default;
};

// Decodes the schema arguments into plan.args (one per argument; out=
// arguments, plan.is_out, stay empty).
void DecodeArgs(Plan& plan, const lowering::RuleEntry& rule, const std::vector<c10::Argument>& schema,
                const std::vector<c10::IValue>& args, TensorSource& tensors, const std::string& op);
// Adds a module parameter to the plan; returns its index.
int AddParam(Plan& plan, Param param);
// A number as a runtime scalar parameter of its category (Bool, I64, F64, C128).
ArgPlan DecodeScalar(Plan& plan, const c10::Scalar& s);
// Generator arguments left None still need a state parameter; a random rule
// of an op without a generator argument (native_dropout, ...) draws from the
// default generator: an extra, last argument.
void DecodeGenerators(Plan& plan, const lowering::RuleEntry& rule, const std::vector<c10::Argument>& schema);
// Float scalars run in f32 (complex in c64) unless an f64 tensor takes part.
void SetScalarWidths(Plan& plan);
// A scalar's exact value as text (hex floats), for cache keys.
std::string ExactString(const c10::Scalar& s);

// A decoded argument as the rule gets it, given a Value per plan parameter;
// `read(i)` gives the Value of the source's tensor i.
template <typename Read>
lowering::Arg RuleArg(const ArgPlan& ap, const std::vector<hlo::Value>& params, Read&& read) {
  using K = lowering::Arg::Kind;
  lowering::Arg a = ap.literal;
  a.kind = ap.kind;
  if (ap.kind == K::Tensor) {
    a.tensor = ap.param >= 0 ? params[ap.param] : read(ap.tensors[0]);
  } else if (ap.kind == K::TensorList) {
    for (int t : ap.tensors) a.tensors.push_back(t >= 0 ? read(t) : hlo::Value());
  } else if (ap.kind == K::Scalar || ap.kind == K::Generator) {
    a.tensor = params[ap.param];
  } else if (ap.kind == K::Double && ap.param >= 0) {
    a.tensor = params[ap.param];
  } else if (ap.kind == K::ScalarList) {
    for (size_t k = 0; k < ap.tensors.size(); ++k) a.tensors.push_back(params[ap.tensors[k]]);
    a.ints = ap.literal.ints;  // each element's category (ElementType)
  }
  return a;
}

}  // namespace torch_tpu::aten
