// Externally produced StableHLO modules run on tpu tensors: the runtime side
// of torch_tpu.pallas.jax_op (a JAX function exported with jax.export).
//
//   _C._run_custom_module(key, text, inputs, outputs, donate) -> [Tensor...]
//     Runs `text` (a module whose @main takes the inputs' shapes and dtypes
//     and returns `outputs`, (dtype, shape) pairs) as one executable. The
//     module is embedded in a wrapper whose parameters are the inputs' whole
//     storages (as every torch_tpu executable takes them); a view is made
//     contiguous first. Compiled once per `key` (the caller's signature of
//     the text), through the runtime's memory and disk caches. `donate`:
//     indices of inputs whose buffers the execution may reuse for an output
//     of the same dtype and size (tf.aliasing_output); a donated tensor is
//     consumed: reading it afterwards raises an error, as in JAX.
//   _C._custom_module_handle(key, text, outputs) -> int
//   _C._run_custom_module_handle(handle, inputs, donate) -> [Tensor...]
//     The same, with the text and outputs registered once (jax_op does this
//     per shape signature): a call copies no text and builds no cache key.
//   In fused eager (torch_tpu.fused()) a call without donation joins the
//   chain being recorded: the module is embedded in the chain's module and
//   called there (func.call), its outputs pending values of the chain
//   (fused.h). _C._set_jax_ops_join_fused(False) makes each call end the
//   chain and run alone instead (returns the previous setting).
//   _C._register_custom_module_rule(op, callback)
//     A torch.compile lowering rule (Scope::Graph) for the custom op `op` ("ns::name"):
//     callback(args) returns the module text for the node's arguments
//     (("tensor", dtype, shape) for tensors, Python values otherwise); the
//     module is embedded into the graph's module and called with func.call,
//     so the op is one op of the compiled graph.
#include <torch/csrc/Dtype.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/extension.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "aten/call.h"
#include "aten/fused.h"
#include "aten/tpu.h"

namespace torch_tpu::aten {

using hlo::ElementType;
using hlo::TensorType;
using hlo::Value;
using runtime::DeviceStorage;

namespace py = pybind11;

namespace {

struct OutputSpec {
  ElementType dtype;
  std::vector<int64_t> shape;
};

int64_t Numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::vector<OutputSpec> ParseOutputs(const py::list& outputs) {
  std::vector<OutputSpec> specs;
  for (auto h : outputs) {
    auto tup = h.cast<py::tuple>();
    TORCH_CHECK(tup.size() == 2, "_run_custom_module: outputs are (dtype, shape) pairs");
    TORCH_CHECK(THPDtype_Check(tup[0].ptr()), "_run_custom_module: expected a torch.dtype");
    at::ScalarType st = reinterpret_cast<THPDtype*>(tup[0].ptr())->scalar_type;
    specs.push_back({ToElementType(st, "jax_op output"), tup[1].cast<std::vector<int64_t>>()});
  }
  return specs;
}

// Input i -> the output its buffer is donated to (same dtype and size), for
// each index in `donate` that has one.
std::map<size_t, size_t> DonationTargets(const std::vector<at::Tensor>& inputs,
                                         const std::vector<int64_t>& donate,
                                         const std::vector<OutputSpec>& outputs) {
  std::map<size_t, size_t> targets;
  std::set<size_t> taken;
  for (int64_t d : donate) {
    TORCH_CHECK(d >= 0 && d < static_cast<int64_t>(inputs.size()), "jax_op: donated input ", d,
                " out of range (", inputs.size(), " tensor inputs)");
    const at::Tensor& t = inputs[d];
    ElementType dt = ToElementType(t.scalar_type(), "jax_op input");
    for (size_t j = 0; j < outputs.size(); ++j) {
      if (taken.count(j) || outputs[j].dtype != dt || Numel(outputs[j].shape) != t.numel()) continue;
      targets[static_cast<size_t>(d)] = j;
      taken.insert(j);
      break;
    }
  }
  return targets;
}

// The module's call on flat storage values: each reshaped to its input's
// sizes, one func.call of the embedded @main, the results flattened.
std::vector<Value> EmitModuleCall(hlo::Builder& b, const std::string& text,
                                  const std::vector<at::Tensor>& inputs, std::vector<Value> flat_inputs,
                                  const std::vector<OutputSpec>& outputs) {
  std::vector<Value> args;
  for (size_t i = 0; i < inputs.size(); ++i) args.push_back(b.Reshape(flat_inputs[i], inputs[i].sizes().vec()));
  std::vector<TensorType> types;
  for (const auto& o : outputs) types.push_back(TensorType{o.dtype, o.shape});
  std::vector<Value> results = b.Call(b.EmbedModule(text), args, types);
  std::vector<Value> flat;
  for (size_t i = 0; i < results.size(); ++i)
    flat.push_back(b.Reshape(results[i], {Numel(outputs[i].shape)}));
  return flat;
}

// The wrapper run alone: whole-storage parameters, the module's call.
std::string WrapperText(const std::string& text, const std::vector<at::Tensor>& inputs,
                        const std::vector<OutputSpec>& outputs,
                        const std::map<size_t, size_t>& aliases) {
  hlo::Builder b("jax_op");
  std::vector<Value> params;
  for (size_t i = 0; i < inputs.size(); ++i) {
    ElementType t = ToElementType(inputs[i].scalar_type(), "jax_op input");
    auto alias = aliases.find(i);
    std::string attrs =
        alias == aliases.end() ? "" : "tf.aliasing_output = " + std::to_string(alias->second) + " : i32";
    params.push_back(b.Parameter(TensorType{t, {inputs[i].numel()}}, attrs));
  }
  b.Return(EmitModuleCall(b, text, inputs, std::move(params), outputs));
  return b.ToText();
}

int DeviceOf(const std::vector<at::Tensor>& inputs) {
  int device = -1;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& t = inputs[i];
    TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1, "jax_op: input ", i,
                " is on ", t.device(), "; move it to tpu first");
    int d = t.device().index() < 0 ? CurrentDevice() : t.device().index();
    TORCH_CHECK(device < 0 || device == d, "jax_op: inputs on tpu:", device, " and tpu:", d);
    device = d;
  }
  return device < 0 ? CurrentDevice() : device;
}

// Whole contiguous storages: an input that is a view gets a dense copy.
std::vector<at::Tensor> DenseInputs(const std::vector<at::Tensor>& inputs) {
  std::vector<at::Tensor> dense(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& t = inputs[i];
    if (GeometryOf(t).whole || t.numel() == 0) {
      dense[i] = t;
    } else if (Recording()) {
      // Fused eager: a functional copy, which the chain records (a copy into
      // a fresh tensor would first zero-fill its storage, an execution).
      dense[i] = t.clone(at::MemoryFormat::Contiguous);
    } else {
      // Strict eager: a copy into an exact buffer (a clone may run bounded
      // dynamic, and its padded result would take one more execution to
      // compact).
      dense[i] = at::empty(t.sizes(), t.options());
      RunInto(kCopyRule, {t}, dense[i]);
    }
  }
  return dense;
}

// One export registered once (_custom_module_handle): its text, its parsed
// outputs, and its executables by (device, donation targets), so a call
// copies no text, parses no outputs and builds no key.
struct PreparedModule {
  std::string key, text;
  std::vector<OutputSpec> outputs;
  std::mutex mu;
  std::map<std::string, pjrt::ExecutablePtr> exes;
};

std::vector<std::unique_ptr<PreparedModule>>& Prepared() {
  static auto* modules = new std::vector<std::unique_ptr<PreparedModule>>();  // never freed
  return *modules;
}
std::mutex prepared_mu;

PreparedModule& PreparedAt(int64_t handle) {
  std::lock_guard<std::mutex> lock(prepared_mu);
  TORCH_CHECK(handle >= 0 && handle < static_cast<int64_t>(Prepared().size()),
              "jax_op: unknown custom module handle ", handle);
  return *Prepared()[handle];
}

int64_t PrepareCustomModule(const std::string& key, const std::string& text,
                            const py::list& outputs) {
  auto m = std::make_unique<PreparedModule>();
  m->key = key;
  m->text = text;
  m->outputs = ParseOutputs(outputs);
  std::lock_guard<std::mutex> lock(prepared_mu);
  Prepared().push_back(std::move(m));
  return static_cast<int64_t>(Prepared().size()) - 1;
}

pjrt::ExecutablePtr ExecutableFor(PreparedModule& m, int device, const std::vector<at::Tensor>& dense,
                                  const std::map<size_t, size_t>& aliases) {
  std::string suffix = "|" + std::to_string(dense.size());
  for (const auto& [i, j] : aliases) suffix += "|" + std::to_string(i) + ">" + std::to_string(j);
  std::string local_key = std::to_string(device) + suffix;
  auto& rt = GetRuntime();
  {
    std::lock_guard<std::mutex> lock(m.mu);
    auto it = m.exes.find(local_key);
    if (it != m.exes.end()) {
      ++rt.stats().cache_hits;
      return it->second;
    }
  }
  pjrt::ExecutablePtr exe;
  try {
    exe = rt.GetOrCompile("custom_module|" + m.key + suffix, device,
                          [&] { return WrapperText(m.text, dense, m.outputs, aliases); });
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "jax_op: compiling the exported module failed: ", e.what());
  }
  std::lock_guard<std::mutex> lock(m.mu);
  m.exes.emplace(local_key, exe);
  return exe;
}

// Off: a jax_op ends the fused chain and runs alone, as it did before calls
// joined the chain (_C._set_jax_ops_join_fused; benchmarks compare both).
std::atomic<bool> g_join_fused{true};

// Fused eager: the call joins the chain being recorded (a donating call runs
// alone: its inputs' buffers must be free to give away).
std::optional<std::vector<at::Tensor>> RecordPrepared(const PreparedModule& m, int device,
                                                      const std::vector<at::Tensor>& dense) {
  if (!g_join_fused.load()) return std::nullopt;
  RecordedModule r;
  r.key = "custom_module|" + m.key;
  r.device = device;
  r.inputs = dense;
  for (const auto& o : m.outputs) r.outputs.push_back(TensorType{o.dtype, o.shape});
  r.emit = [&](hlo::Builder& b, const std::vector<Value>& flat) {
    return EmitModuleCall(b, m.text, dense, flat, m.outputs);
  };
  std::optional<std::vector<at::Tensor>> out = RecordModule(r);
  if (out) ++GetRuntime().stats().native_ops["jax_op"];
  return out;
}

std::vector<at::Tensor> RunPrepared(PreparedModule& m, const std::vector<at::Tensor>& inputs,
                                    const std::vector<int64_t>& donate) {
  const std::vector<OutputSpec>& outputs = m.outputs;
  int device = DeviceOf(inputs);
  std::vector<at::Tensor> dense = DenseInputs(inputs);
  if (donate.empty()) {
    std::optional<std::vector<at::Tensor>> recorded = RecordPrepared(m, device, dense);
    if (recorded) return *recorded;
  }
  FlushPending();  // fused eager: recorded ops write the storages read here
  std::map<size_t, size_t> aliases = DonationTargets(dense, donate, outputs);
  pjrt::ExecutablePtr exe = ExecutableFor(m, device, dense, aliases);
  auto& rt = GetRuntime();
  std::vector<pjrt::BufferPtr> keep;
  std::vector<PJRT_Buffer*> buffers;
  for (const at::Tensor& t : dense) {
    DeviceStorage* s = StorageOf(t);
    PrepareStorage(s, ToElementType(t.scalar_type(), "jax_op input"));
    keep.push_back(s->buffer);
    buffers.push_back(s->buffer->raw());
  }
  // A buffer passed twice cannot be donated (the execution would read it).
  std::vector<int64_t> non_donatable;
  for (size_t p = 0; p < buffers.size(); ++p) {
    bool donated = aliases.count(p) > 0;
    for (size_t q = 0; q < buffers.size() && donated; ++q)
      if (q != p && buffers[q] == buffers[p]) donated = false;
    if (!donated) non_donatable.push_back(static_cast<int64_t>(p));
  }
  std::vector<pjrt::BufferPtr> outs;
  try {
    outs = rt.Execute(*exe, buffers, non_donatable, "jax_op");
  } catch (const pjrt::Error& e) {
    TORCH_CHECK(false, "jax_op: ", e.what());
  }
  ++rt.stats().native_ops["jax_op"];
  std::vector<at::Tensor> results;
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, device));
  for (size_t i = 0; i < outputs.size(); ++i) {
    at::Tensor t = at::empty(outputs[i].shape, at::TensorOptions()
                                                   .dtype(ToScalarType(outputs[i].dtype))
                                                   .device(c10::DeviceType::PrivateUse1, device));
    DeviceStorage* s = StorageOf(t);
    s->dtype = outputs[i].dtype;
    s->Set(outs.at(i));
    results.push_back(t);
  }
  return results;
}

std::vector<at::Tensor> RunCustomModuleHandle(int64_t handle, const std::vector<at::Tensor>& inputs,
                                              const std::vector<int64_t>& donate) {
  return RunPrepared(PreparedAt(handle), inputs, donate);
}

// The one-shot form: a module registered for this call only (custom_jax_kernel).
std::vector<at::Tensor> RunCustomModule(const std::string& key, const std::string& text,
                                        const std::vector<at::Tensor>& inputs,
                                        const py::list& outputs_spec,
                                        const std::vector<int64_t>& donate) {
  PreparedModule m;
  m.key = key;
  m.text = text;
  m.outputs = ParseOutputs(outputs_spec);
  return RunPrepared(m, inputs, donate);
}

// One rule argument as the Python callback sees it.
py::object ArgToPython(const lowering::Arg& a) {
  using Kind = lowering::Arg::Kind;
  auto tensor = [](const Value& v) -> py::object {
    return py::make_tuple("tensor", hlo::Name(v.dtype()), v.shape());
  };
  switch (a.kind) {
    case Kind::None: return py::none();
    case Kind::Tensor: return tensor(a.tensor);
    case Kind::TensorList: {
      py::list l;
      for (const Value& v : a.tensors) l.append(v.valid() ? tensor(v) : py::none());
      return std::move(l);
    }
    case Kind::Int: return py::int_(a.i);
    case Kind::IntList: return py::cast(a.ints);
    case Kind::Double: return py::float_(a.d);
    case Kind::Bool: return py::bool_(a.i != 0);
    case Kind::String: return py::str(a.s);
    default:
      throw lowering::Unsupported("jax_op in a graph: unsupported argument kind");
  }
}

void RegisterCustomModuleRule(const std::string& op, py::function callback) {
  // Never freed: the rule table outlives the interpreter (a py::function
  // released after Py_Finalize would touch a dead interpreter).
  auto* cb = new py::function(std::move(callback));
  lowering::Register(
      op, [cb, op](lowering::Context& c, const std::vector<lowering::Arg>& a) {
        py::gil_scoped_acquire gil;
        py::list args;
        std::vector<Value> tensors;
        for (const auto& arg : a) {
          args.append(ArgToPython(arg));
          if (arg.kind == lowering::Arg::Kind::Tensor) tensors.push_back(arg.tensor);
          if (arg.kind == lowering::Arg::Kind::TensorList)
            for (const Value& v : arg.tensors)
              if (v.valid()) tensors.push_back(v);
        }
        std::string text = (*cb)(args).cast<std::string>();
        std::string callee = c.b.EmbedModule(text);
        return c.b.Call(callee, tensors, c.outputs);
      },
      {}, lowering::Scope::Graph);
}

}  // namespace

void RegisterCustomModuleBindings(PyObject* module) {
  py::module_ m = py::reinterpret_borrow<py::module_>(module);
  m.def("_run_custom_module", &RunCustomModule, py::arg("key"), py::arg("text"), py::arg("inputs"),
        py::arg("outputs"), py::arg("donate") = std::vector<int64_t>());
  m.def("_register_custom_module_rule", &RegisterCustomModuleRule);
  m.def("_custom_module_handle", &PrepareCustomModule, py::arg("key"), py::arg("text"),
        py::arg("outputs"));
  m.def("_run_custom_module_handle", &RunCustomModuleHandle, py::arg("handle"), py::arg("inputs"),
        py::arg("donate") = std::vector<int64_t>());
  m.def("_set_jax_ops_join_fused", [](bool on) { return g_join_fused.exchange(on); });
}

}  // namespace torch_tpu::aten
