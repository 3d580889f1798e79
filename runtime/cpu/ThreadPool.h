//===- ThreadPool.h - Deterministic parallel loops for CPU kernels -*- C++ -*-===//
//
// A fixed set of worker threads for intra-op parallelism. parallelFor splits
// [0, n) into contiguous chunks by a rule that depends only on n, the grain
// and the thread count (never on timing), so a kernel that reduces within a
// chunk gives the same bits on every run with the same thread count.
//
// Which thread runs a chunk does depend on timing: the caller and the
// workers claim chunks one at a time from a shared counter, and the caller
// runs every chunk no worker has claimed yet. A worker that is asleep, or
// not scheduled because other processes hold the cores, therefore never
// delays the caller; it costs at most the chunk it claimed (forEach: one
// piece). Nested calls, and calls while another thread's loop is running,
// run inline.
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
  /// them: exactly the chunks chunks(n, grain, threads()) lists. Returns
  /// when every chunk is done.
  void parallelFor(int64_t n, int64_t grain,
                   const std::function<void(int64_t, int64_t)> &body);

  /// Calls body(i) once for every i in [0, n): independent pieces, run in
  /// any order by the caller and at most threads - 1 workers (threads <= 1:
  /// all on the caller). Pieces are claimed one at a time, so a worker that
  /// wakes late holds the caller up by one piece at most.
  void forEach(int64_t n, int threads, const std::function<void(int64_t)> &body);

  /// The chunks parallelFor would use (exposed for tests and kernels that
  /// keep per-chunk partial results).
  static std::vector<std::pair<int64_t, int64_t>> chunks(int64_t n, int64_t grain,
                                                         int threads);

  /// Chunks (forEach: pieces) of the last loop that its calling thread ran
  /// itself (tests and measurements; timing-dependent unless the loop ran
  /// inline).
  int64_t lastCallerChunks() const { return lastCallerChunks_.load(std::memory_order_relaxed); }

private:
  void workerLoop();
  /// Runs work_ (already filled) with body_ on the caller and at most
  /// `helpers` workers; returns the chunks the caller ran.
  int64_t run(int helpers);
  /// Claims and runs chunks of the loop `generation` until none is left;
  /// returns how many this thread ran. A worker (not the caller) that
  /// finishes the loop's last chunk wakes the caller.
  int64_t drain(uint32_t generation, bool caller);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t, int64_t)> *body_ = nullptr;
  std::vector<std::pair<int64_t, int64_t>> work_;
  /// The current loop: generation (high 32 bits), chunk count (next 16)
  /// and the next unclaimed chunk (low 16). A claim is a compare-and-swap that keeps the
  /// generation, so a late worker can never claim a chunk of a newer loop
  /// or read work_ while the caller rewrites it.
  std::atomic<uint64_t> state_{0};
  std::atomic<int> pending_{0}; ///< chunks not finished
  /// Workers still allowed to join the loop: generation (high 32 bits),
  /// count (low 32).
  std::atomic<uint64_t> helpers_{0};
  std::atomic<bool> busy_{false};
  std::atomic<bool> stopping_{false};
  int sleepers_ = 0; ///< workers blocked on wake_ (guarded by mu_)
  std::atomic<int64_t> lastCallerChunks_{0};
};

} // namespace kiln::cpu

#endif // KILN_RUNTIME_CPU_THREADPOOL_H
