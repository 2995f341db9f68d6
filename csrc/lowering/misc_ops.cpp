// Miscellaneous rules that used to fall back to the CPU:
//
// - mode(self, dim, keepdim): the most frequent value of each slice, from one
//   stable sort. Ties between values go to the smallest value; the index is
//   the LAST occurrence of that value in the slice. That is what the CPU
//   kernel returns whenever it is deterministic (slices of <= 16 elements,
//   where std::sort is an insertion sort); for longer slices the CPU's index
//   depends on its unstable sort (any occurrence of the mode). A NaN is never
//   equal to anything (as on the CPU), so each NaN counts once; NaNs sort last.
// - randperm.generator_out: the permutation that sorts n random 64-bit keys
//   drawn from the tpu generator (rng_bit_generator, ThreeFry keyed by the
//   generator's state): on device, reproducible under torch.manual_seed, not
//   PyTorch's CPU stream.
// - histc (+ out=): float inputs follow the CPU kernel (linear interpolation
//   in the input dtype, NaN and out-of-range elements ignored, the last bin
//   closed); integer inputs follow CUDA (bounds truncated to integers, bins
//   by int64 division), which the CPU kernel does not implement. min == max
//   takes the range from the data on device (no sync); range errors are
//   device-side assertions raised at the next sync point.
// - embedding_renorm (+ in-place, out=): rows referenced by `indices` whose
//   norm exceeds max_norm are scaled by max_norm / (norm + 1e-7), each row
//   once however often it is referenced (nn.Embedding(max_norm=...)).
#include <cmath>
#include <limits>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

using K = Arg::Kind;
using E = ElementType;

Value AtLeast1d(Builder& b, Value x) { return x.rank() == 0 ? b.Reshape(x, {1}) : x; }

// Stable ascending sort of `x` along `dim` with an i64 iota carried along
// (original positions). NaN sorts last; bools sort as ui8.
std::pair<Value, Value> SortWithIndices(Builder& b, Value x, int64_t dim) {
  Value idx = b.Iota(TensorType{E::I64, x.shape()}, dim);
  bool is_float = hlo::IsFloat(x.dtype());
  auto r = b.Sort({x, idx}, dim, /*stable=*/true, [&](Builder& b, const std::vector<Value>& a) {
    Value before = b.Compare("LT", a[0], a[1]);
    if (is_float) {  // a number comes before a NaN
      Value lnan = b.Compare("NE", a[0], a[0]), rnan = b.Compare("NE", a[1], a[1]);
      before = b.Binary("or", before, b.Binary("and", b.Unary("not", lnan), rnan));
    }
    return before;
  });
  return {r[0], r[1]};
}

// x shifted by `k` along dim (k > 0: towards higher positions), filled with `fill`.
Value Shift(Builder& b, Value x, int64_t dim, int64_t k, Value fill) {
  int64_t r = x.rank();
  std::vector<int64_t> zeros(r, 0), ones(r, 1), low(r, 0), high(r, 0);
  if (k > 0) {
    low[dim] = k;
    Value padded = b.Pad(x, fill, low, zeros, zeros);
    return b.Slice(padded, zeros, x.shape(), ones);
  }
  high[dim] = -k;
  Value padded = b.Pad(x, fill, zeros, high, zeros);
  std::vector<int64_t> start(r, 0), limit = padded.shape();
  start[dim] = -k;
  return b.Slice(padded, start, limit, ones);
}

// Inclusive running maximum along dim (Hillis-Steele, log2(n) steps).
Value CumMax(Builder& b, Value x, int64_t dim) {
  Value lowest = b.MinValue(x.dtype());
  for (int64_t k = 1; k < x.shape()[dim]; k *= 2)
    x = b.Binary("maximum", x, Shift(b, x, dim, k, lowest));
  return x;
}

// ---------------------------------------------------------------- mode

// mode(self, int dim=-1, bool keepdim=False) -> (values, indices)
std::vector<Value> Mode(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value x0 = a.at(0).tensor;
  int64_t dim = WrapDim(a.at(1).i, x0.rank());
  const TensorType& vo = c.outputs.at(0);
  const TensorType& io = c.outputs.at(1);
  Value x = AtLeast1d(b, x0);
  int64_t n = x.shape()[dim];
  if (vo.numel() == 0 || n == 0) {
    if (n == 0 && vo.numel() != 0)
      throw std::out_of_range("mode(): Expected reduction dim " + std::to_string(dim) +
                              " to have non-zero size.");
    return {b.Splat(vo.dtype, 0, vo.shape), b.Splat(io.dtype, 0, io.shape)};
  }
  E t = x.dtype();
  Value xv = t == E::Bool ? b.Convert(x, E::U8) : x;
  auto [s, p] = SortWithIndices(b, xv, dim);
  const auto& shape = s.shape();
  // same[i]: s[i] == s[i-1] (false at i = 0; NaN equals nothing).
  Value prev = Shift(b, s, dim, 1, b.ConstantInt(s.dtype(), 0));
  Value pos = b.Iota(TensorType{E::I64, shape}, dim);
  Value first = b.Compare("EQ", pos, b.Splat(E::I64, 0, shape));
  Value same = b.Binary("and", b.Compare("EQ", s, prev), b.Unary("not", first));
  // Start of each element's run, then the run length at its last element.
  Value start = CumMax(b, b.Select(same, b.Splat(E::I64, 0, shape), pos), dim);
  Value freq = b.Binary("add", b.Binary("subtract", pos, start), b.Splat(E::I64, 1, shape));
  Value same_next = Shift(b, same, dim, -1, b.ConstantInt(E::Bool, 0));
  Value score = b.Select(same_next, b.Splat(E::I64, 0, shape), freq);  // run ends only
  // Highest count, then lowest sorted position (the smallest value); carry
  // the value and its original index (the run's last = highest index).
  auto r = b.ReduceN(
      {score, pos, s, p},
      {b.ConstantInt(E::I64, -1), b.ConstantInt(E::I64, std::numeric_limits<int64_t>::max()),
       b.ConstantInt(s.dtype(), 0), b.ConstantInt(E::I64, 0)},
      {dim}, [](Builder& rb, const std::vector<Value>& v) {
        Value fa = v[0], ia = v[1], fb = v[4], ib = v[5];
        Value pick_a = rb.Binary(
            "or", rb.Compare("GT", fa, fb),
            rb.Binary("and", rb.Compare("EQ", fa, fb), rb.Compare("LT", ia, ib)));
        std::vector<Value> out;
        for (int k = 0; k < 4; ++k) out.push_back(rb.Select(pick_a, v[k], v[k + 4]));
        return out;
      });
  Value values = b.Convert(r[2], vo.dtype);
  return {b.Reshape(values, vo.shape), b.Reshape(b.Convert(r[3], io.dtype), io.shape)};
}

// ---------------------------------------------------------------- randperm

// randperm.generator_out(int n, *, Generator? generator, Tensor(a!) out)
std::vector<Value> RandPerm(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = c.outputs.at(0);
  int64_t n = out.numel();
  // As the CPU kernel: n - 1 must be representable in the result dtype.
  auto limit = [&]() -> std::pair<int64_t, const char*> {
    switch (out.dtype) {
      case E::I8: return {127, "int8_t"};
      case E::U8: return {255, "uint8_t"};
      case E::I16: return {32767, "int16_t"};
      case E::I32: return {2147483647, "int32_t"};
      case E::F16: return {(1 << 11) + 1, "Half"};
      case E::BF16: return {(1 << 8) + 1, "BFloat16"};
      case E::F32: return {(1 << 24) + 1, "Float"};
      case E::F64: return {(int64_t{1} << 53) + 1, "Double"};
      default: return {std::numeric_limits<int64_t>::max(), "int64_t"};
    }
  }();
  if (hlo::IsFloat(out.dtype) ? n > limit.first : n - 1 > limit.first)
    throw std::invalid_argument(std::string("randperm: n = ") + std::to_string(n) +
                                " is too large for the result type " + limit.second);
  if (out.dtype == E::Bool) throw std::invalid_argument("randperm not implemented for 'Bool'");
  if (n == 0) return {b.Splat(out.dtype, 0, out.shape)};
  Value keys = b.RandomBits(GeneratorArg(a).tensor, TensorType{E::U64, {n}});
  Value idx = b.Iota(TensorType{E::I64, {n}}, 0);
  // Stable: (astronomically unlikely) equal keys still give a permutation.
  auto r = b.Sort({keys, idx}, 0, /*stable=*/true,
                  [](Builder& b, const std::vector<Value>& v) { return b.Compare("LT", v[0], v[1]); });
  return {b.Reshape(b.Convert(r[1], out.dtype), out.shape)};
}

// ---------------------------------------------------------------- histc

// histc(self, int bins=100, Scalar min=0, Scalar max=0)
std::vector<Value> Histc(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = c.outputs.at(0);
  Value x0 = a.at(0).tensor;
  E t = x0.dtype();
  if (t == E::Bool) throw std::invalid_argument("histc: not implemented for 'Bool'");
  int64_t bins = a.at(1).i;
  if (bins <= 0) throw std::invalid_argument("torch.histc: bins must be > 0, but got " +
                                             std::to_string(bins));
  bool is_float = hlo::IsFloat(t);
  // Bounds: the compute type for floats (the CPU's doubles, rounded once to
  // the input dtype below), int64 for integers (CUDA's accumulate type).
  E bt = is_float ? ComputeType(t) : E::I64;
  int64_t n = x0.type.numel();
  Value x = b.Reshape(x0, {n});
  Value lo = As(b, a.at(2), bt, {});
  Value hi = As(b, a.at(3), bt, {});
  if (n > 0) {  // min == max: the data's range
    Value xb = b.Convert(x, bt);
    Value dmin = b.ReduceN({xb}, {b.MaxValue(bt)}, {0}, [](Builder& rb, const std::vector<Value>& v) {
      return std::vector<Value>{MaxMin(rb, v[0], v[1], false)};
    })[0];
    Value dmax = b.ReduceN({xb}, {b.MinValue(bt)}, {0}, [](Builder& rb, const std::vector<Value>& v) {
      return std::vector<Value>{MaxMin(rb, v[0], v[1], true)};
    })[0];
    Value from_data = b.Compare("EQ", lo, hi);
    lo = b.Select(from_data, dmin, lo);
    hi = b.Select(from_data, dmax, hi);
  }
  Value equal = b.Compare("EQ", lo, hi);
  Value one = b.ConstantInt(bt, 1);
  lo = b.Select(equal, b.Binary("subtract", lo, one), lo);
  hi = b.Select(equal, b.Binary("add", hi, one), hi);
  if (is_float) {
    auto finite = [&](Value v) {
      return b.IsFinite(v);
    };
    c.Require(b.Binary("and", finite(lo), finite(hi)),
              "torch.histc: range of [min, max] is not finite");
  }
  c.Require(b.Compare("LT", lo, hi), "torch.histc: max must be larger than min");
  if (n == 0) return {b.Splat(out.dtype, 0, out.shape)};

  std::vector<int64_t> shape{n};
  Value pos;
  Value inside;
  if (is_float) {
    // The CPU kernel: ((x - left) * bins / (right - left)) in the input dtype.
    Value left = b.BroadcastTo(b.Convert(lo, t), shape);
    Value right = b.BroadcastTo(b.Convert(hi, t), shape);
    inside = b.Binary("and", b.Compare("GE", x, left), b.Compare("LE", x, right));  // NaN: no
    Value q = b.Binary("divide",
                       b.Binary("multiply", b.Binary("subtract", x, left),
                                b.Splat(t, static_cast<double>(bins), shape)),
                       b.Binary("subtract", right, left));
    pos = b.Convert(b.Select(inside, q, b.Splat(t, 0, shape)), E::I64);
  } else {
    // CUDA's integer path: (x - min) * bins / (max - min) in int64.
    Value xi = b.Convert(x, E::I64);
    Value left = b.BroadcastTo(lo, shape), right = b.BroadcastTo(hi, shape);
    inside = b.Binary("and", b.Compare("GE", xi, left), b.Compare("LE", xi, right));
    Value num = b.Binary("multiply", b.Binary("subtract", xi, left),
                         b.Splat(E::I64, static_cast<double>(bins), shape));
    Value den = b.Select(inside, b.Binary("subtract", right, left), b.Splat(E::I64, 1, shape));
    pos = b.Binary("divide", b.Select(inside, num, b.Splat(E::I64, 0, shape)), den);
  }
  // The last bin is closed: x == max lands in bin bins - 1.
  pos = b.Clamp(b.ConstantInt(E::I64, 0), pos, b.ConstantInt(E::I64, bins - 1));
  E acc = is_float ? ComputeType(t) : E::I64;
  Value ones = b.Convert(inside, acc);
  Value hist = b.Scatter(b.Splat(acc, 0, {bins}), b.Reshape(pos, {n, 1}), ones, {0}, "add");
  return {b.Reshape(b.Convert(hist, out.dtype), out.shape)};
}

// ---------------------------------------------------------------- embedding_renorm

// embedding_renorm(self, indices, float max_norm, float norm_type): the new weight.
std::vector<Value> EmbeddingRenorm(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value w = a.at(0).tensor;
  Value indices = a.at(1).tensor;
  const TensorType& out = c.outputs.at(0);
  if (w.rank() != 2)
    throw std::invalid_argument("embedding_renorm_: Expected 2-dimensional tensor, but got " +
                                std::to_string(w.rank()) + "-dimensional tensor for argument #1 'self'");
  if (indices.dtype() != E::I64 && indices.dtype() != E::I32)
    throw std::invalid_argument("embedding_renorm_: Expected tensor for argument #2 'indices' to "
                                "have one of the following scalar types: Long, Int");
  if (!hlo::IsFloat(w.dtype())) throw Unsupported("embedding_renorm_ of a non-float weight");
  double max_norm = a.at(2).kind == K::Int ? static_cast<double>(a.at(2).i) : a.at(2).d;
  double p = a.at(3).kind == K::Int ? static_cast<double>(a.at(3).i) : a.at(3).d;
  int64_t n = indices.type.numel();
  int64_t rows = w.shape()[0], d = w.shape()[1];
  if (n == 0 || rows == 0) return {b.Convert(w, out.dtype)};
  // Like the CPU kernel (self[i] selects), negative indices wrap.
  Value idx = CheckedIndex(c, b.Reshape(indices, {n}), rows, true, "embedding_renorm_");
  Value at = b.Reshape(idx, {n, 1});
  Value r = b.Gather(w, at, {0});  // [n, d]
  E ct = ComputeType(w.dtype());
  Value rc = b.Convert(r, ct);
  Value ar = b.Unary("abs", rc);
  std::vector<int64_t> shape{n, d};
  Value norm;
  if (std::isinf(p)) {
    norm = b.Reduce(ar, p > 0 ? b.MinValue(ct) : b.MaxValue(ct), {1}, p > 0 ? "maximum" : "minimum");
  } else if (p == 0) {
    norm = b.Reduce(b.Convert(b.Compare("NE", ar, b.Splat(ct, 0, shape)), ct), b.Constant(ct, 0),
                    {1}, "add");
  } else if (p == 1) {
    norm = b.Reduce(ar, b.Constant(ct, 0), {1}, "add");
  } else if (p == 2) {
    norm = b.Unary("sqrt", b.Reduce(b.Binary("multiply", rc, rc), b.Constant(ct, 0), {1}, "add"));
  } else {
    Value s = b.Reduce(b.Binary("power", ar, b.Splat(ct, p, shape)), b.Constant(ct, 0), {1}, "add");
    norm = b.Binary("power", s, b.Splat(ct, 1.0 / p, {n}));
  }
  // The norm is a tensor of the weight's dtype on the CPU.
  norm = b.Convert(b.Convert(norm, w.dtype()), ct);
  Value too_big = b.Compare("GT", norm, b.Splat(ct, max_norm, {n}));
  Value scale = b.Binary("divide", b.Splat(ct, max_norm, {n}),
                         b.Binary("add", norm, b.Splat(ct, 1e-7, {n})));
  scale = b.Select(too_big, scale, b.Splat(ct, 1, {n}));
  Value scaled = b.Convert(b.Binary("multiply", rc, b.BroadcastInDim(scale, shape, {0})), w.dtype());
  // Every copy of a repeated index writes the same row.
  Value result = b.Scatter(w, at, scaled, {0}, "assign");
  return {b.Convert(result, out.dtype)};
}

// addcmul(self, tensor1, tensor2, *, value=1) = self + value * tensor1 * tensor2
// addcdiv(...) = self + value * tensor1 / tensor2, in ATen's order of
// operations, 16-bit floats in float32 (opmath) as the CPU kernel.
Rule Addc(bool div) {
  return [div](Context& c, const std::vector<Arg>& a) -> std::vector<Value> {
    const TensorType& out = c.outputs.at(0);
    Builder& b = c.b;
    if (div && !hlo::IsFloat(out.dtype))
      throw Unsupported("addcdiv of integer tensors (PyTorch raises for them too)");
    ElementType ct = hlo::IsFloat(out.dtype) ? ComputeType(out.dtype) : out.dtype;
    Value self = As(b, a.at(0), ct, out.shape);
    Value t1 = As(b, a.at(1), ct, out.shape);
    Value t2 = As(b, a.at(2), ct, out.shape);
    Value value = As(b, a.at(3), ct, out.shape);
    Value term = b.Binary(div ? "divide" : "multiply", b.Binary("multiply", value, t1), t2);
    return {b.Convert(b.Binary("add", self, term), out.dtype)};
  };
}

// _weight_norm_interface(v, g, dim) -> (w, norms): norms = ||v|| over every
// dim but `dim`, w = v * (g / norms), as ATen's kernel (torch.nn.utils.
// weight_norm and parametrizations.weight_norm, e.g. Wav2Vec2's positional
// convolution).
struct WeightNormParts {
  int64_t dim, k;
  std::vector<int64_t> others;  // reduced dims
  ElementType ct;
};
WeightNormParts WeightNormSetup(const Value& v, int64_t dim_arg, ElementType out_dtype,
                                const char* op) {
  if (v.rank() == 0) throw Unsupported(std::string(op) + " of a 0-d tensor");
  WeightNormParts p;
  p.dim = WrapDim(dim_arg, v.rank());
  p.k = v.shape()[p.dim];
  for (int64_t d = 0; d < v.rank(); ++d)
    if (d != p.dim) p.others.push_back(d);
  p.ct = ComputeType(out_dtype);
  return p;
}
Value SumOthers(Builder& b, Value x, const WeightNormParts& p) {
  return p.others.empty() ? x : b.Reduce(x, b.Constant(p.ct, 0), p.others, "add");
}
Value AlongDim(Builder& b, Value perdim, const Value& like, const WeightNormParts& p) {
  return b.BroadcastInDim(b.Reshape(perdim, {p.k}), like.shape(), {p.dim});
}

std::vector<Value> WeightNormRule(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = c.outputs.at(0);
  Value v = a.at(0).tensor;
  WeightNormParts p = WeightNormSetup(v, a.at(2).i, out.dtype, "_weight_norm_interface");
  Value vf = b.Convert(v, p.ct);
  Value norm = b.Unary("sqrt", SumOthers(b, b.Binary("multiply", vf, vf), p));  // [k]
  Value g = b.Reshape(b.Convert(a.at(1).tensor, p.ct), {p.k});
  Value w = b.Binary("multiply", vf, AlongDim(b, b.Binary("divide", g, norm), vf, p));
  const TensorType& norms = c.outputs.at(1);
  return {b.Convert(w, out.dtype), b.Convert(b.Reshape(norm, norms.shape), norms.dtype)};
}

// _weight_norm_interface_backward(grad_w, saved_v, saved_g, saved_norms, dim)
//   -> (grad_v, grad_g): grad_g = sum(grad_w * v) / norms,
//   grad_v = (g / norms) * (grad_w - v * (grad_g / norms)).
std::vector<Value> WeightNormBackwardRule(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = c.outputs.at(0);
  Value v = a.at(1).tensor;
  WeightNormParts p =
      WeightNormSetup(v, a.at(4).i, out.dtype, "_weight_norm_interface_backward");
  Value vf = b.Convert(v, p.ct);
  Value gw = b.Convert(a.at(0).tensor, p.ct);
  Value g = b.Reshape(b.Convert(a.at(2).tensor, p.ct), {p.k});
  Value norm = b.Reshape(b.Convert(a.at(3).tensor, p.ct), {p.k});
  Value grad_g = b.Binary("divide", SumOthers(b, b.Binary("multiply", gw, vf), p), norm);
  Value inner = b.Binary(
      "subtract", gw,
      b.Binary("multiply", vf, AlongDim(b, b.Binary("divide", grad_g, norm), vf, p)));
  Value grad_v = b.Binary("multiply", AlongDim(b, b.Binary("divide", g, norm), vf, p), inner);
  const TensorType& gout = c.outputs.at(1);
  return {b.Convert(grad_v, out.dtype), b.Convert(b.Reshape(grad_g, gout.shape), gout.dtype)};
}

// nan_to_num(self, nan?, posinf?, neginf?): NaN -> nan (0), +inf -> posinf
// (the dtype's largest finite value), -inf -> neginf (its lowest); other
// dtypes unchanged.
double LargestFinite(ElementType t) {
  switch (t) {
    case ElementType::F16: return 65504.0;
    case ElementType::BF16: return 3.3895313892515355e38;
    case ElementType::F32: return 3.4028234663852886e38;
    default: return 1.7976931348623157e308;
  }
}

std::vector<Value> NanToNum(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = c.outputs.at(0);
  Value x = b.Convert(a.at(0).tensor, out.dtype);
  if (!hlo::IsFloat(out.dtype)) return {x};
  auto value = [&](size_t i, double fallback) {
    return a.size() > i && a[i].kind == K::Double ? a[i].d : fallback;
  };
  const std::vector<int64_t>& shape = out.shape;
  double big = LargestFinite(out.dtype);
  Value inf = b.Splat(out.dtype, std::numeric_limits<double>::infinity(), shape);
  Value r = b.Select(b.Compare("NE", x, x), b.Splat(out.dtype, value(1, 0.0), shape), x);
  r = b.Select(b.Compare("EQ", x, inf), b.Splat(out.dtype, value(2, big), shape), r);
  r = b.Select(b.Compare("EQ", x, b.Unary("negate", inf)), b.Splat(out.dtype, value(3, -big), shape), r);
  return {r};
}

const bool registered = [] {
  Register("nan_to_num", NanToNum);
  Register("_weight_norm_interface", WeightNormRule);
  Register("_weight_norm_interface_backward", WeightNormBackwardRule);
  Register("addcmul", Addc(false));
  Register("addcdiv", Addc(true));
  Register("mode", Mode);
  RegisterRandom("randperm.generator_out", RandPerm);
  Register("histc", Histc);
  Register("embedding_renorm", EmbeddingRenorm);
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
