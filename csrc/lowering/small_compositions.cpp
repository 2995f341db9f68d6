// Ops that are a few reshapes, slices or reductions of native ones:
// linalg_cross, trace, count_nonzero, aminmax, take, channel_shuffle and
// logspace. Semantics (dtypes, special cases) are the CPU kernels'.
#include <cmath>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

using K = Arg::Kind;
using E = ElementType;

// The rule of another op under one output type of this call.
Value Delegate(Context& c, const std::string& op, const TensorType& out, const std::vector<Arg>& args) {
  Context sub{c.b};
  sub.outputs = {out};
  sub.fp32_highest = c.fp32_highest;
  sub.op = c.op;
  sub.default_float = c.default_float;
  std::vector<Value> r = Find(op)->rule(sub, args);
  for (auto& check : sub.checks) c.checks.push_back(std::move(check));
  return r.at(0);
}

std::vector<int64_t> AllDims(int64_t rank) {
  std::vector<int64_t> d(rank);
  for (int64_t i = 0; i < rank; ++i) d[i] = i;
  return d;
}

// One index along `dim` (size 1 kept).
Value At(Builder& b, Value x, int64_t dim, int64_t i) {
  std::vector<int64_t> start(x.rank(), 0), limit = x.shape(), strides(x.rank(), 1);
  start[dim] = i;
  limit[dim] = i + 1;
  return b.Slice(x, start, limit, strides);
}

// linalg_cross(self, other, dim): the 3-vector cross product along dim.
std::vector<Value> Cross(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  Value x = As(b, a.at(0), out.dtype, out.shape), y = As(b, a.at(1), out.dtype, out.shape);
  int64_t dim = WrapDim(a.at(2).i, out.rank());
  if (out.shape.at(dim) != 3)
    throw std::invalid_argument("linalg.cross: inputs dimension " + std::to_string(a[2].i) +
                                " must have length 3. Got " + std::to_string(out.shape[dim]));
  auto term = [&](int64_t i, int64_t j) {
    return b.Binary("subtract", b.Binary("multiply", At(b, x, dim, i), At(b, y, dim, j)),
                    b.Binary("multiply", At(b, x, dim, j), At(b, y, dim, i)));
  };
  return One(b.Concatenate({term(1, 2), term(2, 0), term(0, 1)}, dim));
}

// trace(self): the sum of the main diagonal of a matrix (ints sum as int64).
std::vector<Value> Trace(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  Value x = a.at(0).tensor;
  if (x.rank() != 2) throw std::invalid_argument("trace: expected a matrix, but got tensor with dim " +
                                                 std::to_string(x.rank()));
  ElementType ct = ComputeType(out.dtype);
  x = b.Convert(x, ct);
  TensorType it{E::I64, x.shape()};
  Value diagonal = b.Compare("EQ", b.Iota(it, 0), b.Iota(it, 1));
  Value d = b.Select(diagonal, x, b.Splat(ct, 0, x.shape()));
  return One(b.Convert(b.Reshape(b.Reduce(d, b.Constant(ct, 0), {0, 1}, "add"), out.shape), out.dtype));
}

// count_nonzero(self, dims): int64 counts of nonzero elements (all dims when empty / None).
std::vector<Value> CountNonzero(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value x = a.at(0).tensor;
  if (x.rank() == 0) x = b.Reshape(x, {1});
  std::vector<int64_t> dims;
  if (a.at(1).kind == K::IntList) dims = ReduceDims(a[1].ints, x.rank());
  if (a[1].kind == K::Int) dims = {WrapDim(a[1].i, x.rank())};
  if (dims.empty()) dims = AllDims(x.rank());
  Value nz = b.Convert(b.Compare("NE", x, b.Splat(x.dtype(), 0, x.shape())), E::I64);
  Value n = b.Reduce(nz, b.ConstantInt(E::I64, 0), dims, "add");
  return One(b.Convert(b.Reshape(n, Out(c).shape), Out(c).dtype));
}

// aminmax(self, dim?, keepdim): amin and amax (their rules: NaN propagates).
std::vector<Value> AminMax(Context& c, const std::vector<Arg>& a) {
  Arg dims;
  dims.kind = K::IntList;
  if (a.at(1).kind == K::Int) dims.ints = {a[1].i};
  std::vector<Arg> args = {a.at(0), dims, a.at(2)};
  return {Delegate(c, "amin", Out(c, 0), args), Delegate(c, "amax", Out(c, 1), args)};
}

// take(self, index): self flattened, read at `index` (negative wraps; out of range raises).
std::vector<Value> Take(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  Value x = a.at(0).tensor, index = a.at(1).tensor;
  int64_t n = index.type.numel(), size = x.type.numel();
  if (n == 0) return One(Zeros(b, out));
  if (size == 0) throw std::out_of_range("take: tried to take from an empty tensor");
  Value idx = CheckedIndex(c, b.Reshape(index, {n}), size, true, "take");
  Value r = b.Gather(b.Reshape(x, {size}), b.Reshape(idx, {n, 1}), {0});
  return One(b.Reshape(r, out.shape));
}

// channel_shuffle(self, groups): (N, g, C / g, *) transposed to (N, C / g, g, *).
std::vector<Value> ChannelShuffle(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value x = a.at(0).tensor;
  int64_t g = a.at(1).i;
  if (x.rank() < 3 || g <= 0 || x.shape()[1] % g != 0)
    throw Unsupported("channel_shuffle: needs rank >= 3 and channels divisible by groups");
  std::vector<int64_t> split = {x.shape()[0], g, x.shape()[1] / g}, perm = {0, 2, 1};
  for (int64_t d = 2; d < x.rank(); ++d) split.push_back(x.shape()[d]), perm.push_back(d + 1);
  return One(b.Reshape(b.Transpose(b.Reshape(x, split), perm), Out(c).shape));
}

// logspace.out(start, end, steps, base): base ** linspace(start, end, steps)
// (the linspace rule, in the output dtype as the CPU kernel), float outputs.
std::vector<Value> Logspace(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  if (!hlo::IsFloat(out.dtype)) throw Unsupported("logspace with an integer dtype");
  if (out.numel() == 0) return One(Zeros(b, out));
  ElementType ct = ComputeType(out.dtype);
  Value exponent = b.Convert(Delegate(c, "linspace.out", out, {a.at(0), a.at(1), a.at(2)}), ct);
  Value base = b.Splat(ct, a.at(3).d, out.shape);
  return One(b.Convert(b.Binary("power", base, exponent), out.dtype));
}

const bool registered = [] {
  Register("linalg_cross", Cross);
  Register("trace", Trace);
  Register("count_nonzero.dim_IntList", CountNonzero);
  Register("count_nonzero", CountNonzero);
  Register("aminmax", AminMax);
  Register("take", Take);
  Register("channel_shuffle", ChannelShuffle);
  Register("native_channel_shuffle", ChannelShuffle);
  Register("logspace.out", Logspace);
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
