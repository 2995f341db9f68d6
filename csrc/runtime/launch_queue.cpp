#include "runtime/launch_queue.h"

#include <pthread.h>

#include <deque>
#include <mutex>

#include "runtime/compile_hook.h"

namespace torch_tpu::runtime::launch_queue {

std::atomic<int> g_size{0};

namespace {

struct Queue {
  std::mutex mu;  // entries, and the `queued` of every storage
  std::deque<std::unique_ptr<QueuedLaunch>> entries;
  // One thread runs launches at a time. Recursive: a compile-log callback
  // run after a launch may dispatch (and so drain) again.
  std::recursive_mutex run_mu;
};

Queue& Q() {
  static auto* q = new Queue();  // leaked: storages may be freed at exit
  return *q;
}

// fork(): the child must not inherit `mu` locked by a thread it lacks.
void RegisterAtFork() {
  static bool registered = (pthread_atfork([] { Q().mu.lock(); }, [] { Q().mu.unlock(); },
                                           [] { Q().mu.unlock(); }),
                            true);
  (void)registered;
}

// Runs one taken entry. Its executable (waited for), its late parameters
// (written by entries that ran before it), and its results: freed storages
// are written as scratch storages, so the values reach later readers.
void RunOne(Runtime& rt, QueuedLaunch& q) {
  pjrt::ExecutablePtr exe = q.compile->Wait();
  Launch& l = q.launch;
  l.exe = exe.get();
  std::vector<DeviceStorage> scratch(l.results.size());
  std::vector<DeviceStorage*> live(l.results.size(), nullptr);
  {
    std::lock_guard<std::mutex> lock(Q().mu);
    for (size_t i = 0; i < l.params.size(); ++i)
      if (q.late[i]) l.params[i].buffer = q.late[i]->buffer;
    for (size_t k = 0; k < l.results.size(); ++k) {
      live[k] = l.results[k];
      if (!l.results[k]) l.results[k] = &scratch[k];
    }
  }
  for (const auto& p : l.params)
    if (p.kind == LaunchParam::Kind::Buffer && !p.buffer)
      throw pjrt::Error("internal: a queued launch reads a value that was never written");
  Run(rt, l);
  {
    std::lock_guard<std::mutex> lock(Q().mu);
    for (size_t k = 0; k < l.results.size(); ++k) {
      q.writes[k]->buffer = l.results[k]->buffer;
      if (live[k] && live[k]->queued == q.writes[k]) live[k]->queued = nullptr;
    }
  }
  if (q.on_compiled) {
    bool compiled = q.compile->compiled();
    q.on_compiled(compiled);
    if (compiled) NotifyCompiled(q.compile->seconds());  // compile_hook.h: the compile-burst log
  }
}

// After a failure: every queued entry is dropped, its storages no longer
// queued. Returns them, to be destroyed outside the lock.
std::deque<std::unique_ptr<QueuedLaunch>> DropAll(QueuedLaunch& failed) {
  std::lock_guard<std::mutex> lock(Q().mu);
  std::deque<std::unique_ptr<QueuedLaunch>> dropped;
  dropped.swap(Q().entries);
  auto unqueue = [](QueuedLaunch& q) {
    for (size_t k = 0; k < q.launch.results.size(); ++k) {
      DeviceStorage* s = q.launch.results[k];
      if (s && s->queued == q.writes[k]) s->queued = nullptr;
    }
  };
  unqueue(failed);
  for (auto& q : dropped) unqueue(*q);
  g_size.store(0, std::memory_order_release);
  return dropped;
}

// Takes the front entry if there is one (and, when `ready_only`, its
// executable is ready).
std::unique_ptr<QueuedLaunch> TakeFront(bool ready_only) {
  std::lock_guard<std::mutex> lock(Q().mu);
  auto& entries = Q().entries;
  if (entries.empty()) return nullptr;
  if (ready_only && (!entries.front()->compile->done() || entries.front()->compile->failed()))
    return nullptr;
  std::unique_ptr<QueuedLaunch> q = std::move(entries.front());
  entries.pop_front();
  return q;
}

void RunQueued(Runtime& rt, bool ready_only) {
  std::lock_guard<std::recursive_mutex> run(Q().run_mu);
  while (auto q = TakeFront(ready_only)) {
    try {
      RunOne(rt, *q);
    } catch (const std::exception& e) {
      const std::string op = q->launch.op ? *q->launch.op : "op";
      auto dropped = DropAll(*q);
      const char* what = q->compile->failed() ? " failed to compile (on the compile pool): "
                                              : " failed (launched from the compile queue): ";
      throw pjrt::Error(op + what + e.what() +
                        (dropped.empty() ? std::string()
                                         : "; " + std::to_string(dropped.size()) +
                                               " ops queued after it were not run"));
    }
    g_size.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace

void Enqueue(Runtime& rt, std::unique_ptr<QueuedLaunch> q) {
  RegisterAtFork();
  {
    std::lock_guard<std::mutex> lock(Q().mu);
    Launch& l = q->launch;
    l.checks = &q->checks;
    q->late.assign(l.params.size(), nullptr);
    for (size_t i = 0; i < l.params.size() && i < q->reads.size(); ++i) {
      DeviceStorage* s = q->reads[i];
      if (s && s->queued) {
        q->late[i] = s->queued;
        l.params[i].buffer = nullptr;  // stale: the queued value replaces it
      }
    }
    for (DeviceStorage* s : l.results) {
      s->queued = std::make_shared<QueuedValue>();
      q->writes.push_back(s->queued);
    }
    Q().entries.push_back(std::move(q));
    g_size.fetch_add(1, std::memory_order_acq_rel);
  }
  RunReady(rt);
}

void Drain(Runtime& rt) {
  if (!Busy()) return;
  if (Runtime::InForkedChild())
    throw pjrt::Error("tpu: queued ops cannot run in a forked child process (the compile threads "
                      "stayed in the parent)");
  RunQueued(rt, false);
}

void RunReady(Runtime& rt) {
  if (Busy()) RunQueued(rt, true);
}

void Forget(DeviceStorage* s) {
  if (!s->queued) return;
  std::lock_guard<std::mutex> lock(Q().mu);
  for (auto& q : Q().entries)
    for (auto& r : q->launch.results)
      if (r == s) r = nullptr;
}

}  // namespace torch_tpu::runtime::launch_queue
