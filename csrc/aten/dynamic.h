// Bounded dynamic shapes in strict eager (dynamic.cpp): the mode and counters.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "hlo/builder.h"
#include "runtime/runtime.h"

namespace torch_tpu::aten {

enum class DynamicMode { Off, Auto, All };

struct DynamicCounters {
  int64_t executables = 0;      // bounded-dynamic executables compiled (or loaded)
  int64_t hits = 0;             // calls that reused one
  int64_t hit_path_hits = 0;    // ... of them, launched by the hit path (call_fast.cpp: same sizes again)
  int64_t exact_fallbacks = 0;  // signatures sent back to exact shapes (XLA refused the module)
  int64_t derived_specs = 0;    // new sizes whose output specs came without the meta kernel (spec_model.cpp)
  // Strict-eager compiles per op (exact-shape and dynamic): the ops that
  // still recompile for new shapes.
  std::map<std::string, int64_t> compiles_by_op;
  // Of those, the bounded-dynamic ones (one per size bucket, not per shape).
  std::map<std::string, int64_t> dynamic_compiles_by_op;
  // Why an exact-shape compile did not run dynamic: op -> reason -> count.
  std::map<std::string, std::map<std::string, int64_t>> exact_reasons;
};

// Counts one strict-eager compile of `op` (`dynamic`: a bounded-dynamic one).
// An exact one counts under `reason`, else ExactReason() now.
void CountCompile(const std::string& op, bool dynamic = false, const char* reason = nullptr);
// Why this thread's last strict-eager call ran exact shapes (a string literal;
// a compile queued on the pool keeps it for when it is counted).
const char* ExactReason();
// Runtime::GetOrCompile(), counting a compile of `op` (CountCompile) when XLA
// compiled it in this call (not a cache hit).
pjrt::ExecutablePtr GetOrCompileCounted(const std::string& key, int device,
                                        const std::function<std::string()>& build, const std::string& op,
                                        bool dynamic = false);
// Counts a bounded-dynamic executable compiled (or loaded), and a call that reused one.
void CountDynamicExecutable();
void CountDynamicHit(bool hit_path = false);
void CountDerivedSpecs();

// Whether a call can run dynamic at all: the mode is not 0, or some tensor
// carries a mark_dynamic / mark_static hint. PlanCall records each input's
// geometry span in the key only then (the mode-0 hot path stays as it was).
extern bool g_dynamic_active;
inline bool DynamicShapesActive() { return g_dynamic_active; }
// Whether `t` (or the base it views) carries mark_dynamic / mark_static hints.
bool CarriesDynamicHints(const at::Tensor& t);

// torch_tpu.mark_dynamic / mark_static: hints on `t`'s dims (already
// normalised and checked by dynamic.py), kept on its TensorImpl. A dynamic
// dim runs bounded from the first call (bound: `max`, or the size's bucket
// when max < 0 or the size is past it), in every mode; a static dim never
// runs dynamic.
void MarkDims(const at::Tensor& t, const std::vector<int64_t>& dims, bool dynamic, int64_t min,
              int64_t max);
// Per dim of `t`: "dynamic", "static" or "" (no hint), for tests and report().
std::vector<std::string> DimHintsOf(const at::Tensor& t);

DynamicMode GetDynamicMode();
// "0", "auto" or "1" (TORCH_TPU_DYNAMIC_SHAPES); throws std::invalid_argument otherwise.
void SetDynamicMode(const std::string& mode);
// Forgets the sizes every signature has seen (compiled executables stay).
void ForgetDynamicSizes();
// Since the last stats reset.
DynamicCounters DynamicStats();

// For modules run bounded-dynamic outside the op table (custom_module.cpp:
// jax_op exports with bounded dims).
// The bucket a dynamic dim of size `s` runs at (16, 18, 20, ..., 32, 36, ...).
int64_t DynamicBucket(int64_t s);
// The bucket of a small size (<= 16) of a dim that has run at the `warm`
// small buckets, whose rows hold `row_bytes` in the largest tensor they are
// in: the smallest warm bucket that holds it, else its coarse bucket (4, 8,
// 16), while that pads each tensor past 1.25x by at most the slack
// (TORCH_TPU_PADDING_SLACK_BYTES); else its fine bucket (1-4, then even).
int64_t SmallBucketAmong(const std::set<int64_t>& warm, int64_t size, int64_t row_bytes);
// The buffer of storage `s` laid out row-major at `padded` sizes with its
// `real` elements at the front of each dim: its buffer when it holds that
// layout, else padded through the host once (the storage keeps the layout).
pjrt::BufferPtr PaddedBuffer(runtime::DeviceStorage* s, const std::vector<int64_t>& real,
                             const std::vector<int64_t>& padded, int device);
// A result with dynamic dims `dyn` (bounded by its type's shape) as a static
// flat array of its bound, the real elements at the front of each dim (as
// dynamic ops' results keep their storages).
hlo::Value PadDynamicResult(hlo::Builder& b, hlo::Value v, const std::vector<bool>& dyn);
// Counts a call of `op` that ran exact shapes because of `reason` (exact_reasons).
void CountExactFallback(const std::string& op, const std::string& reason);

}  // namespace torch_tpu::aten
