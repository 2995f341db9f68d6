// The compile-burst log: a burst of compiles whose compile time passes a
// threshold (1 s; TORCH_TPU_COMPILE_LOG_SECONDS, <= 0 turns it off) logs ONE
// line, through a Python callback (torch_tpu/compile_log.py: logging), so a
// slow first call is never silent. A burst is a run of compiles each less
// than kGap after the previous one (debug.reset_stats() starts a new one);
// the line is written when the burst's compile time passes the threshold,
// never per compile. Nothing runs on cache hits (runtime/compile_hook.h).
#include "aten/compile_log.h"

#include <torch/csrc/utils/pybind.h>

#include <chrono>
#include <cstdlib>
#include <mutex>

#include "aten/tpu.h"
#include "runtime/compile_hook.h"

namespace torch_tpu::aten {

namespace py = pybind11;

namespace {

constexpr double kGapSeconds = 2.0;

struct Burst {
  std::mutex mu;
  std::chrono::steady_clock::time_point last{};
  int64_t generation = -1;
  int64_t count = 0;
  double seconds = 0;
  bool logged = false;
  py::object* callback = nullptr;  // leaked: must outlive interpreter shutdown
};

Burst& TheBurst() {
  static auto* b = new Burst();
  return *b;
}

double Threshold() {
  const char* v = std::getenv("TORCH_TPU_COMPILE_LOG_SECONDS");
  if (!v || !*v) return 1.0;
  char* end = nullptr;
  double t = std::strtod(v, &end);
  return end && *end == '\0' ? t : 1.0;
}

// Adds one compile to the current burst; true when it is the one that
// passes the threshold (the caller logs).
bool AddCompile(Burst& b, double seconds, int64_t* count, double* total) {
  std::lock_guard<std::mutex> lock(b.mu);
  auto now = std::chrono::steady_clock::now();
  int64_t g = GetRuntime().stats_generation();
  if (g != b.generation || std::chrono::duration<double>(now - b.last).count() > kGapSeconds + seconds) {
    b.generation = g;
    b.count = 0;
    b.seconds = 0;
    b.logged = false;
  }
  b.last = now;
  ++b.count;
  b.seconds += seconds;
  double threshold = Threshold();
  if (b.logged || threshold <= 0 || b.seconds < threshold || !b.callback) return false;
  b.logged = true;
  *count = b.count;
  *total = b.seconds;
  return true;
}

void OnCompiled(double seconds) {
  Burst& b = TheBurst();
  int64_t count = 0;
  double total = 0;
  if (!AddCompile(b, seconds, &count, &total) || !Py_IsInitialized() || _Py_IsFinalizing()) return;
  py::gil_scoped_acquire gil;
  try {
    (*b.callback)(count, total);
  } catch (py::error_already_set& e) {
    e.discard_as_unraisable("torch_tpu compile-burst log");
  }
}

}  // namespace

void RegisterCompileLogBindings(PyObject* module) {
  py::module_ m = py::reinterpret_borrow<py::module_>(module);
  m.def("_set_compile_log_callback", [](py::object fn) {
    Burst& b = TheBurst();
    std::lock_guard<std::mutex> lock(b.mu);
    b.callback = fn.is_none() ? nullptr : new py::object(std::move(fn));  // the old one leaks (rare)
    runtime::SetCompileHook(b.callback ? &OnCompiled : nullptr);
  });
}

}  // namespace torch_tpu::aten
