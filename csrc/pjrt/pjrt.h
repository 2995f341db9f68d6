// RAII over the PJRT C API. Knows nothing of torch: plugin, client, device,
// buffer, event, executable. Every PJRT error becomes a pjrt::Error.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

struct PJRT_Api;
struct PJRT_Client;
struct PJRT_Device;
struct PJRT_Buffer;
struct PJRT_Event;
struct PJRT_LoadedExecutable;
struct PJRT_Error;

namespace torch_tpu::pjrt {

// An error reported by the plugin (or by this layer about the plugin).
class Error : public std::runtime_error {
 public:
  Error(const std::string& message, int code = 0)
      : std::runtime_error(message), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

// Element types, numbered as PJRT_Buffer_Type (kept in one place: pjrt.cpp
// static_asserts the correspondence).
enum class BufferType : int {
  Invalid = 0, Pred = 1, S8 = 2, S16 = 3, S32 = 4, S64 = 5, U8 = 6, U16 = 7,
  U32 = 8, U64 = 9, F16 = 10, F32 = 11, F64 = 12, BF16 = 13, C64 = 14, C128 = 15,
  F8E5M2 = 16, F8E4M3FN = 17,
};

class Api;
class Client;

// A completion event. Await() throws the plugin's error if the work failed.
class Event {
 public:
  Event(const Api* api, PJRT_Event* event) : api_(api), event_(event) {}
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void Await();
  bool IsReady() const;

 private:
  const Api* api_;
  PJRT_Event* event_;
};

// One device-resident array. Destroyed (and its memory freed) with the object.
class Buffer {
 public:
  Buffer(const Api* api, PJRT_Buffer* buffer) : api_(api), buffer_(buffer) {}
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  PJRT_Buffer* raw() const { return buffer_; }
  std::vector<int64_t> dims() const;
  BufferType type() const;
  size_t OnDeviceSizeInBytes() const;
  bool IsDeleted() const;
  // Blocks until the buffer's value is computed; throws the execution's error.
  void AwaitReady() const;
  // Copies the whole buffer into dst (dst_size bytes, dense row-major).
  void ToHost(void* dst, size_t dst_size) const;
  std::shared_ptr<Buffer> CopyToDevice(PJRT_Device* device) const;
  // The device the buffer lives on.
  PJRT_Device* device() const;

 private:
  friend struct BufferRegistry;
  const Api* api_;
  PJRT_Buffer* buffer_;
  // Links of the live-buffer list (pjrt.cpp, live_buffers.h): intrusive, so
  // tracking a buffer allocates nothing.
  Buffer* live_prev_ = nullptr;
  Buffer* live_next_ = nullptr;
  bool live_ = false;
};
using BufferPtr = std::shared_ptr<Buffer>;

// A compiled, loaded program.
class Executable {
 public:
  Executable(const Api* api, PJRT_LoadedExecutable* exe, size_t num_outputs)
      : api_(api), exe_(exe), num_outputs_(num_outputs) {}
  ~Executable();
  Executable(const Executable&) = delete;
  Executable& operator=(const Executable&) = delete;

  size_t num_outputs() const { return num_outputs_; }
  // Runs on one device. Arguments listed in `donated` are consumed (their
  // buffers become deleted); all others are left untouched.
  std::vector<BufferPtr> Execute(const std::vector<PJRT_Buffer*>& args,
                                 const std::vector<int64_t>& non_donatable) const;
  // Bytes that DeserializeAndLoad accepts, for the same plugin version.
  std::string Serialize() const;

 private:
  const Api* api_;
  PJRT_LoadedExecutable* exe_;
  size_t num_outputs_;
};
using ExecutablePtr = std::shared_ptr<Executable>;

// Description of one addressable device.
struct DeviceInfo {
  PJRT_Device* device = nullptr;
  int id = 0;
  std::string kind;
  std::string debug_string;
};

struct MemoryStats {
  int64_t bytes_in_use = 0;
  int64_t peak_bytes_in_use = -1;  // -1: the plugin does not report it
  int64_t bytes_limit = -1;
};

// Named options as "name=value" text: plugin create options and XLA
// compile options (env_option_overrides) both come from such lists.
using Options = std::vector<std::pair<std::string, std::string>>;

// "name=value,name=value" -> pairs in order, empty items skipped; a name
// given twice keeps its last value. Throws Error naming `source` (the
// environment variable the text came from) for an item without a name or '='.
Options ParseOptionList(const std::string& text, const std::string& source);
// Sets `name` to `value` in `options`, replacing an earlier value.
void SetOption(Options& options, const std::string& name, const std::string& value);

// An option's value typed by its spelling: true/false -> bool, an integer ->
// int64, another number ("0.5", "1e-3") -> floating point, else a string.
struct TypedValue {
  enum class Kind { kBool, kInt, kFloat, kString } kind = Kind::kString;
  bool b = false;
  int64_t i = 0;
  double d = 0;
};
TypedValue TypeOf(const std::string& text);

// A client of one plugin: devices, transfers, compilation.
class Client {
 public:
  // Plugin create options, e.g. {"cpu_device_count", "2"} for XLA:CPU or
  // {"preallocate", "false"} for the CUDA plugin. Values are typed by their
  // spelling (TypeOf; numbers become the API's float).
  Client(std::shared_ptr<const Api> api, const Options& options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const Api& api() const { return *api_; }
  const std::string& platform_name() const { return platform_name_; }
  const std::string& platform_version() const { return platform_version_; }
  const std::vector<DeviceInfo>& devices() const { return devices_; }

  // Copies host memory (dense row-major) into a new buffer on `device`.
  // The host memory may be reused as soon as this returns.
  BufferPtr FromHost(const void* data, BufferType type,
                     const std::vector<int64_t>& dims, int device) const;
  // A new buffer on `device` whose elements are unspecified (for a value
  // about to be overwritten whole); nullptr when the plugin cannot make one
  // (no such call, or it answers Unimplemented).
  BufferPtr Uninitialized(BufferType type, const std::vector<int64_t>& dims, int device) const;
  // XLA debug options (e.g. {"xla_cpu_use_fusion_emitters", "false"})
  // that every later Compile passes as the compile options'
  // env_option_overrides. XLA rejects an unknown name when it compiles.
  void set_xla_options(Options options) { xla_options_ = std::move(options); }
  const Options& xla_options() const { return xla_options_; }
  // Compiles StableHLO (MLIR text) for one device.
  ExecutablePtr Compile(const std::string& mlir, int device) const;
  ExecutablePtr Deserialize(const std::string& bytes) const;
  MemoryStats DeviceMemoryStats(int device) const;

 private:
  std::shared_ptr<const Api> api_;
  PJRT_Client* client_ = nullptr;
  std::string platform_name_;
  std::string platform_version_;
  std::vector<DeviceInfo> devices_;
  Options xla_options_;
};

// A loaded plugin (dlopen + GetPjrtApi + PJRT_Plugin_Initialize).
class Api {
 public:
  // Throws Error with the path and dlerror() when the plugin cannot be used.
  static std::shared_ptr<const Api> Load(const std::string& path);
  ~Api();

  const PJRT_Api* raw() const { return api_; }
  const std::string& path() const { return path_; }
  int major_version() const { return major_; }
  int minor_version() const { return minor_; }
  // Plugin attributes such as xla_version (stringified).
  std::vector<std::pair<std::string, std::string>> Attributes() const;

  // Turns a PJRT_Error into an exception (and frees it). No-op for null.
  void Check(PJRT_Error* error, const char* what) const;
  // Whether the plugin's function table has this slot (older plugins have
  // shorter tables). `offset` is offsetof(PJRT_Api, fn).
  bool Has(size_t offset) const;

 private:
  Api() = default;
  void* handle_ = nullptr;
  const PJRT_Api* api_ = nullptr;
  std::string path_;
  int major_ = 0, minor_ = 0;
};

// In a fork()ed child the plugin's threads do not exist: calls into it can
// hang. After this, destructors of PJRT objects release nothing (the child's
// memory goes with the process).
void AbandonPluginInChild();
bool PluginAbandoned();

// Serialized xla.CompileOptionsProto for one replica, one partition, placed
// on the device with global id `device_id`, with `xla_options` as its
// env_option_overrides (typed by TypeOf). Exposed for tests.
std::string SingleDeviceCompileOptions(int device_id, const Options& xla_options = {});

// Extra zeroed bytes appended to every argument struct we pass, reported in
// struct_size, so that plugins speaking a newer API minor version (whose
// structs grew) read zeros (their defaults) for fields we do not know.
constexpr size_t kStructPadding = 256;

}  // namespace torch_tpu::pjrt
