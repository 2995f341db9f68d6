// Complex numbers: which generic rules take complex values as they are, the
// rules whose complex form differs (abs, angle, sgn, pow, conj_physical),
// and the constructors (complex, polar). See RegisterComplex in lowering.h:
// a generic rule not listed here sends a complex op to the CPU fallback.
#include <cmath>

#include "lowering/complex_common.h"

namespace torch_tpu::lowering {
namespace {

using K = Arg::Kind;

// The output dtype's value of arg i, broadcast to the output shape.
Value In(Context& c, const Arg& a, size_t out = 0) {
  return As(c.b, a, Out(c, out).dtype, Out(c, out).shape);
}

// |x|: hypot's special values for complex x (an infinite part: inf, else a
// NaN part: NaN; complex_special_values.cpp).
Value Abs(Builder& b, Value x) { return hlo::IsComplex(x.dtype()) ? complex_parts::AbsC99(b, x) : b.Abs(x); }

std::vector<Value> AbsRule(Context& c, const std::vector<Arg>& a) {
  Value x = a[0].tensor;
  return One(c.b.Convert(Abs(c.b, x), Out(c).dtype));
}

// angle: atan2(imag, real) for complex; for real x, pi where x < 0, NaN
// stays NaN, else 0 (ATen's angle_impl).
std::vector<Value> AngleRule(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value x = a[0].tensor;
  const TensorType& out = Out(c);
  if (hlo::IsComplex(x.dtype())) return One(b.Convert(b.Binary("atan2", b.Imag(x), b.Real(x)), out.dtype));
  ElementType ct = ComputeType(out.dtype);
  Value xf = As(b, x, ct, out.shape);
  Value zero = b.Splat(ct, 0, out.shape);
  Value r = b.Select(b.Compare("LT", xf, zero), b.Splat(ct, M_PI, out.shape), zero);
  r = b.Select(b.Compare("NE", xf, xf), xf, r);
  return One(b.Convert(r, out.dtype));
}

// sgn(z) = z / |z| (each part divided by the real |z|, as c10::complex's
// operator/(T)), 0 at 0.
std::vector<Value> ComplexSgn(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value z = In(c, a[0]);
  Value r = Abs(b, z);
  Value zero = b.Splat(r.dtype(), 0, r.shape());
  Value unit = b.Complex(b.Binary("divide", b.Real(z), r), b.Binary("divide", b.Imag(z), r));
  return One(b.Select(b.Compare("EQ", r, zero), b.Splat(z.dtype(), 0, z.shape()), unit));
}

std::vector<Value> ComplexPow(Context& c, const std::vector<Arg>& a) {
  return One(c.b.Binary("power", In(c, a[0]), In(c, a[1])));
}

// conj_physical: re - i im; real values are their own conjugate.
std::vector<Value> ConjPhysical(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value x = In(c, a[0]);
  if (!hlo::IsComplex(x.dtype())) return One(x);
  return One(b.Complex(b.Real(x), b.Unary("negate", b.Imag(x))));
}

// complex(real, imag) and polar(abs, angle): parts in the output's part type.
std::vector<Value> ComplexFromParts(Context& c, const std::vector<Arg>& a) {
  ElementType part = hlo::RealPart(Out(c).dtype);
  const auto& shape = Out(c).shape;
  return One(c.b.Complex(As(c.b, a[0], part, shape), As(c.b, a[1], part, shape)));
}

std::vector<Value> Polar(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  ElementType part = hlo::RealPart(Out(c).dtype);
  const auto& shape = Out(c).shape;
  Value r = As(b, a[0], part, shape), theta = As(b, a[1], part, shape);
  return One(b.Complex(b.Binary("multiply", r, b.Unary("cosine", theta)),
                       b.Binary("multiply", r, b.Unary("sine", theta))));
}

// isnan / isinf: of either part.
Rule PartTest(const std::string& test) {
  return [test](Context& c, const std::vector<Arg>& a) {
    Builder& b = c.b;
    Value x = a[0].tensor;
    auto one = [&](Value p) {
      if (test == "isnan") return b.Compare("NE", p, p);
      return b.Compare("EQ", b.Unary("abs", p), b.Splat(p.dtype(), INFINITY, p.shape()));
    };
    return One(b.Binary("or", one(b.Real(x)), one(b.Imag(x))));
  };
}

// A norm of complex values is the real rule's norm of their magnitudes.
std::vector<Value> ComplexVectorNorm(Context& c, const std::vector<Arg>& a) {
  std::vector<Arg> args = a;
  args[0].tensor = Abs(c.b, a[0].tensor);
  return Find("linalg_vector_norm")->rule(c, args);
}

// torch.compile graphs are functional: view_as_real / view_as_complex are
// values there (the eager views are ATen kernels in aten/complex.cpp).
std::vector<Value> GraphViewAsReal(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value x = a[0].tensor;
  std::vector<int64_t> column = x.shape();
  column.push_back(1);
  Value parts = b.Concatenate({b.Reshape(b.Real(x), column), b.Reshape(b.Imag(x), column)},
                              x.rank());
  return One(b.Convert(parts, Out(c).dtype));
}

std::vector<Value> GraphViewAsComplex(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value x = a[0].tensor;
  std::vector<int64_t> start(x.rank(), 0), limit = x.shape(), step(x.rank(), 1);
  std::vector<int64_t> shape(x.shape().begin(), x.shape().end() - 1);
  auto part = [&](int64_t i) {
    start.back() = i;
    limit.back() = i + 1;
    return b.Reshape(b.Slice(x, start, limit, step), shape);
  };
  return One(b.Complex(part(0), part(1)));
}

const bool registered = [] {
  // Generic rules that are right for complex values as written: copies,
  // data movement, +-*/, the unary math StableHLO defines on complex
  // numbers, matmuls and sums.
  MarkComplexCapable({
      "internal:copy_convert", "clone", "cat", "stack", "index_select", "gather", "flip", "roll",
      "repeat", "constant_pad_nd", "where.self", "where.ScalarOther", "where.ScalarSelf",
      "fill.Scalar", "fill.Tensor", "zero", "zeros_like", "ones_like", "full_like",
      "masked_fill.Scalar", "masked_fill.Tensor", "index_put", "index_copy", "index_add",
      "scatter.src", "scatter_add", "tril", "triu", "diagonal_scatter", "slice_scatter",
      "select_scatter", "_unsafe_index.Tensor", "_unsafe_index_put", "_index_put_impl",
      "masked_scatter",
      "add.Tensor", "add.Scalar", "sub.Tensor", "sub.Scalar", "rsub.Tensor", "rsub.Scalar",
      "mul.Tensor", "mul.Scalar", "div.Tensor", "div.Scalar", "neg", "reciprocal",
      "exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh",
      "sigmoid", "log2", "log10", "eq.Tensor", "eq.Scalar", "ne.Tensor", "ne.Scalar",
      "mm", "bmm", "addmm", "baddbmm", "dot", "mv", "addmv",
      "sum", "sum.dim_IntList", "mean", "mean.dim", "prod", "prod.dim_int",
  });
  RegisterComplex("abs", AbsRule);
  RegisterComplex("isnan", PartTest("isnan"));
  RegisterComplex("isinf", PartTest("isinf"));
  RegisterComplex("linalg_vector_norm", ComplexVectorNorm);
  MarkComplexCapable({"cumsum", "cumprod", "nonzero_static"});
  // CHLO's atan/atanh/sinh/cosh are defined on complex numbers (principal
  // branches, signed zeros on the cuts as CPU); the rest only multiply, add,
  // compare with zero or move values. Not asin/acos/asinh/acosh: CHLO's
  // complex forms put -0 on the wrong side of their branch cuts
  // (asinh(-0-2j): +1.317-1.571j, CPU -1.317-1.571j), so they fall back.
  MarkComplexCapable({"atan", "sinh", "cosh", "atanh", "exp2",
                      "addcmul", "trace", "take", "channel_shuffle", "count_nonzero",
                      "count_nonzero.dim_IntList"});
  // Padding by reflection / replication moves values; eye fills 0 and 1;
  // silu is x * logistic(x); index_fill writes its scalar.
  MarkComplexCapable({"reflection_pad1d", "reflection_pad2d", "reflection_pad3d",
                      "replication_pad1d", "replication_pad2d", "replication_pad3d", "eye.m_out",
                      "silu", "index_fill.int_Scalar", "index_fill.int_Tensor"});
  // Truth values: Builder::Convert to bool compares with zero (both parts).
  MarkComplexCapable({"logical_and", "logical_or", "logical_xor", "logical_not", "any", "any.dim",
                      "any.dims", "all", "all.dim", "all.dims"});
  RegisterComplex("sgn", ComplexSgn);
  for (const char* name : {"pow.Tensor_Tensor", "pow.Tensor_Scalar", "pow.Scalar"})
    RegisterComplex(name, ComplexPow);
  Register("angle", AngleRule, {"angle.out"});
  Register("conj_physical", ConjPhysical, {"conj_physical.out", "conj_physical_", "_conj_physical"});
  Register("complex", ComplexFromParts, {"complex.out"});
  Register("polar", Polar, {"polar.out"});
  MarkComplexCapable({"angle", "conj_physical", "complex", "polar"});
  Register("view_as_real", GraphViewAsReal, {}, Scope::Graph);
  Register("view_as_complex", GraphViewAsComplex, {}, Scope::Graph);
  // The graph forms of views and constructors move or fill values only.
  std::vector<std::string> graph_ops = {"view_as_real", "view_as_complex"};
  for (const char* n : {"view", "_unsafe_view", "reshape", "alias", "detach", "lift_fresh_copy",
                        "squeeze", "squeeze.dim", "squeeze.dims", "unsqueeze", "view_as",
                        "flatten.using_ints", "_reshape_copy", "view_copy", "alias_copy",
                        "squeeze_copy.dims", "unsqueeze_copy", "_reshape_alias", "expand",
                        "expand_copy", "permute", "permute_copy", "transpose.int", "t",
                        "numpy_T", "slice.Tensor", "slice_copy.Tensor", "select.int",
                        "select_copy.int", "as_strided", "unfold", "diagonal", "split.Tensor",
                        "split_with_sizes", "split_with_sizes_copy", "unbind.int", "_to_copy",
                        "copy", "full", "full_like", "new_full", "scalar_tensor", "zeros",
                        "zeros_like", "new_zeros", "empty.memory_format", "empty_like",
                        "new_empty", "empty_strided", "new_empty_strided", "ones", "ones_like",
                        "new_ones", "as_strided_scatter", "slice_scatter", "select_scatter"})
    graph_ops.push_back(n);
  for (auto& n : graph_ops) n = "graph:" + n;
  MarkComplexCapable(graph_ops);
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
