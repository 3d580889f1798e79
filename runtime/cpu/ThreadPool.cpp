//===- ThreadPool.cpp - Deterministic parallel loops for CPU kernels ------===//
#include "runtime/cpu/ThreadPool.h"
#include "runtime/core/Spin.h"

#include <algorithm>
#include <cstdlib>

namespace kiln::cpu {

namespace {
constexpr int kIndexBits = 16; ///< next chunk (low bits), chunk count (next 16)
constexpr uint64_t kIndexMask = (uint64_t(1) << kIndexBits) - 1;
constexpr int64_t kMaxChunks = int64_t(kIndexMask); ///< threads() is capped by it

uint32_t generationOf(uint64_t s) { return uint32_t(s >> 32); }

int spinMicros() {
  static int us = std::getenv("KILN_SPIN_US") ? std::atoi(std::getenv("KILN_SPIN_US")) : 200;
  return us;
}
/// Spins up to spinMicros() for `ready` before the caller blocks
/// (runtime/core/Spin.h).
template <typename Ready> bool spinUntil(Ready ready) {
  return kiln::spinUntil(ready, spinMicros());
}
} // namespace

ThreadPool::ThreadPool(int threads) {
  int n = int(std::min<int64_t>(std::max(1, threads), kMaxChunks));
  for (int i = 1; i < n; ++i)
    workers_.emplace_back([this] { workerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
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

int64_t ThreadPool::drain(uint32_t generation, bool caller) {
  int64_t ran = 0;
  uint64_t s = state_.load(std::memory_order_acquire);
  while (generationOf(s) == generation) {
    uint64_t next = s & kIndexMask, count = (s >> kIndexBits) & kIndexMask;
    if (next >= count)
      break;
    if (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel,
                                      std::memory_order_acquire))
      continue;
    // Claimed: work_ and body_ stay as they are until pending_ reaches 0.
    auto [b, e] = work_[size_t(next)];
    (*body_)(b, e);
    ++ran;
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1 && !caller) {
      std::lock_guard<std::mutex> lock(mu_);
      done_.notify_all();
    }
    s = state_.load(std::memory_order_acquire);
  }
  return ran;
}

void ThreadPool::parallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)> &body) {
  std::vector<std::pair<int64_t, int64_t>> parts = chunks(n, grain, threads());
  if (parts.empty())
    return;
  // One chunk, no workers, nested, or another thread's loop running: inline.
  if (parts.size() == 1 || workers_.empty() || busy_.exchange(true, std::memory_order_acquire)) {
    for (auto [b, e] : parts)
      body(b, e);
    lastCallerChunks_.store(int64_t(parts.size()), std::memory_order_relaxed);
    return;
  }
  // Every claim of the previous loop has finished (pending_ was 0), so no
  // worker reads these now.
  work_ = std::move(parts);
  body_ = &body;
  lastCallerChunks_.store(run(int(workers_.size())), std::memory_order_relaxed);
}

void ThreadPool::forEach(int64_t n, int threads,
                         const std::function<void(int64_t)> &body) {
  if (n <= 0)
    return;
  int helpers = int(std::min<int64_t>({int64_t(threads) - 1, int64_t(workers_.size()), n - 1}));
  if (helpers <= 0 || n > kMaxChunks || busy_.exchange(true, std::memory_order_acquire)) {
    for (int64_t i = 0; i < n; ++i)
      body(i);
    lastCallerChunks_.store(n, std::memory_order_relaxed);
    return;
  }
  work_.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i)
    work_[size_t(i)] = {i, i + 1};
  std::function<void(int64_t, int64_t)> each = [&](int64_t b, int64_t) { body(b); };
  body_ = &each;
  lastCallerChunks_.store(run(helpers), std::memory_order_relaxed);
}

int64_t ThreadPool::run(int helpers) {
  pending_.store(int(work_.size()), std::memory_order_relaxed);
  uint32_t generation;
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation = generationOf(state_.load(std::memory_order_relaxed)) + 1;
    helpers_.store(uint64_t(generation) << 32 | uint64_t(helpers), std::memory_order_relaxed);
    state_.store(uint64_t(generation) << 32 | uint64_t(work_.size()) << kIndexBits,
                 std::memory_order_release);
    wake = sleepers_ > 0;
  }
  if (wake) {
    if (helpers == 1)
      wake_.notify_one();
    else
      wake_.notify_all();
  }
  int64_t mine = drain(generation, /*caller=*/true);
  // Only chunks a worker claimed (and is running) are left.
  if (!spinUntil([&] { return pending_.load(std::memory_order_acquire) == 0; })) {
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return pending_.load(std::memory_order_acquire) == 0; });
  }
  body_ = nullptr;
  busy_.store(false, std::memory_order_release);
  return mine;
}

void ThreadPool::workerLoop() {
  uint32_t seen = 0;
  auto ready = [&] {
    return stopping_.load(std::memory_order_relaxed) ||
           generationOf(state_.load(std::memory_order_acquire)) != seen;
  };
  while (true) {
    if (!spinUntil(ready)) {
      std::unique_lock<std::mutex> lock(mu_);
      ++sleepers_;
      wake_.wait(lock, ready);
      --sleepers_;
    }
    if (stopping_.load(std::memory_order_relaxed))
      return;
    seen = generationOf(state_.load(std::memory_order_acquire));
    // A loop for fewer threads than the pool has: the first ones to arrive
    // take part, the others wait for the next loop.
    uint64_t h = helpers_.load(std::memory_order_acquire);
    while (generationOf(h) == seen && (h & 0xffffffffu) > 0)
      if (helpers_.compare_exchange_weak(h, h - 1, std::memory_order_acq_rel,
                                         std::memory_order_acquire)) {
        drain(seen, /*caller=*/false);
        break;
      }
  }
}

} // namespace kiln::cpu
