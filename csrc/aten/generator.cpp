// The tpu generator: (seed, offset) of a counter-based stream. Random rules
// take the state as a runtime parameter; each call advances the offset by
// the values it draws.
#include <ATen/core/GeneratorForPrivateuseone.h>

#include <cstring>
#include <mutex>

#include "aten/tpu.h"

namespace torch_tpu::aten {

namespace {

struct TpuGenerator final : public c10::GeneratorImpl {
  explicit TpuGenerator(c10::DeviceIndex device)
      : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, device),
                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)) {}
  void set_current_seed(uint64_t seed) override {
    seed_ = seed;
    offset_ = 0;
  }
  void set_offset(uint64_t offset) override { offset_ = offset; }
  uint64_t get_offset() const override { return offset_; }
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override {
    uint64_t s = c10::detail::getNonDeterministicRandom();
    set_current_seed(s);
    return s;
  }
  // State: 16 bytes, seed then offset, as a CPU uint8 tensor.
  void set_state(const c10::TensorImpl& state) override {
    TORCH_CHECK(state.numel() == 16 && state.dtype() == at::kByte,
                "tpu RNG state must be a uint8 tensor of 16 bytes");
    const auto* p = static_cast<const uint8_t*>(state.data());
    std::memcpy(&seed_, p, 8);
    std::memcpy(&offset_, p + 8, 8);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    auto t = at::empty({16}, at::kByte);
    std::memcpy(t.data_ptr(), &seed_, 8);
    std::memcpy(static_cast<uint8_t*>(t.data_ptr()) + 8, &offset_, 8);
    return t.getIntrusivePtr();
  }
  TpuGenerator* clone_impl() const override {
    auto* g = new TpuGenerator(device().index());
    g->seed_ = seed_;
    g->offset_ = offset_;
    return g;
  }
  uint64_t seed_ = 67280421310721ULL;
  uint64_t offset_ = 0;
};

std::vector<at::Generator>& DefaultGenerators() {
  static std::vector<at::Generator> gens = [] {
    std::vector<at::Generator> v;
    int n = GetRuntime().device_count();
    for (int i = 0; i < n; ++i)
      v.push_back(at::make_generator<TpuGenerator>(static_cast<c10::DeviceIndex>(i)));
    return v;
  }();
  return gens;
}

}  // namespace

std::pair<uint64_t, uint64_t> NextRngState(const std::optional<at::Generator>& gen, int device,
                                           uint64_t increment) {
  at::Generator g = gen.has_value() && gen->defined() ? *gen : DefaultGenerators().at(device);
  auto* impl = dynamic_cast<TpuGenerator*>(g.unsafeGetGeneratorImpl());
  TORCH_CHECK(impl != nullptr, "Expected a 'tpu' generator, got one for ", g.device());
  std::lock_guard<std::mutex> lock(g.mutex());
  auto state = std::make_pair(impl->seed_, impl->offset_);
  impl->offset_ += increment;
  return state;
}

const at::Generator& DefaultGenerator(int device) {
  return DefaultGenerators().at(device < 0 ? CurrentDevice() : device);
}

at::Generator NewGenerator(int device) {
  return at::make_generator<TpuGenerator>(
      static_cast<c10::DeviceIndex>(device < 0 ? CurrentDevice() : device));
}

}  // namespace torch_tpu::aten
