// The device storage behind a tpu tensor: its view geometry, its buffer
// (created as zeros, reinterpreted for another dtype, resized), all through
// the one launcher.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_set>

#include "aten/storage_module.h"
#include "aten/tpu.h"
#include "runtime/launch_queue.h"
#include "runtime/launcher.h"

namespace torch_tpu::aten {

using runtime::DeviceStorage;

void RunStorageModule(const std::string& op, const std::string& key, int device,
                      const std::function<std::string()>& build, const DeviceStorage* in,
                      DeviceStorage* out, std::optional<hlo::ElementType> out_type) {
  auto& rt = GetRuntime();
  auto exe = rt.GetOrCompile(key, device, build);
  runtime::Launch launch;
  launch.exe = exe.get();
  launch.device = device;
  launch.op = &op;
  if (in) launch.params = {runtime::LaunchParam::Of(in->buffer)};
  launch.results = {out};
  if (out_type) launch.result_types = {*out_type};
  runtime::Run(rt, launch);
}

namespace {

// Whether a fresh storage of `key`'s type and size was zero-filled before.
bool SeenBefore(const std::string& key) {
  static std::mutex mu;
  static auto* seen = new std::unordered_set<std::string>();
  std::lock_guard<std::mutex> lock(mu);
  if (seen->count(key)) return true;
  if (seen->size() >= 4096) seen->clear();  // sizes that never repeat
  seen->insert(key);
  return false;
}

}  // namespace

// A fresh storage's zeros, without an executable per size, so that a new
// shape of a fresh tensor (torch.ones(n), x.to(dtype)) compiles nothing:
// up to 64 KiB always uploaded from host zeros (a copy that costs about what
// a launch does); up to 64 MiB uploaded the first time a size is seen, its
// one-op module run from the second (cached: no host copy per call); past
// that the module always runs.
void ZeroFill(DeviceStorage* s) {
  hlo::ElementType t = s->dtype;
  int64_t numel = s->numel();
  std::string key = std::string("zeros|") + hlo::Name(t) + "|" + std::to_string(numel);
  constexpr size_t kAlwaysUpload = size_t{64} << 10, kMaxUpload = size_t{64} << 20;
  if (s->nbytes <= kAlwaysUpload || (s->nbytes <= kMaxUpload && !SeenBefore(key))) {
    std::unique_ptr<void, decltype(&std::free)> zeros(std::calloc(std::max<size_t>(s->nbytes, 1), 1), &std::free);
    TORCH_CHECK(zeros, "tpu: cannot allocate ", s->nbytes, " bytes of host zeros");
    s->Set(GetRuntime().Upload(zeros.get(), t, {numel}, s->device));
    return;
  }
  static const std::string op = "zeros";
  RunStorageModule(op, key, s->device, [&] {
    hlo::Builder b("zeros");
    b.Return({b.Splat(t, 0, {numel})});
    return b.ToText();
  }, nullptr, s);
}

void GiveBufferToOverwrite(DeviceStorage* s, hlo::ElementType t) {
  if (s->buffer || s->pending() || s->queued || s->nbytes % hlo::ByteSize(t) != 0) return;
  pjrt::BufferPtr b = GetRuntime().Uninitialized(t, {static_cast<int64_t>(s->nbytes / hlo::ByteSize(t))}, s->device);
  if (!b) return;  // PrepareStorage zero-fills it
  s->dtype = t;
  s->Set(std::move(b));
}

namespace {
thread_local bool t_queued_call = false;
}  // namespace

QueuedCallScope::QueuedCallScope() : previous_(t_queued_call) { t_queued_call = true; }
QueuedCallScope::~QueuedCallScope() { t_queued_call = previous_; }
bool QueuedCallScope::Open() { return t_queued_call; }

void DrainLaunches() {
  if (runtime::launch_queue::Busy()) runtime::launch_queue::Drain(GetRuntime());
}

DeviceStorage* StorageOf(const at::Tensor& t) {
  // Outside a queued call, a storage a queued launch writes is read only
  // once that launch has run.
  if (runtime::launch_queue::Busy() && !t_queued_call) runtime::launch_queue::Drain(GetRuntime());
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

bool ReinterpretComplexStorage(DeviceStorage* s, hlo::ElementType t);  // complex.cpp

// The real elements of a padded storage, packed, as a CPU tensor.
at::Tensor RealElements(const DeviceStorage& s) {
  auto opts = at::TensorOptions().dtype(ToScalarType(s.dtype));
  at::Tensor padded = at::empty(s.padded_shape, opts);
  GetRuntime().Download(*s.buffer, padded.data_ptr(), padded.nbytes());
  at::Tensor v = padded;
  for (size_t d = 0; d < s.real_shape.size(); ++d)
    v = v.narrow(static_cast<int64_t>(d), 0, s.real_shape[d]);
  return v.contiguous();
}

// On the device: the reader (a fused chain, a compiled graph, a jax_op, a
// dtype view) compiles for this exact shape anyway, and a host round trip
// would stall the queue on every call.
void CompactStorage(DeviceStorage* s) {
  if (!s->padded()) return;
  if (s->real_shape == s->padded_shape) return s->Set(s->buffer);  // sizes at their bucket: no padding
  hlo::ElementType t = s->dtype;
  std::string key = std::string("compact|") + hlo::Name(t) + "|" + hlo::Ints(s->real_shape) + "|" +
                    hlo::Ints(s->padded_shape);
  static const std::string op = "compact padded storage";
  RunStorageModule(op, key, s->device, [&] {
    hlo::Builder b("compact");
    hlo::Value x = b.Reshape(b.Parameter({t, {s->buffer_numel()}}), s->padded_shape);
    std::vector<int64_t> start(s->real_shape.size(), 0), step(s->real_shape.size(), 1);
    b.Return({b.Reshape(b.Slice(x, start, s->real_shape, step), {s->numel()})});
    return b.ToText();
  }, s, s);
}

void DownloadStorage(const DeviceStorage& s, void* dst) {
  if (!s.padded() || s.real_shape == s.padded_shape) return GetRuntime().Download(*s.buffer, dst, s.nbytes);
  std::memcpy(dst, RealElements(s).data_ptr(), s.nbytes);
}

void PrepareStorage(DeviceStorage* s, hlo::ElementType t, bool keep_capacity) {
  if (s->pending()) FlushPending();
  if (s->queued) {
    // A queued launch writes it (a plain array of its dtype): a call queued
    // after it reads that value; anything else waits for it.
    if (s->dtype == t && !s->padded() && QueuedCallScope::Open()) return;
    DrainLaunches();
  }
  if (s->padded() && (!keep_capacity || s->dtype != t)) CompactStorage(s);
  if (s->buffer && s->dtype == t) return;
  if (!s->buffer) {
    TORCH_CHECK(s->nbytes % hlo::ByteSize(t) == 0, "tpu storage of ", s->nbytes,
                " bytes cannot hold elements of ", hlo::Name(t));
    s->dtype = t;
    ZeroFill(s);
    return;
  }
  // A complex storage seen as its real parts (view_as_real) or back: on the
  // device (complex.cpp).
  if (ReinterpretComplexStorage(s, t)) return;
  // Reinterpreting bytes (tensor.view(dtype)): go through the host.
  std::vector<char> bytes(s->nbytes);
  GetRuntime().Download(*s->buffer, bytes.data(), bytes.size());
  TORCH_CHECK(s->nbytes % hlo::ByteSize(t) == 0, "tpu storage of ", s->nbytes,
              " bytes cannot hold elements of ", hlo::Name(t));
  s->dtype = t;
  s->Set(GetRuntime().Upload(bytes.data(), t, {static_cast<int64_t>(s->nbytes / hlo::ByteSize(t))},
                             s->device));
}

// Replaces the storage's bytes by `newsize` bytes, keeping the common prefix.
// An empty storage (an out= tensor's, resized by the op) has no prefix to
// keep: the fresh storage is all there is (zero-filled if read before
// written), so no module per size runs (arange.out compiled a resize per
// new length).
void ResizeStorage(const c10::Storage& storage, size_t newsize) {
  FlushPending();
  auto* old = static_cast<DeviceStorage*>(storage.data_ptr().get_context());
  c10::DeviceGuard guard(storage.device());
  at::DataPtr fresh = DeviceAllocator()->allocate(newsize);
  auto* s = static_cast<DeviceStorage*>(fresh.get_context());
  if (old && old->buffer && old->nbytes > 0 && newsize > 0) {
    hlo::ElementType t = old->dtype;
    int64_t old_n = old->numel(), new_n = static_cast<int64_t>(newsize / hlo::ByteSize(t));
    if (newsize % hlo::ByteSize(t) != 0) t = hlo::ElementType::U8;
    PrepareStorage(old, t);
    old_n = old->numel();
    new_n = static_cast<int64_t>(newsize / hlo::ByteSize(t));
    std::string key = std::string("resize|") + hlo::Name(t) + "|" + std::to_string(old_n) +
                      "|" + std::to_string(new_n);
    static const std::string op = "resize_";
    RunStorageModule(op, key, old->device, [&] {
      hlo::Builder b("resize");
      hlo::Value x = b.Parameter({t, {old_n}});
      hlo::Value y = new_n <= old_n ? b.Slice(x, {0}, {new_n}, {1})
                                    : b.Pad(x, b.Constant(t, 0), {0}, {new_n - old_n}, {0});
      b.Return({y});
      return b.ToText();
    }, old, s, t);
  }
  storage.unsafeGetStorageImpl()->set_data_ptr_noswap(std::move(fresh));
  storage.unsafeGetStorageImpl()->set_nbytes(newsize);
}

}  // namespace torch_tpu::aten
