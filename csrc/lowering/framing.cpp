// Signal framing: unfold_backward, the overlap-add that istft and the
// backward of Tensor.unfold (stft's framing) run. Windows of `size` taken
// every `step` along `dim` are summed back into a signal of input_sizes.
#include <algorithm>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

// Places `piece` (length n along the last dim) at offset `low` inside a
// signal of `length`, zero elsewhere; `interior` zeros between elements.
Value PlaceAlongLast(Builder& b, Value piece, int64_t low, int64_t interior, int64_t length) {
  int64_t r = piece.rank(), n = piece.shape().back();
  int64_t span = n == 0 ? 0 : n + (n - 1) * interior;
  std::vector<int64_t> lo(r, 0), hi(r, 0), in(r, 0);
  lo.back() = low;
  hi.back() = length - low - span;
  in.back() = interior;
  if (hi.back() < 0) {  // windows past the end (cannot happen for a real unfold)
    throw std::invalid_argument("unfold_backward: windows do not fit in the input");
  }
  return b.Pad(piece, b.Constant(piece.dtype(), 0), lo, hi, in);
}

// unfold_backward(Tensor grad_in, SymInt[] input_sizes, int dim, int size, int step)
std::vector<Value> UnfoldBackward(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  Value g = b.Convert(a[0].tensor, out.dtype);
  int64_t rank = static_cast<int64_t>(out.shape.size());
  int64_t dim = rank == 0 ? 0 : WrapDim(a[2].i, rank), size = a[3].i, step = a[4].i;
  int64_t length = rank == 0 ? 1 : out.shape[dim];
  if (rank == 0) return One(b.Reshape(g, {}));
  // grad_in: input dims with `dim` holding the windows, plus the window
  // elements last. Move the window dim just before the last.
  std::vector<int64_t> perm;
  for (int64_t d = 0; d <= rank; ++d)
    if (d != dim && d != rank) perm.push_back(d);
  perm.push_back(dim);
  perm.push_back(rank);
  Value w = b.Transpose(g, perm);  // [..., W, size]
  std::vector<int64_t> lead(w.shape().begin(), w.shape().end() - 2);
  int64_t windows = w.shape()[rank - 1];
  std::vector<int64_t> signal = lead;
  signal.push_back(length);
  Value sum = b.Splat(out.dtype, 0, signal);
  auto slice_last2 = [&](int64_t k0, int64_t k1) {
    std::vector<int64_t> start(rank + 1, 0), limit = w.shape(), strides(rank + 1, 1);
    start.back() = k0;
    limit.back() = k1;
    return b.Slice(w, start, limit, strides);
  };
  if (size % step == 0 && windows > 0) {
    // Blocks of `step` elements: block j of window i lands at (i + j) * step.
    for (int64_t j = 0; j < size / step; ++j) {
      std::vector<int64_t> flat = lead;
      flat.push_back(windows * step);
      Value block = b.Reshape(slice_last2(j * step, (j + 1) * step), flat);
      sum = b.Binary("add", sum, PlaceAlongLast(b, block, j * step, 0, length));
    }
  } else if (windows > 0) {
    // Element k of window i lands at i * step + k.
    for (int64_t k = 0; k < size; ++k) {
      std::vector<int64_t> col = lead;
      col.push_back(windows);
      Value piece = b.Reshape(slice_last2(k, k + 1), col);
      sum = b.Binary("add", sum, PlaceAlongLast(b, piece, k, step - 1, length));
    }
  }
  // Back to the input layout: the signal dim returns to `dim`.
  std::vector<int64_t> back_perm;
  for (int64_t d = 0; d < rank - 1; ++d) back_perm.push_back(d);
  back_perm.insert(back_perm.begin() + dim, rank - 1);
  return One(b.Transpose(sum, back_perm));
}

const bool registered = [] {
  Register("unfold_backward", UnfoldBackward, {"unfold_backward.out"});
  MarkComplexCapable({"unfold_backward"});
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
