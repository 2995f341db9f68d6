#include "pjrt/pjrt.h"
#include "pjrt/test_plugin.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace torch_tpu::pjrt {
namespace {

std::shared_ptr<const Api> CpuPlugin() {
  static std::shared_ptr<const Api> api =
      Api::Load(testing::CpuPluginPath());
  return api;
}

std::shared_ptr<Client> CpuClient() {
  static std::shared_ptr<Client> client = std::make_shared<Client>(
      CpuPlugin(), std::vector<std::pair<std::string, std::string>>{
                       {"cpu_device_count", "2"}});
  return client;
}

const char* kAddModule = R"(module @add {
  func.func public @main(%a: tensor<2xf32>, %b: tensor<2xf32>) -> (tensor<2xf32>) {
    %0 = "stablehlo.add"(%a, %b) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
    "func.return"(%0) : (tensor<2xf32>) -> ()
  }
})";

TEST(Pjrt, LoadsPluginAndReportsVersion) {
  auto api = CpuPlugin();
  EXPECT_EQ(api->major_version(), 0);
  EXPECT_GT(api->minor_version(), 0);
  bool has_xla_version = false;
  for (auto& [name, value] : api->Attributes())
    if (name == "xla_version") has_xla_version = true;
  EXPECT_TRUE(has_xla_version);
}

TEST(Pjrt, BadPathThrowsWithPath) {
  try {
    Api::Load("/nonexistent/plugin.so");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/plugin.so"),
              std::string::npos);
  }
}

TEST(Pjrt, ClientHasRequestedDevices) {
  auto client = CpuClient();
  EXPECT_EQ(client->platform_name(), "cpu");
  ASSERT_EQ(client->devices().size(), 2u);
  EXPECT_NE(client->devices()[0].id, client->devices()[1].id);
}

TEST(Pjrt, RoundTripAndCompileExecute) {
  auto client = CpuClient();
  for (int device = 0; device < 2; ++device) {
    float a[2] = {1.5f, -2.0f}, b[2] = {0.25f, 4.0f}, out[2] = {0, 0};
    auto ba = client->FromHost(a, BufferType::F32, {2}, device);
    auto bb = client->FromHost(b, BufferType::F32, {2}, device);
    EXPECT_EQ(ba->dims(), std::vector<int64_t>{2});
    EXPECT_EQ(ba->type(), BufferType::F32);
    auto exe = client->Compile(kAddModule, device);
    ASSERT_EQ(exe->num_outputs(), 1u);
    auto outs = exe->Execute({ba->raw(), bb->raw()}, {0, 1});
    outs[0]->ToHost(out, sizeof(out));
    EXPECT_FLOAT_EQ(out[0], 1.75f);
    EXPECT_FLOAT_EQ(out[1], 2.0f);
    EXPECT_FALSE(ba->IsDeleted());
  }
}

TEST(Pjrt, CopyToOtherDevice) {
  auto client = CpuClient();
  int32_t a[3] = {1, 2, 3}, out[3] = {0, 0, 0};
  auto b0 = client->FromHost(a, BufferType::S32, {3}, 0);
  auto b1 = b0->CopyToDevice(client->devices()[1].device);
  b1->ToHost(out, sizeof(out));
  EXPECT_EQ(out[2], 3);
}

TEST(Pjrt, CompileErrorCarriesPluginMessage) {
  auto client = CpuClient();
  try {
    client->Compile("module { this is not mlir }", 0);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("PJRT_Client_Compile"),
              std::string::npos);
  }
}

TEST(Pjrt, SerializeDeserializeRuns) {
  auto client = CpuClient();
  auto exe = client->Compile(kAddModule, 0);
  std::string bytes = exe->Serialize();
  ASSERT_FALSE(bytes.empty());
  auto again = client->Deserialize(bytes);
  float a[2] = {1, 2}, out[2];
  auto ba = client->FromHost(a, BufferType::F32, {2}, 0);
  auto outs = again->Execute({ba->raw(), ba->raw()}, {0, 1});
  outs[0]->ToHost(out, sizeof(out));
  EXPECT_FLOAT_EQ(out[1], 4.0f);
}

TEST(Pjrt, DonationConsumesInput) {
  auto client = CpuClient();
  const char* module = R"(module @inc {
  func.func public @main(%a: tensor<2xf32> {tf.aliasing_output = 0 : i32}) -> (tensor<2xf32>) {
    %0 = "stablehlo.add"(%a, %a) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
    "func.return"(%0) : (tensor<2xf32>) -> ()
  }
})";
  auto exe = client->Compile(module, 0);
  float a[2] = {1, 2}, out[2];
  auto ba = client->FromHost(a, BufferType::F32, {2}, 0);
  auto outs = exe->Execute({ba->raw()}, {});
  outs[0]->ToHost(out, sizeof(out));
  EXPECT_FLOAT_EQ(out[1], 4.0f);
  EXPECT_TRUE(ba->IsDeleted());
}

// Padded argument structs report a struct_size larger than the header's
// sizeof: this is the path a plugin newer than our header takes, and the
// plugin we test with must accept it (it does: larger is allowed).
TEST(Pjrt, PaddedStructsAccepted) {
  EXPECT_GE(kStructPadding, 64u);
  auto client = CpuClient();  // every call above used padded structs
  EXPECT_FALSE(client->platform_version().empty());
}

TEST(Pjrt, CompileOptionsEncoding) {
  // executable_build_options {num_replicas:1 num_partitions:1
  //   device_assignment {replica_count:1 computation_count:1
  //   computation_devices {replica_device_ids: 3}}}
  std::string expected("\x1a\x0e\x20\x01\x28\x01\x4a\x08\x08\x01\x10\x01\x1a\x02\x08\x03", 16);
  EXPECT_EQ(SingleDeviceCompileOptions(3), expected);
}

TEST(Pjrt, CompileOptionsCarryXlaOptionsSortedAndTyped) {
  std::string base = SingleDeviceCompileOptions(3);
  // env_option_overrides (field 7) entries {key = 1, value = 2}, sorted by
  // name; OptionOverrideProto: string 1, bool 2, int64 3, double 4.
  std::string half("\x21\x00\x00\x00\x00\x00\x00\xe0\x3f", 9);  // 0.5, fixed64
  std::string expected = base;
  expected += std::string("\x3a\x07\x0a\x01" "a" "\x12\x02\x18\x07", 9);  // a=7
  expected += std::string("\x3a\x0e\x0a\x01" "b" "\x12\x09", 7) + half;  // b=0.5
  expected += std::string("\x3a\x09\x0a\x01" "c" "\x12\x04\x0a\x02" "on", 11);  // c=on
  expected += std::string("\x3a\x07\x0a\x01" "d" "\x12\x02\x10\x01", 9);  // d=true
  EXPECT_EQ(SingleDeviceCompileOptions(3, {{"d", "true"}, {"c", "on"}, {"a", "7"}, {"b", "0.5"}}),
            expected);
}

TEST(Pjrt, OptionListsParseTyped) {
  Options o = ParseOptionList("a=1,,b=x,a=2", "TEST_VAR");
  EXPECT_EQ(o, (Options{{"a", "2"}, {"b", "x"}}));
  try {
    ParseOptionList("a=1,novalue", "TEST_VAR");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("TEST_VAR: expected name=value, got 'novalue'"),
              std::string::npos) << e.what();
  }
  EXPECT_EQ(TypeOf("false").kind, TypedValue::Kind::kBool);
  EXPECT_EQ(TypeOf("-3").i, -3);
  EXPECT_EQ(TypeOf("1e-3").kind, TypedValue::Kind::kFloat);
  EXPECT_EQ(TypeOf("3x").kind, TypedValue::Kind::kString);
}

TEST(Pjrt, XlaOptionsReachTheCompiler) {
  Client client(CpuPlugin(), {});
  client.set_xla_options({{"xla_cpu_use_fusion_emitters", "false"}});
  float a[2] = {1.5f, -2.0f}, b[2] = {0.25f, 4.0f}, out[2] = {0, 0};
  auto ba = client.FromHost(a, BufferType::F32, {2}, 0);
  auto bb = client.FromHost(b, BufferType::F32, {2}, 0);
  auto outs = client.Compile(kAddModule, 0)->Execute({ba->raw(), bb->raw()}, {});
  outs[0]->ToHost(out, sizeof(out));
  EXPECT_FLOAT_EQ(out[0], 1.75f);
  client.set_xla_options({{"xla_no_such_option_anywhere", "1"}});
  try {
    client.Compile(kAddModule, 0);
    FAIL() << "XLA accepted an unknown option";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("xla_no_such_option_anywhere"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace torch_tpu::pjrt
