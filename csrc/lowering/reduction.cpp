// Reduction rules: sum, mean, prod, max/min (values, indices, NaN
// propagation), argmax/argmin, var/std, any/all, logsumexp, softmax and its
// backward, vector norms, cumulative sums and products. Values accumulate in
// ComputeType(output dtype) (f32 for 16-bit floats); the result is converted
// to, and reshaped into, the output type the meta kernel computed, which also
// takes care of keepdim.
#include <cmath>
#include <cstdint>
#include <limits>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

using K = Arg::Kind;

// The result converted to output i's dtype and reshaped to its shape.
Value Finish(Context& c, Value v, size_t i = 0) {
  const TensorType& out = Out(c, i);
  return c.b.Reshape(c.b.Convert(v, out.dtype), out.shape);
}

const Value& Self(const std::vector<Arg>& a, size_t i = 0) {
  if (a.at(i).kind != K::Tensor) throw std::logic_error("lowering: expected a tensor argument");
  return a[i].tensor;
}

bool Flag(const std::vector<Arg>& a, size_t i) {
  return i < a.size() && (a[i].kind == K::Bool || a[i].kind == K::Int) && a[i].i != 0;
}

// The dims an `int`, `int[]` or None argument names: None means all dims, and
// so does an empty list unless `empty_is_all` is false (any.dims/all.dims).
std::vector<int64_t> DimsArg(const std::vector<Arg>& a, size_t i, int64_t rank,
                             bool empty_is_all = true) {
  if (i >= a.size() || a[i].is_none()) return ReduceDims({}, rank);
  if (a[i].kind == K::Int) return ReduceDims({a[i].i}, rank);
  if (a[i].kind == K::IntList) {
    if (a[i].ints.empty() && !empty_is_all) return {};
    return ReduceDims(a[i].ints, rank);
  }
  throw std::logic_error("lowering: expected a dim argument");
}

int64_t Count(const Value& x, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= x.shape()[d];
  return n;
}

// The dims of x that survive reducing `dims` (for broadcasting back).
std::vector<int64_t> SurvivingDims(int64_t rank, const std::vector<int64_t>& dims) {
  std::vector<int64_t> kept;
  for (int64_t i = 0; i < rank; ++i) {
    bool reduced = false;
    for (int64_t d : dims) reduced |= d == i;
    if (!reduced) kept.push_back(i);
  }
  return kept;
}

// A reduced value broadcast back to the shape of the unreduced `like`.
Value Expand(Builder& b, Value reduced, const Value& like, const std::vector<int64_t>& dims) {
  return b.BroadcastInDim(reduced, like.shape(), SurvivingDims(like.rank(), dims));
}

Value Fill(Builder& b, const Value& like, double v) { return b.Splat(like.dtype(), v, like.shape()); }

Value Sum(Builder& b, Value x, const std::vector<int64_t>& dims) {
  if (dims.empty()) return x;
  ElementType t = x.dtype();
  return b.Reduce(x, b.ConstantInt(t, 0), dims, t == ElementType::Bool ? "or" : "add");
}

Value Prod(Builder& b, Value x, const std::vector<int64_t>& dims) {
  if (dims.empty()) return x;
  ElementType t = x.dtype();
  return b.Reduce(x, b.ConstantInt(t, 1), dims, t == ElementType::Bool ? "and" : "multiply");
}

Value Extreme(Builder& b, Value x, const std::vector<int64_t>& dims, bool is_max) {
  if (dims.empty()) return x;
  ElementType t = x.dtype();
  Value init = is_max ? b.MinValue(t) : b.MaxValue(t);
  return b.ReduceN({x}, {init}, dims, [is_max](Builder& rb, const std::vector<Value>& a) {
    return std::vector<Value>{MaxMin(rb, a[0], a[1], is_max)};
  })[0];
}

// (values, int64 indices) of the max (min) along `dim`: a NaN wins, ties go
// to the first occurrence. The combiner is commutative and associative, so
// the reduction order XLA picks does not matter.
std::pair<Value, Value> ArgExtreme(Builder& b, Value x, int64_t dim, bool is_max) {
  ElementType t = x.dtype();
  Value xv = t == ElementType::Bool ? b.Convert(x, ElementType::U8) : x;
  bool is_float = hlo::IsFloat(xv.dtype());
  Value idx = b.Iota(TensorType{ElementType::I64, x.shape()}, dim);
  Value init_v = is_max ? b.MinValue(xv.dtype()) : b.MaxValue(xv.dtype());
  Value init_i = b.ConstantInt(ElementType::I64, std::numeric_limits<int64_t>::max());
  auto r = b.ReduceN({xv, idx}, {init_v, init_i}, {dim},
                     [is_max, is_float](Builder& rb, const std::vector<Value>& a) {
                       Value av = a[0], ai = a[1], bv = a[2], bi = a[3];
                       Value better = rb.Compare(is_max ? "GT" : "LT", av, bv);
                       Value first = rb.Compare("LT", ai, bi);
                       Value pick_a = rb.Binary(
                           "or", better, rb.Binary("and", rb.Compare("EQ", av, bv), first));
                       if (is_float) {
                         Value a_nan = rb.Compare("NE", av, av);
                         Value b_ok = rb.Unary("not", rb.Compare("NE", bv, bv));
                         pick_a = rb.Select(a_nan, rb.Binary("or", b_ok, first),
                                            rb.Binary("and", b_ok, pick_a));
                       }
                       return std::vector<Value>{rb.Select(pick_a, av, bv),
                                                 rb.Select(pick_a, ai, bi)};
                     });
  return {b.Convert(r[0], t), r[1]};
}

// Inclusive scan along `dim` in log2(n) steps of shift-and-combine
// (Hillis-Steele): O(n log n) work, static shapes only.
Value Scan(Builder& b, Value x, int64_t dim, bool product) {
  ElementType t = x.dtype();
  int64_t n = x.shape()[dim];
  if (x.type.numel() == 0) return x;
  std::string op = t == ElementType::Bool ? (product ? "and" : "or")
                                          : (product ? "multiply" : "add");
  Value identity = b.ConstantInt(t, product ? 1 : 0);
  std::vector<int64_t> zeros(x.rank(), 0), ones(x.rank(), 1);
  for (int64_t k = 1; k < n; k *= 2) {
    std::vector<int64_t> low = zeros;
    low[dim] = k;
    Value padded = b.Pad(x, identity, low, zeros, zeros);
    Value shifted = b.Slice(padded, zeros, x.shape(), ones);
    x = b.Binary(op, x, shifted);
  }
  return x;
}

// ATen's zero_numel_check_dims: reductions without an identity (max, min,
// argmax, ...) reject an empty reduced dim. Meta kernels skip the check.
void CheckNonEmpty(Context& c, const Value& x, const std::vector<int64_t>& dims) {
  if (x.type.numel() != 0) return;
  std::string op = c.op.substr(0, c.op.find('.'));
  if (dims.empty() || x.rank() == 0 || static_cast<int64_t>(dims.size()) == x.rank())
    throw std::invalid_argument(op + "(): Expected reduction dim to be specified for "
                                "input.numel() == 0.");
  for (int64_t d : dims)
    if (x.shape()[d] == 0)
      throw std::out_of_range(op + "(): Expected reduction dim " + std::to_string(d) +
                              " to have non-zero size.");
}

// ---------------------------------------------------------------- rules

// The number of elements a mean over `dims` of x divides by, as a value like
// s. A bounded-dynamic x (dynamic.cpp) counts its dynamic dims at run time.
Value MeanDivisor(hlo::Builder& b, const Value& s, const Value& x, const std::vector<int64_t>& dims) {
  if (!x.type.is_dynamic()) return Fill(b, s, static_cast<double>(Count(x, dims)));
  return b.BroadcastInDim(ElementCount(b, x, dims, 1, s.dtype()), s.shape(), {});
}

// sum / mean / prod: `dim_arg` is the index of the dims argument, or -1 for
// the full-reduction overloads.
Rule SumRule(int dim_arg, bool mean) {
  return [dim_arg, mean](Context& c, const std::vector<Arg>& a) {
    Value x = Self(a);
    ElementType ct = ComputeType(Out(c).dtype);
    auto dims = dim_arg < 0 ? ReduceDims({}, x.rank()) : DimsArg(a, dim_arg, x.rank());
    Value s = Sum(c.b, c.b.Convert(x, ct), dims);
    if (mean) s = c.b.Binary("divide", s, MeanDivisor(c.b, s, x, dims));
    return std::vector<Value>{Finish(c, s)};
  };
}

// nansum(self, dim?, keepdim, *, dtype?): sum with NaN counted as zero.
std::vector<Value> NanSumRule(Context& c, const std::vector<Arg>& a) {
  Value x = Self(a);
  ElementType ct = ComputeType(Out(c).dtype);
  Value xf = c.b.Convert(x, ct);
  if (hlo::IsFloat(ct))
    xf = c.b.Select(c.b.Compare("NE", xf, xf), c.b.Splat(ct, 0, xf.shape()), xf);
  return {Finish(c, Sum(c.b, xf, DimsArg(a, 1, x.rank())))};
}

Rule ProdRule(int dim_arg) {
  return [dim_arg](Context& c, const std::vector<Arg>& a) {
    Value x = Self(a);
    ElementType ct = ComputeType(Out(c).dtype);
    auto dims = dim_arg < 0 ? ReduceDims({}, x.rank()) : DimsArg(a, dim_arg, x.rank());
    return std::vector<Value>{Finish(c, Prod(c.b, c.b.Convert(x, ct), dims))};
  };
}

// amax / amin / max / min (full): values only, in the input dtype (exact).
Rule ExtremeRule(int dim_arg, bool is_max) {
  return [dim_arg, is_max](Context& c, const std::vector<Arg>& a) {
    Value x = Self(a);
    auto dims = dim_arg < 0 ? ReduceDims({}, x.rank()) : DimsArg(a, dim_arg, x.rank());
    CheckNonEmpty(c, x, dims);
    return std::vector<Value>{Finish(c, Extreme(c.b, x, dims, is_max))};
  };
}

// max.dim / min.dim: (values, indices).
Rule ExtremeDimRule(bool is_max) {
  return [is_max](Context& c, const std::vector<Arg>& a) {
    Value x = Self(a);
    int64_t dim = WrapDim(a.at(1).i, x.rank());
    if (x.rank() == 0) x = c.b.Reshape(x, {1});
    if (x.shape()[dim] == 0) CheckNonEmpty(c, x, {dim});
    auto [values, indices] = ArgExtreme(c.b, x, dim, is_max);
    return std::vector<Value>{Finish(c, values, 0), Finish(c, indices, 1)};
  };
}

// argmax / argmin: dim None flattens.
Rule ArgRule(bool is_max) {
  return [is_max](Context& c, const std::vector<Arg>& a) {
    Value x = Self(a);
    int64_t dim = 0;
    if (a.size() > 1 && a[1].kind == K::Int) {
      dim = WrapDim(a[1].i, x.rank());
      if (x.rank() == 0) x = c.b.Reshape(x, {1});
      if (x.shape()[dim] == 0) CheckNonEmpty(c, x, {dim});
    } else {
      CheckNonEmpty(c, x, {});
      x = c.b.Reshape(x, {x.type.numel()});
    }
    return std::vector<Value>{Finish(c, ArgExtreme(c.b, x, dim, is_max).second)};
  };
}

// var / std / var_mean / std_mean (.correction): two-pass, divisor
// max(0, N - correction) so that N <= correction gives inf/nan as on CPU.
Rule VarRule(bool take_sqrt, bool with_mean) {
  return [take_sqrt, with_mean](Context& c, const std::vector<Arg>& a) {
    Builder& b = c.b;
    ElementType ct = ComputeType(Out(c).dtype);
    Value x = b.Convert(Self(a), ct);
    auto dims = DimsArg(a, 1, x.rank());
    Value total = Sum(b, x, dims);
    Value n = MeanDivisor(b, total, Self(a), dims);  // bounded dynamic: its real elements (a convert drops the flags)
    Value mean = b.Binary("divide", total, n);
    Value dev = b.Binary("subtract", x, Expand(b, mean, x, dims));
    Value ssq = Sum(b, b.Binary("multiply", dev, dev), dims);
    Value corr;
    const Arg* ca = a.size() > 2 ? &a[2] : nullptr;
    if (!ca || ca->is_none()) {
      corr = Fill(b, ssq, 1);
    } else if (ca->kind == K::Scalar || ca->kind == K::Tensor) {
      corr = As(b, *ca, ct, ssq.shape());
    } else if (ca->kind == K::Double) {
      corr = Fill(b, ssq, ca->d);
    } else {
      corr = Fill(b, ssq, static_cast<double>(ca->i));
    }
    Value denom = b.Binary("maximum", b.Binary("subtract", n, corr), Fill(b, ssq, 0));
    Value var = b.Binary("divide", ssq, denom);
    if (take_sqrt) var = b.Unary("sqrt", var);
    std::vector<Value> out{Finish(c, var, 0)};
    if (with_mean) out.push_back(Finish(c, mean, 1));
    return out;
  };
}

// any / all; `dim_arg` -1 for the full overloads.
Rule AnyAllRule(int dim_arg, bool is_any) {
  return [dim_arg, is_any](Context& c, const std::vector<Arg>& a) {
    Value x = c.b.Convert(Self(a), ElementType::Bool);
    auto dims = dim_arg < 0 ? ReduceDims({}, x.rank())
                            : DimsArg(a, dim_arg, x.rank(), /*empty_is_all=*/false);
    Value r = x;
    if (!dims.empty())
      r = c.b.Reduce(x, c.b.ConstantInt(ElementType::Bool, is_any ? 0 : 1), dims,
                     is_any ? "or" : "and");
    return std::vector<Value>{Finish(c, r)};
  };
}

std::vector<Value> LogSumExp(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  ElementType ct = ComputeType(Out(c).dtype);
  Value x = b.Convert(Self(a), ct);
  auto dims = DimsArg(a, 1, x.rank());
  if (dims.empty()) return {Finish(c, x)};
  Value m = Extreme(b, x, dims, true);
  // An infinite max would turn x - max into nan: shift by 0 instead.
  Value is_inf = b.Compare("EQ", b.Unary("abs", m), Fill(b, m, INFINITY));
  m = b.Select(is_inf, Fill(b, m, 0), m);
  Value e = b.Unary("exponential", b.Binary("subtract", x, Expand(b, m, x, dims)));
  Value r = b.Binary("add", b.Unary("log", Sum(b, e, dims)), m);
  return {Finish(c, r)};
}

// Softmax-family rules work on a rank >= 1 view (a 0-d tensor is [1]).
Rule SoftmaxRule(bool log) {
  return [log](Context& c, const std::vector<Arg>& a) {
    Builder& b = c.b;
    ElementType ct = ComputeType(Out(c).dtype);
    Value x0 = Self(a);
    int64_t dim = WrapDim(a.at(1).i, x0.rank());
    Value x = AtLeast1d(b, b.Convert(x0, ct));
    std::vector<int64_t> dims{dim};
    Value m = b.Reduce(x, b.MinValue(ct), dims, "maximum");
    Value shifted = b.Binary("subtract", x, Expand(b, m, x, dims));
    Value e = b.Unary("exponential", shifted);
    Value s = Sum(b, e, dims);
    Value r = log ? b.Binary("subtract", shifted, Expand(b, b.Unary("log", s), x, dims))
                  : b.Binary("divide", e, Expand(b, s, x, dims));
    return std::vector<Value>{Finish(c, r)};
  };
}

// _safe_softmax (attention's softmax under a mask): softmax, but a row of
// -inf alone gives zeros, not nan. Native, so that it runs dynamic:
// PyTorch's composite calls isneginf and where(out=), which run exact
// shapes (Falcon's attention compiled both at every new prompt length).
std::vector<Value> SafeSoftmax(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value r = SoftmaxRule(false)(c, a).at(0);
  Value x = Self(a);
  Value masked = b.Compare("EQ", x, Fill(b, x, -INFINITY));
  if (x.rank() > 0) {
    std::vector<int64_t> dims{WrapDim(a.at(1).i, x.rank())};
    masked = Expand(b, b.Reduce(masked, b.ConstantInt(ElementType::Bool, 1), dims, "and"), masked, dims);
  }
  return {b.Select(masked, Fill(b, r, 0), r)};
}

// (grad_output, output, dim, input_dtype) -> grad_input.
Rule SoftmaxBackwardRule(bool log) {
  return [log](Context& c, const std::vector<Arg>& a) {
    Builder& b = c.b;
    ElementType ct = ComputeType(Out(c).dtype);
    Value g0 = Self(a, 0);
    int64_t dim = WrapDim(a.at(2).i, g0.rank());
    Value g = AtLeast1d(b, b.Convert(g0, ct));
    Value y = AtLeast1d(b, b.Convert(Self(a, 1), ct));
    std::vector<int64_t> dims{dim};
    Value r;
    if (log) {
      Value s = Expand(b, Sum(b, g, dims), g, dims);
      r = b.Binary("subtract", g, b.Binary("multiply", b.Unary("exponential", y), s));
    } else {
      Value gy = b.Binary("multiply", g, y);
      Value s = Expand(b, Sum(b, gy, dims), g, dims);
      r = b.Binary("subtract", gy, b.Binary("multiply", y, s));
    }
    return std::vector<Value>{Finish(c, r)};
  };
}

// linalg_vector_norm(self, ord, dim, keepdim, dtype). `ord` is normally a
// runtime Scalar, so every special case is computed and the right one
// selected; a baked number (Double/Int) picks one statically.
std::vector<Value> VectorNorm(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  ElementType ct = ComputeType(Out(c).dtype);
  Value x = b.Convert(Self(a), ct);
  auto dims = DimsArg(a, 2, x.rank());
  Value ax = b.Unary("abs", x);
  auto inf_norm = [&] { return Extreme(b, ax, dims, true); };
  auto ninf_norm = [&] { return Extreme(b, ax, dims, false); };
  auto zero_norm = [&] {
    return Sum(b, b.Convert(b.Compare("NE", ax, Fill(b, ax, 0)), ct), dims);
  };
  auto one_norm = [&] { return Sum(b, ax, dims); };
  auto two_norm = [&] { return b.Unary("sqrt", Sum(b, b.Binary("multiply", x, x), dims)); };
  auto p_norm = [&](Value p_reduced) {
    Value p = Expand(b, p_reduced, x, dims);
    Value s = Sum(b, b.Binary("power", ax, p), dims);
    return b.Binary("power", s, b.Binary("divide", Fill(b, s, 1), p_reduced));
  };
  const Arg& ord = a.at(1);
  Value r;
  if (ord.kind == K::Double || ord.kind == K::Int) {
    double p = ord.kind == K::Double ? ord.d : static_cast<double>(ord.i);
    if (std::isinf(p)) {
      r = p > 0 ? inf_norm() : ninf_norm();
    } else if (p == 0) {
      r = zero_norm();
    } else if (p == 1) {
      r = one_norm();
    } else if (p == 2) {
      r = two_norm();
    } else {
      Value two = two_norm();
      r = p_norm(Fill(b, two, p));
    }
  } else {
    Value two = two_norm();
    Value p = As(b, ord, ct, two.shape());
    auto is = [&](double v) { return b.Compare("EQ", p, Fill(b, p, v)); };
    r = p_norm(p);
    r = b.Select(is(1), one_norm(), r);
    r = b.Select(is(0), zero_norm(), r);
    r = b.Select(is(-INFINITY), ninf_norm(), r);
    r = b.Select(is(INFINITY), inf_norm(), r);
    r = b.Select(is(2), two, r);
  }
  return {Finish(c, r)};
}

Rule CumulativeRule(bool product) {
  return [product](Context& c, const std::vector<Arg>& a) {
    ElementType ct = ComputeType(Out(c).dtype);
    Value x0 = Self(a);
    int64_t dim = WrapDim(a.at(1).i, x0.rank());
    Value x = AtLeast1d(c.b, c.b.Convert(x0, ct));
    return std::vector<Value>{Finish(c, Scan(c.b, x, dim, product))};
  };
}

// A softmax's rows (DynamicShapes::rows_when): a 2-d input, over its last dim.
bool RowsOverLastDim(const std::vector<Arg>& a) {
  const Arg& x = a.at(0);
  return x.kind == Arg::Kind::Tensor && x.tensor.rank() == 2 && WrapDim(a.at(a.size() > 3 ? 2 : 1).i, 2) == 1;
}

const bool registered = [] {
  // Out= variants take the functional's arguments first, then the outputs.
  Register("sum", SumRule(-1, false), {"sum.out"}).Dynamic();
  Register("sum.dim_IntList", SumRule(1, false), {"sum.IntList_out"}).Dynamic().dynamic.independent_dims = KeptDims(1);
  Register("mean", SumRule(-1, true), {"mean.dtype_out"}).Dynamic();
  Register("mean.dim", SumRule(1, true), {"mean.out"}).Dynamic().dynamic.independent_dims = KeptDims(1);
  Register("prod", ProdRule(-1), {"prod.out"}).Dynamic();
  Register("nansum", NanSumRule);
  Register("prod.dim_int", ProdRule(1), {"prod.int_out"}).Dynamic().dynamic.independent_dims = KeptDims(1);
  Register("amax", ExtremeRule(1, true), {"amax.out"}).Dynamic().dynamic.independent_dims = KeptDims(1);
  Register("amin", ExtremeRule(1, false), {"amin.out"}).Dynamic().dynamic.independent_dims = KeptDims(1);
  Register("max", ExtremeRule(-1, true), {"max.unary_out"}).Dynamic();
  Register("min", ExtremeRule(-1, false), {"min.unary_out"}).Dynamic();
  Register("max.dim", ExtremeDimRule(true), {"max.dim_max"}).Dynamic().dynamic.independent_dims = KeptDims(1);
  Register("min.dim", ExtremeDimRule(false), {"min.dim_min"}).Dynamic().dynamic.independent_dims = KeptDims(1);
  Register("argmax", ArgRule(true), {"argmax.out"}).Dynamic().dynamic.independent_dims = KeptDims(1);
  Register("argmin", ArgRule(false), {"argmin.out"}).Dynamic().dynamic.independent_dims = KeptDims(1);
  Register("var.correction", VarRule(false, false), {"var.correction_out"}).Dynamic(ComplexExact).dynamic.independent_dims = KeptDims(1);
  Register("std.correction", VarRule(true, false), {"std.correction_out"}).Dynamic(ComplexExact).dynamic.independent_dims = KeptDims(1);
  Register("var_mean.correction", VarRule(false, true), {"var_mean.correction_out"}).Dynamic(ComplexExact).dynamic.independent_dims = KeptDims(1);
  Register("std_mean.correction", VarRule(true, true), {"std_mean.correction_out"}).Dynamic(ComplexExact).dynamic.independent_dims = KeptDims(1);
  Register("any", AnyAllRule(-1, true), {"any.all_out"}).Dynamic();
  Register("any.dim", AnyAllRule(1, true), {"any.out"}).Dynamic().dynamic.independent_dims = KeptDims(1);
  Register("any.dims", AnyAllRule(1, true), {"any.dims_out"});
  Register("all", AnyAllRule(-1, false), {"all.all_out"}).Dynamic();
  Register("all.dim", AnyAllRule(1, false), {"all.out"}).Dynamic().dynamic.independent_dims = KeptDims(1);
  Register("all.dims", AnyAllRule(1, false), {"all.dims_out"});
  Register("logsumexp", LogSumExp, {"logsumexp.out"}).Dynamic(ComplexExact).dynamic.independent_dims = KeptDims(1);
  // (Log-)softmax over the last dim of [r, k] rows treats its rows
  // independently, also in its backward (grad_output, output, dim, ...).
  for (bool log : {false, true}) {
    std::string name = log ? "_log_softmax" : "_softmax";
    RuleEntry& fwd = Register(name, SoftmaxRule(log), {name + ".out"}).Dynamic();
    fwd.dynamic.rows_args = {0};
    fwd.dynamic.rows_when = RowsOverLastDim;
    fwd.dynamic.independent_dims = KeptDims(1);  // (self, dim, half_to_float)
    std::string bwd_name = name + "_backward_data";
    RuleEntry& bwd = Register(bwd_name, SoftmaxBackwardRule(log), {bwd_name + ".out"}).Dynamic();
    bwd.dynamic.rows_args = {0, 1};
    bwd.dynamic.rows_when = RowsOverLastDim;
  }
  RuleEntry& safe = Register("_safe_softmax", SafeSoftmax).Dynamic();
  safe.dynamic.rows_args = {0};
  safe.dynamic.rows_when = RowsOverLastDim;
  safe.dynamic.independent_dims = KeptDims(1);
  Register("linalg_vector_norm", VectorNorm, {"linalg_vector_norm.out"}).Dynamic(ComplexExact).dynamic.independent_dims = KeptDims(2);
  Register("cumsum", CumulativeRule(false), {"cumsum.out", "cumsum_"}).Dynamic().dynamic.independent_dims = KeptDims(1);
  // A scan runs from the first element: the padding after the real ones adds nothing to them.
  Register("cumprod", CumulativeRule(true), {"cumprod.out", "cumprod_"}).Dynamic().dynamic.independent_dims = KeptDims(1);
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
