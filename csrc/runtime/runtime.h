// Device runtime: the process-wide PJRT client, device storage, the
// compilation cache, execution (async by default, synchronous in debug
// mode) and statistics. Knows PJRT, not ATen op semantics.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "hlo/element_type.h"
#include "runtime/disk_cache.h"
#include "pjrt/pjrt.h"

namespace torch_tpu::runtime {

class PendingCompile;  // compile_pool.h
struct QueuedValue;    // launch_queue.h

pjrt::BufferType ToPjrt(hlo::ElementType t);

// The bytes of one PyTorch storage on one device. The current value is an
// immutable PJRT buffer holding a 1-D array of `dtype` covering all bytes;
// writes replace it. No buffer yet means never written (reads see zeros).
// A bounded-dynamic op's result keeps its bucket-sized buffer: `padded_shape`
// (the bucket), the real `real_shape` elements at the front of each dim (row
// major), so the next dynamic op takes it as it is; also when the sizes sit
// at their bucket (no padding, but the same layout: exact ops reading a
// window of it keep one key for every size of the bucket). Strict-eager plans
// slice the real elements out; everything else compacts it first
// (PrepareStorage). nbytes stays PyTorch's size.
struct DeviceStorage {
  int device = 0;
  size_t nbytes = 0;
  hlo::ElementType dtype = hlo::ElementType::U8;
  pjrt::BufferPtr buffer;
  std::vector<int64_t> padded_shape, real_shape;  // empty: buffer holds exactly numel()
  // Per padded dim: its padded size is a product of buckets (the h*w tokens
  // of a [b, c, h, w] image read as [b, h*w, c]) that no bucket of a real
  // size gives back; dynamic readers take it whole (dynamic.cpp). Empty: none.
  std::vector<bool> product_dims;
  // Fused eager: the storage's new value is the value with this id in the
  // module being recorded (a 1-D array of `dtype`, numel() elements); buffer
  // is stale until the recording is flushed. -1: not pending.
  int pending_value = -1;
  bool pending() const { return pending_value >= 0; }
  // Background compiles (launch_queue.h): a queued launch will write the
  // storage; until it has run, `buffer` is stale and readers queued after it
  // take this value. Null: no queued launch writes it.
  std::shared_ptr<QueuedValue> queued;
  int64_t numel() const { return static_cast<int64_t>(nbytes / hlo::ByteSize(dtype)); }
  bool padded() const { return !padded_shape.empty(); }
  int64_t buffer_numel() const {
    int64_t n = 1;
    for (int64_t d : padded_shape) n *= d;
    return padded() ? n : numel();
  }
  // Device bytes the padding adds (counted in memory_allocated).
  int64_t padding_bytes() const {
    return padded() ? (buffer_numel() - numel()) * static_cast<int64_t>(hlo::ByteSize(dtype)) : 0;
  }
  // The storage's new value: `b` holds exactly numel() elements, or (padded)
  // a row-major `padded` array with the real `real` elements at the front of
  // each dim.
  void Set(pjrt::BufferPtr b) {
    if (padded()) ClearPadding();
    buffer = std::move(b);
  }
  void SetPadded(pjrt::BufferPtr b, std::vector<int64_t> real, std::vector<int64_t> padded);
  // A module's new value for the storage: `elements` long. A padded storage
  // keeps its layout when the value fills its whole buffer; otherwise Set().
  void SetResult(pjrt::BufferPtr b, int64_t elements) {
    if (padded() && elements == buffer_numel()) buffer = std::move(b);
    else Set(std::move(b));
  }

 private:
  void ClearPadding();  // runtime.cpp: also gives its bytes back to the memory counters
};

struct Stats {
  int64_t compiles = 0;
  int64_t cache_hits = 0;
  int64_t hit_path_hits = 0;  // of them, calls launched from their fingerprint (aten/call_fast.cpp)
  int64_t executions = 0;
  double compile_seconds = 0;
  int64_t transfers_to_device = 0;
  int64_t transfers_to_host = 0;
  std::map<std::string, int64_t> fallbacks;  // op name -> count
  std::map<std::string, int64_t> native_ops;  // op name -> count
  int64_t disk_hits = 0;    // executables loaded from the disk cache
  int64_t disk_misses = 0;  // looked up on disk, not found (then compiled)
};

struct MemoryCounters {
  int64_t allocated = 0;
  int64_t peak = 0;
  int64_t num_allocs = 0;
  int64_t num_frees = 0;
};

// A device-side assertion failed (an index out of range, ...).
class DeviceAssertion : public std::out_of_range {
 public:
  using std::out_of_range::out_of_range;
};

// Path, size and modification time of the native library holding this code:
// what keys on-disk state to one torch_tpu build (prefetch manifests, the
// compile backend's traced graphs).
std::string BuildIdentity();

class Runtime {
 public:
  // Loads the plugin at `plugin_path` and creates the client. Must be called
  // once before Get(); later calls with the same path are no-ops.
  static void Initialize(const std::string& plugin_path, int cpu_device_count);
  static bool IsInitialized();
  static Runtime& Get();
  // This process is a fork() of one that had initialized the runtime: the
  // plugin's threads are gone, so nothing may call into it (it would hang).
  static bool InForkedChild();

  const pjrt::Client& client() const { return *client_; }
  int device_count() const { return static_cast<int>(client_->devices().size()); }
  // "cpu", "cuda" or "tpu" (from the plugin's platform name).
  std::string platform() const;
  // Index of the device holding `buffer` (-2 if none of ours).
  int DeviceIndexOf(const pjrt::Buffer& buffer) const;
  const std::string& plugin_path() const { return plugin_path_; }
  // The XLA debug options every compile passes (TORCH_TPU_XLA_OPTIONS).
  const pjrt::Options& xla_options() const;

  // Compiled executable for `key`, compiling build() on a miss. Throws
  // pjrt::Error (with the module saved to a file named in the message).
  // *compiled (if given): whether XLA compiled it in this call (not a
  // memory or disk-cache hit); compiles on other threads do not count.
  pjrt::ExecutablePtr GetOrCompile(const std::string& key, int device,
                                   const std::function<std::string()>& build,
                                   bool* compiled = nullptr);
  // GetOrCompile() on the compile pool (compile_pool.h): build() runs here,
  // the compile there; counted the same (a key already compiling is a hit).
  // The caller runs NotifyCompiled() when it takes a compiled executable.
  std::shared_ptr<PendingCompile> CompileInBackground(const std::string& key, int device,
                                                      const std::function<std::string()>& build);
  // Runs and records outputs for synchronize(); in launch-blocking mode waits
  // for completion and reports the op that failed.
  std::vector<pjrt::BufferPtr> Execute(const pjrt::Executable& exe,
                                       const std::vector<PJRT_Buffer*>& args,
                                       const std::vector<int64_t>& non_donatable,
                                       const std::string& op);
  // Waits for all work issued so far (on `device`, or all devices if < 0).
  void Synchronize(int device = -1);

  pjrt::BufferPtr Upload(const void* data, hlo::ElementType t,
                         const std::vector<int64_t>& dims, int device);
  // A buffer whose elements are unspecified; nullptr where the plugin makes none.
  pjrt::BufferPtr Uninitialized(hlo::ElementType t, const std::vector<int64_t>& dims, int device);
  // Rank-0 parameters of any element type, converted as C++ converts (floats
  // to the nearest value of a narrower float type); equal values share one
  // cached, never-written buffer.
  pjrt::BufferPtr UploadScalar(double v, hlo::ElementType t, int device);
  pjrt::BufferPtr UploadInt(int64_t v, hlo::ElementType t, int device);
  void Download(const pjrt::Buffer& buffer, void* dst, size_t nbytes);

  // Device-side assertion results (rank-0 pred buffers) of executed ops.
  // Checked at sync points; a failed one throws DeviceAssertion.
  void AddAssertion(pjrt::BufferPtr ok, std::string message);
  void CheckAssertions();

  Stats& stats() { return stats_; }
  void ResetStats() {
    std::lock_guard<std::mutex> lock(cache_mu_);  // compile threads count under it
    stats_ = Stats();
    prefetched_ = 0;
    ++stats_generation_;
  }
  // Changes with every ResetStats(): counters cached by address re-find theirs.
  int64_t stats_generation() const { return stats_generation_; }
  MemoryCounters& memory(int device) { return memory_.at(device); }
  bool launch_blocking() const { return launch_blocking_; }
  void set_launch_blocking(bool v) { launch_blocking_ = v; }
  size_t cache_size() const {
    std::lock_guard<std::mutex> lock(cache_mu_);
    return cache_.size();
  }
  const std::string& disk_cache_dir() const { return disk_->dir(); }
  void ClearCache() {
    std::lock_guard<std::mutex> lock(cache_mu_);
    cache_.clear();
  }
  // Executables the background prefetcher loaded from the disk cache.
  int64_t prefetched() const { return prefetched_; }
  // Stops the prefetcher and waits for it (process exit, tests).
  void StopPrefetch();

 private:
  Runtime(const std::string& plugin_path, int cpu_device_count);
  pjrt::ExecutablePtr Lookup(const std::string& full_key);
  pjrt::ExecutablePtr CompileText(const std::string& full_key, const std::string& key, int device,
                                  const std::string& text, double* seconds);
  pjrt::ExecutablePtr CompileModule(const std::string& key, int device, const std::string& text,
                                    double* seconds);
  pjrt::BufferPtr CachedScalar(const void* data, size_t nbytes, hlo::ElementType t, int device);
  // Warm start: see the comment at StartPrefetch in runtime.cpp.
  void StartPrefetch();
  void PrefetchLoop();
  pjrt::ExecutablePtr LoadPrefetchEntry(const std::string& key, const std::string& file);
  void RecordInManifest(const std::string& key, const std::string& disk_key);
  // Start of every disk key for `device`: plugin identity and compile options.
  std::string DiskKeyHead(int device) const;
  // The TORCH_TPU_XLA_OPTIONS name a compile error message names, if any.
  const std::string* RejectedXlaOption(const std::string& message) const;
  static void AtFork(int phase);
  std::string plugin_path_;
  std::unordered_map<std::string, pjrt::BufferPtr> scalars_;
  std::shared_ptr<const pjrt::Api> api_;
  std::unique_ptr<pjrt::Client> client_;
  mutable std::mutex cache_mu_;  // cache_ and the prefetch state below
  std::unordered_map<std::string, pjrt::ExecutablePtr> cache_;
  std::unordered_map<std::string, std::shared_ptr<PendingCompile>> compiling_;  // on the pool
  std::unordered_map<std::string, std::string> prefetch_pending_;  // key -> entry file
  std::vector<std::string> prefetch_order_;
  size_t prefetch_next_ = 0;
  std::unordered_set<std::string> prefetched_unused_;  // loaded, not yet looked up
  std::unordered_set<std::string> manifest_keys_;
  std::string manifest_path_;
  bool prefetch_running_ = false;
  bool prefetch_stop_ = false;
  std::condition_variable prefetch_done_;
  std::atomic<int64_t> prefetched_{0};
  std::vector<std::weak_ptr<pjrt::Buffer>> pending_;
  std::vector<std::pair<pjrt::BufferPtr, std::string>> assertions_;
  std::vector<MemoryCounters> memory_;
  std::unique_ptr<DiskCache> disk_;
  std::string disk_key_prefix_;  // plugin identity, part of every disk key
  Stats stats_;
  int64_t stats_generation_ = 0;
  bool launch_blocking_ = false;
};

}  // namespace torch_tpu::runtime
