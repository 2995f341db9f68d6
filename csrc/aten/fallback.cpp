// The CPU fallback: an op without a lowering rule (or one its rule does not
// handle) runs on the CPU, its tpu tensors copied to host and back; each
// such call is counted per op in debug.stats()["fallbacks"].
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/native/CPUFallback.h>
#include <torch/library.h>

#include "aten/tpu.h"

namespace torch_tpu::aten {

namespace {

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

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&Fallback>());
}

}  // namespace torch_tpu::aten
