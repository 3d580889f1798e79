//===- ThreadPool.h - Deterministic parallel loops for CPU kernels -*- C++ -*-===//
//
// A fixed set of worker threads for intra-op parallelism. parallelFor splits
// [0, n) into contiguous chunks by a rule that depends only on n, the grain
// and the thread count (never on timing), so a kernel that reduces within a
// chunk gives the same bits on every run with the same thread count.
// The calling thread works too; nested calls run inline.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CPU_THREADPOOL_H
#define KILN_RUNTIME_CPU_THREADPOOL_H

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln::cpu {

class ThreadPool {
public:
  /// `threads` >= 1 (the caller counts as one of them).
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool &) = delete;
  ThreadPool &operator=(const ThreadPool &) = delete;

  int threads() const { return int(workers_.size()) + 1; }

  /// Calls body(begin, end) over disjoint chunks covering [0, n), each at
  /// least `grain` long (except a shorter last one), at most threads() of
  /// them. Returns when every chunk is done.
  void parallelFor(int64_t n, int64_t grain,
                   const std::function<void(int64_t, int64_t)> &body);

  /// The chunks parallelFor would use (exposed for tests and kernels that
  /// keep per-chunk partial results).
  static std::vector<std::pair<int64_t, int64_t>> chunks(int64_t n, int64_t grain,
                                                         int threads);

private:
  void workerLoop(int index);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t, int64_t)> *body_ = nullptr;
  std::vector<std::pair<int64_t, int64_t>> work_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stopping_{false};
  int sleepers_ = 0; ///< workers blocked on wake_ (guarded by mu_)
  bool stop_ = false;
  bool busy_ = false;
};

} // namespace kiln::cpu

#endif // KILN_RUNTIME_CPU_THREADPOOL_H
