// Whole graphs (torch.compile): a sequence of lowering-rule calls becomes ONE
// StableHLO module, compiled once and run many times. The rules are the very
// ones eager ops use; graph-only rules (views, factories) are registered as
// "_tpu_graph::<op>" and looked up first.
//
// Python (torch_tpu/compile.py) walks the FX graph and calls
//   add_input(dtype, shape) -> id
//   add_op(op, args, outputs) -> [id...]
//   set_outputs(ids, strides, mutations=[])
//   compile(device)
//   run(inputs) -> [Tensor...]
// Graph inputs are module parameters holding the whole (contiguous) storage
// of the input tensor; non-contiguous inputs are made dense first.
//
// Mutated inputs (AOTAutograd's `copy_(input, new_value)` epilogue, kept in
// the graph with keep_inference_input_mutations: buffers, KV caches,
// optimizer state) are `mutations`, (input index, value id) pairs: the new
// value is an extra module result aliased to the input's parameter
// (tf.aliasing_output), the input's storage buffer is donated to the
// execution and the storage takes the result buffer: an in-place update
// with no copy, as eager in-place ops do. An input that is a non-dense view
// goes through a dense temporary and is written back with one copy (counted
// in _Graph.mutation_stats()["copied_back"]).
//
// TORCH_TPU_DUMP_GRAPHS=<dir> writes every graph module to <dir>/graph_<hash>.mlir.
#include <torch/csrc/Dtype.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/extension.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <set>

#include "aten/tpu.h"

namespace torch_tpu::aten {

using hlo::ElementType;
using hlo::TensorType;
using hlo::Value;
using lowering::Arg;
using runtime::DeviceStorage;

namespace py = pybind11;

namespace {

at::ScalarType DtypeOf(const py::handle& h) {
  TORCH_CHECK(THPDtype_Check(h.ptr()), "expected a torch.dtype, got ",
              std::string(py::str(h.get_type())));
  return reinterpret_cast<THPDtype*>(h.ptr())->scalar_type;
}

std::vector<int64_t> ShapeOf(const py::handle& h) {
  std::vector<int64_t> s;
  for (auto d : h) s.push_back(d.cast<int64_t>());
  return s;
}

int64_t Numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// Totals over all graphs (compile.stats() reports them).
struct MutationCounters {
  int64_t donated = 0;      // mutated inputs updated in place through donation
  int64_t rebound = 0;      // updated in place without donation (storage shared)
  int64_t copied_back = 0;  // non-dense views written back with a copy
} g_mutations;

const lowering::RuleEntry* Lookup(const std::string& op) {
  if (const auto* e = lowering::Find("_tpu_graph::" + op)) return e;
  const auto* e = lowering::Find(op);
  // Find() also answers in-place / out= variant names with the functional
  // rule; a graph needs the exact op.
  if (e && e->name != op) return nullptr;
  return e;
}

class Graph {
 public:
  Graph() : b_("graph") {}

  int AddInput(const py::handle& dtype, const py::handle& shape) {
    TORCH_CHECK(!compiled_, "graph already compiled");
    ElementType t = ToElementType(DtypeOf(dtype), "torch.compile input");
    std::vector<int64_t> s = ShapeOf(shape);
    Value p = b_.Parameter(TensorType{t, {Numel(s)}});
    ParamSlot slot;
    slot.input = static_cast<int>(inputs_.size());
    params_.push_back(slot);
    inputs_.push_back({t, s});
    if (t == ElementType::F64) any_f64_ = true;
    return Add(b_.Reshape(p, s));
  }

  std::vector<int> AddOp(const std::string& op, const py::list& args, const py::list& outputs) {
    TORCH_CHECK(!compiled_, "graph already compiled");
    const lowering::RuleEntry* entry = Lookup(op);
    if (!entry) throw std::runtime_error("torch_tpu: no lowering rule for aten::" + op);
    lowering::Context ctx{b_};
    ctx.op = op;
    ctx.fp32_highest =
        at::globalContext().float32MatmulPrecision() == at::Float32MatmulPrecision::HIGHEST;
    std::vector<at::ScalarType> out_dtypes;
    for (auto o : outputs) {
      auto tup = o.cast<py::tuple>();
      at::ScalarType st = DtypeOf(tup[0]);
      out_dtypes.push_back(st);
      ctx.outputs.push_back(TensorType{ToElementType(st, op.c_str()), ShapeOf(tup[1])});
    }
    // Float scalars are f32 unless an f64 tensor takes part (as eager).
    bool op_f64 = false;
    for (auto h : args) {
      auto t = h.cast<py::tuple>();
      std::string tag = t[0].cast<std::string>();
      if (tag == "tensor") op_f64 |= value(t[1].cast<int>()).dtype() == ElementType::F64;
      if (tag == "tensors")
        for (auto e : t[1])
          if (!e.is_none()) op_f64 |= value(e.cast<int>()).dtype() == ElementType::F64;
    }
    ElementType float_t = op_f64 ? ElementType::F64 : ElementType::F32;
    int64_t numel = 0;
    for (const auto& o : ctx.outputs) numel += o.numel();

    std::vector<Arg> rule_args;
    bool has_generator = false;
    for (auto h : args) {
      auto t = h.cast<py::tuple>();
      std::string tag = t[0].cast<std::string>();
      Arg a;
      if (tag == "none") {
        a.kind = Arg::Kind::None;
      } else if (tag == "tensor") {
        a.kind = Arg::Kind::Tensor;
        a.tensor = value(t[1].cast<int>());
      } else if (tag == "tensors") {
        a.kind = Arg::Kind::TensorList;
        for (auto e : t[1]) a.tensors.push_back(e.is_none() ? Value() : value(e.cast<int>()));
      } else if (tag == "scalar") {
        a.kind = Arg::Kind::Scalar;
        a.tensor = ScalarConstant(t[1], float_t, &a.scalar_type);
      } else if (tag == "scalars") {
        a.kind = Arg::Kind::ScalarList;
        for (auto e : t[1]) {
          ElementType cat;
          a.tensors.push_back(ScalarConstant(e, float_t, &cat));
          a.ints.push_back(static_cast<int64_t>(cat));
        }
      } else if (tag == "int") {
        a.kind = Arg::Kind::Int;
        a.i = t[1].cast<int64_t>();
      } else if (tag == "ints") {
        a.kind = Arg::Kind::IntList;
        for (auto e : t[1]) a.ints.push_back(e.cast<int64_t>());
      } else if (tag == "float") {
        a.kind = Arg::Kind::Double;
        a.d = t[1].cast<double>();
        if (entry->runtime_floats) a.tensor = b_.Constant(float_t, a.d);
      } else if (tag == "bool") {
        a.kind = Arg::Kind::Bool;
        a.i = t[1].cast<bool>() ? 1 : 0;
      } else if (tag == "str") {
        a.kind = Arg::Kind::String;
        a.s = t[1].cast<std::string>();
      } else if (tag == "dtype") {
        a.kind = Arg::Kind::ScalarType;
        a.dtype = ToElementType(DtypeOf(t[1]), op.c_str());
      } else if (tag == "generator") {
        a = GeneratorArg(numel);
        has_generator = true;
      } else {
        throw std::runtime_error("torch_tpu graph: unknown argument tag '" + tag + "'");
      }
      rule_args.push_back(a);
    }
    if (entry->random && !has_generator) rule_args.push_back(GeneratorArg(numel));

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
      ids.push_back(Add(b_.Convert(v, ctx.outputs[i].dtype)));
    }
    for (auto& c : ctx.checks) checks_.push_back({c.ok, op + ": " + c.message});
    return ids;
  }

  void SetOutputs(const std::vector<int>& ids, const py::list& strides,
                  const std::vector<std::pair<int, int>>& mutations) {
    TORCH_CHECK(!compiled_, "graph already compiled");
    TORCH_CHECK(strides.size() == ids.size(), "set_outputs: one stride list per output");
    std::vector<Value> outs;
    outputs_.clear();
    for (size_t i = 0; i < ids.size(); ++i) {
      Value v = value(ids[i]);
      Output o;
      o.sizes = v.shape();
      o.strides = ShapeOf(strides[i]);
      o.dtype = v.dtype();
      TORCH_CHECK(o.strides.size() == o.sizes.size(), "set_outputs: bad strides");
      int64_t n = static_cast<int64_t>(at::detail::computeStorageNbytes(o.sizes, o.strides, 1));
      if (Numel(o.sizes) == 0) n = 0;
      lowering::ViewGeometry g;
      g.sizes = o.sizes;
      g.strides = o.strides;
      g.storage_numel = n;
      g.whole = n == v.type.numel() && (o.strides == lowering::ContiguousStrides(o.sizes) || n <= 1);
      if (g.whole) {
        o.strides = lowering::ContiguousStrides(o.sizes);
        outs.push_back(b_.Reshape(v, {n}));
      } else {
        outs.push_back(lowering::WriteView(b_, b_.Splat(v.dtype(), 0, {n}),
                                           b_.ConstantInt(ElementType::I64, 0), g, v));
      }
      outputs_.push_back(o);
    }
    mutations_.clear();
    std::set<int> mutated;
    for (const auto& [input, id] : mutations) {
      TORCH_CHECK(input >= 0 && input < static_cast<int>(inputs_.size()),
                  "set_outputs: mutation of unknown input ", input);
      TORCH_CHECK(mutated.insert(input).second, "set_outputs: input ", input, " mutated twice");
      const InputSpec& spec = inputs_[input];
      Value v = value(id);
      TORCH_CHECK(v.dtype() == spec.dtype && v.shape() == spec.shape, "set_outputs: input ", input,
                  " is ", hlo::Name(spec.dtype), c10::IntArrayRef(spec.shape),
                  " but its new value is ", v.type.str());
      int param = -1;
      for (size_t p = 0; p < params_.size(); ++p)
        if (params_[p].input == input) param = static_cast<int>(p);
      TORCH_CHECK(param >= 0, "internal: no parameter for input ", input);
      b_.SetParameterAttrs(param, "tf.aliasing_output = " + std::to_string(outs.size()) + " : i32");
      outs.push_back(b_.Reshape(v, {Numel(spec.shape)}));
      mutations_.push_back({input, param});
    }
    for (const auto& c : checks_) {
      outs.push_back(c.ok);
      check_messages_.push_back(c.message);
    }
    b_.Return(outs);
    text_ = b_.ToText();
    returned_ = true;
  }

  void Compile(int device) {
    TORCH_CHECK(returned_, "compile: call set_outputs first");
    device_ = device;
    auto& rt = GetRuntime();
    char key[64];
    std::snprintf(key, sizeof(key), "graph|%016zx|%zu", std::hash<std::string>()(text_),
                  text_.size());
    if (const char* dir = std::getenv("TORCH_TPU_DUMP_GRAPHS"); dir && *dir) {
      char name[64];
      std::snprintf(name, sizeof(name), "/graph_%016zx.mlir", std::hash<std::string>()(text_));
      std::ofstream(std::string(dir) + name) << text_;
    }
    try {
      exe_ = rt.GetOrCompile(key, device, [&] { return text_; });
    } catch (const std::exception& e) {
      throw std::runtime_error(std::string("torch_tpu: compiling the graph failed: ") + e.what());
    }
    compiled_ = true;
  }

  std::vector<at::Tensor> Run(const std::vector<at::Tensor>& inputs) {
    TORCH_CHECK(compiled_, "run: graph not compiled");
    TORCH_CHECK(inputs.size() == inputs_.size(), "compiled graph expects ", inputs_.size(),
                " inputs, got ", inputs.size());
    auto& rt = GetRuntime();
    std::vector<at::Tensor> dense(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      const at::Tensor& t = inputs[i];
      TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1 && t.device().index() == device_,
                  "compiled graph input ", i, " must be on tpu:", device_, ", got ", t.device());
      TORCH_CHECK(ToElementType(t.scalar_type(), "input") == inputs_[i].dtype &&
                      t.sizes().vec() == inputs_[i].shape,
                  "compiled graph input ", i, " has type ", t.scalar_type(), t.sizes(),
                  ", the graph was compiled for another one");
      if (GeometryOf(t).whole) {
        dense[i] = t;
      } else {
        dense[i] = at::empty(t.sizes(), t.options());
        if (t.numel() > 0) RunInto("_tpu_copy", {t}, dense[i]);
      }
    }
    std::vector<pjrt::BufferPtr> keep;
    std::vector<PJRT_Buffer*> buffers;
    std::vector<int64_t> non_donatable;
    std::vector<bool> donate(params_.size(), false);
    for (const Mutation& m : mutations_) donate[m.param] = true;
    for (size_t p = 0; p < params_.size(); ++p) {
      const ParamSlot& slot = params_[p];
      if (slot.input >= 0) {
        const at::Tensor& t = dense[slot.input];
        DeviceStorage* s = StorageOf(t);
        PrepareStorage(s, inputs_[slot.input].dtype);
        keep.push_back(s->buffer);
      } else {
        auto [seed, offset] = NextRngState(std::nullopt, device_, slot.rng_increment);
        uint64_t state[2] = {seed, offset};
        keep.push_back(rt.Upload(state, ElementType::U64, {2}, device_));
      }
      buffers.push_back(keep.back()->raw());
    }
    // A donated buffer must not be read through another parameter (the same
    // storage passed twice): then the storage just takes the result.
    for (size_t p = 0; p < params_.size(); ++p) {
      if (donate[p])
        for (size_t q = 0; q < params_.size(); ++q)
          if (q != p && buffers[q] == buffers[p]) donate[p] = false;
      if (!donate[p]) non_donatable.push_back(static_cast<int64_t>(p));
    }
    std::vector<pjrt::BufferPtr> outs;
    try {
      outs = rt.Execute(*exe_, buffers, non_donatable, "compiled graph");
    } catch (const pjrt::Error& e) {
      TORCH_CHECK(false, "torch_tpu compiled graph: ", e.what());
    }
    size_t first_check = outputs_.size() + mutations_.size();
    for (size_t i = 0; i < check_messages_.size(); ++i)
      rt.AddAssertion(outs[first_check + i], check_messages_[i]);
    // Mutated inputs: their storages take the results (in place).
    for (size_t k = 0; k < mutations_.size(); ++k) {
      const Mutation& m = mutations_[k];
      DeviceStorage* s = StorageOf(dense[m.input]);
      s->dtype = inputs_[m.input].dtype;
      s->buffer = outs[outputs_.size() + k];
      if (!dense[m.input].is_same(inputs[m.input])) {
        RunInto("_tpu_copy", {dense[m.input]}, inputs[m.input]);
        ++g_mutations.copied_back;
      } else if (donate[m.param]) {
        ++g_mutations.donated;
      } else {
        ++g_mutations.rebound;
      }
    }
    std::vector<at::Tensor> results;
    c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, device_));
    for (size_t i = 0; i < outputs_.size(); ++i) {
      const Output& o = outputs_[i];
      at::Tensor t = at::empty_strided(
          o.sizes, o.strides,
          at::TensorOptions().dtype(ToScalarType(o.dtype)).device(c10::DeviceType::PrivateUse1, device_));
      DeviceStorage* s = StorageOf(t);
      s->dtype = o.dtype;
      s->buffer = outs[i];
      results.push_back(t);
    }
    return results;
  }

  std::string text() const { return text_; }
  int num_params() const { return static_cast<int>(params_.size()); }

  // A graph from external module text (benchmarks: another frontend's
  // module, e.g. jax.jit(f).lower(...).as_text(), run on this plugin). Its
  // parameters must be the inputs' whole storages (1-D, numel elements),
  // its results 1-D, one per output, returned as contiguous tensors.
  static std::unique_ptr<Graph> FromText(const std::string& text, const py::list& inputs,
                                         const py::list& outputs) {
    auto g = std::make_unique<Graph>();
    for (auto h : inputs) {
      auto tup = h.cast<py::tuple>();
      ParamSlot slot;
      slot.input = static_cast<int>(g->inputs_.size());
      g->params_.push_back(slot);
      g->inputs_.push_back({ToElementType(DtypeOf(tup[0]), "module input"), ShapeOf(tup[1])});
    }
    for (auto h : outputs) {
      auto tup = h.cast<py::tuple>();
      Output o;
      o.dtype = ToElementType(DtypeOf(tup[0]), "module output");
      o.sizes = ShapeOf(tup[1]);
      o.strides = lowering::ContiguousStrides(o.sizes);
      g->outputs_.push_back(o);
    }
    g->text_ = text;
    g->returned_ = true;
    return g;
  }

 private:
  struct ParamSlot {
    int input = -1;              // index into inputs_, or -1 for an RNG state
    uint64_t rng_increment = 0;  // RNG: values drawn per run
  };
  struct InputSpec {
    ElementType dtype;
    std::vector<int64_t> shape;
  };
  struct Output {
    std::vector<int64_t> sizes, strides;
    ElementType dtype;
  };
  struct Check {
    Value ok;
    std::string message;
  };
  struct Mutation {
    int input;  // index into inputs_
    int param;  // its module parameter
  };

  int Add(Value v) {
    values_.push_back(v);
    return static_cast<int>(values_.size()) - 1;
  }
  const Value& value(int id) const {
    if (id < 0 || id >= static_cast<int>(values_.size()))
      throw std::runtime_error("torch_tpu graph: unknown value id " + std::to_string(id));
    return values_[id];
  }

  // A Python number as a rank-0 constant; its category goes to *category.
  Value ScalarConstant(const py::handle& h, ElementType float_t, ElementType* category) {
    if (py::isinstance<py::bool_>(h)) {
      *category = ElementType::Bool;
      return b_.ConstantInt(ElementType::Bool, h.cast<bool>() ? 1 : 0);
    }
    if (py::isinstance<py::int_>(h)) {
      *category = ElementType::I64;
      return b_.ConstantInt(ElementType::I64, h.cast<int64_t>());
    }
    if (py::isinstance<py::float_>(h)) {
      *category = ElementType::F64;
      return b_.Constant(float_t, h.cast<double>());
    }
    throw std::runtime_error("torch_tpu graph: unsupported scalar " + std::string(py::repr(h)));
  }

  Arg GeneratorArg(int64_t numel) {
    Arg a;
    a.kind = Arg::Kind::Generator;
    a.tensor = b_.Parameter(TensorType{ElementType::U64, {2}});
    ParamSlot slot;
    slot.rng_increment = static_cast<uint64_t>(numel) + 1;
    params_.push_back(slot);
    return a;
  }

  hlo::Builder b_;
  std::vector<Value> values_;
  std::vector<ParamSlot> params_;
  std::vector<InputSpec> inputs_;
  std::vector<Output> outputs_;
  std::vector<Check> checks_;
  std::vector<Mutation> mutations_;
  std::vector<std::string> check_messages_;
  std::string text_;
  bool any_f64_ = false;
  bool returned_ = false;
  bool compiled_ = false;
  int device_ = 0;
  pjrt::ExecutablePtr exe_;
};

// ---- graph-only rules for the functional forms of writes into views, as
// AOTAutograd emits them for slice assignment and index writes into KV
// caches and buffers (`cache[:, :, t:t+1] = k`, `x[i] = v`): one
// dynamic_update_slice, which XLA performs in place in the (donated) buffer.

// slice_scatter(self, src, dim=0, start=None, end=None, step=1)
std::vector<Value> SliceScatter(lowering::Context& c, const std::vector<Arg>& a) {
  Value x = a.at(0).tensor, src = a.at(1).tensor;
  int64_t r = x.rank();
  auto int_or = [&](size_t i, int64_t dflt) {
    return i < a.size() && a[i].kind == Arg::Kind::Int ? a[i].i : dflt;
  };
  int64_t dim = lowering::WrapDim(int_or(2, 0), r);
  int64_t n = x.shape()[dim];
  int64_t start = int_or(3, 0), step = int_or(5, 1);
  if (step != 1) throw lowering::Unsupported("slice_scatter with a step");
  if (start < 0) start += n;
  start = std::clamp<int64_t>(start, 0, n);
  std::vector<int64_t> want = x.shape();
  want[dim] = src.shape()[dim];
  if (src.shape() != want || start + want[dim] > n)
    throw lowering::Unsupported("slice_scatter: unexpected source shape");
  std::vector<Value> starts;
  for (int64_t d = 0; d < r; ++d)
    starts.push_back(c.b.ConstantInt(ElementType::I64, d == dim ? start : 0));
  return {c.b.DynamicUpdateSlice(x, c.b.Convert(src, x.dtype()), starts)};
}

// select_scatter(self, src, dim, index)
std::vector<Value> SelectScatter(lowering::Context& c, const std::vector<Arg>& a) {
  Value x = a.at(0).tensor, src = a.at(1).tensor;
  int64_t r = x.rank();
  int64_t dim = lowering::WrapDim(a.at(2).i, r);
  int64_t n = x.shape()[dim], index = a.at(3).i;
  if (index < -n || index >= n) throw std::out_of_range("select_scatter: index out of range");
  if (index < 0) index += n;
  std::vector<int64_t> shape = x.shape();
  shape[dim] = 1;
  std::vector<Value> starts;
  for (int64_t d = 0; d < r; ++d)
    starts.push_back(c.b.ConstantInt(ElementType::I64, d == dim ? index : 0));
  Value update = c.b.Reshape(c.b.Convert(src, x.dtype()), shape);
  return {c.b.DynamicUpdateSlice(x, update, starts)};
}

// as_strided_scatter(self, src, size, stride, storage_offset=None): self is
// taken as a dense buffer (compile.py checks that its value is contiguous
// with offset 0, as for as_strided), src is written through the view.
std::vector<Value> AsStridedScatter(lowering::Context& c, const std::vector<Arg>& a) {
  Value x = a.at(0).tensor, src = a.at(1).tensor;
  lowering::ViewGeometry g;
  g.sizes = a.at(2).ints;
  g.strides = a.at(3).ints;
  g.storage_numel = x.type.numel();
  int64_t offset = a.size() > 4 && a[4].kind == Arg::Kind::Int ? a[4].i : 0;
  if (src.shape() != g.sizes) throw lowering::Unsupported("as_strided_scatter: source shape");
  Value flat = c.b.Reshape(x, {g.storage_numel});
  Value out = lowering::WriteView(c.b, flat, c.b.ConstantInt(ElementType::I64, offset), g,
                                  c.b.Convert(src, x.dtype()));
  return {c.b.Reshape(out, x.shape())};
}

struct GraphRules {
  GraphRules() {
    lowering::Register("_tpu_graph::as_strided_scatter", AsStridedScatter);
    lowering::Register("_tpu_graph::slice_scatter", SliceScatter);
    lowering::Register("_tpu_graph::select_scatter", SelectScatter);
  }
} graph_rules;

// Exceptions as Python RuntimeError with the message (c10::Error included).
template <typename F>
auto Guarded(F f) {
  return [f](auto&&... args) {
    try {
      return f(std::forward<decltype(args)>(args)...);
    } catch (const py::error_already_set&) {
      throw;
    } catch (const std::exception& e) {
      throw std::runtime_error(e.what());
    }
  };
}

}  // namespace

void RegisterGraphBindings(PyObject* module) {
  py::module_ m = py::reinterpret_borrow<py::module_>(module);
  py::class_<Graph>(m, "_Graph")
      .def(py::init<>())
      .def("add_input", [](Graph& g, py::handle dtype, py::handle shape) {
        return Guarded([&] { return g.AddInput(dtype, shape); })();
      })
      .def("add_op", [](Graph& g, const std::string& op, const py::list& args,
                        const py::list& outputs) {
        return Guarded([&] { return g.AddOp(op, args, outputs); })();
      })
      .def(
          "set_outputs",
          [](Graph& g, const std::vector<int>& ids, const py::list& strides,
             const std::vector<std::pair<int, int>>& mutations) {
            Guarded([&] { g.SetOutputs(ids, strides, mutations); })();
          },
          py::arg("ids"), py::arg("strides"),
          py::arg("mutations") = std::vector<std::pair<int, int>>())
      .def("compile", [](Graph& g, int device) {
        Guarded([&] { g.Compile(device); })();
      })
      .def("run", [](Graph& g, const std::vector<at::Tensor>& inputs) {
        return Guarded([&] { return g.Run(inputs); })();
      })
      .def("text", &Graph::text)
      .def_static("from_text",
                  [](const std::string& text, const py::list& inputs, const py::list& outputs) {
                    return Guarded([&] { return Graph::FromText(text, inputs, outputs); })();
                  })
      .def_static("has_rule", [](const std::string& op) { return Lookup(op) != nullptr; })
      .def_static("mutation_stats",
                  [] {
                    return std::map<std::string, int64_t>{
                        {"donated", g_mutations.donated},
                        {"rebound", g_mutations.rebound},
                        {"copied_back", g_mutations.copied_back}};
                  })
      .def_static("reset_mutation_stats", [] { g_mutations = MutationCounters(); });
}

}  // namespace torch_tpu::aten
