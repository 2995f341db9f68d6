#include <gtest/gtest.h>

#include <cmath>

#include "lowering/test_util.h"

namespace torch_tpu::lowering {
namespace {
using testing::HostTensor;
using testing::RunChain;
using testing::RunRule;
using testing::TestArg;

TEST(Elementwise, AddWithAlphaBroadcastsAndPromotes) {
  auto out = RunRule("add.Tensor",
                     {TestArg::T(HostTensor::F32({2, 2}, {1, 2, 3, 4})),
                      TestArg::T(HostTensor::I64({2}, {10, 20})), TestArg::ScalarI(2)},
                     {TensorType{ElementType::F32, {2, 2}}});
  EXPECT_EQ(out[0].As<float>(), (std::vector<float>{21, 42, 23, 44}));
}

TEST(Elementwise, ChainOfTwoRulesInOneModule) {
  // (x * 3) then exp: one module, two rules, as torch.compile will do.
  auto out = RunChain({{"mul.Scalar", {TestArg::T(HostTensor::F32({3}, {0, 1, -1})),
                                       TestArg::ScalarF(3.0)}},
                       {"exp", {TestArg::T(HostTensor::F32({3}, {0, 0, 0}))}}},
                      {{TensorType{ElementType::F32, {3}}}, {TensorType{ElementType::F32, {3}}}});
  auto v = out[0].As<float>();
  EXPECT_FLOAT_EQ(v[0], 1.0f);
  EXPECT_NEAR(v[1], std::exp(3.0f), 1e-4);
  EXPECT_NEAR(v[2], std::exp(-3.0f), 1e-7);
}

TEST(Elementwise, FloorDivideAndRemainderFollowPython) {
  auto x = HostTensor::I64({4}, {7, -7, 7, -7});
  auto y = HostTensor::I64({4}, {2, 2, -2, -2});
  auto q = RunRule("floor_divide", {TestArg::T(x), TestArg::T(y)},
                   {TensorType{ElementType::I64, {4}}});
  EXPECT_EQ(q[0].As<int64_t>(), (std::vector<int64_t>{3, -4, -4, 3}));
  auto r = RunRule("remainder.Tensor", {TestArg::T(x), TestArg::T(y)},
                   {TensorType{ElementType::I64, {4}}});
  EXPECT_EQ(r[0].As<int64_t>(), (std::vector<int64_t>{1, 1, -1, -1}));
}

TEST(Elementwise, CompareInPromotedType) {
  auto out = RunRule("lt.Scalar", {TestArg::T(HostTensor::I64({3}, {0, 1, 2})), TestArg::ScalarF(1.5)},
                     {TensorType{ElementType::Bool, {3}}});
  auto v = out[0].As<uint8_t>();
  EXPECT_TRUE(v[0]);
  EXPECT_TRUE(v[1]);  // 1 < 1.5 only if compared as float
  EXPECT_FALSE(v[2]);
}

TEST(Elementwise, IsNanComparesTheInputNotABoolCast) {
  auto out = RunRule("isnan", {TestArg::T(HostTensor::F32({3}, {1.0f, INFINITY, NAN}))},
                     {TensorType{ElementType::Bool, {3}}});
  EXPECT_EQ(out[0].As<uint8_t>(), (std::vector<uint8_t>{0, 0, 1}));
}

TEST(Elementwise, RsubScalesSelfByAlpha) {
  // rsub(self, other, alpha) = other - alpha * self
  auto out = RunRule("rsub.Tensor",
                     {TestArg::T(HostTensor::I64({2}, {1, 2})),
                      TestArg::T(HostTensor::I64({2}, {10, 20})), TestArg::ScalarI(3)},
                     {TensorType{ElementType::I64, {2}}});
  EXPECT_EQ(out[0].As<int64_t>(), (std::vector<int64_t>{7, 14}));
}

TEST(Elementwise, IntegerPowWrapsAndHandlesNegativeExponents) {
  auto x = HostTensor::I64({5}, {55, -1, -1, 2, 3});
  auto y = HostTensor::I64({5}, {127, -3, -4, -1, 4});
  auto out = RunRule("pow.Tensor_Tensor", {TestArg::T(x), TestArg::T(y)},
                     {TensorType{ElementType::I64, {5}}});
  // 55 ** 127 mod 2**64, as PyTorch's wrapping powi.
  EXPECT_EQ(out[0].As<int64_t>(),
            (std::vector<int64_t>{5131385751627792775LL, -1, 1, 0, 81}));
}

TEST(Elementwise, IsFiniteReturnsBool) {
  auto out = RunRule("isfinite", {TestArg::T(HostTensor::F32({3}, {1.0f, INFINITY, NAN}))},
                     {TensorType{ElementType::Bool, {3}}});
  EXPECT_EQ(out[0].As<uint8_t>(), (std::vector<uint8_t>{1, 0, 0}));
}

TEST(Elementwise, TruncDivideRoundsBf16QuotientFirst) {
  // 18 / -0.546875 = -32.91 rounds to -33 in bf16 before truncation (as on CPU).
  auto x = HostTensor::Of<uint16_t>(ElementType::BF16, {1}, {0x4190});
  auto y = HostTensor::Of<uint16_t>(ElementType::BF16, {1}, {0xBF0C});
  Arg mode;
  mode.kind = Arg::Kind::String;
  mode.s = "trunc";
  auto out = RunRule("div.Tensor_mode", {TestArg::T(x), TestArg::T(y), TestArg::L(mode)},
                     {TensorType{ElementType::BF16, {1}}});
  EXPECT_EQ(out[0].As<uint16_t>(), (std::vector<uint16_t>{0xC204}));
}

TEST(Elementwise, DigammaOfSignedZeroIsInfinite) {
  auto out = RunRule("digamma", {TestArg::T(HostTensor::F32({3}, {0.0f, -0.0f, 1.0f}))},
                     {TensorType{ElementType::F32, {3}}});
  auto v = out[0].As<float>();
  EXPECT_EQ(v[0], -INFINITY);
  EXPECT_EQ(v[1], INFINITY);
  EXPECT_NEAR(v[2], -0.5772157f, 1e-6);
}

TEST(Elementwise, MaximumPropagatesNanFromEitherSide) {
  auto x = HostTensor::F32({3}, {-INFINITY, NAN, 1.0f});
  auto y = HostTensor::F32({3}, {NAN, -INFINITY, 2.0f});
  auto out = RunRule("maximum", {TestArg::T(x), TestArg::T(y)},
                     {TensorType{ElementType::F32, {3}}});
  auto v = out[0].As<float>();
  EXPECT_TRUE(std::isnan(v[0]));
  EXPECT_TRUE(std::isnan(v[1]));
  EXPECT_EQ(v[2], 2.0f);
}

TEST(Elementwise, SignOfNanAndNegativeZeroIsZero) {
  auto out = RunRule("sign", {TestArg::T(HostTensor::F32({4}, {NAN, -0.0f, -3.0f, 2.0f}))},
                     {TensorType{ElementType::F32, {4}}});
  auto v = out[0].As<float>();
  EXPECT_EQ(v[0], 0.0f);
  EXPECT_FALSE(std::signbit(v[1]));
  EXPECT_EQ(v[2], -1.0f);
  EXPECT_EQ(v[3], 1.0f);
}

TEST(Promotion, MatchesPyTorch) {
  auto tensor = [](ElementType t, int rank) {
    Arg a;
    a.kind = Arg::Kind::Tensor;
    a.tensor.type = TensorType{t, std::vector<int64_t>(rank, 2)};
    return a;
  };
  auto scalar = [](ElementType t) {
    Arg a;
    a.kind = Arg::Kind::Scalar;
    a.scalar_type = t;
    return a;
  };
  using E = ElementType;
  Arg i32 = tensor(E::I32, 1), f16 = tensor(E::F16, 1), bf16 = tensor(E::BF16, 1);
  Arg f64_0d = tensor(E::F64, 0), u8 = tensor(E::U8, 1), i8 = tensor(E::I8, 1);
  Arg sf = scalar(E::F64), si = scalar(E::I64);
  EXPECT_EQ(ResultType({&i32, &sf}), E::F32);
  EXPECT_EQ(ResultType({&i32, &si}), E::I32);
  EXPECT_EQ(ResultType({&f16, &bf16}), E::F32);
  EXPECT_EQ(ResultType({&f16, &f64_0d}), E::F16);  // 0-d does not upcast same category
  EXPECT_EQ(ResultType({&i32, &f64_0d}), E::F64);  // but a higher category does
  EXPECT_EQ(ResultType({&u8, &i8}), E::I16);
}

}  // namespace
}  // namespace torch_tpu::lowering
