#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "lowering/test_util.h"

namespace torch_tpu::lowering {
namespace {
using testing::HostTensor;
using testing::RunRule;
using testing::TestArg;
using E = ElementType;

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

TensorType T(E t, std::vector<int64_t> shape) { return TensorType{t, std::move(shape)}; }

HostTensor I32(std::vector<int64_t> shape, const std::vector<int32_t>& v) {
  return HostTensor::Of(E::I32, std::move(shape), v);
}
HostTensor Bool(std::vector<int64_t> shape, const std::vector<uint8_t>& v) {
  return HostTensor::Of(E::Bool, std::move(shape), v);
}
TestArg DType(E t) {
  Arg a;
  a.kind = Arg::Kind::ScalarType;
  a.dtype = t;
  return TestArg::L(a);
}

void ExpectNear(const std::vector<float>& got, const std::vector<float>& want,
                float tol = 1e-5f) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << "at " << i << ": " << got[i];
    } else if (std::isinf(want[i])) {
      EXPECT_EQ(got[i], want[i]) << "at " << i;
    } else {
      EXPECT_NEAR(got[i], want[i], tol * std::max(1.0f, std::fabs(want[i]))) << "at " << i;
    }
  }
}

const HostTensor kX23 = HostTensor::F32({2, 3}, {1, 2, 3, 4, 5, 6});

// ---------------------------------------------------------------- sum, mean, prod

TEST(Reduction, SumFullAndOverDims) {
  auto full = RunRule("sum", {TestArg::T(kX23), TestArg::None()}, {T(E::F32, {})});
  EXPECT_EQ(full[0].As<float>(), (std::vector<float>{21}));
  auto rows = RunRule("sum.dim_IntList",
                      {TestArg::T(kX23), TestArg::Ints({-1}), TestArg::Bool(true), TestArg::None()},
                      {T(E::F32, {2, 1})});
  EXPECT_EQ(rows[0].type.shape, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(rows[0].As<float>(), (std::vector<float>{6, 15}));
  auto cols = RunRule("sum.dim_IntList",
                      {TestArg::T(kX23), TestArg::Ints({0}), TestArg::Bool(false), TestArg::None()},
                      {T(E::F32, {3})});
  EXPECT_EQ(cols[0].As<float>(), (std::vector<float>{5, 7, 9}));
  // An empty dim list (and None) means all dims.
  auto all = RunRule("sum.dim_IntList",
                     {TestArg::T(kX23), TestArg::Ints({}), TestArg::Bool(false), TestArg::None()},
                     {T(E::F32, {})});
  EXPECT_EQ(all[0].As<float>(), (std::vector<float>{21}));
  auto none = RunRule("sum.dim_IntList",
                      {TestArg::T(kX23), TestArg::None(), TestArg::Bool(true), TestArg::None()},
                      {T(E::F32, {1, 1})});
  EXPECT_EQ(none[0].As<float>(), (std::vector<float>{21}));
}

TEST(Reduction, SumPromotesIntegersAndBools) {
  auto i = RunRule("sum", {TestArg::T(I32({3}, {2147483647, 1, 2})), TestArg::None()},
                   {T(E::I64, {})});
  EXPECT_EQ(i[0].type.dtype, E::I64);
  EXPECT_EQ(i[0].As<int64_t>(), (std::vector<int64_t>{2147483650LL}));
  auto b = RunRule("sum.dim_IntList",
                   {TestArg::T(Bool({2, 3}, {1, 0, 1, 1, 1, 1})), TestArg::Ints({1}),
                    TestArg::Bool(false), TestArg::None()},
                   {T(E::I64, {2})});
  EXPECT_EQ(b[0].As<int64_t>(), (std::vector<int64_t>{2, 3}));
  // dtype= asks for a float sum of ints.
  auto f = RunRule("sum", {TestArg::T(I32({2}, {1, 2})), DType(E::F64)}, {T(E::F64, {})});
  EXPECT_EQ(f[0].As<double>(), (std::vector<double>{3}));
}

TEST(Reduction, EmptySumIsZeroAndEmptyProdIsOne) {
  auto s = RunRule("sum.dim_IntList",
                   {TestArg::T(HostTensor::F32({0, 2}, {})), TestArg::Ints({0}),
                    TestArg::Bool(false), TestArg::None()},
                   {T(E::F32, {2})});
  EXPECT_EQ(s[0].As<float>(), (std::vector<float>{0, 0}));
  auto p = RunRule("prod", {TestArg::T(HostTensor::F32({0}, {})), TestArg::None()},
                   {T(E::F32, {})});
  EXPECT_EQ(p[0].As<float>(), (std::vector<float>{1}));
  auto m = RunRule("mean", {TestArg::T(HostTensor::F32({0}, {})), TestArg::None()},
                   {T(E::F32, {})});
  EXPECT_TRUE(std::isnan(m[0].As<float>()[0]));
}

TEST(Reduction, Mean) {
  auto full = RunRule("mean", {TestArg::T(kX23), TestArg::None()}, {T(E::F32, {})});
  EXPECT_FLOAT_EQ(full[0].As<float>()[0], 3.5f);
  auto rows = RunRule("mean.dim",
                      {TestArg::T(kX23), TestArg::Ints({-1}), TestArg::Bool(true), TestArg::None()},
                      {T(E::F32, {2, 1})});
  EXPECT_EQ(rows[0].As<float>(), (std::vector<float>{2, 5}));
  // 0-d input, dim -1.
  auto zero_d = RunRule("mean.dim",
                        {TestArg::T(HostTensor::F32({}, {7})), TestArg::Ints({-1}),
                         TestArg::Bool(false), TestArg::None()},
                        {T(E::F32, {})});
  EXPECT_EQ(zero_d[0].As<float>(), (std::vector<float>{7}));
}

TEST(Reduction, Prod) {
  auto full = RunRule("prod", {TestArg::T(kX23), TestArg::None()}, {T(E::F32, {})});
  EXPECT_EQ(full[0].As<float>(), (std::vector<float>{720}));
  auto rows = RunRule("prod.dim_int",
                      {TestArg::T(I32({2, 3}, {1, 2, 3, 4, 5, 6})), TestArg::Int(-1),
                       TestArg::Bool(false), TestArg::None()},
                      {T(E::I64, {2})});
  EXPECT_EQ(rows[0].As<int64_t>(), (std::vector<int64_t>{6, 120}));
  auto keep = RunRule("prod.dim_int",
                      {TestArg::T(kX23), TestArg::Int(0), TestArg::Bool(true), TestArg::None()},
                      {T(E::F32, {1, 3})});
  EXPECT_EQ(keep[0].As<float>(), (std::vector<float>{4, 10, 18}));
}

// ---------------------------------------------------------------- max / min

TEST(Reduction, AmaxAminPropagateNaN) {
  auto x = HostTensor::F32({2, 3}, {1, kNaN, 3, -4, 5, -6});
  auto mx = RunRule("amax", {TestArg::T(x), TestArg::Ints({-1}), TestArg::Bool(false)},
                    {T(E::F32, {2})});
  ExpectNear(mx[0].As<float>(), {kNaN, 5});
  auto mn = RunRule("amin", {TestArg::T(x), TestArg::Ints({0}), TestArg::Bool(true)},
                    {T(E::F32, {1, 3})});
  ExpectNear(mn[0].As<float>(), {-4, kNaN, -6});
  auto all = RunRule("amax", {TestArg::T(kX23), TestArg::Ints({}), TestArg::Bool(false)},
                     {T(E::F32, {})});
  EXPECT_EQ(all[0].As<float>(), (std::vector<float>{6}));
  auto both = RunRule("amin", {TestArg::T(kX23), TestArg::Ints({0, -1}), TestArg::Bool(true)},
                      {T(E::F32, {1, 1})});
  EXPECT_EQ(both[0].As<float>(), (std::vector<float>{1}));
  auto ints = RunRule("amax", {TestArg::T(I32({3}, {-5, 9, 2})), TestArg::Ints({0}),
                               TestArg::Bool(false)},
                      {T(E::I32, {})});
  EXPECT_EQ(ints[0].As<int32_t>(), (std::vector<int32_t>{9}));
}

TEST(Reduction, MaxMinFull) {
  auto mx = RunRule("max", {TestArg::T(HostTensor::F32({4}, {1, kNaN, 3, 2}))},
                    {T(E::F32, {})});
  EXPECT_TRUE(std::isnan(mx[0].As<float>()[0]));
  auto mn = RunRule("min", {TestArg::T(kX23)}, {T(E::F32, {})});
  EXPECT_EQ(mn[0].As<float>(), (std::vector<float>{1}));
  auto b = RunRule("max", {TestArg::T(Bool({3}, {0, 1, 0}))}, {T(E::Bool, {})});
  EXPECT_EQ(b[0].As<uint8_t>(), (std::vector<uint8_t>{1}));
  auto i = RunRule("min", {TestArg::T(HostTensor::I64({3}, {4, -7, 2}))}, {T(E::I64, {})});
  EXPECT_EQ(i[0].As<int64_t>(), (std::vector<int64_t>{-7}));
}

TEST(Reduction, MaxDimValuesAndFirstIndices) {
  auto x = HostTensor::F32({2, 4}, {1, 7, 7, 2, 3, kNaN, 9, kNaN});
  auto r = RunRule("max.dim", {TestArg::T(x), TestArg::Int(-1), TestArg::Bool(false)},
                   {T(E::F32, {2}), T(E::I64, {2})});
  ASSERT_EQ(r.size(), 2u);
  ExpectNear(r[0].As<float>(), {7, kNaN});
  EXPECT_EQ(r[1].As<int64_t>(), (std::vector<int64_t>{1, 1}));  // first tie, first NaN
  auto m = RunRule("min.dim",
                   {TestArg::T(HostTensor::F32({2, 3}, {3, 1, 1, 0, 5, 0})), TestArg::Int(1),
                    TestArg::Bool(true)},
                   {T(E::F32, {2, 1}), T(E::I64, {2, 1})});
  EXPECT_EQ(m[0].As<float>(), (std::vector<float>{1, 0}));
  EXPECT_EQ(m[1].As<int64_t>(), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(m[1].type.shape, (std::vector<int64_t>{2, 1}));
  auto cols = RunRule("max.dim", {TestArg::T(kX23), TestArg::Int(0), TestArg::Bool(false)},
                      {T(E::F32, {3}), T(E::I64, {3})});
  EXPECT_EQ(cols[0].As<float>(), (std::vector<float>{4, 5, 6}));
  EXPECT_EQ(cols[1].As<int64_t>(), (std::vector<int64_t>{1, 1, 1}));
  // A 0-d input: dim 0 is allowed.
  auto s = RunRule("max.dim", {TestArg::T(HostTensor::F32({}, {4})), TestArg::Int(0),
                               TestArg::Bool(false)},
                   {T(E::F32, {}), T(E::I64, {})});
  EXPECT_EQ(s[0].As<float>(), (std::vector<float>{4}));
  EXPECT_EQ(s[1].As<int64_t>(), (std::vector<int64_t>{0}));
}

TEST(Reduction, ArgmaxArgmin) {
  auto x = HostTensor::F32({2, 3}, {5, 1, 5, 0, 0, -2});
  auto flat = RunRule("argmax", {TestArg::T(x), TestArg::None(), TestArg::Bool(false)},
                      {T(E::I64, {})});
  EXPECT_EQ(flat[0].As<int64_t>(), (std::vector<int64_t>{0}));
  auto flat_keep = RunRule("argmin", {TestArg::T(x), TestArg::None(), TestArg::Bool(true)},
                           {T(E::I64, {1, 1})});
  EXPECT_EQ(flat_keep[0].As<int64_t>(), (std::vector<int64_t>{5}));
  auto rows = RunRule("argmin", {TestArg::T(x), TestArg::Int(-1), TestArg::Bool(false)},
                      {T(E::I64, {2})});
  EXPECT_EQ(rows[0].As<int64_t>(), (std::vector<int64_t>{1, 2}));
  auto cols = RunRule("argmax", {TestArg::T(x), TestArg::Int(0), TestArg::Bool(true)},
                      {T(E::I64, {1, 3})});
  EXPECT_EQ(cols[0].As<int64_t>(), (std::vector<int64_t>{0, 0, 0}));
  auto nan = HostTensor::F32({5}, {1, 9, kNaN, 3, kNaN});
  auto amax = RunRule("argmax", {TestArg::T(nan), TestArg::Int(0), TestArg::Bool(false)},
                      {T(E::I64, {})});
  EXPECT_EQ(amax[0].As<int64_t>(), (std::vector<int64_t>{2}));
  auto amin = RunRule("argmin", {TestArg::T(nan), TestArg::None(), TestArg::Bool(false)},
                      {T(E::I64, {})});
  EXPECT_EQ(amin[0].As<int64_t>(), (std::vector<int64_t>{2}));
  auto ints = RunRule("argmax", {TestArg::T(I32({4}, {3, 8, 8, -1})), TestArg::None(),
                                 TestArg::Bool(false)},
                      {T(E::I64, {})});
  EXPECT_EQ(ints[0].As<int64_t>(), (std::vector<int64_t>{1}));
  auto bools = RunRule("argmax", {TestArg::T(Bool({3}, {0, 1, 1})), TestArg::None(),
                                  TestArg::Bool(false)},
                       {T(E::I64, {})});
  EXPECT_EQ(bools[0].As<int64_t>(), (std::vector<int64_t>{1}));
  auto zero_d = RunRule("argmax", {TestArg::T(HostTensor::F32({}, {3})), TestArg::Int(-1),
                                   TestArg::Bool(false)},
                        {T(E::I64, {})});
  EXPECT_EQ(zero_d[0].As<int64_t>(), (std::vector<int64_t>{0}));
}

// ---------------------------------------------------------------- var / std

const HostTensor kV = HostTensor::F32({2, 4}, {1, 2, 3, 4, 2, 4, 4, 8});

TEST(Reduction, VarStdWithCorrection) {
  auto var = RunRule("var.correction",
                     {TestArg::T(kV), TestArg::Ints({1}), TestArg::None(), TestArg::Bool(false)},
                     {T(E::F32, {2})});
  ExpectNear(var[0].As<float>(), {5.0f / 3, 19.0f / 3});
  auto std0 = RunRule("std.correction",
                      {TestArg::T(kV), TestArg::Ints({-1}), TestArg::ScalarI(0),
                       TestArg::Bool(false)},
                      {T(E::F32, {2})});
  ExpectNear(std0[0].As<float>(), {std::sqrt(1.25f), std::sqrt(4.75f)});
  auto cols = RunRule("var.correction",
                      {TestArg::T(kV), TestArg::Ints({0}), TestArg::ScalarF(1.0),
                       TestArg::Bool(true)},
                      {T(E::F32, {1, 4})});
  ExpectNear(cols[0].As<float>(), {0.5, 2, 0.5, 8});
  auto all = RunRule("var.correction",
                     {TestArg::T(kV), TestArg::None(), TestArg::None(), TestArg::Bool(false)},
                     {T(E::F32, {})});
  // mean 3.5; squared deviations sum 6.25+2.25+.25+.25+2.25+.25+.25+20.25 = 32
  ExpectNear(all[0].As<float>(), {32.0f / 7});
}

TEST(Reduction, VarMeanAndStdMean) {
  auto vm = RunRule("var_mean.correction",
                    {TestArg::T(kV), TestArg::Ints({-1}), TestArg::ScalarI(2),
                     TestArg::Bool(false)},
                    {T(E::F32, {2}), T(E::F32, {2})});
  ASSERT_EQ(vm.size(), 2u);
  ExpectNear(vm[0].As<float>(), {2.5, 9.5});
  ExpectNear(vm[1].As<float>(), {2.5, 4.5});
  auto sm = RunRule("std_mean.correction",
                    {TestArg::T(kV), TestArg::Ints({1}), TestArg::None(), TestArg::Bool(true)},
                    {T(E::F32, {2, 1}), T(E::F32, {2, 1})});
  ExpectNear(sm[0].As<float>(), {std::sqrt(5.0f / 3), std::sqrt(19.0f / 3)});
  ExpectNear(sm[1].As<float>(), {2.5, 4.5});
}

TEST(Reduction, VarWithTooFewSamplesIsNanOrInf) {
  // n == correction: 0/0 = nan for a constant row, x/0 = inf otherwise.
  auto one = RunRule("var.correction",
                     {TestArg::T(HostTensor::F32({2, 1}, {3, 4})), TestArg::Ints({1}),
                      TestArg::None(), TestArg::Bool(false)},
                     {T(E::F32, {2})});
  ExpectNear(one[0].As<float>(), {kNaN, kNaN});
  auto two = RunRule("var.correction",
                     {TestArg::T(HostTensor::F32({2}, {1, 3})), TestArg::None(),
                      TestArg::ScalarI(3), TestArg::Bool(false)},
                     {T(E::F32, {})});
  ExpectNear(two[0].As<float>(), {kInf});
  auto zero_d = RunRule("std.correction",
                        {TestArg::T(HostTensor::F32({}, {3})), TestArg::None(), TestArg::None(),
                         TestArg::Bool(false)},
                        {T(E::F32, {})});
  ExpectNear(zero_d[0].As<float>(), {kNaN});
}

// ---------------------------------------------------------------- any / all

TEST(Reduction, AnyAll) {
  auto x = HostTensor::F32({2, 3}, {0, 0, 2, 1, 1, 1});
  auto any = RunRule("any", {TestArg::T(x)}, {T(E::Bool, {})});
  EXPECT_EQ(any[0].As<uint8_t>(), (std::vector<uint8_t>{1}));
  auto all = RunRule("all", {TestArg::T(x)}, {T(E::Bool, {})});
  EXPECT_EQ(all[0].As<uint8_t>(), (std::vector<uint8_t>{0}));
  auto any_rows = RunRule("any.dim", {TestArg::T(HostTensor::F32({2, 2}, {0, 0, 0, 5})),
                                      TestArg::Int(-1), TestArg::Bool(true)},
                          {T(E::Bool, {2, 1})});
  EXPECT_EQ(any_rows[0].As<uint8_t>(), (std::vector<uint8_t>{0, 1}));
  auto all_rows = RunRule("all.dim", {TestArg::T(x), TestArg::Int(1), TestArg::Bool(false)},
                          {T(E::Bool, {2})});
  EXPECT_EQ(all_rows[0].As<uint8_t>(), (std::vector<uint8_t>{0, 1}));
  auto all_dims = RunRule("all.dims", {TestArg::T(x), TestArg::Ints({0, 1}),
                                       TestArg::Bool(false)},
                          {T(E::Bool, {})});
  EXPECT_EQ(all_dims[0].As<uint8_t>(), (std::vector<uint8_t>{0}));
  auto any_none = RunRule("any.dims", {TestArg::T(x), TestArg::None(), TestArg::Bool(false)},
                          {T(E::Bool, {})});
  EXPECT_EQ(any_none[0].As<uint8_t>(), (std::vector<uint8_t>{1}));
  // any.dims with an empty list reduces nothing (as PyTorch).
  auto any_empty = RunRule("any.dims", {TestArg::T(x), TestArg::Ints({}), TestArg::Bool(false)},
                           {T(E::Bool, {2, 3})});
  EXPECT_EQ(any_empty[0].As<uint8_t>(), (std::vector<uint8_t>{0, 0, 1, 1, 1, 1}));
  // uint8 input keeps uint8.
  auto u8 = RunRule("all", {TestArg::T(HostTensor::Of<uint8_t>(E::U8, {2}, {3, 7}))},
                    {T(E::U8, {})});
  EXPECT_EQ(u8[0].type.dtype, E::U8);
  EXPECT_EQ(u8[0].As<uint8_t>(), (std::vector<uint8_t>{1}));
  auto empty = RunRule("all", {TestArg::T(HostTensor::F32({0}, {}))}, {T(E::Bool, {})});
  EXPECT_EQ(empty[0].As<uint8_t>(), (std::vector<uint8_t>{1}));
}

// ---------------------------------------------------------------- logsumexp, softmax

TEST(Reduction, LogSumExpIsStable) {
  auto x = HostTensor::F32({3, 3}, {1, 2, 3, 1000, 1000, -kInf, -kInf, -kInf, -kInf});
  auto r = RunRule("logsumexp", {TestArg::T(x), TestArg::Ints({1}), TestArg::Bool(false)},
                   {T(E::F32, {3})});
  float want0 = std::log(std::exp(1.0f) + std::exp(2.0f) + std::exp(3.0f));
  ExpectNear(r[0].As<float>(), {want0, 1000 + std::log(2.0f), -kInf});
  auto inf = RunRule("logsumexp", {TestArg::T(HostTensor::F32({2}, {kInf, 1})),
                                   TestArg::Ints({-1}), TestArg::Bool(true)},
                     {T(E::F32, {1})});
  ExpectNear(inf[0].As<float>(), {kInf});
  // Integer input computes in float.
  auto ints = RunRule("logsumexp", {TestArg::T(HostTensor::I64({2, 2}, {1, 2, 3, 4})),
                                    TestArg::Ints({1}), TestArg::Bool(false)},
                      {T(E::F32, {2})});
  ExpectNear(ints[0].As<float>(), {2.3132617f, 4.3132617f});
}

TEST(Reduction, SoftmaxRowsSumToOne) {
  auto x = HostTensor::F32({2, 3}, {1, 2, 3, 1000, 1001, 1002});
  auto r = RunRule("_softmax", {TestArg::T(x), TestArg::Int(-1), TestArg::Bool(false)},
                   {T(E::F32, {2, 3})});
  auto v = r[0].As<float>();
  float e1 = std::exp(-2.0f), e2 = std::exp(-1.0f), s = e1 + e2 + 1;
  ExpectNear(v, {e1 / s, e2 / s, 1 / s, e1 / s, e2 / s, 1 / s});
  for (int row = 0; row < 2; ++row)
    EXPECT_NEAR(v[3 * row] + v[3 * row + 1] + v[3 * row + 2], 1.0f, 1e-6);
  auto cols = RunRule("_softmax", {TestArg::T(HostTensor::F32({2, 2}, {0, 5, 0, 5})),
                                   TestArg::Int(0), TestArg::Bool(false)},
                      {T(E::F32, {2, 2})});
  ExpectNear(cols[0].As<float>(), {0.5, 0.5, 0.5, 0.5});
  auto zero_d = RunRule("_softmax", {TestArg::T(HostTensor::F32({}, {3})), TestArg::Int(0),
                                     TestArg::Bool(false)},
                        {T(E::F32, {})});
  EXPECT_EQ(zero_d[0].As<float>(), (std::vector<float>{1}));
  // A masked (-inf) entry gets 0.
  auto masked = RunRule("_softmax", {TestArg::T(HostTensor::F32({3}, {0, -kInf, 0})),
                                     TestArg::Int(0), TestArg::Bool(false)},
                        {T(E::F32, {3})});
  ExpectNear(masked[0].As<float>(), {0.5, 0, 0.5});
}

TEST(Reduction, SoftmaxHalfToFloat) {
  // bf16 1.0, 2.0, 3.0 (bit patterns), output f32.
  auto x = HostTensor::Of<uint16_t>(E::BF16, {3}, {0x3F80, 0x4000, 0x4040});
  auto r = RunRule("_softmax", {TestArg::T(x), TestArg::Int(0), TestArg::Bool(true)},
                   {T(E::F32, {3})});
  EXPECT_EQ(r[0].type.dtype, E::F32);
  float s = std::exp(1.0f) + std::exp(2.0f) + std::exp(3.0f);
  ExpectNear(r[0].As<float>(), {std::exp(1.0f) / s, std::exp(2.0f) / s, std::exp(3.0f) / s});
}

TEST(Reduction, LogSoftmax) {
  auto x = HostTensor::F32({2, 2}, {0, 0, 1, 3});
  auto r = RunRule("_log_softmax", {TestArg::T(x), TestArg::Int(1), TestArg::Bool(false)},
                   {T(E::F32, {2, 2})});
  float l = std::log(std::exp(1.0f) + std::exp(3.0f));
  ExpectNear(r[0].As<float>(), {-std::log(2.0f), -std::log(2.0f), 1 - l, 3 - l});
}

TEST(Reduction, SoftmaxBackward) {
  // y = softmax output rows, g = upstream grads: dx = y * (g - sum(g * y)).
  auto y = HostTensor::F32({2, 2}, {0.25, 0.75, 0.5, 0.5});
  auto g = HostTensor::F32({2, 2}, {1, 2, 3, -1});
  auto r = RunRule("_softmax_backward_data",
                   {TestArg::T(g), TestArg::T(y), TestArg::Int(-1), DType(E::F32)},
                   {T(E::F32, {2, 2})});
  float s0 = 0.25f + 1.5f, s1 = 1.5f - 0.5f;
  ExpectNear(r[0].As<float>(), {0.25f * (1 - s0), 0.75f * (2 - s0), 0.5f * (3 - s1),
                                0.5f * (-1 - s1)});
  // log_softmax: dx = g - exp(y) * sum(g), y the log-probabilities.
  auto ly = HostTensor::F32({2, 2}, {std::log(0.25f), std::log(0.75f), std::log(0.5f),
                                     std::log(0.5f)});
  auto lr = RunRule("_log_softmax_backward_data",
                    {TestArg::T(g), TestArg::T(ly), TestArg::Int(1), DType(E::F32)},
                    {T(E::F32, {2, 2})});
  ExpectNear(lr[0].As<float>(), {1 - 0.25f * 3, 2 - 0.75f * 3, 3 - 0.5f * 2, -1 - 0.5f * 2});
}

// ---------------------------------------------------------------- norms

TEST(Reduction, VectorNormRuntimeOrd) {
  auto x = HostTensor::F32({2, 3}, {3, 0, -4, 1, -2, 2});
  auto norm = [&](TestArg ord) {
    return RunRule("linalg_vector_norm",
                   {TestArg::T(x), std::move(ord), TestArg::Ints({-1}), TestArg::Bool(false),
                    TestArg::None()},
                   {T(E::F32, {2})})[0]
        .As<float>();
  };
  ExpectNear(norm(TestArg::ScalarI(2)), {5, 3});
  ExpectNear(norm(TestArg::ScalarF(1)), {7, 5});
  ExpectNear(norm(TestArg::ScalarF(kInf)), {4, 2});
  ExpectNear(norm(TestArg::ScalarF(-kInf)), {0, 1});
  ExpectNear(norm(TestArg::ScalarI(0)), {2, 3});
  ExpectNear(norm(TestArg::ScalarI(3)), {std::cbrt(91.0f), std::cbrt(17.0f)}, 1e-4f);
  ExpectNear(norm(TestArg::ScalarF(-1)), {0, 0.5f}, 1e-4f);
  auto all = RunRule("linalg_vector_norm",
                     {TestArg::T(x), TestArg::ScalarI(2), TestArg::None(), TestArg::Bool(true),
                      TestArg::None()},
                     {T(E::F32, {1, 1})});
  ExpectNear(all[0].As<float>(), {std::sqrt(34.0f)});
}

// ---------------------------------------------------------------- cumulative

TEST(Reduction, CumsumCumprod) {
  auto s = RunRule("cumsum", {TestArg::T(I32({2, 5}, {1, 2, 3, 4, 5, 1, 1, 1, 1, 1})),
                              TestArg::Int(-1), TestArg::None()},
                   {T(E::I64, {2, 5})});
  EXPECT_EQ(s[0].As<int64_t>(), (std::vector<int64_t>{1, 3, 6, 10, 15, 1, 2, 3, 4, 5}));
  auto cols = RunRule("cumsum", {TestArg::T(kX23), TestArg::Int(0), TestArg::None()},
                      {T(E::F32, {2, 3})});
  EXPECT_EQ(cols[0].As<float>(), (std::vector<float>{1, 2, 3, 5, 7, 9}));
  auto p = RunRule("cumprod", {TestArg::T(HostTensor::F32({9}, {1, 2, 3, 4, 5, 6, 7, 0.5, 2})),
                               TestArg::Int(0), TestArg::None()},
                   {T(E::F32, {9})});
  ExpectNear(p[0].As<float>(), {1, 2, 6, 24, 120, 720, 5040, 2520, 5040});
  auto b = RunRule("cumsum", {TestArg::T(Bool({3}, {1, 0, 1})), TestArg::Int(0),
                              TestArg::None()},
                   {T(E::I64, {3})});
  EXPECT_EQ(b[0].As<int64_t>(), (std::vector<int64_t>{1, 1, 2}));
  auto zero_d = RunRule("cumprod", {TestArg::T(HostTensor::F32({}, {4})), TestArg::Int(0),
                                    TestArg::None()},
                        {T(E::F32, {})});
  EXPECT_EQ(zero_d[0].As<float>(), (std::vector<float>{4}));
  auto empty = RunRule("cumsum", {TestArg::T(HostTensor::F32({0, 3}, {})), TestArg::Int(0),
                                  TestArg::None()},
                       {T(E::F32, {0, 3})});
  EXPECT_TRUE(empty[0].As<float>().empty());
  // A long row: 1..100.
  std::vector<float> ones(100, 1), want(100);
  for (int i = 0; i < 100; ++i) want[i] = static_cast<float>(i + 1);
  auto longer = RunRule("cumsum", {TestArg::T(HostTensor::F32({100}, ones)), TestArg::Int(0),
                                   TestArg::None()},
                        {T(E::F32, {100})});
  EXPECT_EQ(longer[0].As<float>(), want);
}

TEST(Reduction, AccumulationTypes) {
  // bf16 sums accumulate in f32: 256 + 1 + 1 + ... would stall at 256 in bf16.
  std::vector<uint16_t> bits(17, 0x3F80);  // 1.0
  bits[0] = 0x4380;                        // 256.0
  auto s = RunRule("sum", {TestArg::T(HostTensor::Of<uint16_t>(E::BF16, {17}, bits)),
                           TestArg::None()},
                   {T(E::BF16, {})});
  EXPECT_EQ(s[0].type.dtype, E::BF16);
  EXPECT_EQ(s[0].As<uint16_t>(), (std::vector<uint16_t>{0x4388}));  // 272.0
  // f64 stays f64.
  auto d = RunRule("mean", {TestArg::T(HostTensor::Of<double>(E::F64, {3}, {1e300, 2e300, 3e300})),
                            TestArg::None()},
                   {T(E::F64, {})});
  EXPECT_DOUBLE_EQ(d[0].As<double>()[0], 2e300);  // overflows in f32
  // max.dim of ints and bools.
  auto i = RunRule("min.dim", {TestArg::T(I32({4}, {3, -2, 7, -2})), TestArg::Int(0),
                               TestArg::Bool(false)},
                   {T(E::I32, {}), T(E::I64, {})});
  EXPECT_EQ(i[0].As<int32_t>(), (std::vector<int32_t>{-2}));
  EXPECT_EQ(i[1].As<int64_t>(), (std::vector<int64_t>{1}));
  auto b = RunRule("max.dim", {TestArg::T(Bool({2, 2}, {0, 1, 0, 0})), TestArg::Int(1),
                               TestArg::Bool(false)},
                   {T(E::Bool, {2}), T(E::I64, {2})});
  EXPECT_EQ(b[0].As<uint8_t>(), (std::vector<uint8_t>{1, 0}));
  EXPECT_EQ(b[1].As<int64_t>(), (std::vector<int64_t>{1, 0}));
}

TEST(Reduction, VectorNormBakedOrd) {
  Arg ord;
  ord.kind = Arg::Kind::Double;
  ord.d = 3;
  auto r = RunRule("linalg_vector_norm",
                   {TestArg::T(HostTensor::F32({2}, {-1, 2})), TestArg::L(ord), TestArg::None(),
                    TestArg::Bool(false), TestArg::None()},
                   {T(E::F32, {})});
  ExpectNear(r[0].As<float>(), {std::cbrt(9.0f)}, 1e-4f);
  ord.d = 2;
  auto two = RunRule("linalg_vector_norm",
                     {TestArg::T(HostTensor::F32({2}, {3, -4})), TestArg::L(ord),
                      TestArg::None(), TestArg::Bool(false), TestArg::None()},
                     {T(E::F32, {})});
  EXPECT_EQ(two[0].As<float>(), (std::vector<float>{5}));
}

TEST(Reduction, VariantsAreRegistered) {
  for (const char* name : {"sum.IntList_out", "max.dim_max", "cumsum_", "any.all_out",
                           "var_mean.correction_out", "_softmax.out"})
    EXPECT_NE(Find(name), nullptr) << name;
  EXPECT_EQ(Find("any.out"), Find("any.dim"));
  EXPECT_EQ(Find("mean.out"), Find("mean.dim"));
}

}  // namespace
}  // namespace torch_tpu::lowering
