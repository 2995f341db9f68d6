// What the rule table states about bounded dynamic shapes (RuleEntry::dynamic):
// which rules may run bounded, and the dims each keeps static for a call.
#include <gtest/gtest.h>

#include <set>
#include <utility>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

Arg TensorOf(std::vector<int64_t> shape) {
  Arg a;
  a.kind = Arg::Kind::Tensor;
  a.tensor.type = TensorType{ElementType::F32, std::move(shape)};
  return a;
}

Arg Literal(Arg::Kind kind, int64_t i = 0, std::vector<int64_t> ints = {}, double d = 0) {
  Arg a;
  a.kind = kind;
  a.i = i;
  a.ints = std::move(ints);
  a.d = d;
  return a;
}

Arg DoubleOf(double d) { return Literal(Arg::Kind::Double, 0, {}, d); }

// The (arg, dim) pairs rule `name` keeps static for `args`, and its reason to
// run exact shapes (nullptr: none).
std::pair<std::set<std::pair<size_t, size_t>>, const char*> StaticOf(const std::string& name,
                                                                     const std::vector<Arg>& args) {
  const RuleEntry* e = Find(name);
  EXPECT_TRUE(e && e->dynamic.enabled) << name;
  StaticDims dims(args);
  if (e && e->dynamic.static_dims) e->dynamic.static_dims(args, dims);
  return {{dims.dims().begin(), dims.dims().end()}, dims.exact()};
}

TEST(DynamicShapes, ElementwiseAndProductsAreDynamicWithNoStaticDims) {
  for (const char* name : {"add.Tensor", "exp", "relu", "sum.dim_IntList", "mm", "bmm", "_softmax"}) {
    const RuleEntry* e = Find(name);
    ASSERT_TRUE(e) << name;
    EXPECT_TRUE(e->dynamic.enabled) << name;
    EXPECT_FALSE(e->dynamic.static_dims) << name;
  }
  EXPECT_EQ(Find("mm")->dynamic.rows_args, std::vector<size_t>{0});
  EXPECT_EQ(Find("addmm")->dynamic.rows_args, std::vector<size_t>{1});
  EXPECT_TRUE(Find("pow.Tensor_Scalar")->dynamic.integers_exact);
  EXPECT_FALSE(Find("linspace.out")->dynamic.enabled);
}

TEST(DynamicShapes, ReflectionAndReplicationPadsKeepThePaddedDimsStatic) {
  using Dims = std::set<std::pair<size_t, size_t>>;
  const Arg pad = Literal(Arg::Kind::IntList, 0, {1, 2, 1, 2});
  EXPECT_EQ(StaticOf("reflection_pad2d", {TensorOf({2, 3, 6, 6}), pad}).first, (Dims{{0, 2}, {0, 3}}));
  EXPECT_EQ(StaticOf("replication_pad1d", {TensorOf({2, 3, 6}), Literal(Arg::Kind::IntList, 0, {1, 2})}).first,
            (Dims{{0, 2}}));
  // backward(grad_output, self, padding): both tensors' padded dims
  EXPECT_EQ(StaticOf("reflection_pad2d_backward", {TensorOf({2, 3, 9, 9}), TensorOf({2, 3, 6, 6}), pad}).first,
            (Dims{{0, 2}, {0, 3}, {1, 2}, {1, 3}}));
}

// The (arg, dim)s rule `name` states its results are independent along.
std::set<std::pair<size_t, size_t>> IndependentOf(const std::string& name, const std::vector<Arg>& args) {
  const RuleEntry* e = Find(name);
  EXPECT_TRUE(e && e->dynamic.independent_dims) << name;
  StaticDims dims(args);
  if (e && e->dynamic.independent_dims) e->dynamic.independent_dims(args, dims);
  return {dims.dims().begin(), dims.dims().end()};
}

TEST(DynamicShapes, RowIndependentRulesSayAlongWhich) {
  using Dims = std::set<std::pair<size_t, size_t>>;
  EXPECT_EQ(IndependentOf("mm", {TensorOf({6, 4}), TensorOf({4, 3})}), (Dims{{0, 0}, {1, 1}}));
  // mean.dim(self [2, 5, 8], dim [-1]): the kept dims 0 and 1; every dim reduced: none.
  EXPECT_EQ(IndependentOf("mean.dim", {TensorOf({2, 5, 8}), Literal(Arg::Kind::IntList, 0, {-1})}),
            (Dims{{0, 0}, {0, 1}}));
  EXPECT_TRUE(IndependentOf("sum.dim_IntList", {TensorOf({2, 5}), Literal(Arg::Kind::IntList, 0, {})}).empty());
  EXPECT_EQ(IndependentOf("_softmax", {TensorOf({3, 7}), Literal(Arg::Kind::Int, 1)}), (Dims{{0, 0}}));
  EXPECT_EQ(IndependentOf("cumsum", {TensorOf({3, 7, 2}), Literal(Arg::Kind::Int, -2)}), (Dims{{0, 0}, {0, 2}}));
  EXPECT_TRUE(IndependentOf("argmax", {TensorOf({3, 7}), Arg{}}).empty());  // dim=None: every dim reduced
  EXPECT_EQ(IndependentOf("native_layer_norm", {TensorOf({2, 5, 8}), Literal(Arg::Kind::IntList, 0, {8})}),
            (Dims{{0, 0}, {0, 1}, {0, 2}}));  // the normalized dim is static anyway
  EXPECT_FALSE(Find("cat")->dynamic.independent_dims);
}

TEST(DynamicShapes, BatchNormKeepsItsChannelsStatic) {
  // native_batch_norm(input [b, c, h, w], weight, bias, running_mean, running_var, ...)
  auto [dims, exact] = StaticOf("native_batch_norm", {TensorOf({6, 8, 5, 4}), TensorOf({8}), TensorOf({8}),
                                                      TensorOf({8}), TensorOf({8})});
  EXPECT_EQ(exact, nullptr);
  EXPECT_EQ(dims, (std::set<std::pair<size_t, size_t>>{{0, 1}, {1, 0}, {2, 0}, {3, 0}, {4, 0}}));
  EXPECT_EQ(StaticOf("native_batch_norm_backward", {TensorOf({6, 8}), TensorOf({6, 8})}).first,
            (std::set<std::pair<size_t, size_t>>{{0, 1}, {1, 1}}));
}

TEST(DynamicShapes, GroupNormReadsItsSizeIntsOffItsInput) {
  // native_group_norm(input, weight, bias, N, C, HxW, group, eps): N, C and
  // HxW are the input's dims 0, 1 and 2.. (keyed without their values).
  const RuleEntry* gn = Find("native_group_norm");
  ASSERT_TRUE(gn && gn->dynamic.enabled);
  ASSERT_EQ(gn->dynamic.size_ints.size(), 3u);
  const std::vector<int64_t> x{6, 8, 5, 4};
  EXPECT_EQ(gn->dynamic.size_ints[0].arg, 3u);
  EXPECT_EQ(gn->dynamic.size_ints[0].Of(x), 6);
  EXPECT_EQ(gn->dynamic.size_ints[1].Of(x), 8);
  EXPECT_EQ(gn->dynamic.size_ints[2].Of(x), 20);
  EXPECT_EQ(Find("native_group_norm_backward")->dynamic.size_ints[2].arg, 7u);
  // upsample_nearest2d_backward(grad_output, output_size, input_size, scales_h, scales_w):
  // input_size[0] is grad_output's batch; output_size[j] its spatial sizes,
  // input_size[2 + j] those divided by the scales.
  const std::vector<SizeInt>& up = Find("upsample_nearest2d_backward")->dynamic.size_ints;
  ASSERT_EQ(up.size(), 5u);
  EXPECT_EQ(up[0].arg, 2u);
  EXPECT_EQ(up[0].element, 0);
  EXPECT_EQ(up[0].Of(x), 6);
  EXPECT_EQ(up[1].arg, 1u);
  EXPECT_EQ(up[1].element, 0);
  EXPECT_EQ(up[1].Of(x), 5);
  EXPECT_EQ(up[2].arg, 2u);
  EXPECT_EQ(up[2].element, 2);
  EXPECT_EQ(up[2].scale_arg, 3);
  EXPECT_EQ(up[2].Of(x, 2.0), 2);  // floor(5 / 2)
  // A group norm's spatial dims are dynamic too (its group's elements counted at run time).
  auto [dims, exact] = StaticOf("native_group_norm", {TensorOf({6, 8, 5, 4}), TensorOf({8}), TensorOf({8})});
  EXPECT_EQ(dims, (std::set<std::pair<size_t, size_t>>{{0, 1}, {1, 0}, {2, 0}}));
}

TEST(DynamicShapes, NearestUpsamplingByItsScalesIsDynamicInSpace) {
  // upsample_nearest2d(self [2, 8, 5, 7], output_size, scales_h, scales_w):
  // output_size floor(in * scale) is a SizeInt of the input's spatial dims.
  const RuleEntry* up = Find("upsample_nearest2d");
  ASSERT_TRUE(up);
  ASSERT_EQ(up->dynamic.size_ints.size(), 2u);
  EXPECT_EQ(up->dynamic.size_ints[1].Of({2, 8, 5, 7}, 1.5), 10);  // floor(7 * 1.5)
  const Arg x = TensorOf({2, 8, 5, 7});
  Arg none;
  const std::set<std::pair<size_t, size_t>> channels{{0, 1}}, batch_only{{0, 1}, {0, 2}, {0, 3}};
  EXPECT_EQ(StaticOf("upsample_nearest2d", {x, Literal(Arg::Kind::IntList, 0, {10, 14}), DoubleOf(2), DoubleOf(2)}).first,
            channels);
  // An output_size alone (its map is the ratio of the sizes), or one the scales do not give: static.
  EXPECT_EQ(StaticOf("upsample_nearest2d", {x, Literal(Arg::Kind::IntList, 0, {10, 14}), none, none}).first, batch_only);
  EXPECT_EQ(StaticOf("upsample_nearest2d", {x, Literal(Arg::Kind::IntList, 0, {11, 14}), DoubleOf(2), DoubleOf(2)}).first,
            batch_only);
  // Bilinear reads the next input element at the border: static in space.
  EXPECT_EQ(StaticOf("upsample_bilinear2d", {x, Literal(Arg::Kind::IntList, 0, {10, 14}), Literal(Arg::Kind::Bool),
                                             DoubleOf(2), DoubleOf(2)}).first,
            batch_only);
}

TEST(DynamicShapes, ConvolutionsAndMaxPoolingsAreDynamicInBatchAndSpace) {
  // convolution(input [b, 3, 16, 16], weight [8, 3, 3, 3], bias [8], ...):
  // static at the bucket on zero-filled padding; its strided results follow
  // the input in steps.
  auto [conv, exact] = StaticOf("convolution", {TensorOf({2, 3, 16, 16}), TensorOf({8, 3, 3, 3}), TensorOf({8})});
  EXPECT_EQ(exact, nullptr);
  std::set<std::pair<size_t, size_t>> want{{0, 1}, {1, 0}, {1, 1}, {1, 2}, {1, 3}, {2, 0}};
  EXPECT_EQ(conv, want);
  EXPECT_TRUE(Find("convolution")->dynamic.stepped_outputs);
  EXPECT_TRUE(Find("convolution_backward")->dynamic.stepped_outputs);
  // max_pool2d_with_indices(self [b, c, h, w]): static at the bucket on -inf
  // padding, its channels static; an unbatched [c, h, w] average pooling
  // keeps its spatial dims static.
  EXPECT_EQ(StaticOf("max_pool2d_with_indices", {TensorOf({2, 8, 6, 6})}).first,
            (std::set<std::pair<size_t, size_t>>{{0, 1}}));
  EXPECT_TRUE(Find("max_pool2d_with_indices")->dynamic.stepped_outputs);
  // avg_pool2d(self [c, h, w], kernel, stride, padding, ceil_mode, count_include_pad,
  // divisor_override): dynamic in space unless a real window clips at the end.
  auto avg = [](bool ceil_mode) {
    return std::vector<Arg>{TensorOf({8, 6, 6}), Literal(Arg::Kind::IntList, 0, {2}), Literal(Arg::Kind::IntList),
                            Literal(Arg::Kind::IntList, 0, {1}), Literal(Arg::Kind::Bool, ceil_mode),
                            Literal(Arg::Kind::Bool, 1), Arg{}};
  };
  EXPECT_EQ(StaticOf("avg_pool2d", avg(false)).first, (std::set<std::pair<size_t, size_t>>{{0, 0}}));
  EXPECT_EQ(StaticOf("avg_pool2d", avg(true)).first,
            (std::set<std::pair<size_t, size_t>>{{0, 0}, {0, 1}, {0, 2}}));
  // A global average pooling (output 1x1) is a mean: dynamic in space; to 2x2, static.
  EXPECT_EQ(StaticOf("_adaptive_avg_pool2d", {TensorOf({2, 8, 6, 6}), Literal(Arg::Kind::IntList, 0, {1, 1})}).first,
            (std::set<std::pair<size_t, size_t>>{{0, 1}}));
  EXPECT_EQ(StaticOf("_adaptive_avg_pool2d", {TensorOf({2, 8, 6, 6}), Literal(Arg::Kind::IntList, 0, {2, 2})}).first,
            (std::set<std::pair<size_t, size_t>>{{0, 1}, {0, 2}, {0, 3}}));
}

TEST(DynamicShapes, OnlyElementwiseRulesRunUnmasked) {
  // Elementwise: the module runs on the padded buffers with no sizes set.
  for (const char* name : {"add.Tensor", "mul.Scalar", "exp", "relu", "gelu", "silu_backward", "where.self",
                           "clone", "fill.Scalar", "zero", "masked_fill.Scalar", "eq.Scalar"})
    EXPECT_TRUE(Find(name) && Find(name)->dynamic.elementwise) << name;
  // Anything that mixes elements across a dim needs XLA's masking.
  for (const char* name : {"sum.dim_IntList", "mm", "_softmax", "cat", "cumsum", "embedding", "index_copy",
                           "_unsafe_index.Tensor", "native_layer_norm", "constant_pad_nd"})
    EXPECT_FALSE(Find(name) && Find(name)->dynamic.elementwise) << name;
}

TEST(DynamicShapes, LayerNormKeepsItsNormalizedDimsStatic) {
  // native_layer_norm(input [b, s, h], normalized_shape [h], weight [h], bias [h], eps)
  auto [dims, exact] = StaticOf("native_layer_norm", {TensorOf({2, 5, 8}), Literal(Arg::Kind::IntList, 0, {8}),
                                                       TensorOf({8}), TensorOf({8}), Literal(Arg::Kind::Double)});
  EXPECT_EQ(exact, nullptr);
  EXPECT_EQ(dims, (std::set<std::pair<size_t, size_t>>{{0, 2}, {2, 0}, {3, 0}}));
}

TEST(DynamicShapes, AttentionKeepsHeadsStaticAlsoInTraining) {
  // (query, key, value [b, h, s, E], attn_bias [b, h, L, S], compute_log_sumexp, ...)
  std::vector<Arg> args = {TensorOf({1, 4, 9, 16}), TensorOf({1, 2, 9, 16}), TensorOf({1, 2, 9, 16}),
                           TensorOf({1, 1, 9, 9}), Literal(Arg::Kind::Bool, 0)};
  auto [dims, exact] = StaticOf("_scaled_dot_product_efficient_attention", args);
  EXPECT_EQ(exact, nullptr);
  std::set<std::pair<size_t, size_t>> heads = {{0, 1}, {0, 3}, {1, 1}, {1, 3}, {2, 1}, {2, 3}, {3, 1}};
  EXPECT_EQ(dims, heads);
  args[4].i = 1;  // saves its logsumexp for backward: the same
  EXPECT_EQ(StaticOf("_scaled_dot_product_efficient_attention", args), std::make_pair(heads, (const char*)nullptr));
}

TEST(DynamicShapes, AttentionStatesItsResults) {
  // (query [2, 4, 5, 16], key [2, 2, 9, 16], value [2, 2, 9, 8], no bias, compute_log_sumexp)
  std::vector<Arg> args = {TensorOf({2, 4, 5, 16}), TensorOf({2, 2, 9, 16}), TensorOf({2, 2, 9, 8}), Arg{},
                           Literal(Arg::Kind::Bool, 1)};
  const DerivedOutputs& derive = Find("_scaled_dot_product_efficient_attention")->dynamic.derived_outputs;
  ASSERT_TRUE(derive);
  auto outs = derive(args);
  ASSERT_TRUE(outs.has_value());
  ASSERT_EQ(outs->size(), 4u);
  EXPECT_EQ((*outs)[0].type.shape, (std::vector<int64_t>{2, 4, 5, 8}));
  EXPECT_EQ((*outs)[0].order, (std::vector<int64_t>{0, 2, 1, 3}));  // [B, L, H, Ev] in memory
  EXPECT_EQ((*outs)[1].type.shape, (std::vector<int64_t>{2, 4, 32}));  // rows rounded up to 32
  EXPECT_EQ((*outs)[1].type.dtype, ElementType::F32);
  args[4].i = 0;
  EXPECT_EQ((*derive(args))[1].type.shape, (std::vector<int64_t>{2, 4, 0}));
  args[2] = TensorOf({3, 2, 9, 8});  // another batch: the meta kernel's
  EXPECT_FALSE(derive(args).has_value());
}

TEST(DynamicShapes, AttentionBackwardKeepsHeadsStaticAlsoWithDropout) {
  // (grad_out, q, k, v, bias, out, logsumexp [b, h, L], seed, offset, dropout_p, ...)
  Arg dropout = Literal(Arg::Kind::Double);
  std::vector<Arg> args = {TensorOf({1, 4, 9, 16}), TensorOf({1, 4, 9, 16}), TensorOf({1, 4, 9, 16}),
                           TensorOf({1, 4, 9, 16}), TensorOf({1, 1, 1, 1}), TensorOf({1, 4, 9, 16}),
                           TensorOf({1, 4, 9}),     TensorOf({}),           TensorOf({}),
                           dropout};
  auto [dims, exact] = StaticOf("_scaled_dot_product_efficient_attention_backward", args);
  EXPECT_EQ(exact, nullptr);
  std::set<std::pair<size_t, size_t>> want = {{0, 1}, {0, 3}, {1, 1}, {1, 3}, {2, 1}, {2, 3}, {3, 1},
                                              {3, 3}, {4, 1}, {5, 1}, {5, 3}, {6, 1}};
  EXPECT_EQ(dims, want);
  args[9].d = 0.1;  // its mask is drawn at the real sizes (RandomBits), as the forward drew it
  auto [with_dropout, exact_with_dropout] = StaticOf("_scaled_dot_product_efficient_attention_backward", args);
  EXPECT_EQ(exact_with_dropout, nullptr);
  EXPECT_EQ(with_dropout, want);
}

TEST(DynamicShapes, DropoutDrawsAtTheRealSizes) {
  const RuleEntry* dropout = Find("native_dropout");
  ASSERT_NE(dropout, nullptr);
  EXPECT_TRUE(dropout->dynamic.enabled);
  EXPECT_TRUE(dropout->dynamic.draws_at_real_sizes);
  EXPECT_TRUE(Find("uniform_")->dynamic.draws_at_real_sizes);  // rand's fill
  EXPECT_TRUE(Find("uniform_")->overwrites_destination);
  EXPECT_TRUE(Find("multinomial")->dynamic.draws_at_real_sizes);  // sampling at a new batch size
  EXPECT_TRUE(Find("log_normal_")->dynamic.draws_at_real_sizes);
  EXPECT_TRUE(Find("normal.Tensor_Tensor")->dynamic.draws_at_real_sizes);  // at mean and std's broadcast sizes
  EXPECT_FALSE(Find("normal.Tensor_Tensor")->overwrites_destination);     // functional: no destination
  EXPECT_FALSE(Find("randperm.generator_out")->dynamic.enabled);           // out= only: exact shapes
}

TEST(DynamicShapes, ConstantPadKeepsCroppedDimsStatic) {
  // constant_pad_nd(self [b, s, h], pad (h: 1, -1), (s: 0, 2)): the crop of h keeps it static
  auto [dims, exact] = StaticOf("constant_pad_nd", {TensorOf({2, 5, 8}), Literal(Arg::Kind::IntList, 0, {1, -1, 0, 2})});
  EXPECT_EQ(exact, nullptr);
  EXPECT_EQ(dims, (std::set<std::pair<size_t, size_t>>{{0, 2}}));
}

TEST(DynamicShapes, LossOpsRunOnRows) {
  // log_softmax over the last dim of [r, V] rows; nll_loss's target padding rows ignored.
  const RuleEntry* ls = Find("_log_softmax");
  EXPECT_EQ(ls->dynamic.rows_args, std::vector<size_t>{0});
  EXPECT_TRUE(ls->dynamic.rows_when({TensorOf({6, 10}), Literal(Arg::Kind::Int, -1), Literal(Arg::Kind::Bool)}));
  EXPECT_FALSE(ls->dynamic.rows_when({TensorOf({6, 10}), Literal(Arg::Kind::Int, 0), Literal(Arg::Kind::Bool)}));
  EXPECT_FALSE(ls->dynamic.rows_when({TensorOf({2, 3, 10}), Literal(Arg::Kind::Int, 2), Literal(Arg::Kind::Bool)}));
  const RuleEntry* nll = Find("nll_loss_forward");
  EXPECT_EQ(nll->dynamic.rows_args, (std::vector<size_t>{0, 1}));
  EXPECT_EQ(nll->dynamic.neutral_rows, std::make_pair(1, 4));  // target <- ignore_index
  EXPECT_EQ(Find("nll_loss_backward")->dynamic.neutral_rows, std::make_pair(2, 5));
}

TEST(DynamicShapes, IndexCopyIsDynamicInEveryDim) {
  // index_copy(self [b, S, h], dim -2, index [n], source [b, n, h]): a KV
  // cache's batch and length, and the prompt's length, may all change.
  auto [dims, exact] = StaticOf("index_copy", {TensorOf({2, 32, 8}), Literal(Arg::Kind::Int, -2),
                                                TensorOf({3}), TensorOf({2, 3, 8})});
  EXPECT_EQ(exact, nullptr);
  EXPECT_TRUE(dims.empty());
}

}  // namespace
}  // namespace torch_tpu::lowering
