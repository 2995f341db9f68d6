// Whole graphs (torch.compile): a sequence of lowering-rule calls becomes ONE
// StableHLO module, compiled once and run many times. The rules are the very
// ones eager ops use, plus Graph-scope rules (views, factories).
//
// The compile backend (python/torch_tpu/compile_graph.py, through bindings.cpp)
// walks the FX graph and calls AddInput per graph input, AddOp per node,
// SetOutputs, Compile, then Run per call. Graph inputs are module parameters
// holding the whole (contiguous) storage of the input tensor; non-contiguous
// inputs are made dense first. Scalars (Scalar and Scalar[] args, and the
// float args of rules with runtime floats) are runtime parameters, as in
// eager: a graph differing only in a scalar's value (an lr schedule, a
// changing alpha) is the same module and never recompiles.
//
// Mutated inputs (AOTAutograd's `copy_(input, new_value)` epilogue, kept in
// the graph with keep_inference_input_mutations: buffers, KV caches,
// optimizer state) are `mutations`, (input index, value id) pairs: the new
// value is an extra module result aliased to the input's parameter
// (tf.aliasing_output), the input's storage buffer is donated to the
// execution and the storage takes the result buffer: an in-place update
// with no copy, as eager in-place ops do. An input that is a non-dense view
// goes through a dense temporary and is written back with one copy. A
// mutated input with dynamic dims (a KV cache whose batch is a symbol) gets
// its new value padded at its bound, aliased to its padded parameter: the
// storage keeps the padded layout (DeviceStorage::SetPadded).
//
// Bounded dynamic dims (torch.compile with symbolic shapes, compile_symbolic.py's
// Bucketed): a dim of an input or op result may name a runtime size `k`
// (`dims[d] = k`, -1: static). Its shape entry is then the bound (the
// size's bucket); the value is set_dimension_size'd to runtime size k, an
// i32 parameter given per Run, so XLA's dynamic padder masks the padding
// in reductions and contractions. A dynamic input is passed in the padded
// layout of its bound (PaddedBuffer: the real elements at the front of each
// dim); a dynamic output comes back with its real sizes in a padded storage
// (DeviceStorage::SetPadded), as eager's dynamic ops leave theirs.
//
// TORCH_TPU_DUMP_GRAPHS=<dir> writes every graph module to <dir>/graph_<hash>.mlir.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "aten/tpu.h"
#include "runtime/launcher.h"

namespace torch_tpu::aten {

struct Plan;  // a decoded call (call.h)

struct GraphTensorType {
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  std::vector<int> dims;  // per dim: the runtime size index of a dynamic dim, -1 static; empty: static
};

// Totals over all graphs (compile.stats() reports them).
struct MutationCounters {
  int64_t donated = 0;      // mutated inputs updated in place through donation
  int64_t rebound = 0;      // updated in place without donation (storage shared)
  int64_t copied_back = 0;  // non-dense views written back with a copy
};
MutationCounters& GraphMutations();

class Graph {
 public:
  Graph();
  int AddInput(at::ScalarType dtype, const std::vector<int64_t>& shape, const std::vector<int>& dims = {});
  // Adds a node: `args` holds one value per argument of the op's schema
  // (Schema(op)), as an eager call of the op would get them, except that a
  // graph tensor is ValueArg(id) (a Tensor slot may also hold a number: a
  // wrapped Python scalar). They are decoded as eager calls decode theirs
  // (call_args.h). Returns the ids of the op's outputs, whose types are
  // `outputs` (from the FX graph's fake values).
  std::vector<int> AddOp(const std::string& op, const std::vector<c10::IValue>& args,
                         const std::vector<GraphTensorType>& outputs);
  void SetOutputs(const std::vector<int>& ids, const std::vector<std::vector<int64_t>>& strides,
                  const std::vector<std::pair<int, int>>& mutations);
  void Compile(int device);
  // `sizes`: the runtime sizes of a graph with dynamic dims (index k of dims).
  std::vector<at::Tensor> Run(const std::vector<at::Tensor>& inputs, const std::vector<int64_t>& sizes = {});
  const std::string& text() const { return text_; }

  // A graph from external module text (benchmarks: another frontend's
  // module, e.g. jax.jit(f).lower(...).as_text(), run on this plugin). Its
  // parameters must be the inputs' whole storages (1-D, numel elements),
  // its results 1-D, one per output, returned as contiguous tensors.
  static std::unique_ptr<Graph> FromText(const std::string& text,
                                         const std::vector<GraphTensorType>& inputs,
                                         const std::vector<GraphTensorType>& outputs);
  static bool HasRule(const std::string& op);
  // The schema of a graph op: "add.Tensor" (aten), "ns::name" (a custom op).
  static const c10::FunctionSchema& Schema(const std::string& op);
  // Graph value `id` as an argument of AddOp.
  static c10::IValue ValueArg(int id);

 private:
  struct ParamSlot {
    enum class Kind { Input, Rng, Scalar, Size } kind = Kind::Input;
    int input = -1;              // Input: index into inputs_; Size: runtime size index
    uint64_t rng_increment = 0;  // Rng: values drawn per run
    runtime::LaunchParam value;  // Scalar: the value, uploaded per run
  };
  struct InputSpec {
    hlo::ElementType dtype;
    std::vector<int64_t> shape;  // a dynamic dim's bound
    std::vector<int> dims;       // as GraphTensorType::dims
  };
  struct Output {
    std::vector<int64_t> sizes, strides;  // a dynamic dim's bound
    hlo::ElementType dtype;
    std::vector<int> dims;  // as GraphTensorType::dims
  };
  struct Mutation {
    int input;             // index into inputs_
    int param;             // its module parameter
    bool dynamic = false;  // a dynamic input: its new value comes back padded, after the dynamic outputs
  };

  int Add(hlo::Value v, std::vector<int> dims = {});
  // The i32 parameter of runtime size k; `v` with its dims set to their sizes.
  hlo::Value SizeParam(int k);
  hlo::Value WithSizes(hlo::Value v, const std::vector<int>& dims, bool to_static_rest = false);
  std::vector<int64_t> RealSizes(const std::vector<int64_t>& bound, const std::vector<int>& dims,
                                 const std::vector<int64_t>& sizes) const;
  at::Tensor PaddedInput(const at::Tensor& t, size_t i, pjrt::BufferPtr* buffer);
  const hlo::Value& value(int id) const;
  // Module parameters for the decoded call's scalars and generator states.
  std::vector<hlo::Value> AddParams(const Plan& plan);
  hlo::Value OutputValue(hlo::Value v, Output* o);
  // Static mutations go to `outs`, dynamic ones (padded at their bound) to `padded`.
  void AddMutations(const std::vector<std::pair<int, int>>& mutations, std::vector<hlo::Value>* outs,
                    std::vector<hlo::Value>* padded);
  std::vector<at::Tensor> DenseInputs(const std::vector<at::Tensor>& inputs, const std::vector<int64_t>& sizes,
                                      std::vector<pjrt::BufferPtr>* padded);
  std::vector<runtime::LaunchParam> LaunchParams(const std::vector<at::Tensor>& dense,
                                                 const std::vector<pjrt::BufferPtr>& padded,
                                                 const std::vector<int64_t>& sizes);
  void TakeMutations(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& dense,
                     const std::vector<bool>& donated);

  hlo::Builder b_;
  std::vector<hlo::Value> values_;
  std::vector<std::vector<int>> value_dims_;  // per value: its dynamic dims (empty: static)
  std::vector<hlo::Value> size_params_;       // runtime size k's parameter (invalid: not yet made)
  std::vector<size_t> dynamic_outputs_;       // outputs_ returned after the checks, padded
  std::vector<ParamSlot> params_;
  std::vector<InputSpec> inputs_;
  std::vector<Output> outputs_;
  std::vector<std::pair<hlo::Value, std::string>> checks_;
  std::vector<Mutation> mutations_;
  std::vector<std::string> check_messages_;
  std::string text_;
  bool returned_ = false;
  bool compiled_ = false;
  int device_ = 0;
  pjrt::ExecutablePtr exe_;
};

}  // namespace torch_tpu::aten
