// Element types: the one vocabulary of dtypes every layer shares (the
// runtime's storages and transfers, the builder's tensor types, the ATen
// glue's dtype mapping). No syntax beyond the StableHLO type names.
#pragma once

namespace torch_tpu::hlo {

enum class ElementType {
  Bool, I8, I16, I32, I64, U8, U16, U32, U64, F16, BF16, F32, F64,
  // float8 (OCP FP8): E4M3FN has no infinities (conversions saturate to
  // +-448, as in PyTorch), E5M2 has.
  F8E4M3FN, F8E5M2,
  // complex<f32> / complex<f64> (PyTorch's complex64 / complex128).
  C64, C128,
};

const char* Name(ElementType t);  // "f32", "i1", "ui8", ...
int ByteSize(ElementType t);
bool IsFloat(ElementType t);
bool IsSigned(ElementType t);     // signed integers
bool IsUnsigned(ElementType t);   // unsigned integers
bool IsInteger(ElementType t);    // signed or unsigned, not bool
bool IsComplex(ElementType t);    // C64, C128
// The real type of a complex type's parts (C64 -> F32); other types as is.
ElementType RealPart(ElementType t);
// The complex type whose parts are `t` (F64 -> C128, other floats -> C64).
ElementType ComplexOf(ElementType t);

}  // namespace torch_tpu::hlo
