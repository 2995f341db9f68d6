// Compiled graphs (aten/graph.h) built node by node, as the compile backend
// builds them, run on the XLA:CPU plugin and checked against ATen's CPU
// results.
#include "aten/graph.h"

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cstdlib>

namespace torch_tpu::aten {
namespace {

using c10::IValue;

class GraphTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    setenv("TORCH_TPU_CACHE_DIR", "", 1);  // no disk cache in unit tests: real compiles
    const char* plugin = std::getenv("TORCH_TPU_TEST_CPU_PLUGIN");
    ConfigurePlugin(plugin && *plugin ? plugin : TORCH_TPU_DEFAULT_CPU_PLUGIN, 1);
    RegisterDevice();
  }

  static at::Tensor Tpu(const at::Tensor& t) { return t.to(c10::Device(c10::DeviceType::PrivateUse1, 0)); }
  static IValue V(int id) { return Graph::ValueArg(id); }

  // (x + alpha * y) * 0.5, the multiplier a wrapped number (a Python scalar
  // in a Tensor slot), as torch.compile records `(x + y * alpha) * 0.5`.
  static std::unique_ptr<Graph> AxpyHalf(double alpha) {
    auto g = std::make_unique<Graph>();
    int x = g->AddInput(at::kFloat, {2, 3});
    int y = g->AddInput(at::kFloat, {2, 3});
    std::vector<int> sum = g->AddOp("add.Tensor", {V(x), V(y), IValue(alpha)}, {{at::kFloat, {2, 3}}});
    std::vector<int> out = g->AddOp("mul.Tensor", {V(sum.at(0)), IValue(0.5)}, {{at::kFloat, {2, 3}}});
    g->SetOutputs({out.at(0)}, {{3, 1}}, {});
    return g;
  }

  at::Tensor x_ = at::arange(6, at::kFloat).reshape({2, 3});
  at::Tensor y_ = at::full({2, 3}, 4.0f);
};

TEST_F(GraphTest, NodesCompileAndRun) {
  auto g = AxpyHalf(2.0);
  g->Compile(0);
  std::vector<at::Tensor> out = g->Run({Tpu(x_), Tpu(y_)});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].device().type(), c10::DeviceType::PrivateUse1);
  EXPECT_TRUE(at::allclose(out[0].cpu(), (x_ + 2.0 * y_) * 0.5)) << out[0].cpu();
  // Runs again with other inputs, same executable.
  out = g->Run({Tpu(y_), Tpu(x_)});
  EXPECT_TRUE(at::allclose(out[0].cpu(), (y_ + 2.0 * x_) * 0.5)) << out[0].cpu();
}

// A scalar is a runtime parameter: a graph differing only in alpha is the
// same module, found in the executable cache, and gives the new result.
TEST_F(GraphTest, ScalarChangesResultWithoutRecompiling) {
  auto first = AxpyHalf(2.0);
  first->Compile(0);
  auto& stats = GetRuntime().stats();
  const int64_t compiles = stats.compiles, hits = stats.cache_hits;
  auto second = AxpyHalf(-3.0);
  EXPECT_EQ(first->text(), second->text());
  second->Compile(0);
  EXPECT_EQ(stats.compiles, compiles);
  EXPECT_EQ(stats.cache_hits, hits + 1);
  at::Tensor got = second->Run({Tpu(x_), Tpu(y_)})[0].cpu();
  EXPECT_TRUE(at::allclose(got, (x_ - 3.0 * y_) * 0.5)) << got;
  got = first->Run({Tpu(x_), Tpu(y_)})[0].cpu();
  EXPECT_TRUE(at::allclose(got, (x_ + 2.0 * y_) * 0.5)) << got;
}

// Tensor lists, int lists and None arguments decode as in eager:
// cat([x, y], 1), then sum over dim 1 with dtype None.
TEST_F(GraphTest, ListArguments) {
  Graph g;
  int x = g.AddInput(at::kFloat, {2, 3});
  int y = g.AddInput(at::kFloat, {2, 3});
  c10::impl::GenericList tensors(c10::AnyType::get());
  tensors.push_back(V(x));
  tensors.push_back(V(y));
  int cat = g.AddOp("cat", {IValue(tensors), IValue(int64_t{1})}, {{at::kFloat, {2, 6}}}).at(0);
  int sum = g.AddOp("sum.dim_IntList", {V(cat), IValue(std::vector<int64_t>{1}), IValue(false), IValue()},
                    {{at::kFloat, {2}}}).at(0);
  g.SetOutputs({cat, sum}, {{6, 1}, {1}}, {});
  g.Compile(0);
  std::vector<at::Tensor> out = g.Run({Tpu(x_), Tpu(y_)});
  at::Tensor want = at::cat({x_, y_}, 1);
  EXPECT_TRUE(at::equal(out[0].cpu(), want));
  EXPECT_TRUE(at::allclose(out[1].cpu(), want.sum(1)));
}

// A mutated input (copy_ epilogue of AOTAutograd) is updated in place.
TEST_F(GraphTest, MutatedInputUpdatedInPlace) {
  Graph g;
  int buf = g.AddInput(at::kFloat, {2, 3});
  int y = g.AddInput(at::kFloat, {2, 3});
  int next = g.AddOp("add.Tensor", {V(buf), V(y), IValue(1)}, {{at::kFloat, {2, 3}}}).at(0);
  g.SetOutputs({}, {}, {{0, next}});
  g.Compile(0);
  at::Tensor b = Tpu(x_), t = Tpu(y_);
  const int64_t donated = GraphMutations().donated;
  EXPECT_TRUE(g.Run({b, t}).empty());
  g.Run({b, t});
  EXPECT_TRUE(at::allclose(b.cpu(), x_ + 2 * y_)) << b.cpu();
  EXPECT_EQ(GraphMutations().donated, donated + 2);
}

// A random op without a generator argument draws from the default
// generator: a state parameter the graph advances on every run.
TEST_F(GraphTest, RandomOpDrawsFreshValuesPerRun) {
  Graph g;
  const int64_t n = 4096;
  int x = g.AddInput(at::kFloat, {n});
  std::vector<int> out = g.AddOp("native_dropout", {V(x), IValue(0.25), IValue(true)},
                                 {{at::kFloat, {n}}, {at::kBool, {n}}});
  g.SetOutputs(out, {{1}, {1}}, {});
  g.Compile(0);
  at::Tensor ones = at::ones({n});
  std::vector<at::Tensor> first = g.Run({Tpu(ones)}), second = g.Run({Tpu(ones)});
  at::Tensor y = first[0].cpu(), mask = first[1].cpu();
  // Kept values are scaled by 1 / (1 - p), dropped ones are zero.
  EXPECT_TRUE(at::allclose(y, mask.to(at::kFloat) / 0.75));
  double kept = mask.to(at::kFloat).mean().item<double>();
  EXPECT_NEAR(kept, 0.75, 0.05);
  EXPECT_FALSE(at::equal(mask, second[1].cpu()));
}

TEST_F(GraphTest, BadNodesThrow) {
  Graph g;
  int x = g.AddInput(at::kFloat, {2, 3});
  // add.Tensor has three schema arguments.
  EXPECT_THROW(g.AddOp("add.Tensor", {V(x), V(x)}, {{at::kFloat, {2, 3}}}), std::exception);
  EXPECT_THROW(g.AddOp("add.Tensor", {V(x), V(7), IValue(1)}, {{at::kFloat, {2, 3}}}), std::exception);
  EXPECT_THROW(g.AddOp("no_such_op", {}, {}), std::exception);
  EXPECT_THROW(g.Compile(0), std::exception);  // no outputs set
}

}  // namespace
}  // namespace torch_tpu::aten
