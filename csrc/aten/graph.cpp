#include "aten/graph.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <set>
#include <stdexcept>

#include "aten/call_args.h"
#include "aten/dynamic.h"

namespace torch_tpu::aten {

using hlo::ElementType;
using hlo::TensorType;
using hlo::Value;
using lowering::Arg;
using runtime::DeviceStorage;
using runtime::LaunchParam;

namespace {

int64_t Numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

}  // namespace

MutationCounters& GraphMutations() {
  static MutationCounters counters;
  return counters;
}

Graph::Graph() : b_("graph") {}

bool Graph::HasRule(const std::string& op) { return lowering::FindForGraph(op) != nullptr; }

int Graph::Add(Value v, std::vector<int> dims) {
  bool any = false;
  for (int k : dims) any |= k >= 0;
  if (!any) dims.clear();
  values_.push_back(v);
  value_dims_.push_back(std::move(dims));
  return static_cast<int>(values_.size()) - 1;
}

Value Graph::SizeParam(int k) {
  TORCH_CHECK(k >= 0 && k < 4096, "torch_tpu graph: bad runtime size index ", k);
  if (static_cast<size_t>(k) >= size_params_.size()) size_params_.resize(k + 1);
  if (!size_params_[k].valid()) {
    ParamSlot slot;
    slot.kind = ParamSlot::Kind::Size;
    slot.input = k;
    params_.push_back(slot);
    size_params_[k] = b_.Parameter(TensorType{ElementType::I32, {}});
  }
  return size_params_[k];
}

// `v` with each dynamic dim set to its runtime size; `to_static_rest`: its
// other dims declared static (a result XLA would otherwise infer dynamic).
Value Graph::WithSizes(Value v, const std::vector<int>& dims, bool to_static_rest) {
  if (dims.empty() && !to_static_rest) return v;
  TORCH_CHECK(dims.empty() || dims.size() == v.shape().size(), "torch_tpu graph: ", dims.size(),
              " dynamic dim entries for a value of rank ", v.shape().size());
  for (size_t d = 0; d < v.shape().size(); ++d) {
    int k = dims.empty() ? -1 : dims[d];
    if (k >= 0)
      v = b_.SetDimensionSize(v, SizeParam(k), static_cast<int64_t>(d));
    else if (to_static_rest)
      v = b_.SetDimensionSize(v, b_.ConstantInt(ElementType::I32, v.shape()[d]), static_cast<int64_t>(d), true);
  }
  return v;
}

std::vector<int64_t> Graph::RealSizes(const std::vector<int64_t>& bound, const std::vector<int>& dims,
                                      const std::vector<int64_t>& sizes) const {
  std::vector<int64_t> real = bound;
  for (size_t d = 0; d < dims.size(); ++d) {
    if (dims[d] < 0) continue;
    TORCH_CHECK(static_cast<size_t>(dims[d]) < sizes.size(), "compiled graph: runtime size ", dims[d],
                " missing (", sizes.size(), " given)");
    int64_t n = sizes[dims[d]];
    TORCH_CHECK(n >= 0 && n <= bound[d], "compiled graph: runtime size ", n, " of a dim bounded by ", bound[d]);
    real[d] = n;
  }
  return real;
}

const Value& Graph::value(int id) const {
  if (id < 0 || id >= static_cast<int>(values_.size()))
    throw std::runtime_error("torch_tpu graph: unknown value id " + std::to_string(id));
  return values_[id];
}

int Graph::AddInput(at::ScalarType dtype, const std::vector<int64_t>& shape, const std::vector<int>& dims) {
  TORCH_CHECK(!compiled_, "graph already compiled");
  TORCH_CHECK(dims.empty() || dims.size() == shape.size(), "add_input: one dims entry per dim");
  ElementType t = ToElementType(dtype, "torch.compile input");
  Value p = b_.Parameter(TensorType{t, {Numel(shape)}});
  ParamSlot slot;
  slot.input = static_cast<int>(inputs_.size());
  params_.push_back(slot);
  inputs_.push_back({t, shape, dims});
  return Add(WithSizes(b_.Reshape(p, shape), dims), dims);
}

namespace {

// A graph value as an argument: a capsule holding its id.
struct ValueRef : torch::CustomClassHolder {
  explicit ValueRef(int id) : id(id) {}
  int id;
};

// Graph tensors are values of the graph, or numbers (wrapped Python scalars).
class GraphValues final : public TensorSource {
 public:
  GraphValues(const std::vector<Value>& values, const std::string& op) : values_(values), op_(op) {}
  ArgPlan Tensor(Plan& p, const c10::IValue& v) override {
    if (v.isInt() || v.isDouble() || v.isBool() || v.isComplexDouble()) return DecodeScalar(p, v.toScalar());
    auto* ref = v.isCapsule() ? dynamic_cast<ValueRef*>(v.toCapsule().get()) : nullptr;
    if (!ref) throw lowering::Unsupported(op_ + ": a tensor argument that is no graph value (" + v.tagKind() + ")");
    if (ref->id < 0 || ref->id >= static_cast<int>(values_.size()))
      throw std::runtime_error("torch_tpu graph: unknown value id " + std::to_string(ref->id));
    ElementType t = values_[ref->id].dtype();
    if (t == ElementType::F64 || t == ElementType::C128) p.any_f64 = true;
    ArgPlan a;
    a.kind = Arg::Kind::Tensor;
    a.tensors.push_back(ref->id);
    return a;
  }

 private:
  const std::vector<Value>& values_;
  const std::string& op_;
};

}  // namespace

c10::IValue Graph::ValueArg(int id) { return c10::IValue::make_capsule(c10::make_intrusive<ValueRef>(id)); }

const c10::FunctionSchema& Graph::Schema(const std::string& op) {
  std::string name = op, overload;
  if (op.find("::") == std::string::npos) {
    size_t dot = op.find('.');
    name = "aten::" + op.substr(0, dot);
    if (dot != std::string::npos) overload = op.substr(dot + 1);
  }
  auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
  if (!handle) throw std::runtime_error("torch_tpu graph: no operator " + op);
  return handle->schema();
}

// Scalars and generator states become module parameters, uploaded per run:
// a graph differing in a scalar's value is the same module.
std::vector<Value> Graph::AddParams(const Plan& plan) {
  std::vector<Value> values;
  for (const Param& q : plan.params) {
    ParamSlot slot;
    if (q.kind == Param::Kind::Rng) {
      slot.kind = ParamSlot::Kind::Rng;
    } else if (q.kind == Param::Kind::Scalar) {
      slot.kind = ParamSlot::Kind::Scalar;
      slot.value = LaunchValue(plan, q);
    } else {
      throw std::runtime_error("torch_tpu graph: unexpected parameter of a graph op");
    }
    params_.push_back(slot);
    values.push_back(b_.Parameter(ParamType(plan, q)));
  }
  return values;
}

std::vector<int> Graph::AddOp(const std::string& op, const std::vector<c10::IValue>& args,
                              const std::vector<GraphTensorType>& outputs) {
  TORCH_CHECK(!compiled_, "graph already compiled");
  const lowering::RuleEntry* entry = lowering::FindForGraph(op);
  if (!entry) throw std::runtime_error("torch_tpu: no lowering rule for aten::" + op);
  const std::vector<c10::Argument>& schema = Schema(op).arguments();
  TORCH_CHECK(args.size() == schema.size(), op, ": expected ", schema.size(), " arguments, got ", args.size());
  lowering::Context ctx{b_};
  ctx.op = op;
  ctx.fp32_highest = at::globalContext().float32MatmulPrecision() == at::Float32MatmulPrecision::HIGHEST;
  for (const auto& o : outputs) {
    ctx.outputs.push_back(TensorType{ToElementType(o.dtype, op.c_str()), o.shape});
    TORCH_CHECK(o.dims.empty() || o.dims.size() == o.shape.size(), op, ": one dims entry per output dim");
  }
  Plan plan;
  plan.is_out.assign(args.size() + 1, false);
  GraphValues tensors(values_, op);
  DecodeArgs(plan, *entry, schema, args, tensors, op);
  DecodeGenerators(plan, *entry, schema);
  SetScalarWidths(plan);
  const size_t first_param = params_.size();
  std::vector<Value> params = AddParams(plan);
  std::vector<Arg> rule_args;
  for (const ArgPlan& ap : plan.args) rule_args.push_back(RuleArg(ap, params, [&](int id) { return value(id); }));
  // Values drawn per run, counted as eager counts them.
  uint64_t draws = entry->random() ? entry->draws(rule_args, ctx.outputs)
                                   : lowering::DrawPerOutputElement(rule_args, ctx.outputs);
  for (size_t p = first_param; p < params_.size(); ++p)
    if (params_[p].kind == ParamSlot::Kind::Rng) params_[p].rng_increment = draws;
  std::vector<Value> results = entry->rule(ctx, rule_args);
  if (results.size() < ctx.outputs.size())
    throw std::runtime_error(op + ": lowering rule returned " + std::to_string(results.size()) +
                             " values, expected " + std::to_string(ctx.outputs.size()));
  std::vector<int> ids;
  for (size_t i = 0; i < ctx.outputs.size(); ++i) {
    Value v = results[i];
    if (v.shape() != ctx.outputs[i].shape)
      throw std::runtime_error(op + ": lowering rule produced " + v.type.str() +
                               " but PyTorch expects " + ctx.outputs[i].str());
    ids.push_back(Add(WithSizes(b_.Convert(v, ctx.outputs[i].dtype), outputs[i].dims), outputs[i].dims));
  }
  for (auto& c : ctx.checks) checks_.push_back({c.ok, op + ": " + c.message});
  return ids;
}

// A graph output as the flat value of its fresh storage (strided when the
// output is not dense).
Value Graph::OutputValue(Value v, Output* o) {
  int64_t n = static_cast<int64_t>(at::detail::computeStorageNbytes(o->sizes, o->strides, 1));
  if (Numel(o->sizes) == 0) n = 0;
  lowering::ViewGeometry g;
  g.sizes = o->sizes;
  g.strides = o->strides;
  g.storage_numel = n;
  g.whole = n == v.type.numel() && (o->strides == lowering::ContiguousStrides(o->sizes) || n <= 1);
  if (g.whole) {
    o->strides = lowering::ContiguousStrides(o->sizes);
    return b_.Reshape(v, {n});
  }
  return lowering::WriteView(b_, b_.Splat(v.dtype(), 0, {n}), b_.ConstantInt(ElementType::I64, 0), g, v);
}

namespace {
bool AnyDynamicDim(const std::vector<int>& dims) {
  return std::any_of(dims.begin(), dims.end(), [](int k) { return k >= 0; });
}
}  // namespace

void Graph::AddMutations(const std::vector<std::pair<int, int>>& mutations, std::vector<Value>* outs,
                         std::vector<Value>* padded) {
  mutations_.clear();
  std::set<int> mutated;
  const bool bounded = !size_params_.empty();
  for (const auto& [input, id] : mutations) {
    TORCH_CHECK(input >= 0 && input < static_cast<int>(inputs_.size()),
                "set_outputs: mutation of unknown input ", input);
    TORCH_CHECK(mutated.insert(input).second, "set_outputs: input ", input, " mutated twice");
    const InputSpec& spec = inputs_[input];
    const std::vector<int>& dims = value_dims_.at(id);
    const bool dynamic = AnyDynamicDim(dims);
    TORCH_CHECK(dynamic ? dims == spec.dims : !AnyDynamicDim(spec.dims), "set_outputs: input ", input,
                " and its new value have different dynamic dims");
    Value v = WithSizes(value(id), dims, bounded);
    TORCH_CHECK(v.dtype() == spec.dtype && v.shape() == spec.shape, "set_outputs: input ", input,
                " is ", hlo::Name(spec.dtype), c10::IntArrayRef(spec.shape),
                " but its new value is ", v.type.str());
    int param = -1;
    for (size_t p = 0; p < params_.size(); ++p)
      if (params_[p].kind == ParamSlot::Kind::Input && params_[p].input == input)
        param = static_cast<int>(p);
    TORCH_CHECK(param >= 0, "internal: no parameter for input ", input);
    if (dynamic) {  // aliased in SetOutputs, once its position is known
      std::vector<bool> dyn;
      for (int k : dims) dyn.push_back(k >= 0);
      padded->push_back(PadDynamicResult(b_, v, dyn));
    } else {
      b_.SetParameterAttrs(param, "tf.aliasing_output = " + std::to_string(outs->size()) + " : i32");
      outs->push_back(b_.Reshape(v, {Numel(spec.shape)}));
    }
    mutations_.push_back({input, param, dynamic});
  }
}

void Graph::SetOutputs(const std::vector<int>& ids, const std::vector<std::vector<int64_t>>& strides,
                       const std::vector<std::pair<int, int>>& mutations) {
  TORCH_CHECK(!compiled_, "graph already compiled");
  TORCH_CHECK(strides.size() == ids.size(), "set_outputs: one stride list per output");
  std::vector<Value> outs, dynamic;
  outputs_.clear();
  dynamic_outputs_.clear();
  const bool bounded = !size_params_.empty();
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::vector<int>& dims = value_dims_.at(ids[i]);
    Value v = WithSizes(value(ids[i]), dims, bounded);
    Output o{v.shape(), strides[i], v.dtype(), dims};
    TORCH_CHECK(o.strides.size() == o.sizes.size(), "set_outputs: bad strides");
    if (dims.empty()) {
      outs.push_back(OutputValue(v, &o));
    } else {
      // Returned after the checks, static at its bound (padded storage).
      std::vector<bool> dyn;
      for (int k : dims) dyn.push_back(k >= 0);
      o.strides = lowering::ContiguousStrides(o.sizes);
      dynamic.push_back(PadDynamicResult(b_, v, dyn));
      dynamic_outputs_.push_back(i);
    }
    outputs_.push_back(o);
  }
  std::vector<Value> padded_mutations;
  AddMutations(mutations, &outs, &padded_mutations);
  for (const auto& c : checks_) {
    outs.push_back(c.first);
    check_messages_.push_back(c.second);
  }
  outs.insert(outs.end(), dynamic.begin(), dynamic.end());
  size_t next = 0;
  for (const Mutation& m : mutations_) {
    if (!m.dynamic) continue;
    b_.SetParameterAttrs(m.param, "tf.aliasing_output = " + std::to_string(outs.size()) + " : i32");
    outs.push_back(padded_mutations[next++]);
  }
  b_.Return(outs);
  text_ = b_.ToText();
  returned_ = true;
}

void Graph::Compile(int device) {
  TORCH_CHECK(returned_, "compile: call set_outputs first");
  device_ = device;
  char key[64];
  std::snprintf(key, sizeof(key), "graph|%016zx|%zu", std::hash<std::string>()(text_), text_.size());
  if (const char* dir = std::getenv("TORCH_TPU_DUMP_GRAPHS"); dir && *dir) {
    char name[64];
    std::snprintf(name, sizeof(name), "/graph_%016zx.mlir", std::hash<std::string>()(text_));
    std::ofstream(std::string(dir) + name) << text_;
  }
  try {
    exe_ = GetRuntime().GetOrCompile(key, device, [&] { return text_; });
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("torch_tpu: compiling the graph failed: ") + e.what());
  }
  compiled_ = true;
}

// A dynamic input as the module reads it: its storage's buffer laid out at
// the bound (a storage in another layout, or a view, is padded once, through
// the host, as eager's first dynamic op of a chain pads its input).
at::Tensor Graph::PaddedInput(const at::Tensor& t, size_t i, pjrt::BufferPtr* buffer) {
  const InputSpec& spec = inputs_[i];
  at::Tensor dense = t;
  if (!GeometryOf(t).whole) {
    dense = at::empty(t.sizes(), t.options());
    if (t.numel() > 0) RunInto(kCopyRule, {t}, dense);
  }
  DeviceStorage* s = StorageOf(dense);
  PrepareStorage(s, spec.dtype, /*keep_capacity=*/true);
  *buffer = PaddedBuffer(s, t.sizes().vec(), spec.shape, device_);
  return dense;
}

std::vector<at::Tensor> Graph::DenseInputs(const std::vector<at::Tensor>& inputs, const std::vector<int64_t>& sizes,
                                           std::vector<pjrt::BufferPtr>* padded) {
  TORCH_CHECK(inputs.size() == inputs_.size(), "compiled graph expects ", inputs_.size(),
              " inputs, got ", inputs.size());
  std::vector<at::Tensor> dense(inputs.size());
  padded->assign(inputs.size(), nullptr);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& t = inputs[i];
    TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1 && t.device().index() == device_,
                "compiled graph input ", i, " must be on tpu:", device_, ", got ", t.device());
    const std::vector<int64_t> real = RealSizes(inputs_[i].shape, inputs_[i].dims, sizes);
    TORCH_CHECK(ToElementType(t.scalar_type(), "input") == inputs_[i].dtype && t.sizes().vec() == real,
                "compiled graph input ", i, " has type ", t.scalar_type(), t.sizes(),
                ", the graph was compiled for another one (", c10::IntArrayRef(real), ")");
    if (!inputs_[i].dims.empty()) {
      dense[i] = PaddedInput(t, i, &(*padded)[i]);
    } else if (GeometryOf(t).whole) {
      dense[i] = t;
    } else {
      dense[i] = at::empty(t.sizes(), t.options());
      if (t.numel() > 0) RunInto(kCopyRule, {t}, dense[i]);
    }
  }
  return dense;
}

std::vector<LaunchParam> Graph::LaunchParams(const std::vector<at::Tensor>& dense,
                                             const std::vector<pjrt::BufferPtr>& padded,
                                             const std::vector<int64_t>& sizes) {
  std::vector<bool> donate(params_.size(), false);
  for (const Mutation& m : mutations_) donate[m.param] = true;
  std::vector<LaunchParam> params;
  for (size_t p = 0; p < params_.size(); ++p) {
    const ParamSlot& slot = params_[p];
    if (slot.kind == ParamSlot::Kind::Input && padded[slot.input]) {
      params.push_back(LaunchParam::Of(padded[slot.input], donate[p]));
    } else if (slot.kind == ParamSlot::Kind::Size) {
      TORCH_CHECK(static_cast<size_t>(slot.input) < sizes.size(), "compiled graph: runtime size ", slot.input,
                  " missing (", sizes.size(), " given)");
      params.push_back(LaunchParam::Integer(sizes[slot.input], ElementType::I32));
    } else if (slot.kind == ParamSlot::Kind::Input) {
      DeviceStorage* s = StorageOf(dense[slot.input]);
      PrepareStorage(s, inputs_[slot.input].dtype);
      params.push_back(LaunchParam::Of(s->buffer, donate[p]));
    } else if (slot.kind == ParamSlot::Kind::Rng) {
      auto [seed, offset] = NextRngState(std::nullopt, device_, slot.rng_increment);
      uint64_t state[2] = {seed, offset};
      params.push_back(LaunchParam::Raw(state, sizeof(state), ElementType::U64, 2));
    } else {
      params.push_back(slot.value);
    }
  }
  return params;
}

namespace {
// A storage's new value `b`, a row-major `bound` array with the `real`
// elements at the front of each dim.
void TakePadded(DeviceStorage* s, pjrt::BufferPtr b, const std::vector<int64_t>& real,
                const std::vector<int64_t>& bound) {
  if (real != bound) s->SetPadded(std::move(b), real, bound);
  else s->Set(std::move(b));
}
}  // namespace

// Mutated inputs: their storages took the results (in place); a non-dense
// input is written back from its dense temporary.
void Graph::TakeMutations(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& dense,
                          const std::vector<bool>& donated) {
  auto& counters = GraphMutations();
  for (size_t k = 0; k < mutations_.size(); ++k) {
    const Mutation& m = mutations_[k];
    if (!dense[m.input].is_same(inputs[m.input])) {
      RunInto(kCopyRule, {dense[m.input]}, inputs[m.input]);
      ++counters.copied_back;
    } else if (donated[k]) {
      ++counters.donated;
    } else {
      ++counters.rebound;
    }
  }
}

std::vector<at::Tensor> Graph::Run(const std::vector<at::Tensor>& inputs, const std::vector<int64_t>& sizes) {
  TORCH_CHECK(compiled_, "run: graph not compiled");
  std::vector<pjrt::BufferPtr> padded;
  std::vector<at::Tensor> dense = DenseInputs(inputs, sizes, &padded);
  static const std::string op = "compiled graph";
  runtime::Launch launch;
  launch.exe = exe_.get();
  launch.device = device_;
  launch.op = &op;
  launch.params = LaunchParams(dense, padded, sizes);
  launch.checks = &check_messages_;
  std::vector<at::Tensor> results;
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, device_));
  for (const Output& o : outputs_) {
    auto opts = at::TensorOptions().dtype(ToScalarType(o.dtype)).device(c10::DeviceType::PrivateUse1, device_);
    if (!o.dims.empty()) {  // taken after the run (padded)
      results.push_back(at::empty(RealSizes(o.sizes, o.dims, sizes), opts));
      continue;
    }
    results.push_back(at::empty_strided(o.sizes, o.strides, opts));
    launch.results.push_back(StorageOf(results.back()));
    launch.result_types.push_back(o.dtype);
  }
  // A buffer also read through another parameter is not donated (the
  // launcher's rule): then the storage just takes the result.
  std::vector<bool> donated;
  size_t padded_mutations = 0;
  for (const Mutation& m : mutations_) {
    if (m.dynamic) {
      ++padded_mutations;
    } else {
      launch.results.push_back(StorageOf(dense[m.input]));
      launch.result_types.push_back(inputs_[m.input].dtype);
    }
    bool shared = false;
    for (size_t p = 0; p < launch.params.size(); ++p)
      shared |= static_cast<int>(p) != m.param && launch.params[p].buffer &&
                launch.params[p].buffer == launch.params[m.param].buffer;
    donated.push_back(!shared);
  }
  std::vector<pjrt::BufferPtr> rest;
  try {
    rest = runtime::Run(GetRuntime(), launch);
  } catch (const pjrt::Error& e) {
    TORCH_CHECK(false, "torch_tpu compiled graph: ", e.what());
  }
  TORCH_CHECK(rest.size() == dynamic_outputs_.size() + padded_mutations, "internal: compiled graph returned ",
              rest.size(), " padded outputs, expected ", dynamic_outputs_.size() + padded_mutations);
  size_t next = 0;
  for (size_t k : dynamic_outputs_) {
    StorageOf(results[k])->dtype = outputs_[k].dtype;
    TakePadded(StorageOf(results[k]), rest[next++], results[k].sizes().vec(), outputs_[k].sizes);
  }
  for (const Mutation& m : mutations_)
    if (m.dynamic) TakePadded(StorageOf(dense[m.input]), rest[next++], dense[m.input].sizes().vec(), inputs_[m.input].shape);
  TakeMutations(inputs, dense, donated);
  return results;
}

std::unique_ptr<Graph> Graph::FromText(const std::string& text, const std::vector<GraphTensorType>& inputs,
                                       const std::vector<GraphTensorType>& outputs) {
  auto g = std::make_unique<Graph>();
  for (const auto& in : inputs) {
    ParamSlot slot;
    slot.input = static_cast<int>(g->inputs_.size());
    g->params_.push_back(slot);
    g->inputs_.push_back({ToElementType(in.dtype, "module input"), in.shape});
  }
  for (const auto& out : outputs) {
    Output o;
    o.dtype = ToElementType(out.dtype, "module output");
    o.sizes = out.shape;
    o.strides = lowering::ContiguousStrides(o.sizes);
    g->outputs_.push_back(o);
  }
  g->text_ = text;
  g->returned_ = true;
  return g;
}

}  // namespace torch_tpu::aten
