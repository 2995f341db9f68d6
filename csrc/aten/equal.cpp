// torch.equal on tpu tensors: one device reduction and one scalar read (istft
// checks its window envelope with it). Without it the CPU fallback copied
// both tensors to the host.
#include <ATen/ops/all.h>
#include <ATen/ops/eq.h>
#include <torch/library.h>

#include "aten/tpu.h"

namespace torch_tpu::aten {
namespace {

bool Equal(const at::Tensor& self, const at::Tensor& other) {
  TORCH_CHECK(self.device() == other.device(), "Cannot compare two tensors on different "
              "devices. Got: ", self.device(), " and ", other.device());
  if (self.sizes() != other.sizes()) return false;
  if (self.numel() == 0) return true;
  return at::eq(self, other).all().item<bool>();
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("equal", Equal); }

}  // namespace torch_tpu::aten
