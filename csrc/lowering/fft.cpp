// torch.fft's three ATen ops on stablehlo.fft: _fft_c2c, _fft_r2c, _fft_c2r.
// Every torch.fft function (fft, rfft2, ihfftn, ...), stft/istft and the
// backward formulas of these ops (which call these ops again) decompose into
// them, plus padding, slicing and conjugation.
//
// stablehlo.fft transforms the trailing 1-3 dims: the transformed dims are
// moved last (in their order) and done in chunks of up to three. XLA's
// inverse transforms scale by 1/n and the forward ones not at all; PyTorch's
// `normalization` (0: none, 1: 1/sqrt(n), 2: 1/n, n the signal size) is
// applied afterwards.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

constexpr int64_t kMaxFftRank = 3;  // stablehlo.fft: 1 to 3 trailing dims

std::vector<int64_t> Inverse(const std::vector<int64_t>& perm) {
  std::vector<int64_t> inv(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inv[perm[i]] = static_cast<int64_t>(i);
  return inv;
}

// Applies one stablehlo.fft of `type` over `dims` (at most 3, any position):
// the dims are moved last, transformed and moved back. fft_length: the
// signal sizes (for IRFFT the output's; for the others the input's).
Value FftOver(Builder& b, Value x, const std::vector<int64_t>& dims, const std::string& type,
              std::vector<int64_t> fft_length) {
  std::vector<int64_t> perm;
  for (int64_t d = 0; d < x.rank(); ++d)
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) perm.push_back(d);
  perm.insert(perm.end(), dims.begin(), dims.end());
  Value y = b.Fft(b.Transpose(x, perm), type, fft_length);
  return b.Transpose(y, Inverse(perm));
}

// c2c over any number of dims: chunks of up to three (they commute).
Value ComplexFft(Builder& b, Value x, const std::vector<int64_t>& dims, bool forward) {
  for (size_t start = 0; start < dims.size(); start += kMaxFftRank) {
    std::vector<int64_t> chunk(dims.begin() + start,
                               dims.begin() + std::min(dims.size(), start + kMaxFftRank));
    std::vector<int64_t> lengths;
    for (int64_t d : chunk) lengths.push_back(x.shape()[d]);
    x = FftOver(b, x, chunk, forward ? "FFT" : "IFFT", lengths);
  }
  return x;
}

// The transformed dims, wrapped, in PyTorch's order (the last one is the
// halved one of r2c / c2r).
std::vector<int64_t> FftDims(const Arg& a, int64_t rank) {
  std::vector<int64_t> dims;
  for (int64_t d : a.ints) dims.push_back(WrapDim(d, rank));
  return dims;
}

int64_t SignalSize(const std::vector<int64_t>& shape, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= shape[d];
  return n;
}

// Multiplies by PyTorch's normalization factor, given how XLA scaled the
// transform (1 for forward, 1/n for inverse).
Value Normalize(Builder& b, Value x, int64_t normalization, int64_t n, bool xla_scaled_by_n) {
  double want = normalization == 1 ? 1 / std::sqrt(static_cast<double>(n))
                : normalization == 2 ? 1 / static_cast<double>(n) : 1.0;
  double factor = xla_scaled_by_n ? want * static_cast<double>(n) : want;
  if (factor == 1.0) return x;
  ElementType part = hlo::RealPart(x.dtype());
  Value s = b.Splat(part, factor, x.shape());
  if (!hlo::IsComplex(x.dtype())) return b.Binary("multiply", x, s);
  return b.Complex(b.Binary("multiply", b.Real(x), s), b.Binary("multiply", b.Imag(x), s));
}

// _fft_c2c(Tensor self, SymInt[] dim, int normalization, bool forward)
std::vector<Value> FftC2C(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  Value x = c.b.Convert(a[0].tensor, out.dtype);
  std::vector<int64_t> dims = FftDims(a[1], x.rank());
  bool forward = a[3].i != 0;
  Value y = ComplexFft(c.b, x, dims, forward);
  return One(Normalize(c.b, y, a[2].i, SignalSize(x.shape(), dims), !forward));
}

// _fft_r2c(Tensor self, int[] dim, int normalization, bool onesided): the
// last dim of `dim` is halved (n/2+1) when onesided.
std::vector<Value> FftR2C(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  Value x = b.Convert(a[0].tensor, hlo::RealPart(out.dtype));
  std::vector<int64_t> dims = FftDims(a[1], x.rank());
  int64_t n = SignalSize(x.shape(), dims);
  if (dims.empty()) return One(b.Convert(x, out.dtype));
  Value y;
  if (a[3].i == 0) {  // two-sided: a complex transform of the real input
    y = ComplexFft(b, b.Convert(x, out.dtype), dims, true);
  } else {
    size_t split = dims.size() > kMaxFftRank ? dims.size() - kMaxFftRank : 0;
    std::vector<int64_t> last(dims.begin() + split, dims.end()), rest(dims.begin(), dims.begin() + split);
    std::vector<int64_t> lengths;
    for (int64_t d : last) lengths.push_back(x.shape()[d]);
    y = ComplexFft(b, FftOver(b, x, last, "RFFT", lengths), rest, true);
  }
  return One(Normalize(b, y, a[2].i, n, false));
}

// _fft_c2r(Tensor self, int[] dim, int normalization, SymInt last_dim_size):
// the input holds the n/2+1 non-redundant values along the last dim of
// `dim`; the output has last_dim_size there.
std::vector<Value> FftC2R(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  Value x = b.Convert(a[0].tensor, hlo::ComplexOf(out.dtype));
  std::vector<int64_t> dims = FftDims(a[1], x.rank());
  if (dims.empty()) return One(b.Convert(x, out.dtype));
  int64_t last_dim = dims.back(), last_size = a[3].i, half = last_size / 2 + 1;
  // Exactly n/2+1 values along the halved dim (extra ones are ignored).
  int64_t have = x.shape()[last_dim];
  if (have > half) {
    std::vector<int64_t> start(x.rank(), 0), limit = x.shape(), step(x.rank(), 1);
    limit[last_dim] = half;
    x = b.Slice(x, start, limit, step);
  } else if (have < half) {
    std::vector<int64_t> low(x.rank(), 0), high(x.rank(), 0), interior(x.rank(), 0);
    high[last_dim] = half - have;
    x = b.Pad(x, b.Constant(x.dtype(), 0), low, high, interior);
  }
  size_t split = dims.size() > kMaxFftRank ? dims.size() - kMaxFftRank : 0;
  std::vector<int64_t> last(dims.begin() + split, dims.end()), rest(dims.begin(), dims.begin() + split);
  Value y = ComplexFft(b, x, rest, false);
  std::vector<int64_t> lengths;
  for (int64_t d : last) lengths.push_back(d == last_dim ? last_size : x.shape()[d]);
  y = FftOver(b, y, last, "IRFFT", lengths);
  return One(Normalize(b, y, a[2].i, SignalSize(y.shape(), dims), true));
}

const bool registered = [] {
  Register("_fft_c2c", FftC2C, {"_fft_c2c.out"});
  Register("_fft_r2c", FftR2C, {"_fft_r2c.out"});
  Register("_fft_c2r", FftC2R, {"_fft_c2r.out"});
  MarkComplexCapable({"_fft_c2c", "_fft_r2c", "_fft_c2r"});
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
