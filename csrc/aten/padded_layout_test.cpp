// Padded storage layouts (aten/padded_layout.h): which views of a padded
// storage merge its padded dims, and the product of buckets they read.
#include "aten/padded_layout.h"

#include <gtest/gtest.h>

namespace torch_tpu::aten {
namespace {

lowering::ViewGeometry View(std::vector<int64_t> sizes, std::vector<int64_t> strides) {
  lowering::ViewGeometry g;
  g.sizes = std::move(sizes);
  g.strides = std::move(strides);
  return g;
}

TEST(PaddedLayout, TheTokensOfAnImageMergeItsPaddedDims) {
  // A [2, 8, 38, 38] image in its 40x40 bucket, read as [2, 38*38, 8] tokens
  // (permute(0, 2, 3, 1).reshape(b, h*w, c)): the product of the buckets.
  const StorageLayout image{{2, 8, 38, 38}, {2, 8, 40, 40}};
  const auto tokens = View({2, 38 * 38, 8}, {8 * 38 * 38, 1, 38 * 38});
  EXPECT_EQ(MergedPaddedSize(tokens, 1, image), 1600);
  EXPECT_EQ(MergedPaddedSize(tokens, 2, image), -1);  // the channels: one dim
  EXPECT_EQ(MergedPaddedSize(tokens, 0, image), -1);
  // [b, s, h] padded in s read as [b*s, h] rows: s is padded inside b.
  const StorageLayout bsh{{3, 5, 4}, {4, 8, 4}};
  EXPECT_EQ(MergedPaddedSize(View({15, 4}, {4, 1}), 0, bsh), 32);
  // A piece of a dim, or a dim read alone, merges nothing.
  EXPECT_EQ(MergedPaddedSize(View({3, 5, 2, 2}, {20, 4, 2, 1}), 2, bsh), -1);
}

TEST(PaddedLayout, AnImageAtItsBucketMergesOnlyWhenAskedTo) {
  // 40x40 in its own bucket: contiguous (MapView reads it), but the same
  // product as 38x38's when `contiguous` (so both sizes share their tokens' bucket).
  const StorageLayout image{{2, 8, 40, 40}, {2, 8, 40, 40}};
  const auto tokens = View({2, 1600, 8}, {8 * 1600, 1, 1600});
  EXPECT_EQ(MergedPaddedSize(tokens, 1, image), -1);
  EXPECT_EQ(MergedPaddedSize(tokens, 1, image, true), 1600);
}

}  // namespace
}  // namespace torch_tpu::aten
