// Helpers of the complex linear-algebra rule files (complex_linalg.cpp,
// complex_qr_svd.cpp): conjugates, Hermitian matrices. No rule lives here.
#pragma once

#include <string>

#include "lowering/linalg_common.h"

namespace torch_tpu::lowering::linalg::complex_matrix {

inline int64_t Rows(const Value& v) { return v.shape()[v.rank() - 2]; }
inline int64_t Cols(const Value& v) { return v.shape()[v.rank() - 1]; }

inline Value Conj(Builder& b, Value x) { return b.Complex(b.Real(x), b.Unary("negate", b.Imag(x))); }

// A complex64 / complex128 matrix arg, else Unsupported.
inline Value ComplexMatrix(const Value& v, const std::string& op) {
  if (v.dtype() != E::C64 && v.dtype() != E::C128) throw Unsupported(op + ": complex64/128 only");
  if (v.rank() < 2) throw Unsupported(op + " of a tensor of rank < 2");
  return v;
}

// The Hermitian matrix of x's lower (upper) triangle; the diagonal real
// (LAPACK reads only that triangle and the diagonal's real part).
inline Value Hermitian(Builder& b, Value x, bool from_lower) {
  Value strict = Masked(b, TriangleMask(b, x.shape(), from_lower ? "GT" : "LT"), x);
  Value diag = Masked(b, TriangleMask(b, x.shape(), "EQ"), b.Real(x));
  Value d = b.Complex(diag, b.Splat(diag.dtype(), 0, diag.shape()));
  return b.Binary("add", b.Binary("add", strict, Conj(b, MT(b, strict))), d);
}

}  // namespace torch_tpu::lowering::linalg::complex_matrix
