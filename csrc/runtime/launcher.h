// The one launcher: every executable torch_tpu runs (an eager op, a fused
// chain, a compiled graph, a resize, a zero fill) goes through Launch(). It
// uploads the runtime parameters, marks which buffers the execution may
// donate, executes, registers the device-side assertions and re-points the
// storages that take the results.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "runtime/runtime.h"

namespace torch_tpu::runtime {

// One module parameter.
struct LaunchParam {
  enum class Kind {
    Buffer,  // `buffer` as it is (a storage's current value)
    Int,     // rank-0 `dtype` holding `i` (storage offsets, integer scalars)
    Float,   // rank-0 `dtype` holding `f` (float scalars)
    Bytes,   // `nbytes` raw bytes of `dtype`: rank 0, or 1-D of `length`
  };
  Kind kind = Kind::Buffer;
  pjrt::BufferPtr buffer;
  // Buffer: the execution may consume it (its storage takes a result). A
  // buffer also passed as another parameter is never donated.
  bool donate = false;
  hlo::ElementType dtype = hlo::ElementType::I64;
  int64_t i = 0;
  double f = 0;
  uint8_t bytes[16] = {0};
  size_t nbytes = 0;
  int64_t length = -1;  // Bytes: -1 for rank 0

  static LaunchParam Of(pjrt::BufferPtr b, bool donate = false);
  static LaunchParam Integer(int64_t v, hlo::ElementType t);
  static LaunchParam Floating(double v, hlo::ElementType t);
  static LaunchParam Raw(const void* data, size_t nbytes, hlo::ElementType t, int64_t length = -1);
};

struct Launch {
  const pjrt::Executable* exe = nullptr;
  int device = 0;
  const std::string* op = nullptr;  // names the failing op in errors
  std::vector<LaunchParam> params;
  // Result k becomes the buffer of results[k] (whose dtype is set to
  // result_types[k]). Results past these are assertion predicates, one per
  // entry of *checks; any further results are returned to the caller.
  std::vector<DeviceStorage*> results;
  std::vector<hlo::ElementType> result_types;
  const std::vector<std::string>* checks = nullptr;
  size_t num_checks() const { return checks ? checks->size() : 0; }
};

// Runs `launch`; returns the results that no storage took.
std::vector<pjrt::BufferPtr> Run(Runtime& rt, const Launch& launch);

// The launch floor (benchmarks/op_overhead.py): `op` (one eager op) runs with
// its launch kept; the kept launch then runs `n` more times as the runtime
// alone: parameter uploads and PJRT execute, outputs dropped, nothing
// donated; no dispatcher, no planning. Returns seconds per replayed launch.
double LaunchFloorSeconds(Runtime& rt, const std::function<void()>& op, int n);

}  // namespace torch_tpu::runtime
