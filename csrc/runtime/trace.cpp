#include "runtime/trace.h"

#include <pjrt_c_api.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>

namespace torch_tpu::runtime::trace {

std::atomic<bool> g_enabled{false};

namespace {
std::mutex& CallbackMutex() {
  static auto* mu = new std::mutex();
  return *mu;
}
std::shared_ptr<Callback>& CurrentCallback() {
  static auto* cb = new std::shared_ptr<Callback>();
  return *cb;
}

constexpr int kMaxDevices = 64;
// Latest completion seen per device: an execution's device time starts no
// earlier (the device runs one program at a time, in launch order).
std::atomic<int64_t> g_last_end[kMaxDevices];
std::atomic<int64_t> g_in_flight{0};

struct Pending {
  std::string name;
  int device;
  int64_t launch_ns;
  const PJRT_Api* api;
  PJRT_Event* event;
};

void DestroyError(const PJRT_Api* api, PJRT_Error* error) {
  if (!error) return;
  PJRT_Error_Destroy_Args a{};
  a.struct_size = PJRT_Error_Destroy_Args_STRUCT_SIZE;
  a.error = error;
  api->PJRT_Error_Destroy(&a);
}

void OnReady(PJRT_Error* error, void* user_arg) {
  std::unique_ptr<Pending> p(static_cast<Pending*>(user_arg));
  int64_t end = NowNs();
  DestroyError(p->api, error);  // a failed execution is reported where it is awaited
  int64_t start = p->launch_ns;
  if (p->device >= 0 && p->device < kMaxDevices) {
    std::atomic<int64_t>& last = g_last_end[p->device];
    int64_t previous = last.load();
    while (previous < end && !last.compare_exchange_weak(previous, end)) {
    }
    start = std::max(start, std::min(previous, end));
  }
  Emit({Kind::Execute, std::move(p->name), p->device, std::min(start, end), end});
  PJRT_Event_Destroy_Args d{};
  d.struct_size = PJRT_Event_Destroy_Args_STRUCT_SIZE;
  d.event = p->event;
  p->api->PJRT_Event_Destroy(&d);
  --g_in_flight;
}

}  // namespace

int DeviceOf(const pjrt::Client& client, const pjrt::Buffer& buffer) {
  PJRT_Device* device = buffer.device();
  const auto& devices = client.devices();
  for (size_t i = 0; i < devices.size(); ++i)
    if (devices[i].device == device) return static_cast<int>(i);
  return -1;
}

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::Compile: return "compile";
    case Kind::Execute: return "execute";
    case Kind::ToDevice: return "to_device";
    case Kind::ToHost: return "to_host";
  }
  return "?";
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void SetCallback(Callback callback) {
  std::lock_guard<std::mutex> lock(CallbackMutex());
  CurrentCallback() = callback ? std::make_shared<Callback>(std::move(callback)) : nullptr;
  for (auto& t : g_last_end) t = 0;
  g_enabled = CurrentCallback() != nullptr;
}

void Emit(Span span) {
  std::shared_ptr<Callback> cb;
  {
    std::lock_guard<std::mutex> lock(CallbackMutex());
    cb = CurrentCallback();
  }
  if (cb) (*cb)(span);
}

void OnExecuted(const pjrt::Client& client, const std::string& name, int64_t launch_ns,
                const std::vector<pjrt::BufferPtr>& outputs) {
  if (!launch_ns || !Enabled()) return;
  if (outputs.empty()) {
    Emit({Kind::Execute, name, -1, launch_ns, NowNs()});
    return;
  }
  const PJRT_Api* api = client.api().raw();
  PJRT_Buffer_ReadyEvent_Args r{};
  r.struct_size = PJRT_Buffer_ReadyEvent_Args_STRUCT_SIZE;
  r.buffer = outputs[0]->raw();
  if (PJRT_Error* error = api->PJRT_Buffer_ReadyEvent(&r)) {
    DestroyError(api, error);
    return;
  }
  ++g_in_flight;
  auto* p = new Pending{name, DeviceOf(client, *outputs[0]), launch_ns, api, r.event};
  PJRT_Event_OnReady_Args o{};
  o.struct_size = PJRT_Event_OnReady_Args_STRUCT_SIZE;
  o.event = r.event;
  o.callback = OnReady;
  o.user_arg = p;
  if (PJRT_Error* error = api->PJRT_Event_OnReady(&o)) {  // not registered: clean up here
    DestroyError(api, error);
    OnReady(nullptr, p);
  }
}

int64_t InFlight() { return g_in_flight; }

std::string NameOfKey(const std::string& key) {
  size_t end = key.find_first_of("|( \n");
  return key.substr(0, std::min<size_t>(end == std::string::npos ? key.size() : end, 80));
}

}  // namespace torch_tpu::runtime::trace
