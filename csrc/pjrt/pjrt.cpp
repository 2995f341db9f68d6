#include "pjrt/pjrt.h"
#include "pjrt/live_buffers.h"

#include <atomic>

#include <dlfcn.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>

#include "pjrt_c_api.h"  // from the xla-cpu-pjrt wheel

namespace torch_tpu::pjrt {

static_assert(static_cast<int>(BufferType::F32) == PJRT_Buffer_Type_F32);
static_assert(static_cast<int>(BufferType::BF16) == PJRT_Buffer_Type_BF16);
static_assert(static_cast<int>(BufferType::F8E5M2) == PJRT_Buffer_Type_F8E5M2);
static_assert(static_cast<int>(BufferType::F8E4M3FN) == PJRT_Buffer_Type_F8E4M3FN);
static_assert(static_cast<int>(BufferType::Pred) == PJRT_Buffer_Type_PRED);
static_assert(static_cast<int>(BufferType::C128) == PJRT_Buffer_Type_C128);

namespace {

// An argument struct with zeroed padding after it; struct_size covers both.
template <typename T>
struct Args : T {
  char padding[kStructPadding];
  Args() {
    std::memset(static_cast<void*>(this), 0, sizeof(*this));
    this->struct_size = sizeof(*this);
  }
};

std::string Str(const char* data, size_t size) {
  return data ? std::string(data, size) : std::string();
}

}  // namespace

// ---------------------------------------------------------------- Api

bool Api::Has(size_t offset) const {
  return offset + sizeof(void*) <= api_->struct_size &&
         *reinterpret_cast<void* const*>(reinterpret_cast<const char*>(api_) +
                                         offset) != nullptr;
}

void Api::Check(PJRT_Error* error, const char* what) const {
  if (error == nullptr) return;
  Args<PJRT_Error_Message_Args> m;
  m.error = error;
  api_->PJRT_Error_Message(&m);
  std::string message = Str(m.message, m.message_size);
  Args<PJRT_Error_GetCode_Args> c;
  c.error = error;
  int code = 0;
  if (api_->PJRT_Error_GetCode(&c) == nullptr) code = c.code;
  Args<PJRT_Error_Destroy_Args> d;
  d.error = error;
  api_->PJRT_Error_Destroy(&d);
  throw Error(std::string(what) + ": " + message, code);
}

std::shared_ptr<const Api> Api::Load(const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    throw Error("cannot load PJRT plugin '" + path + "': " +
                (why ? why : "unknown dlopen error") +
                ". Set TORCH_TPU_PLUGIN to cpu, cuda, tpu or the path of a "
                "PJRT plugin .so");
  }
  using GetApiFn = const PJRT_Api* (*)();
  auto get_api = reinterpret_cast<GetApiFn>(dlsym(handle, "GetPjrtApi"));
  if (get_api == nullptr) {
    dlclose(handle);
    throw Error("'" + path + "' is not a PJRT plugin (no GetPjrtApi symbol)");
  }
  std::shared_ptr<Api> api(new Api());
  api->handle_ = handle;
  api->path_ = path;
  api->api_ = get_api();
  if (api->api_ == nullptr) throw Error("GetPjrtApi returned null in " + path);
  api->major_ = api->api_->pjrt_api_version.major_version;
  api->minor_ = api->api_->pjrt_api_version.minor_version;
  if (api->major_ != PJRT_API_MAJOR) {
    throw Error("PJRT plugin " + path + " speaks API " + std::to_string(api->major_) + "." +
                std::to_string(api->minor_) + ", torch_tpu needs major version " +
                std::to_string(PJRT_API_MAJOR));
  }
  if (api->Has(offsetof(PJRT_Api, PJRT_Plugin_Initialize))) {
    Args<PJRT_Plugin_Initialize_Args> init;
    api->Check(api->api_->PJRT_Plugin_Initialize(&init),
               "PJRT_Plugin_Initialize");
  }
  return api;
}

Api::~Api() {
  // Plugins are not designed to be unloaded (static destructors, threads):
  // keep the library mapped for the life of the process.
}

std::vector<std::pair<std::string, std::string>> Api::Attributes() const {
  std::vector<std::pair<std::string, std::string>> out;
  if (!Has(offsetof(PJRT_Api, PJRT_Plugin_Attributes))) return out;
  Args<PJRT_Plugin_Attributes_Args> a;
  Check(api_->PJRT_Plugin_Attributes(&a), "PJRT_Plugin_Attributes");
  for (size_t i = 0; i < a.num_attributes; ++i) {
    const PJRT_NamedValue& v = a.attributes[i];
    std::string name = Str(v.name, v.name_size), value;
    switch (v.type) {
      case PJRT_NamedValue_kString:
        value = Str(v.string_value, v.value_size);
        break;
      case PJRT_NamedValue_kInt64:
        value = std::to_string(v.int64_value);
        break;
      case PJRT_NamedValue_kInt64List:
        for (size_t j = 0; j < v.value_size; ++j)
          value += (j ? "." : "") + std::to_string(v.int64_array_value[j]);
        break;
      case PJRT_NamedValue_kFloat:
        value = std::to_string(v.float_value);
        break;
      case PJRT_NamedValue_kBool:
        value = v.bool_value ? "true" : "false";
        break;
    }
    out.emplace_back(name, value);
  }
  return out;
}

// ---------------------------------------------------------------- Event

namespace {
std::atomic<bool> g_abandoned{false};
}  // namespace

void AbandonPluginInChild() { g_abandoned = true; }
bool PluginAbandoned() { return g_abandoned.load(std::memory_order_relaxed); }

Event::~Event() {
  if (event_ == nullptr || PluginAbandoned()) return;
  Args<PJRT_Event_Destroy_Args> a;
  a.event = event_;
  api_->raw()->PJRT_Event_Destroy(&a);
}

void Event::Await() {
  Args<PJRT_Event_Await_Args> a;
  a.event = event_;
  api_->Check(api_->raw()->PJRT_Event_Await(&a), "PJRT_Event_Await");
}

bool Event::IsReady() const {
  Args<PJRT_Event_IsReady_Args> a;
  a.event = event_;
  api_->Check(api_->raw()->PJRT_Event_IsReady(&a), "PJRT_Event_IsReady");
  return a.is_ready;
}

// ---------------------------------------------------------------- Buffer

// The buffers alive in this process: a doubly linked list through the
// buffers themselves (one lock, no allocation per buffer).
struct BufferRegistry {
  std::mutex mu;
  Buffer* head = nullptr;

  void Insert(Buffer* b) {
    std::lock_guard<std::mutex> lock(mu);
    b->live_next_ = head;
    if (head) head->live_prev_ = b;
    head = b;
    b->live_ = true;
  }
  void Erase(Buffer* b) {
    std::lock_guard<std::mutex> lock(mu);
    if (!b->live_) return;
    (b->live_prev_ ? b->live_prev_->live_next_ : head) = b->live_next_;
    if (b->live_next_) b->live_next_->live_prev_ = b->live_prev_;
    b->live_ = false;
  }
  template <typename F>
  void ForEach(F f) {
    std::lock_guard<std::mutex> lock(mu);
    for (const Buffer* b = head; b; b = b->live_next_) f(*b);
  }
};

namespace {

BufferRegistry& Registry() {
  static auto* r = new BufferRegistry();  // never destroyed: buffers may outlive statics
  return *r;
}

// Every Buffer this file creates goes through Tracked (~Buffer forgets it).
BufferPtr Tracked(BufferPtr b) {
  Registry().Insert(b.get());
  return b;
}

}  // namespace

LiveBufferStats LiveBuffers(PJRT_Device* device) {
  LiveBufferStats stats;
  Registry().ForEach([&](const Buffer& buffer) {
    const Buffer* b = &buffer;
    if (b->IsDeleted() || b->device() != device) return;
    ++stats.count;
    stats.bytes += static_cast<int64_t>(b->OnDeviceSizeInBytes());
  });
  return stats;
}

Buffer::~Buffer() {
  Registry().Erase(this);
  if (PluginAbandoned()) return;
  Args<PJRT_Buffer_Destroy_Args> a;
  a.buffer = buffer_;
  PJRT_Error* e = api_->raw()->PJRT_Buffer_Destroy(&a);
  if (e) {
    try {
      api_->Check(e, "PJRT_Buffer_Destroy");
    } catch (...) {
    }
  }
}

std::vector<int64_t> Buffer::dims() const {
  Args<PJRT_Buffer_Dimensions_Args> a;
  a.buffer = buffer_;
  api_->Check(api_->raw()->PJRT_Buffer_Dimensions(&a), "PJRT_Buffer_Dimensions");
  return std::vector<int64_t>(a.dims, a.dims + a.num_dims);
}

BufferType Buffer::type() const {
  Args<PJRT_Buffer_ElementType_Args> a;
  a.buffer = buffer_;
  api_->Check(api_->raw()->PJRT_Buffer_ElementType(&a),
              "PJRT_Buffer_ElementType");
  return static_cast<BufferType>(a.type);
}

size_t Buffer::OnDeviceSizeInBytes() const {
  Args<PJRT_Buffer_OnDeviceSizeInBytes_Args> a;
  a.buffer = buffer_;
  api_->Check(api_->raw()->PJRT_Buffer_OnDeviceSizeInBytes(&a),
              "PJRT_Buffer_OnDeviceSizeInBytes");
  return a.on_device_size_in_bytes;
}

bool Buffer::IsDeleted() const {
  Args<PJRT_Buffer_IsDeleted_Args> a;
  a.buffer = buffer_;
  api_->Check(api_->raw()->PJRT_Buffer_IsDeleted(&a), "PJRT_Buffer_IsDeleted");
  return a.is_deleted;
}

void Buffer::AwaitReady() const {
  Args<PJRT_Buffer_ReadyEvent_Args> a;
  a.buffer = buffer_;
  api_->Check(api_->raw()->PJRT_Buffer_ReadyEvent(&a), "PJRT_Buffer_ReadyEvent");
  Event(api_, a.event).Await();
}

void Buffer::ToHost(void* dst, size_t dst_size) const {
  Args<PJRT_Buffer_ToHostBuffer_Args> a;
  a.src = buffer_;
  a.dst = dst;
  a.dst_size = dst_size;
  api_->Check(api_->raw()->PJRT_Buffer_ToHostBuffer(&a),
              "PJRT_Buffer_ToHostBuffer");
  Event(api_, a.event).Await();
}

PJRT_Device* Buffer::device() const {
  Args<PJRT_Buffer_Device_Args> a;
  a.buffer = buffer_;
  api_->Check(api_->raw()->PJRT_Buffer_Device(&a), "PJRT_Buffer_Device");
  return a.device;
}

BufferPtr Buffer::CopyToDevice(PJRT_Device* device) const {
  Args<PJRT_Buffer_CopyToDevice_Args> a;
  a.buffer = buffer_;
  a.dst_device = device;
  api_->Check(api_->raw()->PJRT_Buffer_CopyToDevice(&a),
              "PJRT_Buffer_CopyToDevice");
  return Tracked(std::make_shared<Buffer>(api_, a.dst_buffer));
}

// ---------------------------------------------------------------- Executable

Executable::~Executable() {
  if (PluginAbandoned()) return;
  Args<PJRT_LoadedExecutable_Destroy_Args> a;
  a.executable = exe_;
  PJRT_Error* e = api_->raw()->PJRT_LoadedExecutable_Destroy(&a);
  if (e) {
    try {
      api_->Check(e, "PJRT_LoadedExecutable_Destroy");
    } catch (...) {
    }
  }
}

std::vector<BufferPtr> Executable::Execute(
    const std::vector<PJRT_Buffer*>& args,
    const std::vector<int64_t>& non_donatable) const {
  Args<PJRT_ExecuteOptions> options;
  options.non_donatable_input_indices =
      non_donatable.empty() ? nullptr : non_donatable.data();
  options.num_non_donatable_input_indices = non_donatable.size();
  std::vector<PJRT_Buffer*> outputs(num_outputs_, nullptr);
  PJRT_Buffer* const* arg_list = args.data();
  PJRT_Buffer** output_list = outputs.data();
  Args<PJRT_LoadedExecutable_Execute_Args> a;
  a.executable = exe_;
  a.options = &options;
  a.argument_lists = &arg_list;
  a.num_devices = 1;
  a.num_args = args.size();
  a.output_lists = &output_list;
  api_->Check(api_->raw()->PJRT_LoadedExecutable_Execute(&a),
              "PJRT_LoadedExecutable_Execute");
  std::vector<BufferPtr> result;
  result.reserve(num_outputs_);
  for (PJRT_Buffer* b : outputs) result.push_back(Tracked(std::make_shared<Buffer>(api_, b)));
  return result;
}

std::string Executable::Serialize() const {
  Args<PJRT_LoadedExecutable_GetExecutable_Args> g;
  g.loaded_executable = exe_;
  api_->Check(api_->raw()->PJRT_LoadedExecutable_GetExecutable(&g),
              "PJRT_LoadedExecutable_GetExecutable");
  Args<PJRT_Executable_Serialize_Args> s;
  s.executable = g.executable;
  PJRT_Error* err = api_->raw()->PJRT_Executable_Serialize(&s);
  std::string bytes;
  if (err == nullptr) {
    bytes.assign(s.serialized_bytes, s.serialized_bytes_size);
    if (s.serialized_executable_deleter)
      s.serialized_executable_deleter(s.serialized_executable);
  }
  Args<PJRT_Executable_Destroy_Args> d;
  d.executable = g.executable;
  api_->raw()->PJRT_Executable_Destroy(&d);
  api_->Check(err, "PJRT_Executable_Serialize");
  return bytes;
}

// ---------------------------------------------------------------- Client

namespace {

void Varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void IntField(std::string& out, int field, int64_t v) {
  Varint(out, static_cast<uint64_t>(field) << 3);
  Varint(out, static_cast<uint64_t>(v));
}
void BytesField(std::string& out, int field, const std::string& bytes) {
  Varint(out, (static_cast<uint64_t>(field) << 3) | 2);
  Varint(out, bytes.size());
  out += bytes;
}

size_t NumOutputs(const Api* api, PJRT_LoadedExecutable* exe) {
  Args<PJRT_LoadedExecutable_GetExecutable_Args> g;
  g.loaded_executable = exe;
  api->Check(api->raw()->PJRT_LoadedExecutable_GetExecutable(&g),
             "PJRT_LoadedExecutable_GetExecutable");
  Args<PJRT_Executable_NumOutputs_Args> n;
  n.executable = g.executable;
  PJRT_Error* err = api->raw()->PJRT_Executable_NumOutputs(&n);
  Args<PJRT_Executable_Destroy_Args> d;
  d.executable = g.executable;
  api->raw()->PJRT_Executable_Destroy(&d);
  api->Check(err, "PJRT_Executable_NumOutputs");
  return n.num_outputs;
}

// OptionOverrideProto{oneof: string_field = 1, bool_field = 2,
// int_field = 3, double_field = 4}.
std::string OptionOverride(const std::string& text) {
  std::string out;
  TypedValue v = TypeOf(text);
  switch (v.kind) {
    case TypedValue::Kind::kBool: IntField(out, 2, v.b ? 1 : 0); break;
    case TypedValue::Kind::kInt: IntField(out, 3, v.i); break;
    case TypedValue::Kind::kFloat: {
      Varint(out, (4 << 3) | 1);  // fixed64
      uint64_t bits;
      std::memcpy(&bits, &v.d, sizeof(bits));
      for (int k = 0; k < 8; ++k) out += static_cast<char>((bits >> (8 * k)) & 0xff);
      break;
    }
    case TypedValue::Kind::kString: BytesField(out, 1, text); break;
  }
  return out;
}

}  // namespace

Options ParseOptionList(const std::string& text, const std::string& source) {
  Options options;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(pos, comma - pos);
    pos = comma + 1;
    if (item.empty()) continue;
    size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      throw Error(source + ": expected name=value, got '" + item + "'");
    SetOption(options, item.substr(0, eq), item.substr(eq + 1));
  }
  return options;
}

void SetOption(Options& options, const std::string& name, const std::string& value) {
  for (auto& option : options) {
    if (option.first == name) {
      option.second = value;
      return;
    }
  }
  options.emplace_back(name, value);
}

TypedValue TypeOf(const std::string& text) {
  TypedValue v;
  auto parses = [&](const char* end) { return !text.empty() && *end == '\0'; };
  char* end = nullptr;
  if (text == "true" || text == "false") {
    v.kind = TypedValue::Kind::kBool;
    v.b = text == "true";
    return v;
  }
  v.i = std::strtoll(text.c_str(), &end, 10);
  if (parses(end)) {
    v.kind = TypedValue::Kind::kInt;
    return v;
  }
  v.d = std::strtod(text.c_str(), &end);
  if (parses(end)) v.kind = TypedValue::Kind::kFloat;
  return v;
}

std::string SingleDeviceCompileOptions(int device_id, const Options& xla_options) {
  // DeviceAssignmentProto{replica_count=1, computation_count=1,
  //   computation_devices{replica_device_ids=[device_id]}}
  std::string computation_device;
  IntField(computation_device, 1, device_id);
  std::string assignment;
  IntField(assignment, 1, 1);
  IntField(assignment, 2, 1);
  BytesField(assignment, 3, computation_device);
  // ExecutableBuildOptionsProto{num_replicas=1, num_partitions=1,
  //   device_assignment}
  std::string build;
  IntField(build, 4, 1);
  IntField(build, 5, 1);
  BytesField(build, 9, assignment);
  std::string options;  // CompileOptionsProto{executable_build_options = 3,
  BytesField(options, 3, build);  //   env_option_overrides = 7 (a map)}
  // Sorted by name: the same options give the same bytes (a cache key).
  std::map<std::string, std::string> sorted(xla_options.begin(), xla_options.end());
  for (const auto& [name, value] : sorted) {
    std::string entry;  // map entry {key = 1, value = 2}
    BytesField(entry, 1, name);
    BytesField(entry, 2, OptionOverride(value));
    BytesField(options, 7, entry);
  }
  return options;
}

Client::Client(std::shared_ptr<const Api> api, const Options& options)
    : api_(std::move(api)) {
  // Values live inside the PJRT_NamedValue (a union), except strings, which
  // point into `options`.
  std::vector<PJRT_NamedValue> named(options.size());
  for (size_t i = 0; i < options.size(); ++i) {
    const std::string& name = options[i].first;
    const std::string& text = options[i].second;
    PJRT_NamedValue& v = named[i];
    std::memset(&v, 0, sizeof(v));
    v.struct_size = sizeof(PJRT_NamedValue);  // array element: exact size
    v.name = name.c_str();
    v.name_size = name.size();
    v.value_size = 1;
    TypedValue typed = TypeOf(text);
    if (typed.kind == TypedValue::Kind::kBool) {
      v.type = PJRT_NamedValue_kBool;
      v.bool_value = typed.b;
    } else if (typed.kind == TypedValue::Kind::kInt) {
      v.type = PJRT_NamedValue_kInt64;
      v.int64_value = typed.i;
    } else if (typed.kind == TypedValue::Kind::kFloat) {
      v.type = PJRT_NamedValue_kFloat;
      v.float_value = static_cast<float>(typed.d);
    } else {
      v.type = PJRT_NamedValue_kString;
      v.string_value = text.c_str();
      v.value_size = text.size();
    }
  }
  Args<PJRT_Client_Create_Args> a;
  a.create_options = named.empty() ? nullptr : named.data();
  a.num_options = named.size();
  api_->Check(api_->raw()->PJRT_Client_Create(&a), "PJRT_Client_Create");
  client_ = a.client;

  Args<PJRT_Client_PlatformName_Args> pn;
  pn.client = client_;
  api_->Check(api_->raw()->PJRT_Client_PlatformName(&pn), "PJRT_Client_PlatformName");
  platform_name_ = Str(pn.platform_name, pn.platform_name_size);
  Args<PJRT_Client_PlatformVersion_Args> pv;
  pv.client = client_;
  api_->Check(api_->raw()->PJRT_Client_PlatformVersion(&pv),
              "PJRT_Client_PlatformVersion");
  platform_version_ = Str(pv.platform_version, pv.platform_version_size);

  Args<PJRT_Client_AddressableDevices_Args> ad;
  ad.client = client_;
  api_->Check(api_->raw()->PJRT_Client_AddressableDevices(&ad),
              "PJRT_Client_AddressableDevices");
  for (size_t i = 0; i < ad.num_addressable_devices; ++i) {
    DeviceInfo info;
    info.device = ad.addressable_devices[i];
    Args<PJRT_Device_GetDescription_Args> gd;
    gd.device = info.device;
    api_->Check(api_->raw()->PJRT_Device_GetDescription(&gd),
                "PJRT_Device_GetDescription");
    Args<PJRT_DeviceDescription_Id_Args> id;
    id.device_description = gd.device_description;
    api_->Check(api_->raw()->PJRT_DeviceDescription_Id(&id),
                "PJRT_DeviceDescription_Id");
    info.id = id.id;
    Args<PJRT_DeviceDescription_Kind_Args> kind;
    kind.device_description = gd.device_description;
    api_->Check(api_->raw()->PJRT_DeviceDescription_Kind(&kind),
                "PJRT_DeviceDescription_Kind");
    info.kind = Str(kind.device_kind, kind.device_kind_size);
    Args<PJRT_DeviceDescription_DebugString_Args> ds;
    ds.device_description = gd.device_description;
    api_->Check(api_->raw()->PJRT_DeviceDescription_DebugString(&ds),
                "PJRT_DeviceDescription_DebugString");
    info.debug_string = Str(ds.debug_string, ds.debug_string_size);
    devices_.push_back(info);
  }
}

Client::~Client() {
  // Destroying a client while buffers may still be referenced elsewhere is
  // undefined in PJRT; the process-wide client lives until exit, so skip it.
}

BufferPtr Client::FromHost(const void* data, BufferType type,
                           const std::vector<int64_t>& dims, int device) const {
  Args<PJRT_Client_BufferFromHostBuffer_Args> a;
  a.client = client_;
  a.data = data;
  a.type = static_cast<PJRT_Buffer_Type>(type);
  a.dims = dims.data();
  a.num_dims = dims.size();
  a.host_buffer_semantics =
      PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes;
  a.device = devices_.at(device).device;
  api_->Check(api_->raw()->PJRT_Client_BufferFromHostBuffer(&a),
              "PJRT_Client_BufferFromHostBuffer");
  auto buffer = Tracked(std::make_shared<Buffer>(api_.get(), a.buffer));
  if (a.done_with_host_buffer) {
    // The caller may free `data` when we return: wait for the copy.
    Event(api_.get(), a.done_with_host_buffer).Await();
  }
  return buffer;
}

BufferPtr Client::Uninitialized(BufferType type, const std::vector<int64_t>& dims, int device) const {
  static std::atomic<bool> unsupported{false};
  if (unsupported || !api_->Has(offsetof(PJRT_Api, PJRT_Client_CreateUninitializedBuffer))) return nullptr;
  Args<PJRT_Client_CreateUninitializedBuffer_Args> a;
  a.client = client_;
  a.shape_dims = dims.data();
  a.shape_num_dims = dims.size();
  a.shape_element_type = static_cast<PJRT_Buffer_Type>(type);
  a.device = devices_.at(device).device;
  try {
    api_->Check(api_->raw()->PJRT_Client_CreateUninitializedBuffer(&a), "PJRT_Client_CreateUninitializedBuffer");
  } catch (const Error&) {
    unsupported = true;  // the caller uploads zeros instead, from now on
    return nullptr;
  }
  return Tracked(std::make_shared<Buffer>(api_.get(), a.buffer));
}

ExecutablePtr Client::Compile(const std::string& mlir, int device) const {
  Args<PJRT_Program> program;
  static const char kFormat[] = "mlir";
  program.code = const_cast<char*>(mlir.data());
  program.code_size = mlir.size();
  program.format = kFormat;
  program.format_size = sizeof(kFormat) - 1;
  std::string options = SingleDeviceCompileOptions(devices_.at(device).id, xla_options_);
  Args<PJRT_Client_Compile_Args> a;
  a.client = client_;
  a.program = &program;
  a.compile_options = options.data();
  a.compile_options_size = options.size();
  api_->Check(api_->raw()->PJRT_Client_Compile(&a), "PJRT_Client_Compile");
  return std::make_shared<Executable>(api_.get(), a.executable,
                                      NumOutputs(api_.get(), a.executable));
}

ExecutablePtr Client::Deserialize(const std::string& bytes) const {
  Args<PJRT_Executable_DeserializeAndLoad_Args> a;
  a.client = client_;
  a.serialized_executable = bytes.data();
  a.serialized_executable_size = bytes.size();
  api_->Check(api_->raw()->PJRT_Executable_DeserializeAndLoad(&a),
              "PJRT_Executable_DeserializeAndLoad");
  return std::make_shared<Executable>(api_.get(), a.loaded_executable,
                                      NumOutputs(api_.get(), a.loaded_executable));
}

MemoryStats Client::DeviceMemoryStats(int device) const {
  MemoryStats stats;
  if (!api_->Has(offsetof(PJRT_Api, PJRT_Device_MemoryStats))) return stats;
  Args<PJRT_Device_MemoryStats_Args> a;
  a.device = devices_.at(device).device;
  PJRT_Error* e = api_->raw()->PJRT_Device_MemoryStats(&a);
  if (e != nullptr) {  // CPU plugins do not implement it: not an error for us.
    try {
      api_->Check(e, "PJRT_Device_MemoryStats");
    } catch (const Error&) {
    }
    return stats;
  }
  stats.bytes_in_use = a.bytes_in_use;
  if (a.peak_bytes_in_use_is_set) stats.peak_bytes_in_use = a.peak_bytes_in_use;
  if (a.bytes_limit_is_set) stats.bytes_limit = a.bytes_limit;
  return stats;
}

}  // namespace torch_tpu::pjrt
