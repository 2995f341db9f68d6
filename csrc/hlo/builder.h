// StableHLO text builder: tensor types, SSA values, ops, functions and
// modules (element types: element_type.h). All emitted syntax lives here (generic op form, the
// least fragile text). No torch, no PJRT.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "hlo/element_type.h"

namespace torch_tpu::hlo {

struct TensorType {
  ElementType dtype = ElementType::F32;
  std::vector<int64_t> shape;
  // Bounded dynamic dims (XLA's dynamic padder): dims flagged here have a
  // runtime size of at most shape[d]. Empty: static. Only the builder's
  // SetDimensionSize / DynamicReshape make such types; other ops' results
  // are printed static (XLA infers their dynamism from the operands).
  std::vector<bool> dynamic;
  bool is_dynamic() const;
  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  int64_t numel() const;
  std::string str() const;  // tensor<2x3xf32>
  bool operator==(const TensorType& o) const {
    return dtype == o.dtype && shape == o.shape;
  }
};

// An SSA value inside a function under construction.
struct Value {
  int id = -1;
  TensorType type;
  bool valid() const { return id >= 0; }
  ElementType dtype() const { return type.dtype; }
  const std::vector<int64_t>& shape() const { return type.shape; }
  int64_t rank() const { return type.rank(); }
};

// Builds one function `@main` of one module. Ops are appended in order.
class Builder {
 public:
  explicit Builder(std::string module_name = "torch_tpu");

  // Adds a parameter. `attrs` is printed as the argument's attribute
  // dictionary body, e.g. "tf.aliasing_output = 0 : i32".
  Value Parameter(const TensorType& type, const std::string& attrs = "");
  void SetParameterAttrs(int index, const std::string& attrs);
  int num_parameters() const { return static_cast<int>(params_.size()); }
  void Return(const std::vector<Value>& results);
  std::string ToText() const;

  // ---- the generic op: name, operands, attribute dict body, result types.
  std::vector<Value> Op(const std::string& name, const std::vector<Value>& operands,
                        const std::vector<TensorType>& results,
                        const std::string& attrs = "");
  Value Op1(const std::string& name, const std::vector<Value>& operands,
            const TensorType& result, const std::string& attrs = "");
  // An op with one region whose block takes `block_args` and is filled by
  // `body` (which must end by calling RegionReturn).
  std::vector<Value> OpWithRegion(
      const std::string& name, const std::vector<Value>& operands,
      const std::vector<TensorType>& results, const std::string& attrs,
      const std::vector<TensorType>& block_args,
      const std::function<void(const std::vector<Value>&)>& body);
  void RegionReturn(const std::vector<Value>& values);

  // ---- constants
  Value Constant(ElementType t, double v);     // scalar (rank 0)
  Value ConstantInt(ElementType t, int64_t v);  // exact for integers
  Value ConstantBits(ElementType t, uint64_t bits);  // raw bit pattern
  Value ConstantComplex(ElementType t, double re, double im);  // t complex
  Value Splat(ElementType t, double v, const std::vector<int64_t>& shape);
  // 1-D constants holding `v` (floats rounded to t first).
  Value ConstantArray(ElementType t, const std::vector<double>& v);
  Value ConstantIntArray(ElementType t, const std::vector<int64_t>& v);
  Value MinValue(ElementType t);  // lowest finite (or -inf for floats)
  Value MaxValue(ElementType t);

  // ---- elementwise
  Value Unary(const std::string& op, Value x);  // "stablehlo.<op>"
  Value Binary(const std::string& op, Value a, Value b);
  // "chlo.<op>" (CHLO's elementwise math: erf, erf_inv, lgamma, digamma,
  // zeta, asin, sinh...), of the type of the first operand.
  Value Chlo(const std::string& op, const std::vector<Value>& operands);
  Value Compare(const std::string& direction, Value a, Value b);  // EQ NE LT ...
  Value Select(Value pred, Value on_true, Value on_false);
  Value Convert(Value x, ElementType t);  // no-op when same type
  Value BitcastConvert(Value x, ElementType t);
  Value Clamp(Value lo, Value x, Value hi);
  Value IsFinite(Value x);  // i1 of x's shape
  // Keeps XLA from folding or reordering through x (the value is unchanged).
  Value OptimizationBarrier(Value x);
  // Complex numbers: re + i*im from two real values of one type; the real
  // and imaginary parts (a real result type).
  Value Complex(Value re, Value im);
  Value Real(Value x);
  // |x|: of a real type for complex x (the modulus), else x's type.
  Value Abs(Value x);
  Value Imag(Value x);
  // stablehlo.fft over the trailing fft_length.size() (1 to 3) dims. `type`:
  // "FFT", "IFFT" (scaled by 1/n, XLA's convention), "RFFT" (real in, last
  // dim n/2+1 out), "IRFFT" (complex in, real out of fft_length, 1/n).
  Value Fft(Value x, const std::string& type, const std::vector<int64_t>& fft_length);

  // ---- shapes
  Value Reshape(Value x, const std::vector<int64_t>& shape);
  Value BroadcastInDim(Value x, const std::vector<int64_t>& shape,
                       const std::vector<int64_t>& dims);
  // Numpy-style: right-aligned broadcast of x to shape.
  Value BroadcastTo(Value x, const std::vector<int64_t>& shape);
  Value Transpose(Value x, const std::vector<int64_t>& permutation);
  // The operand `v` was transposed from by `permutation` in this builder
  // (an invalid Value if `v` is no such transpose).
  Value TransposedFrom(const Value& v, const std::vector<int64_t>& permutation) const;
  // Whether the function has bounded dynamic dims so far (set_dimension_size,
  // dynamic_reshape or a bounded call).
  bool bounded() const { return bounded_; }
  Value Slice(Value x, const std::vector<int64_t>& start,
              const std::vector<int64_t>& limit, const std::vector<int64_t>& strides);
  Value DynamicSlice(Value x, const std::vector<Value>& starts,
                     const std::vector<int64_t>& sizes);
  Value DynamicUpdateSlice(Value x, Value update, const std::vector<Value>& starts);
  Value Concatenate(const std::vector<Value>& xs, int64_t dim);
  Value Iota(const TensorType& type, int64_t dim);
  Value Reverse(Value x, const std::vector<int64_t>& dims);
  Value Pad(Value x, Value pad_value, const std::vector<int64_t>& low,
            const std::vector<int64_t>& high, const std::vector<int64_t>& interior);
  // Bounded dynamism: x with dim `dim` given the runtime size `size` (rank-0
  // i32, at most x.shape()[dim]). `to_static`: the result is static again
  // (the dim back to its full bound, e.g. a packed result in its buffer).
  Value SetDimensionSize(Value x, Value size, int64_t dim, bool to_static = false);
  // x's elements (row-major, its runtime sizes) reshaped to the runtime
  // sizes `sizes` (1-D i32 of bound.size() entries); dims flagged in
  // `dynamic` are bounded by `bound`.
  Value DynamicReshape(Value x, Value sizes, const std::vector<int64_t>& bound,
                       const std::vector<bool>& dynamic);
  // The runtime size of x's dim `dim` (rank-0 i32; a constant for static dims).
  Value GetDimensionSize(Value x, int64_t dim);

  // ---- sorting
  // Sorts `operands` (same shape) together along `dim`; `before(b, [l0, r0,
  // l1, r1, ...])` returns an i1: whether the element with scalars l* comes
  // before the one with r*.
  std::vector<Value> Sort(const std::vector<Value>& operands, int64_t dim, bool stable,
                          const std::function<Value(Builder&, const std::vector<Value>&)>& before);

  // ---- reductions and contractions
  // Reduces `x` over `dims` with the binary op `combiner` ("add", "maximum",
  // ...), starting from `init` (a rank-0 value).
  Value Reduce(Value x, Value init, const std::vector<int64_t>& dims,
               const std::string& combiner);
  // Generic reduce over several operands; body gets 2*n scalars.
  std::vector<Value> ReduceN(
      const std::vector<Value>& xs, const std::vector<Value>& inits,
      const std::vector<int64_t>& dims,
      const std::function<std::vector<Value>(Builder&, const std::vector<Value>&)>& body);
  Value DotGeneral(Value lhs, Value rhs, const std::vector<int64_t>& lhs_batch,
                   const std::vector<int64_t>& rhs_batch,
                   const std::vector<int64_t>& lhs_contract,
                   const std::vector<int64_t>& rhs_contract, ElementType result,
                   bool highest_precision);
  // Gathers rows: out[i..., :] = x[indices[i...], :] along dim 0 of a 1-D or
  // N-D operand, via stablehlo.gather. `index_dims` are the operand dims the
  // last axis of `indices` indexes (indices has shape [..., len(index_dims)]);
  // slices are 1 along index_dims and full elsewhere.
  Value Gather(Value x, Value indices, const std::vector<int64_t>& index_dims);
  // ---- control flow and linear algebra
  // stablehlo.while over the loop-carried `init` values: `cond` gets the
  // current values and returns a rank-0 i1, `body` returns the next values
  // (same types). The regions may use values defined before the loop.
  std::vector<Value> While(
      const std::vector<Value>& init,
      const std::function<Value(const std::vector<Value>&)>& cond,
      const std::function<std::vector<Value>(const std::vector<Value>&)>& body);
  // stablehlo.if: runs `on_true` or `on_false` (each returns values of the
  // types `results`) depending on the rank-0 i1 `pred`.
  std::vector<Value> If(Value pred, const std::vector<TensorType>& results,
                        const std::function<std::vector<Value>()>& on_true,
                        const std::function<std::vector<Value>()>& on_false);
  // stablehlo.cholesky of [..., n, n]; only the `lower` (or upper) triangle
  // of the result is meaningful; non-positive-definite inputs give NaNs.
  Value Cholesky(Value a, bool lower);
  // stablehlo.triangular_solve: op(a) x = rhs (left) or x op(a) = rhs,
  // op = transpose when `transpose`; a is [..., n, n].
  Value TriangularSolve(Value a, Value rhs, bool left, bool lower, bool unit_diagonal,
                        bool transpose);
  // stablehlo.custom_call @target (api_version 1), e.g. XLA's expander
  // targets "Qr", "ProductOfElementaryHouseholderReflectors", "Eigh".
  std::vector<Value> CustomCall(const std::string& target, const std::vector<Value>& operands,
                                const std::vector<TensorType>& results,
                                const std::string& backend_config = "");

  // Inverse of Gather: writes (or, with combiner "add", accumulates) updates.
  Value Scatter(Value x, Value indices, Value updates,
                const std::vector<int64_t>& index_dims, const std::string& combiner);
  // Scatter whose combiner is `combine(b, old, update)` (rank-0 values).
  Value Scatter(Value x, Value indices, Value updates, const std::vector<int64_t>& index_dims,
                const std::function<Value(Builder&, Value, Value)>& combine);
  // reduce_window over `xs` (with rank-0 `inits`) to `result_shape`; `body`
  // gets 2 * xs.size() scalars (accumulators, then elements).
  std::vector<Value> ReduceWindow(
      const std::vector<Value>& xs, const std::vector<Value>& inits,
      const std::vector<int64_t>& result_shape, const std::vector<int64_t>& window,
      const std::vector<int64_t>& strides, const std::vector<int64_t>& dilations,
      const std::vector<int64_t>& pad_lo, const std::vector<int64_t>& pad_hi,
      const std::function<std::vector<Value>(Builder&, const std::vector<Value>&)>& body);

  // ---- convolution
  struct ConvGeometry {
    // Dimension layouts, as in StableHLO: e.g. "[b, f, 0, 1]", "[o, i, 0, 1]".
    std::string lhs_spec, rhs_spec, out_spec;
    std::vector<int64_t> window_strides, pad_lo, pad_hi, lhs_dilation, rhs_dilation;
    int64_t feature_groups = 1, batch_groups = 1;
    bool highest_precision = false;
  };
  Value Convolution(Value lhs, Value rhs, const TensorType& result, const ConvGeometry& g);

  // ---- functions of other modules
  // Adds the functions of a complete module (e.g. one jax.export printed,
  // without locations) to this module as private functions, renamed with a
  // fresh prefix so they cannot clash, and returns the symbol of its
  // `@main`. The same text embedded twice is added once. Throws
  // std::invalid_argument for text that is not one module of functions.
  std::string EmbedModule(const std::string& module_text);
  // func.call of `callee` (a symbol EmbedModule returned).
  std::vector<Value> Call(const std::string& callee, const std::vector<Value>& args,
                          const std::vector<TensorType>& results);
  // The same, the results' bounded dynamic dims kept in their types (a
  // callee whose results are bounded dynamic).
  std::vector<Value> CallBounded(const std::string& callee, const std::vector<Value>& args,
                                 const std::vector<TensorType>& results);

 private:
  std::string NewName(int id) const { return "%" + std::to_string(id); }
  std::string Ref(const Value& v) const;
  std::string Signature(const std::vector<Value>& operands,
                        const std::vector<TensorType>& results) const;
  void Emit(const std::string& line);

  std::string module_name_;
  int next_id_ = 0;
  std::vector<std::pair<Value, std::string>> params_;
  std::vector<TensorType> result_types_;
  std::vector<std::string> lines_;
  std::unordered_map<int, std::string> aliases_;  // id -> "%N#i"
  std::vector<std::string> functions_;  // embedded functions, printed after main
  std::unordered_map<std::string, std::string> embedded_;  // module text -> callee
  int indent_ = 2;
  bool keep_dynamic_ = false;  // the op being added makes a bounded dynamic type
  bool bounded_ = false;       // some op made a bounded dynamic type (bounded())
  // id of a transpose's result -> its operand and permutation (TransposedFrom).
  std::unordered_map<int, std::pair<Value, std::vector<int64_t>>> transposes_;
  bool returned_ = false;
};

std::string Ints(const std::vector<int64_t>& v);  // "1, 2, 3"
std::string ArrayAttr(const std::vector<int64_t>& v);  // array<i64: 1, 2>

}  // namespace torch_tpu::hlo
