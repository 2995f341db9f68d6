// Copies: tpu <-> CPU transfers (a view goes through a dense temporary),
// tpu -> tpu copies (the Internal copy rule, with dtype conversion and
// broadcasting, written through the destination's view), .item().
#include <ATen/MemoryOverlap.h>
#include <torch/library.h>

#include "aten/tpu.h"

namespace torch_tpu::aten {

bool CopyResolvingMathBits(const at::Tensor& src, const at::Tensor& dst);  // complex.cpp
bool CopyComplexHalf(const at::Tensor& src, const at::Tensor& dst);       // complex_half.cpp
at::Scalar ComplexHalfItem(const at::Tensor& self);                       // complex_half.cpp

namespace {

// The tensor's values as a contiguous CPU tensor.
at::Tensor ToCpu(const at::Tensor& src) {
  FlushPending();
  at::Tensor s = src;
  auto* storage = StorageOf(s);
  hlo::ElementType t = ToElementType(s.scalar_type(), "copy to cpu");
  lowering::ViewGeometry g = GeometryOf(s);
  if (!g.whole) {
    at::Tensor dense = at::empty(s.sizes(), s.options());
    RunInto(kCopyRule, {s}, dense);
    return ToCpu(dense);
  }
  at::Tensor out = at::empty(s.sizes(), s.options().device(at::kCPU));
  if (s.numel() == 0) return out;
  PrepareStorage(storage, t, /*keep_capacity=*/true);
  DownloadStorage(*storage, out.data_ptr());
  return out;
}

void FromCpu(const at::Tensor& src, const at::Tensor& dst) {
  FlushPending();
  if (dst.numel() == 0) return;
  c10::DeviceGuard guard(dst.device());
  at::Tensor host = src.to(dst.scalar_type()).expand(dst.sizes()).contiguous();
  hlo::ElementType t = ToElementType(dst.scalar_type(), "copy to tpu");
  auto* storage = StorageOf(dst);
  lowering::ViewGeometry g = GeometryOf(dst);
  if (g.whole) {
    storage->Set(GetRuntime().Upload(host.data_ptr(), t, {host.numel()}, storage->device));
    storage->dtype = t;  // after Set: padding (if any) was counted in the old dtype
    return;
  }
  // Upload into a dense temporary, then write it through the view.
  at::Tensor tmp = at::empty(dst.sizes(), dst.options());
  FromCpu(host, tmp);
  RunInto(kCopyRule, {tmp}, dst);
}

at::Tensor CopyFrom(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  if (CopyComplexHalf(self, dst)) return dst;        // chalf: through its f16 pairs
  if (CopyResolvingMathBits(self, dst)) return dst;  // x.conj(), _neg_view()
  bool src_tpu = self.device().type() == c10::DeviceType::PrivateUse1;
  bool dst_tpu = dst.device().type() == c10::DeviceType::PrivateUse1;
  // The checks TensorIterator makes for a CPU copy_.
  if (dst_tpu) at::assert_no_internal_overlap(dst);
  if (src_tpu && dst_tpu) at::assert_no_partial_overlap(dst, self);
  try {
    if (src_tpu && dst_tpu) {
      if (self.device() == dst.device()) {
        RunInto(kCopyRule, {self}, dst);
      } else {
        FromCpu(ToCpu(self), dst);
      }
    } else if (src_tpu) {
      dst.copy_(ToCpu(self));
    } else if (dst_tpu) {
      FromCpu(self, dst);
    } else {
      TORCH_CHECK(false, "tpu _copy_from called with no tpu tensor");
    }
  } catch (const lowering::Unsupported& e) {
    TORCH_CHECK(false, "copy_: ", e.what());
  } catch (const pjrt::Error& e) {
    TORCH_CHECK(false, "copy_: ", e.what());
  } catch (const std::out_of_range& e) {  // a failed device-side assertion
    TORCH_CHECK_INDEX(false, e.what());
  }
  return dst;
}

at::Tensor CopyFromAndResize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) dst.resize_(self.sizes());
  return CopyFrom(self, dst, false);
}

at::Scalar LocalScalarDense(const at::Tensor& self) {
  if (self.scalar_type() == at::kComplexHalf) return ComplexHalfItem(self);
  try {
    return ToCpu(self).item();
  } catch (const std::out_of_range& e) {  // a failed device-side assertion
    TORCH_CHECK_INDEX(false, e.what());
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_copy_from", CopyFrom);
  m.impl("_copy_from_and_resize", CopyFromAndResize);
  m.impl("_local_scalar_dense", LocalScalarDense);
}

}  // namespace torch_tpu::aten
