// Normalization rules: layer norm, group norm, batch norm, RMS norm, forward
// and backward. Statistics are computed in the compute type (f32 for 16-bit
// floats), like PyTorch's CPU kernels; outputs are converted back.
//
// Backward rules return every gradient (grad_input, grad_weight, grad_bias)
// with its natural shape and dtype whatever `output_mask` says, computed
// from the arguments only: masked-out ones cost nothing (XLA drops unused
// results) and a dispatcher that maps None outputs can simply skip them.
//
// Batch norm in training mode also updates running_mean / running_var: the
// rules return the new running statistics after the op's outputs (see
// BatchNormForward). For _native_batch_norm_legit and _batch_norm_with_update
// the schema marks them mutated and the dispatcher writes them back; for
// native_batch_norm (eager nn.BatchNorm*) the schema does not, so they are
// extra results the dispatcher must be told to write.
#include <cmath>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

using K = Arg::Kind;

int64_t Prod(const std::vector<int64_t>& v, size_t from = 0, size_t to = SIZE_MAX) {
  int64_t p = 1;
  for (size_t i = from; i < v.size() && i < to; ++i) p *= v[i];
  return p;
}

std::vector<int64_t> Range(int64_t from, int64_t to) {
  std::vector<int64_t> r;
  for (int64_t i = from; i < to; ++i) r.push_back(i);
  return r;
}

Value Sum(Builder& b, Value x, const std::vector<int64_t>& dims) {
  return b.Reduce(x, b.Constant(x.dtype(), 0), dims, "add");
}

// x / n as a splat of x's shape.
Value DivN(Builder& b, Value x, int64_t n) {
  return b.Binary("divide", x, b.Splat(x.dtype(), static_cast<double>(n), x.shape()));
}

// x / n, n a rank-0 count.
Value DivCount(Builder& b, Value x, Value n) {
  return b.Binary("divide", x, b.BroadcastInDim(n, x.shape(), {}));
}

// The number of elements per channel of a batch norm's input x (all dims
// but 1), as a [ch] splat of type t (CountOf).
Value PerChannelCount(Builder& b, const Value& x, ElementType t) {
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < x.rank(); ++d)
    if (d != 1) dims.push_back(d);
  return b.BroadcastInDim(ElementCount(b, x, dims, 1, t), {x.shape()[1]}, {});
}

Value Mul(Builder& b, Value x, Value y) { return b.Binary("multiply", x, y); }
Value Add(Builder& b, Value x, Value y) { return b.Binary("add", x, y); }
Value Sub(Builder& b, Value x, Value y) { return b.Binary("subtract", x, y); }

bool IsTensor(const Arg& a) { return a.kind == K::Tensor; }

// The compute type of an op over `x` and its optional parameters.
ElementType NormComputeType(const std::vector<const Arg*>& args) {
  ElementType t = ElementType::F32;
  for (const Arg* a : args)
    if (a && IsTensor(*a) && a->tensor.dtype() == ElementType::F64) t = ElementType::F64;
  return t;
}

// 1 / sqrt(v + eps), as ATen (0 where v + eps == 0, as batch norm's InvStd).
Value InvStd(Builder& b, Value var, double eps, bool zero_for_zero) {
  Value v = Add(b, var, b.Splat(var.dtype(), eps, var.shape()));
  Value r = b.Unary("rsqrt", v);
  if (!zero_for_zero) return r;
  Value zero = b.Splat(var.dtype(), 0, var.shape());
  return b.Select(b.Compare("EQ", v, zero), zero, r);
}

// Reshapes (and converts) a statistics tensor to `shape`.
Value Stat(Builder& b, const Arg& a, ElementType ct, const std::vector<int64_t>& shape) {
  return b.Reshape(b.Convert(a.tensor, ct), shape);
}

bool Mask(const Arg& a, size_t i) {
  return a.kind != K::IntList || i >= a.ints.size() || a.ints[i] != 0;
}

// A norm over the trailing normalized_shape dims of x, in x's own shape:
// statistics reduce the trailing dims and broadcast back over the leading
// ones. (Never a reshape to [rows, n]: under bounded dynamic shapes two
// padded leading dims merged into one, and split back, are not what XLA's
// padder can follow: layer norm gave wrong values on a [b, s, h] padded in
// b and s.)
struct Trailing {
  std::vector<int64_t> shape;       // x's shape
  int64_t axis, n;                  // the first normalized dim, their element count
  std::vector<int64_t> lead, tail;  // the leading dims, the normalized dims
  Value xf;                         // x in the compute type
};
Trailing TrailingDims(Builder& b, Value x, const std::vector<int64_t>& normalized_shape, ElementType ct,
                      const char* op) {
  int64_t axis = x.rank() - static_cast<int64_t>(normalized_shape.size());
  if (axis < 0) throw Unsupported(std::string(op) + ": normalized_shape longer than input");
  return {x.shape(), axis, Prod(x.shape(), axis), Range(0, axis), Range(axis, x.rank()), b.Convert(x, ct)};
}

// The mean over the normalized dims (shape: the leading dims).
Value RowMean(Builder& b, const Trailing& t, Value v) { return DivN(b, Sum(b, v, t.tail), t.n); }
// A per-row statistic broadcast over the normalized dims.
Value Spread(Builder& b, const Trailing& t, Value stat) { return b.BroadcastInDim(stat, t.shape, t.lead); }
// A normalized-shape parameter (weight) broadcast over the rows.
Value PerElement(Builder& b, const Trailing& t, Value w, ElementType ct) {
  return b.BroadcastInDim(b.Convert(w, ct), t.shape, t.tail);
}
// A statistic as the op returns it ([lead..., 1...]).
Value SavedStat(Builder& b, Value stat, const TensorType& out) {
  std::vector<int64_t> lead = Range(0, stat.rank());
  return b.Convert(b.BroadcastInDim(stat, out.shape, lead), out.dtype);
}
// A saved statistic read back ([lead..., 1...] as saved, else any shape of
// the rows' count), broadcast over the normalized dims.
Value SpreadSaved(Builder& b, const Trailing& t, const Arg& a, ElementType ct) {
  Value v = b.Convert(a.tensor, ct);
  if (v.rank() == static_cast<int64_t>(t.shape.size())) return b.BroadcastInDim(v, t.shape, Range(0, v.rank()));
  std::vector<int64_t> lead(t.shape.begin(), t.shape.begin() + t.axis);
  return Spread(b, t, b.Reshape(v, lead));
}

// ---------------------------------------------------------------- layer norm

// native_layer_norm(input, normalized_shape, weight?, bias?, eps)
//   -> (out, mean, rstd)
std::vector<Value> LayerNorm(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  ElementType ct = NormComputeType({&a[0], &a[2], &a[3]});
  Trailing t = TrailingDims(b, a.at(0).tensor, a.at(1).ints, ct, "native_layer_norm");
  Value mean = RowMean(b, t, t.xf);
  Value xc = Sub(b, t.xf, Spread(b, t, mean));
  Value rstd = InvStd(b, RowMean(b, t, Mul(b, xc, xc)), a.at(4).d, false);
  Value y = Mul(b, xc, Spread(b, t, rstd));
  if (IsTensor(a.at(2))) y = Mul(b, y, PerElement(b, t, a[2].tensor, ct));
  if (IsTensor(a.at(3))) y = Add(b, y, PerElement(b, t, a[3].tensor, ct));
  const auto& outs = c.outputs;
  return {b.Convert(y, outs.at(0).dtype), SavedStat(b, mean, outs.at(1)), SavedStat(b, rstd, outs.at(2))};
}

// native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd,
//   weight?, bias?, output_mask) -> (grad_input, grad_weight, grad_bias)
std::vector<Value> LayerNormBackward(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value x = a.at(1).tensor;
  ElementType ct = NormComputeType({&a[0], &a[1], &a[5], &a[6]});
  Trailing t = TrailingDims(b, x, a.at(2).ints, ct, "native_layer_norm_backward");
  Value dy = b.Convert(a.at(0).tensor, ct);
  Value rstd = SpreadSaved(b, t, a.at(4), ct);
  Value xhat = Mul(b, Sub(b, t.xf, SpreadSaved(b, t, a.at(3), ct)), rstd);
  bool has_weight = IsTensor(a.at(5));
  Value g = has_weight ? Mul(b, dy, PerElement(b, t, a[5].tensor, ct)) : dy;
  Value mean_g = Spread(b, t, RowMean(b, t, g));
  Value mean_gx = Spread(b, t, RowMean(b, t, Mul(b, g, xhat)));
  Value dx = Mul(b, rstd, Sub(b, Sub(b, g, mean_g), Mul(b, xhat, mean_gx)));
  Value dw = Sum(b, Mul(b, dy, xhat), t.lead);
  Value db = Sum(b, dy, t.lead);
  ElementType wt = has_weight ? a[5].tensor.dtype() : x.dtype();
  ElementType bt = IsTensor(a.at(6)) ? a[6].tensor.dtype() : wt;
  return {b.Convert(dx, x.dtype()), b.Convert(dw, wt), b.Convert(db, bt)};
}

// ---------------------------------------------------------------- group norm

// A group norm's view of its input x: [N, G, C/G, spatial...] when N, C
// and HxW are x's own sizes (no dims merged: a dynamic spatial dim stays one
// dim, masked by XLA's padder), else [N, G, C/G * HxW] (N and HxW given
// apart from x's split: x's elements read in order). `count`: the elements
// of one group (at run time for dynamic dims).
struct Groups {
  std::vector<int64_t> shape;
  std::vector<int64_t> inner;  // the dims of one group: 2..
  Value count;
  bool own_split = false;  // [N, G, C/G, spatial...]
};

Groups GroupsOf(Builder& b, const Value& x, int64_t n, int64_t ch, int64_t hw, int64_t g, ElementType t) {
  const std::vector<int64_t>& s = x.shape();
  int64_t spatial = 1;
  for (int64_t d = 2; d < x.rank(); ++d) spatial *= s[d];
  Groups r;
  r.own_split = x.rank() >= 2 && s[0] == n && s[1] == ch && spatial == hw;
  if (r.own_split) {
    r.shape = {n, g, ch / g};
    r.shape.insert(r.shape.end(), s.begin() + 2, s.end());
    std::vector<int64_t> dims;
    for (int64_t d = 2; d < x.rank(); ++d) dims.push_back(d);
    r.count = ElementCount(b, x, dims, ch / g, t);
  } else {
    r.shape = {n, g, ch / g * hw};
    r.count = b.Constant(t, static_cast<double>(ch / g * hw));
  }
  for (int64_t d = 2; d < static_cast<int64_t>(r.shape.size()); ++d) r.inner.push_back(d);
  return r;
}

// native_group_norm(input, weight?, bias?, N, C, HxW, group, eps)
//   -> (out, mean [N, G], rstd [N, G])
std::vector<Value> GroupNorm(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value x = a.at(0).tensor;
  int64_t n = a.at(3).i, ch = a.at(4).i, hw = a.at(5).i, g = a.at(6).i;
  if (g <= 0 || ch % g != 0) throw Unsupported("native_group_norm: C not divisible by group");
  ElementType ct = NormComputeType({&a[0], &a[1], &a[2]});
  double eps = a.at(7).d;
  Groups gr = GroupsOf(b, x, n, ch, hw, g, ct);
  const std::vector<int64_t>& grouped = gr.shape;
  Value xf = b.Reshape(b.Convert(x, ct), grouped);
  Value mean = DivCount(b, Sum(b, xf, gr.inner), gr.count);
  Value xc = Sub(b, xf, b.BroadcastInDim(mean, grouped, {0, 1}));
  Value var = DivCount(b, Sum(b, Mul(b, xc, xc), gr.inner), gr.count);
  Value rstd = InvStd(b, var, eps, false);
  // [N, C, ...]: x's own dims (no dynamic dims merged), or N, C and HxW given.
  std::vector<int64_t> rows = gr.own_split ? x.shape() : std::vector<int64_t>{n, ch, hw};
  Value y = b.Reshape(Mul(b, xc, b.BroadcastInDim(rstd, grouped, {0, 1})), rows);
  if (IsTensor(a.at(1)))
    y = Mul(b, y, b.BroadcastInDim(b.Convert(a[1].tensor, ct), rows, {1}));
  if (IsTensor(a.at(2)))
    y = Add(b, y, b.BroadcastInDim(b.Convert(a[2].tensor, ct), rows, {1}));
  const auto& outs = c.outputs;
  return {b.Convert(b.Reshape(y, x.shape()), outs.at(0).dtype),
          b.Convert(b.Reshape(mean, outs.at(1).shape), outs.at(1).dtype),
          b.Convert(b.Reshape(rstd, outs.at(2).shape), outs.at(2).dtype)};
}

// native_group_norm_backward(grad_out, input, mean, rstd, weight?, N, C,
//   HxW, group, output_mask) -> (grad_input, grad_weight, grad_bias)
std::vector<Value> GroupNormBackward(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value x = a.at(1).tensor;
  int64_t n = a.at(5).i, ch = a.at(6).i, hw = a.at(7).i, g = a.at(8).i;
  if (g <= 0 || ch % g != 0) throw Unsupported("native_group_norm_backward: C not divisible by group");
  int64_t d = ch / g;
  ElementType ct = NormComputeType({&a[0], &a[1], &a[4]});
  Groups gr = GroupsOf(b, x, n, ch, hw, g, ct);
  std::vector<int64_t> s4{n, g, d};  // [N, G, C/G, spatial...] or [N, G, C/G, HxW]
  if (gr.own_split) s4.insert(s4.end(), x.shape().begin() + 2, x.shape().end());
  else s4.push_back(hw);
  std::vector<int64_t> inner, outer{0};  // a group's dims; a channel's other dims
  for (int64_t k = 2; k < static_cast<int64_t>(s4.size()); ++k) inner.push_back(k);
  for (int64_t k = 3; k < static_cast<int64_t>(s4.size()); ++k) outer.push_back(k);
  Value dy = b.Reshape(b.Convert(a.at(0).tensor, ct), s4);
  Value xf = b.Reshape(b.Convert(x, ct), s4);
  Value mean = b.BroadcastInDim(Stat(b, a.at(2), ct, {n, g}), s4, {0, 1});
  Value rstd = b.BroadcastInDim(Stat(b, a.at(3), ct, {n, g}), s4, {0, 1});
  Value xhat = Mul(b, Sub(b, xf, mean), rstd);
  bool has_weight = IsTensor(a.at(4));
  Value gy = dy;
  if (has_weight)
    gy = Mul(b, dy, b.BroadcastInDim(b.Reshape(b.Convert(a[4].tensor, ct), {g, d}), s4, {1, 2}));
  Value mean_g = b.BroadcastInDim(DivCount(b, Sum(b, gy, inner), gr.count), s4, {0, 1});
  Value mean_gx = b.BroadcastInDim(DivCount(b, Sum(b, Mul(b, gy, xhat), inner), gr.count), s4, {0, 1});
  Value dx = Mul(b, rstd, Sub(b, Sub(b, gy, mean_g), Mul(b, xhat, mean_gx)));
  Value dw = b.Reshape(Sum(b, Mul(b, dy, xhat), outer), {ch});
  Value db = b.Reshape(Sum(b, dy, outer), {ch});
  ElementType wt = has_weight ? a[4].tensor.dtype() : x.dtype();
  return {b.Convert(b.Reshape(dx, x.shape()), x.dtype()), b.Convert(dw, wt), b.Convert(db, wt)};
}

// ---------------------------------------------------------------- batch norm

struct BatchNormArgs {
  const Arg* input;
  const Arg* weight;
  const Arg* bias;
  const Arg* running_mean;  // may be None
  const Arg* running_var;
  bool training;
  double momentum;
  double eps;
};

// Returns {out, save_mean, save_invstd} shaped like c.outputs[0..2] (eval
// mode: the saved statistics are whatever shape meta says, empty on CPU),
// followed, in training mode with running statistics, by the updated
// running_mean and running_var (EXTRA values beyond the op's outputs).
std::vector<Value> BatchNormForward(Context& c, const BatchNormArgs& p) {
  Builder& b = c.b;
  Value x = p.input->tensor;
  if (x.rank() < 2) throw Unsupported("batch norm on an input of rank < 2");
  ElementType ct = NormComputeType({p.input, p.weight, p.bias});
  const std::vector<int64_t>& shape = x.shape();
  int64_t ch = shape[1];
  std::vector<int64_t> reduce;
  for (int64_t i = 0; i < x.rank(); ++i)
    if (i != 1) reduce.push_back(i);
  Value xf = b.Convert(x, ct);
  bool has_stats = IsTensor(*p.running_mean) && IsTensor(*p.running_var);
  Value mean, invstd, var, n = PerChannelCount(b, x, ct);
  if (p.training) {
    mean = b.Binary("divide", Sum(b, xf, reduce), n);
    Value xc = Sub(b, xf, b.BroadcastInDim(mean, shape, {1}));
    var = b.Binary("divide", Sum(b, Mul(b, xc, xc), reduce), n);
    invstd = InvStd(b, var, p.eps, true);
  } else {
    if (!has_stats) throw Unsupported("batch norm in eval mode without running statistics");
    mean = b.Convert(p.running_mean->tensor, ct);
    invstd = InvStd(b, b.Convert(p.running_var->tensor, ct), p.eps, false);
  }
  Value alpha = invstd, beta;
  if (IsTensor(*p.weight)) alpha = Mul(b, alpha, b.Convert(p.weight->tensor, ct));
  beta = b.Unary("negate", Mul(b, mean, alpha));
  if (IsTensor(*p.bias)) beta = Add(b, beta, b.Convert(p.bias->tensor, ct));
  Value y = Add(b, Mul(b, xf, b.BroadcastInDim(alpha, shape, {1})), b.BroadcastInDim(beta, shape, {1}));
  const auto& outs = c.outputs;
  auto saved = [&](Value v, size_t i) {
    const TensorType& t = outs.at(i);
    if (t.numel() == ch) return b.Convert(b.Reshape(v, t.shape), t.dtype);
    return b.Splat(t.dtype, 0, t.shape);
  };
  std::vector<Value> r{b.Convert(y, outs.at(0).dtype), saved(mean, 1), saved(invstd, 2)};
  if (p.training && has_stats) {
    Value rm = p.running_mean->tensor, rv = p.running_var->tensor;
    ElementType st = rm.dtype() == ElementType::F64 ? ElementType::F64 : ct;
    Value mom = b.Splat(st, p.momentum, {ch}), keep = b.Splat(st, 1.0 - p.momentum, {ch});
    Value count = b.Convert(n, st);  // var * n / (n - 1)
    Value unbiased = b.Binary("divide", Mul(b, b.Convert(var, st), count),
                              Sub(b, count, b.Splat(st, 1, {ch})));
    Value new_rm = Add(b, Mul(b, mom, b.Convert(mean, st)), Mul(b, keep, b.Convert(rm, st)));
    Value new_rv = Add(b, Mul(b, mom, unbiased), Mul(b, keep, b.Convert(rv, st)));
    r.push_back(b.Convert(new_rm, rm.dtype()));
    r.push_back(b.Convert(new_rv, rv.dtype()));
  } else if (outs.size() >= 5 && has_stats) {
    // A dispatcher that treats the running stats as mutated: unchanged.
    r.push_back(p.running_mean->tensor);
    r.push_back(p.running_var->tensor);
  }
  return r;
}

// native_batch_norm_backward(grad_out, input, weight?, running_mean?,
//   running_var?, save_mean?, save_invstd?, train, eps, output_mask)
std::vector<Value> BatchNormBackward(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value x = a.at(1).tensor;
  if (x.rank() < 2) throw Unsupported("batch norm on an input of rank < 2");
  bool train = a.at(7).i != 0;
  double eps = a.at(8).d;
  ElementType ct = NormComputeType({&a[0], &a[1], &a[2]});
  const std::vector<int64_t>& shape = x.shape();
  int64_t ch = shape[1];
  Value n = PerChannelCount(b, x, ct);
  std::vector<int64_t> reduce;
  for (int64_t i = 0; i < x.rank(); ++i)
    if (i != 1) reduce.push_back(i);
  Value mean, invstd;
  if (train) {
    if (!IsTensor(a.at(5)) || !IsTensor(a.at(6)))
      throw Unsupported("batch norm backward (train) without saved statistics");
    mean = Stat(b, a[5], ct, {ch});
    invstd = Stat(b, a[6], ct, {ch});
  } else {
    if (!IsTensor(a.at(3)) || !IsTensor(a.at(4)))
      throw Unsupported("batch norm backward (eval) without running statistics");
    mean = Stat(b, a[3], ct, {ch});
    invstd = InvStd(b, Stat(b, a[4], ct, {ch}), eps, false);
  }
  Value dy = b.Convert(a.at(0).tensor, ct), xf = b.Convert(x, ct);
  Value xc = Sub(b, xf, b.BroadcastInDim(mean, shape, {1}));
  Value dotp = Sum(b, Mul(b, xc, dy), reduce);
  Value sum = Sum(b, dy, reduce);
  bool has_weight = IsTensor(a.at(2));
  Value w = has_weight ? b.Convert(a[2].tensor, ct) : b.Splat(ct, 1, {ch});
  Value dx;
  if (train) {
    Value k = b.Binary("divide", Mul(b, dotp, Mul(b, invstd, invstd)), n);
    Value mean_dy = b.Binary("divide", sum, n);
    dx = Sub(b, Sub(b, dy, Mul(b, xc, b.BroadcastInDim(k, shape, {1}))),
             b.BroadcastInDim(mean_dy, shape, {1}));
    dx = Mul(b, dx, b.BroadcastInDim(Mul(b, invstd, w), shape, {1}));
  } else {
    dx = Mul(b, dy, b.BroadcastInDim(Mul(b, invstd, w), shape, {1}));
  }
  ElementType wt = has_weight ? a[2].tensor.dtype() : x.dtype();
  return {b.Convert(dx, x.dtype()), b.Convert(Mul(b, dotp, invstd), wt), b.Convert(sum, wt)};
}

// ---------------------------------------------------------------- rms norm

double DefaultEps(ElementType t) {
  // rms_norm's default: epsilon of the compute (opmath) type.
  return t == ElementType::F64 ? 2.220446049250313e-16 : 1.1920928955078125e-07;
}

// _fused_rms_norm(input, normalized_shape, weight?, eps?) -> (out, rstd)
std::vector<Value> RmsNorm(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value x = a.at(0).tensor;
  ElementType ct = ComputeType(x.dtype());
  Trailing t = TrailingDims(b, x, a.at(1).ints, ct, "_fused_rms_norm");
  double eps = a.at(3).kind == K::Double ? a[3].d : DefaultEps(ct);
  Value rstd = InvStd(b, RowMean(b, t, Mul(b, t.xf, t.xf)), eps, false);
  // As ATen's composite: normalize in the compute type, round to the input
  // dtype, then scale by the weight.
  Value y = b.Convert(Mul(b, t.xf, Spread(b, t, rstd)), x.dtype());
  const TensorType& out = c.outputs.at(0);
  if (IsTensor(a.at(2))) {
    ElementType wct = ComputeType(out.dtype);
    y = Mul(b, b.Convert(y, wct), PerElement(b, t, a[2].tensor, wct));
  }
  return {b.Convert(y, out.dtype), SavedStat(b, rstd, c.outputs.at(1))};
}

// _fused_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight?,
//   output_mask[2]) -> (grad_input, grad_weight)
std::vector<Value> RmsNormBackward(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value x = a.at(1).tensor;
  ElementType ct = NormComputeType({&a[0], &a[1], &a[4]});
  Trailing t = TrailingDims(b, x, a.at(2).ints, ct, "_fused_rms_norm_backward");
  Value dy = b.Convert(a.at(0).tensor, ct);
  Value rstd = SpreadSaved(b, t, a.at(3), ct);
  Value xhat = Mul(b, t.xf, rstd);
  bool has_weight = IsTensor(a.at(4));
  Value g = has_weight ? Mul(b, dy, PerElement(b, t, a[4].tensor, ct)) : dy;
  Value mean_gx = Spread(b, t, RowMean(b, t, Mul(b, g, xhat)));
  Value dx = Mul(b, rstd, Sub(b, g, Mul(b, xhat, mean_gx)));
  Value dw = Sum(b, Mul(b, dy, xhat), t.lead);
  ElementType wt = has_weight ? a[4].tensor.dtype() : x.dtype();
  return {b.Convert(dx, x.dtype()), b.Convert(dw, wt)};
}

// ---------------------------------------------------------------- output types
// CPU's, which the tpu follows (meta gives CUDA's): the saved statistics
// are in the input's dtype unless the input is 16-bit with f32 parameters
// (then f32), and batch norm saves none (shape [0]) in eval mode.

bool Reduced(ElementType t) { return t == ElementType::BF16 || t == ElementType::F16; }

// ATen's param_scalar_type: f32 for a mixed 16-bit input with f32
// parameters, else the input's dtype.
ElementType SavedStatType(const std::vector<Arg>& a, const std::vector<size_t>& params) {
  ElementType xt = a.at(0).tensor.dtype();
  if (!Reduced(xt)) return xt;
  bool any = false;
  for (size_t i : params) {
    if (!IsTensor(a.at(i))) continue;
    if (a[i].tensor.dtype() != ElementType::F32) return xt;
    any = true;
  }
  return any ? ElementType::F32 : xt;
}

// (out, save_mean, save_invstd[, reserve]) of a batch norm over a[0..4].
std::vector<TensorType> BatchNormTypes(const std::vector<Arg>& a, bool training, bool reserve) {
  const TensorType& x = a.at(0).tensor.type;
  if (x.rank() < 2) throw Unsupported("batch norm on an input of rank < 2");
  ElementType st = SavedStatType(a, {1, 2, 3, 4});
  bool saves = training || !IsTensor(a.at(3)) || !IsTensor(a.at(4));
  TensorType stat{st, {saves ? x.shape[1] : 0}};
  std::vector<TensorType> r{x, stat, stat};
  if (reserve) r.push_back(TensorType{ElementType::U8, {0}});
  return r;
}

std::vector<TensorType> LayerNormTypes(const std::vector<Arg>& a) {
  const TensorType& x = a.at(0).tensor.type;
  int64_t axis = x.rank() - static_cast<int64_t>(a.at(1).ints.size());
  if (axis < 0) throw Unsupported("native_layer_norm: normalized_shape longer than input");
  std::vector<int64_t> stat_shape(x.shape.begin(), x.shape.begin() + axis);
  stat_shape.resize(x.shape.size(), 1);
  TensorType stat{SavedStatType(a, {2, 3}), stat_shape};
  return {x, stat, stat};
}

// A norm over trailing dims (which stay static): its results are
// independent along every other dim of its input (DynamicShapes::independent_dims).
void InputRows(const std::vector<Arg>&, StaticDims& s) { s.All(0); }

// Bounded dynamic shapes: a batch norm counts its elements per channel at
// run time (PerChannelCount), so its batch and spatial dims may be dynamic
// in `batched` args' dims 0 and 2..; their channel dim, and the per-channel
// `channels` args, stay static.
StaticDimsRule BatchNormBatchOnly(std::vector<size_t> batched, std::vector<size_t> channels) {
  return [batched, channels](const std::vector<Arg>&, StaticDims& s) {
    for (size_t arg : batched)
      if (s.Rank(arg) > 1) s.Dim(arg, 1);
    for (size_t arg : channels) s.All(arg);
    s.Because("a batch norm's channel dim is static");
  };
}

const bool registered = [] {
  // Bounded dynamic shapes: the normalized dims stay static (it divides by
  // their element count), in the input, the gradient, the weight and the bias.
  // Its rows (every dim it may have dynamic) are independent: unmasked then.
  RuleEntry& layer_norm = Register("native_layer_norm", LayerNorm)
      .Dynamic([](const std::vector<Arg>& a, StaticDims& s) {  // (input, shape, weight, bias, eps)
        s.Last(0, a.at(1).ints.size());
        s.All(2);
        s.All(3);
      });
  layer_norm.output_types = LayerNormTypes;
  layer_norm.dynamic.independent_dims = InputRows;
  Register("native_layer_norm_backward", LayerNormBackward)
      .Dynamic([](const std::vector<Arg>& a, StaticDims& s) {  // (grad, input, shape, mean, rstd, weight, bias, mask)
        s.Last(0, a.at(2).ints.size());
        s.Last(1, a.at(2).ints.size());
        s.All(5);
        s.All(6);
      });
  // Bounded dynamic shapes: the batch and spatial dims (a ragged batch, a
  // new image size: a group's elements counted at run time); N, C and HxW
  // are read off the input's sizes (SizeInt), so a new size keeps the
  // signature. Channels static.
  RuleEntry& group_norm = Register("native_group_norm", GroupNorm)
      .Dynamic([](const std::vector<Arg>&, StaticDims& s) {  // (input, weight?, bias?, N, C, HxW, group, eps)
        s.Dim(0, 1);
        s.All(1);
        s.All(2);
        s.Because("a group norm's channel dim is static");
      });
  group_norm.dynamic.size_ints = {{3, 0, 0, 1}, {4, 0, 1, 2}, {5, 0, 2, -1}};
  // (grad_out, input, mean [N, group], rstd, weight?, N, C, HxW, group, output_mask)
  RuleEntry& group_norm_backward = Register("native_group_norm_backward", GroupNormBackward)
      .Dynamic([](const std::vector<Arg>&, StaticDims& s) {
        for (size_t arg : {0, 1, 2, 3}) s.Dim(arg, 1);
        s.All(4);
        s.Because("a group norm's channel dim is static");
      });
  group_norm_backward.dynamic.size_ints = {{5, 1, 0, 1}, {6, 1, 1, 2}, {7, 1, 2, -1}};

  // native_batch_norm(input, weight?, bias?, running_mean?, running_var?,
  //   training, momentum, eps). The CPU kernel updates the running stats in
  // place although the schema does not say so: the new values come back as
  // extra results (beyond the three outputs) for the dispatcher to write.
  RuleEntry& native_bn = Register("native_batch_norm", [](Context& c, const std::vector<Arg>& a) {
    return BatchNormForward(c, {&a[0], &a[1], &a[2], &a[3], &a[4], a.at(5).i != 0, a.at(6).d, a.at(7).d});
  });
  native_bn.extra_mutated_args = {3, 4};
  native_bn.Dynamic(BatchNormBatchOnly({0}, {1, 2, 3, 4}));
  native_bn.output_types = [](const std::vector<Arg>& a) { return BatchNormTypes(a, a.at(5).i != 0, false); };
  // _native_batch_norm_legit(input, weight?, bias?, running_mean(a!),
  //   running_var(b!), training, momentum, eps) -> (out, save_mean,
  //   save_invstd). Mutates its running stats AND returns fresh outputs: the
  // dispatcher passes the fresh outputs first, then the mutated tensors, and
  // the rule returns (out, save_mean, save_invstd, new running_mean, new
  // running_var) in that order.
  Register("_native_batch_norm_legit", [](Context& c, const std::vector<Arg>& a) {
    if (c.outputs.size() != 5)
      throw Unsupported("_native_batch_norm_legit: outputs plus mutated running stats");
    bool training = a.at(5).i != 0;
    return BatchNormForward(c, {&a[0], &a[1], &a[2], &a[3], &a[4], training, a.at(6).d, a.at(7).d});
  }).output_types = [](const std::vector<Arg>& a) { return BatchNormTypes(a, a.at(5).i != 0, false); };
  // _batch_norm_with_update(input, weight?, bias?, running_mean(a!),
  //   running_var(b!), momentum, eps) -> (out, save_mean, save_invstd,
  //   reserve), then the mutated running stats.
  Register("_batch_norm_with_update", [](Context& c, const std::vector<Arg>& a) {
    if (c.outputs.size() != 6)
      throw Unsupported("_batch_norm_with_update: outputs plus mutated running stats");
    std::vector<Value> r =
        BatchNormForward(c, {&a[0], &a[1], &a[2], &a[3], &a[4], true, a.at(5).d, a.at(6).d});
    const TensorType& reserve = c.outputs.at(3);
    r.insert(r.begin() + 3, c.b.Splat(reserve.dtype, 0, reserve.shape));
    return r;
  }).output_types = [](const std::vector<Arg>& a) { return BatchNormTypes(a, true, true); };
  // _native_batch_norm_legit.no_stats(input, weight?, bias?, training, momentum, eps)
  Register("_native_batch_norm_legit.no_stats", [](Context& c, const std::vector<Arg>& a) {
    Arg none;
    return BatchNormForward(c, {&a[0], &a[1], &a[2], &none, &none, a.at(3).i != 0, a.at(4).d, a.at(5).d});
  }).output_types = [](const std::vector<Arg>& a) {
    if (a.at(3).i == 0)  // CPU crashes on it; meta says the same
      throw std::invalid_argument("running_mean and running_var must not be None in eval mode");
    std::vector<Arg> with_none(a.begin(), a.begin() + 3);
    with_none.resize(5);
    return BatchNormTypes(with_none, true, false);
  };
  // _native_batch_norm_legit_no_training(input, weight?, bias?, running_mean,
  //   running_var, momentum, eps)
  Register("_native_batch_norm_legit_no_training", [](Context& c, const std::vector<Arg>& a) {
    return BatchNormForward(c, {&a[0], &a[1], &a[2], &a[3], &a[4], false, a.at(5).d, a.at(6).d});
  }).Dynamic(BatchNormBatchOnly({0}, {1, 2, 3, 4}))
    .output_types = [](const std::vector<Arg>& a) { return BatchNormTypes(a, false, false); };
  // _batch_norm_no_update(input, weight?, bias?, running_mean?, running_var?,
  //   momentum, eps) -> (out, save_mean, save_invstd, reserve)
  Register("_batch_norm_no_update", [](Context& c, const std::vector<Arg>& a) {
    bool training = !IsTensor(a.at(3)) || !IsTensor(a.at(4));
    std::vector<Value> r =
        BatchNormForward(c, {&a[0], &a[1], &a[2], &a[3], &a[4], training, a.at(5).d, a.at(6).d});
    r.resize(3);
    const TensorType& reserve = c.outputs.at(3);
    r.push_back(c.b.Splat(reserve.dtype, 0, reserve.shape));
    return r;
  }).output_types = [](const std::vector<Arg>& a) { return BatchNormTypes(a, false, true); };
  // (grad_out, input, weight?, running_mean?, running_var?, save_mean?, save_invstd?, ...)
  Register("native_batch_norm_backward", BatchNormBackward).Dynamic(BatchNormBatchOnly({0, 1}, {2, 3, 4, 5, 6}));
  // batch_norm_backward(grad_out, input, weight, running_mean?, running_var?,
  //   save_mean?, save_var?, update, eps, output_mask, reserve)
  Register("batch_norm_backward", [](Context& c, const std::vector<Arg>& a) {
    return BatchNormBackward(c, {a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9]});
  });

  Register("_fused_rms_norm", RmsNorm).Dynamic([](const std::vector<Arg>& a, StaticDims& s) {
    s.Last(0, a.at(1).ints.size());  // (input, shape, weight, eps)
    s.All(2);
  }).dynamic.independent_dims = InputRows;
  Register("_fused_rms_norm_backward", RmsNormBackward).Dynamic([](const std::vector<Arg>& a, StaticDims& s) {
    s.Last(0, a.at(2).ints.size());  // (grad, input, shape, rstd, weight, mask)
    s.Last(1, a.at(2).ints.size());
    s.All(4);
  });
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
