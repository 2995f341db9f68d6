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
//   _C._custom_module_padded_handle(key, text, in_dynamic, in_bucket, outputs, out_dynamic) -> int
//   _C._run_custom_module_padded(handle, inputs, out_real, donate) -> [Tensor...]
//     A module with bounded dynamic dims (torch_tpu/jax_bounds.py): @main
//     takes input i at `in_bucket[i]` with the dims flagged in
//     `in_dynamic[i]` bounded dynamic, and returns `outputs` ((dtype, bound
//     shape) pairs) with the dims of `out_dynamic` dynamic. One executable
//     serves every size up to the bounds: a dynamic input is passed in its
//     padded layout (dynamic.h: a dynamic op's result as it is; an exact
//     storage padded once), its real sizes as runtime i32 parameters
//     (set_dimension_size); a dynamic output keeps its buffer at the bound,
//     its real sizes `out_real[k]` (the caller evaluates JAX's symbolic
//     result shapes), as dynamic ops' results do. Runs alone (never joins a
//     fused chain).
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
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "aten/call.h"
#include "aten/dynamic.h"
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

// Input d -> the output its buffer is donated to (the first free output of
// the same dtype and element count), for each index in `donate` that has one.
std::map<size_t, size_t> MatchDonations(size_t num_inputs, const std::vector<int64_t>& donate,
                                        const std::vector<OutputSpec>& outputs,
                                        const std::function<ElementType(size_t)>& dtype,
                                        const std::function<int64_t(size_t)>& numel) {
  std::map<size_t, size_t> targets;
  std::set<size_t> taken;
  for (int64_t d : donate) {
    TORCH_CHECK(d >= 0 && d < static_cast<int64_t>(num_inputs), "jax_op: donated input ", d,
                " out of range (", num_inputs, " tensor inputs)");
    const size_t i = static_cast<size_t>(d);
    for (size_t j = 0; j < outputs.size(); ++j) {
      if (taken.count(j) || outputs[j].dtype != dtype(i) || Numel(outputs[j].shape) != numel(i)) continue;
      targets[i] = j;
      taken.insert(j);
      break;
    }
  }
  return targets;
}

std::map<size_t, size_t> DonationTargets(const std::vector<at::Tensor>& inputs,
                                         const std::vector<int64_t>& donate,
                                         const std::vector<OutputSpec>& outputs) {
  return MatchDonations(
      inputs.size(), donate, outputs,
      [&](size_t i) { return ToElementType(inputs[i].scalar_type(), "jax_op input"); },
      [&](size_t i) { return inputs[i].numel(); });
}

// The module's call on flat storage values: each reshaped to its input's
// sizes, one func.call of the embedded @main, the results flattened.
std::vector<Value> EmitModuleCall(hlo::Builder& b, const std::string& text,
                                  const std::vector<std::vector<int64_t>>& input_sizes,
                                  std::vector<Value> flat_inputs, const std::vector<OutputSpec>& outputs) {
  std::vector<Value> args;
  for (size_t i = 0; i < input_sizes.size(); ++i) args.push_back(b.Reshape(flat_inputs[i], input_sizes[i]));
  std::vector<TensorType> types;
  for (const auto& o : outputs) types.push_back(TensorType{o.dtype, o.shape});
  std::vector<Value> results = b.Call(b.EmbedModule(text), args, types);
  std::vector<Value> flat;
  for (size_t i = 0; i < results.size(); ++i)
    flat.push_back(b.Reshape(results[i], {Numel(outputs[i].shape)}));
  return flat;
}

std::vector<std::vector<int64_t>> SizesOf(const std::vector<at::Tensor>& tensors) {
  std::vector<std::vector<int64_t>> sizes;
  for (const at::Tensor& t : tensors) sizes.push_back(t.sizes().vec());
  return sizes;
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
  b.Return(EmitModuleCall(b, text, SizesOf(inputs), std::move(params), outputs));
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

// The executable of a registered module for one call: from the module's own
// map (no key text, no runtime lookup), else through the runtime's memory and
// disk caches under `cache_key`.
// map.
struct FoundExecutable {
  pjrt::ExecutablePtr exe;
  bool in_map = false;    // found in the module's map
  bool compiled = false;  // XLA compiled it (not from a cache)
};
FoundExecutable ModuleExecutable(std::mutex& mu, std::map<std::string, pjrt::ExecutablePtr>& exes,
                                 const std::string& local_key, const std::string& cache_key, int device,
                                 const std::function<std::string()>& text, const char* what) {
  FoundExecutable found;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = exes.find(local_key);
    if (it != exes.end()) {
      found.exe = it->second;
      found.in_map = true;
      return found;
    }
  }
  auto& rt = GetRuntime();
  try {
    found.exe = rt.GetOrCompile(cache_key, device, text, &found.compiled);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "jax_op: compiling the ", what, " failed: ", e.what());
  }
  std::lock_guard<std::mutex> lock(mu);
  exes.emplace(local_key, found.exe);
  return found;
}

std::string AliasSuffix(const std::map<size_t, size_t>& aliases) {
  std::string suffix;
  for (const auto& [i, j] : aliases) suffix += "|" + std::to_string(i) + ">" + std::to_string(j);
  return suffix;
}

pjrt::ExecutablePtr ExecutableFor(PreparedModule& m, int device, const std::vector<at::Tensor>& dense,
                                  const std::map<size_t, size_t>& aliases) {
  std::string suffix = "|" + std::to_string(dense.size()) + AliasSuffix(aliases);
  FoundExecutable found = ModuleExecutable(
      m.mu, m.exes, std::to_string(device) + suffix, "custom_module|" + m.key + suffix, device,
      [&] { return WrapperText(m.text, dense, m.outputs, aliases); }, "exported module");
  if (found.in_map) ++GetRuntime().stats().cache_hits;
  return found.exe;
}

// Runs a jax_op's executable through the one launcher; returns its results.
std::vector<pjrt::BufferPtr> LaunchModule(const pjrt::Executable& exe, int device,
                                          std::vector<runtime::LaunchParam> params) {
  static const std::string op_name = "jax_op";
  runtime::Launch launch;
  launch.exe = &exe;
  launch.device = device;
  launch.op = &op_name;
  launch.params = std::move(params);
  std::vector<pjrt::BufferPtr> outs;
  try {
    outs = runtime::Run(GetRuntime(), launch);
  } catch (const pjrt::Error& e) {
    TORCH_CHECK(false, "jax_op: ", e.what());
  }
  ++GetRuntime().stats().native_ops["jax_op"];
  return outs;
}

// Fresh tpu tensors of sizes `real[k]` taking the results; a result whose
// buffer is larger (a bounded dynamic output, `bound[k]`) keeps that padded
// layout in its storage.
std::vector<at::Tensor> WrapResults(const std::vector<pjrt::BufferPtr>& outs,
                                    const std::vector<OutputSpec>& outputs,
                                    const std::vector<std::vector<int64_t>>& real, int device) {
  std::vector<at::Tensor> results;
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, device));
  for (size_t k = 0; k < outputs.size(); ++k) {
    at::Tensor t = at::empty(real[k], at::TensorOptions()
                                          .dtype(ToScalarType(outputs[k].dtype))
                                          .device(c10::DeviceType::PrivateUse1, device));
    DeviceStorage* s = StorageOf(t);
    s->dtype = outputs[k].dtype;
    if (real[k] != outputs[k].shape)
      s->SetPadded(outs.at(k), real[k], outputs[k].shape);
    else
      s->Set(outs.at(k));
    results.push_back(t);
  }
  return results;
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
  // The chain emits it when it runs: the closure owns what it reads.
  r.emit = [text = m.text, sizes = SizesOf(dense), outputs = m.outputs](hlo::Builder& b,
                                                                        const std::vector<Value>& flat) {
    return EmitModuleCall(b, text, sizes, flat, outputs);
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
  std::vector<runtime::LaunchParam> params;
  for (size_t i = 0; i < dense.size(); ++i) {
    DeviceStorage* s = StorageOf(dense[i]);
    PrepareStorage(s, ToElementType(dense[i].scalar_type(), "jax_op input"));
    // The launcher never donates a buffer also passed as another parameter.
    params.push_back(runtime::LaunchParam::Of(s->buffer, aliases.count(i) > 0));
  }
  std::vector<std::vector<int64_t>> real;
  for (const OutputSpec& o : outputs) real.push_back(o.shape);
  return WrapResults(LaunchModule(*exe, device, std::move(params)), outputs, real, device);
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

// ------------------------------------------------------------------ bounded dynamic modules

struct PaddedModule {
  std::string key, text;
  std::vector<std::vector<bool>> in_dynamic;
  std::vector<std::vector<int64_t>> in_bucket;
  std::vector<OutputSpec> outputs;  // at their bounds
  std::vector<std::vector<bool>> out_dynamic;
  std::mutex mu;
  std::map<std::string, pjrt::ExecutablePtr> exes;
};

std::vector<std::unique_ptr<PaddedModule>>& PaddedModules() {
  static auto* modules = new std::vector<std::unique_ptr<PaddedModule>>();  // never freed
  return *modules;
}

bool AnyTrue(const std::vector<bool>& v) { return std::find(v.begin(), v.end(), true) != v.end(); }

int64_t PreparePaddedModule(const std::string& key, const std::string& text,
                            const std::vector<std::vector<bool>>& in_dynamic,
                            const std::vector<std::vector<int64_t>>& in_bucket, const py::list& outputs,
                            const std::vector<std::vector<bool>>& out_dynamic) {
  auto m = std::make_unique<PaddedModule>();
  m->key = key;
  m->text = text;
  m->in_dynamic = in_dynamic;
  m->in_bucket = in_bucket;
  m->outputs = ParseOutputs(outputs);
  m->out_dynamic = out_dynamic;
  TORCH_CHECK(in_dynamic.size() == in_bucket.size() && m->outputs.size() == out_dynamic.size(),
              "_custom_module_padded_handle: inconsistent input / output descriptions");
  for (size_t i = 0; i < in_dynamic.size(); ++i)
    TORCH_CHECK(in_dynamic[i].size() == in_bucket[i].size(),
                "_custom_module_padded_handle: input ", i, " has ", in_bucket[i].size(), " bounds and ",
                in_dynamic[i].size(), " dynamic flags");
  for (size_t k = 0; k < out_dynamic.size(); ++k)
    TORCH_CHECK(out_dynamic[k].size() == m->outputs[k].shape.size(),
                "_custom_module_padded_handle: output ", k, " has rank ", m->outputs[k].shape.size(),
                " and ", out_dynamic[k].size(), " dynamic flags");
  std::lock_guard<std::mutex> lock(prepared_mu);
  PaddedModules().push_back(std::move(m));
  return static_cast<int64_t>(PaddedModules().size()) - 1;
}

// One input as the executable takes it: a buffer of `dtype` holding the
// row-major array `layout` (a dynamic input: its bound or larger in the
// dynamic dims, the real elements at the front; else the tensor's sizes).
struct PaddedInput {
  pjrt::BufferPtr buffer;
  ElementType dtype;
  std::vector<int64_t> layout;
};

// A dynamic input's storage in a layout the executable reads: a padded
// storage that holds at least the bound in each dynamic dim as it is (a
// dynamic op's result, a KV cache grown by a dynamic cat), else a dense
// copy padded to the bound.
PaddedInput PadInput(const at::Tensor& t, const std::vector<bool>& dyn, const std::vector<int64_t>& bucket,
                     int device) {
  ElementType dt = ToElementType(t.scalar_type(), "jax_op input");
  DeviceStorage* s = StorageOf(t);
  if (s->pending()) FlushPending();
  if (GeometryOf(t).whole && s->padded() && s->dtype == dt && s->real_shape == t.sizes().vec()) {
    bool fits = true;
    for (size_t d = 0; d < dyn.size(); ++d)
      fits &= dyn[d] ? s->padded_shape[d] >= bucket[d] : s->padded_shape[d] == s->real_shape[d];
    if (fits) return {s->buffer, dt, s->padded_shape};
  }
  at::Tensor dense = DenseInputs({t})[0];
  DeviceStorage* ds = StorageOf(dense);
  PrepareStorage(ds, dt, /*keep_capacity=*/true);
  return {PaddedBuffer(ds, t.sizes().vec(), bucket, device), dt, bucket};
}

// The wrapper of a bounded module: flat parameters (then one i32 size per
// dynamic input dim), each input read at its bound with its real sizes set,
// the module's call, dynamic results padded static at their bounds.
std::string PaddedWrapperText(const PaddedModule& m, const std::vector<PaddedInput>& in,
                              const std::map<size_t, size_t>& aliases) {
  hlo::Builder b("jax_op_dyn");
  std::vector<Value> params, sizes;
  for (size_t i = 0; i < in.size(); ++i) {
    auto alias = aliases.find(i);
    std::string attrs =
        alias == aliases.end() ? "" : "tf.aliasing_output = " + std::to_string(alias->second) + " : i32";
    params.push_back(b.Parameter(TensorType{in[i].dtype, {Numel(in[i].layout)}}, attrs));
  }
  for (const auto& dyn : m.in_dynamic)
    for (bool d : dyn)
      if (d) sizes.push_back(b.Parameter(TensorType{ElementType::I32, {}}));
  std::vector<Value> args;
  size_t next = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    Value v = b.Reshape(params[i], in[i].layout);
    const std::vector<int64_t>& bound = m.in_bucket[i];
    if (in[i].layout != bound)
      v = b.Slice(v, std::vector<int64_t>(bound.size(), 0), bound, std::vector<int64_t>(bound.size(), 1));
    for (size_t d = 0; d < bound.size(); ++d)
      if (m.in_dynamic[i][d]) v = b.SetDimensionSize(v, sizes[next++], static_cast<int64_t>(d));
    args.push_back(v);
  }
  std::vector<TensorType> types;
  for (size_t k = 0; k < m.outputs.size(); ++k) {
    TensorType t{m.outputs[k].dtype, m.outputs[k].shape};
    if (AnyTrue(m.out_dynamic[k])) t.dynamic = m.out_dynamic[k];
    types.push_back(t);
  }
  std::vector<Value> results = b.CallBounded(b.EmbedModule(m.text), args, types);
  std::vector<Value> flat;
  for (size_t k = 0; k < results.size(); ++k)
    flat.push_back(AnyTrue(m.out_dynamic[k]) ? PadDynamicResult(b, results[k], m.out_dynamic[k])
                                             : b.Reshape(results[k], {Numel(m.outputs[k].shape)}));
  b.Return(flat);
  return b.ToText();
}

// Donated input -> output of the same dtype whose bound buffer has the
// input buffer's element count.
std::map<size_t, size_t> PaddedDonationTargets(const std::vector<PaddedInput>& in,
                                               const std::vector<int64_t>& donate,
                                               const std::vector<OutputSpec>& outputs) {
  return MatchDonations(
      in.size(), donate, outputs, [&](size_t i) { return in[i].dtype; },
      [&](size_t i) { return Numel(in[i].layout); });
}

pjrt::ExecutablePtr PaddedExecutable(PaddedModule& m, int device, const std::vector<PaddedInput>& in,
                                     const std::map<size_t, size_t>& aliases) {
  std::string suffix = "|" + std::to_string(in.size());
  for (const PaddedInput& p : in) {
    suffix += "|";
    for (int64_t d : p.layout) suffix += std::to_string(d) + ",";
  }
  suffix += AliasSuffix(aliases);
  FoundExecutable found = ModuleExecutable(
      m.mu, m.exes, std::to_string(device) + suffix, "custom_module_dyn|" + m.key + suffix, device,
      [&] { return PaddedWrapperText(m, in, aliases); }, "bounded dynamic module");
  if (found.in_map) {
    CountDynamicHit();
  } else {
    if (found.compiled) CountCompile("jax_op", true);
    CountDynamicExecutable();
  }
  return found.exe;
}

std::vector<at::Tensor> RunPaddedModule(int64_t handle, const std::vector<at::Tensor>& inputs,
                                        const std::vector<std::vector<int64_t>>& out_real,
                                        const std::vector<int64_t>& donate) {
  PaddedModule* mp;
  {
    std::lock_guard<std::mutex> lock(prepared_mu);
    TORCH_CHECK(handle >= 0 && handle < static_cast<int64_t>(PaddedModules().size()),
                "jax_op: unknown padded module handle ", handle);
    mp = PaddedModules()[handle].get();
  }
  PaddedModule& m = *mp;
  TORCH_CHECK(inputs.size() == m.in_dynamic.size(), "jax_op: ", inputs.size(), " inputs for a module of ",
              m.in_dynamic.size());
  TORCH_CHECK(out_real.size() == m.outputs.size(), "jax_op: real sizes of ", out_real.size(),
              " outputs for a module of ", m.outputs.size());
  for (size_t k = 0; k < m.outputs.size(); ++k)
    TORCH_CHECK(out_real[k].size() == m.outputs[k].shape.size(), "jax_op: output ", k, " has rank ",
                m.outputs[k].shape.size(), ", got real sizes of rank ", out_real[k].size());
  for (size_t k = 0; k < m.outputs.size(); ++k)
    for (size_t d = 0; d < out_real[k].size(); ++d)
      TORCH_CHECK(m.out_dynamic[k][d] ? out_real[k][d] <= m.outputs[k].shape[d]
                                      : out_real[k][d] == m.outputs[k].shape[d],
                  "jax_op: output ", k, " real sizes ", out_real[k], " do not fit its bounds ",
                  m.outputs[k].shape);
  int device = DeviceOf(inputs);
  FlushPending();  // fused eager: recorded ops write the storages read here
  std::vector<PaddedInput> in;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& t = inputs[i];
    TORCH_CHECK(t.sizes().vec().size() == m.in_bucket[i].size(), "jax_op: input ", i, " has rank ", t.dim());
    for (size_t d = 0; d < m.in_bucket[i].size(); ++d)
      TORCH_CHECK(m.in_dynamic[i][d] ? t.size(d) <= m.in_bucket[i][d] : t.size(d) == m.in_bucket[i][d],
                  "jax_op: input ", i, " of sizes ", t.sizes(), " does not fit the module's bounds");
    if (AnyTrue(m.in_dynamic[i])) {
      in.push_back(PadInput(t, m.in_dynamic[i], m.in_bucket[i], device));
    } else {
      at::Tensor dense = DenseInputs({t})[0];
      DeviceStorage* s = StorageOf(dense);
      ElementType dt = ToElementType(t.scalar_type(), "jax_op input");
      PrepareStorage(s, dt);
      in.push_back({s->buffer, dt, t.sizes().vec()});
    }
  }
  std::map<size_t, size_t> aliases = PaddedDonationTargets(in, donate, m.outputs);
  pjrt::ExecutablePtr exe = PaddedExecutable(m, device, in, aliases);
  std::vector<runtime::LaunchParam> params;
  for (size_t i = 0; i < in.size(); ++i) params.push_back(runtime::LaunchParam::Of(in[i].buffer, aliases.count(i) > 0));
  for (size_t i = 0; i < inputs.size(); ++i)
    for (size_t d = 0; d < m.in_dynamic[i].size(); ++d)
      if (m.in_dynamic[i][d]) params.push_back(runtime::LaunchParam::Integer(inputs[i].size(d), ElementType::I32));
  return WrapResults(LaunchModule(*exe, device, std::move(params)), m.outputs, out_real, device);
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

void ClearCustomModuleExecutables() {
  std::lock_guard<std::mutex> lock(prepared_mu);
  for (auto& m : Prepared()) {
    std::lock_guard<std::mutex> module_lock(m->mu);
    m->exes.clear();
  }
  for (auto& m : PaddedModules()) {
    std::lock_guard<std::mutex> module_lock(m->mu);
    m->exes.clear();
  }
}

void RegisterCustomModuleBindings(PyObject* module) {
  py::module_ m = py::reinterpret_borrow<py::module_>(module);
  m.def("_run_custom_module", &RunCustomModule, py::arg("key"), py::arg("text"), py::arg("inputs"),
        py::arg("outputs"), py::arg("donate") = std::vector<int64_t>());
  m.def("_register_custom_module_rule", &RegisterCustomModuleRule);
  m.def("_custom_module_handle", &PrepareCustomModule, py::arg("key"), py::arg("text"),
        py::arg("outputs"));
  m.def("_run_custom_module_handle", &RunCustomModuleHandle, py::arg("handle"), py::arg("inputs"),
        py::arg("donate") = std::vector<int64_t>());
  m.def("_custom_module_padded_handle", &PreparePaddedModule, py::arg("key"), py::arg("text"),
        py::arg("in_dynamic"), py::arg("in_bucket"), py::arg("outputs"), py::arg("out_dynamic"));
  m.def("_run_custom_module_padded", &RunPaddedModule, py::arg("handle"), py::arg("inputs"),
        py::arg("out_real"), py::arg("donate") = std::vector<int64_t>());
  m.def("_dynamic_bucket", &DynamicBucket);
  m.def("_small_bucket", &SmallBucketAmong, py::arg("warm"), py::arg("size"), py::arg("row_bytes"));
  m.def("_count_exact_fallback", &CountExactFallback);
  m.def("_set_jax_ops_join_fused", [](bool on) { return g_join_fused.exchange(on); });
}

}  // namespace torch_tpu::aten
