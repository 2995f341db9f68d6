// The "tpu" device for PyTorch: allocator, device guard, hooks, generator,
// factories, native views, copies, the CPU fallback and the Python module.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/Event.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/extension.h>
#include <torch/library.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <typeinfo>
#include <unordered_set>

#include "aten/profiler.h"
#include "aten/tpu.h"

namespace torch_tpu::aten {

using runtime::DeviceStorage;
using runtime::Runtime;

// ------------------------------------------------------------------ runtime

namespace {
std::string g_plugin_path;
int g_cpu_devices = 1;
thread_local int t_current_device = 0;
}  // namespace

void ConfigurePlugin(const std::string& path, int cpu_devices) {
  g_plugin_path = path;
  g_cpu_devices = cpu_devices;
}

Runtime& GetRuntime() {
  if (!Runtime::IsInitialized()) {
    TORCH_CHECK(!g_plugin_path.empty(),
                "torch_tpu: no PJRT plugin configured. Install xla-cpu-pjrt or set "
                "TORCH_TPU_PLUGIN to cpu, cuda, tpu or a plugin path");
    try {
      Runtime::Initialize(g_plugin_path, g_cpu_devices);
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "torch_tpu: ", e.what());
    }
  }
  return Runtime::Get();
}

int CurrentDevice() { return t_current_device; }
void SetCurrentDevice(int device) {
  TORCH_CHECK(device >= 0 && device < GetRuntime().device_count(), "Invalid device index tpu:",
              device, " (", GetRuntime().device_count(), " tpu devices available)");
  t_current_device = device;
}

hlo::ElementType ToElementType(at::ScalarType t, const char* op) {
  using E = hlo::ElementType;
  switch (t) {
    case at::kBool: return E::Bool;
    case at::kChar: return E::I8;
    case at::kShort: return E::I16;
    case at::kInt: return E::I32;
    case at::kLong: return E::I64;
    case at::kByte: return E::U8;
    case at::kUInt16: return E::U16;
    case at::kUInt32: return E::U32;
    case at::kUInt64: return E::U64;
    case at::kHalf: return E::F16;
    case at::kBFloat16: return E::BF16;
    case at::kFloat: return E::F32;
    case at::kDouble: return E::F64;
    case at::kFloat8_e4m3fn: return E::F8E4M3FN;
    case at::kFloat8_e5m2: return E::F8E5M2;
    default:
      throw lowering::Unsupported(std::string(op) + ": dtype " + c10::toString(t) +
                                  " has no native tpu representation");
  }
}

at::ScalarType ToScalarType(hlo::ElementType t) {
  using E = hlo::ElementType;
  switch (t) {
    case E::Bool: return at::kBool;
    case E::I8: return at::kChar;
    case E::I16: return at::kShort;
    case E::I32: return at::kInt;
    case E::I64: return at::kLong;
    case E::U8: return at::kByte;
    case E::U16: return at::kUInt16;
    case E::U32: return at::kUInt32;
    case E::U64: return at::kUInt64;
    case E::F16: return at::kHalf;
    case E::BF16: return at::kBFloat16;
    case E::F32: return at::kFloat;
    case E::F64: return at::kDouble;
    case E::F8E4M3FN: return at::kFloat8_e4m3fn;
    case E::F8E5M2: return at::kFloat8_e5m2;
  }
  return at::kFloat;
}

void RecordFallback(const std::string& op) { ++GetRuntime().stats().fallbacks[op]; }

// ------------------------------------------------------------------ allocator

namespace {

// Addresses handed out as data pointers: unique per storage, never
// dereferenced, in a range no host allocation uses.
std::atomic<uint64_t> g_next_address{0x7e0000000000ULL};

void DeleteStorage(void* ctx) {
  auto* s = static_cast<DeviceStorage*>(ctx);
  ForgetStorage(s);
  if (Runtime::IsInitialized()) {
    auto& m = Runtime::Get().memory(s->device);
    m.allocated -= static_cast<int64_t>(s->nbytes);
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
    m.allocated += static_cast<int64_t>(nbytes);
    m.peak = std::max(m.peak, m.allocated);
    ++m.num_allocs;
    uint64_t addr = g_next_address.fetch_add((nbytes + 511) / 256 * 256);
    return {reinterpret_cast<void*>(addr), s, &DeleteStorage,
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
    auto& m = GetRuntime().memory(device);
    m.peak = m.allocated;
  }
};

TpuAllocator g_allocator;

}  // namespace

DeviceStorage* StorageOf(const at::Tensor& t) {
  auto* s = static_cast<DeviceStorage*>(t.storage().data_ptr().get_context());
  TORCH_CHECK(s != nullptr, "tensor on ", t.device(), " has no tpu storage");
  return s;
}

lowering::ViewGeometry GeometryOf(const at::Tensor& t) {
  lowering::ViewGeometry g;
  g.sizes = t.sizes().vec();
  g.strides = t.strides().vec();
  int64_t itemsize = static_cast<int64_t>(t.element_size());
  g.storage_numel = static_cast<int64_t>(t.storage().nbytes()) / itemsize;
  g.whole = t.storage_offset() == 0 && t.is_contiguous() && t.numel() == g.storage_numel;
  return g;
}

void PrepareStorage(DeviceStorage* s, hlo::ElementType t) {
  if (s->pending) FlushPending();
  if (s->buffer && s->dtype == t) return;
  if (!s->buffer) {
    TORCH_CHECK(s->nbytes % hlo::ByteSize(t) == 0, "tpu storage of ", s->nbytes,
                " bytes cannot hold elements of ", hlo::Name(t));
    s->dtype = t;
    s->buffer = GetRuntime().Zeros(t, static_cast<int64_t>(s->nbytes / hlo::ByteSize(t)),
                                   s->device);
    return;
  }
  // Reinterpreting bytes (tensor.view(dtype)): go through the host.
  std::vector<char> bytes(s->nbytes);
  GetRuntime().Download(*s->buffer, bytes.data(), bytes.size());
  TORCH_CHECK(s->nbytes % hlo::ByteSize(t) == 0, "tpu storage of ", s->nbytes,
              " bytes cannot hold elements of ", hlo::Name(t));
  s->dtype = t;
  s->buffer = GetRuntime().Upload(bytes.data(), t,
                                  {static_cast<int64_t>(s->nbytes / hlo::ByteSize(t))}, s->device);
}

// ------------------------------------------------------------------ guard

namespace {

struct TimingEvent {
  double time_ms = 0;
};

double NowMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct TpuGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;
  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    if (d.index() != old.index()) setDevice(d);
    return old;
  }
  c10::Device getDevice() const override {
    return c10::Device(kType, static_cast<c10::DeviceIndex>(CurrentDevice()));
  }
  void setDevice(c10::Device d) const override {
    if (d.index() >= 0) SetCurrentDevice(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0) t_current_device = d.index();
  }
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream getDefaultStream(c10::Device d) const override { return getStream(d); }
  c10::Stream getNewStream(c10::Device d, int) const override { return getStream(d); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override { return getStream(d); }
  c10::Stream exchangeStream(c10::Stream s) const override { return s; }
  c10::DeviceIndex deviceCount() const noexcept override {
    try {
      return static_cast<c10::DeviceIndex>(GetRuntime().device_count());
    } catch (...) {
      return 0;
    }
  }
  // Events are points in the single in-order stream of each device: record
  // waits for the work issued so far, so elapsed times measure device work.
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex,
              const c10::EventFlag) const override {
    if (*event == nullptr) *event = new TimingEvent();
    FlushPending();
    GetRuntime().Synchronize(stream.device_index());
    static_cast<TimingEvent*>(*event)->time_ms = NowMs();
  }
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<TimingEvent*>(event);
  }
  void synchronizeEvent(void*) const override {}
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    TORCH_CHECK(start && end, "elapsed_time: both events must be recorded first");
    return static_cast<TimingEvent*>(end)->time_ms - static_cast<TimingEvent*>(start)->time_ms;
  }
  void synchronizeDevice(const c10::DeviceIndex d) const override {
    FlushPending();
    GetRuntime().Synchronize(d);
  }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream& s) const override {
    FlushPending();
    GetRuntime().Synchronize(s.device_index());
  }
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, TpuGuardImpl);

// ------------------------------------------------------------------ generator

struct TpuGenerator final : public c10::GeneratorImpl {
  explicit TpuGenerator(c10::DeviceIndex device)
      : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, device),
                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)) {}
  void set_current_seed(uint64_t seed) override {
    seed_ = seed;
    offset_ = 0;
  }
  void set_offset(uint64_t offset) override { offset_ = offset; }
  uint64_t get_offset() const override { return offset_; }
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override {
    uint64_t s = c10::detail::getNonDeterministicRandom();
    set_current_seed(s);
    return s;
  }
  // State: 16 bytes, seed then offset, as a CPU uint8 tensor.
  void set_state(const c10::TensorImpl& state) override {
    TORCH_CHECK(state.numel() == 16 && state.dtype() == at::kByte,
                "tpu RNG state must be a uint8 tensor of 16 bytes");
    const auto* p = static_cast<const uint8_t*>(state.data());
    std::memcpy(&seed_, p, 8);
    std::memcpy(&offset_, p + 8, 8);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    auto t = at::empty({16}, at::kByte);
    std::memcpy(t.data_ptr(), &seed_, 8);
    std::memcpy(static_cast<uint8_t*>(t.data_ptr()) + 8, &offset_, 8);
    return t.getIntrusivePtr();
  }
  TpuGenerator* clone_impl() const override {
    auto* g = new TpuGenerator(device().index());
    g->seed_ = seed_;
    g->offset_ = offset_;
    return g;
  }
  uint64_t seed_ = 67280421310721ULL;
  uint64_t offset_ = 0;
};

std::vector<at::Generator>& DefaultGenerators() {
  static std::vector<at::Generator> gens = [] {
    std::vector<at::Generator> v;
    int n = GetRuntime().device_count();
    for (int i = 0; i < n; ++i)
      v.push_back(at::make_generator<TpuGenerator>(static_cast<c10::DeviceIndex>(i)));
    return v;
  }();
  return gens;
}

}  // namespace

std::pair<uint64_t, uint64_t> NextRngState(const std::optional<at::Generator>& gen, int device,
                                           uint64_t increment) {
  at::Generator g = gen.has_value() && gen->defined() ? *gen : DefaultGenerators().at(device);
  auto* impl = dynamic_cast<TpuGenerator*>(g.unsafeGetGeneratorImpl());
  TORCH_CHECK(impl != nullptr, "Expected a 'tpu' generator, got one for ", g.device());
  std::lock_guard<std::mutex> lock(g.mutex());
  auto state = std::make_pair(impl->seed_, impl->offset_);
  impl->offset_ += increment;
  return state;
}

// ------------------------------------------------------------------ hooks

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
    int idx = d < 0 ? CurrentDevice() : d;
    return DefaultGenerators().at(idx);
  }
  at::Generator getNewGenerator(c10::DeviceIndex d) const override {
    return at::make_generator<TpuGenerator>(d < 0 ? CurrentDevice() : d);
  }
  at::Device getDeviceFromPtr(void*) const override {
    return at::Device(c10::DeviceType::PrivateUse1, CurrentDevice());
  }
  bool isPinnedPtr(const void* p) const override { return IsPinned(p); }
  at::Allocator* getPinnedMemoryAllocator() const override { return &g_pinned_allocator; }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override;
};

}  // namespace

// ------------------------------------------------------------------ resize

namespace {

// Replaces the storage's bytes by `newsize` bytes, keeping the common prefix.
void ResizeStorage(const c10::Storage& storage, size_t newsize) {
  FlushPending();
  auto* old = static_cast<DeviceStorage*>(storage.data_ptr().get_context());
  c10::DeviceGuard guard(storage.device());
  at::DataPtr fresh = g_allocator.allocate(newsize);
  auto* s = static_cast<DeviceStorage*>(fresh.get_context());
  if (old && old->buffer && newsize > 0) {
    hlo::ElementType t = old->dtype;
    int64_t old_n = old->numel(), new_n = static_cast<int64_t>(newsize / hlo::ByteSize(t));
    if (newsize % hlo::ByteSize(t) != 0) t = hlo::ElementType::U8;
    PrepareStorage(old, t);
    old_n = old->numel();
    new_n = static_cast<int64_t>(newsize / hlo::ByteSize(t));
    auto& rt = GetRuntime();
    std::string key = std::string("resize|") + hlo::Name(t) + "|" + std::to_string(old_n) +
                      "|" + std::to_string(new_n);
    auto exe = rt.GetOrCompile(key, old->device, [&] {
      hlo::Builder b("resize");
      hlo::Value x = b.Parameter({t, {old_n}});
      hlo::Value y = new_n <= old_n ? b.Slice(x, {0}, {new_n}, {1})
                                    : b.Pad(x, b.Constant(t, 0), {0}, {new_n - old_n}, {0});
      b.Return({y});
      return b.ToText();
    });
    s->dtype = t;
    s->buffer = rt.Execute(*exe, {old->buffer->raw()}, {0}, "resize_")[0];
  }
  storage.unsafeGetStorageImpl()->set_data_ptr_noswap(std::move(fresh));
  storage.unsafeGetStorageImpl()->set_nbytes(newsize);
}

void TpuHooks::resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const {
  ResizeStorage(storage, newsize);
}

}  // namespace

// ------------------------------------------------------------------ factories and views

namespace {

at::Tensor EmptyMemoryFormat(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                             std::optional<at::Layout>, std::optional<at::Device> device,
                             std::optional<bool>, std::optional<at::MemoryFormat> memory_format) {
  c10::OptionalDeviceGuard guard(device);
  GetRuntime();
  return at::detail::empty_generic(size, &g_allocator,
                                   c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor EmptyStrided(c10::IntArrayRef size, c10::IntArrayRef stride,
                        std::optional<at::ScalarType> dtype, std::optional<at::Layout>,
                        std::optional<at::Device> device, std::optional<bool>) {
  c10::OptionalDeviceGuard guard(device);
  GetRuntime();
  return at::detail::empty_strided_generic(size, stride, &g_allocator,
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

at::Tensor AsStrided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                     std::optional<c10::SymInt> offset) {
  return at::native::as_strided_tensorimpl(
      self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride),
      offset.has_value() ? std::optional<int64_t>(offset->expect_int()) : std::nullopt);
}

at::Tensor View(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor ReshapeAlias(const at::Tensor& self, c10::SymIntArrayRef size,
                        c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size),
                                    C10_AS_INTARRAYREF_SLOW(stride));
}

const at::Tensor& Resize(const at::Tensor& self, c10::SymIntArrayRef size,
                         std::optional<at::MemoryFormat> memory_format) {
  auto sizes = C10_AS_INTARRAYREF_SLOW(size);
  auto* impl = self.unsafeGetTensorImpl();
  int64_t itemsize = static_cast<int64_t>(self.element_size());
  impl->set_sizes_contiguous(sizes);
  if (memory_format.has_value() && *memory_format != at::MemoryFormat::Preserve)
    impl->empty_tensor_restride(*memory_format);
  size_t needed = static_cast<size_t>(
      (at::detail::computeStorageNbytes(self.sizes(), self.strides(), itemsize,
                                        self.storage_offset())));
  if (needed > self.storage().nbytes()) ResizeStorage(self.storage(), needed);
  return self;
}

at::Tensor& SetSourceStorage(at::Tensor& self, at::Storage source) {
  int64_t n = static_cast<int64_t>(source.nbytes() / self.element_size());
  return at::native::set_storage_cpu_(self, source, 0, {n}, {});
}

at::Tensor& SetSourceStorageOffset(at::Tensor& self, at::Storage source, c10::SymInt offset,
                                   c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::native::set_storage_cpu_(self, source, offset.expect_int(),
                                      C10_AS_INTARRAYREF_SLOW(size),
                                      C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor& SetSourceTensor(at::Tensor& self, const at::Tensor& source) {
  return at::native::set_tensor_(self, source);
}

at::Tensor& SetEmpty(at::Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, &g_allocator, true);
  return at::native::set_storage_cpu_(self, storage, 0, {0}, {});
}

// ------------------------------------------------------------------ copies

// The tensor's values as a contiguous CPU tensor.
at::Tensor ToCpu(const at::Tensor& src) {
  FlushPending();
  at::Tensor s = src;
  auto* storage = StorageOf(s);
  hlo::ElementType t = ToElementType(s.scalar_type(), "copy to cpu");
  lowering::ViewGeometry g = GeometryOf(s);
  if (!g.whole) {
    at::Tensor dense = at::empty(s.sizes(), s.options());
    RunInto("_tpu_copy", {s}, dense);
    return ToCpu(dense);
  }
  at::Tensor out = at::empty(s.sizes(), s.options().device(at::kCPU));
  if (s.numel() == 0) return out;
  PrepareStorage(storage, t);
  GetRuntime().Download(*storage->buffer, out.data_ptr(), out.nbytes());
  return out;
}

void FromCpu(const at::Tensor& src, const at::Tensor& dst) {
  FlushPending();
  if (dst.numel() == 0) return;
  c10::DeviceGuard guard(dst.device());
  at::Tensor host = src.to(dst.scalar_type()).expand(dst.sizes()).contiguous();
  hlo::ElementType t = ToElementType(dst.scalar_type(), "copy to tpu");
  auto* storage = StorageOf(dst);
  lowering::ViewGeometry g = GeometryOf(dst);
  if (g.whole) {
    storage->dtype = t;
    storage->buffer = GetRuntime().Upload(host.data_ptr(), t, {host.numel()}, storage->device);
    return;
  }
  // Upload into a dense temporary, then write it through the view.
  at::Tensor tmp = at::empty(dst.sizes(), dst.options());
  FromCpu(host, tmp);
  RunInto("_tpu_copy", {tmp}, dst);
}

at::Tensor CopyFrom(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  bool src_tpu = self.device().type() == c10::DeviceType::PrivateUse1;
  bool dst_tpu = dst.device().type() == c10::DeviceType::PrivateUse1;
  // The checks TensorIterator makes for a CPU copy_.
  if (dst_tpu) at::assert_no_internal_overlap(dst);
  if (src_tpu && dst_tpu) at::assert_no_partial_overlap(dst, self);
  try {
    if (src_tpu && dst_tpu) {
      if (self.device() == dst.device()) {
        RunInto("_tpu_copy", {self}, dst);
      } else {
        FromCpu(ToCpu(self), dst);
      }
    } else if (src_tpu) {
      dst.copy_(ToCpu(self));
    } else if (dst_tpu) {
      FromCpu(self, dst);
    } else {
      TORCH_CHECK(false, "tpu _copy_from called with no tpu tensor");
    }
  } catch (const lowering::Unsupported& e) {
    TORCH_CHECK(false, "copy_: ", e.what());
  } catch (const pjrt::Error& e) {
    TORCH_CHECK(false, "copy_: ", e.what());
  } catch (const std::out_of_range& e) {  // a failed device-side assertion
    TORCH_CHECK_INDEX(false, e.what());
  }
  return dst;
}

at::Tensor CopyFromAndResize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) dst.resize_(self.sizes());
  return CopyFrom(self, dst, false);
}

at::Scalar LocalScalarDense(const at::Tensor& self) {
  try {
    return ToCpu(self).item();
  } catch (const std::out_of_range& e) {  // a failed device-side assertion
    TORCH_CHECK_INDEX(false, e.what());
  }
}

// ------------------------------------------------------------------ fallback

void Fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  std::string name = schema.name().substr(schema.name().find("::") + 2);
  RecordFallback(schema.overload_name().empty() ? name : name + "." + schema.overload_name());
  CpuFallback(op, stack);
}

uint64_t SplitMix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

// Random ops run on the CPU draw from a CPU generator derived from the tpu
// generator's (seed, offset), which advances: torch.manual_seed,
// torch.tpu.get/set_rng_state and tpu Generators govern them.
void CpuFallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  size_t n = args.size();
  auto first = stack->end() - static_cast<std::ptrdiff_t>(n);
  int device = -1;
  int64_t numel = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!first[i].isTensor()) continue;
    const at::Tensor& t = first[i].toTensor();
    if (!t.defined() || t.device().type() != c10::DeviceType::PrivateUse1) continue;
    if (device < 0) device = t.device().index();
    numel = std::max<int64_t>(numel, t.numel());
  }
  if (device < 0) device = CurrentDevice();
  for (size_t i = 0; i < n; ++i) {
    c10::TypePtr type = args[i].real_type();
    if (type->kind() == c10::TypeKind::OptionalType)
      type = type->castRaw<c10::OptionalType>()->getElementType();
    if (type->kind() != c10::TypeKind::GeneratorType) continue;
    std::optional<at::Generator> gen;
    if (first[i].isGenerator()) {
      gen = first[i].toGenerator();
      if (gen->defined() && gen->device().type() != c10::DeviceType::PrivateUse1) continue;
    }
    auto [seed, offset] = NextRngState(gen, device, static_cast<uint64_t>(numel) + 1);
    first[i] = at::detail::createCPUGenerator(SplitMix64(seed ^ SplitMix64(offset)));
  }
  at::native::cpu_fallback(op, stack);
}

// Whether `var.data = from` may shallow-copy `from` into `var`. PyTorch's own
// answer (TensorImpl::has_compatible_shallow_copy_type) knows the built-in
// dense backends only, so without this `module.to("tpu")` replaced every
// Parameter by a new one per module and untied shared (tied) weights. Plain
// strided tensors with a plain TensorImpl on cpu or tpu are compatible.
static bool HasCompatibleShallowCopyType(const at::Tensor& self, const at::Tensor& from) {
  if (self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set())) return true;
  auto plain = [](const at::Tensor& t) {
    const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    auto type = t.device().type();
    return typeid(*impl) == typeid(c10::TensorImpl) && t.layout() == c10::kStrided &&
           t.key_set().has(c10::DispatchKey::Dense) && !t.key_set().has(c10::DispatchKey::Python) &&
           (type == c10::DeviceType::CPU || type == c10::DeviceType::PrivateUse1);
  };
  return plain(self) && plain(from);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", HasCompatibleShallowCopyType);
  m.impl("empty.memory_format", EmptyMemoryFormat);
  m.impl("empty_strided", EmptyStrided);
  m.impl("as_strided", AsStrided);
  m.impl("view", View);
  m.impl("_reshape_alias", ReshapeAlias);
  m.impl("unfold", at::native::unfold);
  m.impl("resize_", Resize);
  m.impl("set_.source_Storage", SetSourceStorage);
  m.impl("set_.source_Storage_storage_offset", SetSourceStorageOffset);
  m.impl("set_.source_Tensor", SetSourceTensor);
  m.impl("set_", SetEmpty);
  m.impl("_copy_from", CopyFrom);
  m.impl("_copy_from_and_resize", CopyFromAndResize);
  m.impl("_local_scalar_dense", LocalScalarDense);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&Fallback>());
}

// ------------------------------------------------------------------ registration

namespace {
TpuHooks* g_hooks = nullptr;
}

void RegisterNativeRules();  // eager.cpp

void RegisterDevice() {
  static bool done = false;
  if (done) return;
  done = true;
  g_hooks = new TpuHooks();
  at::RegisterPrivateUse1HooksInterface(g_hooks);
  c10::SetAllocator(c10::DeviceType::PrivateUse1, &g_allocator);
  RegisterNativeRules();
}

}  // namespace torch_tpu::aten

// ------------------------------------------------------------------ python

namespace {

using torch_tpu::aten::GetRuntime;

py::dict Stats() {
  auto& s = GetRuntime().stats();
  py::dict d;
  d["compiles"] = s.compiles;
  d["cache_hits"] = s.cache_hits;
  d["executions"] = s.executions;
  d["compile_seconds"] = s.compile_seconds;
  d["transfers_to_device"] = s.transfers_to_device;
  d["transfers_to_host"] = s.transfers_to_host;
  d["fallbacks"] = s.fallbacks;
  d["native_ops"] = s.native_ops;
  d["cache_size"] = GetRuntime().cache_size();
  d["disk_hits"] = s.disk_hits;
  d["disk_misses"] = s.disk_misses;
  d["disk_prefetched"] = GetRuntime().prefetched();
  d["disk_cache_dir"] = GetRuntime().disk_cache_dir();
  return d;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch_tpu native core";
  torch_tpu::aten::RegisterGraphBindings(m.ptr());
  torch_tpu::aten::RegisterProfilerBindings(m.ptr());  // aten/profiler.h
  torch_tpu::aten::RegisterDistributedBindings(m.ptr());
  m.def("_register", &torch_tpu::aten::RegisterDevice);
  m.def("_configure", &torch_tpu::aten::ConfigurePlugin);
  m.def("_is_initialized", &torch_tpu::runtime::Runtime::IsInitialized);
  m.def("_device_count", [] { return GetRuntime().device_count(); });
  m.def("_platform", [] { return GetRuntime().platform(); });
  m.def("_plugin_path", [] { return GetRuntime().plugin_path(); });
  m.def("_build_identity", &torch_tpu::runtime::BuildIdentity);
  m.def("_platform_version", [] { return GetRuntime().client().platform_version(); });
  m.def("_device_kind", [](int d) { return GetRuntime().client().devices().at(d).kind; });
  // Index of the PJRT device holding a tpu tensor's buffer (-1: no buffer yet).
  m.def("_buffer_device", [](const at::Tensor& t) {
    TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1, "_buffer_device: not a tpu tensor");
    torch_tpu::aten::FlushPending();
    auto* s = torch_tpu::aten::StorageOf(t);
    if (!s->buffer) return -1;
    PJRT_Device* d = s->buffer->device();
    const auto& devices = GetRuntime().client().devices();
    for (size_t i = 0; i < devices.size(); ++i)
      if (devices[i].device == d) return static_cast<int>(i);
    return -2;
  });
  m.def("_api_version", [] {
    const auto& api = GetRuntime().client().api();
    return py::make_tuple(api.major_version(), api.minor_version());
  });
  m.def("_probe_plugin", [](const std::string& path) {
    try {
      auto api = torch_tpu::pjrt::Api::Load(path);
      return py::make_tuple(api->major_version(), api->minor_version());
    } catch (const std::exception& e) {
      throw std::runtime_error(e.what());
    }
  });
  m.def("_default_generator", [](int idx) {
    const at::Generator& gen = at::globalContext().defaultGenerator(
        c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(idx)));
    return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(gen));
  });
  // torch.Event.elapsed_time accepts only exact torch.Event instances;
  // torch.tpu.Event (a subclass) times through this.
  m.def("_event_elapsed_time", [](py::handle start, py::handle end) {
    TORCH_CHECK(THPEvent_Check(start.ptr()) && THPEvent_Check(end.ptr()),
                "elapsed_time: expected two torch.Event objects");
    auto* a = reinterpret_cast<THPEvent*>(start.ptr());
    auto* b = reinterpret_cast<THPEvent*>(end.ptr());
    return a->event.elapsedTime(b->event);
  });
  m.def("_flush", [] { torch_tpu::aten::FlushPending(); });
  m.def("_set_fusion", [](bool v) { torch_tpu::aten::SetFusion(v); });
  m.def("_fusion_enabled", [] { return torch_tpu::aten::FusionEnabled(); });
  m.def("_current_device", [] { return torch_tpu::aten::CurrentDevice(); });
  m.def("_set_device", [](int d) { torch_tpu::aten::SetCurrentDevice(d); });
  m.def("_synchronize", [](int d) {
    py::gil_scoped_release release;
    torch_tpu::aten::FlushPending();
    GetRuntime().Synchronize(d);
  });
  m.def("_stats", &Stats);
  m.def("_reset_stats", [] { GetRuntime().ResetStats(); });
  m.def("_clear_cache", [] { GetRuntime().ClearCache(); });
  m.def("_set_launch_blocking", [](bool v) { GetRuntime().set_launch_blocking(v); });
  m.def("_memory", [](int d) {
    auto& mem = GetRuntime().memory(d);
    py::dict r;
    r["allocated_bytes"] = mem.allocated;
    r["peak_allocated_bytes"] = mem.peak;
    r["num_allocs"] = mem.num_allocs;
    r["num_frees"] = mem.num_frees;
    return r;
  });
  m.def("_reset_peak", [](int d) {
    auto& mem = GetRuntime().memory(d);
    mem.peak = mem.allocated;
  });
  m.def("_native_ops", [] {
    std::vector<std::string> names;
    for (const auto* e : torch_tpu::lowering::AllRules()) names.push_back(e->name);
    return names;
  });
}
