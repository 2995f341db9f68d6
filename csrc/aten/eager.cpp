// Strict eager, the default mode: one boxed kernel serves every op with a
// lowering rule. It plans the call (call_plan.cpp), finds its output types
// (call_outputs.cpp), and then either records it into the fused chain
// (fused.cpp) or runs it as its own module: on a cache miss the rule builds
// a one-op module (call_emit.cpp) that is compiled once; on a hit the cached
// executable is launched at once, asynchronously. Scalars, view offsets and
// RNG states are runtime parameters, so they never cause a recompile.
#include <ATen/MemoryOverlap.h>
#include <c10/util/accumulate.h>
#include <torch/library.h>

#include <unordered_map>

#include "aten/call.h"
#include "aten/dynamic.h"
#include "runtime/compile_pool.h"
#include "runtime/launch_queue.h"

namespace torch_tpu::aten {

using hlo::Value;
using lowering::Arg;

void ResolveTensorInputs(std::vector<c10::IValue>& args, const std::vector<size_t>& mutable_args,
                         const std::vector<size_t>& out_args, const std::string& op);  // complex.cpp
bool NeedsWidening(const c10::OperatorHandle& op, const torch::jit::Stack& stack);  // complex_half.cpp
void RunWidened(const c10::OperatorHandle& op, torch::jit::Stack* stack);           // complex_half.cpp

namespace {

// What a cache key has compiled: the executable, the call's output specs
// (so meta runs only on a miss) and the messages of its device assertions.
struct Compiled {
  pjrt::ExecutablePtr exe;
  std::vector<OutputSpec> outputs;
  std::vector<std::string> checks;  // prefixed with the op name
  // Compiling on the compile pool (exe not known yet; null otherwise).
  std::shared_ptr<runtime::PendingCompile> compiling;
  // Recorded into a fused chain with these exact sizes (the chain's
  // executable holds it): they stay static, as a compiled call's do.
  bool recorded = false;
  bool known() const { return exe || compiling; }
};

std::unordered_map<std::string, Compiled>& Executables() {
  static auto* m = new std::unordered_map<std::string, Compiled>();
  return *m;
}


// The one-op module: parameters in plan order, results = written storages
// (each aliased to its storage parameter), fresh outputs, assertions.
std::string BuildModule(const Call& call, std::vector<std::string>* checks) {
  const Plan& plan = call.plan;
  hlo::Builder b("op");
  std::vector<Value> params;
  for (const auto& q : plan.params) params.push_back(b.Parameter(ParamType(plan, q)));
  Emitted e = EmitCall(call, b, params);
  std::vector<Value> outs = e.written_values;
  for (size_t k = 0; k < call.written.size(); ++k) {
    int p = plan.storage_param[call.written[k]];
    // A padded storage gets its value back in its padded layout (call_emit.cpp).
    if (p >= 0) b.SetParameterAttrs(p, "tf.aliasing_output = " + std::to_string(k) + " : i32");
  }
  outs.insert(outs.end(), e.fresh_values.begin(), e.fresh_values.end());
  for (const auto& check : e.checks) {
    outs.push_back(check.ok);
    checks->push_back(CheckMessage(*call.desc, check.message));
  }
  b.Return(outs);
  return b.ToText();
}

// `hit`: the cache entry found while planning (null on a miss).
const Compiled& CompiledFor(const Call& call, Compiled* hit) {
  auto& rt = GetRuntime();
  if (hit && hit->exe) {
    ++rt.stats().cache_hits;
    return *hit;
  }
  std::vector<std::string> checks;
  auto exe = GetOrCompileCounted(call.plan.key, call.plan.device,
                                 [&] { return BuildModule(call, &checks); }, call.desc->name);  // dynamic.h
  return Executables()[call.plan.key] = Compiled{exe, call.cached(), checks};
}

// The launch of the call (exe unset): storages written take its first
// results, fresh tensors the next ones (appended to *results).
runtime::Launch BuildLaunch(const Call& call, std::vector<c10::IValue>* results) {
  const Plan& plan = call.plan;
  runtime::Launch launch;
  launch.device = plan.device;
  launch.op = &call.desc->name;
  launch.params.reserve(plan.params.size());
  launch.results.reserve(call.written.size() + call.specs.size());
  for (const Param& q : plan.params) {
    launch.params.push_back(LaunchValue(plan, q));
    launch.params.back().donate = Donated(call, q);
  }
  for (size_t k : call.written) launch.results.push_back(plan.storages[k]);
  for (size_t i = 0; i < call.specs.size(); ++i) {
    if (plan.dests[i].tensor.defined()) {
      results->push_back(plan.dests[i].tensor);
      continue;
    }
    at::Tensor t = FreshTensor(call, i);
    launch.results.push_back(StorageOf(t));
    results->push_back(t);
  }
  return launch;
}

// Launches the call's executable.
std::vector<c10::IValue> LaunchCall(const Call& call, Compiled* hit, FastCall& fast) {
  const Compiled& compiled = CompiledFor(call, hit);
  if (hit) fast.Remember(call, compiled.exe, compiled.outputs, compiled.checks);
  std::vector<c10::IValue> results;
  runtime::Launch launch = BuildLaunch(call, &results);
  launch.exe = compiled.exe.get();
  launch.checks = &compiled.checks;
  runtime::Run(GetRuntime(), launch);
  CountNative(*call.desc);
  return WithUndefined(call, std::move(results));
}

// Whether the call may be queued behind compiles (launch_queue.h): compile
// threads on, strict eager, and plain storages (a padded one goes through
// the paths that read buffers themselves).
bool Queueable(const Call& call) {
  if (runtime::CompileThreads() == 0 || Recording() || GetRuntime().launch_blocking()) return false;
  for (const runtime::DeviceStorage* s : call.plan.storages)
    if (s->padded()) return false;
  return true;
}

// The compile of the call's executable: known (a hit: ready, or still
// compiling) or started on the compile pool. *started: this call started it.
std::shared_ptr<runtime::PendingCompile> CompileFor(const Call& call, Compiled* hit, bool* started) {
  auto& rt = GetRuntime();
  *started = false;
  if (hit && hit->known()) {
    ++rt.stats().cache_hits;
    if (hit->exe) return runtime::PendingCompile::Ready(hit->exe);
    return hit->compiling;
  }
  std::vector<std::string> checks;
  auto pending = rt.CompileInBackground(call.plan.key, call.plan.device,
                                        [&] { return BuildModule(call, &checks); });
  *started = true;  // on_compiled counts it if XLA compiled it (not a cache hit)
  Compiled& entry = Executables()[call.plan.key] = Compiled{nullptr, call.cached(), checks, pending};
  if (pending->done() && !pending->failed()) {  // a cache hit, or done already
    entry.exe = pending->Wait();
    entry.compiling = nullptr;
  }
  return pending;
}

// An in-place call whose destinations and inputs hold no elements (the
// gradient of an empty view: slice_backward's copy into `q[..., 8:]` of a
// head dim of 8) computes nothing. Its shapes were checked (ComputeOutputs);
// nothing compiles or launches, at any size.
bool ComputesNothing(const Call& call) {
  if (call.desc->variant != Variant::InPlace || call.plan.dests.size() != call.specs.size()) return false;
  for (const Dest& d : call.plan.dests)
    if (!d.tensor.defined() || d.tensor.numel() != 0) return false;
  for (const TensorIn& in : call.plan.inputs)
    if (c10::multiply_integers(in.geometry.sizes) != 0) return false;
  return true;
}

// Queues the call's launch behind the compiles (launch_queue.h); its
// results are returned at once (their storages are queued).
std::vector<c10::IValue> QueueCall(const Call& call, Compiled* hit, FastCall& fast) {
  bool started = false;
  auto pending = CompileFor(call, hit, &started);
  const Compiled& compiled = Executables()[call.plan.key];
  if (hit && compiled.exe) fast.Remember(call, compiled.exe, compiled.outputs, compiled.checks);
  auto q = std::make_unique<runtime::QueuedLaunch>();
  std::vector<c10::IValue> results;
  q->launch = BuildLaunch(call, &results);
  q->compile = std::move(pending);
  q->checks = compiled.checks;
  for (const Param& p : call.plan.params)
    q->reads.push_back(p.kind == Param::Kind::Storage ? call.plan.storages[p.storage] : nullptr);
  if (started) {
    const std::string& name = call.desc->name;
    // Counted when the launch runs, after later calls: this call's reason.
    q->on_compiled = [&name, reason = ExactReason()](bool compiled) {
      if (compiled) CountCompile(name, false, reason);  // dynamic.h
    };
  }
  runtime::launch_queue::Enqueue(GetRuntime(), std::move(q));
  CountNative(*call.desc);
  return WithUndefined(call, std::move(results));
}

// A compiling entry whose compile finished: its executable (or, failed,
// no entry: the next call compiles again, as after a synchronous failure).
Compiled* Settle(std::unordered_map<std::string, Compiled>& cache, const std::string& key) {
  auto found = cache.find(key);
  if (found == cache.end()) return nullptr;
  Compiled& c = found->second;
  if (c.compiling && c.compiling->done()) {
    if (c.compiling->failed()) {
      cache.erase(found);
      return nullptr;
    }
    c.exe = c.compiling->Wait();
    c.compiling = nullptr;
  }
  return &c;
}

}  // namespace

void ClearEagerExecutables() { Executables().clear(); }

// Runs `desc` on `args` (the op's arguments, in schema order) and returns
// the op's results: fresh outputs, then mutated tensors.
std::vector<c10::IValue> RunCall(const OpDesc& desc, const c10::OperatorHandle& op,
                                 const std::vector<c10::IValue>& args) {
  FastCall fast;  // call_fast.cpp: a signature seen before launches at once
  if (auto results = fast.TryLaunch(desc, op.schema(), args)) return std::move(*results);
  if (auto results = RunFactoryOnHost(desc, op, args)) return std::move(*results);  // arange at a new size
  // A storage a queued launch writes is read by this call's own launch,
  // queued behind it (or the queue is drained first: below).
  QueuedCallScope scope;
  Call call;
  call.desc = &desc;
  call.plan = PlanCall(desc, op.schema(), args);
  auto& cache = Executables();
  Compiled* hit = Settle(cache, call.plan.key);
  const std::vector<OutputSpec>* cached = hit ? &hit->outputs : DynamicSpecs(call.plan.key);
  std::optional<std::vector<OutputSpec>> derived;  // a new size of a dynamic signature: no meta kernel
  if (!cached && (derived = DerivedSpecs(call, op, args))) cached = &*derived;
  if (!ComputeOutputs(call, op, args, cached)) return RunCall(desc, op, args);  // out= resized
  FinishPlan(call, args);
  if (ComputesNothing(call)) {
    std::vector<c10::IValue> results;
    for (const Dest& d : call.plan.dests) results.push_back(d.tensor);
    CountNative(*call.desc);
    return WithUndefined(call, std::move(results));
  }
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, call.plan.device));
  const bool can_queue = Queueable(call);
  if (!can_queue) DrainLaunches();  // this call reads buffers itself: none may be stale
  // Bounded dynamic shapes (dynamic.cpp): a new size of a known signature.
  // In fused eager too: such a call runs on its own (its chain's executable
  // would otherwise compile for every size), the chain records the rest.
  const bool recording = Recording();
  if (!(hit && (hit->known() || (recording && hit->recorded)))) {
    if (auto results = RunDynamic(call, op, args, fast)) return std::move(*results);
  }
  if (recording) {
    if (CompactForRecording(call)) return RunCall(desc, op, args);  // planned again, exact
    cache.try_emplace(call.plan.key, Compiled{nullptr, call.cached(), {}}).first->second.recorded = true;
    std::shared_ptr<const KeptCall> kept;
    std::vector<c10::IValue> results = RecordCall(call, &kept);
    fast.RememberRecorded(kept);  // the next call of this signature records from it
    return results;
  }
  // Queued when launches are queued (to keep their order) or when it needs
  // a compile; a hit with nothing queued launches at once, as with no pool.
  if (can_queue && (runtime::launch_queue::Busy() || !(hit && hit->exe))) return QueueCall(call, hit, fast);
  return LaunchCall(call, hit, fast);
}

namespace {

void PushResults(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                 std::vector<c10::IValue> results) {
  const auto& returns = op.schema().returns();
  if (returns.size() == 1 && returns[0].real_type()->kind() == c10::TypeKind::ListType) {
    std::vector<at::Tensor> list;
    for (auto& r : results) list.push_back(r.toTensor());
    stack->push_back(list);
    return;
  }
  TORCH_CHECK(returns.size() == results.size() || returns.empty(), "internal: ", returns.size(),
              " returns expected, got ", results.size());
  if (returns.empty()) return;
  for (auto& r : results) stack->push_back(std::move(r));
}

// RunCall() returns fresh outputs then mutated tensors; a mutating op returns, in
// schema order, fresh outputs and aliases of its mutated arguments.
std::vector<c10::IValue> MutatingReturns(const OpDesc& desc, const c10::OperatorHandle& op,
                                         const std::vector<c10::IValue>& args,
                                         std::vector<c10::IValue> results) {
  const auto& schema = op.schema();
  std::vector<c10::IValue> out;
  size_t fresh = 0;
  for (const auto& r : schema.returns()) {
    if (!r.alias_info()) {
      out.push_back(results.at(fresh++));
      continue;
    }
    for (size_t i : desc.mutable_args) {
      if (*schema.arguments()[i].alias_info() == *r.alias_info()) {
        out.push_back(args[i]);
        break;
      }
    }
  }
  return out;
}

std::string PrefixedMessage(const std::string& op, const char* what) { return op + ": " + what; }

// Like TensorIterator on the CPU: no writes through a tensor whose elements
// alias each other (expand()ed), except writes the rule says are safe to
// repeat (fills).
void CheckNoInternalOverlap(const OpDesc& desc, const std::vector<c10::IValue>& args) {
  if (desc.variant == Variant::Functional || desc.rule->repeat_safe_writes) return;
  for (size_t i : desc.mutable_args)
    if (args[i].isTensor() && args[i].toTensor().defined())
      at::assert_no_internal_overlap(args[i].toTensor());
  for (size_t i : desc.out_args) at::assert_no_internal_overlap(args[i].toTensor());
}

// Index lists (Tensor?[]: index_put_, _index_put_impl_, _unsafe_index, ...)
// may hold CPU index tensors, as on CUDA (x[:, idx] with a CPU idx, and its
// backward): they move to the device of the call's first tpu tensor.
// Whether schema argument `a` is an index list (Tensor?[]).
bool IsIndexList(const c10::Argument& a) {
  const c10::TypePtr& type = a.real_type();
  if (type->kind() != c10::TypeKind::ListType) return false;
  const c10::TypePtr& elem = type->castRaw<c10::ListType>()->getElementType();
  return elem->kind() == c10::TypeKind::OptionalType &&
         elem->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::TensorType;
}

void IndicesToDevice(const c10::FunctionSchema& schema, std::vector<c10::IValue>& args) {
  for (size_t k = 0; k < args.size() && k < schema.arguments().size(); ++k) {
    if (!IsIndexList(schema.arguments()[k]) || !args[k].isList()) continue;
    c10::List<std::optional<at::Tensor>> list = c10::impl::toTypedList<std::optional<at::Tensor>>(args[k].toList());
    bool moved = false;  // then `list` is a copy: the caller's (autograd's saved indices) stays as it was
    for (size_t i = 0; i < list.size(); ++i) {
      std::optional<at::Tensor> t = list.get(i);
      if (!t || !t->defined() || !t->device().is_cpu() || t->dim() == 0) continue;
      for (const auto& a : args)  // the call's first tpu tensor
        if (a.isTensor() && a.toTensor().defined() && a.toTensor().device().type() == c10::DeviceType::PrivateUse1) {
          if (!moved) list = list.copy();
          list.set(i, t->to(a.toTensor().device()));
          moved = true;
          break;
        }
    }
    if (moved) args[k] = list;
  }
}

}  // namespace

void EagerKernel(const OpDesc& desc, const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // complex32 has no device type: the op runs on complex64 copies.
  if (NeedsWidening(op, *stack)) return RunWidened(op, stack);
  size_t n = op.schema().arguments().size();
  std::vector<c10::IValue> args(stack->end() - n, stack->end());
  // x.conj() / _neg_view() inputs of ops the math-bit fallbacks let through
  // (mm, clone, _to_copy, ...) and a storage read with two dtypes (z * z.real):
  // resolved into plain tensors (complex.cpp).
  ResolveTensorInputs(args, desc.mutable_args, desc.out_args, desc.name);
  IndicesToDevice(op.schema(), args);
  CheckNoInternalOverlap(desc, args);
  try {
    auto results = RunCall(desc, op, args);
    if (desc.variant == Variant::InPlace) results = MutatingReturns(desc, op, args, results);
    torch::jit::drop(*stack, n);
    PushResults(op, stack, std::move(results));
  } catch (const lowering::Unsupported& e) {
    RecordFallback(desc.name);
    CpuFallback(op, stack);
  } catch (const pjrt::Error& e) {
    TORCH_CHECK(false, PrefixedMessage(desc.name, e.what()));
  } catch (const std::out_of_range& e) {
    TORCH_CHECK_INDEX(false, PrefixedMessage(desc.name, e.what()));
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK(false, PrefixedMessage(desc.name, e.what()));
  } catch (const std::logic_error& e) {
    TORCH_CHECK(false, PrefixedMessage(desc.name, e.what()), " (torch_tpu lowering bug)");
  }
}

void RunInto(const std::string& name, const std::vector<c10::IValue>& inputs, const at::Tensor& dst) {
  // A synthetic in-place call: rule(inputs) written into dst, planned as
  // copy_(Tensor(a!) self, Tensor src, bool non_blocking) with self = dst,
  // whose meta result (dst's own shape and dtype) is what we need.
  static const c10::OperatorHandle copy_op =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::copy_", "");
  static std::unordered_map<std::string, OpDesc>* descs = new std::unordered_map<std::string, OpDesc>();
  auto it = descs->find(name);
  if (it == descs->end()) it = descs->emplace(name, InternalOp(name, Variant::InPlace, {0})).first;
  std::vector<c10::IValue> args{dst, inputs.at(0), false};
  try {
    RunCall(it->second, copy_op, args);
  } catch (const pjrt::Error& e) {
    TORCH_CHECK(false, PrefixedMessage(name, e.what()));
  }
}

}  // namespace torch_tpu::aten
