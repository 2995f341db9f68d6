#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "lowering/test_util.h"

namespace torch_tpu::lowering {
namespace {
using testing::HostTensor;
using testing::RunRule;
using testing::TestArg;

TensorType F32(std::vector<int64_t> shape) { return TensorType{ElementType::F32, shape}; }
TensorType I64(std::vector<int64_t> shape) { return TensorType{ElementType::I64, shape}; }

std::vector<float> Iota(int n) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

// Runs a rule whose first argument is a Tensor[] (RunRule has no list args);
// `rest` are literal args that follow it.
HostTensor RunListRule(const std::string& name, const std::vector<HostTensor>& list,
                       const std::vector<Arg>& rest, const TensorType& output) {
  Builder b("test");
  auto& client = testing::TestClient();
  std::vector<pjrt::BufferPtr> keep;
  std::vector<PJRT_Buffer*> params;
  Arg tensors;
  tensors.kind = Arg::Kind::TensorList;
  for (const HostTensor& h : list) {
    keep.push_back(client.FromHost(h.bytes.data(), testing::ToPjrt(h.type.dtype),
                                   h.type.shape, 0));
    params.push_back(keep.back()->raw());
    tensors.tensors.push_back(b.Parameter(h.type));
  }
  std::vector<Arg> args{tensors};
  args.insert(args.end(), rest.begin(), rest.end());
  Context ctx{b, {output}};
  ctx.op = name;
  std::vector<Value> results = Find(name)->rule(ctx, args);
  EXPECT_EQ(results.at(0).type, output);
  b.Return(results);
  auto exe = client.Compile(b.ToText(), 0);
  auto outs = exe->Execute(params, {});
  HostTensor h{output, {}};
  h.bytes.resize(output.numel() * hlo::ByteSize(output.dtype));
  if (!h.bytes.empty()) outs[0]->ToHost(h.bytes.data(), h.bytes.size());
  return h;
}

Arg IntArg(int64_t v) {
  Arg a;
  a.kind = Arg::Kind::Int;
  a.i = v;
  return a;
}

TEST(TensorOps, CatMixedDtypesSkipsLegacyEmpty) {
  auto out = RunListRule("cat",
                         {HostTensor::I64({1, 2}, {1, 2}), HostTensor::F32({0}, {}),
                          HostTensor::F32({1, 2}, {3.5, 4.5})},
                         {IntArg(0)}, F32({2, 2}));
  EXPECT_EQ(out.As<float>(), (std::vector<float>{1, 2, 3.5, 4.5}));
}

TEST(TensorOps, CatNegativeDim) {
  auto out = RunListRule("cat",
                         {HostTensor::F32({2, 1}, {1, 2}), HostTensor::F32({2, 2}, {3, 4, 5, 6})},
                         {IntArg(-1)}, F32({2, 3}));
  EXPECT_EQ(out.As<float>(), (std::vector<float>{1, 3, 4, 2, 5, 6}));
}

TEST(TensorOps, StackOnNewLastDim) {
  auto out = RunListRule("stack",
                         {HostTensor::F32({2}, {1, 2}), HostTensor::F32({2}, {3, 4}),
                          HostTensor::F32({2}, {5, 6})},
                         {IntArg(-1)}, F32({2, 3}));
  EXPECT_EQ(out.As<float>(), (std::vector<float>{1, 3, 5, 2, 4, 6}));
}

TEST(TensorOps, CloneAndFill) {
  auto x = HostTensor::F32({3}, {1, 2, 3});
  auto clone = RunRule("clone", {TestArg::T(x), TestArg::None()}, {F32({3})});
  EXPECT_EQ(clone[0].As<float>(), (std::vector<float>{1, 2, 3}));
  auto fill = RunRule("fill.Scalar", {TestArg::T(x), TestArg::ScalarF(2.5)}, {F32({3})});
  EXPECT_EQ(fill[0].As<float>(), (std::vector<float>{2.5, 2.5, 2.5}));
  auto fill_t = RunRule("fill.Tensor",
                        {TestArg::T(HostTensor::I64({2}, {0, 0})),
                         TestArg::T(HostTensor::F32({}, {7.9f}))},
                        {I64({2})});
  EXPECT_EQ(fill_t[0].As<int64_t>(), (std::vector<int64_t>{7, 7}));
  auto zero = RunRule("zero", {TestArg::T(x)}, {F32({3})});
  EXPECT_EQ(zero[0].As<float>(), (std::vector<float>{0, 0, 0}));
}

TEST(TensorOps, ArangeFloatStep) {
  auto out = RunRule("arange.start_out",
                     {TestArg::ScalarF(0.5), TestArg::ScalarF(2.0), TestArg::ScalarF(0.3)},
                     {F32({5})});
  EXPECT_EQ(out[0].As<float>(), (std::vector<float>{0.5f, 0.8f, 1.1f, 1.4f, 1.7f}));
  auto ints = RunRule("arange.start_out",
                      {TestArg::ScalarI(-2), TestArg::ScalarI(7), TestArg::ScalarI(3)},
                      {I64({3})});
  EXPECT_EQ(ints[0].As<int64_t>(), (std::vector<int64_t>{-2, 1, 4}));
}

TEST(TensorOps, Linspace) {
  auto out = RunRule("linspace.out", {TestArg::ScalarI(-1), TestArg::ScalarI(1), TestArg::Int(5)},
                     {F32({5})});
  EXPECT_EQ(out[0].As<float>(), (std::vector<float>{-1, -0.5, 0, 0.5, 1}));
  auto sevenths = RunRule("linspace.out",
                          {TestArg::ScalarF(0), TestArg::ScalarF(1), TestArg::Int(7)}, {F32({7})});
  // Bit-exact with PyTorch CPU (the second half counts down from end).
  EXPECT_EQ(sevenths[0].As<float>(),
            (std::vector<float>{0.0f, 0.1666666716337204f, 0.3333333432674408f, 0.5f,
                                0.6666666269302368f, 0.8333333134651184f, 1.0f}));
  auto ints = RunRule("linspace.out",
                      {TestArg::ScalarI(0), TestArg::ScalarI(10), TestArg::Int(4)}, {I64({4})});
  EXPECT_EQ(ints[0].As<int64_t>(), (std::vector<int64_t>{0, 3, 6, 10}));
  auto one = RunRule("linspace.out", {TestArg::ScalarF(3), TestArg::ScalarF(9), TestArg::Int(1)},
                     {F32({1})});
  EXPECT_EQ(one[0].As<float>(), (std::vector<float>{3}));
}

TEST(TensorOps, LinspaceMatchesCpuRounding) {
  // Values of torch.linspace(-3.7, 100, 1000) on CPU where an unfused
  // start + i * step in f32 would differ by one ulp.
  auto out = RunRule("linspace.out",
                     {TestArg::ScalarF(-3.7), TestArg::ScalarI(100), TestArg::Int(1000)},
                     {F32({1000})});
  auto v = out[0].As<float>();
  EXPECT_EQ(v[11], -2.5581581592559814f);
  EXPECT_EQ(v[14], -2.246746778488159f);
  EXPECT_EQ(v[15], -2.1429431438446045f);
  EXPECT_EQ(v[953], 95.22502899169922f);
  EXPECT_EQ(v[975], 97.50870513916016f);
  EXPECT_EQ(v[0], -3.7f);
  EXPECT_EQ(v[999], 100.0f);
  // 16-bit floats round after every operation (bit patterns from PyTorch).
  auto bf = RunRule("linspace.out",
                    {TestArg::ScalarF(-3.7), TestArg::ScalarI(100), TestArg::Int(37)},
                    {TensorType{ElementType::BF16, {37}}});
  EXPECT_EQ(bf[0].As<int16_t>(),
            (std::vector<int16_t>{-16275, -16556, 16387, 16542, 16634, 16683, 16729, 16771,
                                  16794, 16817, 16840, 16863, 16886, 16903, 16914, 16925,
                                  16937, 16949, 16961, 16972, 16984, 16996, 17007, 17018,
                                  17027, 17033, 17038, 17044, 17050, 17056, 17062, 17067,
                                  17073, 17079, 17084, 17090, 17096}));
  auto h = RunRule("linspace.out",
                   {TestArg::ScalarF(0.1), TestArg::ScalarF(7.3), TestArg::Int(11)},
                   {TensorType{ElementType::F16, {11}}});
  EXPECT_EQ(h[0].As<int16_t>(), (std::vector<int16_t>{11878, 14991, 15912, 16517, 16885, 17256,
                                                       17516, 17700, 17884, 18069, 18253}));
}

TEST(TensorOps, Eye) {
  auto out = RunRule("eye.m_out", {TestArg::Int(2), TestArg::Int(3)}, {F32({2, 3})});
  EXPECT_EQ(out[0].As<float>(), (std::vector<float>{1, 0, 0, 0, 1, 0}));
  auto sq = RunRule("eye.out", {TestArg::Int(2)}, {TensorType{ElementType::Bool, {2, 2}}});
  EXPECT_EQ(sq[0].As<uint8_t>(), (std::vector<uint8_t>{1, 0, 0, 1}));
}

TEST(TensorOps, FlipRollTrilTriu) {
  auto x = HostTensor::F32({2, 3}, Iota(6));
  auto flip = RunRule("flip", {TestArg::T(x), TestArg::Ints({1})}, {F32({2, 3})});
  EXPECT_EQ(flip[0].As<float>(), (std::vector<float>{2, 1, 0, 5, 4, 3}));
  auto roll = RunRule("roll", {TestArg::T(x), TestArg::Ints({1}), TestArg::Ints({})},
                      {F32({2, 3})});
  EXPECT_EQ(roll[0].As<float>(), (std::vector<float>{5, 0, 1, 2, 3, 4}));
  auto roll2 = RunRule("roll", {TestArg::T(x), TestArg::Ints({1, -1}), TestArg::Ints({0, 1})},
                       {F32({2, 3})});
  EXPECT_EQ(roll2[0].As<float>(), (std::vector<float>{4, 5, 3, 1, 2, 0}));
  auto tril = RunRule("tril", {TestArg::T(x), TestArg::Int(0)}, {F32({2, 3})});
  EXPECT_EQ(tril[0].As<float>(), (std::vector<float>{0, 0, 0, 3, 4, 0}));
  auto tril_m1 = RunRule("tril", {TestArg::T(x), TestArg::Int(-1)}, {F32({2, 3})});
  EXPECT_EQ(tril_m1[0].As<float>(), (std::vector<float>{0, 0, 0, 3, 0, 0}));
  auto triu = RunRule("triu", {TestArg::T(x), TestArg::Int(1)}, {F32({2, 3})});
  EXPECT_EQ(triu[0].As<float>(), (std::vector<float>{0, 1, 2, 0, 0, 5}));
}

TEST(TensorOps, TriuBatched) {
  auto x = HostTensor::F32({2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  auto out = RunRule("triu", {TestArg::T(x), TestArg::Int(0)}, {F32({2, 2, 2})});
  EXPECT_EQ(out[0].As<float>(), (std::vector<float>{1, 2, 0, 4, 5, 6, 0, 8}));
}

TEST(TensorOps, Repeat) {
  auto x = HostTensor::F32({2, 3}, Iota(6));
  auto out = RunRule("repeat", {TestArg::T(x), TestArg::Ints({1, 2})}, {F32({2, 6})});
  EXPECT_EQ(out[0].As<float>(), (std::vector<float>{0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5}));
  auto grown = RunRule("repeat", {TestArg::T(HostTensor::F32({2}, {1, 2})), TestArg::Ints({2, 2})},
                       {F32({2, 4})});
  EXPECT_EQ(grown[0].As<float>(), (std::vector<float>{1, 2, 1, 2, 1, 2, 1, 2}));
}

TEST(TensorOps, MaskedFill) {
  auto x = HostTensor::F32({2, 2}, {1, 2, 3, 4});
  auto mask = HostTensor::Of<uint8_t>(ElementType::Bool, {2}, {1, 0});  // broadcast rows
  auto out = RunRule("masked_fill.Scalar", {TestArg::T(x), TestArg::T(mask), TestArg::ScalarF(-1)},
                     {F32({2, 2})});
  EXPECT_EQ(out[0].As<float>(), (std::vector<float>{-1, 2, -1, 4}));
  auto t = RunRule("masked_fill.Tensor",
                   {TestArg::T(x), TestArg::T(mask), TestArg::T(HostTensor::F32({}, {9}))},
                   {F32({2, 2})});
  EXPECT_EQ(t[0].As<float>(), (std::vector<float>{9, 2, 9, 4}));
}

TEST(TensorOps, ConstantPadNd) {
  auto x = HostTensor::F32({2, 3}, Iota(6));
  auto out = RunRule("constant_pad_nd", {TestArg::T(x), TestArg::Ints({1, 0, 0, 1}),
                                         TestArg::ScalarF(9)},
                     {F32({3, 4})});
  EXPECT_EQ(out[0].As<float>(), (std::vector<float>{9, 0, 1, 2, 9, 3, 4, 5, 9, 9, 9, 9}));
  auto crop = RunRule("constant_pad_nd", {TestArg::T(x), TestArg::Ints({-1, 1}),
                                          TestArg::ScalarI(7)},
                      {F32({2, 3})});
  EXPECT_EQ(crop[0].As<float>(), (std::vector<float>{1, 2, 7, 4, 5, 7}));
}

TEST(TensorOps, Embedding) {
  auto w = HostTensor::F32({4, 2}, {0, 1, 10, 11, 20, 21, 30, 31});
  auto idx = HostTensor::I64({2, 2}, {3, 0, 1, 3});
  auto out = RunRule("embedding", {TestArg::T(w), TestArg::T(idx), TestArg::Int(-1),
                                   TestArg::Bool(false), TestArg::Bool(false)},
                     {F32({2, 2, 2})});
  EXPECT_EQ(out[0].As<float>(), (std::vector<float>{30, 31, 0, 1, 10, 11, 30, 31}));
}

TEST(TensorOps, IndexSelectDim1) {
  auto x = HostTensor::F32({2, 3}, Iota(6));
  auto out = RunRule("index_select",
                     {TestArg::T(x), TestArg::Int(1), TestArg::T(HostTensor::I64({2}, {2, 0}))},
                     {F32({2, 2})});
  EXPECT_EQ(out[0].As<float>(), (std::vector<float>{2, 0, 5, 3}));
  auto scalar_index =
      RunRule("index_select",
              {TestArg::T(x), TestArg::Int(1), TestArg::T(HostTensor::I64({}, {1}))},
              {F32({2, 1})});
  EXPECT_EQ(scalar_index[0].As<float>(), (std::vector<float>{1, 4}));
  auto i32 = RunRule("index_select",
                     {TestArg::T(x), TestArg::Int(0),
                      TestArg::T(HostTensor::Of<int32_t>(ElementType::I32, {3}, {1, 1, 0}))},
                     {F32({3, 3})});
  EXPECT_EQ(i32[0].As<float>(), (std::vector<float>{3, 4, 5, 3, 4, 5, 0, 1, 2}));
}

TEST(TensorOps, Gather) {
  auto x = HostTensor::F32({2, 3}, Iota(6));
  auto idx = HostTensor::I64({2, 2}, {2, 0, 1, 1});
  auto out = RunRule("gather", {TestArg::T(x), TestArg::Int(1), TestArg::T(idx),
                                TestArg::Bool(false)},
                     {F32({2, 2})});
  EXPECT_EQ(out[0].As<float>(), (std::vector<float>{2, 0, 4, 4}));
  auto dim0 = RunRule("gather", {TestArg::T(x), TestArg::Int(0),
                                 TestArg::T(HostTensor::I64({1, 3}, {1, 0, 1})),
                                 TestArg::Bool(false)},
                      {F32({1, 3})});
  EXPECT_EQ(dim0[0].As<float>(), (std::vector<float>{3, 1, 5}));
}

TEST(TensorOps, Scatter) {
  auto zeros = HostTensor::F32({2, 3}, std::vector<float>(6, 0));
  auto idx = HostTensor::I64({2, 2}, {2, 0, 1, 0});
  // src larger than index: only its [2, 2] corner is used.
  auto src = HostTensor::F32({2, 3}, {1, 2, 9, 3, 4, 9});
  auto out = RunRule("scatter.src", {TestArg::T(zeros), TestArg::Int(1), TestArg::T(idx),
                                     TestArg::T(src)},
                     {F32({2, 3})});
  EXPECT_EQ(out[0].As<float>(), (std::vector<float>{2, 0, 1, 4, 3, 0}));
  auto value = RunRule("scatter.value", {TestArg::T(zeros), TestArg::Int(1), TestArg::T(idx),
                                         TestArg::ScalarF(5)},
                       {F32({2, 3})});
  EXPECT_EQ(value[0].As<float>(), (std::vector<float>{5, 0, 5, 5, 5, 0}));
}

TEST(TensorOps, ScatterAddAccumulatesDuplicates) {
  auto ones = HostTensor::F32({2, 3}, std::vector<float>(6, 1));
  auto out = RunRule("scatter_add",
                     {TestArg::T(ones), TestArg::Int(0),
                      TestArg::T(HostTensor::I64({1, 3}, {1, 0, 1})),
                      TestArg::T(HostTensor::F32({1, 3}, {5, 6, 7}))},
                     {F32({2, 3})});
  EXPECT_EQ(out[0].As<float>(), (std::vector<float>{1, 7, 1, 6, 1, 8}));
  auto dup = RunRule("scatter_add",
                     {TestArg::T(HostTensor::I64({3}, {0, 0, 0})), TestArg::Int(0),
                      TestArg::T(HostTensor::I64({4}, {2, 2, 0, 2})),
                      TestArg::T(HostTensor::I64({4}, {1, 2, 3, 4}))},
                     {I64({3})});
  EXPECT_EQ(dup[0].As<int64_t>(), (std::vector<int64_t>{3, 0, 7}));
}

TEST(TensorOps, IndexAdd) {
  auto ones = HostTensor::F32({3, 2}, std::vector<float>(6, 1));
  auto out = RunRule("index_add",
                     {TestArg::T(ones), TestArg::Int(0),
                      TestArg::T(HostTensor::I64({3}, {2, 0, 2})),
                      TestArg::T(HostTensor::F32({3, 2}, {1, 2, 3, 4, 5, 6})),
                      TestArg::ScalarI(2)},
                     {F32({3, 2})});
  EXPECT_EQ(out[0].As<float>(), (std::vector<float>{7, 9, 1, 1, 13, 17}));
  // Along dim 1.
  auto cols = RunRule("index_add",
                      {TestArg::T(HostTensor::F32({2, 3}, std::vector<float>(6, 0))),
                       TestArg::Int(1), TestArg::T(HostTensor::I64({2}, {2, 0})),
                       TestArg::T(HostTensor::F32({2, 2}, {1, 2, 3, 4})), TestArg::ScalarI(1)},
                      {F32({2, 3})});
  EXPECT_EQ(cols[0].As<float>(), (std::vector<float>{2, 0, 1, 4, 0, 3}));
}

TEST(TensorOps, ZeroDimIndexing) {
  auto x = HostTensor::F32({}, {5});
  auto sel = RunRule("index_select",
                     {TestArg::T(x), TestArg::Int(0), TestArg::T(HostTensor::I64({1}, {0}))},
                     {F32({})});
  EXPECT_EQ(sel[0].As<float>(), (std::vector<float>{5}));
  auto g = RunRule("gather", {TestArg::T(x), TestArg::Int(0), TestArg::T(HostTensor::I64({}, {0})),
                              TestArg::Bool(false)},
                   {F32({})});
  EXPECT_EQ(g[0].As<float>(), (std::vector<float>{5}));
  auto sa = RunRule("scatter_add", {TestArg::T(HostTensor::F32({}, {0})), TestArg::Int(0),
                                    TestArg::T(HostTensor::I64({}, {0})),
                                    TestArg::T(HostTensor::F32({}, {3}))},
                    {F32({})});
  EXPECT_EQ(sa[0].As<float>(), (std::vector<float>{3}));
}

TEST(TensorOps, CatAllLegacyEmpty) {
  // Only 1-D [0] inputs next to a real one of rank 2.
  auto out = RunListRule("cat",
                         {HostTensor::F32({0}, {}), HostTensor::F32({2, 1}, {1, 2})},
                         {IntArg(1)}, F32({2, 1}));
  EXPECT_EQ(out.As<float>(), (std::vector<float>{1, 2}));
}

}  // namespace
}  // namespace torch_tpu::lowering
