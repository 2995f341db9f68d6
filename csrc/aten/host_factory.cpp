// Small factories at new sizes, without an executable per size. A rule that
// says so (RuleEntry::small_results_on_host: arange) has no tensor input:
// its values come from scalars alone, so its sizes are its cache key and an
// exact-shape cache compiles one module per new length (a StaticCache's
// cache positions at every new prompt length). Once the op has compiled one
// size, a later new size whose result fits in 64 KiB is computed by
// PyTorch's own CPU kernel (bit-equal to CPU eager) and uploaded into the
// out tensor: one host-to-device copy, as torch.tensor(...) costs, and no
// compile. Larger results, and mode 0 (exact shapes), compile as before.
#include <ATen/ATen.h>

#include <mutex>
#include <unordered_set>

#include "aten/call.h"
#include "aten/dynamic.h"

namespace torch_tpu::aten {

namespace {

constexpr size_t kMaxHostBytes = size_t{64} << 10;

std::mutex& SeenMutex() {
  static std::mutex mu;
  return mu;
}
std::unordered_set<std::string>& Seen() {
  static auto* seen = new std::unordered_set<std::string>();
  return *seen;
}

// Whether `op|dtype` has compiled a size already (the first size compiles:
// its repeats then hit the executable).
bool CompiledBefore(const std::string& signature) {
  std::lock_guard<std::mutex> lock(SeenMutex());
  return !Seen().insert(signature).second;
}

bool Eligible(const Call& call) {
  if (!call.desc->rule || !call.desc->rule->small_results_on_host) return false;
  if (call.desc->variant != Variant::Out || !call.plan.inputs.empty()) return false;
  if (call.plan.dests.size() != 1 || GetDynamicMode() == DynamicMode::Off) return false;
  const at::Tensor& out = call.plan.dests[0].tensor;
  if (!out.defined() || !out.is_contiguous()) return false;
  const size_t bytes = static_cast<size_t>(out.numel()) * out.element_size();
  if (bytes > kMaxHostBytes) return false;
  return CompiledBefore(call.desc->name + "|" + c10::toString(out.scalar_type()));
}

}  // namespace

std::optional<std::vector<c10::IValue>> RunFactoryOnHost(const Call& call, const c10::OperatorHandle& op,
                                                         const std::vector<c10::IValue>& args) {
  if (!Eligible(call)) return std::nullopt;
  const at::Tensor& out = call.plan.dests[0].tensor;
  torch::jit::Stack stack(args.begin(), args.end());
  const size_t o = call.desc->out_args.at(0);
  at::Tensor host = at::empty({0}, out.options().device(c10::kCPU));
  stack[o] = host;
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
  TORCH_CHECK(host.sizes() == out.sizes(), call.desc->name, ": the CPU kernel gave ", host.sizes(),
              ", the device's out tensor is ", out.sizes());
  at::Tensor dst = out;
  dst.copy_(host);  // an upload into the out tensor's storage
  return std::vector<c10::IValue>{out};
}

// After clear_cache() the first size compiles again, as it did at first.
void ClearHostFactorySizes() {
  std::lock_guard<std::mutex> lock(SeenMutex());
  Seen().clear();
}

}  // namespace torch_tpu::aten
