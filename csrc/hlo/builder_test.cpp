// Golden tests: the exact text the builder prints, and that the XLA:CPU
// plugin parses, compiles and runs it.
#include "hlo/builder.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "pjrt/pjrt.h"
#include "pjrt/test_plugin.h"

namespace torch_tpu::hlo {
namespace {

pjrt::Client& TestClient() {
  static auto client = std::make_shared<pjrt::Client>(
      pjrt::Api::Load(pjrt::testing::CpuPluginPath()),
      std::vector<std::pair<std::string, std::string>>{});
  return *client;
}

std::vector<float> RunF32(const std::string& text,
                          const std::vector<std::vector<float>>& inputs,
                          const std::vector<std::vector<int64_t>>& shapes, size_t out_n) {
  auto& client = TestClient();
  std::vector<pjrt::BufferPtr> keep;
  std::vector<PJRT_Buffer*> args;
  for (size_t i = 0; i < inputs.size(); ++i) {
    keep.push_back(client.FromHost(inputs[i].data(), pjrt::BufferType::F32, shapes[i], 0));
    args.push_back(keep.back()->raw());
  }
  auto exe = client.Compile(text, 0);
  auto outs = exe->Execute(args, {});
  std::vector<float> out(out_n);
  outs[0]->ToHost(out.data(), out.size() * sizeof(float));
  return out;
}

TEST(Hlo, GoldenAddModule) {
  Builder b("golden");
  TensorType t{ElementType::F32, {2, 3}};
  Value x = b.Parameter(t), y = b.Parameter(t);
  b.Return({b.Binary("add", x, y)});
  EXPECT_EQ(b.ToText(),
            "module @golden {\n"
            "  func.func public @main(%0: tensor<2x3xf32>, %1: tensor<2x3xf32>) -> "
            "(tensor<2x3xf32>) {\n"
            "    %2 = \"stablehlo.add\"(%0, %1) : (tensor<2x3xf32>, tensor<2x3xf32>) -> "
            "tensor<2x3xf32>\n"
            "    \"func.return\"(%2) : (tensor<2x3xf32>) -> ()\n"
            "  }\n"
            "}\n");
}

TEST(Hlo, GoldenConstantsAreBitExact) {
  Builder b;
  Value one = b.Constant(ElementType::F32, 1.0);
  Value h = b.Constant(ElementType::BF16, 1.0);
  Value f = b.Constant(ElementType::F16, 1.0);
  Value i = b.ConstantInt(ElementType::I64, -3);
  b.Return({one, h, f, i});
  std::string text = b.ToText();
  EXPECT_NE(text.find("dense<0x3F800000> : tensor<f32>"), std::string::npos) << text;
  EXPECT_NE(text.find("dense<0x3F80> : tensor<bf16>"), std::string::npos) << text;
  EXPECT_NE(text.find("dense<0x3C00> : tensor<f16>"), std::string::npos) << text;
  EXPECT_NE(text.find("dense<-3> : tensor<i64>"), std::string::npos) << text;
  TestClient().Compile(text, 0);
}

TEST(Hlo, Float8ConstantsRoundLikePyTorch) {
  Builder b;
  std::vector<Value> vals = {
      b.Constant(ElementType::F8E4M3FN, 1.0),     // 0x38
      b.Constant(ElementType::F8E4M3FN, -0.3),    // nearest: -0.3125 = 0xAA
      b.Constant(ElementType::F8E4M3FN, 1e6),     // saturates to 448 = 0x7E
      b.Constant(ElementType::F8E4M3FN, 1.0625),  // tie between 1 and 1.125: even, 0x38
      b.Constant(ElementType::F8E5M2, 1.0),       // 0x3C
      b.Constant(ElementType::F8E5M2, 1e6),       // overflows to inf = 0x7C
  };
  b.Return(vals);
  std::string text = b.ToText();
  for (const char* lit : {"dense<0x38> : tensor<f8E4M3FN>", "dense<0xAA> : tensor<f8E4M3FN>",
                          "dense<0x7E> : tensor<f8E4M3FN>", "dense<0x3C> : tensor<f8E5M2>",
                          "dense<0x7C> : tensor<f8E5M2>"})
    EXPECT_NE(text.find(lit), std::string::npos) << lit << "\n" << text;
  TestClient().Compile(text, 0);
}

TEST(Hlo, ComplexConstantsAndParts) {
  Builder b;
  Value c = b.ConstantComplex(ElementType::C64, 1.0, -2.0);
  Value d = b.Constant(ElementType::C128, 3.0);
  b.Return({b.Real(c), b.Imag(c), d});
  std::string text = b.ToText();
  EXPECT_NE(text.find("dense<(0x3F800000, 0xC0000000)> : tensor<complex<f32>>"),
            std::string::npos) << text;
  EXPECT_NE(text.find("dense<(0x4008000000000000, 0x0000000000000000)> : "
                      "tensor<complex<f64>>"), std::string::npos) << text;
  EXPECT_NE(text.find("\"stablehlo.real\"(%0) : (tensor<complex<f32>>) -> tensor<f32>"),
            std::string::npos) << text;
  TestClient().Compile(text, 0);
  EXPECT_EQ(ByteSize(ElementType::C64), 8);
  EXPECT_EQ(ByteSize(ElementType::C128), 16);
  EXPECT_EQ(ComplexOf(ElementType::F64), ElementType::C128);
  EXPECT_EQ(RealPart(ElementType::C64), ElementType::F32);
}

// rfft then irfft of [1, 2, 3, 4] (XLA's IRFFT scales by 1/n: the round trip
// is the identity); |rfft|^2 of the DC bin is 10^2; the complex op and a
// complex -> real convert (real part) run too.
TEST(Hlo, FftRoundTripCompileAndRun) {
  Builder b;
  Value x = b.Parameter(TensorType{ElementType::F32, {4}});
  Value spectrum = b.Fft(x, "RFFT", {4});  // complex<f32>[3]
  EXPECT_EQ(spectrum.type.str(), "tensor<3xcomplex<f32>>");
  Value back = b.Fft(spectrum, "IRFFT", {4});  // f32[4]
  Value c = b.Complex(x, x);                    // x + i x
  Value forward = b.Fft(c, "FFT", {4});
  Value inverse = b.Fft(forward, "IFFT", {4});  // back to x + i x
  Value dc = b.Slice(spectrum, {0}, {1}, {1});
  Value dc_power = b.Real(b.Binary("multiply", dc, dc));
  Value out = b.Concatenate({back, b.Imag(inverse), b.Convert(inverse, ElementType::F32),
                             dc_power}, 0);
  b.Return({out});
  std::string text = b.ToText();
  EXPECT_NE(text.find("fft_type = #stablehlo<fft_type RFFT>, fft_length = array<i64: 4>"),
            std::string::npos) << text;
  auto v = RunF32(text, {{1, 2, 3, 4}}, {{4}}, 13);
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(v[i], i + 1, 1e-5);
    EXPECT_NEAR(v[4 + i], i + 1, 1e-5);
    EXPECT_NEAR(v[8 + i], i + 1, 1e-5);
  }
  EXPECT_NEAR(v[12], 100, 1e-4);
}

TEST(Hlo, ReduceBroadcastDotCompileAndRun) {
  Builder b;
  Value x = b.Parameter(TensorType{ElementType::F32, {2, 3}});
  Value sum = b.Reduce(x, b.Constant(ElementType::F32, 0), {1}, "add");  // [2]
  Value bcast = b.BroadcastTo(b.Reshape(sum, {2, 1}), {2, 3});
  Value xt = b.Transpose(x, {1, 0});  // [3,2]
  Value dot = b.DotGeneral(bcast, xt, {}, {}, {1}, {0}, ElementType::F32, true);  // [2,2]
  b.Return({dot});
  auto out = RunF32(b.ToText(), {{1, 2, 3, 4, 5, 6}}, {{2, 3}}, 4);
  // row sums 6, 15; dot(row_sum * ones(3), x^T) = row_sum * sum of x's rows
  EXPECT_FLOAT_EQ(out[0], 6 * 6);
  EXPECT_FLOAT_EQ(out[1], 6 * 15);
  EXPECT_FLOAT_EQ(out[2], 15 * 6);
  EXPECT_FLOAT_EQ(out[3], 15 * 15);
}

TEST(Hlo, WhileLoopCapturesOuterValues) {
  // x doubled three times by a loop whose body uses `two`, defined outside.
  Builder b;
  Value x = b.Parameter(TensorType{ElementType::F32, {2}});
  Value two = b.Splat(ElementType::F32, 2, {2});
  auto r = b.While(
      {b.ConstantInt(ElementType::I64, 0), x},
      [&](const std::vector<Value>& v) {
        return b.Compare("LT", v[0], b.ConstantInt(ElementType::I64, 3));
      },
      [&](const std::vector<Value>& v) {
        return std::vector<Value>{b.Binary("add", v[0], b.ConstantInt(ElementType::I64, 1)),
                                  b.Binary("multiply", v[1], two)};
      });
  b.Return({r[1]});
  EXPECT_NE(b.ToText().find("\"stablehlo.while\""), std::string::npos);
  auto out = RunF32(b.ToText(), {{1, -3}}, {{2}}, 2);
  EXPECT_FLOAT_EQ(out[0], 8);
  EXPECT_FLOAT_EQ(out[1], -24);
}

TEST(Hlo, IfRunsOneBranch) {
  Builder b;
  Value x = b.Parameter(TensorType{ElementType::F32, {2}});
  Value pred = b.Compare("GT", b.Reduce(x, b.Constant(ElementType::F32, 0), {0}, "add"),
                         b.Constant(ElementType::F32, 0));
  auto r = b.If(
      pred, {x.type}, [&] { return std::vector<Value>{b.Binary("add", x, x)}; },
      [&] { return std::vector<Value>{b.Unary("negate", x)}; });
  b.Return({r[0]});
  EXPECT_NE(b.ToText().find("\"stablehlo.if\""), std::string::npos);
  auto pos = RunF32(b.ToText(), {{1, 2}}, {{2}}, 2);
  EXPECT_FLOAT_EQ(pos[0], 2);
  auto neg = RunF32(b.ToText(), {{-1, -2}}, {{2}}, 2);
  EXPECT_FLOAT_EQ(neg[1], 2);
}

TEST(Hlo, CholeskyTriangularSolveAndQrCustomCall) {
  // A = [[4, 2], [2, 5]] = L L^T with L = [[2, 0], [1, 2]]; L x = [2, 5] -> x = [1, 2].
  Builder b;
  Value a = b.Parameter(TensorType{ElementType::F32, {2, 2}});
  Value rhs = b.Parameter(TensorType{ElementType::F32, {2, 1}});
  Value l = b.Cholesky(a, true);
  Value x = b.TriangularSolve(l, rhs, true, true, false, false);
  auto qr = b.CustomCall("Qr", {a}, {a.type, TensorType{ElementType::F32, {2}}});
  Value q = b.CustomCall("ProductOfElementaryHouseholderReflectors", {qr[0], qr[1]}, {a.type})[0];
  // (Q^T A)[1, 0] is 0 for an orthogonal Q that triangularizes A.
  Value qta = b.DotGeneral(q, a, {}, {}, {0}, {0}, ElementType::F32, true);
  b.Return({b.Concatenate({b.Reshape(x, {2}), b.Reshape(qta, {4})}, 0)});
  auto out = RunF32(b.ToText(), {{4, 2, 2, 5}, {2, 5}}, {{2, 2}, {2, 1}}, 6);
  EXPECT_NEAR(out[0], 1, 1e-6);
  EXPECT_NEAR(out[1], 2, 1e-6);
  EXPECT_NEAR(out[4], 0, 1e-6);
}

TEST(Hlo, MultiResultReduceGatherScatterSlice) {
  Builder b;
  Value x = b.Parameter(TensorType{ElementType::F32, {4}});
  // argmax via a two-operand reduce
  Value iota = b.Iota(TensorType{ElementType::I32, {4}}, 0);
  auto r = b.ReduceN({x, iota}, {b.MinValue(ElementType::F32), b.ConstantInt(ElementType::I32, 0)},
                     {0}, [](Builder& rb, const std::vector<Value>& a) {
                       Value gt = rb.Compare("GT", a[0], a[2]);
                       return std::vector<Value>{rb.Select(gt, a[0], a[2]),
                                                 rb.Select(gt, a[1], a[3])};
                     });
  Value idx = b.Reshape(r[1], {1, 1});
  Value g = b.Gather(x, idx, {0});  // [1]
  Value s = b.Scatter(x, idx, g, {0}, "add");  // doubles the max
  Value sl = b.Slice(s, {1}, {4}, {2});  // elements 1, 3
  Value out = b.Concatenate({sl, b.Reshape(b.Convert(r[1], ElementType::F32), {1}), g}, 0);
  b.Return({out});
  auto v = RunF32(b.ToText(), {{1, 7, 3, 5}}, {{4}}, 4);
  EXPECT_FLOAT_EQ(v[0], 14);
  EXPECT_FLOAT_EQ(v[1], 5);
  EXPECT_FLOAT_EQ(v[2], 1);
  EXPECT_FLOAT_EQ(v[3], 7);
}

TEST(Hlo, DynamicSliceAndUpdate) {
  Builder b;
  Value x = b.Parameter(TensorType{ElementType::F32, {5}});
  Value off = b.Parameter(TensorType{ElementType::I64, {}});
  Value piece = b.DynamicSlice(x, {off}, {2});
  Value doubled = b.Binary("add", piece, piece);
  b.Return({b.DynamicUpdateSlice(x, doubled, {off})});
  auto& client = TestClient();
  float data[5] = {1, 2, 3, 4, 5};
  int64_t o = 2;
  auto bx = client.FromHost(data, pjrt::BufferType::F32, {5}, 0);
  auto bo = client.FromHost(&o, pjrt::BufferType::S64, {}, 0);
  auto outs = client.Compile(b.ToText(), 0)->Execute({bx->raw(), bo->raw()}, {});
  float out[5];
  outs[0]->ToHost(out, sizeof(out));
  EXPECT_FLOAT_EQ(out[1], 2);
  EXPECT_FLOAT_EQ(out[2], 6);
  EXPECT_FLOAT_EQ(out[3], 8);
  EXPECT_FLOAT_EQ(out[4], 5);
}

TEST(Hlo, InvalidUseThrows) {
  Builder b;
  Value x = b.Parameter(TensorType{ElementType::F32, {2}});
  Value y = b.Parameter(TensorType{ElementType::F32, {3}});
  EXPECT_THROW(b.Binary("add", x, y), std::logic_error);
  EXPECT_THROW(b.ToText(), std::logic_error);
}

// The builder methods that hold syntax rules once wrote themselves: each
// module compiles and computes what the op means.
TEST(Hlo, SortCarriesOperandsAndCompiles) {
  Builder b("sort");
  Value x = b.Parameter({ElementType::F32, {4}});
  Value idx = b.Iota({ElementType::I64, {4}}, 0);
  auto r = b.Sort({x, idx}, 0, true, [](Builder& b, const std::vector<Value>& a) {
    return b.Compare("GT", a[0], a[1]);  // descending
  });
  b.Return({r[0], b.Convert(r[1], ElementType::F32)});
  EXPECT_EQ(RunF32(b.ToText(), {{3, 1, 4, 2}}, {{4}}, 4), (std::vector<float>{4, 3, 2, 1}));
}

TEST(Hlo, ReduceWindowCumulativeSum) {
  Builder b("cumsum");
  Value x = b.Parameter({ElementType::F32, {1, 4}});
  Value s = b.ReduceWindow({x}, {b.Constant(ElementType::F32, 0)}, {1, 4}, {1, 4}, {1, 1}, {1, 1},
                           {0, 3}, {0, 0}, [](Builder& b, const std::vector<Value>& v) {
                             return std::vector<Value>{b.Binary("add", v[0], v[1])};
                           })[0];
  b.Return({s});
  EXPECT_EQ(RunF32(b.ToText(), {{1, 2, 3, 4}}, {{1, 4}}, 4), (std::vector<float>{1, 3, 6, 10}));
}

TEST(Hlo, TriangularSolveAndIsFinite) {
  Builder b("trsm");
  Value a = b.Parameter({ElementType::F32, {2, 2}});
  Value rhs = b.Parameter({ElementType::F32, {2, 1}});
  Value x = b.TriangularSolve(a, rhs, true, true, false, false);
  Value finite = b.Convert(b.IsFinite(x), ElementType::F32);
  b.Return({b.Binary("multiply", x, finite)});
  // [[2, 0], [1, 1]] x = [4, 3] -> x = [2, 1]
  EXPECT_EQ(RunF32(b.ToText(), {{2, 0, 1, 1}, {4, 3}}, {{2, 2}, {2, 1}}, 2), (std::vector<float>{2, 1}));
}

TEST(Hlo, ChloOpsPrintTheirDialectAndRun) {
  Builder b("chlo");
  Value x = b.Parameter({ElementType::F32, {2}});
  Value e = b.Chlo("erf", {x});
  b.Return({b.Chlo("erf_inv", {e})});  // erf_inv(erf(x)) = x
  std::string text = b.ToText();
  EXPECT_NE(text.find("\"chlo.erf\"(%0)"), std::string::npos) << text;
  std::vector<float> r = RunF32(text, {{0.25f, -0.5f}}, {{2}}, 2);
  EXPECT_NEAR(r[0], 0.25f, 1e-5);
  EXPECT_NEAR(r[1], -0.5f, 1e-5);
  EXPECT_THROW(b.Chlo("erf", {}), std::logic_error);
}

TEST(Hlo, ConvolutionAndConstantArrays) {
  Builder b("conv");
  Value x = b.Parameter({ElementType::F32, {1, 1, 4}});
  Value w = b.Reshape(b.ConstantArray(ElementType::F32, {1, -1}), {1, 1, 2});
  Builder::ConvGeometry g{"[b, f, 0]", "[o, i, 0]", "[b, f, 0]", {1}, {0}, {0}, {1}, {1}, 1, 1, true};
  Value y = b.Convolution(x, w, {ElementType::F32, {1, 1, 3}}, g);
  Value k = b.Convert(b.ConstantIntArray(ElementType::I64, {1, 2, 3}), ElementType::F32);
  b.Return({b.Binary("multiply", b.Reshape(y, {3}), k)});
  // x = [1, 2, 4, 8]: windows x[i] - x[i+1] = [-1, -2, -4], times [1, 2, 3]
  EXPECT_EQ(RunF32(b.ToText(), {{1, 2, 4, 8}}, {{1, 1, 4}}, 3), (std::vector<float>{-1, -4, -12}));
}

// A module as jax.export prints it (custom_jax_kernel / jax_op): its
// functions become private, renamed callees of func.call; a string
// attribute naming a symbol is left alone; the same text embeds once.
TEST(Hlo, EmbeddedModuleIsCalledAndRuns) {
  const std::string exported =
      "module @jit_f attributes {mhlo.num_partitions = 1 : i32} {\n"
      "  func.func public @main(%arg0: tensor<2x3xf32> {mhlo.layout_mode = \"default\"}) -> "
      "(tensor<2x3xf32> {jax.result_info = \"@main\"}) {\n"
      "    %0 = call @double(%arg0) : (tensor<2x3xf32>) -> tensor<2x3xf32>\n"
      "    return %0 : tensor<2x3xf32>\n"
      "  }\n"
      "  func.func private @double(%arg0: tensor<2x3xf32>) -> tensor<2x3xf32> {\n"
      "    %0 = stablehlo.add %arg0, %arg0 : tensor<2x3xf32>\n"
      "    return %0 : tensor<2x3xf32>\n"
      "  }\n"
      "}\n";
  Builder b("outer");
  TensorType flat{ElementType::F32, {6}}, t{ElementType::F32, {2, 3}};
  Value x = b.Parameter(flat);
  std::string callee = b.EmbedModule(exported);
  EXPECT_EQ(callee, "m0_main");
  EXPECT_EQ(b.EmbedModule(exported), callee);
  Value once = b.Call(callee, {b.Reshape(x, {2, 3})}, {t})[0];
  Value twice = b.Call(callee, {once}, {t})[0];
  b.Return({b.Reshape(twice, {6})});
  std::string text = b.ToText();
  EXPECT_NE(text.find("func.func private @m0_main("), std::string::npos) << text;
  EXPECT_NE(text.find("call @m0_double("), std::string::npos) << text;
  EXPECT_NE(text.find("jax.result_info = \"@main\""), std::string::npos) << text;
  EXPECT_EQ(text.find("func.func public @main(%arg0"), std::string::npos) << text;
  auto out = RunF32(text, {{1, 2, 3, 4, 5, 6}}, {{6}}, 6);
  EXPECT_EQ(out, (std::vector<float>{4, 8, 12, 16, 20, 24}));
  EXPECT_THROW(b.EmbedModule("func.func @main() { }"), std::invalid_argument);
  EXPECT_THROW(b.EmbedModule("module {\n  func.func @f() {\n  }\n}\n"), std::invalid_argument);
}

TEST(Hlo, BoundedDynamicTypesPrintAndStayLocal) {
  Builder b("m");
  Value x = b.Parameter({ElementType::F32, {64}});
  Value n = b.Parameter({ElementType::I32, {}});
  Value d = b.SetDimensionSize(x, n, 0);
  EXPECT_EQ(d.type.str(), "tensor<?xf32, #stablehlo.bounds<64>>");
  Value sizes = b.Concatenate({b.ConstantIntArray(ElementType::I32, {4}), b.Reshape(n, {1})}, 0);
  Value r = b.DynamicReshape(d, sizes, {4, 16}, {false, true});
  EXPECT_EQ(r.type.str(), "tensor<4x?xf32, #stablehlo.bounds<?, 16>>");
  Value e = b.Unary("exponential", r);  // result types copied from r print static
  EXPECT_EQ(e.type.str(), "tensor<4x16xf32>");
  EXPECT_EQ(b.GetDimensionSize(r, 1).type.str(), "tensor<i32>");
  Value s = b.SetDimensionSize(b.Reshape(e, {64}), b.ConstantInt(ElementType::I32, 64), 0, true);
  EXPECT_EQ(s.type.str(), "tensor<64xf32>");
  b.Return({s});
  std::string text = b.ToText();
  EXPECT_NE(text.find("stablehlo.set_dimension_size"), std::string::npos);
  EXPECT_NE(text.find("stablehlo.dynamic_reshape"), std::string::npos);
}

}  // namespace
}  // namespace torch_tpu::hlo
