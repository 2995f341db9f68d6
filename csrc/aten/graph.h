// Whole graphs (torch.compile): a sequence of lowering-rule calls becomes ONE
// StableHLO module, compiled once and run many times. The rules are the very
// ones eager ops use, plus Graph-scope rules (views, factories).
//
// The compile backend (python/torch_tpu/compile.py, through bindings.cpp)
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
// goes through a dense temporary and is written back with one copy.
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
  int AddInput(at::ScalarType dtype, const std::vector<int64_t>& shape);
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
  std::vector<at::Tensor> Run(const std::vector<at::Tensor>& inputs);
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
    enum class Kind { Input, Rng, Scalar } kind = Kind::Input;
    int input = -1;              // Input: index into inputs_
    uint64_t rng_increment = 0;  // Rng: values drawn per run
    runtime::LaunchParam value;  // Scalar: the value, uploaded per run
  };
  struct InputSpec {
    hlo::ElementType dtype;
    std::vector<int64_t> shape;
  };
  struct Output {
    std::vector<int64_t> sizes, strides;
    hlo::ElementType dtype;
  };
  struct Mutation {
    int input;  // index into inputs_
    int param;  // its module parameter
  };

  int Add(hlo::Value v);
  const hlo::Value& value(int id) const;
  // Module parameters for the decoded call's scalars and generator states.
  std::vector<hlo::Value> AddParams(const Plan& plan);
  hlo::Value OutputValue(hlo::Value v, Output* o);
  void AddMutations(const std::vector<std::pair<int, int>>& mutations, std::vector<hlo::Value>* outs);
  std::vector<at::Tensor> DenseInputs(const std::vector<at::Tensor>& inputs);
  std::vector<runtime::LaunchParam> LaunchParams(const std::vector<at::Tensor>& dense);
  void TakeMutations(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& dense,
                     const std::vector<bool>& donated);

  hlo::Builder b_;
  std::vector<hlo::Value> values_;
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
