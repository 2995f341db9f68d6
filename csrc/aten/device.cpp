// The tpu device: which PJRT plugin it runs on, the runtime (created on
// first use, refused in a forked child), the dtype mapping, and the
// registration of the device's pieces with PyTorch.
#include <ATen/detail/PrivateUse1HooksInterface.h>

#include "aten/tpu.h"
#include "lowering/lowering.h"

namespace torch_tpu::aten {

using runtime::Runtime;

// ------------------------------------------------------------------ runtime

namespace {
std::string g_plugin_path;
int g_cpu_devices = 1;
}  // namespace

void ConfigurePlugin(const std::string& path, int cpu_devices) {
  g_plugin_path = path;
  g_cpu_devices = cpu_devices;
}

Runtime& GetRuntime() {
  TORCH_CHECK(!Runtime::InForkedChild(),
              "torch_tpu: cannot re-initialize the tpu device in a forked subprocess (its "
              "runtime belongs to the parent process). To use tpu with multiprocessing, use the "
              "'spawn' start method: torch.multiprocessing.set_start_method('spawn')");
  if (!Runtime::IsInitialized()) {
    TORCH_CHECK(!g_plugin_path.empty(),
                "torch_tpu: no PJRT plugin configured. Install xla-cpu-pjrt or set "
                "TORCH_TPU_PLUGIN to cpu, cuda, tpu or a plugin path");
    try {
      Runtime::Initialize(g_plugin_path, g_cpu_devices);
      lowering::SetTargetPlatform(Runtime::Get().platform());
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "torch_tpu: ", e.what());
    }
  }
  return Runtime::Get();
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
    case at::kComplexFloat: return E::C64;
    case at::kComplexDouble: return E::C128;
    case at::kComplexHalf:
      throw lowering::Unsupported(
          std::string(op) + ": dtype ComplexHalf (torch.complex32 / torch.chalf) has no tpu "
          "representation: XLA has no complex type with float16 parts. Use torch.complex64 on "
          "tpu (x.to(torch.complex64)), or keep complex32 tensors on the CPU");
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
    case E::C64: return at::kComplexFloat;
    case E::C128: return at::kComplexDouble;
  }
  return at::kFloat;
}

void RecordFallback(const std::string& op) { ++GetRuntime().stats().fallbacks[op]; }

// ------------------------------------------------------------------ registration

void RegisterNativeRules();  // op_table.cpp

void RegisterDevice() {
  static bool done = false;
  if (done) return;
  done = true;
  RegisterHooks();
  c10::SetAllocator(c10::DeviceType::PrivateUse1, DeviceAllocator());
  RegisterNativeRules();
}

}  // namespace torch_tpu::aten
