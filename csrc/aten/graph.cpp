// Whole graphs (torch.compile): a sequence of lowering-rule calls becomes ONE
// StableHLO module, compiled once and run many times. The rules are the very
// ones eager ops use; graph-only rules (views, factories) are registered as
// "_tpu_graph::<op>" and looked up first.
//
// Python (torch_tpu/compile.py) walks the FX graph and calls
//   add_input(dtype, shape) -> id
//   add_op(op, args, outputs) -> [id...]
//   set_outputs(ids, strides)
//   compile(device)
//   run(inputs) -> [Tensor...]
// Graph inputs are module parameters holding the whole (contiguous) storage
// of the input tensor; non-contiguous inputs are made dense first.
#include <torch/csrc/Dtype.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/extension.h>

#include <cstdio>
#include <functional>

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

  void SetOutputs(const std::vector<int>& ids, const py::list& strides) {
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
      non_donatable.push_back(static_cast<int64_t>(p));
    }
    std::vector<pjrt::BufferPtr> outs;
    try {
      outs = rt.Execute(*exe_, buffers, non_donatable, "compiled graph");
    } catch (const pjrt::Error& e) {
      TORCH_CHECK(false, "torch_tpu compiled graph: ", e.what());
    }
    for (size_t i = 0; i < check_messages_.size(); ++i)
      rt.AddAssertion(outs[outputs_.size() + i], check_messages_[i]);
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
  std::vector<std::string> check_messages_;
  std::string text_;
  bool any_f64_ = false;
  bool returned_ = false;
  bool compiled_ = false;
  int device_ = 0;
  pjrt::ExecutablePtr exe_;
};

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
      .def("set_outputs", [](Graph& g, const std::vector<int>& ids, const py::list& strides) {
        Guarded([&] { g.SetOutputs(ids, strides); })();
      })
      .def("compile", [](Graph& g, int device) {
        Guarded([&] { g.Compile(device); })();
      })
      .def("run", [](Graph& g, const std::vector<at::Tensor>& inputs) {
        return Guarded([&] { return g.Run(inputs); })();
      })
      .def("text", &Graph::text)
      .def_static("has_rule", [](const std::string& op) { return Lookup(op) != nullptr; });
}

}  // namespace torch_tpu::aten
