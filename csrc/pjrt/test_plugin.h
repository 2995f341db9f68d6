// The XLA:CPU plugin the C++ tests run on: $TORCH_TPU_TEST_CPU_PLUGIN (ctest
// sets it), else the path CMake found at configure time, so that running
// ./build/cpp_tests by hand works too.
#pragma once

#include <cstdlib>
#include <string>

namespace torch_tpu::pjrt::testing {

inline std::string CpuPluginPath() {
  if (const char* env = std::getenv("TORCH_TPU_TEST_CPU_PLUGIN"); env && *env) return env;
#ifdef TORCH_TPU_DEFAULT_CPU_PLUGIN
  return TORCH_TPU_DEFAULT_CPU_PLUGIN;
#else
  return "";
#endif
}

}  // namespace torch_tpu::pjrt::testing
