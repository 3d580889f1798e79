//===- InterOp.h - Threads that run a step's independent plan steps -*- C++ -*-===//
//
// TensorFlow's inter-op parallelism for Kiln: a backend that owns an
// InterOpPool of N threads (StepHooks::interOp()) has the step loop run
// the plan steps of a function as the DAG their dependencies (Step::deps)
// describe, several at once, instead of one after another
// (runtime/core/StepLoop.h, docs/runtime.md "Inter-op threads").
//
// The pool itself only runs one body on N threads at once: the calling
// thread is thread 0, and N - 1 workers, started once, are threads
// 1 .. N-1. run() returns when every thread's body has returned, so nothing
// the body uses is touched after it. Idle workers spin briefly (a step is
// often tens of microseconds long, shorter than a futex sleep and wake),
// then sleep until the next run.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CORE_INTEROP_H
#define KILN_RUNTIME_CORE_INTEROP_H

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln {

class InterOpPool {
public:
  /// `threads` >= 1 (the caller of run() counts as one of them).
  explicit InterOpPool(int threads);
  ~InterOpPool();
  InterOpPool(const InterOpPool &) = delete;
  InterOpPool &operator=(const InterOpPool &) = delete;

  int threads() const { return int(workers_.size()) + 1; }

  /// Calls body(t) on every thread t in [0, threads()) at once (t = 0 on
  /// the caller) and returns when all of them have returned. Not
  /// reentrant: one run at a time.
  void run(const std::function<void(int)> &body);

  /// Spins up to `micros` microseconds (yielding the core now and then)
  /// until ready() holds; false if it did not. For the schedulers that
  /// hand steps to the pool's threads.
  static bool spinUntil(const std::function<bool()> &ready, int micros);

private:
  void workerLoop(int index);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int)> *body_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  int active_ = 0; ///< workers still in the current body (guarded by mu_)
  bool stopping_ = false;
};

} // namespace kiln

#endif // KILN_RUNTIME_CORE_INTEROP_H
