// im2col (nn.functional.unfold) and col2im (nn.functional.fold), each the
// other's backward. im2col(input [N,C,H,W] or [C,H,W], kernel_size,
// dilation, padding, stride) -> [N, C*kh*kw, oh*ow]: column c*kh*kw + i*kw + j
// holds the zero-padded input's pixels at (i*dh + y*sh, j*dw + x*sw), one
// strided slice per kernel tap. col2im(columns, output_size, kernel_size,
// dilation, padding, stride) sums each tap's [oh, ow] block back into the
// padded image (a pad with interior stride - 1 places it) and crops the
// padding, as PyTorch's kernels. Real and complex types.
#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

struct Window {
  int64_t kh, kw, dh, dw, ph, pw, sh, sw;
};

Window ReadWindow(const std::vector<Arg>& a, size_t first, const char* op) {
  auto pair = [&](size_t i) {
    const std::vector<int64_t>& v = a.at(i).ints;
    if (v.size() != 2) throw std::invalid_argument(std::string(op) + ": expected 2-element sizes");
    return v;
  };
  auto k = pair(first), d = pair(first + 1), p = pair(first + 2), s = pair(first + 3);
  return {k[0], k[1], d[0], d[1], p[0], p[1], s[0], s[1]};
}

// Output positions along one axis of size `size` (padded by `pad`).
int64_t Blocks(int64_t size, int64_t pad, int64_t k, int64_t d, int64_t s) {
  return (size + 2 * pad - (d * (k - 1) + 1)) / s + 1;
}

// im2col(self, kernel_size, dilation, padding, stride)
std::vector<Value> Im2Col(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  Value x = a.at(0).tensor;
  if (x.rank() == 3) x = b.Reshape(x, {1, x.shape()[0], x.shape()[1], x.shape()[2]});
  if (x.rank() != 4) throw std::invalid_argument("im2col: expected a 3-d or 4-d input");
  Window w = ReadWindow(a, 1, "im2col");
  int64_t n = x.shape()[0], ch = x.shape()[1], h = x.shape()[2], wd = x.shape()[3];
  int64_t oh = Blocks(h, w.ph, w.kh, w.dh, w.sh), ow = Blocks(wd, w.pw, w.kw, w.dw, w.sw);
  if (out.numel() == 0 || oh <= 0 || ow <= 0) return One(Zeros(b, out));
  Value xp = b.Pad(x, b.Constant(x.dtype(), 0), {0, 0, w.ph, w.pw}, {0, 0, w.ph, w.pw}, {0, 0, 0, 0});
  std::vector<Value> taps;
  for (int64_t i = 0; i < w.kh; ++i)
    for (int64_t j = 0; j < w.kw; ++j) {
      int64_t y0 = i * w.dh, x0 = j * w.dw;
      Value t = b.Slice(xp, {0, 0, y0, x0}, {n, ch, y0 + (oh - 1) * w.sh + 1, x0 + (ow - 1) * w.sw + 1},
                        {1, 1, w.sh, w.sw});
      taps.push_back(b.Reshape(t, {n, ch, 1, oh * ow}));
    }
  Value cols = taps.size() == 1 ? taps[0] : b.Concatenate(taps, 2);
  return One(b.Convert(b.Reshape(cols, out.shape), out.dtype));
}

// col2im(self, output_size, kernel_size, dilation, padding, stride)
std::vector<Value> Col2Im(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  Value x = a.at(0).tensor;
  if (x.rank() == 2) x = b.Reshape(x, {1, x.shape()[0], x.shape()[1]});
  if (x.rank() != 3) throw std::invalid_argument("col2im: expected a 2-d or 3-d input");
  const std::vector<int64_t>& size = a.at(1).ints;
  if (size.size() != 2) throw std::invalid_argument("col2im: expected a 2-element output_size");
  Window w = ReadWindow(a, 2, "col2im");
  int64_t h = size[0], wd = size[1], n = x.shape()[0];
  int64_t oh = Blocks(h, w.ph, w.kh, w.dh, w.sh), ow = Blocks(wd, w.pw, w.kw, w.dw, w.sw);
  int64_t ch = x.shape()[1] / (w.kh * w.kw);
  if (out.numel() == 0 || x.type.numel() == 0) return One(Zeros(b, out));
  ElementType ct = ComputeType(out.dtype);
  Value cols = b.Reshape(b.Convert(x, ct), {n, ch, w.kh * w.kw, oh, ow});
  int64_t hp = h + 2 * w.ph, wp = wd + 2 * w.pw;
  Value zero = b.Constant(ct, 0), sum;
  for (int64_t i = 0; i < w.kh; ++i)
    for (int64_t j = 0; j < w.kw; ++j) {
      int64_t k = i * w.kw + j, y0 = i * w.dh, x0 = j * w.dw;
      Value t = b.Reshape(b.Slice(cols, {0, 0, k, 0, 0}, {n, ch, k + 1, oh, ow}, {1, 1, 1, 1, 1}),
                          {n, ch, oh, ow});
      int64_t yh = hp - (y0 + (oh - 1) * w.sh + 1), xh = wp - (x0 + (ow - 1) * w.sw + 1);
      Value placed = b.Pad(t, zero, {0, 0, y0, x0}, {0, 0, yh, xh}, {0, 0, w.sh - 1, w.sw - 1});
      sum = k == 0 ? placed : b.Binary("add", sum, placed);
    }
  Value img = b.Slice(sum, {0, 0, w.ph, w.pw}, {n, ch, w.ph + h, w.pw + wd}, {1, 1, 1, 1});
  return One(b.Convert(b.Reshape(img, out.shape), out.dtype));
}

const bool registered = [] {
  Register("im2col", Im2Col, {"im2col.out"});
  Register("col2im", Col2Im, {"col2im.out"});
  MarkComplexCapable({"im2col", "col2im"});  // slices, pads and sums only
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
