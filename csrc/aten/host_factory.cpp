// Small factories without an executable per size. A rule that says so
// (RuleEntry::small_results_on_host: arange, eye) has no tensor input: its values
// come from scalars alone, so its sizes and values are its cache key, and an
// exact-shape cache compiles one module per new length or start (a decode
// step's cache position). With dynamic shapes on, a result that fits in
// 64 KiB is computed by PyTorch's own CPU kernel (bit-equal to CPU eager) and
// uploaded into the out tensor: one host-to-device copy, as torch.tensor(...)
// costs, and no compile. It runs before the call is planned: no meta kernel
// and no cache key (arange at a decode step's new start cost 220 us through
// them, 9 us without, against 30 us for a cached executable on XLA:CPU).
// Larger results, and mode 0 (exact shapes), compile as before.
#include <ATen/ATen.h>
#include <ATen/native/Resize.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "aten/call.h"
#include "aten/dynamic.h"

namespace torch_tpu::aten {

namespace {

constexpr size_t kMaxHostBytes = size_t{64} << 10;

// The out tensor of a call of a rule that says so, when it has no other
// tensor arg; nullptr otherwise.
const at::Tensor* HostFactoryOut(const OpDesc& desc, const std::vector<c10::IValue>& args) {
  if (!desc.rule || !desc.rule->small_results_on_host || desc.variant != Variant::Out) return nullptr;
  if (desc.out_args.size() != 1 || GetDynamicMode() == DynamicMode::Off) return nullptr;
  const size_t o = desc.out_args[0];
  for (size_t a = 0; a < args.size(); ++a)
    if (a != o && (args[a].isTensor() || args[a].isTensorList() || args[a].isList())) return nullptr;
  return o < args.size() && args[o].isTensor() && args[o].toTensor().defined() ? &args[o].toTensor() : nullptr;
}

// How many elements the result of a call could hold, read from its args
// before any kernel runs: a range's length (arange: start, end, step) or the
// product of an eye's sizes (n x n, or n x m). nullopt for args that say no size (a bad range:
// the kernel's checks raise).
std::optional<double> ResultElements(const std::vector<c10::IValue>& args) {
  if (args.size() >= 3 && args[0].isScalar() && args[1].isScalar() && args[2].isScalar()) {
    const double start = args[0].toScalar().to<double>(), end = args[1].toScalar().to<double>();
    const double step = args[2].toScalar().to<double>();
    if (step == 0 || !std::isfinite(start) || !std::isfinite(end)) return std::nullopt;
    return std::ceil((end - start) / step);
  }
  std::vector<double> sizes;  // eye(n) / eye(n, m): its int args, then out
  for (const c10::IValue& a : args) {
    if (!a.isInt()) break;
    sizes.push_back(static_cast<double>(std::max<int64_t>(a.toInt(), 0)));
  }
  if (sizes.empty() || sizes.size() > 2) return std::nullopt;
  return sizes[0] * sizes.back();  // n x n, or n x m
}

// Whether the result could fit in kMaxHostBytes of `out`'s dtype: a large
// result is never computed on the host only to be thrown away.
bool MayFitOnHost(const std::vector<c10::IValue>& args, const at::Tensor& out) {
  const std::optional<double> elements = ResultElements(args);
  return !elements || *elements * static_cast<double>(out.element_size()) <= 2.0 * kMaxHostBytes;  // margin for rounding
}

}  // namespace

std::optional<std::vector<c10::IValue>> RunFactoryOnHost(const OpDesc& desc, const c10::OperatorHandle& op,
                                                         const std::vector<c10::IValue>& args) {
  const at::Tensor* found = HostFactoryOut(desc, args);
  if (!found) return std::nullopt;
  at::Tensor out = *found;
  if (!MayFitOnHost(args, out)) return std::nullopt;
  // PyTorch's CPU kernel first (a few us): its result says the size, so no
  // meta kernel runs for a size the device has never seen.
  torch::jit::Stack stack(args.begin(), args.end());
  at::Tensor host = at::empty({0}, out.options().device(c10::kCPU));
  stack[desc.out_args[0]] = host;
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
  const size_t bytes = static_cast<size_t>(host.numel()) * host.element_size();
  if (bytes > kMaxHostBytes) return std::nullopt;
  at::native::resize_output(out, host.sizes());  // out= semantics: PyTorch's warning on a non-empty out
  if (!out.is_contiguous()) return std::nullopt;
  out.copy_(host);  // an upload into the out tensor's storage
  return std::vector<c10::IValue>{out};
}

}  // namespace torch_tpu::aten
