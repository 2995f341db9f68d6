// Complex numbers on tpu: the ATen glue that is not a lowering rule.
//  - view_as_real / view_as_complex are views (same storage, another dtype),
//    registered natively like the other view ops;
//  - a storage seen with both a complex dtype and its real part type (a
//    complex tensor and its view_as_real) is reinterpreted on the device
//    (stablehlo.real/imag/complex) instead of through the host;
//  - copies of tensors with the conjugate or negative bit set (x.conj(),
//    x.conj().imag) resolve the bit on the device.
#include <ATen/native/Resize.h>
#include <algorithm>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <torch/library.h>

#include "aten/storage_module.h"
#include "aten/tpu.h"

namespace torch_tpu::aten {

using hlo::ElementType;

namespace {

// The module that turns a 1-D buffer of `from` into one of `to`, where one is
// complex and the other its part type (or a type of that width, by bitcast).
std::string ReinterpretModule(ElementType from, int64_t from_numel, ElementType to,
                              int64_t to_numel) {
  hlo::Builder b("reinterpret");
  hlo::Value x = b.Parameter(hlo::TensorType{from, {from_numel}});
  if (hlo::IsComplex(from)) {
    ElementType part = hlo::RealPart(from);
    hlo::Value re = b.Reshape(b.Real(x), {from_numel, 1});
    hlo::Value im = b.Reshape(b.Imag(x), {from_numel, 1});
    hlo::Value flat = b.Reshape(b.Concatenate({re, im}, 1), {to_numel});
    b.Return({to == part ? flat : b.BitcastConvert(flat, to)});
  } else {
    ElementType part = hlo::RealPart(to);
    hlo::Value parts = from == part ? x : b.BitcastConvert(x, part);
    hlo::Value pairs = b.Reshape(parts, {to_numel, 2});
    hlo::Value re = b.Reshape(b.Slice(pairs, {0, 0}, {to_numel, 1}, {1, 1}), {to_numel});
    hlo::Value im = b.Reshape(b.Slice(pairs, {0, 1}, {to_numel, 2}, {1, 1}), {to_numel});
    b.Return({b.Complex(re, im)});
  }
  return b.ToText();
}

}  // namespace

// Called by PrepareStorage before it reinterprets bytes through the host:
// handles complex <-> part-width real types on the device. Returns false for
// anything else.
bool ReinterpretComplexStorage(runtime::DeviceStorage* s, ElementType to) {
  ElementType from = s->dtype;
  if (hlo::IsComplex(from) == hlo::IsComplex(to) || !s->buffer) return false;
  ElementType c = hlo::IsComplex(from) ? from : to, r = hlo::IsComplex(from) ? to : from;
  if (hlo::ByteSize(r) * 2 != hlo::ByteSize(c) || hlo::IsComplex(r)) return false;
  if (r != hlo::RealPart(c) && (r == ElementType::Bool || hlo::ByteSize(r) < 4)) return false;
  int64_t from_numel = static_cast<int64_t>(s->nbytes) / hlo::ByteSize(from);
  int64_t to_numel = static_cast<int64_t>(s->nbytes) / hlo::ByteSize(to);
  if (from_numel == 0) return false;
  std::string key = std::string("reinterpret|") + hlo::Name(from) + "|" + hlo::Name(to) + "|" +
                    std::to_string(from_numel);
  static const std::string op = "reinterpret complex storage";
  RunStorageModule(op, key, s->device, [&] { return ReinterpretModule(from, from_numel, to, to_numel); },
                   s, s, to);
  return true;
}

// Called first by _copy_from: copies where src or dst has the conjugate or
// negative bit (lazy x.conj(), x.conj().imag) copy the plain data, then
// conjugate / negate the destination in place. Returns false when no bit is
// set.
bool CopyResolvingMathBits(const at::Tensor& src, const at::Tensor& dst) {
  // Writing into a conjugated (negated) view writes the conjugate (negation)
  // of src into the plain tensor behind it.
  if (dst.is_conj()) {
    at::Tensor plain = dst.conj();
    plain.copy_(src.is_complex() ? src.conj() : src);
    return true;
  }
  if (dst.is_neg()) {
    at::Tensor plain = dst._neg_view();
    plain.copy_(src._neg_view());
    return true;
  }
  if (!src.is_conj() && !src.is_neg()) return false;
  at::Tensor plain = src;
  if (src.is_conj()) plain = plain.conj();
  if (src.is_neg()) plain = plain._neg_view();
  dst.copy_(plain);
  if (src.is_conj() && dst.is_complex()) dst.conj_physical_();
  if (src.is_neg()) dst.neg_();
  return true;
}

namespace {

// A dense copy of t's values (math bits applied by CopyResolvingMathBits).
// Not clone() / resolve_conj(): clone is a rule of the generic kernel again.
at::Tensor PlainCopy(const at::Tensor& t) {
  at::Tensor copy = at::empty(t.sizes(), t.options());
  copy.copy_(t);
  return copy;
}

}  // namespace

// The generic kernel's inputs, before it plans the op:
//  - tensors with the conjugate or negative bit set (the math-bit fallbacks
//    let mm, bmm, addmm, dot, clone, _to_copy, ... through with them, since
//    CPU and CUDA kernels read the bits) are replaced by their values;
//  - one storage read with two dtypes in one op (z * z.real: complex64 and
//    float32): a module takes each storage as one buffer of one type, so the
//    read-only inputs whose dtype differs from the storage's first (or
//    written) use are copied.
// A written argument with a math bit set is refused.
void ResolveTensorInputs(std::vector<c10::IValue>& args, const std::vector<size_t>& mutable_args,
                         const std::vector<size_t>& out_args, const std::string& op) {
  auto written = [&](size_t i) {
    return std::find(mutable_args.begin(), mutable_args.end(), i) != mutable_args.end() ||
           std::find(out_args.begin(), out_args.end(), i) != out_args.end();
  };
  auto is_tpu = [](const at::Tensor& t) {
    return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1;
  };
  // Fast path (every op): no bit set, no storage read with two dtypes.
  bool needed = false;
  for (size_t i = 0; i < args.size() && !needed; ++i) {
    if (!args[i].isTensor() || !is_tpu(args[i].toTensor())) continue;
    const at::Tensor& t = args[i].toTensor();
    needed = t.is_conj() || t.is_neg();
    for (size_t j = 0; j < i && !needed; ++j)
      needed = args[j].isTensor() && is_tpu(args[j].toTensor()) &&
               args[j].toTensor().scalar_type() != t.scalar_type() &&
               args[j].toTensor().storage().is_alias_of(t.storage());
  }
  if (!needed) return;
  // The dtype each storage is used with: written args first.
  std::vector<std::pair<const void*, at::ScalarType>> uses;
  auto use_of = [&](const at::Tensor& t) -> const at::ScalarType* {
    for (const auto& u : uses)
      if (u.first == t.storage().unsafeGetStorageImpl()) return &u.second;
    return nullptr;
  };
  for (size_t pass = 0; pass < 2; ++pass)
    for (size_t i = 0; i < args.size(); ++i)
      if (args[i].isTensor() && (written(i) == (pass == 0))) {
        const at::Tensor& t = args[i].toTensor();
        if (is_tpu(t) && !use_of(t))
          uses.emplace_back(t.storage().unsafeGetStorageImpl(), t.scalar_type());
      }
  for (size_t i = 0; i < args.size(); ++i) {
    if (!args[i].isTensor()) continue;
    const at::Tensor& t = args[i].toTensor();
    if (!is_tpu(t)) continue;
    bool bits = t.is_conj() || t.is_neg();
    bool other_dtype = *use_of(t) != t.scalar_type();
    if (!bits && !other_dtype) continue;
    TORCH_CHECK(!written(i), op, ": writing into a tensor with the conjugate or negative bit "
                "set, or into a storage the op also reads with another dtype, is not "
                "supported on tpu; call .resolve_conj() / .resolve_neg() or .clone() first");
    args[i] = PlainCopy(t);
  }
}

namespace {

// view_as_real of a conjugated tensor is an error on CPU too
// (at::native::view_as_real says so); both are plain views of the storage.
at::Tensor ViewAsReal(const at::Tensor& self) { return at::native::view_as_real(self); }
at::Tensor ViewAsComplex(const at::Tensor& self) { return at::native::view_as_complex(self); }

}  // namespace

// copy_ is a fallthrough for the Conjugate and Negative keys, and for a tpu
// tensor it calls _copy_from, which by default meets those keys' fallbacks;
// they resolved the bit of a source through a clone that is itself a
// _copy_from and dropped it (x.conj().cpu() gave x). Like copy_, let
// _copy_from through: CopyResolvingMathBits sees the bits and resolves them.
// _copy_from exists for out-of-tree devices only (CPU/CUDA copies never call
// it).
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("view_as_real", ViewAsReal);
  m.impl("view_as_complex", ViewAsComplex);
}

}  // namespace torch_tpu::aten
