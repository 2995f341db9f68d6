// Scalar parameters of every element type: the encoding (against PyTorch's
// own conversions of the same values) and the round trip through both
// upload paths of the runtime (UploadScalar for floats, UploadInt for
// integers: each once called the other for types it did not list, which
// recursed until the stack overflowed).
#include "runtime/scalar_bytes.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <limits>

#include "pjrt/test_plugin.h"
#include "runtime/runtime.h"

namespace torch_tpu::runtime {
namespace {

using E = hlo::ElementType;

uint32_t Bits(const ScalarBytes& b) {
  uint32_t v = 0;
  std::memcpy(&v, b.data, b.size);
  return v;
}

// Expected bit patterns: torch.tensor(v, dtype=torch.float64).to(dtype).
TEST(ScalarBytes, NarrowFloatsRoundAsPyTorch) {
  const double inf = std::numeric_limits<double>::infinity();
  const double values[] = {2.5, -0.1, 1000.0, 1e-6, 65504.0, 70000.0, inf, 3.0, -7.0};
  const uint32_t f16[] = {0x4100, 0xae66, 0x63d0, 0x11, 0x7bff, 0x7c00, 0x7c00, 0x4200, 0xc700};
  const uint32_t bf16[] = {0x4020, 0xbdcd, 0x447a, 0x3586, 0x4780, 0x4789, 0x7f80, 0x4040, 0xc0e0};
  const uint32_t e4m3fn[] = {0x42, 0x9d, 0x7e, 0x0, 0x7e, 0x7e, 0x7e, 0x44, 0xce};
  const uint32_t e5m2[] = {0x41, 0xae, 0x64, 0x0, 0x7c, 0x7c, 0x7c, 0x42, 0xc7};
  for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); ++i) {
    EXPECT_EQ(Bits(EncodeScalar(values[i], E::F16)), f16[i]) << values[i];
    EXPECT_EQ(Bits(EncodeScalar(values[i], E::BF16)), bf16[i]) << values[i];
    EXPECT_EQ(Bits(EncodeScalar(values[i], E::F8E4M3FN)), e4m3fn[i]) << values[i];
    EXPECT_EQ(Bits(EncodeScalar(values[i], E::F8E5M2)), e5m2[i]) << values[i];
  }
}

TEST(ScalarBytes, IntegersWrapAndConvert) {
  EXPECT_EQ(Bits(EncodeScalar(int64_t{300}, E::U8)), 44u);
  EXPECT_EQ(Bits(EncodeScalar(int64_t{-1}, E::I8)), 0xffu);
  EXPECT_EQ(Bits(EncodeScalar(int64_t{-2}, E::I16)), 0xfffeu);
  EXPECT_EQ(Bits(EncodeScalar(int64_t{7}, E::Bool)), 1u);
  EXPECT_EQ(Bits(EncodeScalar(2.75, E::I32)), 2u);  // truncates like a C++ cast
  EXPECT_EQ(Bits(EncodeScalar(int64_t{3}, E::F16)), 0x4200u);
  EXPECT_EQ(EncodeScalar(int64_t{3}, E::U64).size, 8u);
}

// Every element type through both upload paths, read back from the device.
TEST(ScalarBytes, UploadRoundTripEveryType) {
  setenv("TORCH_TPU_CACHE_DIR", "", 1);  // no disk cache in unit tests
  Runtime::Initialize(pjrt::testing::CpuPluginPath(), 1);
  Runtime& rt = Runtime::Get();
  const E all[] = {E::Bool, E::I8, E::I16, E::I32, E::I64, E::U8, E::U16, E::U32,
                   E::U64, E::F16, E::BF16, E::F32, E::F64, E::F8E4M3FN, E::F8E5M2};
  for (E t : all) {
    uint8_t got[8] = {0};
    auto a = rt.UploadScalar(3.0, t, 0);
    rt.Download(*a, got, hlo::ByteSize(t));
    ScalarBytes want = EncodeScalar(3.0, t);
    EXPECT_EQ(std::memcmp(got, want.data, want.size), 0) << hlo::Name(t);
    uint8_t got_int[8] = {0};
    auto b = rt.UploadInt(3, t, 0);
    rt.Download(*b, got_int, hlo::ByteSize(t));
    EXPECT_EQ(std::memcmp(got_int, want.data, want.size), 0) << hlo::Name(t);
  }
}

}  // namespace
}  // namespace torch_tpu::runtime
