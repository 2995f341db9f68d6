// grid_sampler_2d(input [N,C,H,W], grid [N,Ho,Wo,2], interpolation_mode,
// padding_mode, align_corners) and its backward, as PyTorch's kernels
// (GridSampler.h): grid values in [-1, 1] are unnormalized to pixel
// coordinates (align_corners: -1 and 1 are the corner pixels' centres, else
// their outer edges), then padded (zeros: out-of-image taps read 0; border:
// clipped to the image; reflection: reflected at the image's edges, then
// clipped). Bilinear mixes the 4 neighbours, nearest takes the nearest one
// (ties to even, as nearbyint). Bicubic goes through the CPU fallback.
//
// Taps are gathered from the input seen as rows [N*H*W, C]; the backward
// scatter-adds grad_output's weighted rows into the same layout and
// differentiates the bilinear weights for grad_grid (0 for nearest, as
// PyTorch). Arithmetic runs in the compute type (f32 for 16-bit floats).
#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

enum Interpolation { kBilinear = 0, kNearest = 1 };
enum Padding { kZeros = 0, kBorder = 1, kReflection = 2 };

// Elementwise helpers over one shape and element type.
struct Ew {
  Builder& b;
  ElementType t;
  std::vector<int64_t> shape;
  Value K(double v) const { return b.Splat(t, v, shape); }
  Value Add(Value x, Value y) const { return b.Binary("add", x, y); }
  Value Sub(Value x, Value y) const { return b.Binary("subtract", x, y); }
  Value Mul(Value x, Value y) const { return b.Binary("multiply", x, y); }
  Value Div(Value x, Value y) const { return b.Binary("divide", x, y); }
  Value Lt(Value x, Value y) const { return b.Compare("LT", x, y); }
  Value And(Value x, Value y) const { return b.Binary("and", x, y); }
};

// A source coordinate along one axis and d(coordinate)/d(grid value).
struct Source {
  Value coord;
  Value mult;
};

// clip_coordinates_set_grad: clipped to [0, size-1]; the gradient is 0 on
// and beyond the borders.
Source Clip(const Ew& e, Source s, int64_t size) {
  Value hi = e.K(static_cast<double>(size - 1));
  Value inside = e.And(e.Lt(e.K(0), s.coord), e.Lt(s.coord, hi));
  return {e.b.Clamp(e.K(0), s.coord, hi), e.b.Select(inside, s.mult, e.K(0))};
}

// reflect_coordinates_set_grad over [twice_low/2, twice_high/2].
Source Reflect(const Ew& e, Source s, int64_t twice_low, int64_t twice_high) {
  if (twice_low == twice_high) return {e.K(0), e.K(0)};
  double lo = twice_low / 2.0, span = (twice_high - twice_low) / 2.0;
  Value in = e.Sub(s.coord, e.K(lo));
  Value sign = e.b.Select(e.Lt(in, e.K(0)), e.K(-1), e.K(1));
  in = e.b.Abs(in);
  Value extra = e.b.Binary("remainder", in, e.K(span));
  Value flips = e.b.Unary("floor", e.Div(in, e.K(span)));
  Value even = e.b.Compare("EQ", e.b.Binary("remainder", flips, e.K(2)), e.K(0));
  Value coord = e.b.Select(even, e.Add(extra, e.K(lo)), e.Add(e.Sub(e.K(span), extra), e.K(lo)));
  Value mult = e.Mul(s.mult, e.b.Select(even, sign, e.b.Unary("negate", sign)));
  return {coord, mult};
}

// grid_sampler_compute_source_index_set_grad.
Source SourceIndex(const Ew& e, Value g, int64_t size, int64_t padding, bool align) {
  Value one = e.K(1);
  Source s;
  if (align) {
    s = {e.Mul(e.Div(e.Add(g, one), e.K(2)), e.K(static_cast<double>(size - 1))),
         e.K((size - 1) / 2.0)};
  } else {
    s = {e.Div(e.Sub(e.Mul(e.Add(g, one), e.K(static_cast<double>(size))), one), e.K(2)),
         e.K(size / 2.0)};
  }
  if (padding == kBorder) return Clip(e, s, size);
  if (padding == kReflection) {
    s = align ? Reflect(e, s, 0, 2 * (size - 1)) : Reflect(e, s, -1, 2 * size - 1);
    return Clip(e, s, size);
  }
  return s;
}

// One tap: the row index into [N*H*W, C] (clamped into range) and whether
// the pixel is inside the image.
struct Tap {
  Value row;    // i64 [N, Ho, Wo, 1]
  Value valid;  // i1 [N, Ho, Wo]
};

struct Geometry {
  int64_t n, c, h, w, ho, wo;
};

Tap MakeTap(const Ew& e, const Geometry& g, Value x, Value y) {
  Builder& b = e.b;
  Value valid = e.And(e.And(b.Compare("GE", x, e.K(0)), e.Lt(x, e.K(static_cast<double>(g.w)))),
                      e.And(b.Compare("GE", y, e.K(0)), e.Lt(y, e.K(static_cast<double>(g.h)))));
  auto index = [&](Value v, int64_t size) {
    return b.Convert(b.Clamp(e.K(0), v, e.K(static_cast<double>(size - 1))), ElementType::I64);
  };
  std::vector<int64_t> shape = e.shape;
  Value batch = b.Iota(TensorType{ElementType::I64, shape}, 0);
  auto mul = [&](Value v, int64_t k) { return b.Binary("multiply", v, b.Splat(ElementType::I64, k, shape)); };
  Value row = b.Binary("add", b.Binary("add", mul(batch, g.h * g.w), mul(index(y, g.h), g.w)),
                       index(x, g.w));
  shape.push_back(1);
  return {b.Reshape(row, shape), valid};
}

// The tap's input rows [N, Ho, Wo, C], 0 outside the image.
Value Read(Builder& b, const Geometry& g, Value rows, const Tap& tap) {
  std::vector<int64_t> shape{g.n, g.ho, g.wo, g.c};
  Value v = b.Gather(rows, tap.row, {0});
  Value valid = b.BroadcastInDim(tap.valid, shape, {0, 1, 2});
  return b.Select(valid, v, b.Splat(v.dtype(), 0, shape));
}

// The taps of one sample point and their weights ([N, Ho, Wo] each).
struct Taps {
  std::vector<Tap> taps;
  std::vector<Value> weights;
  Source sx, sy;
  Value x0, y0;  // the north-west tap (bilinear)
};

Taps MakeTaps(const Ew& e, const Geometry& g, Value grid, int64_t mode, int64_t padding, bool align) {
  Builder& b = e.b;
  auto part = [&](int64_t k) {
    return b.Reshape(b.Slice(grid, {0, 0, 0, k}, {g.n, g.ho, g.wo, k + 1}, {1, 1, 1, 1}), e.shape);
  };
  Taps t;
  t.sx = SourceIndex(e, part(0), g.w, padding, align);
  t.sy = SourceIndex(e, part(1), g.h, padding, align);
  if (mode == kNearest) {
    Value x = b.Unary("round_nearest_even", t.sx.coord), y = b.Unary("round_nearest_even", t.sy.coord);
    t.taps = {MakeTap(e, g, x, y)};
    t.weights = {e.K(1)};
    return t;
  }
  t.x0 = b.Unary("floor", t.sx.coord);
  t.y0 = b.Unary("floor", t.sy.coord);
  Value x1 = e.Add(t.x0, e.K(1)), y1 = e.Add(t.y0, e.K(1));
  Value wx1 = e.Sub(t.sx.coord, t.x0), wx0 = e.Sub(x1, t.sx.coord);
  Value wy1 = e.Sub(t.sy.coord, t.y0), wy0 = e.Sub(y1, t.sy.coord);
  // nw, ne, sw, se
  t.taps = {MakeTap(e, g, t.x0, t.y0), MakeTap(e, g, x1, t.y0), MakeTap(e, g, t.x0, y1),
            MakeTap(e, g, x1, y1)};
  t.weights = {e.Mul(wx0, wy0), e.Mul(wx1, wy0), e.Mul(wx0, wy1), e.Mul(wx1, wy1)};
  return t;
}

struct Prepared {
  Geometry g;
  Ew e;
  Taps taps;
};

Prepared Prepare(Context& c, Value input, Value grid, const std::vector<Arg>& a, size_t mode_arg) {
  int64_t mode = a.at(mode_arg).i, padding = a.at(mode_arg + 1).i;
  bool align = a.at(mode_arg + 2).i != 0;
  if (mode != kBilinear && mode != kNearest)
    throw Unsupported("grid_sampler_2d: bicubic interpolation (CPU fallback)");
  if (input.rank() != 4 || grid.rank() != 4 || grid.shape()[3] != 2 ||
      grid.shape()[0] != input.shape()[0])
    throw std::invalid_argument("grid_sampler_2d: expected input [N,C,H,W] and grid [N,Ho,Wo,2]");
  const auto& s = input.shape();
  Geometry g{s[0], s[1], s[2], s[3], grid.shape()[1], grid.shape()[2]};
  ElementType ct = ComputeType(grid.dtype());
  Ew e{c.b, ct, {g.n, g.ho, g.wo}};
  Taps taps = MakeTaps(e, g, c.b.Convert(grid, ct), mode, padding, align);
  return {g, e, taps};
}

// The input as rows [N*H*W, C] of type t.
Value Rows(Builder& b, const Geometry& g, Value input, ElementType t) {
  Value nhwc = b.Transpose(b.Convert(input, t), {0, 2, 3, 1});
  return b.Reshape(nhwc, {g.n * g.h * g.w, g.c});
}

Value Bcast(Builder& b, const Geometry& g, Value v) {
  return b.BroadcastInDim(v, {g.n, g.ho, g.wo, g.c}, {0, 1, 2});
}

std::vector<Value> GridSampler(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  Value input = a.at(0).tensor, grid = a.at(1).tensor;
  if (out.numel() == 0) return One(Zeros(b, out));
  if (input.type.numel() == 0) return One(Zeros(b, out));
  Prepared p = Prepare(c, input, grid, a, 2);
  Value rows = Rows(b, p.g, input, p.e.t);
  Value sum;
  for (size_t k = 0; k < p.taps.taps.size(); ++k) {
    Value term = Read(b, p.g, rows, p.taps.taps[k]);
    if (p.taps.taps.size() > 1) term = b.Binary("multiply", term, Bcast(b, p.g, p.taps.weights[k]));
    sum = k == 0 ? term : b.Binary("add", sum, term);
  }
  return One(b.Convert(b.Transpose(sum, {0, 3, 1, 2}), out.dtype));
}

// d(output)/d(source x, source y) summed over channels with grad_output.
std::pair<Value, Value> BilinearGridGrad(Builder& b, const Prepared& p, Value rows, Value go) {
  const Ew& e = p.e;
  const Taps& t = p.taps;
  std::vector<Value> v;
  for (const Tap& tap : t.taps) v.push_back(Read(b, p.g, rows, tap));
  Value wx1 = e.Sub(t.sx.coord, t.x0), wx0 = e.Sub(e.K(1), wx1);
  Value wy1 = e.Sub(t.sy.coord, t.y0), wy0 = e.Sub(e.K(1), wy1);
  auto mix = [&](Value s0, Value d0, Value s1, Value d1) {  // (d0 - s0) * w0 + (d1 - s1) * w1
    return std::pair{b.Binary("subtract", d0, s0), b.Binary("subtract", d1, s1)};
  };
  auto [dx0, dx1] = mix(v[0], v[1], v[2], v[3]);  // ne - nw, se - sw
  auto [dy0, dy1] = mix(v[0], v[2], v[1], v[3]);  // sw - nw, se - ne
  auto weighted = [&](Value d0, Value w0, Value d1, Value w1) {
    Value s = b.Binary("add", b.Binary("multiply", d0, Bcast(b, p.g, w0)),
                       b.Binary("multiply", d1, Bcast(b, p.g, w1)));
    Value zero = b.Constant(e.t, 0);
    return b.Reduce(b.Binary("multiply", s, go), zero, {3}, "add");
  };
  Value gx = e.Mul(weighted(dx0, wy0, dx1, wy1), t.sx.mult);
  Value gy = e.Mul(weighted(dy0, wx0, dy1, wx1), t.sy.mult);
  return {gx, gy};
}

// The input gradient: grad_output's weighted rows scatter-added at the taps.
Value InputGrad(Builder& b, const Prepared& p, Value go) {
  const Geometry& g = p.g;
  Value acc = b.Splat(p.e.t, 0, {g.n * g.h * g.w, g.c});
  for (size_t k = 0; k < p.taps.taps.size(); ++k) {
    const Tap& tap = p.taps.taps[k];
    Value upd = p.taps.taps.size() > 1 ? b.Binary("multiply", go, Bcast(b, g, p.taps.weights[k])) : go;
    upd = b.Select(Bcast(b, g, tap.valid), upd, b.Splat(p.e.t, 0, {g.n, g.ho, g.wo, g.c}));
    acc = b.Scatter(acc, tap.row, upd, {0}, "add");
  }
  return b.Transpose(b.Reshape(acc, {g.n, g.h, g.w, g.c}), {0, 3, 1, 2});
}

// grid_sampler_2d_backward(grad_output, input, grid, interpolation_mode,
//   padding_mode, align_corners, output_mask) -> (grad_input, grad_grid).
// The dispatcher lists only the defined results (both when it cannot tell).
std::vector<Value> GridSamplerBackward(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value grad = a.at(0).tensor, input = a.at(1).tensor, grid = a.at(2).tensor;
  std::vector<int64_t> mask = a.at(6).ints;
  mask.resize(2, 1);
  bool all = c.outputs.size() == 2;
  bool want_input = all || mask[0], want_grid = all || mask[1];
  std::vector<Value> results;
  if (grad.type.numel() == 0 || input.type.numel() == 0) {
    for (const TensorType& t : c.outputs) results.push_back(Zeros(b, t));
    return results;
  }
  Prepared p = Prepare(c, input, grid, a, 3);
  const Geometry& g = p.g;
  Value go = b.Transpose(b.Convert(grad, p.e.t), {0, 2, 3, 1});  // [N, Ho, Wo, C]
  if (want_input) results.push_back(b.Convert(InputGrad(b, p, go), Out(c, 0).dtype));
  if (want_grid) {
    const TensorType& t = Out(c, results.size());
    Value ggrid = Zeros(b, t);
    if (a.at(3).i == kBilinear) {
      auto [gx, gy] = BilinearGridGrad(b, p, Rows(b, g, input, p.e.t), go);
      std::vector<int64_t> one{g.n, g.ho, g.wo, 1};
      ggrid = b.Convert(b.Concatenate({b.Reshape(gx, one), b.Reshape(gy, one)}, 3), t.dtype);
    }
    results.push_back(ggrid);
  }
  return results;
}

const bool registered = [] {
  Register("grid_sampler_2d", GridSampler);
  Register("grid_sampler_2d_backward", GridSamplerBackward);
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
