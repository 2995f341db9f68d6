// Bounded dynamic shapes in strict eager (dynamic.cpp): the mode and counters.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace torch_tpu::aten {

enum class DynamicMode { Off, Auto, All };

struct DynamicCounters {
  int64_t executables = 0;      // bounded-dynamic executables compiled (or loaded)
  int64_t hits = 0;             // calls that reused one
  int64_t exact_fallbacks = 0;  // signatures sent back to exact shapes (XLA refused the module)
  // Strict-eager compiles per op (exact-shape and dynamic): the ops that
  // still recompile for new shapes.
  std::map<std::string, int64_t> compiles_by_op;
};

// Counts one strict-eager compile of `op`.
void CountCompile(const std::string& op);

DynamicMode GetDynamicMode();
// "0", "auto" or "1" (TORCH_TPU_DYNAMIC_SHAPES); throws std::invalid_argument otherwise.
void SetDynamicMode(const std::string& mode);
// Forgets the sizes every signature has seen (compiled executables stay).
void ForgetDynamicSizes();
// Since the last stats reset.
DynamicCounters DynamicStats();

}  // namespace torch_tpu::aten
