#include "runtime/compile_pool.h"

#include <pthread.h>

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <stdexcept>
#include <thread>
#include <vector>

namespace torch_tpu::runtime {

std::shared_ptr<PendingCompile> PendingCompile::Ready(pjrt::ExecutablePtr exe) {
  auto p = std::make_shared<PendingCompile>();
  p->Finish(std::move(exe), false, 0);
  return p;
}

bool PendingCompile::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

bool PendingCompile::failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_ && !exe_;
}

pjrt::ExecutablePtr PendingCompile::Wait() const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return done_; });
  if (!exe_) throw pjrt::Error(error_, code_);
  return exe_;
}

bool PendingCompile::compiled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return compiled_;
}

double PendingCompile::seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return seconds_;
}

void PendingCompile::Finish(pjrt::ExecutablePtr exe, bool compiled, double seconds) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    exe_ = std::move(exe);
    compiled_ = compiled;
    seconds_ = seconds;
    done_ = true;
  }
  cv_.notify_all();
}

void PendingCompile::Fail(const std::string& message, int code) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = message.empty() ? "compile failed" : message;
    code_ = code;
    done_ = true;
  }
  cv_.notify_all();
}

int CompileThreads() {
  static const int n = [] {
    const char* v = std::getenv("TORCH_TPU_COMPILE_THREADS");
    if (!v || !*v) return 2;
    char* end = nullptr;
    long parsed = std::strtol(v, &end, 10);
    if (*end != '\0' || parsed < 0 || parsed > 256)
      throw std::invalid_argument(std::string("TORCH_TPU_COMPILE_THREADS='") + v +
                                  "': expected a number of threads from 0 to 256");
    return static_cast<int>(parsed);
  }();
  return n;
}

namespace {

// The threads and their tasks. Leaked: threads may still run at exit.
struct Pool {
  std::mutex mu;
  std::condition_variable wake;
  std::deque<std::function<void()>> tasks;
  std::vector<std::thread> threads;
  bool forked_child = false;
};

Pool& ThePool() {
  static auto* p = new Pool();
  return *p;
}

void Worker(Pool* p) {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(p->mu);
      p->wake.wait(lock, [p] { return !p->tasks.empty(); });
      task = std::move(p->tasks.front());
      p->tasks.pop_front();
    }
    task();  // tasks report their own errors (PendingCompile::Fail)
  }
}

// fork(): the pool's mutex is held across it, so the child never inherits it
// locked; the child has none of the threads, so it keeps none of the tasks.
void AtForkPrepare() { ThePool().mu.lock(); }
void AtForkParent() { ThePool().mu.unlock(); }
void AtForkChild() {
  Pool& p = ThePool();
  new std::vector<std::thread>(std::move(p.threads));  // handles of threads not here: leaked
  p.threads.clear();
  new std::deque<std::function<void()>>(std::move(p.tasks));  // abandoned, not destroyed
  p.tasks.clear();
  p.forked_child = true;
  p.mu.unlock();
}

}  // namespace

void SubmitCompile(std::function<void()> task) {
  Pool& p = ThePool();
  {
    std::lock_guard<std::mutex> lock(p.mu);
    if (p.forked_child) throw pjrt::Error("compile pool: unusable in a forked child process");
    if (p.threads.empty()) {
      static bool registered = (pthread_atfork(AtForkPrepare, AtForkParent, AtForkChild), true);
      (void)registered;
      for (int i = 0; i < std::max(CompileThreads(), 1); ++i) p.threads.emplace_back(Worker, &p);
    }
    p.tasks.push_back(std::move(task));
  }
  p.wake.notify_one();
}

}  // namespace torch_tpu::runtime
