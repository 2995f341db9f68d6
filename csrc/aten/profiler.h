// torch_tpu._C._trace_start / _trace_stop: collects the runtime's timing
// spans (runtime/trace.h) for torch_tpu.profiler.
#pragma once

struct _object;

namespace torch_tpu::aten {
void RegisterProfilerBindings(struct _object* module);
}  // namespace torch_tpu::aten
