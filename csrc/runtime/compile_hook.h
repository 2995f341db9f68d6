// A hook the runtime calls after each compilation (not on cache or disk
// hits): the compile-burst log (aten/compile_log.cpp) sits on it. Off (no
// hook) it costs one atomic load per compile.
#pragma once

#include <atomic>

namespace torch_tpu::runtime {

// Runs on the compiling thread, with no runtime lock held.
using CompileHook = void (*)(double seconds);
void SetCompileHook(CompileHook hook);
void NotifyCompiled(double seconds);

}  // namespace torch_tpu::runtime
