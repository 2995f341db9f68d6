// histc (+ out=): a histogram of the input's elements in `bins` equal bins
// between min and max. Float inputs follow the CPU kernel (linear
// interpolation in the input dtype, NaN and out-of-range elements ignored,
// the last bin closed); integer inputs follow CUDA (bounds truncated to
// integers, bins by int64 division), which the CPU kernel does not
// implement. min == max takes the range from the data on device (no sync);
// range errors are device-side assertions raised at the next sync point.
// At a bucket's sizes the padding is counted in no bin (RealElements).
#include <string>
#include <vector>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

using E = ElementType;

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
  // Bounded dynamic: the padding counts in no bin and bounds no range.
  Value real = RealElements(b, x0);
  if (real.valid()) real = b.Reshape(real, {n});
  Value x = b.Reshape(StaticFilled(b, x0, 0.0), {n});
  auto only_real = [&](Value v, Value identity) {
    return real.valid() ? b.Select(real, v, b.BroadcastInDim(identity, v.shape(), {})) : v;
  };
  Value lo = As(b, a.at(2), bt, {});
  Value hi = As(b, a.at(3), bt, {});
  if (n > 0) {  // min == max: the data's range
    Value xb = b.Convert(x, bt);
    Value dmin = b.ReduceN({only_real(xb, b.MaxValue(bt))}, {b.MaxValue(bt)}, {0},
                           [](Builder& rb, const std::vector<Value>& v) {
      return std::vector<Value>{MaxMin(rb, v[0], v[1], false)};
    })[0];
    Value dmax = b.ReduceN({only_real(xb, b.MinValue(bt))}, {b.MinValue(bt)}, {0},
                           [](Builder& rb, const std::vector<Value>& v) {
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
  if (real.valid()) inside = b.Binary("and", inside, real);
  Value ones = b.Convert(inside, acc);
  Value hist = b.Scatter(b.Splat(acc, 0, {bins}), b.Reshape(pos, {n, 1}), ones, {0}, "add");
  return {b.Reshape(b.Convert(hist, out.dtype), out.shape)};
}

// Bounded dynamic in every dim of its input (Mixtral's expert counts over a
// new number of tokens); the bins are its output, static.
const bool registered = [] {
  Register("histc", Histc).Dynamic();
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
