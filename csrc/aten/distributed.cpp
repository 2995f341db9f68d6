// torch.distributed on "tpu" tensors: a c10d::Backend that stages through
// host memory. Each collective copies its tpu tensors to CPU, runs the same
// collective on a wrapped CPU backend (ProcessGroupGloo, created by
// python/torch_tpu/distributed.py), waits for it, and copies the results back
// into the tpu tensors in place. CPU tensors pass through unchanged.
//
// Collectives run synchronously: the returned Work is already completed and
// its future holds the output tensors (DDP's reducer reads them from it).
// ReduceOp.AVG and PREMUL_SUM (which gloo lacks) become SUM with a division
// after, or a multiplication before. Collectives the wrapped backend does not
// implement raise its error, which names the op.
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>

#include "aten/tpu.h"

namespace torch_tpu::aten {
namespace {

namespace py = pybind11;
using c10d::ReduceOp;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;

bool IsTpu(const at::Tensor& t) {
  return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1;
}

// Host copy of an input (the tensor itself when it is on the CPU already).
at::Tensor HostCopy(const at::Tensor& t) { return IsTpu(t) ? t.to(at::kCPU).contiguous() : t; }
std::vector<at::Tensor> HostCopy(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(HostCopy(t));
  return out;
}
// Host buffer for an output (the tensor itself when it is on the CPU).
at::Tensor HostBuffer(const at::Tensor& t) {
  return IsTpu(t) ? at::empty(t.sizes(), t.options().device(at::kCPU)) : t;
}
std::vector<at::Tensor> HostBuffer(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(HostBuffer(t));
  return out;
}
// Flat view when possible: NCCL's *_base collectives see tensors as flat
// buffers ((world, n) outputs of an all-gather), gloo wants matching shapes.
at::Tensor Flat(const at::Tensor& t) { return t.is_contiguous() ? t.view({-1}) : t; }

void CopyBack(const at::Tensor& dst, const at::Tensor& host) {
  if (IsTpu(dst)) dst.copy_(host);
}
void CopyBack(const std::vector<at::Tensor>& dst, const std::vector<at::Tensor>& host) {
  for (size_t i = 0; i < dst.size(); ++i) CopyBack(dst[i], host[i]);
}

// A completed Work whose future holds `result`.
WorkPtr Done(const std::vector<at::Tensor>& result) {
  auto fut = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors());
  fut->markCompleted(c10::IValue(result));
  return c10d::Work::create_from_future(fut);
}

void Wait(const WorkPtr& w) {
  if (w) w->wait();
}

// What the wrapped backend runs for `op`, and what to do around it.
struct Reduction {
  ReduceOp op;
  bool average = false;
  std::optional<at::Tensor> premul;  // factor (a CPU tensor) for PREMUL_SUM
};

Reduction Prepare(const ReduceOp& op) {
  Reduction r{op};
  if (op.op_ == ReduceOp::AVG) {
    r.op = ReduceOp(ReduceOp::SUM);
    r.average = true;
  } else if (op.op_ == ReduceOp::PREMUL_SUM) {
    // NCCLPreMulSumSupplement: the class's name up to torch 2.12, an alias of
    // PreMulSumSupplement since (the GPU machine builds against 2.11).
    auto* s = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
    TORCH_CHECK(s != nullptr, "tpu process group: PREMUL_SUM without a factor");
    r.premul = s->tensor_factor.defined() ? s->tensor_factor.to(at::kCPU)
                                          : at::scalar_tensor(s->double_factor, at::kDouble);
    r.op = ReduceOp(ReduceOp::SUM);
  }
  return r;
}

// Applies the pre-multiplication out of place (inputs may be the caller's).
at::Tensor PreMul(const Reduction& r, const at::Tensor& host) {
  if (!r.premul) return host;
  return host.mul(r.premul->to(host.scalar_type()));
}
void PreMulInPlace(const Reduction& r, const at::Tensor& host) {
  if (r.premul) host.mul_(r.premul->to(host.scalar_type()));
}
void Finish(const Reduction& r, const at::Tensor& host, int size) {
  if (!r.average) return;
  if (at::isFloatingType(host.scalar_type()) || at::isComplexType(host.scalar_type())) {
    host.div_(size);
  } else {
    host.copy_(host.div(size, "floor"));
  }
}

class StagingBackend final : public c10d::Backend {
 public:
  explicit StagingBackend(c10::intrusive_ptr<c10d::Backend> inner)
      : c10d::Backend(inner->getRank(), inner->getSize()), inner_(std::move(inner)) {}

  const std::string getBackendName() const override { return "tpu_gloo"; }
  c10::intrusive_ptr<c10d::Backend> inner() const { return inner_; }

  void setTimeout(std::chrono::milliseconds timeout) override { inner_->setTimeout(timeout); }

  WorkPtr broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override {
    auto host = HostCopy(tensors);
    Wait(inner_->broadcast(host, opts));
    CopyBack(tensors, host);
    return Done(tensors);
  }

  // allreduce and reduce: gloo has no AVG / PREMUL_SUM, so those run as SUM
  // with the scaling done around it; `receives`: this rank gets the result.
  template <typename Opts, typename Run>
  WorkPtr StageReduction(std::vector<at::Tensor>& tensors, const Opts& opts, bool receives,
                         Run run) {
    Reduction r = Prepare(opts.reduceOp);
    auto host = HostCopy(tensors);
    for (auto& h : host) PreMulInPlace(r, h);
    Opts o = opts;
    o.reduceOp = r.op;
    Wait(run(host, o));
    if (receives) {
      for (auto& h : host) Finish(r, h, getSize());
      CopyBack(tensors, host);
    }
    return Done(tensors);
  }

  WorkPtr allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override {
    return StageReduction(tensors, opts, true, [&](auto& host, auto& o) {
      return inner_->allreduce(host, o);
    });
  }

  WorkPtr allreduce_coalesced(std::vector<at::Tensor>& tensors,
                              const c10d::AllreduceCoalescedOptions& opts) override {
    // One allreduce per tensor: the same result, without gloo's requirement
    // that coalesced tensors share a dtype and layout.
    c10d::AllreduceOptions o;
    o.reduceOp = opts.reduceOp;
    o.timeout = opts.timeout;
    for (auto& t : tensors) {
      std::vector<at::Tensor> one{t};
      allreduce(one, o);
    }
    return Done(tensors);
  }

  WorkPtr reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override {
    return StageReduction(tensors, opts, getRank() == opts.rootRank, [&](auto& host, auto& o) {
      return inner_->reduce(host, o);
    });
  }

  // allgather and gather: one list of outputs per input, staged alike.
  template <typename Run>
  WorkPtr StageLists(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                     Run run) {
    auto host_in = HostCopy(inputs);
    std::vector<std::vector<at::Tensor>> host_out;
    for (auto& o : outputs) host_out.push_back(HostBuffer(o));
    Wait(run(host_out, host_in));
    std::vector<at::Tensor> flat;
    for (size_t i = 0; i < outputs.size(); ++i) {
      CopyBack(outputs[i], host_out[i]);
      flat.insert(flat.end(), outputs[i].begin(), outputs[i].end());
    }
    return Done(flat);
  }

  WorkPtr allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                    const c10d::AllgatherOptions& opts) override {
    return StageLists(outputs, inputs, [&](auto& out, auto& in) {
      return inner_->allgather(out, in, opts);
    });
  }

  WorkPtr _allgather_base(at::Tensor& output, at::Tensor& input,
                          const c10d::AllgatherOptions& opts) override {
    at::Tensor host_in = HostCopy(input);
    at::Tensor host_out = HostBuffer(output);
    at::Tensor flat_out = Flat(host_out), flat_in = Flat(host_in);
    Wait(inner_->_allgather_base(flat_out, flat_in, opts));
    CopyBack(output, host_out);
    return Done({output});
  }

  WorkPtr allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                              std::vector<at::Tensor>& inputs,
                              const c10d::AllgatherOptions& opts) override {
    std::vector<at::Tensor> flat;
    for (size_t i = 0; i < inputs.size(); ++i) {
      std::vector<std::vector<at::Tensor>> out{outputs.at(i)};
      std::vector<at::Tensor> in{inputs[i]};
      allgather(out, in, opts);
      flat.insert(flat.end(), outputs[i].begin(), outputs[i].end());
    }
    return Done(flat);
  }

  WorkPtr allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllgatherOptions& opts) override {
    for (size_t i = 0; i < inputs.size(); ++i) _allgather_base(outputs.at(i), inputs[i], opts);
    return Done(outputs);
  }

  WorkPtr gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                 const c10d::GatherOptions& opts) override {
    return StageLists(outputs, inputs, [&](auto& out, auto& in) {
      return inner_->gather(out, in, opts);
    });
  }

  WorkPtr scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                  const c10d::ScatterOptions& opts) override {
    std::vector<std::vector<at::Tensor>> host_in;
    for (auto& i : inputs) host_in.push_back(HostCopy(i));
    auto host_out = HostBuffer(outputs);
    Wait(inner_->scatter(host_out, host_in, opts));
    CopyBack(outputs, host_out);
    return Done(outputs);
  }

  WorkPtr reduce_scatter(std::vector<at::Tensor>& outputs,
                         std::vector<std::vector<at::Tensor>>& inputs,
                         const c10d::ReduceScatterOptions& opts) override {
    Reduction r = Prepare(opts.reduceOp);
    std::vector<std::vector<at::Tensor>> host_in;
    for (auto& list : inputs) {
      std::vector<at::Tensor> h;
      for (auto& t : list) h.push_back(PreMul(r, HostCopy(t)));
      host_in.push_back(std::move(h));
    }
    auto host_out = HostBuffer(outputs);
    c10d::ReduceScatterOptions o = opts;
    o.reduceOp = r.op;
    Wait(inner_->reduce_scatter(host_out, host_in, o));
    for (auto& h : host_out) Finish(r, h, getSize());
    CopyBack(outputs, host_out);
    return Done(outputs);
  }

  WorkPtr _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                               const c10d::ReduceScatterOptions& opts) override {
    Reduction r = Prepare(opts.reduceOp);
    at::Tensor host_in = PreMul(r, HostCopy(input));
    at::Tensor host_out = HostBuffer(output);
    c10d::ReduceScatterOptions o = opts;
    o.reduceOp = r.op;
    at::Tensor flat_out = Flat(host_out), flat_in = Flat(host_in);
    Wait(inner_->_reduce_scatter_base(flat_out, flat_in, o));
    Finish(r, host_out, getSize());
    CopyBack(output, host_out);
    return Done({output});
  }

  WorkPtr reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::ReduceScatterOptions& opts) override {
    for (size_t i = 0; i < inputs.size(); ++i) _reduce_scatter_base(outputs.at(i), inputs[i], opts);
    return Done(outputs);
  }

  WorkPtr alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
                        std::vector<int64_t>& input_splits,
                        const c10d::AllToAllOptions& opts) override {
    at::Tensor host_in = HostCopy(input);
    at::Tensor host_out = HostBuffer(output);
    Wait(inner_->alltoall_base(host_out, host_in, output_splits, input_splits, opts));
    CopyBack(output, host_out);
    return Done({output});
  }

  WorkPtr alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                   const c10d::AllToAllOptions& opts) override {
    auto host_in = HostCopy(inputs);
    auto host_out = HostBuffer(outputs);
    Wait(inner_->alltoall(host_out, host_in, opts));
    CopyBack(outputs, host_out);
    return Done(outputs);
  }

  WorkPtr send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    auto host = HostCopy(tensors);
    Wait(inner_->send(host, dst, tag));
    return Done(tensors);
  }

  WorkPtr recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    auto host = HostBuffer(tensors);
    Wait(inner_->recv(host, src, tag));
    CopyBack(tensors, host);
    return Done(tensors);
  }

  WorkPtr recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    auto host = HostBuffer(tensors);
    Wait(inner_->recvAnysource(host, tag));
    CopyBack(tensors, host);
    return Done(tensors);
  }

  WorkPtr barrier(const c10d::BarrierOptions& opts) override {
    // Work issued before the barrier is finished before it.
    GetRuntime().Synchronize();
    c10d::BarrierOptions o = opts;
    o.device = std::nullopt;  // the wrapped backend is a CPU one
    o.device_ids.clear();
    Wait(inner_->barrier(o));
    return Done({});
  }

  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override {
    inner_->monitoredBarrier(opts, wait_all_ranks);
  }
  void setSequenceNumberForGroup() override { inner_->setSequenceNumberForGroup(); }
  uint64_t getSequenceNumberForGroup() override { return inner_->getSequenceNumberForGroup(); }
  void abort() override { inner_->abort(); }
  void shutdown() override { inner_->shutdown(); }

 private:
  c10::intrusive_ptr<c10d::Backend> inner_;
};

}  // namespace

// Called by torch_tpu.distributed after torch.distributed is imported (which
// registers c10d::Backend with pybind, the base of the class defined here).
void RegisterDistributedBindings(PyObject* module) {
  auto m = py::reinterpret_borrow<py::module_>(module);
  m.def("_init_distributed", [m]() mutable {
    if (py::hasattr(m, "_StagingBackend")) return;
    py::class_<StagingBackend, c10d::Backend, c10::intrusive_ptr<StagingBackend>>(
        m, "_StagingBackend",
        "c10d backend for tpu tensors: stages each collective through host memory and runs it "
        "on the wrapped CPU backend (gloo).")
        .def(py::init<c10::intrusive_ptr<c10d::Backend>>(), py::arg("inner"))
        .def_property_readonly("inner", &StagingBackend::inner);
  });
}

}  // namespace torch_tpu::aten
