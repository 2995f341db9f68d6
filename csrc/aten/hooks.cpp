// PyTorch's PrivateUse1 hooks for tpu (availability, device count and
// index, generators, pinned memory, storage resize) and the "pinned" host
// allocator.
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/impl/alloc_cpu.h>

#include <mutex>
#include <unordered_set>

#include "aten/tpu.h"

namespace torch_tpu::aten {

namespace {

// "Pinned" host memory: ordinary host memory (PJRT copies from any host
// buffer), remembered so that is_pinned() is true for what pin_memory() and
// empty(..., pin_memory=True) return. DDP's reducer asserts it
// (find_unused_parameters=True stages its used-parameter map through it).
// Leaked on purpose: tensors may be freed during static destruction.
std::mutex& g_pinned_mutex = *new std::mutex;
std::unordered_set<const void*>& g_pinned = *new std::unordered_set<const void*>;

void FreePinned(void* p) {
  {
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    g_pinned.erase(p);
  }
  c10::free_cpu(p);
}

class PinnedAllocator final : public at::Allocator {
 public:
  at::DataPtr allocate(size_t nbytes) override {
    void* p = nbytes ? c10::alloc_cpu(nbytes) : nullptr;
    if (p) {
      std::lock_guard<std::mutex> lock(g_pinned_mutex);
      g_pinned.insert(p);
    }
    return {p, p, &FreePinned, at::Device(at::kCPU)};
  }
  at::DeleterFnPtr raw_deleter() const override { return &FreePinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

PinnedAllocator g_pinned_allocator;

bool IsPinned(const void* p) {
  std::lock_guard<std::mutex> lock(g_pinned_mutex);
  return g_pinned.count(p) > 0;
}

struct TpuHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override {
    try {
      return GetRuntime().device_count() > 0;
    } catch (...) {
      return false;
    }
  }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override {
    return static_cast<c10::DeviceIndex>(GetRuntime().device_count());
  }
  void setCurrentDevice(c10::DeviceIndex d) const override { SetCurrentDevice(d); }
  c10::DeviceIndex getCurrentDevice() const override {
    return static_cast<c10::DeviceIndex>(CurrentDevice());
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    auto old = getCurrentDevice();
    SetCurrentDevice(d);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override {
    return exchangeDevice(d);
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex d) const override {
    return DefaultGenerator(d);
  }
  at::Generator getNewGenerator(c10::DeviceIndex d) const override { return NewGenerator(d); }
  at::Device getDeviceFromPtr(void*) const override {
    return at::Device(c10::DeviceType::PrivateUse1, CurrentDevice());
  }
  bool isPinnedPtr(const void* p) const override { return IsPinned(p); }
  at::Allocator* getPinnedMemoryAllocator() const override { return &g_pinned_allocator; }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    ResizeStorage(storage, newsize);
  }
};

}  // namespace

void RegisterHooks() {
  static TpuHooks* hooks = new TpuHooks();
  at::RegisterPrivateUse1HooksInterface(hooks);
}

}  // namespace torch_tpu::aten
