#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "lowering/test_util.h"

namespace torch_tpu::lowering {
namespace {
using testing::HostTensor;
using testing::RunRule;
using testing::TestArg;

TensorType F32(std::vector<int64_t> shape) { return TensorType{ElementType::F32, shape}; }

HostTensor BF16(std::vector<int64_t> shape, const std::vector<uint16_t>& bits) {
  return HostTensor::Of(ElementType::BF16, std::move(shape), bits);
}

TEST(Linalg, Mm) {
  auto out = RunRule("mm",
                     {TestArg::T(HostTensor::F32({2, 3}, {1, 2, 3, 4, 5, 6})),
                      TestArg::T(HostTensor::F32({3, 2}, {1, 0, 0, 1, 1, -1}))},
                     {F32({2, 2})});
  EXPECT_EQ(out[0].As<float>(), (std::vector<float>{4, -1, 10, -1}));
}

TEST(Linalg, MmInt64IsExact) {
  // 9000000004 is not representable in f32: the product must stay integer.
  auto out = RunRule("mm",
                     {TestArg::T(HostTensor::I64({1, 2}, {3000000001, 1})),
                      TestArg::T(HostTensor::I64({2, 1}, {3, 1}))},
                     {TensorType{ElementType::I64, {1, 1}}});
  EXPECT_EQ(out[0].As<int64_t>(), (std::vector<int64_t>{9000000004}));
}

TEST(Linalg, MmBf16AccumulatesInF32) {
  // [[1, 2], [3, 4]] @ [[0.5, 1], [1, 0.5]] = [[2.5, 2], [5.5, 5]]
  auto out = RunRule("mm",
                     {TestArg::T(BF16({2, 2}, {0x3F80, 0x4000, 0x4040, 0x4080})),
                      TestArg::T(BF16({2, 2}, {0x3F00, 0x3F80, 0x3F80, 0x3F00}))},
                     {TensorType{ElementType::BF16, {2, 2}}});
  EXPECT_EQ(out[0].type.dtype, ElementType::BF16);
  EXPECT_EQ(out[0].As<uint16_t>(), (std::vector<uint16_t>{0x4020, 0x4000, 0x40B0, 0x40A0}));
}

// The module text of `mm` on two [2, 2] tensors of `t`, emitted with
// torch.get_float32_matmul_precision() "highest" or not.
std::string MmText(ElementType t, bool fp32_highest) {
  Builder b("test");
  Arg x;
  x.kind = Arg::Kind::Tensor;
  x.tensor = b.Parameter(TensorType{t, {2, 2}});
  Context ctx{b, {TensorType{t, {2, 2}}}};
  ctx.op = "mm";
  ctx.fp32_highest = fp32_highest;
  b.Return(Find("mm")->rule(ctx, {x, x}));
  return b.ToText();
}

TEST(Linalg, ComplexProductsTakeTheirFloatWidthsPrecision) {
  // complex64 is float32 pairs: HIGHEST exactly when f32 gets it (XLA:GPU
  // multiplied complex64 at reduced precision without it, errors of 1e-3);
  // complex128 always, as float64.
  const std::string highest = "precision HIGHEST";
  EXPECT_NE(MmText(ElementType::C64, true).find(highest), std::string::npos);
  EXPECT_EQ(MmText(ElementType::C64, false).find(highest), std::string::npos);
  EXPECT_NE(MmText(ElementType::C128, false).find(highest), std::string::npos);
  EXPECT_NE(MmText(ElementType::F32, true).find(highest), std::string::npos);
  EXPECT_EQ(MmText(ElementType::F32, false).find(highest), std::string::npos);
}

TEST(Linalg, Bmm) {
  std::vector<float> b1(8), b2(12);
  for (int i = 0; i < 8; ++i) b1[i] = i;
  for (int i = 0; i < 12; ++i) b2[i] = i;
  auto out = RunRule("bmm",
                     {TestArg::T(HostTensor::F32({2, 2, 2}, b1)),
                      TestArg::T(HostTensor::F32({2, 2, 3}, b2))},
                     {F32({2, 2, 3})});
  EXPECT_EQ(out[0].As<float>(),
            (std::vector<float>{3, 4, 5, 9, 14, 19, 69, 78, 87, 99, 112, 125}));
}

TEST(Linalg, AddmmBroadcastsSelfWithBetaAlpha) {
  auto out = RunRule("addmm",
                     {TestArg::T(HostTensor::F32({2}, {10, 20})),
                      TestArg::T(HostTensor::F32({2, 2}, {1, 2, 3, 4})),
                      TestArg::T(HostTensor::F32({2, 2}, {5, 6, 7, 8})), TestArg::ScalarF(2.0),
                      TestArg::ScalarF(0.5)},
                     {F32({2, 2})});
  EXPECT_EQ(out[0].As<float>(), (std::vector<float>{29.5, 51, 41.5, 65}));
}

TEST(Linalg, AddmmBetaZeroIgnoresNaNSelf) {
  float nan = std::numeric_limits<float>::quiet_NaN();
  auto out = RunRule("addmm",
                     {TestArg::T(HostTensor::F32({2, 2}, {nan, nan, nan, nan})),
                      TestArg::T(HostTensor::F32({2, 2}, {1, 2, 3, 4})),
                      TestArg::T(HostTensor::F32({2, 2}, {5, 6, 7, 8})), TestArg::ScalarI(0),
                      TestArg::ScalarI(1)},
                     {F32({2, 2})});
  EXPECT_EQ(out[0].As<float>(), (std::vector<float>{19, 22, 43, 50}));
  // beta != 0: NaN propagates.
  auto nan_out = RunRule("addmm",
                         {TestArg::T(HostTensor::F32({2, 2}, {nan, 0, 0, 0})),
                          TestArg::T(HostTensor::F32({2, 2}, {1, 2, 3, 4})),
                          TestArg::T(HostTensor::F32({2, 2}, {5, 6, 7, 8})),
                          TestArg::ScalarF(1.0), TestArg::ScalarI(1)},
                         {F32({2, 2})});
  auto v = nan_out[0].As<float>();
  EXPECT_TRUE(std::isnan(v[0]));
  EXPECT_EQ(v[3], 50);
}

TEST(Linalg, AddmmInt64) {
  auto out = RunRule("addmm",
                     {TestArg::T(HostTensor::I64({1}, {100})),
                      TestArg::T(HostTensor::I64({2, 2}, {1, 2, 3, 4})),
                      TestArg::T(HostTensor::I64({2, 2}, {5, 6, 7, 8})), TestArg::ScalarI(1),
                      TestArg::ScalarI(2)},
                     {TensorType{ElementType::I64, {2, 2}}});
  EXPECT_EQ(out[0].As<int64_t>(), (std::vector<int64_t>{138, 144, 186, 200}));
}

TEST(Linalg, AddmmBf16) {
  // self 1, [[1, 2], [3, 4]] @ [[0.5, 1], [1, 0.5]] -> [[3.5, 3], [6.5, 6]]
  auto out = RunRule("addmm",
                     {TestArg::T(BF16({2}, {0x3F80, 0x3F80})),
                      TestArg::T(BF16({2, 2}, {0x3F80, 0x4000, 0x4040, 0x4080})),
                      TestArg::T(BF16({2, 2}, {0x3F00, 0x3F80, 0x3F80, 0x3F00})),
                      TestArg::ScalarI(1), TestArg::ScalarI(1)},
                     {TensorType{ElementType::BF16, {2, 2}}});
  EXPECT_EQ(out[0].As<uint16_t>(), (std::vector<uint16_t>{0x4060, 0x4040, 0x40D0, 0x40C0}));
}

TEST(Linalg, BaddbmmBroadcastsSelf) {
  std::vector<float> b1(8), b2(12);
  for (int i = 0; i < 8; ++i) b1[i] = i;
  for (int i = 0; i < 12; ++i) b2[i] = i;
  auto out = RunRule("baddbmm",
                     {TestArg::T(HostTensor::F32({2, 1}, {100, 200})),
                      TestArg::T(HostTensor::F32({2, 2, 2}, b1)),
                      TestArg::T(HostTensor::F32({2, 2, 3}, b2)), TestArg::ScalarI(1),
                      TestArg::ScalarI(2)},
                     {F32({2, 2, 3})});
  EXPECT_EQ(out[0].As<float>(), (std::vector<float>{106, 108, 110, 218, 228, 238, 238, 256,
                                                     274, 398, 424, 450}));
}

TEST(Linalg, AddbmmSumsOverBatch) {
  std::vector<float> b1(8), b2(12);
  for (int i = 0; i < 8; ++i) b1[i] = i;
  for (int i = 0; i < 12; ++i) b2[i] = i;
  auto out = RunRule("addbmm",
                     {TestArg::T(HostTensor::F32({3}, {1, 1, 1})),
                      TestArg::T(HostTensor::F32({2, 2, 2}, b1)),
                      TestArg::T(HostTensor::F32({2, 2, 3}, b2)), TestArg::ScalarI(3),
                      TestArg::ScalarI(1)},
                     {F32({2, 3})});
  EXPECT_EQ(out[0].As<float>(), (std::vector<float>{75, 85, 95, 111, 129, 147}));
}

TEST(Linalg, DotMvAddmv) {
  auto m = HostTensor::F32({2, 2}, {1, 2, 3, 4});
  auto v = HostTensor::F32({2}, {1, -1});
  auto dot = RunRule("dot", {TestArg::T(v), TestArg::T(HostTensor::F32({2}, {3, 4}))},
                     {F32({})});
  EXPECT_EQ(dot[0].As<float>(), (std::vector<float>{-1}));
  auto mv = RunRule("mv", {TestArg::T(m), TestArg::T(v)}, {F32({2})});
  EXPECT_EQ(mv[0].As<float>(), (std::vector<float>{-1, -1}));
  auto addmv = RunRule("addmv",
                       {TestArg::T(HostTensor::F32({2}, {10, 20})), TestArg::T(m),
                        TestArg::T(v), TestArg::ScalarF(0.5), TestArg::ScalarI(3)},
                       {F32({2})});
  EXPECT_EQ(addmv[0].As<float>(), (std::vector<float>{2, 7}));
}

TEST(Linalg, AddmmActivation) {
  auto args = [](bool gelu) {
    return std::vector<TestArg>{TestArg::T(HostTensor::F32({2}, {-30, 0})),
                                TestArg::T(HostTensor::F32({2, 2}, {1, 2, 3, 4})),
                                TestArg::T(HostTensor::F32({2, 2}, {5, 6, 7, 8})),
                                TestArg::ScalarI(1), TestArg::ScalarI(1),
                                TestArg::Bool(gelu)};
  };
  auto relu = RunRule("_addmm_activation", args(false), {F32({2, 2})});
  EXPECT_EQ(relu[0].As<float>(), (std::vector<float>{0, 22, 13, 50}));
  auto gelu = RunRule("_addmm_activation", args(true), {F32({2, 2})});
  auto g = gelu[0].As<float>();
  EXPECT_NEAR(g[0], 0, 1e-6);
  EXPECT_NEAR(g[1], 22, 1e-5);
  EXPECT_NEAR(g[2], 13, 1e-5);
}

}  // namespace
}  // namespace torch_tpu::lowering
