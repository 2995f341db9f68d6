// Test helpers: run lowering rules on host data through the XLA:CPU plugin.
#pragma once

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "lowering/lowering.h"
#include "pjrt/pjrt.h"
#include "pjrt/test_plugin.h"

namespace torch_tpu::lowering::testing {

inline pjrt::Client& TestClient() {
  static auto client = std::make_shared<pjrt::Client>(
      pjrt::Api::Load(pjrt::testing::CpuPluginPath()),
      std::vector<std::pair<std::string, std::string>>{});
  return *client;
}

inline pjrt::BufferType ToPjrt(ElementType t) {
  using B = pjrt::BufferType;
  switch (t) {
    case ElementType::Bool: return B::Pred;
    case ElementType::I8: return B::S8;
    case ElementType::I16: return B::S16;
    case ElementType::I32: return B::S32;
    case ElementType::I64: return B::S64;
    case ElementType::U8: return B::U8;
    case ElementType::U16: return B::U16;
    case ElementType::U32: return B::U32;
    case ElementType::U64: return B::U64;
    case ElementType::F16: return B::F16;
    case ElementType::BF16: return B::BF16;
    case ElementType::F32: return B::F32;
    case ElementType::F64: return B::F64;
    case ElementType::F8E4M3FN: return B::F8E4M3FN;
    case ElementType::F8E5M2: return B::F8E5M2;
    case ElementType::C64: return B::C64;
    case ElementType::C128: return B::C128;
  }
  return B::Invalid;
}

// A dense host array.
struct HostTensor {
  TensorType type;
  std::vector<char> bytes;

  template <typename T>
  static HostTensor Of(ElementType t, std::vector<int64_t> shape, const std::vector<T>& v) {
    HostTensor h{TensorType{t, std::move(shape)}, {}};
    h.bytes.resize(v.size() * sizeof(T));
    std::memcpy(h.bytes.data(), v.data(), h.bytes.size());
    return h;
  }
  static HostTensor F32(std::vector<int64_t> shape, const std::vector<float>& v) {
    return Of(ElementType::F32, std::move(shape), v);
  }
  static HostTensor I64(std::vector<int64_t> shape, const std::vector<int64_t>& v) {
    return Of(ElementType::I64, std::move(shape), v);
  }
  template <typename T>
  std::vector<T> As() const {
    std::vector<T> v(bytes.size() / sizeof(T));
    std::memcpy(v.data(), bytes.data(), bytes.size());
    return v;
  }
};

// One argument of a rule call in a test.
struct TestArg {
  enum class Kind { Tensor, Scalar, Literal } kind;
  HostTensor tensor;  // Tensor; Scalar (rank 0)
  Arg literal;        // Literal
  static TestArg T(HostTensor h) { return TestArg{Kind::Tensor, std::move(h), {}}; }
  static TestArg ScalarF(double v) {
    return TestArg{Kind::Scalar, HostTensor::Of<double>(ElementType::F64, {}, {v}), {}};
  }
  static TestArg ScalarI(int64_t v) {
    return TestArg{Kind::Scalar, HostTensor::Of<int64_t>(ElementType::I64, {}, {v}), {}};
  }
  static TestArg L(Arg a) { return TestArg{Kind::Literal, {}, std::move(a)}; }
  static TestArg Int(int64_t v) {
    Arg a;
    a.kind = Arg::Kind::Int;
    a.i = v;
    return L(a);
  }
  static TestArg Ints(std::vector<int64_t> v) {
    Arg a;
    a.kind = Arg::Kind::IntList;
    a.ints = std::move(v);
    return L(a);
  }
  static TestArg Bool(bool v) {
    Arg a;
    a.kind = Arg::Kind::Bool;
    a.i = v;
    return L(a);
  }
  static TestArg None() { return L(Arg{}); }
};

// Builds a module calling each rule in `chain` in turn; stage k>0 receives the
// previous stage's first result as its first argument (replacing args[0]).
inline std::vector<HostTensor> RunChain(
    const std::vector<std::pair<std::string, std::vector<TestArg>>>& chain,
    const std::vector<std::vector<TensorType>>& outputs) {
  Builder b("test");
  std::vector<pjrt::BufferPtr> keep;
  std::vector<PJRT_Buffer*> params;
  auto& client = TestClient();
  std::vector<Value> prev;
  for (size_t stage = 0; stage < chain.size(); ++stage) {
    const auto& [name, test_args] = chain[stage];
    std::vector<Arg> args;
    for (size_t i = 0; i < test_args.size(); ++i) {
      const TestArg& t = test_args[i];
      if (t.kind == TestArg::Kind::Literal) {
        args.push_back(t.literal);
        continue;
      }
      Arg a;
      if (stage > 0 && i == 0) {
        a.kind = Arg::Kind::Tensor;
        a.tensor = prev.at(0);
        args.push_back(a);
        continue;
      }
      keep.push_back(client.FromHost(t.tensor.bytes.data(), ToPjrt(t.tensor.type.dtype),
                                     t.tensor.type.shape, 0));
      params.push_back(keep.back()->raw());
      a.tensor = b.Parameter(t.tensor.type);
      if (t.kind == TestArg::Kind::Scalar) {
        a.kind = Arg::Kind::Scalar;
        a.scalar_type = t.tensor.type.dtype;
      } else {
        a.kind = Arg::Kind::Tensor;
      }
      args.push_back(a);
    }
    const RuleEntry* entry = Find(name);
    if (!entry) throw std::runtime_error("no rule " + name);
    Context ctx{b, outputs.at(stage)};
    ctx.op = name;
    prev = entry->rule(ctx, args);
  }
  b.Return(prev);
  auto exe = client.Compile(b.ToText(), 0);
  auto outs = exe->Execute(params, {});
  std::vector<HostTensor> result;
  for (size_t i = 0; i < outs.size(); ++i) {
    HostTensor h{prev[i].type, {}};
    h.bytes.resize(prev[i].type.numel() * hlo::ByteSize(prev[i].dtype()));
    if (!h.bytes.empty()) outs[i]->ToHost(h.bytes.data(), h.bytes.size());
    result.push_back(std::move(h));
  }
  return result;
}

inline std::vector<HostTensor> RunRule(const std::string& name, std::vector<TestArg> args,
                                       std::vector<TensorType> outputs) {
  return RunChain({{name, std::move(args)}}, {std::move(outputs)});
}

}  // namespace torch_tpu::lowering::testing
