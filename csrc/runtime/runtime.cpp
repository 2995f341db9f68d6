#include "runtime/runtime.h"
#include "runtime/compile_hook.h"
#include "runtime/compile_pool.h"
#include "runtime/trace.h"

#include "runtime/scalar_bytes.h"

#include <dlfcn.h>
#include <pthread.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>
#include <thread>

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
    case E::F8E4M3FN: return B::F8E4M3FN;
    case E::F8E5M2: return B::F8E5M2;
    case E::C64: return B::C64;
    case E::C128: return B::C128;
  }
  return B::Invalid;
}

void Runtime::Initialize(const std::string& plugin_path, int cpu_device_count) {
  auto& inst = Instance();
  if (inst) return;
  inst.reset(new Runtime(plugin_path, cpu_device_count));
}

bool Runtime::IsInitialized() { return Instance() != nullptr; }

namespace {
std::atomic<bool> g_forked_child{false};
}  // namespace

bool Runtime::InForkedChild() { return g_forked_child.load(); }

int Runtime::DeviceIndexOf(const pjrt::Buffer& buffer) const {
  PJRT_Device* d = buffer.device();
  const auto& devices = client_->devices();
  for (size_t i = 0; i < devices.size(); ++i)
    if (devices[i].device == d) return static_cast<int>(i);
  return -2;
}

Runtime& Runtime::Get() {
  auto& inst = Instance();
  if (!inst) throw pjrt::Error("torch_tpu runtime used before initialization");
  return *inst;
}

Runtime::Runtime(const std::string& plugin_path, int cpu_device_count)
    : plugin_path_(plugin_path) {
  api_ = pjrt::Api::Load(plugin_path);
  pjrt::Options options;
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
  if (const char* env = std::getenv("TORCH_TPU_PJRT_OPTIONS"))
    for (const auto& [name, value] : pjrt::ParseOptionList(env, "TORCH_TPU_PJRT_OPTIONS"))
      pjrt::SetOption(options, name, value);
  client_ = std::make_unique<pjrt::Client>(api_, options);
  // TORCH_TPU_XLA_OPTIONS="name=value,..." sets XLA debug options
  // (xla_cpu_use_fusion_emitters=false, ...) for every compile; they are
  // part of the compile options, so of every disk cache key.
  if (const char* env = std::getenv("TORCH_TPU_XLA_OPTIONS"))
    client_->set_xla_options(pjrt::ParseOptionList(env, "TORCH_TPU_XLA_OPTIONS"));
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
  // fork(): see AtFork.
  static bool fork_hooks = [] {
    pthread_atfork([] { AtFork(0); }, [] { AtFork(1); }, [] { AtFork(2); });
    return true;
  }();
  (void)fork_hooks;
  StartPrefetch();
}

std::string Runtime::platform() const {
  const std::string& name = client_->platform_name();
  if (name == "cuda" || name == "gpu" || name == "rocm") return "cuda";
  if (name == "tpu") return "tpu";
  return name;
}

// The cached executable for `full_key` (memory, or a prefetch entry not
// loaded yet), counted as a hit; null on a miss.
pjrt::ExecutablePtr Runtime::Lookup(const std::string& full_key) {
  std::string claimed;  // an entry file the prefetcher has not reached yet
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(full_key);
    if (it != cache_.end()) {
      if (prefetched_unused_.erase(full_key)) {
        ++stats_.disk_hits;
      } else {
        ++stats_.cache_hits;
      }
      return it->second;
    }
    auto p = prefetch_pending_.find(full_key);
    if (p != prefetch_pending_.end()) {
      claimed = std::move(p->second);
      prefetch_pending_.erase(p);
    }
  }
  if (!claimed.empty()) {
    if (auto exe = LoadPrefetchEntry(full_key, claimed)) {
      std::lock_guard<std::mutex> lock(cache_mu_);
      ++stats_.disk_hits;
      return cache_.emplace(full_key, exe).first->second;
    }
  }
  return nullptr;
}

pjrt::ExecutablePtr Runtime::GetOrCompile(const std::string& key, int device,
                                          const std::function<std::string()>& build, bool* compiled) {
  if (compiled) *compiled = false;
  std::string full_key = std::to_string(device) + "|" + key;
  if (auto exe = Lookup(full_key)) return exe;
  double seconds = -1;
  auto exe = CompileText(full_key, key, device, build(), &seconds);
  if (seconds >= 0) NotifyCompiled(seconds);  // compile_hook.h: the compile-burst log
  if (compiled) *compiled = seconds >= 0;
  return exe;
}

std::shared_ptr<PendingCompile> Runtime::CompileInBackground(const std::string& key, int device,
                                                             const std::function<std::string()>& build) {
  std::string full_key = std::to_string(device) + "|" + key;
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = compiling_.find(full_key);
    if (it != compiling_.end()) {
      ++stats_.cache_hits;  // compiled once, as the synchronous path would
      return it->second;
    }
  }
  if (auto exe = Lookup(full_key)) return PendingCompile::Ready(exe);
  auto pending = std::make_shared<PendingCompile>();
  auto text = std::make_shared<std::string>(build());  // on this thread: the builder is not shared
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    compiling_[full_key] = pending;
  }
  SubmitCompile([this, full_key, key, device, text, pending] {
    try {
      double seconds = -1;
      auto exe = CompileText(full_key, key, device, *text, &seconds);
      pending->Finish(exe, seconds >= 0, std::max(seconds, 0.0));
    } catch (const pjrt::Error& e) {
      pending->Fail(e.what(), e.code());
    } catch (const std::exception& e) {
      pending->Fail(e.what(), 0);
    }
    std::lock_guard<std::mutex> lock(cache_mu_);
    compiling_.erase(full_key);
  });
  return pending;
}

// The executable of module `text`: from the disk cache, or compiled (then
// stored there and in memory). *seconds: the compile time, or untouched
// when none ran. Safe on any thread.
pjrt::ExecutablePtr Runtime::CompileText(const std::string& full_key, const std::string& key, int device,
                                         const std::string& text, double* seconds) {
  std::string disk_key;
  if (disk_->enabled()) {
    disk_key = DiskKeyHead(device) + text;
    if (auto bytes = disk_->Load(disk_key)) {
      try {
        auto exe = client_->Deserialize(*bytes);
        RecordInManifest(full_key, disk_key);
        std::lock_guard<std::mutex> lock(cache_mu_);
        ++stats_.disk_hits;
        return cache_.emplace(full_key, exe).first->second;
      } catch (const pjrt::Error&) {
        // Unloadable (e.g. written by another plugin build): recompile.
      }
    }
    std::lock_guard<std::mutex> lock(cache_mu_);
    ++stats_.disk_misses;
  }
  auto exe = CompileModule(key, device, text, seconds);
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    stats_.compile_seconds += *seconds;
    ++stats_.compiles;
    cache_.emplace(full_key, exe);
  }
  if (disk_->enabled()) {
    try {
      disk_->Store(disk_key, exe->Serialize());
      RecordInManifest(full_key, disk_key);
    } catch (const pjrt::Error&) {
      // Plugins that cannot serialize just do without the disk tier.
    }
  }
  return exe;
}

pjrt::ExecutablePtr Runtime::CompileModule(const std::string& key, int device, const std::string& text,
                                           double* seconds) {
  auto start = std::chrono::steady_clock::now();
  pjrt::ExecutablePtr exe;
  try {
    trace::Scope span(trace::Kind::Compile, trace::NameOfKey(key), device);
    // Fault injection for tests: compiles of keys containing this fail.
    const char* fail = std::getenv("TORCH_TPU_TEST_FAIL_COMPILE");
    if (fail && *fail && key.find(fail) != std::string::npos)
      throw pjrt::Error(std::string("injected compile failure (TORCH_TPU_TEST_FAIL_COMPILE=") + fail + ")");
    exe = client_->Compile(text, device);
  } catch (const pjrt::Error& e) {
    if (const std::string* name = RejectedXlaOption(e.what()))
      throw pjrt::Error("TORCH_TPU_XLA_OPTIONS sets '" + *name + "', which XLA does not accept (" +
                            e.what() + "); remove it or correct its name or value",
                        e.code());
    // Keep the module for the bug report.
    std::string path = "/tmp/torch_tpu_failed_module_" +
                       std::to_string(std::hash<std::string>()(text)) + ".mlir";
    std::ofstream(path) << text;
    throw pjrt::Error(std::string(e.what()) + " (module saved to " + path + ")", e.code());
  }
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return exe;
}

std::string Runtime::DiskKeyHead(int device) const {
  return disk_key_prefix_ + "\noptions=" +
         pjrt::SingleDeviceCompileOptions(client_->devices().at(device).id,
                                          client_->xla_options()) +
         "\nmodule=";
}

const pjrt::Options& Runtime::xla_options() const { return client_->xla_options(); }

const std::string* Runtime::RejectedXlaOption(const std::string& message) const {
  for (const auto& option : client_->xla_options())
    if (message.find(option.first) != std::string::npos) return &option.first;
  return nullptr;
}

// Warm start. Loading an executable from the disk cache costs 1-2 ms on a
// quiet 2-core machine (10-25 ms when it is loaded), and a program needs
// hundreds (every eager op signature). So each program (same command line,
// same torch_tpu build, same plugin) keeps a manifest of the executables it
// used, and the next run of it loads them on a background thread from the
// moment the runtime starts, while the main thread is still importing
// Python packages. The main thread takes an executable from the prefetcher's
// results when it is there, loads a not-yet-reached one itself (skipping the
// lowering), and never waits for the thread. TORCH_TPU_CACHE_PREFETCH=0
// turns it off. Entries are checked like every disk entry (checksum,
// plugin identity, compile options); the manifest name carries the build
// identity, so a rebuilt torch_tpu starts a new manifest.
namespace {
constexpr size_t kManifestMaxRecords = 2048;
constexpr size_t kManifestMaxKey = 4096;

void BuildIdAnchor() {}

std::string CommandLine() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void StopPrefetchAtExit() {
  if (Runtime::IsInitialized()) Runtime::Get().StopPrefetch();
}
}  // namespace

std::string BuildIdentity() {
  Dl_info info;
  if (!dladdr(reinterpret_cast<void*>(&BuildIdAnchor), &info) || !info.dli_fname) return "";
  struct stat st;
  if (stat(info.dli_fname, &st) != 0) return "";
  return std::string(info.dli_fname) + ":" + std::to_string(st.st_size) + ":" +
         std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec);
}

void Runtime::StartPrefetch() {
  if (!disk_->enabled()) return;
  if (const char* env = std::getenv("TORCH_TPU_CACHE_PREFETCH"); env && std::string(env) == "0")
    return;
  std::string build = BuildIdentity(), cmdline = CommandLine();
  if (build.empty() || cmdline.empty()) return;
  std::string dir = disk_->Subdir("prefetch");  // "" if it is unsafe (cache refused)
  if (dir.empty()) return;
  // (DiskKeyHead: the plugin identity and the compile options, XLA's included)
  manifest_path_ = dir + "/" + HashName(cmdline + "\n" + build + "\n" + DiskKeyHead(0)) + ".list";
  for (auto& [key, file] : disk_->ReadManifest(manifest_path_)) {
    if (!manifest_keys_.insert(key).second) continue;
    prefetch_order_.push_back(key);
    prefetch_pending_.emplace(std::move(key), std::move(file));
  }
  if (prefetch_order_.empty()) return;
  static bool hooks = [] {
    std::atexit(StopPrefetchAtExit);
    return true;
  }();
  (void)hooks;
  prefetch_running_ = true;
  std::thread([this] { PrefetchLoop(); }).detach();
}

void Runtime::PrefetchLoop() {
  for (;;) {
    std::string key, file;
    {
      std::lock_guard<std::mutex> lock(cache_mu_);
      while (!prefetch_stop_ && prefetch_next_ < prefetch_order_.size()) {
        auto it = prefetch_pending_.find(prefetch_order_[prefetch_next_++]);
        if (it == prefetch_pending_.end()) continue;  // claimed by the main thread
        key = it->first;
        file = std::move(it->second);
        prefetch_pending_.erase(it);
        break;
      }
      if (key.empty()) {
        prefetch_running_ = false;
        prefetch_order_.clear();
        prefetch_done_.notify_all();
        return;
      }
    }
    auto exe = LoadPrefetchEntry(key, file);
    if (!exe) continue;
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.emplace(key, exe).second) {
      prefetched_unused_.insert(key);
      ++prefetched_;
    }
  }
}

pjrt::ExecutablePtr Runtime::LoadPrefetchEntry(const std::string& key, const std::string& file) {
  // The key starts with the device index; the entry must have been compiled
  // for that device by this plugin.
  size_t bar = key.find('|');
  int device = -1;
  try {
    device = std::stoi(key.substr(0, bar));
  } catch (const std::exception&) {
    return nullptr;
  }
  if (bar == std::string::npos || device < 0 || device >= device_count()) return nullptr;
  if (file.find('/') != std::string::npos) return nullptr;
  auto entry = disk_->ReadEntry(disk_->dir() + "/" + file);
  if (!entry) return nullptr;
  std::string expect = DiskKeyHead(device);
  if (entry->first.compare(0, expect.size(), expect) != 0) return nullptr;
  try {
    return client_->Deserialize(entry->second);
  } catch (const pjrt::Error&) {
    return nullptr;
  }
}

void Runtime::RecordInManifest(const std::string& key, const std::string& disk_key) {
  if (manifest_path_.empty() || key.size() > kManifestMaxKey) return;
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (manifest_keys_.size() >= kManifestMaxRecords || !manifest_keys_.insert(key).second)
      return;
  }
  std::string file = std::filesystem::path(disk_->PathFor(disk_key)).filename().string();
  std::string record = ManifestRecord(key, file);
  // One append per record (O_APPEND): concurrent runs of the same program
  // interleave whole records.
  disk_->AppendToManifest(manifest_path_, record);
}

void Runtime::StopPrefetch() {
  std::unique_lock<std::mutex> lock(cache_mu_);
  prefetch_stop_ = true;
  prefetch_done_.wait_for(lock, std::chrono::seconds(5), [this] { return !prefetch_running_; });
}

// fork(): the child has none of the parent's threads (the plugin's, the
// prefetcher), so it must never call into the plugin again: it is marked as
// a forked child (GetRuntime() then raises, as CUDA does) and PJRT objects it
// inherited are abandoned, not destroyed. The mutex is held across fork so
// that neither side inherits it locked by a thread that does not exist.
void Runtime::AtFork(int phase) {
  if (!IsInitialized()) return;
  Runtime& rt = Get();
  if (phase == 0) {
    rt.cache_mu_.lock();
    return;
  }
  if (phase == 2) {
    g_forked_child = true;
    pjrt::AbandonPluginInChild();
    rt.prefetch_running_ = false;
    rt.prefetch_stop_ = true;
    rt.prefetch_pending_.clear();
    rt.prefetch_order_.clear();
  }
  rt.cache_mu_.unlock();
}

std::vector<pjrt::BufferPtr> Runtime::Execute(const pjrt::Executable& exe,
                                              const std::vector<PJRT_Buffer*>& args,
                                              const std::vector<int64_t>& non_donatable,
                                              const std::string& op) {
  int64_t launch_ns = trace::Enabled() ? trace::NowNs() : 0;
  auto outs = exe.Execute(args, non_donatable);
  trace::OnExecuted(*client_, op, launch_ns, outs);
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
  trace::Scope span(trace::Kind::ToDevice, "to_device", device);
  return client_->FromHost(data, ToPjrt(t), dims, device);
}

pjrt::BufferPtr Runtime::Uninitialized(hlo::ElementType t, const std::vector<int64_t>& dims, int device) {
  return client_->Uninitialized(ToPjrt(t), dims, device);
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
  ScalarBytes bytes = EncodeScalar(v, t);
  return CachedScalar(bytes.data, bytes.size, t, device);
}

pjrt::BufferPtr Runtime::UploadInt(int64_t v, hlo::ElementType t, int device) {
  ScalarBytes bytes = EncodeScalar(v, t);
  return CachedScalar(bytes.data, bytes.size, t, device);
}

namespace {
void CountPaddingBytes(int device, int64_t delta) {
  if (delta == 0 || !Runtime::IsInitialized()) return;
  MemoryCounters& m = Runtime::Get().memory(device);
  m.allocated += delta;
  m.peak = std::max(m.peak, m.allocated);
}
}  // namespace

void DeviceStorage::SetPadded(pjrt::BufferPtr b, std::vector<int64_t> real, std::vector<int64_t> padded) {
  int64_t before = padding_bytes();
  buffer = std::move(b);
  real_shape = std::move(real);
  padded_shape = std::move(padded);
  product_dims.clear();
  CountPaddingBytes(device, padding_bytes() - before);
}

void DeviceStorage::ClearPadding() {
  CountPaddingBytes(device, -padding_bytes());
  padded_shape.clear();
  real_shape.clear();
  product_dims.clear();
}

void Runtime::Download(const pjrt::Buffer& buffer, void* dst, size_t nbytes) {
  CheckAssertions();
  ++stats_.transfers_to_host;
  if (nbytes == 0) return;
  trace::Scope span(trace::Kind::ToHost, "to_host",
                    trace::Enabled() ? trace::DeviceOf(*client_, buffer) : -1);
  buffer.ToHost(dst, nbytes);
}

}  // namespace torch_tpu::runtime
