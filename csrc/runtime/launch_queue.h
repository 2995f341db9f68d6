// The launch queue: launches whose executables are compiling on the compile
// pool (compile_pool.h). Python keeps dispatching while XLA compiles: a
// first-seen op builds its module, submits the compile and queues its
// launch; every later launch is queued behind it while the queue is not
// empty, so launches run strictly in dispatch order. They run on the
// dispatching thread: those whose executables are ready as new ones are
// queued (RunReady), all of them at a sync point (Drain).
//
// A storage a queued launch will write is `queued` (runtime.h): its buffer
// is stale. A launch queued later that reads it takes the value when it
// runs. Any other reader must Drain() first (aten does so wherever a
// storage is looked up outside a queued call, and at every sync point).
// A compile that failed is raised by the next Drain(), naming the op.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/compile_pool.h"
#include "runtime/launcher.h"

namespace torch_tpu::runtime {

// The value a queued launch writes into a storage, set when it has run.
struct QueuedValue {
  pjrt::BufferPtr buffer;
};

// One launch whose executable may still be compiling.
struct QueuedLaunch {
  Launch launch;  // exe: the compile's; checks: set to &checks
  std::shared_ptr<PendingCompile> compile;
  std::vector<std::string> checks;
  // Per launch parameter: the storage it reads (null: not a storage).
  std::vector<DeviceStorage*> reads;
  // Called after the launch ran, when this entry started the compile:
  // whether XLA compiled it (false: a cache or disk hit).
  std::function<void(bool compiled)> on_compiled;
  // Filled when queued: per parameter, the queued value it reads (null:
  // launch.params[i].buffer); per result, the value it writes.
  std::vector<std::shared_ptr<QueuedValue>> late, writes;
};

namespace launch_queue {

extern std::atomic<int> g_size;  // queued launches, including one being run

// Whether any launch is queued: the one check of every fast path.
inline bool Busy() { return g_size.load(std::memory_order_acquire) != 0; }

// Queues `q` behind every queued launch, then runs the ready ones.
void Enqueue(Runtime& rt, std::unique_ptr<QueuedLaunch> q);

// Runs every queued launch in order, waiting for their compiles. The first
// that fails (its compile, or its execution) is raised as a pjrt::Error
// naming its op; the launches after it are dropped (the storages they would
// write keep their previous values) and the queue is empty again.
void Drain(Runtime& rt);

// Runs the queued launches whose executables are ready, up to the first
// that is not. A failed compile stays queued for Drain() to raise.
void RunReady(Runtime& rt);

// `s` is being freed: queued launches that write it write a scratch
// storage instead (later queued readers still get the value).
void Forget(DeviceStorage* s);

}  // namespace launch_queue
}  // namespace torch_tpu::runtime
