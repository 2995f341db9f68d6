// cummax / cummin: the running maximum (minimum) along dim and the index
// where it was last reached, as the CPU kernel's sequential loop
//   if (x >= acc || isnan(x)) { acc = x; idx = i; }   (<= for cummin)
// i.e. the best element so far in a total order where NaN is above every
// number and, among equals, the later one wins. That choice is associative,
// so the loop becomes a Hillis-Steele scan: log2(n) combines of each
// element with the one 2^k before it (padding: the lowest value, which
// never wins).
#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

using E = ElementType;

// Whether the later element (v2) replaces the earlier one (v1).
Value LaterWins(Builder& b, Value v1, Value v2, bool is_max) {
  Value wins = b.Compare(is_max ? "GE" : "LE", v2, v1);
  if (!hlo::IsFloat(v1.dtype())) return wins;
  return b.Binary("or", wins, b.Compare("NE", v2, v2));
}

Value Shifted(Builder& b, Value x, int64_t dim, int64_t k, Value pad) {
  int64_t r = x.rank();
  std::vector<int64_t> low(r, 0), high(r, 0), interior(r, 0), start(r, 0), ones(r, 1);
  low[dim] = k;
  return b.Slice(b.Pad(x, pad, low, high, interior), start, x.shape(), ones);
}

std::vector<Value> CumMaxMin(Context& c, const std::vector<Arg>& a, bool is_max) {
  Builder& b = c.b;
  Value x = a.at(0).tensor;
  const TensorType& out = Out(c);
  if (x.dtype() == E::Bool) x = b.Convert(x, E::U8);
  if (x.rank() == 0) x = b.Reshape(x, {1});
  if (out.numel() == 0) return {Zeros(b, Out(c, 0)), Zeros(b, Out(c, 1))};
  int64_t dim = WrapDim(a.at(1).i, x.rank());
  int64_t n = x.shape()[dim];
  // The value that never wins: -inf (+inf for cummin) or the integer extreme.
  Value never = is_max ? b.MinValue(x.dtype()) : b.MaxValue(x.dtype());
  Value v = x, idx = b.Iota(TensorType{E::I64, x.shape()}, dim);
  for (int64_t k = 1; k < n; k *= 2) {
    Value pv = Shifted(b, v, dim, k, never), pi = Shifted(b, idx, dim, k, b.ConstantInt(E::I64, 0));
    Value keep = LaterWins(b, pv, v, is_max);
    v = b.Select(keep, v, pv);
    idx = b.Select(keep, idx, pi);
  }
  return {b.Reshape(b.Convert(v, Out(c, 0).dtype), Out(c, 0).shape),
          b.Reshape(b.Convert(idx, Out(c, 1).dtype), Out(c, 1).shape)};
}

const bool registered = [] {
  // Bounded dynamic: the scan runs from the first element, so the padding
  // after the real ones never reaches them.
  Register("cummax", [](Context& c, const std::vector<Arg>& a) { return CumMaxMin(c, a, true); },
           {"cummax.out"}).Dynamic().dynamic.independent_dims = KeptDims(1);
  Register("cummin", [](Context& c, const std::vector<Arg>& a) { return CumMaxMin(c, a, false); },
           {"cummin.out"}).Dynamic().dynamic.independent_dims = KeptDims(1);
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
