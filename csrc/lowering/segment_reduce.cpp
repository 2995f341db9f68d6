// segment_reduce(data, reduce, lengths?, indices?, offsets?, axis, unsafe,
// initial?) and _segment_reduce_backward, as PyTorch's CPU kernels
// (SegmentReduce.cpp). Along `axis`, segment s of each row covers
// [start_s, end_s) (from lengths' running sums, or from offsets); it reduces
// with sum, prod, max, min or mean, starting from `initial` (default: 0, 1,
// lowest, highest, 0). An empty mean segment without initial is NaN; max
// and min propagate NaN.
//
// Data [P, L, R] (P: the dims before axis, R: those after) is compared with
// a membership mask [P, S, L] and reduced over L: S * L work per element of
// R, which suits segment counts of feature or batch size. The backward
// spreads the gradient back through the same mask: mean divides by the
// length; max/min give it to the elements equal to the result (NaNs too),
// the positive shares divided by their count (as CPU); prod uses out / x,
// or, for a zero or NaN x, the product of the segment's other elements.
#include <cmath>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

enum class Reduction { Sum, Prod, Max, Min, Mean };

Reduction ReadReduction(const std::string& s) {
  if (s == "sum") return Reduction::Sum;
  if (s == "prod") return Reduction::Prod;
  if (s == "max") return Reduction::Max;
  if (s == "min") return Reduction::Min;
  if (s == "mean") return Reduction::Mean;
  throw std::invalid_argument("segment_reduce: reduce must be one of sum, prod, max, min, mean; got " + s);
}

// The segments of one call: data as [P, L, R] in the compute type, the
// membership mask [P, S, L] and each segment's length [P, S] (i64).
struct Segments {
  int64_t p = 1, l = 1, r = 1, s = 0;
  std::vector<int64_t> out_shape;  // lead + [S] + rest
  Value data, member, length;
};

Segments ReadSegments(Context& c, Value data, const Arg& lengths, const Arg& offsets, int64_t axis,
                      ElementType ct) {
  Builder& b = c.b;
  Segments g;
  axis = WrapDim(axis, data.rank());
  const auto& shape = data.shape();
  for (int64_t i = 0; i < axis; ++i) g.p *= shape[i];
  for (int64_t i = axis + 1; i < data.rank(); ++i) g.r *= shape[i];
  g.l = shape[axis];
  bool by_lengths = !lengths.is_none();
  if (!by_lengths && offsets.is_none())
    throw std::invalid_argument("segment_reduce: one of lengths or offsets must be given");
  Value seg = by_lengths ? lengths.tensor : offsets.tensor;
  if (seg.rank() != axis + 1)
    throw std::invalid_argument("segment_reduce: expected lengths / offsets of rank axis + 1");
  int64_t n = seg.shape().back();
  g.s = by_lengths ? n : n - 1;
  Value v = b.Convert(b.Reshape(seg, {g.p, n}), ElementType::I64);
  Value start, end;
  if (by_lengths) {  // end_s = sum_{t <= s} lengths_t
    std::vector<int64_t> sq{g.p, g.s, g.s};
    Value upto = b.Compare("LE", b.Iota(TensorType{ElementType::I64, sq}, 2),
                           b.Iota(TensorType{ElementType::I64, sq}, 1));
    Value terms = b.Select(upto, b.BroadcastInDim(v, sq, {0, 2}), b.Splat(ElementType::I64, 0, sq));
    end = b.Reduce(terms, b.ConstantInt(ElementType::I64, 0), {2}, "add");
    start = b.Binary("subtract", end, v);
  } else {
    start = b.Slice(v, {0, 0}, {g.p, g.s}, {1, 1});
    end = b.Slice(v, {0, 1}, {g.p, g.s + 1}, {1, 1});
  }
  g.length = b.Binary("subtract", end, start);
  std::vector<int64_t> ms{g.p, g.s, g.l};
  Value j = b.Iota(TensorType{ElementType::I64, ms}, 2);
  g.member = b.Binary("and", b.Compare("GE", j, b.BroadcastInDim(start, ms, {0, 1})),
                      b.Compare("LT", j, b.BroadcastInDim(end, ms, {0, 1})));
  g.data = b.Reshape(b.Convert(data, ct), {g.p, g.l, g.r});
  g.out_shape.assign(shape.begin(), shape.begin() + axis);
  g.out_shape.push_back(g.s);
  g.out_shape.insert(g.out_shape.end(), shape.begin() + axis + 1, shape.end());
  return g;
}

std::vector<int64_t> Full(const Segments& g) { return {g.p, g.s, g.l, g.r}; }

// A [P, S, L] or [P, S] or [P, L, R] or [P, S, R] value broadcast to [P, S, L, R].
Value Member4(Builder& b, const Segments& g) { return b.BroadcastInDim(g.member, Full(g), {0, 1, 2}); }
Value Data4(Builder& b, const Segments& g) { return b.BroadcastInDim(g.data, Full(g), {0, 2, 3}); }
Value PerSegment4(Builder& b, const Segments& g, Value v) { return b.BroadcastInDim(v, Full(g), {0, 1, 3}); }

Value InitialValue(Builder& b, Reduction red, const Arg& initial, ElementType ct) {
  if (!initial.is_none()) return b.Convert(initial.tensor, ct);
  switch (red) {
    case Reduction::Prod: return b.Constant(ct, 1);
    case Reduction::Max: return b.MinValue(ct);
    case Reduction::Min: return b.MaxValue(ct);
    default: return b.Constant(ct, 0);
  }
}

// The reduction over each segment: [P, S, R].
Value Reduce(Builder& b, const Segments& g, Reduction red, const Arg& initial, ElementType ct) {
  Value init = InitialValue(b, red, initial, ct);
  Value member = Member4(b, g), x = Data4(b, g);
  // Non-members hold the reduction's identity (max / min: init itself).
  Value filler = b.BroadcastInDim(init, Full(g), {});
  if (red == Reduction::Mean || red == Reduction::Sum) filler = b.Splat(ct, 0, Full(g));
  if (red == Reduction::Prod) filler = b.Splat(ct, 1, Full(g));
  Value masked = b.Select(member, x, filler);
  const char* op = red == Reduction::Prod ? "multiply"
                   : red == Reduction::Max ? "maximum"
                   : red == Reduction::Min ? "minimum" : "add";
  Value r = b.Reduce(masked, init, {2}, op);
  std::vector<int64_t> os{g.p, g.s, g.r};
  if (red == Reduction::Max || red == Reduction::Min) {  // NaN wins, as CPU
    Value nan = b.Binary("and", member, b.Compare("NE", x, x));
    Value any = b.Reduce(nan, b.ConstantInt(ElementType::Bool, 0), {2}, "or");
    r = b.Select(any, b.Splat(ct, NAN, os), r);
  }
  if (red == Reduction::Mean) {
    Value len = b.BroadcastInDim(g.length, os, {0, 1});
    Value positive = b.Compare("GT", len, b.Splat(ElementType::I64, 0, os));
    Value mean = b.Binary("divide", r, b.Convert(len, ct));
    Value empty = initial.is_none() ? b.Splat(ct, NAN, os) : r;
    r = b.Select(positive, b.Select(b.Compare("NE", r, r), r, mean), empty);
  }
  return r;
}

// segment_reduce(data, reduce, lengths?, indices?, offsets?, axis, unsafe, initial?)
std::vector<Value> SegmentReduce(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  if (!a.at(3).is_none()) throw Unsupported("segment_reduce: indices (CPU fallback)");
  Reduction red = ReadReduction(a.at(1).s);
  ElementType ct = ComputeType(out.dtype);
  if (out.numel() == 0) return One(Zeros(b, out));
  Segments g = ReadSegments(c, a.at(0).tensor, a.at(2), a.at(4), a.at(5).i, ct);
  if (a.at(6).i == 0 && !a.at(2).is_none()) {  // lengths must cover the axis, as CPU checks
    Value total = b.Reduce(g.length, b.ConstantInt(ElementType::I64, 0), {1}, "add");
    Value ok = b.Compare("EQ", total, b.Splat(ElementType::I64, static_cast<double>(g.l), {g.p}));
    c.Require(b.Reduce(ok, b.ConstantInt(ElementType::Bool, 1), {0}, "and"),
              "segment_reduce: expected all rows of lengths along axis to sum to data.size(axis)");
  }
  Value r = Reduce(b, g, red, a.at(7), ct);
  return One(b.Convert(b.Reshape(r, out.shape), out.dtype));
}

// The product of each segment's elements other than j (times initial): [P, S, L, R].
Value ExclusiveProduct(Builder& b, const Segments& g, const Arg& initial, ElementType ct) {
  std::vector<int64_t> s5{g.p, g.s, g.l, g.l, g.r};  // [.., j, k, ..]
  Value k_member = b.BroadcastInDim(g.member, s5, {0, 1, 3});
  Value other = b.Compare("NE", b.Iota(TensorType{ElementType::I64, s5}, 2),
                          b.Iota(TensorType{ElementType::I64, s5}, 3));
  Value x = b.BroadcastInDim(g.data, s5, {0, 3, 4});
  Value terms = b.Select(b.Binary("and", k_member, other), x, b.Splat(ct, 1, s5));
  return b.Reduce(terms, InitialValue(b, Reduction::Prod, initial, ct), {3}, "multiply");
}

// The gradient of each (segment, element) pair, before the sum over segments.
Value PairGrad(Builder& b, const Segments& g, Reduction red, Value go, Value out,
               const Arg& initial, ElementType ct) {
  Value g4 = PerSegment4(b, g, go), x = Data4(b, g), member = Member4(b, g);
  Value zero = b.Splat(ct, 0, Full(g));
  switch (red) {
    case Reduction::Sum: return g4;
    case Reduction::Mean: {
      Value len = b.Convert(b.BroadcastInDim(g.length, Full(g), {0, 1}), ct);
      return b.Binary("divide", g4, len);  // only members are kept: len > 0
    }
    case Reduction::Max:
    case Reduction::Min: {
      Value hit = b.Binary("and", member, b.Binary("or", b.Compare("NE", x, x),
                                                   b.Compare("EQ", x, PerSegment4(b, g, out))));
      Value share = b.Select(hit, g4, zero);
      Value count = b.Reduce(b.Convert(hit, ct), b.Constant(ct, 0), {2}, "add");  // [P, S, R]
      Value c4 = b.BroadcastInDim(count, Full(g), {0, 1, 3});
      Value split = b.Binary("and", b.Compare("GE", c4, b.Splat(ct, 2, Full(g))),
                             b.Compare("GT", share, zero));
      return b.Select(split, b.Binary("divide", share, c4), share);
    }
    case Reduction::Prod: {
      Value via_out = b.Binary("divide", b.Binary("multiply", g4, PerSegment4(b, g, out)), x);
      Value special = b.Binary("or", b.Compare("NE", x, x), b.Compare("EQ", x, zero));
      Value direct = b.Binary("multiply", g4, ExclusiveProduct(b, g, initial, ct));
      return b.Select(special, direct, via_out);
    }
  }
  return zero;
}

// _segment_reduce_backward(grad, output, data, reduce, lengths?, offsets?, axis, initial?)
std::vector<Value> SegmentReduceBackward(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  Reduction red = ReadReduction(a.at(3).s);
  ElementType ct = ComputeType(out.dtype);
  if (out.numel() == 0) return One(Zeros(b, out));
  Segments g = ReadSegments(c, a.at(2).tensor, a.at(4), a.at(5), a.at(6).i, ct);
  if (g.s == 0) return One(Zeros(b, out));
  if (red == Reduction::Prod && g.p * g.s * g.l * g.l * g.r > (int64_t{1} << 24))
    throw Unsupported("_segment_reduce_backward: prod over long segments (CPU fallback)");
  Value go = b.Reshape(b.Convert(a.at(0).tensor, ct), {g.p, g.s, g.r});
  Value res = b.Reshape(b.Convert(a.at(1).tensor, ct), {g.p, g.s, g.r});
  Value pair = PairGrad(b, g, red, go, res, a.at(7), ct);
  Value kept = b.Select(Member4(b, g), pair, b.Splat(ct, 0, Full(g)));
  Value grad = b.Reduce(kept, b.Constant(ct, 0), {1}, "add");  // [P, L, R]
  return One(b.Convert(b.Reshape(grad, out.shape), out.dtype));
}

const bool registered = [] {
  Register("segment_reduce", SegmentReduce, {"segment_reduce.out"});
  Register("_segment_reduce_backward", SegmentReduceBackward, {"_segment_reduce_backward.out"});
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
