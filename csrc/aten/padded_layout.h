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

// The layout runs of a padded layout: (real, padded) element counts, size-1
// dims dropped and an unpadded dim folded into the one outside it. Two
// layouts with equal runs put every real element at the same place.
std::vector<std::pair<int64_t, int64_t>> LayoutRuns(const StorageLayout& l);
bool SameLayout(const StorageLayout& a, const StorageLayout& b);

// Emits the view out of `buffer` (flat, at `read.layout.padded` sizes) at the
// view's sizes with each dynamic view dim at its bucket (`bucket`); the
// caller marks the dynamic dims' runtime sizes.
hlo::Value ReadPaddedView(hlo::Builder& b, hlo::Value buffer, const ViewRead& read,
                          const std::vector<int64_t>& view_sizes);

// `buffer` (flat, at `write.layout.padded` sizes) with `update` (static, at
// the view's sizes; the view reads no dim broadcast) written into the view's
// window: the new flat buffer.
hlo::Value WritePaddedView(hlo::Builder& b, hlo::Value buffer, const ViewRead& write, hlo::Value update);

}  // namespace torch_tpu::aten
