// The device guard: the current tpu device (per thread), streams (one
// in-order stream per device) and timing events.
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <chrono>

#include "aten/tpu.h"

namespace torch_tpu::aten {

namespace {
thread_local int t_current_device = 0;
}  // namespace

int CurrentDevice() { return t_current_device; }

void SetCurrentDevice(int device) {
  TORCH_CHECK(device >= 0 && device < GetRuntime().device_count(), "Invalid device index tpu:",
              device, " (", GetRuntime().device_count(), " tpu devices available)");
  t_current_device = device;
}

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

}  // namespace

}  // namespace torch_tpu::aten
