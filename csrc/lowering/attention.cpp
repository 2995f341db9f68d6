// Scaled dot-product attention, forward and backward, each one module.
//
// F.scaled_dot_product_attention on tpu picks the "overrideable" backend
// (aten/data_dependent.cpp registers _fused_sdp_choice for PrivateUse1), and
// the explicit kernels of _scaled_dot_product_fused_attention_overrideable
// (+ _backward) call the two ops lowered here. The overrideable forward
// returns SymInts (max_q, max_k), which the generic dispatcher cannot
// produce, so the math lives in these tensor-only ops instead:
//
//   _scaled_dot_product_efficient_attention(q, k, v, attn_bias?,
//       compute_log_sumexp, dropout_p, is_causal, *, scale)
//     -> (output, logsumexp [B, H, ceil(L/32)*32], philox_seed, philox_offset)
//   _scaled_dot_product_efficient_attention_backward(grad_out, q, k, v,
//       attn_bias, out, logsumexp, philox_seed, philox_offset, dropout_p,
//       grad_input_mask, is_causal, *, scale) -> (dq, dk, dv, dbias)
//
// Layout [B, Hk, G, L, S] throughout: G = Hq / Hk query heads share one
// key/value head (GQA; query head h uses kv head h / G, like
// repeat_interleave). Scores, softmax and both matmuls run in f32 for
// 16-bit inputs. attn_bias: bool (True = attend) or additive float,
// broadcastable to [B, Hq, L, S]; is_causal masks col > row (top-left
// aligned, like the math backend). A fully masked row gives zeros (PyTorch's
// _safe_softmax) and logsumexp -inf. Dropout keeps each probability with
// chance 1 - p from the generator's (seed, offset) (RandomBits: drawn for
// the real elements alike at a bucket's sizes), which the forward returns as philox_seed / philox_offset and the
// backward uses to draw the same mask again.
#include <cmath>
#include <limits>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

using K = Arg::Kind;
using E = ElementType;

struct Shapes {
  int64_t B, Hq, Hk, G, L, S, E, Ev;
};

Shapes ShapesOf(const Value& q, const Value& k, const Value& v) {
  if (q.rank() != 4 || k.rank() != 4 || v.rank() != 4)
    throw Unsupported("attention: only 4-D query/key/value are lowered");
  Shapes s;
  s.B = q.shape()[0];
  s.Hq = q.shape()[1];
  s.L = q.shape()[2];
  s.E = q.shape()[3];
  s.Hk = k.shape()[1];
  s.S = k.shape()[2];
  s.Ev = v.shape()[3];
  if (s.Hk == 0 || s.Hq % s.Hk != 0 || v.shape()[1] != s.Hk)
    throw std::invalid_argument("attention: query heads must be a multiple of key/value heads");
  s.G = s.Hq / s.Hk;
  return s;
}

double ScaleOf(const Arg& a, int64_t e) {
  if (a.kind == K::Double) return a.d;
  return 1.0 / std::sqrt(static_cast<double>(e));
}

// The (key) state ui64[2] for dropout from i64 seed and offset tensors.
Value StateFrom(Builder& b, Value seed, Value offset) {
  Value s = b.Reshape(b.BitcastConvert(b.Convert(seed, E::I64), E::U64), {1});
  Value o = b.Reshape(b.BitcastConvert(b.Convert(offset, E::I64), E::U64), {1});
  return b.Concatenate({s, o}, 0);
}

// Keep mask (true with probability 1 - p) of the probabilities' shape
// [B, Hk, G, L, S], from ui64[2] state: drawn at the real sizes of q's
// batch and rows and k's keys (the heads are static).
Value KeepMask(Builder& b, Value state, const std::vector<int64_t>& shape, const Value& q, const Value& k,
               double p) {
  std::vector<Value> qs = RealSizes(b, q), ks = RealSizes(b, k);
  std::vector<Value> real{qs[0], Value{}, Value{}, qs[2], ks[2]};
  Value u = Uniform01(b, state, shape, /*wide=*/false, real);
  return b.Compare("GE", u, b.Splat(E::F32, p, shape));
}

struct Forward {
  Value q5;    // [B, Hk, G, L, E] compute type
  Value k, v;  // [B, Hk, S, E|Ev]
  Value p;     // softmax probabilities [B, Hk, G, L, S]
  Value lse;   // [B, Hk, G, L]
  Value keep;  // dropout keep mask or invalid
};

// Scores, masks and the safe softmax.
Forward Probabilities(Context& c, const Shapes& s, Value q, Value k, Value v, const Arg& bias,
                      bool causal, double scale) {
  Builder& b = c.b;
  E ct = ComputeType(q.dtype());
  Forward f;
  f.q5 = b.Reshape(b.Convert(q, ct), {s.B, s.Hk, s.G, s.L, s.E});
  f.k = b.Convert(k, ct);
  f.v = b.Convert(v, ct);
  std::vector<int64_t> sshape{s.B, s.Hk, s.G, s.L, s.S};
  Value sc = b.DotGeneral(f.q5, f.k, {0, 1}, {0, 1}, {4}, {3}, ct, c.fp32_highest);
  sc = b.Binary("multiply", sc, b.Splat(ct, scale, sshape));
  Value ninf = b.Splat(ct, -std::numeric_limits<double>::infinity(), sshape);
  if (bias.kind == K::Tensor) {
    Value m = bias.tensor;
    if (m.rank() > 4) throw std::invalid_argument("attention: attn_mask of rank > 4");
    std::vector<int64_t> full{s.B, s.Hq, s.L, s.S};
    if (m.dtype() == E::Bool) {
      Value keep = b.Reshape(b.BroadcastTo(m, full), sshape);
      sc = b.Select(keep, sc, ninf);
    } else {
      sc = b.Binary("add", sc, b.Reshape(b.BroadcastTo(b.Convert(m, ct), full), sshape));
    }
  }
  if (causal) {
    TensorType it{E::I64, sshape};
    Value allowed = b.Compare("GE", b.Iota(it, 3), b.Iota(it, 4));
    sc = b.Select(allowed, sc, ninf);
  }
  std::vector<int64_t> rshape{s.B, s.Hk, s.G, s.L};
  std::vector<int64_t> rdims{0, 1, 2, 3};
  Value m = b.Reduce(sc, b.MinValue(ct), {4}, "maximum");
  Value m_inf = b.Compare("EQ", m, b.Splat(ct, -std::numeric_limits<double>::infinity(), rshape));
  m = b.Select(m_inf, b.Splat(ct, 0, rshape), m);
  Value e = b.Unary("exponential", b.Binary("subtract", sc, b.BroadcastInDim(m, sshape, rdims)));
  Value sum = b.Reduce(e, b.ConstantInt(ct, 0), {4}, "add");
  Value empty = b.Compare("EQ", sum, b.Splat(ct, 0, rshape));
  Value safe_sum = b.Select(empty, b.Splat(ct, 1, rshape), sum);
  f.p = b.Binary("divide", e, b.BroadcastInDim(safe_sum, sshape, rdims));
  f.lse = b.Binary("add", b.Unary("log", sum), m);
  return f;
}

// P with dropout applied (scaled by 1 / (1 - p)).
Value Dropped(Builder& b, Value p, Value keep, double dropout) {
  if (!keep.valid()) return p;
  Value scaled = b.Binary("multiply", p, b.Splat(p.dtype(), 1.0 / (1.0 - dropout), p.shape()));
  return b.Select(keep, scaled, b.Splat(p.dtype(), 0, p.shape()));
}

// _scaled_dot_product_efficient_attention (+ generator state, appended).
std::vector<Value> AttentionForward(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value q = a[0].tensor, k = a[1].tensor, v = a[2].tensor;
  Shapes s = ShapesOf(q, k, v);
  double dropout = a[5].kind == K::Double ? a[5].d : 0.0;
  bool causal = a[6].i != 0;
  double scale = ScaleOf(a[7], s.E);
  Value state = a.back().tensor;  // ui64[2]
  const TensorType& out_t = c.outputs.at(0);
  const TensorType& lse_t = c.outputs.at(1);
  E ct = ComputeType(q.dtype());
  Value out, lse;
  if (s.B * s.Hq * s.L == 0) {
    out = b.Splat(out_t.dtype, 0, out_t.shape);
    lse = b.Splat(E::F32, 0, {s.B, s.Hq, s.L});
  } else if (s.S == 0) {  // nothing to attend to: zeros, lse -inf
    out = b.Splat(out_t.dtype, 0, out_t.shape);
    lse = b.Splat(E::F32, -std::numeric_limits<double>::infinity(), {s.B, s.Hq, s.L});
  } else {
    Forward f = Probabilities(c, s, q, k, v, a[3], causal, scale);
    if (dropout > 0) f.keep = KeepMask(b, state, f.p.shape(), q, k, dropout);
    Value pd = Dropped(b, f.p, f.keep, dropout);
    Value o = b.DotGeneral(pd, f.v, {0, 1}, {0, 1}, {4}, {2}, ct, c.fp32_highest);
    out = b.Convert(b.Reshape(o, {s.B, s.Hq, s.L, s.Ev}), out_t.dtype);
    lse = b.Convert(b.Reshape(f.lse, {s.B, s.Hq, s.L}), E::F32);
  }
  // logsumexp is padded with zeros (or empty when not requested) per the
  // meta kernel. Padded by writing it into zeros one row longer than its
  // rounded rows, then cutting that row off: on a bounded-dynamic L, XLA's
  // padder writes the real rows only, and infers the result static (an
  // update smaller than its destination), which it must be: a dynamic
  // result comes back from XLA:CPU with its sizes appended, a buffer no
  // executable takes (a pad or concatenate would stay dynamic).
  int64_t want = lse_t.shape.at(2);
  if (want == 0) {
    lse = b.Splat(E::F32, 0, {s.B, s.Hq, 0});
  } else if (want >= s.L) {
    Value zero = b.ConstantInt(E::I64, 0);
    lse = b.DynamicUpdateSlice(b.Splat(E::F32, 0, {s.B, s.Hq, want + 1}), lse, {zero, zero, zero});
    lse = b.Slice(lse, {0, 0, 0}, {s.B, s.Hq, want}, {1, 1, 1});
  } else {
    lse = b.Slice(lse, {0, 0, 0}, {s.B, s.Hq, want}, {1, 1, 1});
  }
  Value seed = b.BitcastConvert(b.Reshape(b.Slice(state, {0}, {1}, {1}), {}), E::I64);
  Value offset = b.BitcastConvert(b.Reshape(b.Slice(state, {1}, {2}, {1}), {}), E::I64);
  return {out, b.Convert(lse, lse_t.dtype), b.Convert(seed, c.outputs.at(2).dtype),
          b.Convert(offset, c.outputs.at(3).dtype)};
}

// Sums `g` ([B, Hq, L, S]) down to the broadcastable shape `shape`.
Value ReduceTo(Builder& b, Value g, const std::vector<int64_t>& shape) {
  int64_t r = static_cast<int64_t>(shape.size()), full = g.rank();
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < full; ++i) {
    int64_t j = i - (full - r);
    if ((j < 0 || shape[j] == 1) && g.shape()[i] != 1) dims.push_back(i);
    else if (j < 0) dims.push_back(i);
  }
  if (!dims.empty()) g = b.Reduce(g, b.ConstantInt(g.dtype(), 0), dims, "add");
  return b.Reshape(g, shape);
}

// _scaled_dot_product_efficient_attention_backward.
std::vector<Value> AttentionBackward(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value go = a[0].tensor, q = a[1].tensor, k = a[2].tensor, v = a[3].tensor;
  Shapes s = ShapesOf(q, k, v);
  double dropout = a[9].kind == K::Double ? a[9].d : 0.0;
  bool causal = a.size() > 11 && a[11].i != 0;
  double scale = a.size() > 12 ? ScaleOf(a[12], s.E) : ScaleOf(Arg{}, s.E);
  E ct = ComputeType(q.dtype());
  auto zeros = [&](size_t i) { return b.Splat(c.outputs[i].dtype, 0, c.outputs[i].shape); };
  const TensorType& dk_t = c.outputs.at(1);
  if (dk_t.shape.size() != 4 || dk_t.shape[1] != s.Hk)
    throw std::invalid_argument("attention backward: key heads differ from the gradient's");
  std::vector<Value> result;
  if (s.B * s.Hq * s.L * s.S == 0) {
    result = {zeros(0), zeros(1), zeros(2)};
  } else {
    Forward f = Probabilities(c, s, q, k, v, a[4], causal, scale);
    if (dropout > 0)
      f.keep = KeepMask(b, StateFrom(b, a[7].tensor, a[8].tensor), f.p.shape(), q, k, dropout);
    Value pd = Dropped(b, f.p, f.keep, dropout);
    Value g5 = b.Reshape(b.Convert(go, ct), {s.B, s.Hk, s.G, s.L, s.Ev});
    Value dv = b.DotGeneral(pd, g5, {0, 1}, {0, 1}, {2, 3}, {2, 3}, ct, c.fp32_highest);
    Value dpd = b.DotGeneral(g5, f.v, {0, 1}, {0, 1}, {4}, {3}, ct, c.fp32_highest);
    Value dp = Dropped(b, dpd, f.keep, dropout);
    std::vector<int64_t> sshape = f.p.shape();
    Value row = b.Reduce(b.Binary("multiply", f.p, dp), b.ConstantInt(ct, 0), {4}, "add");
    Value ds = b.Binary("multiply", f.p,
                        b.Binary("subtract", dp, b.BroadcastInDim(row, sshape, {0, 1, 2, 3})));
    Value dss = b.Binary("multiply", ds, b.Splat(ct, scale, sshape));
    Value dq = b.DotGeneral(dss, f.k, {0, 1}, {0, 1}, {4}, {2}, ct, c.fp32_highest);
    Value dk = b.DotGeneral(dss, f.q5, {0, 1}, {0, 1}, {2, 3}, {2, 3}, ct, c.fp32_highest);
    result = {b.Convert(b.Reshape(dq, c.outputs[0].shape), c.outputs[0].dtype),
              b.Convert(b.Reshape(dk, c.outputs[1].shape), c.outputs[1].dtype),
              b.Convert(b.Reshape(dv, c.outputs[2].shape), c.outputs[2].dtype)};
    if (c.outputs.size() > 3 && a[4].kind == K::Tensor && a[4].tensor.dtype() != E::Bool) {
      Value gb = ReduceTo(b, b.Reshape(ds, {s.B, s.Hq, s.L, s.S}), a[4].tensor.shape());
      result.push_back(b.Convert(b.Reshape(gb, c.outputs[3].shape), c.outputs[3].dtype));
      return result;
    }
  }
  if (c.outputs.size() > 3) result.push_back(zeros(3));
  return result;
}

// Bounded dynamic shapes: batch and sequence dims only. A padded head count
// would change grouped-query attention's grouping, a padded head dim the
// default scale 1/sqrt(E). `args`: the schema args of q, k, v and the mask:
// q, k, v [b, h, s, E] (dims 0 and -2); the mask its first and last two
// dims (padded batch rows are independent).
void HeadDimsStatic(const std::vector<size_t>& args, size_t mask, StaticDims& s) {
  for (size_t arg : args) {
    const size_t rank = s.Rank(arg);
    for (size_t d = 0; d < rank; ++d) {
      bool sequence = d + 2 == rank || (arg == mask && d + 1 == rank) || (d == 0 && rank == 4);
      if (!sequence) s.Dim(arg, d);
    }
  }
  s.Because("attention's head counts and head dim stay static");
}

// The forward (q, k, v, mask, compute_log_sumexp, ...). The saved
// logsumexp's rows are rounded up to a multiple of 32: they follow the
// length in steps (RuleEntry::dynamic.stepped_outputs), so at a bucket 32 or
// more rows past the real length (an image's tokens, 841 in a bucket of
// 900) they are a dynamic dim too, kept padded; the rows past the real
// length are padding the backward never reads.
void AttentionStaticDims(const std::vector<Arg>& a, StaticDims& s) { HeadDimsStatic({0, 1, 2, 3}, 3, s); }

// The backward (grad_out, q, k, v, mask, out, logsumexp, seed, offset,
// dropout_p, ...): the logsumexp's heads stay static; its rows follow L
// (SDPA's backward passes it cut to the L real rows, a window of its
// rounded storage; the rule does not read it: it computes the
// probabilities again, and its dropout mask, drawn at the real sizes as
// the forward drew it).
void AttentionBackwardStaticDims(const std::vector<Arg>& a, StaticDims& s) {
  HeadDimsStatic({0, 1, 2, 3, 4, 5}, 4, s);
  if (s.Rank(6) == 3) s.Dim(6, 1);
}

// The forward's results as PyTorch's (Python) meta kernel makes them, for
// consistent q [B, H, L, E], k [B, Hk, S, E], v [B, Hk, S, Ev] (H a
// multiple of Hk): out [B, H, L, Ev] laid out as [B, L, H, Ev]; the
// logsumexp [B, H, L rounded up to 32] in float (0 rows when not asked
// for); the dropout seed and offset, int64 scalars.
std::optional<std::vector<OutputLayout>> AttentionOutputs(const std::vector<Arg>& a) {
  if (a.size() < 5 || a[4].kind != K::Bool) return std::nullopt;
  for (size_t i = 0; i < 3; ++i)
    if (a[i].kind != K::Tensor || a[i].tensor.rank() != 4 || a[i].tensor.dtype() != a[0].tensor.dtype())
      return std::nullopt;
  const std::vector<int64_t>& q = a[0].tensor.shape();
  const std::vector<int64_t>& k = a[1].tensor.shape();
  const std::vector<int64_t>& v = a[2].tensor.shape();
  if (k[0] != q[0] || v[0] != q[0] || k[1] != v[1] || k[1] < 1 || q[1] % k[1] != 0 || k[3] != q[3] || v[2] != k[2])
    return std::nullopt;
  if (a[3].kind == K::Tensor) {  // a bias broadcast to [B, H, L, S]
    const std::vector<int64_t>& m = a[3].tensor.shape();
    const std::vector<int64_t> scores{q[0], q[1], q[2], k[2]};
    if (m.size() > 4) return std::nullopt;
    for (size_t d = 0; d < m.size(); ++d)
      if (m[m.size() - 1 - d] != 1 && m[m.size() - 1 - d] != scores[3 - d]) return std::nullopt;
  } else if (!a[3].is_none()) {
    return std::nullopt;
  }
  const int64_t rows = a[4].i ? (q[2] + 31) / 32 * 32 : 0;
  return std::vector<OutputLayout>{
      {TensorType{a[0].tensor.dtype(), {q[0], q[1], q[2], v[3]}}, {0, 2, 1, 3}},
      {TensorType{E::F32, {q[0], q[1], rows}}, {0, 1, 2}},
      {TensorType{E::I64, {}}, {}},
      {TensorType{E::I64, {}}, {}}};
}

const bool registered = [] {
  // Its only randomness is dropout: at dropout_p == 0 it draws nothing, as on
  // CPU and CUDA (the generator stays where it was).
  RuleEntry& forward = RegisterRandom("_scaled_dot_product_efficient_attention", AttentionForward,
                                      [](const std::vector<Arg>& a, const std::vector<TensorType>& outputs) {
                                        bool no_dropout = a.size() > 5 && a[5].kind == K::Double && a[5].d == 0.0;
                                        return no_dropout ? uint64_t{0} : DrawPerOutputElement(a, outputs);
                                      }).Dynamic(AttentionStaticDims);
  forward.dynamic.stepped_outputs = true;
  forward.dynamic.draws_at_real_sizes = true;
  forward.dynamic.derived_outputs = AttentionOutputs;
  RuleEntry& backward = Register("_scaled_dot_product_efficient_attention_backward", AttentionBackward)
                            .Dynamic(AttentionBackwardStaticDims);
  backward.dynamic.front_window_args = {6};  // logsumexp
  backward.dense_outputs = true;  // the bias gradient (T5's position bias): dense, so it runs dynamic
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
