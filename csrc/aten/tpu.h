// Shared declarations of the ATen glue (PrivateUse1 = "tpu").
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/CachingDeviceAllocator.h>

#include "hlo/builder.h"
#include "lowering/lowering.h"
#include "runtime/runtime.h"

namespace torch_tpu::aten {

// Runtime::Get(), initializing it on first use from the configured plugin.
runtime::Runtime& GetRuntime();
void ConfigurePlugin(const std::string& path, int cpu_devices);

hlo::ElementType ToElementType(at::ScalarType t, const char* op);
at::ScalarType ToScalarType(hlo::ElementType t);

// The device storage behind a tpu tensor.
runtime::DeviceStorage* StorageOf(const at::Tensor& t);
lowering::ViewGeometry GeometryOf(const at::Tensor& t);
// Ensures the storage has a buffer of dtype `t` (zeros if never written).
// Throws lowering::Unsupported if it holds another dtype of another size.
// A bucket-sized (padded) buffer is compacted to exactly the storage's
// elements unless `keep_capacity` (strict-eager plans read its prefix).
void PrepareStorage(runtime::DeviceStorage* s, hlo::ElementType t, bool keep_capacity = false);
// A padded buffer replaced by one of exactly the storage's elements.
void CompactStorage(runtime::DeviceStorage* s);
// The storage's nbytes (padded or not) into `dst`.
void DownloadStorage(const runtime::DeviceStorage& s, void* dst);

int CurrentDevice();
void SetCurrentDevice(int device);

// Generator state (seed, offset) of `gen` or the default generator of
// `device`; advances the offset by `increment`.
std::pair<uint64_t, uint64_t> NextRngState(const std::optional<at::Generator>& gen,
                                           int device, uint64_t increment);

// Runs the Internal rule `name` on `inputs` and writes its first result
// into `dst` (a tpu tensor), converting dtype and broadcasting.
void RunInto(const std::string& name, const std::vector<c10::IValue>& inputs,
             const at::Tensor& dst);
// The Internal rule that copies (converts, broadcasts) its input.
inline constexpr const char* kCopyRule = "copy_convert";

void RecordFallback(const std::string& op);
// Registers the device with PyTorch (hooks, allocator, the op table).
void RegisterDevice();
void RegisterDistributedBindings(struct _object* module);  // _C._init_distributed (distributed.cpp)
void RegisterCustomModuleBindings(struct _object* module);  // _C._run_custom_module (custom_module.cpp)
// Drops the executables of bounded-dynamic custom modules (debug.clear_cache).
void ClearCustomModuleExecutables();

// The pieces of the device (allocator.cpp, hooks.cpp, generator.cpp).
c10::DeviceAllocator* DeviceAllocator();
// Memory counters in fused eager (allocator.cpp). SettleDeferredStorages
// counts the storages allocated while calls were recorded that are still
// alive: run before the counters are read and after a recording has run.
// ReleaseRecordingBuffers then uncounts the buffers of storages freed while
// the recording held them as parameters.
void SettleDeferredStorages();
void ReleaseRecordingBuffers();
void RegisterHooks();
const at::Generator& DefaultGenerator(int device);  // < 0: the current device
at::Generator NewGenerator(int device);
// Storage buffers (storage.cpp): the storage's buffer becomes zeros of its
// dtype; a storage's bytes become `newsize` bytes, keeping the common prefix.
void ZeroFill(runtime::DeviceStorage* s);
// A storage that has no buffer yet and that the next op overwrites whole
// (torch.zeros' zero_, a fill, a copy into a fresh tensor) gets one of dtype
// `t` with unspecified elements: no zeros uploaded or compiled per size.
void GiveBufferToOverwrite(runtime::DeviceStorage* s, hlo::ElementType t);
void ResizeStorage(const c10::Storage& storage, size_t newsize);

// Fused eager (TORCH_TPU_DEFER_AND_FUSE=1 or torch_tpu.fused()): ops are
// recorded into one module and run when a value is needed.
void FlushPending();                      // runs what was recorded, if anything
// Background compiles (runtime/launch_queue.h): runs every queued launch,
// raising the first failure (FlushPending() does this too). StorageOf()
// drains first unless a QueuedCallScope is open on the thread: the one
// place (strict eager's RunCall) that knows a queued storage's buffer is
// stale and queues its own launch behind it.
void DrainLaunches();
class QueuedCallScope {
 public:
  QueuedCallScope();
  ~QueuedCallScope();
  static bool Open();

 private:
  bool previous_;
};
// A storage is being freed; true if its buffer stays alive until the
// recording runs (a parameter of the chain being recorded).
bool ForgetStorage(runtime::DeviceStorage* s);
void SetFusion(bool enabled);
bool FusionEnabled();
// at::native::cpu_fallback, with tpu generators (given or default) replaced
// by CPU generators derived from their state.
void CpuFallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace torch_tpu::aten
