// The tpu allocator: a storage's DataPtr owns a runtime::DeviceStorage
// (its PJRT buffer comes with the first write) and carries a unique, never
// dereferenced address, so code that groups tensors by data_ptr() works.
// A DeviceAllocator, so torch.accelerator.memory_* work.
#include <c10/core/CachingDeviceAllocator.h>

#include <atomic>
#include <mutex>
#include <unordered_set>

#include "aten/call.h"
#include "aten/tpu.h"
#include "runtime/launch_queue.h"

namespace torch_tpu::aten {

using runtime::DeviceStorage;
using runtime::Runtime;

namespace {

// Addresses handed out as data pointers: unique per storage, never
// dereferenced, in a range no host allocation uses.
std::atomic<uint64_t> g_next_address{0x7e0000000000ULL};

// Bytes of storages freed while a fused recording holds their buffers as
// parameters: still on the device until the recording runs.
std::mutex g_held_mu;
std::vector<std::pair<int, int64_t>> g_held;  // (device, bytes)

void DeleteStorage(void* ctx) {
  auto* s = static_cast<DeviceStorage*>(ctx);
  runtime::launch_queue::Forget(s);  // a queued launch that writes it writes a scratch storage
  bool held = ForgetStorage(s);
  if (Runtime::IsInitialized()) {  // also in a forked child: counters only
    auto& m = Runtime::Get().memory(s->device);
    int64_t bytes = static_cast<int64_t>(s->nbytes) + s->padding_bytes();
    if (held) {
      std::lock_guard<std::mutex> lock(g_held_mu);
      g_held.emplace_back(s->device, bytes);
    } else {
      m.allocated -= bytes;
    }
    ++m.num_frees;
  }
  delete s;
}

// Fused eager: a storage allocated while calls are recorded has no device
// buffer until the recording runs, and one freed before then never gets
// one (the recorder drops it from the chain's results; XLA keeps such a
// value in registers or a temporary of the chain). Its bytes are counted
// when the recording has run or the counters are read
// (SettleDeferredStorages), so memory_allocated counts buffers that exist
// or will exist, not values that died inside a fused chain.
std::mutex g_deferred_mu;
std::unordered_set<DeviceStorage*> g_deferred;  // allocated while recording, not counted yet

void DeleteDeferredStorage(void* ctx) {
  auto* s = static_cast<DeviceStorage*>(ctx);
  bool counted;
  {
    std::lock_guard<std::mutex> lock(g_deferred_mu);
    counted = g_deferred.erase(s) == 0;
  }
  if (counted) return DeleteStorage(ctx);
  bool held = ForgetStorage(s);  // a buffer it got by a transfer, read by the recording
  if (Runtime::IsInitialized()) {  // padding is counted as it is set (runtime.cpp)
    auto& m = Runtime::Get().memory(s->device);
    if (held) {
      m.allocated += static_cast<int64_t>(s->nbytes);
      m.peak = std::max(m.peak, m.allocated);
      std::lock_guard<std::mutex> lock(g_held_mu);
      g_held.emplace_back(s->device, static_cast<int64_t>(s->nbytes) + s->padding_bytes());
    } else {
      m.allocated -= s->padding_bytes();
    }
    ++m.num_frees;
  }
  delete s;
}

// A DeviceAllocator, so torch.accelerator.memory_* work: storages free their
// buffers when released, nothing is cached.
class TpuAllocator final : public c10::DeviceAllocator {
 public:
  at::DataPtr allocate(size_t nbytes) override {
    int device = CurrentDevice();
    auto* s = new DeviceStorage();
    s->device = device;
    s->nbytes = nbytes;
    auto& m = GetRuntime().memory(device);
    ++m.num_allocs;
    bool defer = Recording();
    if (defer) {
      std::lock_guard<std::mutex> lock(g_deferred_mu);
      g_deferred.insert(s);
    } else {
      m.allocated += static_cast<int64_t>(nbytes);
      m.peak = std::max(m.peak, m.allocated);
    }
    uint64_t addr = g_next_address.fetch_add((nbytes + 511) / 256 * 256);
    return {reinterpret_cast<void*>(addr), s, defer ? &DeleteDeferredStorage : &DeleteStorage,
            at::Device(at::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device))};
  }
  at::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void*, const void*, std::size_t) const override {
    TORCH_CHECK(false, "tpu storage bytes cannot be copied on the host; use tensor.copy_()");
  }
  bool initialized() override { return Runtime::IsInitialized(); }
  void emptyCache(c10::MempoolId_t) override {}
  void recordStream(const c10::DataPtr&, c10::Stream) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    SettleDeferredStorages();
    const auto& m = GetRuntime().memory(device);
    c10::CachingDeviceAllocator::DeviceStats stats;
    for (auto* array : {&stats.allocated_bytes, &stats.reserved_bytes, &stats.active_bytes,
                        &stats.requested_bytes}) {
      auto& all = (*array)[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
      all.current = m.allocated;
      all.peak = m.peak;
    }
    auto& n = stats.allocation[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
    n.current = m.num_allocs - m.num_frees;
    n.allocated = m.num_allocs;
    n.freed = m.num_frees;
    stats.num_device_alloc = m.num_allocs;
    stats.num_device_free = m.num_frees;
    return stats;
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    auto& m = GetRuntime().memory(device);
    m.num_allocs = m.num_frees = 0;
  }
  void resetPeakStats(c10::DeviceIndex device) override {
    SettleDeferredStorages();
    auto& m = GetRuntime().memory(device);
    m.peak = m.allocated;
  }
};

TpuAllocator g_allocator;

}  // namespace

c10::DeviceAllocator* DeviceAllocator() { return &g_allocator; }

void SettleDeferredStorages() {
  std::unordered_set<DeviceStorage*> settled;
  {
    std::lock_guard<std::mutex> lock(g_deferred_mu);
    if (g_deferred.empty()) return;
    settled.swap(g_deferred);
  }
  auto& rt = GetRuntime();
  for (DeviceStorage* s : settled)
    rt.memory(s->device).allocated += static_cast<int64_t>(s->nbytes);
  for (DeviceStorage* s : settled) {
    auto& m = rt.memory(s->device);
    m.peak = std::max(m.peak, m.allocated);
  }
}


void ReleaseRecordingBuffers() {
  std::vector<std::pair<int, int64_t>> held;
  {
    std::lock_guard<std::mutex> lock(g_held_mu);
    held.swap(g_held);
  }
  for (const auto& [device, bytes] : held) GetRuntime().memory(device).allocated -= bytes;
}

}  // namespace torch_tpu::aten
