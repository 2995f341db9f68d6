// The compile-burst log (compile_log.cpp): _C._set_compile_log_callback.
#pragma once

struct _object;

namespace torch_tpu::aten {
void RegisterCompileLogBindings(struct _object* module);
}  // namespace torch_tpu::aten
