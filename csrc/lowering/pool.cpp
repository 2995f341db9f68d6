// Pooling, padding and resampling: max/avg pooling (reduce_window), adaptive
// average and max pooling, fractional max pooling (2-d), reflection/replication pads and the upsample family
// (nearest, nearest-exact, linear/bilinear/trilinear, bicubic), each with
// its backward op.
//
// Pads, resampling and adaptive pooling are separable: along each spatial
// dim the output is a fixed linear map of the input, out[o] = sum_k w[k][o] *
// in[idx[k][o]]. The index and weight tables are computed here, at compile
// time, with PyTorch's own CPU formulas (float arithmetic as in its kernels)
// and applied with one gather per dim. Backward ops apply the transposed map
// (also a gather: no scatter, deterministic).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <tuple>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

using K = Arg::Kind;

int64_t Prod(const std::vector<int64_t>& v, size_t from = 0) {
  int64_t n = 1;
  for (size_t i = from; i < v.size(); ++i) n *= v[i];
  return n;
}

// `v` repeated to n entries when it has one (int[2] args accept a single int).
std::vector<int64_t> Expand(const std::vector<int64_t>& v, size_t n, int64_t dflt) {
  if (v.empty()) return std::vector<int64_t>(n, dflt);
  if (v.size() == 1) return std::vector<int64_t>(n, v[0]);
  return v;
}

std::optional<double> OptDouble(const std::vector<Arg>& a, size_t i) {
  if (i >= a.size() || a[i].kind != K::Double) return std::nullopt;
  return a[i].d;
}


// ---------------------------------------------------------------- constants

Value ConstIndex(Builder& b, const std::vector<int64_t>& v) {
  return b.ConstantIntArray(ElementType::I64, v);
}

Value ConstFloat(Builder& b, ElementType dt, const std::vector<double>& v) {
  return b.ConstantArray(dt, v);
}

Value ConstBool(Builder& b, const std::vector<bool>& v) {
  return b.ConstantIntArray(ElementType::Bool, std::vector<int64_t>(v.begin(), v.end()));
}

// ---------------------------------------------------------------- separable maps

// out[o] = sum_k w[k][o] * in[idx[k][o]] along one dim.
struct Map {
  int64_t in = 0, out = 0, taps = 1;
  std::vector<int64_t> idx;  // [taps][out]
  std::vector<double> w;     // [taps][out]; empty: one tap of weight 1
  std::vector<bool> valid;   // [taps][out]; empty: all taps valid
};

Map Gather1(int64_t in, int64_t out, const std::function<int64_t(int64_t)>& src) {
  Map m;
  m.in = in;
  m.out = out;
  for (int64_t o = 0; o < out; ++o) m.idx.push_back(src(o));
  return m;
}

// The adjoint map: in and out swap; taps padded (as invalid) to the largest
// fan-in.
Map Transposed(const Map& m) {
  std::vector<std::vector<std::pair<int64_t, double>>> uses(m.in);
  for (int64_t k = 0; k < m.taps; ++k)
    for (int64_t o = 0; o < m.out; ++o) {
      size_t j = k * m.out + o;
      if (!m.valid.empty() && !m.valid[j]) continue;
      uses[m.idx[j]].push_back({o, m.w.empty() ? 1.0 : m.w[j]});
    }
  Map t;
  t.in = m.out;
  t.out = m.in;
  t.taps = 1;
  for (const auto& u : uses) t.taps = std::max<int64_t>(t.taps, u.size());
  t.idx.assign(t.taps * t.out, 0);
  t.w.assign(t.taps * t.out, 0.0);
  t.valid.assign(t.taps * t.out, false);
  bool all_valid = true;
  for (int64_t i = 0; i < t.out; ++i)
    for (int64_t k = 0; k < t.taps; ++k) {
      size_t j = k * t.out + i;
      if (k < static_cast<int64_t>(uses[i].size())) {
        t.idx[j] = uses[i][k].first;
        t.w[j] = uses[i][k].second;
        t.valid[j] = true;
      } else {
        all_valid = false;
      }
    }
  if (all_valid) t.valid.clear();
  return t;
}

// Applies `m` along `dim` of x (weights in x's dtype).
Value Apply(Builder& b, Value x, int64_t dim, const Map& m) {
  std::vector<int64_t> shape = x.shape();
  shape[dim] = m.out;
  if (Prod(shape) == 0 || x.type.numel() == 0) return b.Splat(x.dtype(), 0, shape);
  std::vector<int64_t> others;
  for (int64_t i = 0; i < x.rank(); ++i)
    if (i != dim) others.push_back(x.shape()[i]);
  Value idx = b.Reshape(ConstIndex(b, m.idx), {m.taps * m.out, 1});
  Value g = b.Gather(x, idx, {dim});  // [taps*out, others...]
  std::vector<int64_t> tshape{m.taps, m.out};
  tshape.insert(tshape.end(), others.begin(), others.end());
  g = b.Reshape(g, tshape);
  if (!m.w.empty()) {
    Value w = b.BroadcastInDim(b.Reshape(ConstFloat(b, x.dtype(), m.w), {m.taps, m.out}),
                               tshape, {0, 1});
    g = b.Binary("multiply", g, w);
    if (!m.valid.empty()) {
      Value ok = b.BroadcastInDim(b.Reshape(ConstBool(b, m.valid), {m.taps, m.out}), tshape,
                                  {0, 1});
      g = b.Select(ok, g, b.Splat(x.dtype(), 0, tshape));
    }
  }
  std::vector<int64_t> rshape(tshape.begin() + 1, tshape.end());
  g = (m.taps == 1) ? b.Reshape(g, rshape)
                    : b.Reduce(g, b.Constant(x.dtype(), 0), {0}, "add");
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < x.rank(); ++i) perm.push_back(i < dim ? i + 1 : (i == dim ? 0 : i));
  return b.Transpose(g, perm);
}

// Applies one map per trailing dim (maps[j] to dim rank - n + j).
Value ApplyAll(Builder& b, Value x, const std::vector<Map>& maps, bool transpose) {
  int64_t first = x.rank() - static_cast<int64_t>(maps.size());
  if (!transpose) {
    for (int64_t j = static_cast<int64_t>(maps.size()) - 1; j >= 0; --j)
      x = Apply(b, x, first + j, maps[j]);
  } else {
    for (size_t j = 0; j < maps.size(); ++j) x = Apply(b, x, first + j, Transposed(maps[j]));
  }
  return x;
}

// ---------------------------------------------------------------- PyTorch formulas

template <typename T>
T ScalesValue(std::optional<double> scale, int64_t in, int64_t out) {
  return (scale.has_value() && *scale > 0.) ? static_cast<T>(1.0 / *scale)
                                             : (static_cast<T>(in) / out);
}

template <typename T>
T AreaScale(int64_t in, int64_t out, bool align_corners, std::optional<double> scale) {
  if (out > 1)
    return align_corners ? static_cast<T>(in - 1) / (out - 1) : ScalesValue<T>(scale, in, out);
  return T(0);
}

template <typename T>
T SourceIndex(T scale, int64_t dst, bool align_corners, bool cubic) {
  if (align_corners) return scale * dst;
  T src = scale * (dst + static_cast<T>(0.5)) - static_cast<T>(0.5);
  return (!cubic && src < 0) ? T(0) : src;
}

template <typename T>
void GuardIndexAndLambda(T real, int64_t in, int64_t& index, T& lambda) {
  index = std::min(static_cast<int64_t>(floorf(static_cast<float>(real))), in - 1);
  lambda = std::min(std::max(real - index, static_cast<T>(0)), static_cast<T>(1));
}

enum class Mode { Nearest, NearestExact, Linear, Cubic };

Map NearestMap(int64_t in, int64_t out, std::optional<double> scale, bool exact) {
  return Gather1(in, out, [&](int64_t o) -> int64_t {
    float s = ScalesValue<float>(scale, in, out);
    if (exact)
      return std::min(static_cast<int64_t>(floorf(static_cast<float>((o + 0.5) * s))), in - 1);
    if (out == in) return o;
    if (out == 2 * in) return o >> 1;
    return std::min(static_cast<int64_t>(floorf(o * s)), in - 1);
  });
}

template <typename T>
Map InterpMap(int64_t in, int64_t out, bool align_corners, std::optional<double> scale,
              bool cubic) {
  Map m;
  m.in = in;
  m.out = out;
  m.taps = cubic ? 4 : 2;
  m.idx.assign(m.taps * out, 0);
  m.w.assign(m.taps * out, 0.0);
  T ratio = AreaScale<T>(in, out, align_corners, scale);
  for (int64_t o = 0; o < out; ++o) {
    T real = SourceIndex<T>(ratio, o, align_corners, cubic);
    int64_t i0;
    T lambda;
    GuardIndexAndLambda<T>(real, in, i0, lambda);
    if (!cubic) {
      m.idx[o] = i0;
      m.idx[out + o] = i0 + (i0 < in - 1 ? 1 : 0);
      m.w[o] = static_cast<T>(1) - lambda;
      m.w[out + o] = lambda;
      continue;
    }
    const T A = -0.75;
    auto c1 = [A](T x) { return ((A + 2) * x - (A + 3)) * x * x + 1; };
    auto c2 = [A](T x) { return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A; };
    T t = lambda, t2 = static_cast<T>(1.0) - lambda;
    T coeffs[4] = {c2(t + static_cast<T>(1.0)), c1(t), c1(t2), c2(t2 + static_cast<T>(1.0))};
    for (int64_t k = 0; k < 4; ++k) {
      m.idx[k * out + o] = std::max<int64_t>(std::min<int64_t>(i0 - 1 + k, in - 1), 0);
      m.w[k * out + o] = coeffs[k];
    }
  }
  return m;
}

// The maps of one upsample call: `in` and `out` are the spatial sizes.
std::vector<Map> UpsampleMaps(Mode mode, const std::vector<int64_t>& in,
                              const std::vector<int64_t>& out, bool align_corners,
                              const std::vector<std::optional<double>>& scales, bool f64) {
  std::vector<Map> maps;
  for (size_t j = 0; j < in.size(); ++j) {
    auto s = j < scales.size() ? scales[j] : std::nullopt;
    switch (mode) {
      case Mode::Nearest: maps.push_back(NearestMap(in[j], out[j], s, false)); break;
      case Mode::NearestExact: maps.push_back(NearestMap(in[j], out[j], s, true)); break;
      case Mode::Linear:
      case Mode::Cubic:
        maps.push_back(f64 ? InterpMap<double>(in[j], out[j], align_corners, s, mode == Mode::Cubic)
                           : InterpMap<float>(in[j], out[j], align_corners, s, mode == Mode::Cubic));
        break;
    }
  }
  return maps;
}

// upsample_*(self, output_size, [align_corners,] scales...) and
// upsample_*_backward(grad_output, output_size, input_size, [align_corners,] scales...).
Rule UpsampleRule(Mode mode, int64_t n, bool backward) {
  return [mode, n, backward](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = c.outputs.at(0);
    // A backward's gradient with dynamic dims: zeros past its real elements
    // (a padding element may map onto a real input element).
    Value x = backward ? StaticFilled(c.b, a.at(0).tensor, 0) : a.at(0).tensor;
    bool interp = mode == Mode::Linear || mode == Mode::Cubic;
    size_t next = backward ? 3 : 2;
    bool align = interp ? a.at(next++).i != 0 : false;
    std::vector<std::optional<double>> scales;
    for (int64_t j = 0; j < n; ++j) scales.push_back(OptDouble(a, next + j));
    std::vector<int64_t> out_size = a.at(1).ints;
    std::vector<int64_t> in_size;
    if (backward) {
      const auto& full = a.at(2).ints;
      in_size.assign(full.end() - n, full.end());
    } else {
      in_size.assign(x.shape().end() - n, x.shape().end());
    }
    if (!hlo::IsFloat(out.dtype) && (interp || backward))
      throw Unsupported("interpolation of integer tensors");
    ElementType ct = ComputeType(out.dtype);
    bool exact_copy = !interp;  // gathers only: keep the dtype
    Value v = exact_copy && !backward ? x : c.b.Convert(x, ct);
    auto maps = UpsampleMaps(mode, in_size, out_size, align, scales, ct == ElementType::F64);
    Value r = ApplyAll(c.b, v, maps, backward);
    return std::vector<Value>{c.b.Convert(c.b.Reshape(r, out.shape), out.dtype)};
  };
}

// ---------------------------------------------------------------- pads

Map PadMap(int64_t in, int64_t lo, int64_t hi, bool reflect) {
  return Gather1(in, in + lo + hi, [&](int64_t o) -> int64_t {
    int64_t s = o - lo;
    if (reflect) {
      if (s < 0) s = -s;
      if (s >= in) s = 2 * (in - 1) - s;
      return s;
    }
    return std::min(std::max<int64_t>(s, 0), in - 1);
  });
}

// reflection/replication_padNd(self, padding) and their backward ops
// (grad_output, self, padding). padding pairs start at the last dim.
Rule PadRule(bool reflect, bool backward) {
  return [reflect, backward](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = c.outputs.at(0);
    Value x = a.at(0).tensor;
    Value self = backward ? a.at(1).tensor : x;
    const auto& pad = a.at(backward ? 2 : 1).ints;
    int64_t n = static_cast<int64_t>(pad.size()) / 2;
    std::vector<Map> maps(n);
    for (int64_t j = 0; j < n; ++j) {
      int64_t dim = self.rank() - 1 - j;
      maps[n - 1 - j] = PadMap(self.shape()[dim], pad[2 * j], pad[2 * j + 1], reflect);
    }
    Value v = backward ? c.b.Convert(x, ComputeType(out.dtype)) : x;
    if (backward && !hlo::IsFloat(out.dtype)) throw Unsupported("integer pad backward");
    Value r = ApplyAll(c.b, v, maps, backward);
    return std::vector<Value>{c.b.Convert(r, out.dtype)};
  };
}

// Bounded dynamic shapes: the dims a reflection or replication pad pads
// (the last padding.size() / 2 of self, and of grad_output in the backward)
// stay static: it reads their border elements, which the padding would
// move. The dims before them (batch, channels) run dynamic.
StaticDimsRule PaddedDimsStatic(bool backward) {
  return [backward](const std::vector<Arg>& a, StaticDims& s) {
    const size_t pad_arg = backward ? 2 : 1;
    s.Because("the dims a reflection or replication pad pads");
    if (pad_arg >= a.size()) return s.All(0);
    const size_t n = a[pad_arg].ints.size() / 2;
    s.Last(0, n);
    if (backward) s.Last(1, n);
  };
}

// ---------------------------------------------------------------- adaptive avg pool

Map AdaptiveMap(int64_t in, int64_t out) {
  Map m;
  m.in = in;
  m.out = out;
  std::vector<int64_t> start(out), end(out);
  m.taps = 1;
  for (int64_t o = 0; o < out; ++o) {
    start[o] = static_cast<int64_t>(std::floor(static_cast<float>(o * in) / out));
    end[o] = static_cast<int64_t>(std::ceil(static_cast<float>((o + 1) * in) / out));
    m.taps = std::max(m.taps, end[o] - start[o]);
  }
  m.idx.assign(m.taps * out, 0);
  m.w.assign(m.taps * out, 0.0);
  m.valid.assign(m.taps * out, false);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t k = 0; k < end[o] - start[o]; ++k) {
      m.idx[k * out + o] = start[o] + k;
      m.w[k * out + o] = 1.0 / static_cast<double>(end[o] - start[o]);
      m.valid[k * out + o] = true;
    }
  return m;
}

// An adaptive average pooling to one element per channel over `self`'s
// trailing n dims, some bounded-dynamic: their sum over the real elements
// (XLA masks the padding) by their runtime count; backward: the gradient
// spread over them by that count.
Value GlobalAverage(Builder& b, Value x, const Value& self, int64_t n, bool backward, const TensorType& out) {
  ElementType ct = ComputeType(out.dtype);
  std::vector<int64_t> dims;
  for (int64_t d = self.rank() - n; d < self.rank(); ++d) dims.push_back(d);
  Value count = ElementCount(b, self, dims, 1, ct);
  if (backward) {
    std::vector<int64_t> lead(self.shape().begin(), self.shape().end() - n), lead_dims;
    for (size_t d = 0; d < lead.size(); ++d) lead_dims.push_back(static_cast<int64_t>(d));
    Value g = b.BroadcastInDim(b.Reshape(b.Convert(x, ct), lead), self.shape(), lead_dims);
    return b.Convert(b.Binary("divide", g, b.BroadcastInDim(count, self.shape(), {})), out.dtype);
  }
  Value sum = b.Reduce(b.Convert(x, ct), b.Constant(ct, 0), dims, "add");
  Value mean = b.Binary("divide", sum, b.BroadcastInDim(count, sum.shape(), {}));
  return b.Convert(b.Reshape(mean, out.shape), out.dtype);
}

// _adaptive_avg_poolNd(self, output_size) / _backward(grad_output, self).
Rule AdaptiveAvgRule(int64_t n, bool backward) {
  return [n, backward](Context& c, const std::vector<Arg>& a) {
    const TensorType& out = c.outputs.at(0);
    if (!hlo::IsFloat(out.dtype)) throw Unsupported("integer adaptive_avg_pool");
    Value x = a.at(0).tensor;
    Value self = backward ? a.at(1).tensor : x;
    std::vector<int64_t> in_size(self.shape().end() - n, self.shape().end());
    std::vector<int64_t> out_size = backward
                                        ? std::vector<int64_t>(x.shape().end() - n, x.shape().end())
                                        : Expand(a.at(1).ints, n, 1);
    ElementType ct = ComputeType(out.dtype);
    if (std::all_of(out_size.begin(), out_size.end(), [](int64_t o) { return o == 1; }) && self.type.is_dynamic())
      return std::vector<Value>{GlobalAverage(c.b, x, self, n, backward, out)};
    std::vector<Map> maps;
    for (int64_t j = 0; j < n; ++j) maps.push_back(AdaptiveMap(in_size[j], out_size[j]));
    Value r = ApplyAll(c.b, c.b.Convert(x, ct), maps, backward);
    return std::vector<Value>{c.b.Convert(c.b.Reshape(r, out.shape), out.dtype)};
  };
}

// ---------------------------------------------------------------- reduce_window pools

std::vector<Value> ReduceWindow(
    Builder& b, const std::vector<Value>& xs, const std::vector<Value>& inits,
    const std::vector<int64_t>& window, const std::vector<int64_t>& strides,
    const std::vector<int64_t>& dilations, const std::vector<int64_t>& lo,
    const std::vector<int64_t>& hi,
    const std::function<std::vector<Value>(Builder&, const std::vector<Value>&)>& body) {
  std::vector<int64_t> shape;
  const auto& in = xs[0].shape();
  for (size_t i = 0; i < in.size(); ++i) {
    int64_t padded = in[i] + lo[i] + hi[i];
    int64_t dk = (window[i] - 1) * dilations[i] + 1;
    shape.push_back(padded < dk ? 0 : (padded - dk) / strides[i] + 1);
  }
  return b.ReduceWindow(xs, inits, shape, window, strides, dilations, lo, hi, body);
}

// Pooling geometry over the trailing n dims of x; lead dims get window 1.
struct Window {
  std::vector<int64_t> window, strides, dilations, lo, hi;  // full rank
  std::vector<int64_t> out;                                 // full output shape
};

Window PoolWindow(const Value& x, const std::vector<int64_t>& out_shape, int64_t n,
                  const std::vector<int64_t>& k, const std::vector<int64_t>& s,
                  const std::vector<int64_t>& p, const std::vector<int64_t>& d) {
  Window w;
  int64_t lead = x.rank() - n;
  for (int64_t i = 0; i < x.rank(); ++i) {
    if (i < lead) {
      w.window.push_back(1); w.strides.push_back(1); w.dilations.push_back(1);
      w.lo.push_back(0); w.hi.push_back(0);
      continue;
    }
    int64_t j = i - lead, o = out_shape[i];
    w.window.push_back(k[j]);
    w.strides.push_back(s[j]);
    w.dilations.push_back(d[j]);
    w.lo.push_back(p[j]);
    // Enough high padding for the last window (ceil_mode may need more
    // than p); any surplus window is sliced off.
    int64_t need = o <= 0 ? 0 : (o - 1) * s[j] + (k[j] - 1) * d[j] + 1 - x.shape()[i] - p[j];
    w.hi.push_back(std::max<int64_t>(need, 0));
  }
  w.out = out_shape;
  return w;
}

Value SliceTo(Builder& b, Value v, const std::vector<int64_t>& shape) {
  if (v.shape() == shape) return v;
  std::vector<int64_t> zeros(shape.size(), 0), ones(shape.size(), 1);
  return b.Slice(v, zeros, shape, ones);
}

struct PoolArgs {
  std::vector<int64_t> k, s, p, d;
};

PoolArgs ReadPoolArgs(const std::vector<Arg>& a, size_t first, int64_t n, bool has_dilation) {
  PoolArgs r;
  r.k = Expand(a.at(first).ints, n, 1);
  r.s = a.at(first + 1).ints.empty() ? r.k : Expand(a.at(first + 1).ints, n, 1);
  r.p = Expand(a.at(first + 2).ints, n, 0);
  r.d = has_dilation ? Expand(a.at(first + 3).ints, n, 1) : std::vector<int64_t>(n, 1);
  return r;
}

// The reduction body of max pooling with indices over (value, flat index)
// pairs: a total order with NaN above all (the last NaN wins, as the CPU
// kernels' `val > max || isnan(val)` scan), then value, then the first index
// among equals.
std::vector<Value> MaxAndIndex(Builder& rb, const std::vector<Value>& v) {
  Value av = v[0], ai = v[1], bv = v[2], bi = v[3];
  Value a_nan = rb.Compare("NE", av, av), b_nan = rb.Compare("NE", bv, bv);
  Value b_ok = rb.Unary("not", b_nan);
  Value first = rb.Compare("LT", ai, bi);
  Value better = rb.Binary(
      "or", rb.Compare("GT", av, bv), rb.Binary("and", rb.Compare("EQ", av, bv), first));
  Value pick_a = rb.Select(a_nan, rb.Binary("or", b_ok, rb.Unary("not", first)),
                           rb.Binary("and", b_ok, better));
  return std::vector<Value>{rb.Select(pick_a, av, bv), rb.Select(pick_a, ai, bi)};
}

// Each element's flat index in its plane of the trailing n dims.
Value PlaneIndex(Builder& b, const std::vector<int64_t>& shape, int64_t n, const std::vector<Value>& runtime = {}) {
  TensorType it{ElementType::I64, shape};
  Value idx = b.Splat(ElementType::I64, 0, shape);
  Value stride = b.ConstantInt(ElementType::I64, 1);
  const int64_t lead = static_cast<int64_t>(shape.size()) - n;
  for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= lead; --i) {
    idx = b.Binary("add", idx, b.Binary("multiply", b.Iota(it, i), b.BroadcastInDim(stride, shape, {})));
    const Value& size = runtime.empty() ? Value() : runtime[i - lead];
    stride = b.Binary("multiply", stride, size.valid() ? size : b.ConstantInt(ElementType::I64, shape[i]));
  }
  return idx;
}

// The runtime sizes (i64) of x's trailing n dims: invalid for its static ones.
std::vector<Value> RuntimeSpatialSizes(Builder& b, const Value& x, int64_t n) {
  std::vector<Value> sizes(n);
  for (int64_t j = 0; j < n; ++j) {
    const int64_t d = x.rank() - n + j;
    if (d < static_cast<int64_t>(x.type.dynamic.size()) && x.type.dynamic[d])
      sizes[j] = b.Convert(b.GetDimensionSize(x, d), ElementType::I64);
  }
  return sizes;
}

// Flat plane indices of a plane of runtime sizes `runtime` (the real one)
// as indices into the plane of static sizes `shape`'s trailing n dims (the
// bucket's): each index's coordinates kept.
Value ToBucketPlane(Builder& b, Value idx, const std::vector<int64_t>& shape, int64_t n,
                    const std::vector<Value>& runtime) {
  auto splat = [&](Value s) { return b.BroadcastInDim(s, idx.shape(), {}); };
  Value rest = idx, out = b.Splat(ElementType::I64, 0, idx.shape());
  int64_t bucket_stride = 1;
  for (int64_t j = n - 1; j >= 0; --j) {
    const Value size = runtime[j].valid() ? runtime[j] : b.ConstantInt(ElementType::I64, shape[shape.size() - n + j]);
    Value coord = j > 0 ? b.Binary("remainder", rest, splat(size)) : rest;
    out = b.Binary("add", out, b.Binary("multiply", coord, b.Splat(ElementType::I64, static_cast<double>(bucket_stride), idx.shape())));
    if (j > 0) rest = b.Binary("divide", rest, splat(size));
    bucket_stride *= shape[shape.size() - n + j];
  }
  return out;
}

// max_poolNd_with_indices(self, kernel_size, stride, padding, dilation, ceil_mode)
Rule MaxPoolRule(int64_t n) {
  return [n](Context& c, const std::vector<Arg>& a) {
    Builder& b = c.b;
    Value x = a.at(0).tensor;
    const TensorType& out = c.outputs.at(0);
    if (!hlo::IsFloat(x.dtype())) throw Unsupported("integer max pooling");
    if (out.numel() == 0)
      return std::vector<Value>{b.Splat(out.dtype, 0, out.shape),
                                b.Splat(ElementType::I64, 0, out.shape)};
    PoolArgs pa = ReadPoolArgs(a, 1, n, true);
    // Dynamic spatial dims: the pooling runs static at the bucket on the
    // input's padding filled with -inf (as its own padding), the indices
    // counted in the real plane (runtime sizes).
    const std::vector<Value> runtime = RuntimeSpatialSizes(b, x, n);
    x = StaticFilled(b, x, b.MinValue(x.dtype()));
    Window w = PoolWindow(x, out.shape, n, pa.k, pa.s, pa.p, pa.d);
    Value idx = PlaneIndex(b, x.shape(), n, runtime);  // flat index into the spatial plane
    auto r = ReduceWindow(
        b, {x, idx}, {b.MinValue(x.dtype()), b.ConstantInt(ElementType::I64, INT64_MAX)},
        w.window, w.strides, w.dilations, w.lo, w.hi,
        MaxAndIndex);
    return std::vector<Value>{SliceTo(b, r[0], out.shape), SliceTo(b, r[1], out.shape)};
  };
}

// max_poolNd_with_indices_backward(grad_output, self, kernel_size, stride,
//   padding, dilation, ceil_mode, indices) and adaptive_max_poolNd_backward(
//   grad_output, self, indices): scatter-add into the plane. `index_arg`:
//   where the indices are.
Rule MaxPoolBackwardRule(int64_t n, size_t index_arg = 7) {
  return [n, index_arg](Context& c, const std::vector<Arg>& a) {
    Builder& b = c.b;
    const TensorType& out = c.outputs.at(0);
    ElementType ct = ComputeType(out.dtype);
    // Dynamic dims: the gradient's padding zeroed, its indices (into the
    // real plane) moved into the bucket's plane.
    const std::vector<Value> runtime = RuntimeSpatialSizes(b, a.at(1).tensor, n);
    Value g = StaticFilled(b, a.at(0).tensor, 0), self = a.at(1).tensor;  // self: its shape only
    Value ind = StaticFilled(b, a.at(index_arg).tensor, 0);
    const bool moved = std::any_of(runtime.begin(), runtime.end(), [](const Value& v) { return v.valid(); });
    if (moved) ind = ToBucketPlane(b, b.Convert(ind, ElementType::I64), self.shape(), n, runtime);
    int64_t lead = self.rank() - n;
    std::vector<int64_t> lead_shape(self.shape().begin(), self.shape().begin() + lead);
    int64_t batch = Prod(lead_shape);
    int64_t li = Prod(self.shape(), lead), lo = Prod(g.shape(), lead);
    if (out.numel() == 0 || g.type.numel() == 0)
      return std::vector<Value>{b.Splat(out.dtype, 0, out.shape)};
    Value gi = CheckedIndex(c, b.Reshape(ind, {batch * lo, 1}), li, false,
                            "max_pool_backward");
    Value bi = b.Reshape(b.Iota(TensorType{ElementType::I64, {batch, lo}}, 0), {batch * lo, 1});
    Value indices = b.Concatenate({bi, gi}, 1);
    Value updates = b.Reshape(b.Convert(g, ct), {batch * lo});
    Value r = b.Scatter(b.Splat(ct, 0, {batch, li}), indices, updates, {0, 1}, "add");
    return std::vector<Value>{b.Convert(b.Reshape(r, out.shape), out.dtype)};
  };
}

// ---------------------------------------------------------------- adaptive max pool

// max over the taps of `m` along `dim` of (x, idx), with the index of the
// maximum (MaxAndIndex); invalid taps never win.
std::pair<Value, Value> MaxApply(Builder& b, Value x, Value idx, int64_t dim, const Map& m) {
  std::vector<int64_t> others;
  for (int64_t i = 0; i < x.rank(); ++i)
    if (i != dim) others.push_back(x.shape()[i]);
  Value taps = b.Reshape(ConstIndex(b, m.idx), {m.taps * m.out, 1});
  std::vector<int64_t> tshape{m.taps, m.out};
  tshape.insert(tshape.end(), others.begin(), others.end());
  Value gx = b.Reshape(b.Gather(x, taps, {dim}), tshape);
  Value gi = b.Reshape(b.Gather(idx, taps, {dim}), tshape);
  Value lowest = b.MinValue(x.dtype()), last = b.ConstantInt(ElementType::I64, INT64_MAX);
  if (!m.valid.empty()) {
    Value ok = b.BroadcastInDim(b.Reshape(ConstBool(b, m.valid), {m.taps, m.out}), tshape, {0, 1});
    gx = b.Select(ok, gx, b.BroadcastInDim(lowest, tshape, {}));
    gi = b.Select(ok, gi, b.BroadcastInDim(last, tshape, {}));
  }
  auto r = b.ReduceN({gx, gi}, {lowest, last}, {0}, MaxAndIndex);
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < x.rank(); ++i) perm.push_back(i < dim ? i + 1 : (i == dim ? 0 : i));
  return {b.Transpose(r[0], perm), b.Transpose(r[1], perm)};
}

// adaptive_max_poolNd(self, output_size) -> (values, indices): the bins of
// adaptive average pooling, reduced one dim at a time (last dim first) with
// the flat plane index of each maximum carried along. Separable: the first
// maximum in row-major order wins ties, the last NaN wins NaNs, as CPU.
Rule AdaptiveMaxRule(int64_t n) {
  return [n](Context& c, const std::vector<Arg>& a) {
    Builder& b = c.b;
    const TensorType& out = c.outputs.at(0);
    Value x = a.at(0).tensor;
    if (!hlo::IsFloat(x.dtype())) throw Unsupported("integer adaptive_max_pool");
    if (out.numel() == 0 || x.type.numel() == 0)
      return std::vector<Value>{b.Splat(out.dtype, 0, out.shape),
                                b.Splat(ElementType::I64, 0, out.shape)};
    std::vector<int64_t> out_size = Expand(a.at(1).ints, n, 1);
    Value idx = PlaneIndex(b, x.shape(), n);
    int64_t first = x.rank() - n;
    for (int64_t j = n - 1; j >= 0; --j) {
      int64_t dim = first + j;
      std::tie(x, idx) = MaxApply(b, x, idx, dim, AdaptiveMap(x.shape()[dim], out_size[j]));
    }
    return std::vector<Value>{b.Convert(b.Reshape(x, out.shape), out.dtype),
                              b.Reshape(idx, c.outputs.at(1).shape)};
  };
}

// ---------------------------------------------------------------- fractional max pool

// The window starts along one dim of size `in` for every plane: [N, C, out]
// i64, from the plane's sample u in [0, 1) (the sample's dtype t), as
// PyTorch's generate_intervals: start_i = int((i + u) * alpha) - int(u *
// alpha) with alpha = (in - pool) / (out - 1), in t's arithmetic; the last
// window ends at the input's end.
Value FractionalStarts(Builder& b, Value u, int64_t in, int64_t out, int64_t pool) {
  std::vector<int64_t> shape = u.shape();  // [N, C]
  std::vector<int64_t> oshape{shape[0], shape[1], out};
  ElementType t = u.dtype();
  Value last = b.Splat(ElementType::I64, static_cast<double>(in - pool), oshape);
  if (out <= 1) return last;
  Value alpha = b.Binary("divide", b.Constant(t, static_cast<double>(in - pool)),
                         b.Constant(t, static_cast<double>(out - 1)));
  Value ub = b.BroadcastInDim(u, oshape, {0, 1});
  Value ab = b.BroadcastInDim(alpha, oshape, {});
  Value i = b.Convert(b.Iota(TensorType{ElementType::I64, oshape}, 2), t);
  Value hi = b.Convert(b.Binary("multiply", b.Binary("add", i, ub), ab), ElementType::I64);
  Value lo = b.Convert(b.Binary("multiply", ub, ab), ElementType::I64);
  Value starts = b.Binary("subtract", hi, lo);
  Value is_last = b.Compare("EQ", b.Iota(TensorType{ElementType::I64, oshape}, 2),
                            b.Splat(ElementType::I64, static_cast<double>(out - 1), oshape));
  return b.Select(is_last, last, starts);
}

// Max (with its index) over the windows [start, start + pool) along the
// last dim of (x, idx) [N, C, R, L]; starts [N, C, O]. Result [N, C, R, O].
std::pair<Value, Value> WindowMax(Builder& b, Value x, Value idx, Value starts, int64_t pool) {
  std::vector<int64_t> s = x.shape();
  int64_t o = starts.shape()[2];
  std::vector<int64_t> taps{s[0], s[1], s[2], o, pool};
  Value pos = b.Binary("add", b.BroadcastInDim(starts, taps, {0, 1, 3}),
                       b.Iota(TensorType{ElementType::I64, taps}, 4));
  pos = b.Clamp(b.ConstantInt(ElementType::I64, 0), pos, b.ConstantInt(ElementType::I64, s[3] - 1));
  Value coords = Coordinates(b, b.Reshape(pos, {s[0], s[1], s[2], o * pool}), 3);
  Value gx = b.Reshape(b.Gather(x, coords, {0, 1, 2, 3}), taps);
  Value gi = b.Reshape(b.Gather(idx, coords, {0, 1, 2, 3}), taps);
  auto r = b.ReduceN({gx, gi}, {b.MinValue(x.dtype()), b.ConstantInt(ElementType::I64, INT64_MAX)},
                     {4}, MaxAndIndex);
  return {r[0], r[1]};
}

// fractional_max_pool2d(self, kernel_size, output_size, random_samples
//   [N, C, 2]) -> (values, indices): windows of kernel_size starting at
// FractionalStarts (sample 0 for the width, 1 for the height), reduced one
// dim at a time (width first) under max pooling's order.
std::vector<Value> FractionalMaxPool2d(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = c.outputs.at(0);
  Value x = a.at(0).tensor, samples = a.at(3).tensor;
  if (!hlo::IsFloat(x.dtype())) throw Unsupported("integer fractional_max_pool2d");
  if (out.numel() == 0 || x.type.numel() == 0)
    return {b.Splat(out.dtype, 0, out.shape), b.Splat(ElementType::I64, 0, out.shape)};
  if (x.rank() == 3) x = b.Reshape(x, {1, x.shape()[0], x.shape()[1], x.shape()[2]});
  std::vector<int64_t> k = Expand(a.at(1).ints, 2, 1), o = Expand(a.at(2).ints, 2, 1);
  int64_t n = x.shape()[0], ch = x.shape()[1], h = x.shape()[2], w = x.shape()[3];
  Value u = b.Reshape(samples, {n, ch, 2});
  auto sample = [&](int64_t j) {
    return b.Reshape(b.Slice(u, {0, 0, j}, {n, ch, j + 1}, {1, 1, 1}), {n, ch});
  };
  Value idx = PlaneIndex(b, x.shape(), 2);
  auto [vw, iw] = WindowMax(b, x, idx, FractionalStarts(b, sample(0), w, o[1], k[1]), k[1]);
  // [N, C, H, OW] -> [N, C, OW, H]: the height windows along the last dim
  std::vector<int64_t> swap{0, 1, 3, 2};
  auto [vh, ih] = WindowMax(b, b.Transpose(vw, swap), b.Transpose(iw, swap),
                            FractionalStarts(b, sample(1), h, o[0], k[0]), k[0]);
  return {b.Convert(b.Reshape(b.Transpose(vh, swap), out.shape), out.dtype),
          b.Reshape(b.Transpose(ih, swap), c.outputs.at(1).shape)};
}

// The avg-pool divisor over the output's trailing n dims, broadcast to the
// output shape (compute type).
Value AvgDivisor(Builder& b, const Value& x, const std::vector<int64_t>& out_shape, int64_t n,
                 const PoolArgs& pa, bool count_include_pad, const Arg& divisor_override,
                 ElementType ct) {
  if (divisor_override.kind == K::Int)
    return b.Splat(ct, static_cast<double>(divisor_override.i), out_shape);
  int64_t lead = x.rank() - n;
  std::vector<int64_t> ones_shape, window, strides, dil, lo, hi, sp_out;
  for (int64_t j = 0; j < n; ++j) {
    int64_t in = x.shape()[lead + j], o = out_shape[lead + j];
    int64_t need = (o - 1) * pa.s[j] + pa.k[j] - in - pa.p[j];
    sp_out.push_back(o);
    window.push_back(pa.k[j]);
    strides.push_back(pa.s[j]);
    dil.push_back(1);
    if (count_include_pad) {  // windows clipped to [-p, in + p)
      ones_shape.push_back(in + 2 * pa.p[j]);
      lo.push_back(0);
      hi.push_back(std::max<int64_t>(need - pa.p[j], 0));
    } else {  // windows clipped to the input
      ones_shape.push_back(in);
      lo.push_back(pa.p[j]);
      hi.push_back(std::max<int64_t>(need, 0));
    }
  }
  Value ones = b.Splat(ct, 1, ones_shape);
  Value cnt = ReduceWindow(b, {ones}, {b.Constant(ct, 0)}, window, strides, dil, lo, hi,
                           [](Builder& rb, const std::vector<Value>& v) {
                             return std::vector<Value>{rb.Binary("add", v[0], v[1])};
                           })[0];
  cnt = SliceTo(b, cnt, sp_out);
  std::vector<int64_t> dims;
  for (int64_t j = 0; j < n; ++j) dims.push_back(lead + j);
  return b.BroadcastInDim(cnt, out_shape, dims);
}

// avg_poolNd(self, kernel_size, stride, padding, ceil_mode, count_include_pad,
//   divisor_override)
Rule AvgPoolRule(int64_t n) {
  return [n](Context& c, const std::vector<Arg>& a) {
    Builder& b = c.b;
    const TensorType& out = c.outputs.at(0);
    if (!hlo::IsFloat(out.dtype)) throw Unsupported("integer avg pooling");
    if (out.numel() == 0) return std::vector<Value>{b.Splat(out.dtype, 0, out.shape)};
    ElementType ct = ComputeType(out.dtype);
    // Dynamic spatial dims (AvgPoolSpatial): static at the bucket on zero-filled padding.
    Value x = b.Convert(StaticFilled(b, a.at(0).tensor, 0), ct);
    PoolArgs pa = ReadPoolArgs(a, 1, n, false);
    Window w = PoolWindow(x, out.shape, n, pa.k, pa.s, pa.p, pa.d);
    Value sum = ReduceWindow(b, {x}, {b.Constant(ct, 0)}, w.window, w.strides, w.dilations,
                             w.lo, w.hi, [](Builder& rb, const std::vector<Value>& v) {
                               return std::vector<Value>{rb.Binary("add", v[0], v[1])};
                             })[0];
    sum = SliceTo(b, sum, out.shape);
    Value div = AvgDivisor(b, x, out.shape, n, pa, a.at(5).i != 0, a.at(6), ct);
    return std::vector<Value>{b.Convert(b.Binary("divide", sum, div), out.dtype)};
  };
}

// avg_poolNd_backward(grad_output, self, kernel_size, stride, padding,
//   ceil_mode, count_include_pad, divisor_override): the adjoint of the
// windowed sum is a stride-1 windowed sum over the dilated, padded grad.
Rule AvgPoolBackwardRule(int64_t n) {
  return [n](Context& c, const std::vector<Arg>& a) {
    Builder& b = c.b;
    const TensorType& out = c.outputs.at(0);
    if (!hlo::IsFloat(out.dtype)) throw Unsupported("integer avg pooling");
    ElementType ct = ComputeType(out.dtype);
    Value g = b.Convert(StaticFilled(b, a.at(0).tensor, 0), ct), self = a.at(1).tensor;
    if (out.numel() == 0 || g.type.numel() == 0)
      return std::vector<Value>{b.Splat(out.dtype, 0, out.shape)};
    PoolArgs pa = ReadPoolArgs(a, 2, n, false);
    Value div = AvgDivisor(b, self, g.shape(), n, pa, a.at(6).i != 0, a.at(7), ct);
    g = b.Binary("divide", g, div);
    int64_t lead = self.rank() - n;
    std::vector<int64_t> lo(self.rank(), 0), hi(self.rank(), 0), interior(self.rank(), 0);
    std::vector<int64_t> window(self.rank(), 1), ones(self.rank(), 1);
    for (int64_t j = 0; j < n; ++j) {
      int64_t i = lead + j, in = self.shape()[i], o = g.shape()[i];
      int64_t before = pa.k[j] - 1 - pa.p[j];
      lo[i] = before;
      hi[i] = in + pa.k[j] - 1 - ((o - 1) * pa.s[j] + 1) - before;
      interior[i] = pa.s[j] - 1;
      window[i] = pa.k[j];
    }
    Value padded = b.Pad(g, b.Constant(ct, 0), lo, hi, interior);
    std::vector<int64_t> zeros(self.rank(), 0);
    Value r = ReduceWindow(b, {padded}, {b.Constant(ct, 0)}, window, ones, ones, zeros, zeros,
                           [](Builder& rb, const std::vector<Value>& v) {
                             return std::vector<Value>{rb.Binary("add", v[0], v[1])};
                           })[0];
    return std::vector<Value>{b.Convert(b.Reshape(r, out.shape), out.dtype)};
  };
}

// Bounded dynamic shapes: a pooling (or an upsampling) windows its spatial
// dims and keeps its leading (batch) dims apart, so those may be dynamic (a
// ragged last batch); the channel and spatial dims of tensor args `args`
// stay static.
StaticDimsRule BatchOnly(std::vector<size_t> args, int64_t n) {
  return [args, n](const std::vector<Arg>&, StaticDims& s) {
    for (size_t a : args) s.Last(a, static_cast<size_t>(n) + 1);
    s.Because("the channel and spatial dims of a pooling or upsampling are static");
  };
}

// Whether a call's int args are the values its size ints give (its scales
// given): a nearest upsampling's sizes then follow its scales.
bool SizeIntsHold(const std::vector<SizeInt>& ints, const std::vector<Arg>& a) {
  for (const SizeInt& s : ints) {
    if (s.arg >= a.size() || s.tensor_arg >= a.size() || a[s.tensor_arg].kind != Arg::Kind::Tensor) return false;
    double scale = 1.0;
    if (s.scale_arg >= 0) {
      if (static_cast<size_t>(s.scale_arg) >= a.size() || a[s.scale_arg].kind != Arg::Kind::Double ||
          a[s.scale_arg].d <= 0)
        return false;
      scale = a[s.scale_arg].d;
    }
    const std::vector<int64_t>& ints_arg = a[s.arg].ints;
    const int64_t value = s.element < 0 ? a[s.arg].i
                          : static_cast<size_t>(s.element) < ints_arg.size() ? ints_arg[s.element] : -1;
    if (s.Of(a[s.tensor_arg].tensor.shape(), scale) != value) return false;
  }
  return true;
}

// The channel dim (the one before the n spatial ones) of tensor args `args`
// kept static: a window op that runs static at the bucket on filled padding.
void KeepChannels(const std::vector<size_t>& args, int64_t n, StaticDims& s) {
  for (size_t arg : args) {
    const size_t rank = s.Rank(arg);
    if (rank > static_cast<size_t>(n)) s.Dim(arg, rank - static_cast<size_t>(n) - 1);
  }
}

// A nearest upsampling (or its backward, `size_ints` its) whose sizes follow
// its scales (SizeIntsHold) runs dynamic in space too; otherwise in its batch.
StaticDimsRule NearestSpatial(std::vector<size_t> args, int64_t n, std::vector<SizeInt> size_ints) {
  return [args, n, size_ints](const std::vector<Arg>& a, StaticDims& s) {
    if (!SizeIntsHold(size_ints, a)) return BatchOnly(args, n)(a, s);
    KeepChannels(args, n, s);
    s.Because("an upsampling's channel dim is static");
  };
}

// A nearest upsampling (or its backward) with its scales given (an
// interpolate(scale_factor=...)) maps output element o to input element
// floor(o / scale) (nearest-exact: of o + 0.5) whatever the sizes, and no
// real output element reads past the real input: its spatial dims may be
// dynamic too, its output_size (and the backward's input_size) being
// SizeInts keyed without their values (the backward zeroes its gradient's
// padding). With an output_size alone (the map depends on the ratio of the
// sizes) they stay static, as its channels do.
void NearestUpsample(const std::string& name, Rule rule, int64_t n) {
  std::vector<SizeInt> size_ints;
  for (int64_t j = 0; j < n; ++j) size_ints.push_back({1, 0, static_cast<size_t>(2 + j), 3 + j, j, 2 + j});
  Register(name, std::move(rule)).Dynamic(NearestSpatial({0}, n, size_ints)).dynamic.size_ints = size_ints;
}

// Max pooling (and its backward) runs static at the bucket on -inf padding,
// its indices counted in the real plane: dynamic in batch and spatial dims,
// the channel dim of tensor args `args` static.
StaticDimsRule ChannelsOnly(std::vector<size_t> args, int64_t n) {
  return [args, n](const std::vector<Arg>&, StaticDims& s) {
    KeepChannels(args, n, s);
    s.Because("a max pooling's channel dim is static");
  };
}

// An average pooling whose real windows divide alike at any larger size:
// a divisor override, or windows never clipped at the end (no ceil_mode;
// count_include_pad or no padding). It runs static at the bucket on
// zero-filled padding: dynamic in batch and spatial dims, the channel dim of
// tensor args `args` static; otherwise (a window clipped by the real size)
// its spatial dims stay static. `first`: the index of its kernel_size arg.
StaticDimsRule AvgPoolSpatial(std::vector<size_t> args, size_t first, int64_t n) {
  return [args, first, n](const std::vector<Arg>& a, StaticDims& s) {
    const Arg& padding = a.at(first + 2);
    const bool ceil_mode = a.at(first + 3).i != 0, include_pad = a.at(first + 4).i != 0;
    const bool no_padding = std::all_of(padding.ints.begin(), padding.ints.end(), [](int64_t p) { return p == 0; });
    if (a.at(first + 5).kind != K::Int && (ceil_mode || (!include_pad && !no_padding)))
      return BatchOnly(args, n)(a, s);
    KeepChannels(args, n, s);
    s.Because("an average pooling's channel dim is static");
  };
}

// An adaptive average pooling to one element per channel (a CNN's global
// pooling) is a mean over the spatial dims: those may be dynamic; to other
// sizes its bins depend on the input's sizes (spatial dims static).
// `backward`: (grad_output [.., 1, 1], self).
StaticDimsRule GlobalPoolingOnly(int64_t n, bool backward) {
  return [n, backward](const std::vector<Arg>& a, StaticDims& s) {
    bool global = true;
    if (backward) {
      const auto& g = a.at(0).tensor.shape();
      for (int64_t j = 0; j < n && j < static_cast<int64_t>(g.size()); ++j) global &= g[g.size() - 1 - j] == 1;
    } else {
      for (int64_t o : a.at(1).ints) global &= o == 1;
    }
    const std::vector<size_t> args = backward ? std::vector<size_t>{0, 1} : std::vector<size_t>{0};
    if (!global) return BatchOnly(args, n)(a, s);
    KeepChannels(args, n, s);
    s.Because("an adaptive average pooling's channel dim is static");
  };
}

// upsample_*_backward(grad_output, output_size, input_size, ...): dynamic in
// the batch like the forward; input_size's batch is read off grad_output.
void UpsampleBackward(const std::string& name, Rule rule, int64_t n) {
  RuleEntry& e = Register(name, std::move(rule)).Dynamic(BatchOnly({0}, n));
  e.dynamic.size_ints = {{2, 0, 0, 1, 0}};
}

// A nearest upsampling's backward (grad_output, output_size, input_size,
// scales...): as the forward (NearestUpsample), output_size[j] the
// gradient's size and input_size[2 + j] floor(it / scales[j]).
void NearestUpsampleBackward(const std::string& name, Rule rule, int64_t n) {
  std::vector<SizeInt> size_ints{{2, 0, 0, 1, 0}};
  for (int64_t j = 0; j < n; ++j) {
    const size_t dim = static_cast<size_t>(2 + j);
    size_ints.push_back({1, 0, dim, 3 + j, j});
    size_ints.push_back({2, 0, dim, 3 + j, 2 + j, 3 + j, true});
  }
  // Dynamic in space when all of them hold (the batch one always does).
  std::vector<SizeInt> spatial(size_ints.begin() + 1, size_ints.end());
  Register(name, std::move(rule)).Dynamic(NearestSpatial({0}, n, spatial)).dynamic.size_ints = size_ints;
}

const bool registered = [] {
  for (int64_t n : {2, 3}) {
    std::string d = std::to_string(n) + "d";
    // (self, ...); backward: (grad_output, self, ..., indices)
    Register("max_pool" + d + "_with_indices", MaxPoolRule(n)).Dynamic(ChannelsOnly({0}, n)).dynamic.stepped_outputs = true;
    Register("max_pool" + d + "_with_indices_backward", MaxPoolBackwardRule(n))
        .Dynamic(ChannelsOnly({0, 1, 7}, n)).dynamic.result_like_arg = 1;
    Register("avg_pool" + d, AvgPoolRule(n)).Dynamic(AvgPoolSpatial({0}, 1, n)).dynamic.stepped_outputs = true;
    Register("avg_pool" + d + "_backward", AvgPoolBackwardRule(n))
        .Dynamic(AvgPoolSpatial({0, 1}, 2, n)).dynamic.result_like_arg = 1;
    Register("_adaptive_avg_pool" + d, AdaptiveAvgRule(n, false)).Dynamic(GlobalPoolingOnly(n, false));
    Register("_adaptive_avg_pool" + d + "_backward", AdaptiveAvgRule(n, true)).Dynamic(GlobalPoolingOnly(n, true));
  }
  Register("adaptive_max_pool2d", AdaptiveMaxRule(2), {"adaptive_max_pool2d.out"});
  Register("adaptive_max_pool3d", AdaptiveMaxRule(3), {"adaptive_max_pool3d.out"});
  Register("fractional_max_pool2d", FractionalMaxPool2d, {"fractional_max_pool2d.output"});
  Register("fractional_max_pool2d_backward", MaxPoolBackwardRule(2, 4),
           {"fractional_max_pool2d_backward.grad_input"});
  Register("adaptive_max_pool2d_backward", MaxPoolBackwardRule(2, 2),
           {"adaptive_max_pool2d_backward.grad_input"});
  Register("adaptive_max_pool3d_backward", MaxPoolBackwardRule(3, 2),
           {"adaptive_max_pool3d_backward.grad_input"});

  for (const char* d : {"1d", "2d", "3d"}) {
    std::string s(d);
    Register("reflection_pad" + s, PadRule(true, false)).Dynamic(PaddedDimsStatic(false));
    Register("reflection_pad" + s + "_backward", PadRule(true, true)).Dynamic(PaddedDimsStatic(true));
    Register("replication_pad" + s, PadRule(false, false)).Dynamic(PaddedDimsStatic(false));
    Register("replication_pad" + s + "_backward", PadRule(false, true)).Dynamic(PaddedDimsStatic(true));
  }
  for (int64_t n = 1; n <= 3; ++n) {
    std::string s = std::to_string(n) + "d";
    NearestUpsample("upsample_nearest" + s, UpsampleRule(Mode::Nearest, n, false), n);
    NearestUpsampleBackward("upsample_nearest" + s + "_backward", UpsampleRule(Mode::Nearest, n, true), n);
    NearestUpsample("_upsample_nearest_exact" + s, UpsampleRule(Mode::NearestExact, n, false), n);
    NearestUpsampleBackward("_upsample_nearest_exact" + s + "_backward", UpsampleRule(Mode::NearestExact, n, true), n);
  }
  Register("upsample_linear1d", UpsampleRule(Mode::Linear, 1, false)).Dynamic(BatchOnly({0}, 1));
  UpsampleBackward("upsample_linear1d_backward", UpsampleRule(Mode::Linear, 1, true), 1);
  Register("upsample_bilinear2d", UpsampleRule(Mode::Linear, 2, false)).Dynamic(BatchOnly({0}, 2));
  UpsampleBackward("upsample_bilinear2d_backward", UpsampleRule(Mode::Linear, 2, true), 2);
  Register("upsample_trilinear3d", UpsampleRule(Mode::Linear, 3, false)).Dynamic(BatchOnly({0}, 3));
  UpsampleBackward("upsample_trilinear3d_backward", UpsampleRule(Mode::Linear, 3, true), 3);
  Register("upsample_bicubic2d", UpsampleRule(Mode::Cubic, 2, false)).Dynamic(BatchOnly({0}, 2));
  UpsampleBackward("upsample_bicubic2d_backward", UpsampleRule(Mode::Cubic, 2, true), 2);
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
