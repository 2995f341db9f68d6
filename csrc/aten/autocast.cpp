// Autocast for the tpu device: torch.autocast(device_type="tpu") uses the
// same op lists as CUDA (PyTorch's AT_FORALL_* lists), registered for the
// AutocastPrivateUse1 key. Matmuls and convolutions run in the autocast dtype
// (bfloat16 by default on tpu), precision-sensitive ops (softmax, norms,
// losses, exp/log, ...) in float32, and ops taking several inputs at the
// widest of their types. Every other op falls through unchanged.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace torch_tpu::aten {
namespace {

// As on CUDA: binary_cross_entropy is unsafe to autocast (its backward is
// not fp16-safe); users are told to use the _with_logits form.
at::Tensor BinaryCrossEntropyBanned(const at::Tensor&, const at::Tensor&,
                                    const std::optional<at::Tensor>&, int64_t) {
  TORCH_CHECK(false,
              "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to "
              "autocast.\nMany models use a sigmoid layer right before the binary cross "
              "entropy layer.\nIn this case, combine the two layers using "
              "torch.nn.functional.binary_cross_entropy_with_logits\nor torch.nn.BCEWithLogitsLoss. "
              " binary_cross_entropy_with_logits and BCEWithLogits are\nsafe to autocast.");
}

// TPUs compute in bfloat16 natively: make it the default autocast dtype (in
// the thread that loads the extension; torch keeps it per thread).
const bool default_dtype_set = [] {
  at::autocast::set_autocast_dtype(at::kPrivateUse1, at::kBFloat16);
  return true;
}();

// The AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE list names these unqualified.
#if __has_include(<ATen/core/Dimname.h>)
// torch < 2.13 still lists named-tensor overloads (used on the GPU machine's
// torch 2.11); 2.13 dropped named tensors.
using at::DimnameList;
#endif
using at::IntArrayRef;
using at::Scalar;
using at::ScalarType;
using at::Tensor;

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define TPU_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define TPU_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define TPU_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define TPU_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_LOWER_PRECISION_FP(TPU_LOWER_PRECISION_FP)
  AT_FORALL_FP32(TPU_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(TPU_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(TPU_PROMOTE)
#undef TPU_LOWER_PRECISION_FP
#undef TPU_FP32
#undef TPU_FP32_SET_OPT_DTYPE
#undef TPU_PROMOTE
  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"),
         TORCH_FN((&BinaryCrossEntropyBanned)));
}

}  // namespace
}  // namespace torch_tpu::aten
