// Background compilation: a small pool of threads that compile modules while
// the dispatching thread goes on (TORCH_TPU_COMPILE_THREADS, default 2; 0:
// every compile runs on the dispatching thread, as before). A compile's
// outcome is a PendingCompile: the executable, or the error that the next
// sync point raises (launch_queue.h).
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "pjrt/pjrt.h"

namespace torch_tpu::runtime {

// The outcome of one compile, set once by the thread that ran it.
class PendingCompile {
 public:
  // An already known executable (a cache hit).
  static std::shared_ptr<PendingCompile> Ready(pjrt::ExecutablePtr exe);

  bool done() const;
  // Done and failed (its error is kept for Wait()).
  bool failed() const;
  // Blocks until done; the executable, or throws pjrt::Error (the message
  // names the module's failure and where the module was saved).
  pjrt::ExecutablePtr Wait() const;
  // Whether XLA compiled it (false: cache or disk hit), and how long it took.
  bool compiled() const;
  double seconds() const;

  void Finish(pjrt::ExecutablePtr exe, bool compiled, double seconds);
  void Fail(const std::string& message, int code);

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  pjrt::ExecutablePtr exe_;
  bool compiled_ = false;
  double seconds_ = 0;
  std::string error_;
  int code_ = 0;
};

// TORCH_TPU_COMPILE_THREADS: how many compile threads (read once). Not a
// number, or negative: a std::invalid_argument naming the variable.
int CompileThreads();

// Runs `task` on one of CompileThreads() threads, started on first use (a
// process that never compiles in the background starts none). In a forked
// child the threads are gone: tasks are refused (pjrt::Error).
void SubmitCompile(std::function<void()> task);

}  // namespace torch_tpu::runtime
