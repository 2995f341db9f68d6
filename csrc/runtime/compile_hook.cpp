#include "runtime/compile_hook.h"

namespace torch_tpu::runtime {

namespace {
std::atomic<CompileHook> g_hook{nullptr};
}  // namespace

void SetCompileHook(CompileHook hook) { g_hook.store(hook); }

void NotifyCompiled(double seconds) {
  if (CompileHook hook = g_hook.load(std::memory_order_acquire)) hook(seconds);
}

}  // namespace torch_tpu::runtime
