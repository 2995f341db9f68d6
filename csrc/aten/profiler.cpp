#include "aten/profiler.h"

#include <torch/csrc/utils/pybind.h>

#include <chrono>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "runtime/trace.h"

namespace torch_tpu::aten {

namespace py = pybind11;
namespace trace = runtime::trace;

namespace {
// At most this many spans per session (a long run keeps its first ones).
constexpr size_t kMaxSpans = 4 << 20;

struct Collector {
  std::mutex mu;
  std::vector<trace::Span> spans;
  size_t dropped = 0;
};

Collector& TheCollector() {
  static auto* c = new Collector();
  return *c;
}

void Start() {
  Collector& c = TheCollector();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    c.spans.clear();
    c.dropped = 0;
  }
  trace::SetCallback([&c](const trace::Span& span) {
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.spans.size() < kMaxSpans) {
      c.spans.push_back(span);
    } else {
      ++c.dropped;
    }
  });
}

// (kind, name, device, start_ns, end_ns) tuples, and the count dropped.
// Completions are reported on plugin threads, maybe a moment after the
// caller saw the outputs ready: wait (up to a second) for the last ones.
py::tuple Stop() {
  {
    py::gil_scoped_release no_gil;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (trace::InFlight() > 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  trace::SetCallback(nullptr);
  Collector& c = TheCollector();
  std::vector<trace::Span> spans;
  size_t dropped;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    spans.swap(c.spans);
    dropped = c.dropped;
  }
  py::list out;
  for (const auto& s : spans)
    out.append(py::make_tuple(trace::KindName(s.kind), s.name, s.device, s.start_ns, s.end_ns));
  return py::make_tuple(out, dropped);
}
}  // namespace

void RegisterProfilerBindings(PyObject* module) {
  py::module_ m = py::reinterpret_borrow<py::module_>(module);
  m.def("_trace_start", &Start, "Starts collecting the runtime's timing spans.");
  m.def("_trace_stop", &Stop,
        "Stops collecting; returns ([(kind, name, device, start_ns, end_ns)], dropped).");
  m.def("_trace_now_ns", &trace::NowNs, "The runtime's clock (steady, nanoseconds).");
}

}  // namespace torch_tpu::aten
