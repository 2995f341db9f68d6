// Helpers of the complex rule files (complex_*.cpp): running a generic rule
// on real parts under output types of one's own, and splitting args into
// their real and imaginary parts. No rule lives here.
#pragma once

#include <string>
#include <vector>

#include "lowering/lowering.h"

namespace torch_tpu::lowering::complex_parts {

// The rule registered as `op` (gated: real args and real `outputs` reach
// the generic rule) run under `outputs`; its device checks are kept.
inline std::vector<Value> Delegate(Context& c, const std::string& op,
                                   const std::vector<TensorType>& outputs,
                                   const std::vector<Arg>& args) {
  Context sub{c.b};
  sub.outputs = outputs;
  sub.fp32_highest = c.fp32_highest;
  sub.op = c.op;
  sub.default_float = c.default_float;
  std::vector<Value> r = Find(op)->rule(sub, args);
  for (auto& check : sub.checks) c.checks.push_back(std::move(check));
  return r;
}

// A type with the real part type of t (t itself when real).
inline TensorType PartType(const TensorType& t) {
  TensorType r = t;
  if (hlo::IsComplex(t.dtype)) r.dtype = hlo::RealPart(t.dtype);
  return r;
}

// The real (imag = false) or imaginary part of a Tensor or Scalar arg, as an
// arg of the same kind; a real value's imaginary part is zero. Other kinds
// are returned as they are.
inline Arg PartOf(Builder& b, const Arg& a, bool imag) {
  if (a.kind != Arg::Kind::Tensor && a.kind != Arg::Kind::Scalar) return a;
  Arg r = a;
  Value v = a.tensor;
  if (hlo::IsComplex(v.dtype())) {
    r.tensor = imag ? b.Imag(v) : b.Real(v);
  } else if (imag) {
    r.tensor = b.Splat(v.dtype(), 0, v.shape());
  }
  if (a.kind == Arg::Kind::Scalar && hlo::IsComplex(a.scalar_type))
    r.scalar_type = hlo::RealPart(a.scalar_type);
  return r;
}

// An arg holding the tensor v.
inline Arg TensorArg(Value v) {
  Arg r;
  r.kind = Arg::Kind::Tensor;
  r.tensor = v;
  return r;
}

// abs / exp / log / sqrt of complex z with C99's special values (NaN and
// infinite parts, signed zeros), as std:: on CPU: complex_special_values.cpp.
Value AbsC99(Builder& b, Value z);
Value ExpC99(Builder& b, Value z);
Value LogC99(Builder& b, Value z);
Value SqrtC99(Builder& b, Value z);

}  // namespace torch_tpu::lowering::complex_parts
