// Padded storage layouts for bounded dynamic shapes: how a tensor view reads
// a storage buffer whose dims keep their real elements at the front of each
// padded dim (runtime.h: DeviceStorage::real_shape / padded_shape).
//
// A view is readable from such a buffer when it is a permutation of windows
// of the storage's dims (transposes, heads split out of a hidden dim, slices
// such as RoPE's halves, a selected row): MapView finds those dims, splitting
// unpadded storage dims where the view's strides need it (a padded dim's
// elements are not contiguous in the buffer: it never splits) and merging a
// dim with the unpadded ones inside it where one view dim spans them (an
// attention output [b, s, h, d] read as [b*s, h*d]).
#pragma once

#include <optional>
#include <vector>

#include "hlo/builder.h"
#include "lowering/lowering.h"

namespace torch_tpu::aten {

// The dims of a dense strided tensor from outermost to innermost in memory
// (size-1 dims first); nullopt when its elements do not fill a block exactly.
std::optional<std::vector<int64_t>> StorageOrder(const std::vector<int64_t>& sizes,
                                                 const std::vector<int64_t>& strides);

// The strides of a dense tensor of `sizes` laid out in `order` (outermost
// first). Dims flagged in `broadcast` (when given) take stride 0 and no
// memory, as an expand()'s.
std::vector<int64_t> DenseStrides(const std::vector<int64_t>& sizes, const std::vector<int64_t>& order,
                                  const std::vector<bool>& broadcast = {});

// A storage as row-major dims, the real elements at the front of each.
struct StorageLayout {
  std::vector<int64_t> real, padded;
};

// A view read out of a storage layout.
struct ViewRead {
  StorageLayout layout;        // the storage's dims, split as the view needs
  std::vector<int64_t> start;  // per layout dim: the first real element the view reads
  std::vector<int> view_dim;   // per layout dim: the view dim (size > 1) reading it, -1: none
  std::vector<bool> broadcast;  // per view dim: stride 0 and size > 1 (expand): reads no layout dim
};

// The read of view `g` at real element offset `offset` of a storage laid out
// as `base` (an exact storage: one dim of its numel); nullopt when the view is
// no permutation of windows of its dims, some of them broadcast (expanded:
// stride 0), e.g. overlapping strides.
std::optional<ViewRead> MapView(const lowering::ViewGeometry& g, int64_t offset, const StorageLayout& base);

// View `g` at real element offset `offset` read straight out of the padded
// buffer: its geometry and offset in the buffer's own elements (sizes as the
// view's; strides and storage_numel of the padded layout). It does not
// depend on the real sizes, so an exact op reading a window of a growing
// padded storage compiles once. nullopt when MapView cannot map the view.
struct BufferRead {
  lowering::ViewGeometry geometry;
  int64_t offset = 0;
};
std::optional<BufferRead> ReadInBuffer(const lowering::ViewGeometry& g, int64_t offset, const StorageLayout& base);

// A view of a padded storage read as a reshape of its real elements (their
// row-major order), where MapView finds no layout: a dynamic view dim that
// reads a piece of one of the storage's dims, or spans several of them, an
// inner one padded. `[b*s, n]` rows of an mm,
// padded as one dim (a buffer of [R, n] rows, the real b*s first), read as
// `[b, s, n]` by the next op: row (i, j) sits at buffer row i*s + j, s a
// runtime size. The read gathers rows: the view maps onto the real elements
// as onto an exact storage (`view`), and each of its rows of `row` elements
// is found in the buffer from the runtime real sizes of the storage's dims
// outside the rows (their padded sizes: `outer_padded`).
struct ReshapedRead {
  ViewRead view;  // on the real elements as one exact dim
  std::vector<int64_t> outer_padded;
  int64_t row = 1;  // elements per row: trailing whole dims of the view and of the storage
};

// Whether view dim `d` of `g` reads a piece of one of `storage`'s dims (it
// starts or ends inside one, at real strides) rather than whole dims.
bool SplitsStorageDim(const lowering::ViewGeometry& g, size_t d, const StorageLayout& storage);

// When view dim `d` of `g` spans several of `storage`'s dims, an inner one
// padded (the h*w tokens of a [b, c, h, w] image read as [b, h*w, c]): the
// product of their padded sizes (read as a reshape, its real elements
// gathered); -1 otherwise. `contiguous`: also when none is padded (the
// image's sizes at their buckets).
int64_t MergedPaddedSize(const lowering::ViewGeometry& g, size_t d, const StorageLayout& storage,
                         bool contiguous = false);

// The reshaped read of view `g` at real element offset `offset` of
// `storage`, each dynamic view dim (`dyn`) reading a whole dim of the real
// elements; nullopt otherwise.
std::optional<ReshapedRead> MapReshapedView(const lowering::ViewGeometry& g, int64_t offset,
                                            const StorageLayout& storage, const std::vector<bool>& dyn);

// Emits the reshaped read out of `buffer` (flat, at the storage's padded
// sizes) at `view_sizes` (each dynamic view dim at its bucket). `runtime`:
// per view dim, its runtime size (i32; set for the dynamic dims); `outer_real`:
// the runtime real sizes of the storage's dims in `read.outer_padded`. The
// caller marks the dynamic dims' runtime sizes.
hlo::Value ReadReshapedView(hlo::Builder& b, hlo::Value buffer, const ReshapedRead& read,
                            const std::vector<int64_t>& view_sizes, const std::vector<hlo::Value>& runtime,
                            const std::vector<hlo::Value>& outer_real);

// The layout runs of a padded layout: (real, padded) element counts, size-1
// dims dropped and an unpadded dim folded into the one outside it. Two
// layouts with equal runs put every real element at the same place.
std::vector<std::pair<int64_t, int64_t>> LayoutRuns(const StorageLayout& l);
bool SameLayout(const StorageLayout& a, const StorageLayout& b);

// Emits the view out of `buffer` (flat, at `read.layout.padded` sizes) at the
// view's sizes with each dynamic view dim at its bucket (`bucket`); the
// caller marks the dynamic dims' runtime sizes. `starts`, when given: per
// layout dim, its window's start at run time (an i32; an invalid Value:
// `read.start`). A window from a static start whose bucket runs past the
// buffer's end reads to the end, zeros after (its padding).
hlo::Value ReadPaddedView(hlo::Builder& b, hlo::Value buffer, const ViewRead& read,
                          const std::vector<int64_t>& view_sizes, const std::vector<hlo::Value>& starts = {});

// `buffer` (flat, at `write.layout.padded` sizes) with `update` (static, at
// the view's sizes; the view reads no dim broadcast) written into the view's
// window: the new flat buffer. A window from a static start that runs past
// the buffer's end is cut there (the caller makes sure only padding does).
// `starts`: per layout dim, a runtime start (i32) that replaces the window's
// (invalid: the window's).
hlo::Value WritePaddedView(hlo::Builder& b, hlo::Value buffer, const ViewRead& write, hlo::Value update,
                           const std::vector<hlo::Value>& starts = {});

}  // namespace torch_tpu::aten
