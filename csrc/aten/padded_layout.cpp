// Padded storage layouts (padded_layout.h).
#include "aten/padded_layout.h"

#include <algorithm>
#include <functional>
#include <map>

namespace torch_tpu::aten {
namespace {

std::vector<int64_t> RealStrides(const std::vector<int64_t>& real) {
  std::vector<int64_t> s(real.size(), 1);
  for (size_t d = real.size(); d-- > 1;) s[d - 1] = s[d] * real[d];
  return s;
}

// `base` with its dims split at every stride in `cuts` that falls inside
// one; nullopt when a cut does not divide its dim or falls inside a padded
// dim.
std::optional<StorageLayout> Split(const StorageLayout& base, const std::vector<int64_t>& cuts) {
  std::vector<int64_t> strides = RealStrides(base.real);
  StorageLayout out;
  for (size_t j = 0; j < base.real.size(); ++j) {
    const int64_t inner = strides[j], extent = inner * base.real[j];
    std::vector<int64_t> inside;
    for (int64_t c : cuts)
      if (c > inner && c < extent) inside.push_back(c);
    std::sort(inside.begin(), inside.end(), std::greater<>());
    inside.erase(std::unique(inside.begin(), inside.end()), inside.end());
    if (!inside.empty() && base.real[j] != base.padded[j]) return std::nullopt;
    if (inside.empty()) {
      out.real.push_back(base.real[j]);
      out.padded.push_back(base.padded[j]);
      continue;
    }
    int64_t outer = extent;
    inside.push_back(inner);
    for (int64_t c : inside) {  // an unpadded dim: its pieces are unpadded too
      if (c % inner || outer % c) return std::nullopt;
      out.real.push_back(outer / c);
      out.padded.push_back(outer / c);
      outer = c;
    }
  }
  return out;
}

void DropUnitDims(StorageLayout* l) {
  StorageLayout kept;
  for (size_t j = 0; j < l->real.size(); ++j) {
    if (l->real[j] == 1 && l->padded[j] == 1) continue;
    kept.real.push_back(l->real[j]);
    kept.padded.push_back(l->padded[j]);
  }
  *l = std::move(kept);
}

// Merges layout dims so that each view dim of `g` whose size spans several
// of them reads one: an attention output [b, s, h, d] read as [b*s, h*d].
// Dims merge into the one outside them only when unpadded (a padded dim's
// rows are not contiguous with the next); false when a view dim spans a
// partial run of dims.
bool MergeForView(const lowering::ViewGeometry& g, StorageLayout* l) {
  for (bool merged = true; merged;) {
    merged = false;
    std::vector<int64_t> strides = RealStrides(l->real);
    for (size_t d = 0; d < g.sizes.size() && !merged; ++d) {
      if (g.sizes[d] == 1) continue;
      size_t j = 0;
      while (j < strides.size() && (strides[j] != g.strides[d] || l->real[j] == 1)) ++j;
      if (j == strides.size() || g.sizes[d] <= l->real[j]) continue;
      size_t k = j;
      int64_t real = l->real[j], padded = l->padded[j];
      while (real < g.sizes[d] && k > 0 && l->real[k] == l->padded[k]) {
        --k;
        padded = l->padded[k] * real;
        real *= l->real[k];
      }
      if (real != g.sizes[d]) return false;
      l->real.erase(l->real.begin() + static_cast<long>(k), l->real.begin() + static_cast<long>(j) + 1);
      l->padded.erase(l->padded.begin() + static_cast<long>(k), l->padded.begin() + static_cast<long>(j) + 1);
      l->real.insert(l->real.begin() + static_cast<long>(k), real);
      l->padded.insert(l->padded.begin() + static_cast<long>(k), padded);
      merged = true;
    }
  }
  return true;
}

}  // namespace

std::optional<ViewRead> MapView(const lowering::ViewGeometry& g, int64_t offset, const StorageLayout& base) {
  std::vector<int64_t> cuts;
  std::vector<bool> broadcast(g.sizes.size(), false);
  for (size_t d = 0; d < g.sizes.size(); ++d) {
    if (g.sizes[d] == 0 || g.strides[d] < 0) return std::nullopt;
    if (g.sizes[d] > 1 && g.strides[d] == 0) broadcast[d] = true;
    else if (g.sizes[d] > 1) cuts.push_back(g.strides[d]);
  }
  std::optional<StorageLayout> layout = Split(base, cuts);
  if (!layout) return std::nullopt;
  DropUnitDims(&*layout);  // the same layout whatever size-1 dims its writer had
  if (!MergeForView(g, &*layout)) return std::nullopt;
  ViewRead read{*layout, std::vector<int64_t>(layout->real.size(), 0),
                std::vector<int>(layout->real.size(), -1), broadcast};
  std::vector<int64_t> strides = RealStrides(layout->real);
  std::vector<int64_t> extent(layout->real.size(), 1);
  for (size_t d = 0; d < g.sizes.size(); ++d) {
    if (g.sizes[d] == 1 || broadcast[d]) continue;
    // A size-1 layout dim shares its inner neighbour's stride: skip it.
    size_t j = 0;
    while (j < strides.size() && (strides[j] != g.strides[d] || layout->real[j] == 1)) ++j;
    if (j == strides.size() || read.view_dim[j] >= 0 || g.sizes[d] > layout->real[j]) return std::nullopt;
    read.view_dim[j] = static_cast<int>(d);
    extent[j] = g.sizes[d];
  }
  int64_t rest = offset;
  for (size_t j = 0; j < strides.size(); ++j) {
    read.start[j] = rest / strides[j];
    rest %= strides[j];
    if (read.start[j] + extent[j] > layout->real[j]) return std::nullopt;
  }
  if (rest != 0) return std::nullopt;
  return read;
}

std::optional<BufferRead> ReadInBuffer(const lowering::ViewGeometry& g, int64_t offset, const StorageLayout& base) {
  std::optional<ViewRead> read = MapView(g, offset, base);
  if (!read) return std::nullopt;
  std::vector<int64_t> strides = RealStrides(read->layout.padded);  // row major over the padded dims
  BufferRead r;
  r.geometry.sizes = g.sizes;
  r.geometry.strides.assign(g.sizes.size(), 1);  // size-1 dims: any stride reads the same element
  for (size_t d = 0; d < g.sizes.size(); ++d)
    if (read->broadcast[d]) r.geometry.strides[d] = 0;
  r.geometry.storage_numel = 1;
  for (int64_t d : base.padded) r.geometry.storage_numel *= d;
  for (size_t j = 0; j < strides.size(); ++j) {
    r.offset += read->start[j] * strides[j];
    if (read->view_dim[j] >= 0) r.geometry.strides[read->view_dim[j]] = strides[j];
  }
  return r;
}

std::vector<std::pair<int64_t, int64_t>> LayoutRuns(const StorageLayout& l) {
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (size_t d = 0; d < l.real.size(); ++d) {
    if (l.padded[d] == 1) continue;
    if (l.real[d] == l.padded[d] && !runs.empty()) {
      runs.back().first *= l.real[d];
      runs.back().second *= l.padded[d];
    } else {
      runs.emplace_back(l.real[d], l.padded[d]);
    }
  }
  return runs;
}

bool SameLayout(const StorageLayout& a, const StorageLayout& b) {
  if (a.padded.empty() || b.padded.empty()) return false;
  return LayoutRuns(a) == LayoutRuns(b);
}

namespace {

// `v`, at the extents the view reads of each of `read`'s layout dims (1 for
// an unread one), as the view: the unread dims dropped, the rest in view
// order, the broadcast dims expanded.
hlo::Value ToView(hlo::Builder& b, hlo::Value v, const ViewRead& read, const std::vector<int64_t>& view_sizes) {
  std::vector<int64_t> read_sizes;            // the dims a view dim reads
  std::vector<std::pair<int, int64_t>> kept;  // (view dim, its place in read_sizes)
  for (size_t j = 0; j < read.view_dim.size(); ++j) {
    if (read.view_dim[j] < 0) continue;
    kept.emplace_back(read.view_dim[j], static_cast<int64_t>(read_sizes.size()));
    read_sizes.push_back(view_sizes[read.view_dim[j]]);
  }
  v = b.Reshape(v, read_sizes);
  std::sort(kept.begin(), kept.end());  // view order
  std::vector<int64_t> perm;
  for (const auto& [d, place] : kept) perm.push_back(place);
  v = b.Transpose(v, perm);
  std::vector<int64_t> unexpanded = view_sizes, dims;  // the broadcast dims at 1, then expanded
  for (size_t d = 0; d < view_sizes.size(); ++d) {
    if (read.broadcast[d]) unexpanded[d] = 1;
    dims.push_back(static_cast<int64_t>(d));
  }
  v = b.Reshape(v, unexpanded);
  return unexpanded == view_sizes ? v : b.BroadcastInDim(v, view_sizes, dims);
}

// The extent the view reads of each layout dim of `read`.
std::vector<int64_t> ReadExtents(const ViewRead& read, const std::vector<int64_t>& view_sizes) {
  std::vector<int64_t> extent(read.view_dim.size(), 1);
  for (size_t j = 0; j < extent.size(); ++j)
    if (read.view_dim[j] >= 0) extent[j] = view_sizes[read.view_dim[j]];
  return extent;
}

// The first layout dim of `read.view` inside its rows.
size_t FirstRowDim(const ReshapedRead& read) {
  const auto& real = read.view.layout.real;
  size_t j = real.size();
  for (int64_t in_row = 1; j > 0 && in_row < read.row;) in_row *= real[--j];
  return j;
}

}  // namespace

hlo::Value ReadPaddedView(hlo::Builder& b, hlo::Value buffer, const ViewRead& read,
                          const std::vector<int64_t>& view_sizes, const std::vector<hlo::Value>& starts) {
  const StorageLayout& l = read.layout;
  hlo::Value v = b.Reshape(buffer, l.padded);
  std::vector<int64_t> extent = ReadExtents(read, view_sizes);
  // A window from a static start whose bucket runs past the buffer's end
  // (`x[:, 1:]` of a dim padded to 8, at bucket 8) reads to the end; zeros
  // stand for the rest, which is padding (the window's real elements are
  // inside the real ones).
  std::vector<int64_t> cut = extent, past(l.padded.size(), 0);
  bool runtime_starts = false;
  for (size_t j = 0; j < l.padded.size(); ++j) {
    const bool runtime = j < starts.size() && starts[j].valid();
    runtime_starts |= runtime;
    if (!runtime) cut[j] = std::min(extent[j], l.padded[j] - read.start[j]);
    past[j] = extent[j] - cut[j];
  }
  if (runtime_starts) {
    std::vector<hlo::Value> at;
    for (size_t j = 0; j < l.padded.size(); ++j)
      at.push_back(j < starts.size() && starts[j].valid() ? starts[j] : b.ConstantInt(hlo::ElementType::I32, read.start[j]));
    v = b.DynamicSlice(v, at, cut);
  } else if (read.start != std::vector<int64_t>(l.padded.size(), 0) || cut != l.padded) {
    std::vector<int64_t> limit(l.padded.size());
    for (size_t j = 0; j < limit.size(); ++j) limit[j] = read.start[j] + cut[j];
    v = b.Slice(v, read.start, limit, std::vector<int64_t>(l.padded.size(), 1));
  }
  if (cut != extent) {
    std::vector<int64_t> zeros(past.size(), 0);
    v = b.Pad(v, b.ConstantInt(v.dtype(), 0), zeros, past, zeros);
  }
  return ToView(b, v, read, view_sizes);
}

bool SplitsStorageDim(const lowering::ViewGeometry& g, size_t d, const StorageLayout& storage) {
  if (g.sizes[d] <= 1 || g.strides[d] == 0) return false;
  std::vector<int64_t> strides = RealStrides(storage.real);
  strides.push_back(strides.empty() ? 1 : strides[0] * storage.real[0]);  // the end of the outermost dim
  auto boundary = [&](int64_t x) { return std::find(strides.begin(), strides.end(), x) != strides.end(); };
  return !boundary(g.strides[d]) || !boundary(g.strides[d] * g.sizes[d]);
}

int64_t MergedPaddedSize(const lowering::ViewGeometry& g, size_t d, const StorageLayout& storage, bool contiguous) {
  if (g.sizes[d] <= 1 || g.strides[d] <= 0) return -1;
  std::vector<int64_t> strides = RealStrides(storage.real);
  size_t j = 0;  // the innermost storage dim the view dim reads
  while (j < strides.size() && (strides[j] != g.strides[d] || storage.real[j] == 1)) ++j;
  if (j == strides.size() || storage.real[j] >= g.sizes[d]) return -1;
  int64_t real = storage.real[j], padded = storage.padded[j];
  bool inner_padded = false;
  for (size_t k = j; real < g.sizes[d] && k-- > 0;) {
    inner_padded |= storage.real[k + 1] != storage.padded[k + 1];
    real *= storage.real[k];
    padded *= storage.padded[k];
  }
  return real == g.sizes[d] && (inner_padded || contiguous) ? padded : -1;
}

std::optional<ReshapedRead> MapReshapedView(const lowering::ViewGeometry& g, int64_t offset,
                                            const StorageLayout& storage, const std::vector<bool>& dyn) {
  int64_t numel = 1;
  for (int64_t d : storage.real) numel *= d;
  std::optional<ViewRead> view = MapView(g, offset, StorageLayout{{numel}, {numel}});
  if (!view) return std::nullopt;
  const StorageLayout& l = view->layout;
  bool any_dynamic = false;
  for (size_t j = 0; j < l.real.size(); ++j) {
    const int d = view->view_dim[j];
    if (d < 0 || !dyn[d]) continue;
    if (view->start[j] != 0 || l.real[j] != g.sizes[d]) return std::nullopt;  // a window: no reshape
    any_dynamic = true;
  }
  if (!any_dynamic) return std::nullopt;
  // Rows: the most elements that are both trailing whole static dims of the
  // view's layout and trailing unpadded dims of the storage.
  std::map<int64_t, size_t> storage_rows{{1, storage.real.size()}};  // elements -> first dim in the row
  int64_t elements = 1;
  for (size_t m = storage.real.size(); m-- > 0 && storage.real[m] == storage.padded[m];)
    storage_rows[elements *= storage.real[m]] = m;
  ReshapedRead out{*view, {}, 1};
  size_t first_row_dim = storage.real.size();
  elements = 1;
  for (size_t j = l.real.size(); j-- > 0;) {
    const int d = view->view_dim[j];
    if (d < 0 || dyn[d] || view->start[j] != 0 || g.sizes[d] != l.real[j]) break;
    auto found = storage_rows.find(elements *= l.real[j]);
    if (found == storage_rows.end()) continue;
    out.row = elements;
    first_row_dim = found->second;
  }
  out.outer_padded.assign(storage.padded.begin(), storage.padded.begin() + static_cast<long>(first_row_dim));
  return out;
}

hlo::Value ReadReshapedView(hlo::Builder& b, hlo::Value buffer, const ReshapedRead& read,
                            const std::vector<int64_t>& view_sizes, const std::vector<hlo::Value>& runtime,
                            const std::vector<hlo::Value>& outer_real) {
  using hlo::ElementType;
  using hlo::Value;
  const ViewRead& r = read.view;
  const std::vector<int64_t> extent = ReadExtents(r, view_sizes);
  const std::vector<int64_t> grid(extent.begin(), extent.begin() + static_cast<long>(FirstRowDim(read)));
  auto splat = [&](Value scalar) { return b.BroadcastInDim(scalar, grid, {}); };
  auto constant = [&](int64_t v) { return b.ConstantInt(ElementType::I32, v); };
  // The real row each grid point reads: sum of (start + index) * stride over
  // the outer layout dims, the strides from their runtime sizes.
  Value real_row = b.Splat(ElementType::I32, 0, grid), stride = constant(1);
  for (size_t j = grid.size(); j-- > 0;) {
    Value index = b.Binary("add", b.Iota({ElementType::I32, grid}, static_cast<int64_t>(j)), splat(constant(r.start[j])));
    real_row = b.Binary("add", real_row, b.Binary("multiply", index, splat(stride)));
    const int d = r.view_dim[j];
    stride = b.Binary("multiply", stride, d >= 0 && runtime[d].valid() ? runtime[d] : constant(r.layout.real[j]));
  }
  // ... and where that row sits in the buffer: its index in each outer
  // storage dim (runtime real sizes) at that dim's padded stride. Rows past
  // the real ones read clamped garbage that the caller's sizes mask.
  Value buffer_row = b.Splat(ElementType::I32, 0, grid), real_stride = constant(1);
  int64_t padded_stride = 1;
  for (size_t m = read.outer_padded.size(); m-- > 0;) {
    Value index = b.Binary("divide", real_row, splat(real_stride));
    if (m > 0) index = b.Binary("remainder", index, splat(outer_real[m]));
    buffer_row = b.Binary("add", buffer_row, b.Binary("multiply", index, splat(constant(padded_stride))));
    real_stride = b.Binary("multiply", real_stride, outer_real[m]);
    padded_stride *= read.outer_padded[m];
  }
  std::vector<int64_t> index_shape = grid;
  index_shape.push_back(1);
  Value rows = b.Gather(b.Reshape(buffer, {padded_stride, read.row}), b.Reshape(buffer_row, index_shape), {0});
  return ToView(b, b.Reshape(rows, extent), r, view_sizes);
}

hlo::Value WritePaddedView(hlo::Builder& b, hlo::Value buffer, const ViewRead& write, hlo::Value update,
                           const std::vector<hlo::Value>& starts) {
  const StorageLayout& l = write.layout;
  // The update's dims of size > 1 (the ones a layout dim reads), in view order.
  std::vector<int64_t> kept_sizes, kept_dims;
  for (size_t d = 0; d < update.shape().size(); ++d)
    if (update.shape()[d] != 1) {
      kept_dims.push_back(static_cast<int64_t>(d));
      kept_sizes.push_back(update.shape()[d]);
    }
  std::vector<int64_t> perm, extent(l.padded.size(), 1);
  for (size_t j = 0; j < l.padded.size(); ++j) {
    int d = write.view_dim[j];
    if (d < 0) continue;
    extent[j] = update.shape()[d];
    perm.push_back(std::find(kept_dims.begin(), kept_dims.end(), d) - kept_dims.begin());
  }
  hlo::Value v = b.Reshape(b.Transpose(b.Reshape(update, kept_sizes), perm), extent);  // layout order
  // A window running past the buffer's end (its bucket from a start > 0) is
  // cut there: only its padding does (the caller checks).
  std::vector<int64_t> limit = extent;
  for (size_t j = 0; j < limit.size(); ++j)
    if (!(j < starts.size() && starts[j].valid()) && write.start[j] + extent[j] > l.padded[j])
      limit[j] = l.padded[j] - write.start[j];
  if (limit != extent) v = b.Slice(v, std::vector<int64_t>(limit.size(), 0), limit, std::vector<int64_t>(limit.size(), 1));
  std::vector<hlo::Value> at;
  for (size_t j = 0; j < write.start.size(); ++j)
    at.push_back(j < starts.size() && starts[j].valid() ? b.Convert(starts[j], hlo::ElementType::I64)
                                                        : b.ConstantInt(hlo::ElementType::I64, write.start[j]));
  hlo::Value written = b.DynamicUpdateSlice(b.Reshape(buffer, l.padded), v, at);
  return b.Reshape(written, {buffer.type.numel()});
}

std::optional<std::vector<int64_t>> StorageOrder(const std::vector<int64_t>& sizes,
                                                 const std::vector<int64_t>& strides) {
  std::vector<int64_t> perm;
  if (strides == lowering::ContiguousStrides(sizes)) {
    for (size_t d = 0; d < sizes.size(); ++d) perm.push_back(static_cast<int64_t>(d));
    return perm;
  }
  std::vector<int64_t> dims;  // size-1 dims first (anywhere is the same memory), then by stride
  for (size_t d = 0; d < sizes.size(); ++d) (sizes[d] == 1 ? perm : dims).push_back(static_cast<int64_t>(d));
  std::stable_sort(dims.begin(), dims.end(), [&](int64_t a, int64_t b) { return strides[a] > strides[b]; });
  int64_t expected = 1;
  for (size_t i = dims.size(); i-- > 0;) {
    if (strides[dims[i]] != expected) return std::nullopt;
    expected *= sizes[dims[i]];
  }
  perm.insert(perm.end(), dims.begin(), dims.end());
  return perm;
}

std::vector<int64_t> DenseStrides(const std::vector<int64_t>& sizes, const std::vector<int64_t>& order,
                                  const std::vector<bool>& broadcast) {
  std::vector<int64_t> strides(sizes.size(), 0);
  int64_t s = 1;
  for (size_t j = order.size(); j-- > 0;) {
    const int64_t d = order[j];
    if (static_cast<size_t>(d) < broadcast.size() && broadcast[d]) continue;
    strides[d] = s;
    s *= std::max<int64_t>(sizes[d], 1);
  }
  return strides;
}

}  // namespace torch_tpu::aten
