#include "runtime/runtime.h"

#include <chrono>
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>

namespace torch_tpu::runtime {

namespace {
// Never destroyed: PJRT objects must not be released during static
// destruction, after the plugin's own globals are gone.
std::unique_ptr<Runtime>& Instance() {
  static auto* instance = new std::unique_ptr<Runtime>();
  return *instance;
}
}  // namespace

pjrt::BufferType ToPjrt(hlo::ElementType t) {
  using B = pjrt::BufferType;
  using E = hlo::ElementType;
  switch (t) {
    case E::Bool: return B::Pred;
    case E::I8: return B::S8;
    case E::I16: return B::S16;
    case E::I32: return B::S32;
    case E::I64: return B::S64;
    case E::U8: return B::U8;
    case E::U16: return B::U16;
    case E::U32: return B::U32;
    case E::U64: return B::U64;
    case E::F16: return B::F16;
    case E::BF16: return B::BF16;
    case E::F32: return B::F32;
    case E::F64: return B::F64;
  }
  return B::Invalid;
}

void Runtime::Initialize(const std::string& plugin_path, int cpu_device_count) {
  auto& inst = Instance();
  if (inst) return;
  inst.reset(new Runtime(plugin_path, cpu_device_count));
}

bool Runtime::IsInitialized() { return Instance() != nullptr; }

Runtime& Runtime::Get() {
  auto& inst = Instance();
  if (!inst) throw pjrt::Error("torch_tpu runtime used before initialization");
  return *inst;
}

Runtime::Runtime(const std::string& plugin_path, int cpu_device_count)
    : plugin_path_(plugin_path) {
  api_ = pjrt::Api::Load(plugin_path);
  std::vector<std::pair<std::string, std::string>> options;
  // Only the CPU plugin knows cpu_device_count; others reject unknown options.
  if (plugin_path.find("cpu") != std::string::npos)
    options.emplace_back("cpu_device_count", std::to_string(cpu_device_count));
  // The CUDA plugin would otherwise take 75% of GPU memory up front: grow on
  // demand instead, like PyTorch's caching allocator.
  if (plugin_path.find("cuda") != std::string::npos ||
      plugin_path.find("gpu") != std::string::npos)
    options.emplace_back("preallocate", "false");
  // TORCH_TPU_PJRT_OPTIONS="name=value,name=value" adds or overrides any
  // create option the plugin knows (e.g. memory_fraction=0.5).
  if (const char* env = std::getenv("TORCH_TPU_PJRT_OPTIONS")) {
    std::string all = env;
    size_t pos = 0;
    while (pos < all.size()) {
      size_t comma = all.find(',', pos);
      if (comma == std::string::npos) comma = all.size();
      std::string item = all.substr(pos, comma - pos);
      pos = comma + 1;
      if (item.empty()) continue;
      size_t eq = item.find('=');
      if (eq == std::string::npos || eq == 0)
        throw pjrt::Error("TORCH_TPU_PJRT_OPTIONS: expected name=value, got '" + item + "'");
      std::string name = item.substr(0, eq);
      options.erase(std::remove_if(options.begin(), options.end(),
                                   [&](const auto& o) { return o.first == name; }),
                    options.end());
      options.emplace_back(name, item.substr(eq + 1));
    }
  }
  client_ = std::make_unique<pjrt::Client>(api_, options);
  if (client_->devices().empty())
    throw pjrt::Error("PJRT plugin " + plugin_path + " reports no addressable devices");
  memory_.resize(client_->devices().size());
  // Disk cache: TORCH_TPU_CACHE_DIR ("" turns it off), default under the
  // user cache directory.
  std::string dir;
  if (const char* env = std::getenv("TORCH_TPU_CACHE_DIR")) {
    dir = env;
  } else if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) {
    dir = std::string(xdg) + "/torch_tpu";
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    dir = std::string(home) + "/.cache/torch_tpu";
  }
  uint64_t max_bytes = 2ULL << 30;
  if (const char* env = std::getenv("TORCH_TPU_CACHE_MAX_BYTES")) max_bytes = std::stoull(env);
  disk_ = std::make_unique<DiskCache>(dir, max_bytes);
  disk_key_prefix_ = "platform=" + client_->platform_name() +
                     "\nversion=" + client_->platform_version() + "\napi=" +
                     std::to_string(api_->major_version()) + "." +
                     std::to_string(api_->minor_version());
  for (const auto& [name, value] : api_->Attributes())
    if (name == "xla_version" || name == "stablehlo_current_version")
      disk_key_prefix_ += "\n" + name + "=" + value;
  const char* blocking = std::getenv("TORCH_TPU_LAUNCH_BLOCKING");
  launch_blocking_ = blocking && std::string(blocking) == "1";
}

std::string Runtime::platform() const {
  const std::string& name = client_->platform_name();
  if (name == "cuda" || name == "gpu" || name == "rocm") return "cuda";
  if (name == "tpu") return "tpu";
  return name;
}

pjrt::ExecutablePtr Runtime::GetOrCompile(const std::string& key, int device,
                                          const std::function<std::string()>& build) {
  std::string full_key = std::to_string(device) + "|" + key;
  auto it = cache_.find(full_key);
  if (it != cache_.end()) {
    ++stats_.cache_hits;
    return it->second;
  }
  std::string text = build();
  std::string disk_key;
  if (disk_->enabled()) {
    disk_key = disk_key_prefix_ + "\noptions=" +
               pjrt::SingleDeviceCompileOptions(client_->devices().at(device).id) +
               "\nmodule=" + text;
    if (auto bytes = disk_->Load(disk_key)) {
      try {
        auto exe = client_->Deserialize(*bytes);
        ++stats_.disk_hits;
        cache_.emplace(full_key, exe);
        return exe;
      } catch (const pjrt::Error&) {
        // Unloadable (e.g. written by another plugin build): recompile.
      }
    }
    ++stats_.disk_misses;
  }
  auto start = std::chrono::steady_clock::now();
  pjrt::ExecutablePtr exe;
  try {
    exe = client_->Compile(text, device);
  } catch (const pjrt::Error& e) {
    // Keep the module for the bug report.
    std::string path = "/tmp/torch_tpu_failed_module_" +
                       std::to_string(std::hash<std::string>()(text)) + ".mlir";
    std::ofstream(path) << text;
    throw pjrt::Error(std::string(e.what()) + " (module saved to " + path + ")", e.code());
  }
  stats_.compile_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ++stats_.compiles;
  cache_.emplace(full_key, exe);
  if (disk_->enabled()) {
    try {
      disk_->Store(disk_key, exe->Serialize());
    } catch (const pjrt::Error&) {
      // Plugins that cannot serialize just do without the disk tier.
    }
  }
  return exe;
}

std::vector<pjrt::BufferPtr> Runtime::Execute(const pjrt::Executable& exe,
                                              const std::vector<PJRT_Buffer*>& args,
                                              const std::vector<int64_t>& non_donatable,
                                              const std::string& op) {
  auto outs = exe.Execute(args, non_donatable);
  ++stats_.executions;
  if (launch_blocking_) {
    try {
      for (auto& b : outs) b->AwaitReady();
    } catch (const pjrt::Error& e) {
      throw pjrt::Error(op + " failed on the device: " + e.what(), e.code());
    }
    return outs;
  }
  // Remember a few outputs so synchronize() can wait for them; drop the
  // entries of buffers already gone.
  if (pending_.size() > 256) {
    std::vector<std::weak_ptr<pjrt::Buffer>> live;
    for (auto& w : pending_)
      if (auto b = w.lock(); b && !b->IsDeleted()) live.push_back(w);
    pending_.swap(live);
  }
  for (auto& b : outs) pending_.push_back(b);
  return outs;
}

void Runtime::AddAssertion(pjrt::BufferPtr ok, std::string message) {
  if (launch_blocking_) {
    assertions_.emplace_back(std::move(ok), std::move(message));
    CheckAssertions();
    return;
  }
  assertions_.emplace_back(std::move(ok), std::move(message));
  // Bound the list: check old entries (they are usually done by now).
  if (assertions_.size() > 1024) CheckAssertions();
}

void Runtime::CheckAssertions() {
  std::vector<std::pair<pjrt::BufferPtr, std::string>> pending;
  pending.swap(assertions_);
  for (auto& [ok, message] : pending) {
    uint8_t value = 1;
    ok->ToHost(&value, 1);
    if (!value) throw DeviceAssertion(message);
  }
}

void Runtime::Synchronize(int /*device*/) {
  CheckAssertions();
  std::vector<std::weak_ptr<pjrt::Buffer>> pending;
  pending.swap(pending_);
  for (auto& w : pending) {
    if (auto b = w.lock()) {
      if (!b->IsDeleted()) b->AwaitReady();
    }
  }
}

pjrt::BufferPtr Runtime::Upload(const void* data, hlo::ElementType t,
                                const std::vector<int64_t>& dims, int device) {
  ++stats_.transfers_to_device;
  return client_->FromHost(data, ToPjrt(t), dims, device);
}

pjrt::BufferPtr Runtime::CachedScalar(const void* data, size_t nbytes, hlo::ElementType t,
                                      int device) {
  // Scalars and storage offsets are tiny parameters of almost every op, and
  // their values repeat (offset 0, alpha 1, an eps): one immutable device
  // buffer per (device, type, value) saves a host->device copy per parameter
  // per op. On the CUDA plugin each such copy cost tens of microseconds (a
  // cached a + b took 101 us on an H200 before this cache).
  std::string key(reinterpret_cast<const char*>(data), nbytes);
  key += static_cast<char>(t);
  key += static_cast<char>(device);
  auto it = scalars_.find(key);
  if (it != scalars_.end()) return it->second;
  if (scalars_.size() >= 4096) scalars_.clear();  // values that never repeat
  auto buffer = client_->FromHost(data, ToPjrt(t), {}, device);
  scalars_.emplace(std::move(key), buffer);
  return buffer;
}

pjrt::BufferPtr Runtime::UploadScalar(double v, hlo::ElementType t, int device) {
  using E = hlo::ElementType;
  switch (t) {
    case E::F64: return CachedScalar(&v, sizeof(v), t, device);
    case E::F32: {
      float f = static_cast<float>(v);
      return CachedScalar(&f, sizeof(f), t, device);
    }
    default: return UploadInt(static_cast<int64_t>(v), t, device);
  }
}

pjrt::BufferPtr Runtime::UploadInt(int64_t v, hlo::ElementType t, int device) {
  using E = hlo::ElementType;
  switch (t) {
    case E::Bool: {
      uint8_t b = v != 0;
      return CachedScalar(&b, sizeof(b), t, device);
    }
    case E::I32: {
      int32_t i = static_cast<int32_t>(v);
      return CachedScalar(&i, sizeof(i), t, device);
    }
    case E::U64:
    case E::I64: return CachedScalar(&v, sizeof(v), t, device);
    default: return UploadScalar(static_cast<double>(v), t, device);
  }
}

pjrt::BufferPtr Runtime::Zeros(hlo::ElementType t, int64_t numel, int device) {
  std::string key = std::string("zeros|") + hlo::Name(t) + "|" + std::to_string(numel);
  auto exe = GetOrCompile(key, device, [&] {
    hlo::Builder b("zeros");
    b.Return({b.Splat(t, 0, {numel})});
    return b.ToText();
  });
  return Execute(*exe, {}, {}, "zeros")[0];
}

void Runtime::Download(const pjrt::Buffer& buffer, void* dst, size_t nbytes) {
  CheckAssertions();
  ++stats_.transfers_to_host;
  if (nbytes == 0) return;
  buffer.ToHost(dst, nbytes);
}

}  // namespace torch_tpu::runtime
