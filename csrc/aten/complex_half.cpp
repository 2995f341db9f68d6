// complex32 (torch.chalf) on tpu. XLA has no complex type with float16
// parts, so a chalf storage holds its bytes exactly as PyTorch lays them out:
// float16 pairs (real, imag), the buffer of the storage's view_as_real. So
// untyped_storage().nbytes() is 4 bytes per element, views are PyTorch's
// own metadata, and view_as_real / view_as_complex share the storage with
// no conversion.
//  - Copies (to and from the host, between dtypes) go through the f16 pair
//    view: a chalf source is widened to complex64 (exact), a chalf
//    destination receives complex64 values rounded part by part to float16
//    (round to nearest even, as CPU's c10::complex<Half> conversion).
//  - An op with a lowering rule called with chalf tensors (or a chalf dtype
//    argument) runs widened: chalf inputs become complex64 copies, the op
//    runs on those (natively where complex64 has a rule), and its chalf
//    results (the dtypes PyTorch's meta kernel gives the original call) are
//    narrowed back; written chalf arguments receive the widened values.
//    CPU computes most chalf ops in complex<float> and rounds once at the
//    end, which is what this does.
#include <ATen/ops/view_as_real.h>
#include <torch/library.h>

#include "aten/tpu.h"

namespace torch_tpu::aten {

namespace {

bool IsHalfComplex(const at::Tensor& t) {
  return t.defined() && t.scalar_type() == at::kComplexHalf;
}

bool IsTpu(const at::Tensor& t) {
  return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1;
}

// The wide type a value of `t` is converted through without double
// rounding: complex128 for double sources, else complex64.
at::ScalarType WideFor(at::ScalarType t) {
  return t == at::kDouble || t == at::kComplexDouble ? at::kComplexDouble : at::kComplexFloat;
}

// A dense complex64 copy of the chalf tensor t (on t's device), with t's
// conjugate / negative bits kept as lazy bits of the copy.
at::Tensor Widen(const at::Tensor& t) {
  if (t.is_conj()) return Widen(t.conj()).conj();
  if (t.is_neg()) return Widen(t._neg_view())._neg_view();
  at::Tensor wide = at::empty(t.sizes(), t.options().dtype(at::kComplexFloat));
  at::view_as_real(wide).copy_(at::view_as_real(t));
  return wide;
}

// dst (chalf) = the values of wide (a complex tensor broadcastable to dst).
void NarrowInto(const at::Tensor& wide, const at::Tensor& dst) {
  at::Tensor plain = wide.resolve_conj().resolve_neg();
  if (!plain.is_complex()) {  // a real source: zero imaginary parts
    at::Tensor c = at::empty(dst.sizes(), dst.options().dtype(WideFor(plain.scalar_type())));
    c.copy_(plain);
    plain = c;
  }
  at::view_as_real(dst).copy_(at::view_as_real(plain));
}

// w (a result of the widened call) as the dtype the original call returns:
// chalf, or float16 for real results of chalf inputs (abs, angle). A fresh
// tensor keeps w's strides where they are dense.
at::Tensor AsDtype(const at::Tensor& w, at::ScalarType dtype) {
  if (w.scalar_type() == dtype) return w;
  at::TensorOptions o = w.options().dtype(dtype);
  at::Tensor out = w.is_non_overlapping_and_dense() ? at::empty_strided(w.sizes(), w.strides(), o)
                                                    : at::empty(w.sizes(), o);
  if (dtype == at::kComplexHalf)
    NarrowInto(w, out);
  else
    out.copy_(w);
  return out;
}

}  // namespace

// Called by _copy_from: a copy with a chalf source or destination. Returns
// false when neither is chalf.
bool CopyComplexHalf(const at::Tensor& src, const at::Tensor& dst) {
  bool from_half = IsHalfComplex(src), to_half = IsHalfComplex(dst);
  if (!from_half && !to_half) return false;
  if (from_half && to_half) {  // the f16 pairs as they are (broadcasting src)
    at::view_as_real(dst).copy_(at::view_as_real(src.resolve_conj().resolve_neg()));
    return true;
  }
  if (from_half) {
    dst.copy_(Widen(src));
    return true;
  }
  // dst is chalf: convert src to a wide complex type first (an exact step),
  // then round each part once.
  at::Tensor wide = at::empty(dst.sizes(), dst.options().dtype(WideFor(src.scalar_type())));
  wide.copy_(src);
  NarrowInto(wide, dst);
  return true;
}

// .item() of a chalf tpu tensor.
at::Scalar ComplexHalfItem(const at::Tensor& self) {
  at::Tensor host = at::empty(self.sizes(), self.options().device(at::kCPU));
  host.copy_(self);
  return host.item();
}

namespace {

bool IsScalarTypeArg(const c10::Argument& a) {
  c10::TypePtr type = a.real_type();
  if (type->kind() == c10::TypeKind::OptionalType)
    type = type->castRaw<c10::OptionalType>()->getElementType();
  return type->kind() == c10::TypeKind::ScalarTypeType;
}

bool IsWritten(const c10::Argument& a) { return a.alias_info() && a.alias_info()->isWrite(); }

// The result dtypes of the original (chalf) call, from the meta kernels;
// empty if the op has none.
std::vector<std::optional<at::ScalarType>> MetaDtypes(const c10::OperatorHandle& op,
                                                      const std::vector<c10::IValue>& args) {
  auto to_meta = [](const at::Tensor& t) {
    if (!t.defined() || t.device().type() == at::kCPU) return t;
    return at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta));
  };
  torch::jit::Stack stack;
  for (const auto& v : args) {
    if (v.isTensor()) {
      stack.emplace_back(to_meta(v.toTensor()));
    } else if (v.isTensorList()) {
      std::vector<at::Tensor> list;
      for (const at::Tensor& t : v.toTensorVector()) list.push_back(to_meta(t));
      stack.emplace_back(list);
    } else {
      stack.push_back(v);
    }
  }
  std::vector<std::optional<at::ScalarType>> dtypes;
  try {
    op.callBoxed(&stack);
  } catch (const std::exception&) {
    return dtypes;
  }
  for (const auto& r : stack) {
    at::Tensor t;  // a list's first element stands for the list
    if (r.isTensor()) t = r.toTensor();
    if (r.isTensorList() && !r.toTensorVector().empty()) t = r.toTensorVector()[0];
    dtypes.push_back(t.defined() ? std::optional(t.scalar_type()) : std::nullopt);
  }
  return dtypes;
}

// The chalf tpu tensors of an argument: a tensor or a tensor list.
bool HasHalfComplex(const c10::IValue& v) {
  if (v.isTensor()) return IsTpu(v.toTensor()) && IsHalfComplex(v.toTensor());
  if (v.isTensorList())
    for (const at::Tensor& t : v.toTensorVector())
      if (IsTpu(t) && IsHalfComplex(t)) return true;
  return false;
}

}  // namespace

// Whether EagerKernel must run this call widened (RunWidened).
bool NeedsWidening(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const auto& schema = op.schema().arguments();
  auto first = stack.end() - static_cast<std::ptrdiff_t>(schema.size());
  for (size_t i = 0; i < schema.size(); ++i) {
    const c10::IValue& v = first[i];
    if (HasHalfComplex(v)) return true;
    if (v.isInt() && v.toInt() == static_cast<int64_t>(at::kComplexHalf) &&
        IsScalarTypeArg(schema[i]))
      return true;
  }
  return false;
}

// Runs the op on complex64 copies of its chalf arguments (see the top).
void RunWidened(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  size_t n = schema.arguments().size();
  std::vector<c10::IValue> args(stack->end() - static_cast<std::ptrdiff_t>(n), stack->end());
  std::vector<std::optional<at::ScalarType>> dtypes = MetaDtypes(op, args);
  std::vector<c10::IValue> wide = args;
  for (size_t i = 0; i < n; ++i) {
    c10::IValue& v = wide[i];
    if (v.isTensor() && IsTpu(v.toTensor()) && IsHalfComplex(v.toTensor())) {
      v = Widen(v.toTensor());
    } else if (v.isTensorList() && HasHalfComplex(v)) {
      std::vector<at::Tensor> list = v.toTensorVector();
      for (at::Tensor& t : list)
        if (IsTpu(t) && IsHalfComplex(t)) t = Widen(t);
      v = list;
    } else if (v.isInt() && IsScalarTypeArg(schema.arguments()[i]) &&
               static_cast<at::ScalarType>(v.toInt()) == at::kComplexHalf) {
      v = static_cast<int64_t>(at::kComplexFloat);
    }
  }
  torch::jit::Stack call(wide.begin(), wide.end());
  op.callBoxed(&call);
  // Written chalf arguments get the widened values back.
  for (size_t i = 0; i < n; ++i) {
    if (!IsWritten(schema.arguments()[i]) || !args[i].isTensor()) continue;
    const at::Tensor& orig = args[i].toTensor();
    if (!IsHalfComplex(orig) || !IsTpu(orig)) continue;
    const at::Tensor& w = wide[i].toTensor();
    if (orig.sizes() != w.sizes()) orig.resize_(w.sizes());
    NarrowInto(w, orig);
  }
  // Results: aliases of written arguments are the originals; fresh ones
  // are narrowed where the original call returns chalf.
  const auto& returns = schema.returns();
  for (size_t r = 0; r < call.size(); ++r) {
    c10::IValue& v = call[r];
    if (v.isTensorList()) {
      std::vector<at::Tensor> list = v.toTensorVector();
      if (r < dtypes.size() && dtypes[r])
        for (at::Tensor& t : list) t = AsDtype(t, *dtypes[r]);
      v = list;
      continue;
    }
    if (!v.isTensor() || !v.toTensor().defined()) continue;
    if (r < returns.size() && returns[r].alias_info()) {
      for (size_t i = 0; i < n; ++i)
        if (schema.arguments()[i].alias_info() &&
            *schema.arguments()[i].alias_info() == *returns[r].alias_info())
          v = args[i];
      continue;
    }
    if (r < dtypes.size() && dtypes[r])
      v = AsDtype(v.toTensor(), *dtypes[r]);
    else if (r >= dtypes.size() && v.toTensor().scalar_type() == at::kComplexFloat)
      v = AsDtype(v.toTensor(), at::kComplexHalf);  // no meta kernel: complex results narrow
  }
  torch::jit::drop(*stack, n);
  for (auto& v : call) stack->push_back(std::move(v));
}

}  // namespace torch_tpu::aten
