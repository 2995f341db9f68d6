// The Python module torch_tpu._C: every binding of the native core (the
// c10d backend's own bindings live with it, in distributed.cpp).
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Event.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/extension.h>

#include "aten/call.h"
#include "aten/compile_log.h"
#include "pjrt/live_buffers.h"
#include "aten/dynamic.h"
#include "aten/graph.h"
#include "aten/profiler.h"
#include "runtime/launcher.h"

namespace {

using torch_tpu::aten::Graph;
using torch_tpu::aten::GraphTensorType;

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

// (dtype, shape) pairs, or (dtype, bound shape, dims) triples (graph.h:
// dims[d] = the runtime size index of a dynamic dim, -1 static).
std::vector<GraphTensorType> TypesOf(const py::list& l) {
  std::vector<GraphTensorType> out;
  for (auto h : l) {
    auto t = h.cast<py::tuple>();
    GraphTensorType g{DtypeOf(t[0]), ShapeOf(t[1]), {}};
    if (t.size() > 2 && !t[2].is_none()) g.dims = t[2].cast<std::vector<int>>();
    out.push_back(std::move(g));
  }
  return out;
}

// A graph value in the arguments compile_graph.py passes (torch_tpu._C._GraphValue).
struct GraphValueId {
  int id;
};

// What a Tensor slot of a graph op holds: a graph value, or a Python number
// (a wrapped scalar, as in eager).
c10::IValue GraphTensorOf(const py::handle& h) {
  if (h.is_none()) return {};
  if (py::isinstance<GraphValueId>(h)) return Graph::ValueArg(h.cast<GraphValueId>().id);
  if (py::isinstance<py::bool_>(h)) return h.cast<bool>();
  if (py::isinstance<py::int_>(h)) return h.cast<int64_t>();
  if (py::isinstance<py::float_>(h)) return h.cast<double>();
  throw std::runtime_error("torch_tpu graph: tensor argument " + std::string(py::repr(h)));
}

// One FX argument of a graph op as the IValue an eager call would get
// (graph tensors as Graph::ValueArg): the decoder (call_args.h) reads it.
c10::IValue GraphArgOf(const py::handle& h, const c10::Argument& arg) {
  if (h.is_none()) return {};
  c10::TypePtr type = arg.real_type();
  if (type->kind() == c10::TypeKind::OptionalType) type = type->castRaw<c10::OptionalType>()->getElementType();
  switch (type->kind()) {
    case c10::TypeKind::TensorType:
      return GraphTensorOf(h);
    case c10::TypeKind::GeneratorType:
      throw std::runtime_error("torch_tpu graph: an explicit generator");
    case c10::TypeKind::LayoutType:
    case c10::TypeKind::DeviceObjType:
    case c10::TypeKind::MemoryFormatType:
      return {};  // no rule reads them
    case c10::TypeKind::ListType:
      if (type->castRaw<c10::ListType>()->getElementType()->kind() != c10::TypeKind::TensorType &&
          type->castRaw<c10::ListType>()->getElementType()->kind() != c10::TypeKind::OptionalType)
        break;
      {
        c10::impl::GenericList list(c10::AnyType::get());
        for (auto e : h) list.push_back(GraphTensorOf(e));
        return list;
      }
    default:
      break;
  }
  return torch::jit::toIValue(h, type);
}

std::vector<c10::IValue> GraphArgsOf(const std::string& op, const py::list& values) {
  const auto& schema = Graph::Schema(op).arguments();
  TORCH_CHECK(values.size() == schema.size(), op, ": expected ", schema.size(), " arguments, got ",
              values.size());
  std::vector<c10::IValue> args;
  for (size_t i = 0; i < schema.size(); ++i) args.push_back(GraphArgOf(values[i], schema[i]));
  return args;
}

// Exceptions as Python RuntimeError with the message (c10::Error included).
template <typename F>
auto Guarded(F f) {
  try {
    return f();
  } catch (const py::error_already_set&) {
    throw;
  } catch (const std::exception& e) {
    throw std::runtime_error(e.what());
  }
}

void RegisterGraphBindings(py::module_& m) {
  py::class_<GraphValueId>(m, "_GraphValue")
      .def(py::init<int>())
      .def_readonly("id", &GraphValueId::id)
      .def("__repr__", [](const GraphValueId& v) { return "_GraphValue(" + std::to_string(v.id) + ")"; })
      .def(py::pickle([](const GraphValueId& v) { return py::make_tuple(v.id); },
                      [](const py::tuple& t) { return GraphValueId{t[0].cast<int>()}; }));
  py::class_<Graph>(m, "_Graph")
      .def(py::init<>())
      .def(
          "add_input",
          [](Graph& g, py::handle dtype, py::handle shape, const std::vector<int>& dims) {
            return Guarded([&] { return g.AddInput(DtypeOf(dtype), ShapeOf(shape), dims); });
          },
          py::arg("dtype"), py::arg("shape"), py::arg("dims") = std::vector<int>())
      .def("add_op", [](Graph& g, const std::string& op, const py::list& args, const py::list& outputs) {
        return Guarded([&] { return g.AddOp(op, GraphArgsOf(op, args), TypesOf(outputs)); });
      })
      .def(
          "set_outputs",
          [](Graph& g, const std::vector<int>& ids, const py::list& strides,
             const std::vector<std::pair<int, int>>& mutations) {
            Guarded([&] {
              std::vector<std::vector<int64_t>> s;
              for (auto h : strides) s.push_back(ShapeOf(h));
              g.SetOutputs(ids, s, mutations);
              return 0;
            });
          },
          py::arg("ids"), py::arg("strides"), py::arg("mutations") = std::vector<std::pair<int, int>>())
      .def("compile", [](Graph& g, int device) { Guarded([&] { g.Compile(device); return 0; }); })
      .def(
          "run",
          [](Graph& g, const std::vector<at::Tensor>& inputs, const std::vector<int64_t>& sizes) {
            return Guarded([&] { return g.Run(inputs, sizes); });
          },
          py::arg("inputs"), py::arg("sizes") = std::vector<int64_t>())
      .def("text", &Graph::text)
      .def_static("from_text",
                  [](const std::string& text, const py::list& inputs, const py::list& outputs) {
                    return Guarded([&] { return Graph::FromText(text, TypesOf(inputs), TypesOf(outputs)); });
                  })
      .def_static("has_rule", &Graph::HasRule)
      .def_static("mutation_stats",
                  [] {
                    auto& c = torch_tpu::aten::GraphMutations();
                    return std::map<std::string, int64_t>{
                        {"donated", c.donated}, {"rebound", c.rebound}, {"copied_back", c.copied_back}};
                  })
      .def_static("reset_mutation_stats", [] { torch_tpu::aten::GraphMutations() = {}; });
}

using torch_tpu::aten::GetRuntime;

py::dict Stats() {
  torch_tpu::aten::DrainLaunches();  // compiles still running count when they are done
  auto& s = GetRuntime().stats();
  py::dict d;
  d["compiles"] = s.compiles;
  d["cache_hits"] = s.cache_hits;
  d["hit_path_hits"] = s.hit_path_hits;
  d["executions"] = s.executions;
  d["compile_seconds"] = s.compile_seconds;
  d["transfers_to_device"] = s.transfers_to_device;
  d["transfers_to_host"] = s.transfers_to_host;
  d["fallbacks"] = s.fallbacks;
  d["native_ops"] = s.native_ops;
  d["cache_size"] = GetRuntime().cache_size();
  d["disk_hits"] = s.disk_hits;
  d["disk_misses"] = s.disk_misses;
  d["disk_prefetched"] = GetRuntime().prefetched();
  d["disk_cache_dir"] = GetRuntime().disk_cache_dir();
  auto dyn = torch_tpu::aten::DynamicStats();  // bounded dynamic shapes (dynamic.cpp)
  d["dynamic_executables"] = dyn.executables;
  d["dynamic_hits"] = dyn.hits;
  d["dynamic_hit_path_hits"] = dyn.hit_path_hits;
  d["dynamic_exact_fallbacks"] = dyn.exact_fallbacks;
  d["dynamic_derived_specs"] = dyn.derived_specs;
  d["compiles_by_op"] = dyn.compiles_by_op;
  d["dynamic_compiles_by_op"] = dyn.dynamic_compiles_by_op;
  d["exact_reasons"] = dyn.exact_reasons;
  return d;
}

// The plugin and its devices: registration, configuration, what runs.
void BindPlugin(py::module& m) {
  m.def("_register", &torch_tpu::aten::RegisterDevice);
  m.def("_configure", &torch_tpu::aten::ConfigurePlugin);
  m.def("_is_initialized", &torch_tpu::runtime::Runtime::IsInitialized);
  m.def("_device_count", [] { return GetRuntime().device_count(); });
  m.def("_platform", [] { return GetRuntime().platform(); });
  m.def("_plugin_path", [] { return GetRuntime().plugin_path(); });
  m.def("_xla_compile_options", [] {
    py::dict options;  // name -> value text, as TORCH_TPU_XLA_OPTIONS gave it
    for (const auto& [name, value] : GetRuntime().xla_options()) options[py::str(name)] = value;
    return options;
  });
  m.def("_build_identity", &torch_tpu::runtime::BuildIdentity);
  m.def("_platform_version", [] { return GetRuntime().client().platform_version(); });
  m.def("_device_kind", [](int d) { return GetRuntime().client().devices().at(d).kind; });
  // Index of the PJRT device holding a tpu tensor's buffer (-1: no buffer yet).
  m.def("_buffer_device", [](const at::Tensor& t) {
    TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1, "_buffer_device: not a tpu tensor");
    torch_tpu::aten::FlushPending();
    auto* s = torch_tpu::aten::StorageOf(t);
    if (!s->buffer) return -1;
    return GetRuntime().DeviceIndexOf(*s->buffer);
  });
  // The bucket shape a dynamic op's result keeps its buffer at (runtime.h;
  // empty: the buffer holds exactly the storage's elements).
  m.def("_padded_shape", [](const at::Tensor& t) {
    TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1, "_padded_shape: not a tpu tensor");
    return torch_tpu::aten::StorageOf(t)->padded_shape;
  });
  m.def("_api_version", [] {
    const auto& api = GetRuntime().client().api();
    return py::make_tuple(api.major_version(), api.minor_version());
  });
  m.def("_probe_plugin", [](const std::string& path) {
    try {
      auto api = torch_tpu::pjrt::Api::Load(path);
      return py::make_tuple(api->major_version(), api->minor_version());
    } catch (const std::exception& e) {
      throw std::runtime_error(e.what());
    }
  });
  m.def("_default_generator", [](int idx) {
    const at::Generator& gen = at::globalContext().defaultGenerator(
        c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(idx)));
    return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(gen));
  });
  // torch.Event.elapsed_time accepts only exact torch.Event instances;
  // torch.tpu.Event (a subclass) times through this.
  m.def("_event_elapsed_time", [](py::handle start, py::handle end) {
    TORCH_CHECK(THPEvent_Check(start.ptr()) && THPEvent_Check(end.ptr()),
                "elapsed_time: expected two torch.Event objects");
    auto* a = reinterpret_cast<THPEvent*>(start.ptr());
    auto* b = reinterpret_cast<THPEvent*>(end.ptr());
    return a->event.elapsedTime(b->event);
  });
}

// Execution modes: sync points, fused eager, the current device, launch blocking.
void BindModes(py::module& m) {
  m.def("_flush", [] { torch_tpu::aten::FlushPending(); });
  m.def("_is_in_bad_fork", &torch_tpu::runtime::Runtime::InForkedChild);
  m.def("_set_fusion", [](bool v) { torch_tpu::aten::SetFusion(v); });
  m.def("_fusion_enabled", [] { return torch_tpu::aten::FusionEnabled(); });
  m.def("_current_device", [] { return torch_tpu::aten::CurrentDevice(); });
  m.def("_set_device", [](int d) { torch_tpu::aten::SetCurrentDevice(d); });
  m.def("_synchronize", [](int d) {
    py::gil_scoped_release release;
    torch_tpu::aten::FlushPending();
    GetRuntime().Synchronize(d);
  });
  m.def("_set_launch_blocking", [](bool v) { GetRuntime().set_launch_blocking(v); });
}

// Bounded dynamic shapes (dynamic.cpp): mode, hints, the table's dynamic rules.
void BindDynamicShapes(py::module& m) {
  m.def("_set_dynamic_shapes", &torch_tpu::aten::SetDynamicMode);
  m.def("_forget_dynamic_sizes", &torch_tpu::aten::ForgetDynamicSizes);
  m.def("_check_derived_specs", &torch_tpu::aten::SetCheckDerivedSpecs);
  m.def("_mark_dims", &torch_tpu::aten::MarkDims);
  m.def("_dim_hints", &torch_tpu::aten::DimHintsOf);
  m.def("_dynamic_shapes", [] {
    switch (torch_tpu::aten::GetDynamicMode()) {
      case torch_tpu::aten::DynamicMode::Auto: return std::string("auto");
      case torch_tpu::aten::DynamicMode::All: return std::string("1");
      default: return std::string("0");
    }
  });
  m.def("_dynamic_rules", [] {  // the rules marked Dynamic(): strict eager may run them bounded
    std::vector<std::string> names;
    for (const auto* e : torch_tpu::lowering::AllRules())
      if (e->dynamic.enabled) names.push_back(e->name);
    return names;
  });
}

// Counters, the compilation caches and the rule table.
void BindCachesAndStats(py::module& m) {
  m.def("_stats", &Stats);
  m.def("_reset_stats", [] {
    torch_tpu::aten::DrainLaunches();  // compiles running now count before the reset
    GetRuntime().ResetStats();
  });
  m.def("_launch_floor", [](py::function op, int n) {
    torch_tpu::aten::DrainLaunches();  // launches queued before: not the op's, never captured
    return torch_tpu::runtime::LaunchFloorSeconds(GetRuntime(), [&] {
      op();
      torch_tpu::aten::DrainLaunches();  // a queued launch runs (and is kept) here
    }, n);
  });
  m.def("_clear_cache", [] {
    torch_tpu::aten::FlushPending();  // a recorded chain still names its executables
    torch_tpu::aten::ClearFastEntries();
    torch_tpu::aten::ClearEagerExecutables();
    torch_tpu::aten::ClearChainExecutables();
    torch_tpu::aten::ClearPaddedRowsExecutables();
    torch_tpu::aten::ClearDynamicExecutables();
    torch_tpu::aten::ClearCustomModuleExecutables();
    GetRuntime().ClearCache();
  });
  m.def("_native_ops", [] {
    std::vector<std::string> names;
    for (const auto* e : torch_tpu::lowering::AllRules()) names.push_back(e->name);
    return names;
  });
}

// Memory counters, torch_tpu's and the plugin's.
void BindMemory(py::module& m) {
  m.def("_memory", [](int d) {
    torch_tpu::aten::SettleDeferredStorages();
    auto& mem = GetRuntime().memory(d);
    py::dict r;
    r["allocated_bytes"] = mem.allocated;
    r["peak_allocated_bytes"] = mem.peak;
    r["num_allocs"] = mem.num_allocs;
    r["num_frees"] = mem.num_frees;
    return r;
  });
  m.def("_plugin_memory", [](int d) {
    torch_tpu::aten::FlushPending();  // a recorded chain's results become buffers
    const auto& client = GetRuntime().client();
    auto live = torch_tpu::pjrt::LiveBuffers(client.devices().at(d).device);
    auto stats = client.DeviceMemoryStats(d);
    py::dict r;
    r["live_buffers"] = live.count;
    r["live_buffer_bytes"] = live.bytes;
    bool reported = stats.bytes_limit >= 0 || stats.peak_bytes_in_use >= 0;  // CPU plugins: neither
    r["plugin_bytes_in_use"] = reported ? py::object(py::int_(stats.bytes_in_use)) : py::object(py::none());
    r["plugin_peak_bytes_in_use"] = stats.peak_bytes_in_use < 0 ? py::object(py::none())
                                                                : py::object(py::int_(stats.peak_bytes_in_use));
    return r;
  });
  m.def("_reset_peak", [](int d) {
    torch_tpu::aten::SettleDeferredStorages();
    auto& mem = GetRuntime().memory(d);
    mem.peak = mem.allocated;
  });
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch_tpu native core";
  RegisterGraphBindings(m);
  torch_tpu::aten::RegisterProfilerBindings(m.ptr());  // aten/profiler.h
  torch_tpu::aten::RegisterCompileLogBindings(m.ptr());  // aten/compile_log.h
  torch_tpu::aten::RegisterDistributedBindings(m.ptr());
  torch_tpu::aten::RegisterCustomModuleBindings(m.ptr());
  BindPlugin(m);
  BindModes(m);
  BindDynamicShapes(m);
  BindCachesAndStats(m);
  BindMemory(m);
}
