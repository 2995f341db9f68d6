// Optional timing hook of the runtime, for profilers.
//
// While a callback is installed, the runtime reports each compilation, each
// execution and each host<->device transfer as a span (kind, name, device,
// start and end in steady-clock nanoseconds). Off (the default) it costs one
// relaxed atomic load per call site. Compilations and transfers are host
// spans (the calling thread waits for them). An execution is asynchronous:
// its span is the device's, approximately: from the later of its launch and
// the previous completion on the same device to the moment its outputs are
// ready (reported from the plugin's completion callback, on a plugin thread).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "pjrt/pjrt.h"

namespace torch_tpu::runtime::trace {

enum class Kind : int { Compile = 0, Execute = 1, ToDevice = 2, ToHost = 3 };
const char* KindName(Kind kind);

struct Span {
  Kind kind;
  std::string name;
  int device;  // -1: unknown
  int64_t start_ns;
  int64_t end_ns;
};

// The callback may run on any thread (and concurrently); nullptr turns the
// hook off. Spans of executions still in flight when it is replaced go to
// the new callback (or nowhere).
using Callback = std::function<void(const Span&)>;
void SetCallback(Callback callback);

extern std::atomic<bool> g_enabled;
inline bool Enabled() { return g_enabled.load(std::memory_order_relaxed); }
int64_t NowNs();
void Emit(Span span);

// A host span from construction to destruction; nothing when off.
class Scope {
 public:
  Scope(Kind kind, std::string name, int device)
      : kind_(kind), name_(std::move(name)), device_(device), start_(Enabled() ? NowNs() : 0) {}
  ~Scope() {
    if (start_) Emit({kind_, name_, device_, start_, NowNs()});
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Kind kind_;
  std::string name_;
  int device_;
  int64_t start_;
};

// An execution launched at `launch_ns` (0: the hook was off then) whose
// outputs are `outputs`: emits its device span when they are ready.
void OnExecuted(const pjrt::Client& client, const std::string& name, int64_t launch_ns,
                const std::vector<pjrt::BufferPtr>& outputs);

// Executions whose completion has not been reported yet.
int64_t InFlight();

// The index of `buffer`'s device among the client's devices (-1: none).
int DeviceOf(const pjrt::Client& client, const pjrt::Buffer& buffer);

// The op name at the start of a compilation cache key ("mm|f32[...]..." -> "mm").
std::string NameOfKey(const std::string& key);

}  // namespace torch_tpu::runtime::trace
