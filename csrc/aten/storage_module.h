// One-result modules over a storage (zeros, compaction, resize, complex
// reinterpretation: storage.cpp, complex.cpp), compiled once per key and
// run through the launcher.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "aten/tpu.h"

namespace torch_tpu::aten {

// Runs the module `build` makes (compiled once per `key`): it reads `in`'s
// buffer (none when null) and writes `out`, whose dtype becomes `out_type`
// if given. `op` names the module in errors and outlives the call.
void RunStorageModule(const std::string& op, const std::string& key, int device,
                      const std::function<std::string()>& build, const runtime::DeviceStorage* in,
                      runtime::DeviceStorage* out, std::optional<hlo::ElementType> out_type = std::nullopt);

}  // namespace torch_tpu::aten
