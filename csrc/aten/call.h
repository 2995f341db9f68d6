// An ATen call on tpu tensors, in the three stages every execution mode
// shares: PLAN (what each argument is: a storage read, a view offset, a
// scalar, an RNG state, a CPU tensor; and the cache key), OUTPUTS (the types
// the op returns, from the rule or PyTorch's meta kernel) and EMIT (the rule
// builds the op into a module, reading views out of storages and writing
// results back through them). Strict eager compiles and launches the module
// (eager.cpp), fused eager records it into a chain (fused.cpp).
#pragma once

#include <c10/util/SmallVector.h>

#include <optional>
#include <vector>

#include "aten/padded_layout.h"
#include "aten/tpu.h"
#include "runtime/launcher.h"

namespace torch_tpu::aten {

enum class Variant { Functional, InPlace, Out };

// What the dispatcher knows of one registered ATen op (op_table.cpp).
struct OpDesc {
  std::string name;  // "add.Tensor"
  const lowering::RuleEntry* rule = nullptr;
  Variant variant = Variant::Functional;
  std::vector<size_t> out_args;  // schema indices of out= tensors
  // InPlace: schema indices of the mutated (non-out) Tensor / Tensor[] args.
  // The rule returns one value per mutated tensor, lists flattened.
  std::vector<size_t> mutable_args;
  // Its entry in debug.stats()["native_ops"], found once per stats reset.
  mutable int64_t* native_count = nullptr;
  mutable int64_t stats_generation = -1;
};

// Counts one native run of the op.
void CountNative(const OpDesc& desc);

// The op table (op_table.cpp): an entry for an Internal rule called as an
// op of the given variant.
OpDesc InternalOp(const std::string& name, Variant variant, std::vector<size_t> mutable_args);

// Plans and runs one call (eager.cpp); returns fresh outputs, then mutated
// tensors.
std::vector<c10::IValue> RunCall(const OpDesc& desc, const c10::OperatorHandle& op,
                                 const std::vector<c10::IValue>& args);

// One module parameter of a call.
struct Param {
  enum class Kind { Storage, Offset, Scalar, Rng, CpuTensor } kind;
  size_t storage = 0;        // Storage: index into Plan::storages
  int64_t offset = 0;        // Offset
  c10::Scalar scalar;        // Scalar
  hlo::ElementType dtype = hlo::ElementType::F32;
  uint64_t rng[2] = {0, 0};  // Rng
  at::Tensor cpu;            // CpuTensor
  bool buffer_read = false;  // Offset of a TensorIn::buffer_geometry read (exact modules only)
};

// A tpu tensor read by the call: a view of one of the plan's storages.
struct TensorIn {
  size_t storage;
  hlo::ElementType dtype;
  lowering::ViewGeometry geometry;
  int offset_param = -1;
  int storage_param = -1;
  // A window of a padded storage, read by an exact op straight out of the
  // padded buffer (padded_layout.h: ReadInBuffer), at buffer_offset_param.
  std::optional<lowering::ViewGeometry> buffer_geometry;
  int buffer_offset_param = -1;
};

// One schema argument: its kind, where its values come from, its literal.
struct ArgPlan {
  lowering::Arg::Kind kind = lowering::Arg::Kind::None;
  std::vector<int> tensors;  // indices into Plan::inputs (-1: None in Tensor?[])
  int param = -1;            // Scalar / Rng / CpuTensor / runtime Double
  lowering::Arg literal;
};

// Where one result goes: an existing tensor (in-place self, out=) written
// through its view, or a fresh tensor (tensor undefined).
struct Dest {
  at::Tensor tensor;
  bool fresh = true;  // a fresh output (tensor undefined), kept when a recorded call drops `tensor`
  size_t storage = 0;
  lowering::ViewGeometry geometry;
  int offset_param = -1;
  hlo::ElementType dtype;
};

struct Plan {
  std::vector<runtime::DeviceStorage*> storages;
  // Per storage, its layout (padded_layout.h; `padded` empty: exact) when the
  // plan was recorded (fused eager emits a chain when it runs, after its
  // storages may have changed or gone); empty: emission reads the storages.
  std::vector<StorageLayout> layouts;
  std::vector<int> storage_param;  // per storage, -1 if not a parameter
  std::vector<Param> params;
  std::vector<TensorIn> inputs;
  std::vector<ArgPlan> args;       // per schema arg (+ an appended generator)
  std::vector<bool> is_out;        // per schema arg
  std::vector<at::Tensor> dest_tensors;  // in-place / out= destinations
  std::vector<Dest> dests;         // their writes (fresh outputs added later)
  std::string key;
  // Per input: where its geometry (sizes, strides) sits in `key`.
  std::vector<std::pair<size_t, size_t>> geometry_spans;
  // Where the destinations' part (their dtypes and geometries) sits in `key`.
  std::pair<size_t, size_t> dest_span{0, 0};
  int device = -1;
  bool any_f64 = false;
  bool fp32_highest = false;  // float32 matmul precision "highest" (in `key`)
};

// PyTorch's description of one result.
struct OutputSpec {
  std::vector<int64_t> sizes, strides;
  at::ScalarType dtype;
  // An output the op does not produce for these arguments (e.g.
  // convolution_backward with output_mask false): returned undefined, not
  // listed in the rule's ctx.outputs.
  bool defined = true;
};

// A planned call with its outputs: everything emission and launch need.
struct Call {
  const OpDesc* desc = nullptr;
  Plan plan;
  std::vector<OutputSpec> specs;       // the rule's outputs (defined ones), then mutated tensors
  std::vector<bool> undefined_outputs;  // per meta output (functional ops)
  // What the output cache keeps for this key: the specs it already had (not
  // copied per call) or, on a miss, the ones computed for this call.
  const std::vector<OutputSpec>* cached_specs = nullptr;
  std::vector<OutputSpec> computed_specs;
  const std::vector<OutputSpec>& cached() const { return cached_specs ? *cached_specs : computed_specs; }
  std::vector<size_t> written;         // storages written, in result order
};

// ---- stage 1: plan (call_plan.cpp)
// The whole out= tensors of a call, and the whole destinations of an
// in-place call that overwrites them (RuleEntry::overwrites_destination),
// get buffers without zeros when they have none yet (GiveBufferToOverwrite).
void GiveOverwrittenDestinationsBuffers(const OpDesc& desc, const std::vector<c10::IValue>& args);
Plan PlanCall(const OpDesc& desc, const c10::FunctionSchema& schema,
              const std::vector<c10::IValue>& args);
// Adds fresh-output destinations, RNG states and the written-storage list.
void FinishPlan(Call& call, const std::vector<c10::IValue>& args);
// How many random values the call draws (its generators advance by that much).
uint64_t RngDraws(const Call& call);
// Whether parameter q's storage is one the call writes: its buffer is donated to the launch.
bool Donated(const Call& call, const Param& q);
hlo::TensorType ParamType(const Plan& plan, const Param& q);
// A padded storage's real and padded shapes, for the key of a plan that
// takes it as a parameter (its type is the padded numel); nothing for an
// exact buffer.
void AppendCapacityKey(const runtime::DeviceStorage& s, std::string* key);
runtime::LaunchParam LaunchValue(const Plan& plan, const Param& q);

// ---- stage 2: outputs (call_outputs.cpp). Returns false when `args` changed
// (an out= tensor was resized): plan again.
bool ComputeOutputs(Call& call, const c10::OperatorHandle& op, const std::vector<c10::IValue>& args,
                    const std::vector<OutputSpec>* cached);
// The outputs the rule's output_types give for the plan's input sizes (for
// a rule that has them: PyTorch's meta kernel disagrees with it, e.g. batch
// norm's saved statistics in eval mode).
std::vector<OutputSpec> RuleOutputSpecs(const Call& call);
// Rule arguments with types and no values (Tensor args: Value with id -1).
std::vector<lowering::Arg> AbstractArgs(const Plan& plan);

// ---- stage 3: emit (call_emit.cpp). Given a Value per plan parameter,
// returns the new values of the written storages, then the fresh outputs
// (flat storage values), and the device assertions.
struct Emitted {
  std::vector<hlo::Value> written_values, fresh_values;
  std::vector<hlo::Value> fresh_results;  // the fresh outputs before flattening
  std::vector<lowering::Context::Check> checks;
};
// `reads`, when given: per plan input, its value already read (an invalid
// Value: read it from its storage as usual). Bounded-dynamic calls read their
// dynamic inputs themselves (dynamic.cpp).
Emitted EmitCall(const Call& call, hlo::Builder& b, const std::vector<hlo::Value>& params,
                 const std::vector<hlo::Value>* reads = nullptr);
// A device assertion's message as the user reads it: prefixed with the op's
// name unless the rule's message starts with it ("embedding: index out of range").
std::string CheckMessage(const OpDesc& desc, const std::string& message);

// ---- bounded dynamic shapes (dynamic.cpp)
class FastCall;
// How a bounded-dynamic launch leaves a fresh result's storage: its buffer
// at `padded` sizes (storage order) with the real `real` elements at the
// front of each dim, `product` its product-bucket dims (empty: none);
// `padded` empty: an exact buffer.
struct ResultLayout {
  std::vector<int64_t> real, padded;
  std::vector<bool> product;
  void Apply(runtime::DeviceStorage* s, pjrt::BufferPtr buffer) const;
};
// What a bounded-dynamic launch of a call took, for the hit path to launch
// it again (FastCall::RememberBounded).
struct BoundedLaunch {
  pjrt::ExecutablePtr exe;
  std::vector<std::string> checks;
  std::vector<bool> taken;     // per plan parameter: whether it is a module parameter
  std::vector<int64_t> sizes;  // the runtime sizes (i32) after those
  std::vector<ResultLayout> results;  // per fresh result
};
// Strict eager, on a miss of the exact-shape cache: runs the call on a
// bounded-dynamic executable when its signature has dynamic dims; nullopt
// when the call runs with exact shapes. `fast` remembers the launch.
std::optional<std::vector<c10::IValue>> RunDynamic(Call& call, const c10::OperatorHandle& op,
                                                   const std::vector<c10::IValue>& args, FastCall& fast);
// An op on rows (DynamicShapes::rows_args: mm, addmm, log_softmax,
// nll_loss, ...) whose rows are a padded storage's folded outer dims (a
// linear on a [b, s, h] activation padded in b and s, a causal LM's [b*s, V]
// logits): runs on the buffer's rows, its results with rows padded like them
// (padded_rows.cpp); nullopt: not such a call.
std::optional<std::vector<c10::IValue>> RunOnPaddedRows(const Call& call, FastCall& fast);
// mm contracting such rows (grad_output^T @ input: a linear's weight
// gradient): all the buffer rows, the padding rows zeroed; the result exact
// (padded_rows.cpp); nullopt: not such a call.
std::optional<std::vector<c10::IValue>> RunOnContractedRows(const Call& call, FastCall& fast);
// A small factory at a new size computed by PyTorch's CPU kernel and
// uploaded, before any planning (host_factory.cpp); nullopt: plan and
// compile as usual.
std::optional<std::vector<c10::IValue>> RunFactoryOnHost(const OpDesc& desc, const c10::OperatorHandle& op,
                                                         const std::vector<c10::IValue>& args);
// Output specs remembered for an exact-shape key that ran dynamic (null if none).
const std::vector<OutputSpec>* DynamicSpecs(const std::string& key);
// A call's signature (dynamic.cpp): its exact-shape key with the sizes of
// every input that is not a parameter left out (`fixed`, when given: per
// input, whether it is one).
std::string DynamicSignature(const Call& call, const std::vector<c10::IValue>& args,
                             std::vector<bool>* fixed = nullptr);
// The call's output specs with its inputs at `sizes` (the rule's
// output_types when it has them, else PyTorch's meta kernel), the undefined
// outputs left out as in call.specs.
std::vector<OutputSpec> MetaSpecsAt(const Call& call, const c10::OperatorHandle& op,
                                    const std::vector<c10::IValue>& args,
                                    const std::vector<std::vector<int64_t>>& sizes);
// The specs a new size of a dynamic signature has, from how they followed
// its sizes before (spec_model.cpp), without the meta kernel: what
// ComputeOutputs takes as cached. Planned, before ComputeOutputs; nullopt:
// the meta kernel gives them.
std::optional<std::vector<OutputSpec>> DerivedSpecs(const Call& call, const c10::OperatorHandle& op,
                                                    const std::vector<c10::IValue>& args);
// After a bounded-dynamic launch whose specs the meta kernel gave: learns
// how the signature's specs follow its sizes, for DerivedSpecs.
void LearnSpecs(const Call& call, const c10::OperatorHandle& op, const std::vector<c10::IValue>& args);
// Tests: compare every derived spec with the meta kernel's (CheckDerivedSpecs).
void SetCheckDerivedSpecs(bool on);
// call_outputs.cpp: raises when `derived` differ from the meta kernel's specs.
void CheckDerivedSpecs(const Call& call, const c10::OperatorHandle& op, const std::vector<c10::IValue>& args,
                       const std::vector<OutputSpec>& derived);
void ForgetSpecModels();  // spec_model.cpp

// ---- dropping compiled executables (debug.clear_cache()): every cache
// that holds them, so that the next call of each signature compiles again
// (the runtime's key cache is dropped by its owner).
void ClearEagerExecutables();    // eager.cpp: the exact-shape cache
void ClearChainExecutables();    // fused.cpp: fused chains'
void ClearFastEntries();         // call_fast.cpp
void ClearBoundedFastEntries();  // call_fast.cpp: its bounded-dynamic launches only
void ClearPaddedRowsExecutables();  // padded_rows.cpp
void ClearDynamicExecutables();  // dynamic.cpp: bounded-dynamic ones, their specs and failures

// ---- fused eager's record of a call (fused.cpp)
// A call as a fused chain keeps it: emitted only when the chain's executable
// is not known, maybe after its storages changed or went.
struct KeptCall {
  Call call;                                 // storages' layouts recorded, no tensors held
  std::vector<hlo::TensorType> param_types;  // per plan parameter
};
// One plan parameter of a recorded call: a storage it reads (bound to the
// chain's pending value or to the storage's buffer), or a runtime value.
struct KnownParam {
  runtime::DeviceStorage* storage = nullptr;
  runtime::LaunchParam value;
};

// ---- the hit path (call_fast.cpp): a cached functional call launched
// straight from its arguments, by a fingerprint of its signature; in fused
// eager, a signature recorded before is recorded again the same way. A
// bounded-dynamic launch is launched again for the same exact sizes and
// storage layouts (a warm call at a size inside a bucket).
using Fingerprint = c10::SmallVector<int64_t, 48>;
class FastCall {
 public:
  // The call's results, or nullopt when the hit path does not know this
  // signature (yet) or cannot take the call: then run the full path.
  std::optional<std::vector<c10::IValue>> TryLaunch(const OpDesc& desc, const c10::FunctionSchema& schema,
                                                    const std::vector<c10::IValue>& args);
  // After a full-path cache hit of the same call: remembers its signature.
  void Remember(const Call& call, const pjrt::ExecutablePtr& exe, const std::vector<OutputSpec>& outputs,
                const std::vector<std::string>& checks);
  // After the full path recorded the same call into a fused chain.
  void RememberRecorded(const std::shared_ptr<const KeptCall>& kept);
  // After the full path launched the same call bounded-dynamic, its inputs'
  // storages left in the layouts they had (none padded through the host).
  void RememberBounded(const Call& call, BoundedLaunch launch);

  // Storages the call reads that have no buffer yet, and the dtype each is read as.
  using Unfilled = c10::SmallVector<std::pair<runtime::DeviceStorage*, hlo::ElementType>, 2>;

 private:
  // The launch (or record) of an entry with this call's fingerprint: exact
  // entries first, then bounded-dynamic ones; nullopt: none.
  std::optional<std::vector<c10::IValue>> TryKnown(const OpDesc& desc, const std::vector<c10::IValue>& args);
  // Before a known call launches: its unfilled storages get zeros, as planning gives them.
  void FillUnfilled(const OpDesc& desc, const std::vector<c10::IValue>& args);
  // After the full path: whether each of the call's storages kept its buffer
  // and layout (`written`: storages the call overwrote, left out).
  bool LayoutsKept(const std::vector<const runtime::DeviceStorage*>& written = {}) const;

  bool eligible_ = false;
  bool recording_ = false;
  bool any_padded_ = false;   // a storage is padded: only a bounded launch takes the call
  bool any_pending_ = false;  // a storage is pending in the fused chain: none does
  bool any_hinted_ = false;   // a tensor carries mark_dynamic hints: the full path reads them
  c10::SmallVector<runtime::DeviceStorage*, 8> storages_;
  Unfilled unfilled_;
  c10::SmallVector<uint64_t, 8> layouts_;  // per storage: its buffer and layout, hashed (on a miss)
  Fingerprint fingerprint_;
  uint64_t hash_ = 0;
  int device_ = -1;
};

// A fresh tpu tensor for result i of the call (its storage not yet written).
at::Tensor FreshTensor(const Call& call, size_t i);
// Results in the op's order, with undefined tensors where it has none.
std::vector<c10::IValue> WithUndefined(const Call& call, std::vector<c10::IValue> results);

// The recorder of fused eager (fused.cpp).
bool Recording();
// Records the call into the fused chain; returns the op's results. *kept:
// the call as the chain keeps it.
std::vector<c10::IValue> RecordCall(Call& call, std::shared_ptr<const KeptCall>* kept = nullptr);
// Records a functional call of a signature recorded before (its kept call)
// with these parameters; returns its results.
std::vector<c10::IValue> RecordKnownCall(const std::shared_ptr<const KeptCall>& kept,
                                         const std::vector<KnownParam>& params);
// Whether the storage's pending value can be used by an op reading it as `t`.
bool PendingUsable(const runtime::DeviceStorage* s, hlo::ElementType t);
// A call that runs on its own while a chain is being recorded (a bounded
// dynamic op: a new size must not recompile the chain) reads buffers: the
// chain runs first when it holds a value the call reads or a storage it writes.
void SettleRecordingFor(const Call& call);
// A chain's values have numel() elements: a recorded call compacts the padded
// storages it writes (true when it did: plan again). It reads a padded one as
// strict eager does (its window in the buffer: one chain for every size).
bool CompactForRecording(const Call& call);

}  // namespace torch_tpu::aten
