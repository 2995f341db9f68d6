#include "runtime/launcher.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>

namespace torch_tpu::runtime {

LaunchParam LaunchParam::Of(pjrt::BufferPtr b, bool donate) {
  LaunchParam p;
  p.buffer = std::move(b);
  p.donate = donate;
  return p;
}

LaunchParam LaunchParam::Integer(int64_t v, hlo::ElementType t) {
  LaunchParam p;
  p.kind = Kind::Int;
  p.i = v;
  p.dtype = t;
  return p;
}

LaunchParam LaunchParam::Floating(double v, hlo::ElementType t) {
  LaunchParam p;
  p.kind = Kind::Float;
  p.f = v;
  p.dtype = t;
  return p;
}

LaunchParam LaunchParam::Raw(const void* data, size_t nbytes, hlo::ElementType t, int64_t length) {
  LaunchParam p;
  p.kind = Kind::Bytes;
  if (nbytes > sizeof(p.bytes)) throw std::invalid_argument("launch parameter over 16 bytes");
  std::memcpy(p.bytes, data, nbytes);
  p.nbytes = nbytes;
  p.dtype = t;
  p.length = length;
  return p;
}

namespace {

int64_t Elements(const pjrt::Buffer& b) {
  int64_t n = 1;
  for (int64_t d : b.dims()) n *= d;
  return n;
}

pjrt::BufferPtr Upload(Runtime& rt, const LaunchParam& p, int device) {
  switch (p.kind) {
    case LaunchParam::Kind::Buffer: return p.buffer;
    case LaunchParam::Kind::Int: return rt.UploadInt(p.i, p.dtype, device);
    case LaunchParam::Kind::Float: return rt.UploadScalar(p.f, p.dtype, device);
    case LaunchParam::Kind::Bytes: {
      std::vector<int64_t> dims;
      if (p.length >= 0) dims.push_back(p.length);
      return rt.Upload(p.bytes, p.dtype, dims, device);
    }
  }
  return nullptr;
}

// Whether parameter i may be donated: asked for, and not also read through
// another parameter (the same storage passed twice).
bool Donatable(const std::vector<PJRT_Buffer*>& raw, const Launch& l, size_t i) {
  if (!l.params[i].donate) return false;
  for (size_t j = 0; j < raw.size(); ++j)
    if (j != i && raw[j] == raw[i]) return false;
  return true;
}

// LaunchFloorSeconds(): while set, Run() keeps a copy of its launch here.
std::optional<Launch>* captured = nullptr;

// Per-launch scratch, reused so that a cached op allocates nothing here.
// Run() does not re-enter itself on a thread (nothing it calls launches),
// and the buffers kept alive are released before it returns.
struct Scratch {
  std::vector<pjrt::BufferPtr> keep;
  std::vector<PJRT_Buffer*> raw;
  std::vector<int64_t> non_donatable;
  bool busy = false;
};

}  // namespace

std::vector<pjrt::BufferPtr> Run(Runtime& rt, const Launch& l) {
  if (captured && !captured->has_value()) *captured = l;
  thread_local Scratch scratch;
  Scratch local;  // only if Run() ever re-enters on this thread
  Scratch& s = scratch.busy ? local : scratch;
  s.busy = true;
  struct Release {
    Scratch& s;
    ~Release() {
      s.keep.clear();  // drop the references to the parameter buffers
      s.busy = false;
    }
  } release{s};
  const size_t n = l.params.size();
  s.keep.resize(n);
  s.raw.resize(n);
  for (size_t i = 0; i < n; ++i) {
    s.keep[i] = Upload(rt, l.params[i], l.device);
    s.raw[i] = s.keep[i]->raw();
  }
  s.non_donatable.clear();
  for (size_t i = 0; i < n; ++i)
    if (!Donatable(s.raw, l, i)) s.non_donatable.push_back(static_cast<int64_t>(i));
  static const std::string unnamed = "op";
  std::vector<pjrt::BufferPtr> outs = rt.Execute(*l.exe, s.raw, s.non_donatable, l.op ? *l.op : unnamed);
  const size_t taken = l.results.size(), checks = l.num_checks();
  if (outs.size() < taken + checks)
    throw pjrt::Error("executable returned " + std::to_string(outs.size()) + " results, expected " +
                      std::to_string(taken + checks));
  for (size_t k = 0; k < taken; ++k) {
    DeviceStorage* s = l.results[k];
    s->SetResult(outs[k], s->padded() ? Elements(*outs[k]) : 0);
    if (k < l.result_types.size()) s->dtype = l.result_types[k];
  }
  for (size_t c = 0; c < checks; ++c) rt.AddAssertion(outs[taken + c], (*l.checks)[c]);
  return std::vector<pjrt::BufferPtr>(outs.begin() + static_cast<std::ptrdiff_t>(taken + checks),
                                      outs.end());
}

double LaunchFloorSeconds(Runtime& rt, const std::function<void()>& op, int n) {
  std::optional<Launch> kept;
  captured = &kept;
  try {
    op();
  } catch (...) {
    captured = nullptr;
    throw;
  }
  captured = nullptr;
  if (!kept) throw std::invalid_argument("launch floor: the op launched no executable");
  const size_t count = kept->params.size();
  std::vector<int64_t> keep_all(count);
  for (size_t i = 0; i < count; ++i) keep_all[i] = static_cast<int64_t>(i);
  std::vector<pjrt::BufferPtr> last;
  auto start = std::chrono::steady_clock::now();
  for (int k = 0; k < n; ++k) {
    std::vector<pjrt::BufferPtr> held(count);
    std::vector<PJRT_Buffer*> raw(count);
    for (size_t i = 0; i < count; ++i) {
      held[i] = Upload(rt, kept->params[i], kept->device);
      raw[i] = held[i]->raw();
    }
    last = kept->exe->Execute(raw, keep_all);
  }
  for (auto& b : last) b->AwaitReady();
  std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  return took.count() / std::max(n, 1);
}

}  // namespace torch_tpu::runtime
