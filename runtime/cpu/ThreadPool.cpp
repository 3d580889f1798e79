//===- ThreadPool.cpp - Deterministic parallel loops for CPU kernels ------===//
#include "runtime/cpu/ThreadPool.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

namespace kiln::cpu {

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < std::max(1, threads); ++i)
    workers_.emplace_back([this, i] { workerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread &t : workers_)
    t.join();
}

std::vector<std::pair<int64_t, int64_t>>
ThreadPool::chunks(int64_t n, int64_t grain, int threads) {
  std::vector<std::pair<int64_t, int64_t>> out;
  if (n <= 0)
    return out;
  grain = std::max<int64_t>(1, grain);
  int64_t parts = std::min<int64_t>(threads, (n + grain - 1) / grain);
  parts = std::max<int64_t>(1, parts);
  int64_t base = n / parts, extra = n % parts, begin = 0;
  for (int64_t p = 0; p < parts; ++p) {
    int64_t len = base + (p < extra ? 1 : 0);
    out.push_back({begin, begin + len});
    begin += len;
  }
  return out;
}

namespace {
int spinMicros() {
  static int us = std::getenv("KILN_SPIN_US") ? std::atoi(std::getenv("KILN_SPIN_US")) : 200;
  return us;
}
/// Spins up to ~200 us for `ready` before the caller blocks: kernels are
/// often tens of microseconds long, far shorter than a futex sleep/wake.
template <typename Ready> bool spinUntil(Ready ready) {
  auto start = std::chrono::steady_clock::now();
  for (int i = 0;; ++i) {
    if (ready())
      return true;
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
    if ((i & 63) == 63 &&
        std::chrono::steady_clock::now() - start > std::chrono::microseconds(spinMicros()))
      return false;
  }
}
} // namespace

void ThreadPool::parallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)> &body) {
  std::vector<std::pair<int64_t, int64_t>> parts = chunks(n, grain, threads());
  if (parts.empty())
    return;
  std::unique_lock<std::mutex> lock(mu_);
  if (parts.size() == 1 || busy_) { // one chunk, or nested: run inline
    lock.unlock();
    for (auto [b, e] : parts)
      body(b, e);
    return;
  }
  busy_ = true;
  body_ = &body;
  work_ = parts;
  pending_.store(int(parts.size()) - 1); // chunk 0 is the caller's
  generation_.fetch_add(1, std::memory_order_release);
  bool wake = sleepers_ > 0;
  lock.unlock();
  if (wake)
    wake_.notify_all();
  body(parts[0].first, parts[0].second);
  if (!spinUntil([&] { return pending_.load(std::memory_order_acquire) == 0; })) {
    lock.lock();
    done_.wait(lock, [&] { return pending_.load() == 0; });
    lock.unlock();
  }
  lock.lock();
  busy_ = false;
  body_ = nullptr;
}

void ThreadPool::workerLoop(int index) {
  uint64_t seen = 0;
  while (true) {
    std::pair<int64_t, int64_t> chunk;
    const std::function<void(int64_t, int64_t)> *body;
    spinUntil([&] {
      return stopping_.load(std::memory_order_relaxed) ||
             generation_.load(std::memory_order_acquire) != seen;
    });
    {
      std::unique_lock<std::mutex> lock(mu_);
      ++sleepers_;
      wake_.wait(lock, [&] { return stop_ || generation_.load() != seen; });
      --sleepers_;
      if (stop_)
        return;
      seen = generation_.load();
      if (size_t(index) >= work_.size())
        continue; // fewer chunks than threads this time
      chunk = work_[size_t(index)];
      body = body_;
    }
    (*body)(chunk.first, chunk.second);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mu_);
      done_.notify_all();
    }
  }
}

} // namespace kiln::cpu
