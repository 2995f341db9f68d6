// Tensor manipulation and factory rules: cat, stack, clone, fills, factories
// (arange, linspace, eye), flip, roll, tril/triu, repeat, masked_fill,
// indexing (embedding, index_select, gather, scatter, index_add) and
// constant_pad_nd. Output shapes and dtypes come from ctx.outputs (PyTorch's
// meta kernels); factory lengths are therefore baked, their start / end /
// step scalars stay runtime parameters.
//
// Indices are used as given: PyTorch raises on out-of-range (and, for these
// ops, negative) indices, which the rules do not check; XLA clamps gather
// indices and drops out-of-range scatter updates.
#include <algorithm>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

using K = Arg::Kind;
using E = ElementType;

// A scalar (rank-0 value of a Scalar or 0-d Tensor arg) converted and
// broadcast to `shape`.
Value Fill(Builder& b, Value scalar, ElementType t, const std::vector<int64_t>& shape) {
  return b.BroadcastInDim(b.Convert(b.Reshape(scalar, {}), t), shape, {});
}

// The combiner of a scatter in dtype t: "add" / "multiply" become logical
// ops on bool.
std::string Combiner(const std::string& op, ElementType t) {
  if (t != E::Bool) return op;
  if (op == "add") return "or";
  if (op == "multiply") return "and";
  return op;
}

// ---------------------------------------------------------------- joining

std::vector<Value> Cat(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  if (out.numel() == 0) return One(Zeros(c.b, out));
  int64_t dim = WrapDim(a.size() > 1 ? a[1].i : 0, out.rank());
  std::vector<Value> parts;
  // Skips empty inputs, which includes PyTorch's legacy [0]-shaped tensors.
  for (const Value& v : a[0].tensors)
    if (v.type.numel() > 0) parts.push_back(c.b.Convert(v, out.dtype));
  if (parts.empty()) return One(Zeros(c.b, out));
  return One(c.b.Reshape(c.b.Concatenate(parts, dim), out.shape));
}

std::vector<Value> Stack(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  if (out.numel() == 0) return One(Zeros(c.b, out));
  int64_t dim = WrapDim(a.size() > 1 ? a[1].i : 0, out.rank());
  std::vector<Value> parts;
  for (const Value& v : a[0].tensors) {
    std::vector<int64_t> shape = v.shape();
    shape.insert(shape.begin() + dim, 1);
    parts.push_back(c.b.Reshape(c.b.Convert(v, out.dtype), shape));
  }
  return One(c.b.Concatenate(parts, dim));
}

// ---------------------------------------------------------------- factories

// arange.start_out(start, end, step): start + i * step, computed in
// PyTorch's CPU accumulate type (f64 for f32/f64, f32 for 16-bit floats,
// i64 for integers) then converted.
std::vector<Value> Arange(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  Builder& b = c.b;
  if (out.numel() == 0) return One(Zeros(b, out));
  E acc = hlo::IsFloat(out.dtype) ? (out.dtype == E::F16 || out.dtype == E::BF16 ? E::F32 : E::F64)
                                  : E::I64;
  if (out.dtype == E::Bool) throw Unsupported("arange of bool");
  int64_t n = out.shape.at(0);
  Value start = Fill(b, a[0].tensor, acc, {n});
  Value step = a.size() > 2 && !a[2].is_none() ? Fill(b, a[2].tensor, acc, {n})
                                                : b.Splat(acc, 1, {n});
  Value i = b.Convert(b.Iota(TensorType{E::I64, {n}}, 0), acc);
  Value r = b.Binary("add", start, b.Binary("multiply", step, i));
  return One(b.Reshape(b.Convert(r, out.dtype), out.shape));
}

// linspace.out(start, end, steps), as ATen's CPU kernel:
//   step = (end - start) / (steps - 1)
//   i < steps / 2 ? start + i * step : end - (steps - 1 - i) * step
// start, end and step in the output type; f32 outputs then evaluate the
// second line in f64 (the CPU kernel is compiled with FMA contraction, which
// rounds once); 16-bit floats round after each operation, as c10::Half
// arithmetic does; integers compute in f64 and truncate.
std::vector<Value> Linspace(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  Builder& b = c.b;
  if (out.numel() == 0) return One(Zeros(b, out));
  if (out.dtype == E::Bool) throw Unsupported("linspace of bool");
  int64_t n = out.shape.at(0);
  if (n == 1) return One(b.Reshape(Fill(b, a[0].tensor, out.dtype, {1}), out.shape));
  bool half = out.dtype == E::F16 || out.dtype == E::BF16;
  bool integral = !hlo::IsFloat(out.dtype);
  // The type of start, end and step, and the type the last line runs in.
  E st = integral ? E::F64 : ComputeType(out.dtype);
  E ct = out.dtype == E::F32 ? E::F64 : st;
  // Rounds to the output type where PyTorch's arithmetic does.
  auto round = [&](Value v) { return half ? b.Convert(b.Convert(v, out.dtype), st) : v; };
  // start/end: Scalar.to<scalar_t>() first.
  Value start = b.Convert(Fill(b, a[0].tensor, out.dtype, {n}), st);
  Value end = b.Convert(Fill(b, a[1].tensor, out.dtype, {n}), st);
  Value step = round(b.Binary("divide", round(b.Binary("subtract", end, start)),
                              round(b.Splat(st, static_cast<double>(n - 1), {n}))));
  start = b.Convert(start, ct);
  end = b.Convert(end, ct);
  step = b.Convert(step, ct);
  Value i = b.Iota(TensorType{E::I64, {n}}, 0);
  Value fi = round(b.Convert(i, ct));
  Value rev = round(b.Convert(b.Binary("subtract", b.Splat(E::I64, n - 1, {n}), i), ct));
  Value lo = b.Binary("add", start, round(b.Binary("multiply", step, fi)));
  Value hi = b.Binary("subtract", end, round(b.Binary("multiply", step, rev)));
  Value first_half = b.Compare("LT", i, b.Splat(E::I64, n / 2, {n}));
  Value r = b.Select(first_half, lo, hi);
  return One(b.Reshape(b.Convert(r, out.dtype), out.shape));
}

std::vector<Value> Eye(Context& c, const std::vector<Arg>&) {
  const TensorType& out = Out(c);
  Builder& b = c.b;
  if (out.numel() == 0) return One(Zeros(b, out));
  TensorType it{E::I64, out.shape};
  Value diag = b.Compare("EQ", b.Iota(it, 0), b.Iota(it, 1));
  return One(b.Convert(diag, out.dtype));
}

// ---------------------------------------------------------------- reordering

std::vector<Value> Flip(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  Value x = c.b.Convert(a[0].tensor, out.dtype);
  std::vector<int64_t> dims;
  if (x.rank() > 0) {
    for (int64_t d : a[1].ints) dims.push_back(WrapDim(d, x.rank()));
    std::sort(dims.begin(), dims.end());
    dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
  }
  if (out.numel() == 0) return One(Zeros(c.b, out));
  return One(c.b.Reverse(x, dims));
}

Value RollDim(Builder& b, Value x, int64_t shift, int64_t dim) {
  int64_t n = x.shape()[dim];
  if (n == 0) return x;
  int64_t s = ((shift % n) + n) % n;
  if (s == 0) return x;
  std::vector<int64_t> zero(x.rank(), 0), one(x.rank(), 1), full = x.shape();
  std::vector<int64_t> tail_start = zero, head_limit = full;
  tail_start[dim] = n - s;
  head_limit[dim] = n - s;
  Value tail = b.Slice(x, tail_start, full, one);
  Value head = b.Slice(x, zero, head_limit, one);
  return b.Concatenate({tail, head}, dim);
}

std::vector<Value> Roll(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  Value x = c.b.Convert(a[0].tensor, out.dtype);
  if (out.numel() == 0) return One(Zeros(c.b, out));
  const std::vector<int64_t>& shifts = a[1].ints;
  std::vector<int64_t> dims = a.size() > 2 ? a[2].ints : std::vector<int64_t>{};
  if (dims.empty()) {
    if (shifts.size() != 1) throw std::invalid_argument("roll: shifts and dims mismatch");
    Value flat = c.b.Reshape(x, {x.type.numel()});
    return One(c.b.Reshape(RollDim(c.b, flat, shifts[0], 0), out.shape));
  }
  if (shifts.size() != dims.size())
    throw std::invalid_argument("roll: shifts and dimensions must align");
  for (size_t k = 0; k < dims.size(); ++k)
    x = RollDim(c.b, x, shifts[k], WrapDim(dims[k], x.rank()));
  return One(x);
}

// tril keeps col - row <= diagonal, triu keeps col - row >= diagonal.
Rule Triangle(bool lower) {
  return [lower](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = Out(c);
    Builder& b = c.b;
    Value x = b.Convert(a[0].tensor, out.dtype);
    if (x.rank() < 2) throw std::invalid_argument("tril/triu: input must be at least 2-D");
    if (out.numel() == 0) return One(Zeros(b, out));
    int64_t k = a.size() > 1 && a[1].kind == K::Int ? a[1].i : 0;
    int64_t rows = x.shape()[x.rank() - 2], cols = x.shape()[x.rank() - 1];
    TensorType it{E::I64, {rows, cols}};
    Value diff = b.Binary("subtract", b.Iota(it, 1), b.Iota(it, 0));
    Value mask = b.Compare(lower ? "LE" : "GE", diff, b.Splat(E::I64, k, {rows, cols}));
    mask = b.BroadcastInDim(mask, x.shape(), {x.rank() - 2, x.rank() - 1});
    return One(b.Select(mask, x, Zeros(b, x.type)));
  };
}

std::vector<Value> Repeat(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  Builder& b = c.b;
  Value x = b.Convert(a[0].tensor, out.dtype);
  if (out.numel() == 0) return One(Zeros(b, out));
  const std::vector<int64_t>& reps = a[1].ints;
  int64_t n = static_cast<int64_t>(reps.size());
  if (n < x.rank()) throw std::invalid_argument("repeat: fewer repeats than dimensions");
  std::vector<int64_t> padded(n - x.rank(), 1);
  padded.insert(padded.end(), x.shape().begin(), x.shape().end());
  x = b.Reshape(x, padded);
  std::vector<int64_t> wide, dims;
  for (int64_t i = 0; i < n; ++i) {
    wide.push_back(reps[i]);
    wide.push_back(padded[i]);
    dims.push_back(2 * i + 1);
  }
  return One(b.Reshape(b.BroadcastInDim(x, wide, dims), out.shape));
}

// repeat under bounded dynamic shapes: a dim repeated more than once stays
// static (its copies would be separated by padding); the others run dynamic.
void RepeatedDimsStatic(const std::vector<Arg>& a, StaticDims& s) {
  ComplexExact(a, s);
  const std::vector<int64_t>& reps = a.at(1).ints;
  const size_t rank = s.Rank(0);
  if (reps.size() < rank) return;  // the rule rejects it
  for (size_t d = 0; d < rank; ++d)
    if (reps[reps.size() - rank + d] != 1) s.Dim(0, d);
  s.Because("a dim it repeats");
}

// ---------------------------------------------------------------- filling

std::vector<Value> FillRule(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  return One(Fill(c.b, a[1].tensor, out.dtype, out.shape));
}

std::vector<Value> MaskedFill(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  Builder& b = c.b;
  Value x = As(b, a[0], out.dtype, out.shape);
  Value mask = As(b, a[1], E::Bool, out.shape);
  Value v = Fill(b, a[2].tensor, out.dtype, out.shape);
  return One(b.Select(mask, v, x));
}

// x padded in dim d by `low` and `high` elements of `value`, as the
// concatenation [low block, x, high block]: on a bounded-dynamic dim XLA's
// padder puts the high block right after the real elements (a pad would
// leave the padding of x between them).
Value PadByBlocks(Builder& b, Value x, Value value, int64_t d, int64_t low, int64_t high) {
  if (low == 0 && high == 0) return x;
  auto block = [&](int64_t n) {
    std::vector<int64_t> shape = x.shape();
    shape[d] = n;
    return b.BroadcastInDim(value, shape, {});
  };
  std::vector<Value> parts;
  if (low > 0) parts.push_back(block(low));
  parts.push_back(x);
  if (high > 0) parts.push_back(block(high));
  return b.Concatenate(parts, d);
}

std::vector<Value> ConstantPadNd(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  Builder& b = c.b;
  Value x = b.Convert(a[0].tensor, out.dtype);
  Value value = a.size() > 2 && !a[2].is_none()
                    ? b.Convert(b.Reshape(a[2].tensor, {}), out.dtype)
                    : b.ConstantInt(out.dtype, 0);
  if (out.numel() == 0) return One(Zeros(b, out));
  if (x.type.numel() == 0) return One(b.BroadcastInDim(value, out.shape, {}));
  const std::vector<int64_t>& pad = a[1].ints;
  if (pad.size() % 2 != 0 || static_cast<int64_t>(pad.size()) > 2 * x.rank())
    throw std::invalid_argument("constant_pad_nd: bad padding length");
  std::vector<int64_t> low(x.rank(), 0), high(x.rank(), 0), interior(x.rank(), 0);
  for (size_t j = 0; j < pad.size() / 2; ++j) {
    int64_t d = x.rank() - 1 - static_cast<int64_t>(j);
    if (pad[2 * j] < 0 || pad[2 * j + 1] < 0) {  // a crop: pad (and cut) this dim below
      low[d] = pad[2 * j];
      high[d] = pad[2 * j + 1];
    } else {
      x = PadByBlocks(b, x, value, d, pad[2 * j], pad[2 * j + 1]);
    }
  }
  return One(b.Reshape(b.Pad(x, value, low, high, interior), out.shape));
}

// constant_pad_nd under bounded dynamic shapes: a dim it crops (a negative
// pad) keeps its size; the dims it pads run dynamic (PadByBlocks).
void ConstantPadStaticDims(const std::vector<Arg>& a, StaticDims& s) {
  const std::vector<int64_t>& pad = a[1].ints;
  const size_t rank = s.Rank(0);
  for (size_t j = 0; j < pad.size() / 2 && j < rank; ++j)
    if (pad[2 * j] < 0 || pad[2 * j + 1] < 0) s.Dim(0, rank - 1 - j);
  s.Because("a negative pad (a crop) keeps its dim static");
}

// ---------------------------------------------------------------- indexing

// embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse):
// rows of weight. padding_idx only matters to the backward.
std::vector<Value> Embedding(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  Builder& b = c.b;
  if (out.numel() == 0) return One(Zeros(b, out));
  Value w = a[0].tensor;
  Value idx = CheckedIndex(c, a[1].tensor, w.shape()[0], false, "embedding");
  std::vector<int64_t> shape = idx.shape();
  shape.push_back(1);
  Value rows = b.Gather(w, b.Reshape(idx, shape), {0});
  return One(b.Reshape(b.Convert(rows, out.dtype), out.shape));
}

// index_select(self, dim, index): gather along dim, then move the index axis
// (first in the gather result) back to `dim`.
std::vector<Value> IndexSelect(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  Builder& b = c.b;
  if (out.numel() == 0) return One(Zeros(b, out));
  Value x = AtLeast1d(b, a[0].tensor);
  int64_t dim = WrapDim(a[1].i, x.rank());
  Value idx = CheckedIndexInDim(c, a[2].tensor, x, dim, false, "index_select");
  int64_t n = idx.type.numel();
  Value g = b.Gather(x, b.Reshape(idx, {n, 1}), {dim});
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < x.rank(); ++i) perm.push_back(i < dim ? i + 1 : i == dim ? 0 : i);
  return One(b.Reshape(b.Convert(b.Transpose(g, perm), out.dtype), out.shape));
}

// gather(self, dim, index): out[p] = self[p with p[dim] = index[p]].
std::vector<Value> GatherRule(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  Builder& b = c.b;
  if (out.numel() == 0) return One(Zeros(b, out));
  Value x = AtLeast1d(b, a[0].tensor);
  int64_t dim = WrapDim(a[1].i, x.rank());
  Value idx = AtLeast1d(b, CheckedIndexInDim(c, a[2].tensor, x, dim, false, "gather"));
  Value g = b.Gather(x, Coordinates(b, idx, dim), Range(x.rank()));
  return One(b.Reshape(b.Convert(g, out.dtype), out.shape));
}

// scatter family: out = self; out[p with p[dim] = index[p]] (op)= src[p] for
// p over index's shape. `src` is sliced to index's shape (PyTorch allows a
// larger src). Runs in the compute type for add (so bf16 adds round once
// per update, as PyTorch's CPU loop does).
Value ScatterAlong(Context& c, const TensorType& out, Value self, int64_t dim_arg, Value index,
                   Value updates, const std::string& op) {
  Builder& b = c.b;
  bool accumulate = op != "assign";
  ElementType t = accumulate ? ComputeType(out.dtype) : out.dtype;
  Value x = AtLeast1d(b, b.Convert(self, t));
  Value idx = AtLeast1d(b, index);
  if (idx.type.numel() == 0) return b.Reshape(b.Convert(x, out.dtype), out.shape);
  int64_t dim = WrapDim(dim_arg, x.rank());
  idx = CheckedIndex(c, idx, x.shape()[dim], false, "scatter");
  Value u = AtLeast1d(b, b.Convert(updates, t));
  if (u.shape() != idx.shape())
    u = b.Slice(u, std::vector<int64_t>(u.rank(), 0), idx.shape(),
                std::vector<int64_t>(u.rank(), 1));
  Value r = b.Scatter(x, Coordinates(b, idx, dim), u, Range(x.rank()), Combiner(op, t));
  return b.Reshape(b.Convert(r, out.dtype), out.shape);
}

std::string ReduceOp(const std::string& reduce) {
  if (reduce == "add" || reduce == "sum") return "add";
  if (reduce == "multiply" || reduce == "prod") return "multiply";
  throw Unsupported("scatter reduce=" + reduce);
}

// index_add(self, dim, index, source, alpha): out.select(dim, index[i]) +=
// alpha * source.select(dim, i).
std::vector<Value> IndexAdd(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  Builder& b = c.b;
  ElementType ct = ComputeType(out.dtype);
  Value x = AtLeast1d(b, b.Convert(a[0].tensor, ct));
  Value idx = a[2].tensor;
  int64_t n = idx.type.numel();
  if (n == 0 || out.numel() == 0) return One(b.Reshape(b.Convert(x, out.dtype), out.shape));
  int64_t dim = WrapDim(a[1].i, x.rank());
  idx = CheckedIndex(c, idx, x.shape()[dim], false, "index_add");
  Value src = b.Convert(a[3].tensor, ct);
  std::vector<int64_t> src_shape = x.shape();
  src_shape[dim] = n;
  src = b.Reshape(src, src_shape);
  if (a.size() > 4 && a[4].kind == K::Scalar)
    src = b.Binary(ct == E::Bool ? "and" : "multiply", src, Fill(b, a[4].tensor, ct, src_shape));
  std::vector<int64_t> perm{dim};
  for (int64_t i = 0; i < x.rank(); ++i)
    if (i != dim) perm.push_back(i);
  Value u = b.Transpose(src, perm);
  Value r = b.Scatter(x, b.Reshape(idx, {n, 1}), u, {dim}, Combiner("add", ct));
  return One(b.Reshape(b.Convert(r, out.dtype), out.shape));
}

// index_add(self, dim, index, source, alpha) runs dynamic in its index
// length only: self is static (its dim is the indices' bound), and so are
// source's other dims (XLA's padder rejects a scatter whose update window
// dims are dynamic apart from the operand's: XLNet's relative attention).
void IndexAddStaticDims(const std::vector<Arg>& a, StaticDims& s) {
  s.All(0);
  const int64_t rank = static_cast<int64_t>(s.Rank(3));
  for (int64_t d = 0; d < rank; ++d)
    if (a.at(1).kind != Arg::Kind::Int || d != WrapDim(a[1].i, rank)) s.Dim(3, static_cast<size_t>(d));
  s.Because("index_add's self, and its source but along its index");
}

const bool registered = [] {
  Register("cat", Cat).Dynamic();
  Register("stack", Stack).Dynamic();
  Register("clone", [](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = Out(c);
    return One(c.b.Reshape(c.b.Convert(a[0].tensor, out.dtype), out.shape));
  }).DynamicElementwise();

  // torch_tpu's own copies (tensor.copy_, transfers of views): the input
  // converted to the destination's dtype and broadcast to its shape.
  Register("copy_convert", [](Context& c, const std::vector<Arg>& a) {
    return One(As(c.b, a.at(1), Out(c).dtype, Out(c).shape));
  }, {}, Scope::Internal).DynamicElementwise().overwrites_destination = true;
  // Fills write one value everywhere: safe through expand()ed destinations.
  for (const char* fill : {"fill.Scalar", "fill.Tensor"}) {
    RuleEntry& e = Register(fill, FillRule).DynamicElementwise();
    e.repeat_safe_writes = e.overwrites_destination = true;
  }
  RuleEntry& zero = Register("zero", [](Context& c, const std::vector<Arg>&) { return One(Zeros(c.b, Out(c))); }).DynamicElementwise();
  zero.repeat_safe_writes = zero.overwrites_destination = true;
  Register("arange.start_out", Arange).small_results_on_host = true;
  Register("linspace.out", Linspace);
  // eye(q) per new length (XLNet's target mask) is computed on the host while small.
  Register("eye.out", Eye).small_results_on_host = true;
  Register("eye.m_out", Eye).small_results_on_host = true;

  // The dims a flip or a roll moves stay static (the padding would land among
  // the real elements); the others run dynamic.
  Register("flip", Flip).Dynamic(NamedDimsStatic(1, "the dims it flips"));
  Register("roll", Roll).Dynamic(NamedDimsStatic(2, "the dims it rolls (all when it rolls the flattened tensor)"));
  // Masks by each element's position (iota): the padding's positions come after.
  Register("tril", Triangle(true)).DynamicElementwise();
  Register("triu", Triangle(false)).DynamicElementwise();
  Register("repeat", Repeat).Dynamic(RepeatedDimsStatic);
  Register("masked_fill.Scalar", MaskedFill).DynamicElementwise();
  Register("masked_fill.Tensor", MaskedFill).DynamicElementwise();
  Register("constant_pad_nd", ConstantPadNd).Dynamic(ConstantPadStaticDims);

  Register("embedding", Embedding).Dynamic();
  // Dynamic in every dim, the one they select along too (XLNet's relative
  // shift: index_select(x, 3, arange(klen)) of a [b, h, q, 2q - 1] score):
  // the indices are checked against that dim's runtime size, and a gather
  // with slice size 1 never reads its padding. New index lengths run
  // dynamic too (BERT's token types gathered at each position).
  Register("index_select", IndexSelect).Dynamic();
  Register("gather", GatherRule).Dynamic();
  Register("scatter.src", [](Context& c, const std::vector<Arg>& a) {
    return One(ScatterAlong(c, Out(c), a[0].tensor, a[1].i, a[2].tensor, a[3].tensor,
                            "assign"));
  }).Dynamic(IndexedDimStatic("the dim it scatters along (the indices' bound)"));
  Register("scatter.value", [](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = Out(c);
    Value v = Fill(c.b, a[3].tensor, out.dtype, a[2].tensor.shape());
    return One(ScatterAlong(c, out, a[0].tensor, a[1].i, a[2].tensor, v, "assign"));
  }).Dynamic(IndexedDimStatic("the dim it scatters along (the indices' bound)"));
  Register("scatter_add", [](Context& c, const std::vector<Arg>& a) {
    return One(ScatterAlong(c, Out(c), a[0].tensor, a[1].i, a[2].tensor, a[3].tensor, "add"));
  }).Dynamic(IndexedDimStatic("the dim it scatters along (the indices' bound)"));
  Register("scatter.reduce", [](Context& c, const std::vector<Arg>& a) {
    return One(ScatterAlong(c, Out(c), a[0].tensor, a[1].i, a[2].tensor, a[3].tensor,
                            ReduceOp(a[4].s)));
  }).Dynamic(IndexedDimStatic("the dim it scatters along (the indices' bound)"));
  Register("scatter.value_reduce", [](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = Out(c);
    Value v = Fill(c.b, a[3].tensor, out.dtype, a[2].tensor.shape());
    return One(ScatterAlong(c, out, a[0].tensor, a[1].i, a[2].tensor, v, ReduceOp(a[4].s)));
  }).Dynamic(IndexedDimStatic("the dim it scatters along (the indices' bound)"));
  Register("index_add", IndexAdd).Dynamic(IndexAddStaticDims);
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
