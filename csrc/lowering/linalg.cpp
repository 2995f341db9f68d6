// Linear algebra rules: mm, bmm, addmm, baddbmm, addbmm, dot, mv, addmv,
// _addmm_activation. Contractions go through stablehlo.dot_general: f32 at
// HIGHEST precision when torch.get_float32_matmul_precision() is "highest",
// 16-bit floats accumulated in f32, integers in their own type (wrapping
// arithmetic gives the same low bits whatever the accumulator width). The
// `beta * self + alpha * product` epilogue runs in the compute type and is
// rounded to the output dtype once, as PyTorch's CPU gemm does.
#include <cmath>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

using K = Arg::Kind;

// The type a contraction of `t` inputs accumulates (and returns) in.
ElementType AccumulateType(ElementType t) {
  if (t == ElementType::Bool) throw Unsupported("matmul of bool tensors");
  return ComputeType(t);
}

// XLA:CPU's Eigen dot repacks a right operand contracted along its minor dim
// (nn.Linear's [n, k] weight read as [k, n]) on every call: [3, 1024] x
// [32000, 1024]^T took 150-300 ms where (W x^T)^T takes 11-18 ms, as long as
// XLA does not fold the transpose back into the dot (the barrier). One row
// (a GEMV) is fast either way; bounded dynamic modules keep the plain dot
// (there the swapped one made a wide generate() 1.3x slower), and so do
// 16-bit inputs (their f32-accumulating swapped dot inside a
// compiled graph reached a DotThunk that refuses BF16 x BF16 = F32).
// Small weights keep it too: there the barrier and the result's transpose
// cost more than the repacking (linear [34, 64] x [64, 64]^T: 14.3 us
// swapped, 7.2 us plain; [34, 64] x [256, 64]^T: 37.5 vs 35.0 us; [34, 256] x
// [1024, 256]^T: 216 vs 517 us).
constexpr int64_t kSwapMinWeightElements = int64_t{1} << 16;

// The product [m, k] x [k, n] of a plain 2-D contraction that way when
// that applies, else an invalid Value.
Value SwappedTransposedDot(Context& c, Value lhs, Value rhs, ElementType in, ElementType acc, bool highest) {
  Builder& b = c.b;
  if (TargetPlatform() != "cpu" || b.bounded() || in != ElementType::F32 || lhs.rank() != 2 ||
      lhs.shape()[0] <= 1)
    return Value{};
  Value weight = b.TransposedFrom(rhs, {1, 0});  // [n, k]
  if (!weight.valid() || weight.shape()[0] * weight.shape()[1] < kSwapMinWeightElements) return Value{};
  Value product = b.DotGeneral(b.Convert(weight, in), b.Convert(lhs, in), {}, {}, {1}, {1}, acc, highest);
  return b.Transpose(b.OptimizationBarrier(product), {1, 0});
}

// XLA:CPU emits a one-row product with a contiguous right operand ([1, k] x
// [k, n]: GPT-2's Conv1D at each decode step, `x @ W`) as a naive loop
// when the row is under 16 KB: [1, 768] x [768, 3072] took 5.4 ms (CPU
// eager 0.23 ms). The same product of two equal rows goes to Eigen's
// GEMM: 0.36 ms for both, the second row dropped (the barrier keeps XLA
// from folding the broadcast back). Measured per addmm, f32 (plain / two
// rows, us): [1, 64] x [64, 128] 7 / 10, [64, 256] 19 / 11, [128, 384]
// 45 / 18, [256, 1024] 496 / 59, [768, 768] 522 / 169, [3072, 768] 5526 / 282.
constexpr int64_t kTwoRowMinWeightElements = int64_t{1} << 14;

// The product [1, k] x [k, n] of a plain 2-D contraction as the first row
// of two when that applies, else an invalid Value.
Value TwoRowDot(Context& c, Value lhs, Value rhs, ElementType in, ElementType acc, bool highest) {
  Builder& b = c.b;
  const bool floating = in == ElementType::F32 || in == ElementType::BF16 || in == ElementType::F16;
  if (TargetPlatform() != "cpu" || b.bounded() || !floating || lhs.rank() != 2 || rhs.rank() != 2 ||
      lhs.shape()[0] != 1 || b.TransposedFrom(rhs, {1, 0}).valid() ||
      rhs.shape()[0] * rhs.shape()[1] < kTwoRowMinWeightElements)
    return Value{};
  Value rows = b.OptimizationBarrier(b.BroadcastInDim(b.Convert(lhs, in), {2, lhs.shape()[1]}, {0, 1}));
  Value product = b.DotGeneral(rows, b.Convert(rhs, in), {}, {}, {1}, {0}, acc, highest);
  return b.Slice(product, {0, 0}, {1, rhs.shape()[1]}, {1, 1});
}

// lhs . rhs contracted over the given dims, in AccumulateType(inputs); the
// caller converts to the output dtype.
Value Contract(Context& c, Value lhs, Value rhs, const std::vector<int64_t>& lhs_batch,
               const std::vector<int64_t>& rhs_batch,
               const std::vector<int64_t>& lhs_contract,
               const std::vector<int64_t>& rhs_contract) {
  if (lhs.dtype() != rhs.dtype())  // as PyTorch: no promotion between a product's operands
    throw std::invalid_argument(std::string("expected m1 and m2 to have the same dtype, but got: ") +
                                hlo::Name(lhs.dtype()) + " != " + hlo::Name(rhs.dtype()));
  ElementType in = lhs.dtype();
  ElementType acc = AccumulateType(in);
  // complex64 products are float32 ones (PyTorch's "highest" default: no
  // TF32 on CUDA for either); XLA:GPU lowered them at reduced precision.
  bool wide = in == ElementType::F64 || in == ElementType::C128;
  bool single = in == ElementType::F32 || in == ElementType::C64;
  bool highest = wide || (single && c.fp32_highest);
  const bool plain_2d = lhs_batch.empty() && lhs_contract == std::vector<int64_t>{1} &&
                        rhs_contract == std::vector<int64_t>{0};
  if (plain_2d) {
    if (Value swapped = SwappedTransposedDot(c, lhs, rhs, in, acc, highest); swapped.valid()) return swapped;
    if (Value two = TwoRowDot(c, lhs, rhs, in, acc, highest); two.valid()) return two;
  }
  lhs = c.b.Convert(lhs, in);
  rhs = c.b.Convert(rhs, in);
  return c.b.DotGeneral(lhs, rhs, lhs_batch, rhs_batch, lhs_contract, rhs_contract, acc,
                        highest);
}

// A plain product rule: args 0 and 1 contracted, converted to the output.
Rule ProductRule(std::vector<int64_t> lhs_batch, std::vector<int64_t> rhs_batch,
                 std::vector<int64_t> lhs_contract, std::vector<int64_t> rhs_contract) {
  return [=](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = Out(c);
    Value p = Contract(c, a[0].tensor, a[1].tensor, lhs_batch, rhs_batch, lhs_contract,
                       rhs_contract);
    return std::vector<Value>{c.b.Reshape(c.b.Convert(p, out.dtype), out.shape)};
  };
}

// beta * self + alpha * product, with self ignored (even NaN) when beta == 0.
Value Epilogue(Context& c, const Arg& self, Value product, const Arg& beta,
               const Arg& alpha, ElementType ct, const std::vector<int64_t>& shape) {
  Builder& b = c.b;
  Value p = As(b, product, ct, shape);
  bool is_bool = ct == ElementType::Bool;
  if (alpha.kind == K::Scalar)
    p = b.Binary(is_bool ? "and" : "multiply", p, As(b, alpha, ct, shape));
  Value s = As(b, self, ct, shape);
  if (beta.kind != K::Scalar) return b.Binary(is_bool ? "or" : "add", p, s);
  Value beta_v = b.Convert(beta.tensor, ct);
  Value beta_zero = b.Compare("EQ", beta_v, b.ConstantInt(ct, 0));
  Value scaled = b.Binary(is_bool ? "and" : "multiply", s, b.BroadcastTo(beta_v, shape));
  Value sum = b.Binary(is_bool ? "or" : "add", p, scaled);
  return b.Select(b.BroadcastTo(beta_zero, shape), p, sum);
}

// self, m1, m2, beta, alpha: beta * self + alpha * contract(m1, m2).
Rule AddProductRule(std::vector<int64_t> lhs_batch, std::vector<int64_t> rhs_batch,
                    std::vector<int64_t> lhs_contract, std::vector<int64_t> rhs_contract,
                    std::function<Value(Builder&, Value)> activation = nullptr) {
  return [=](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = Out(c);
    ElementType ct = ComputeType(out.dtype);
    Value p = Contract(c, a[1].tensor, a[2].tensor, lhs_batch, rhs_batch, lhs_contract,
                       rhs_contract);
    p = c.b.Reshape(p, out.shape);
    Arg none;
    const Arg& beta = a.size() > 3 ? a[3] : none;
    const Arg& alpha = a.size() > 4 ? a[4] : none;
    Value r = Epilogue(c, a[0], p, beta, alpha, ct, out.shape);
    if (activation) {
      // PyTorch rounds the addmm result before the activation.
      r = c.b.Convert(c.b.Convert(r, out.dtype), ct);
      r = activation(c.b, r);
    }
    return std::vector<Value>{c.b.Convert(r, out.dtype)};
  };
}

Value Relu(Builder& b, Value x) {
  return b.Binary("maximum", x, b.Splat(x.dtype(), 0, x.shape()));
}

// gelu(approximate='none'): x * 0.5 * (1 + erf(x / sqrt(2))).
Value Gelu(Builder& b, Value x) {
  if (!hlo::IsFloat(x.dtype())) throw Unsupported("gelu of an integer tensor");
  Value e = b.Chlo("erf", {b.Binary("multiply", x, b.Splat(x.dtype(), M_SQRT1_2, x.shape()))});
  Value one = b.Splat(x.dtype(), 1, x.shape()), half = b.Splat(x.dtype(), 0.5, x.shape());
  return b.Binary("multiply", b.Binary("multiply", x, half), b.Binary("add", one, e));
}

const bool registered = [] {
  // [n, k] x [k, m]
  // Rows are independent in mm's self and addmm's mat1; mm contracts its
  // self's columns with mat2's rows (DynamicShapes).
  RuleEntry& mm = Register("mm", ProductRule({}, {}, {1}, {0})).Dynamic();
  mm.dynamic.rows_args = {0};
  mm.dynamic.contracts_rows = true;
  mm.dynamic.independent_dims = [](const std::vector<Arg>&, StaticDims& s) {
    s.Dim(0, 0);  // self's rows, mat2's columns
    s.Dim(1, 1);
  };
  // [b, n, k] x [b, k, m]
  Register("bmm", ProductRule({0}, {0}, {2}, {1})).Dynamic().dynamic.independent_dims =
      [](const std::vector<Arg>&, StaticDims& s) {
        for (auto [arg, d] : {std::pair{0, 0}, {0, 1}, {1, 0}, {1, 2}}) s.Dim(arg, d);
      };
  // [k] x [k]
  Register("dot", ProductRule({}, {}, {0}, {0}));
  Register("vdot", ProductRule({}, {}, {0}, {0}));  // real dtypes: no conjugation
  // [n, k] x [k]
  Register("mv", ProductRule({}, {}, {1}, {0}));
  // out_dtype= forms (CUDA-only kernels in PyTorch, no CPU one): 16-bit
  // inputs accumulate in f32 anyway; the result is converted to out_dtype.
  Register("mm.dtype", ProductRule({}, {}, {1}, {0}));
  Register("bmm.dtype", ProductRule({0}, {0}, {2}, {1}));

  RuleEntry& addmm = Register("addmm", AddProductRule({}, {}, {1}, {0})).Dynamic();
  addmm.dynamic.rows_args = {1};
  addmm.dynamic.independent_dims = [](const std::vector<Arg>&, StaticDims& s) {
    s.All(0);  // (self: added elementwise, mat1's rows, mat2's columns)
    s.Dim(1, 0);
    s.Dim(2, 1);
  };
  // [b, n, m] + [b, n, k] x [b, k, m] (Bloom's ALiBi scores)
  Register("baddbmm", AddProductRule({0}, {0}, {2}, {1})).Dynamic().dynamic.independent_dims =
      [](const std::vector<Arg>&, StaticDims& s) {
        s.All(0);  // (self: added elementwise)
        for (auto [arg, d] : {std::pair{1, 0}, {1, 1}, {2, 0}, {2, 2}}) s.Dim(arg, d);
      };
  // sum over the batch: contract batch and k together.
  Register("addbmm", AddProductRule({}, {}, {0, 2}, {0, 1}));
  Register("addmv", AddProductRule({}, {}, {1}, {0}));
  Register("_addmm_activation", [](Context& c, const std::vector<Arg>& a) {
    bool use_gelu = a.size() > 5 && a[5].kind == K::Bool && a[5].i != 0;
    return AddProductRule({}, {}, {1}, {0}, use_gelu ? Gelu : Relu)(c, a);
  });
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
