#include "hlo/element_type.h"

namespace torch_tpu::hlo {

const char* Name(ElementType t) {
  switch (t) {
    case ElementType::Bool: return "i1";
    case ElementType::I8: return "i8";
    case ElementType::I16: return "i16";
    case ElementType::I32: return "i32";
    case ElementType::I64: return "i64";
    case ElementType::U8: return "ui8";
    case ElementType::U16: return "ui16";
    case ElementType::U32: return "ui32";
    case ElementType::U64: return "ui64";
    case ElementType::F16: return "f16";
    case ElementType::BF16: return "bf16";
    case ElementType::F32: return "f32";
    case ElementType::F64: return "f64";
    case ElementType::F8E4M3FN: return "f8E4M3FN";
    case ElementType::F8E5M2: return "f8E5M2";
    case ElementType::C64: return "complex<f32>";
    case ElementType::C128: return "complex<f64>";
  }
  return "?";
}

int ByteSize(ElementType t) {
  switch (t) {
    case ElementType::Bool: case ElementType::I8: case ElementType::U8:
    case ElementType::F8E4M3FN: case ElementType::F8E5M2: return 1;
    case ElementType::I16: case ElementType::U16: case ElementType::F16:
    case ElementType::BF16: return 2;
    case ElementType::I32: case ElementType::U32: case ElementType::F32: return 4;
    case ElementType::I64: case ElementType::U64: case ElementType::F64:
    case ElementType::C64: return 8;
    case ElementType::C128: return 16;
  }
  return 0;
}

bool IsFloat(ElementType t) {
  return t == ElementType::F16 || t == ElementType::BF16 ||
         t == ElementType::F32 || t == ElementType::F64 || t == ElementType::F8E4M3FN ||
         t == ElementType::F8E5M2;
}
bool IsSigned(ElementType t) {
  return t == ElementType::I8 || t == ElementType::I16 || t == ElementType::I32 ||
         t == ElementType::I64;
}
bool IsUnsigned(ElementType t) {
  return t == ElementType::U8 || t == ElementType::U16 || t == ElementType::U32 ||
         t == ElementType::U64;
}
bool IsInteger(ElementType t) { return IsSigned(t) || IsUnsigned(t); }
bool IsComplex(ElementType t) { return t == ElementType::C64 || t == ElementType::C128; }
ElementType RealPart(ElementType t) {
  if (t == ElementType::C64) return ElementType::F32;
  if (t == ElementType::C128) return ElementType::F64;
  return t;
}
ElementType ComplexOf(ElementType t) {
  if (IsComplex(t)) return t;
  return t == ElementType::F64 ? ElementType::C128 : ElementType::C64;
}

}  // namespace torch_tpu::hlo
