#include "runtime/compile_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace torch_tpu::runtime {
namespace {

TEST(PendingCompile, FailureIsKeptForWait) {
  PendingCompile p;
  EXPECT_FALSE(p.done());
  p.Fail("boom (module saved to /tmp/x.mlir)", 3);
  EXPECT_TRUE(p.done());
  EXPECT_TRUE(p.failed());
  try {
    p.Wait();
    FAIL() << "Wait() returned";
  } catch (const pjrt::Error& e) {
    EXPECT_EQ(std::string(e.what()), "boom (module saved to /tmp/x.mlir)");
    EXPECT_EQ(e.code(), 3);
  }
}

TEST(PendingCompile, ReadyHoldsItsExecutableAndIsNotACompile) {
  auto p = PendingCompile::Ready(nullptr);
  EXPECT_TRUE(p->done());
  EXPECT_FALSE(p->compiled());
  // A null executable reads as a failure with a message, never a crash.
  EXPECT_TRUE(p->failed());
  EXPECT_THROW(p->Wait(), pjrt::Error);
}

// The caller goes on while a task runs; Wait() returns when the task ends.
TEST(CompilePool, TasksRunWhileTheCallerGoesOn) {
  auto p = std::make_shared<PendingCompile>();
  std::atomic<bool> release{false};
  SubmitCompile([p, &release] {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    p->Fail("done", 0);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(p->done());  // the task is blocked, the caller is not
  release = true;
  EXPECT_THROW(p->Wait(), pjrt::Error);
  EXPECT_TRUE(p->done());
}

TEST(CompilePool, ManyTasksAllRun) {
  std::atomic<int> ran{0};
  std::vector<std::shared_ptr<PendingCompile>> all;
  for (int i = 0; i < 50; ++i) {
    auto p = std::make_shared<PendingCompile>();
    all.push_back(p);
    SubmitCompile([p, &ran] {
      ++ran;
      p->Fail("x", 0);
    });
  }
  for (auto& p : all) EXPECT_THROW(p->Wait(), pjrt::Error);
  EXPECT_EQ(ran.load(), 50);
}

}  // namespace
}  // namespace torch_tpu::runtime
