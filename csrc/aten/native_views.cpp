// Tensor ops tpu serves natively without a module: empty tensors, views
// (as_strided, view, unfold: new geometry over the same storage), resize_
// and set_.
#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_native.h>
#include <torch/library.h>

#include <typeinfo>

#include "aten/tpu.h"

namespace torch_tpu::aten {

namespace {

at::Tensor EmptyMemoryFormat(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                             std::optional<at::Layout>, std::optional<at::Device> device,
                             std::optional<bool>, std::optional<at::MemoryFormat> memory_format) {
  c10::OptionalDeviceGuard guard(device);
  GetRuntime();
  return at::detail::empty_generic(size, DeviceAllocator(),
                                   c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor EmptyStrided(c10::IntArrayRef size, c10::IntArrayRef stride,
                        std::optional<at::ScalarType> dtype, std::optional<at::Layout>,
                        std::optional<at::Device> device, std::optional<bool>) {
  c10::OptionalDeviceGuard guard(device);
  GetRuntime();
  return at::detail::empty_strided_generic(size, stride, DeviceAllocator(),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

at::Tensor AsStrided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                     std::optional<c10::SymInt> offset) {
  return at::native::as_strided_tensorimpl(
      self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride),
      offset.has_value() ? std::optional<int64_t>(offset->expect_int()) : std::nullopt);
}

at::Tensor View(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor ReshapeAlias(const at::Tensor& self, c10::SymIntArrayRef size,
                        c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size),
                                    C10_AS_INTARRAYREF_SLOW(stride));
}

const at::Tensor& Resize(const at::Tensor& self, c10::SymIntArrayRef size,
                         std::optional<at::MemoryFormat> memory_format) {
  auto sizes = C10_AS_INTARRAYREF_SLOW(size);
  auto* impl = self.unsafeGetTensorImpl();
  int64_t itemsize = static_cast<int64_t>(self.element_size());
  impl->set_sizes_contiguous(sizes);
  if (memory_format.has_value() && *memory_format != at::MemoryFormat::Preserve)
    impl->empty_tensor_restride(*memory_format);
  size_t needed = static_cast<size_t>(
      (at::detail::computeStorageNbytes(self.sizes(), self.strides(), itemsize,
                                        self.storage_offset())));
  if (needed > self.storage().nbytes()) ResizeStorage(self.storage(), needed);
  return self;
}

at::Tensor& SetSourceStorage(at::Tensor& self, at::Storage source) {
  int64_t n = static_cast<int64_t>(source.nbytes() / self.element_size());
  return at::native::set_storage_cpu_(self, source, 0, {n}, {});
}

at::Tensor& SetSourceStorageOffset(at::Tensor& self, at::Storage source, c10::SymInt offset,
                                   c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::native::set_storage_cpu_(self, source, offset.expect_int(),
                                      C10_AS_INTARRAYREF_SLOW(size),
                                      C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor& SetSourceTensor(at::Tensor& self, const at::Tensor& source) {
  return at::native::set_tensor_(self, source);
}

at::Tensor& SetEmpty(at::Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, DeviceAllocator(), true);
  return at::native::set_storage_cpu_(self, storage, 0, {0}, {});
}

// Whether `var.data = from` may shallow-copy `from` into `var`. PyTorch's own
// answer (TensorImpl::has_compatible_shallow_copy_type) knows the built-in
// dense backends only, so without this `module.to("tpu")` replaced every
// Parameter by a new one per module and untied shared (tied) weights. Plain
// strided tensors with a plain TensorImpl on cpu or tpu are compatible.
bool HasCompatibleShallowCopyType(const at::Tensor& self, const at::Tensor& from) {
  if (self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set())) return true;
  auto plain = [](const at::Tensor& t) {
    const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    auto type = t.device().type();
    return typeid(*impl) == typeid(c10::TensorImpl) && t.layout() == c10::kStrided &&
           t.key_set().has(c10::DispatchKey::Dense) && !t.key_set().has(c10::DispatchKey::Python) &&
           (type == c10::DeviceType::CPU || type == c10::DeviceType::PrivateUse1);
  };
  return plain(self) && plain(from);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", HasCompatibleShallowCopyType);
  m.impl("empty.memory_format", EmptyMemoryFormat);
  m.impl("empty_strided", EmptyStrided);
  m.impl("as_strided", AsStrided);
  m.impl("view", View);
  m.impl("_reshape_alias", ReshapeAlias);
  m.impl("unfold", at::native::unfold);
  m.impl("resize_", Resize);
  m.impl("set_.source_Storage", SetSourceStorage);
  m.impl("set_.source_Storage_storage_offset", SetSourceStorageOffset);
  m.impl("set_.source_Tensor", SetSourceTensor);
  m.impl("set_", SetEmpty);
}

}  // namespace torch_tpu::aten
