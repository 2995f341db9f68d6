// Fused eager's entry for a module that is not an ATen call (a jax_op's
// exported StableHLO): it joins the chain being recorded instead of ending it.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "aten/tpu.h"

namespace torch_tpu::aten {

struct RecordedModule {
  // Names what `emit` builds for these inputs' dtypes and sizes (the chain's
  // cache key is made of its calls' keys).
  std::string key;
  int device = 0;
  std::vector<at::Tensor> inputs;  // whole, contiguous tpu tensors
  std::vector<hlo::TensorType> outputs;
  // Builds the call: gets each input's storage value (1-D, numel elements of
  // the input's dtype), returns each output's value flattened to 1-D. Kept
  // until the chain runs, and called only if the chain's executable is not
  // known yet: it must own what it reads (capture by value).
  std::function<std::vector<hlo::Value>(hlo::Builder&, const std::vector<hlo::Value>&)> emit;
};

// Records the module into the fused chain and returns its outputs (fresh
// tensors whose values are pending); nullopt when not recording (strict
// eager, launch blocking): then the caller runs the module alone. Inputs'
// storages are read as their dtypes (converted, compacted) as a recorded
// ATen call reads them.
std::optional<std::vector<at::Tensor>> RecordModule(const RecordedModule& m);

}  // namespace torch_tpu::aten
