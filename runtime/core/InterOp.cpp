//===- InterOp.cpp - Threads that run a step's independent plan steps ------===//
#include "runtime/core/InterOp.h"
#include "runtime/core/Spin.h"

#include <algorithm>

namespace kiln {

bool InterOpPool::spinUntil(const std::function<bool()> &ready, int micros) {
  return kiln::spinUntil(ready, micros);
}

InterOpPool::InterOpPool(int threads) {
  for (int i = 1; i < std::max(threads, 1); ++i)
    workers_.emplace_back([this, i] { workerLoop(i); });
}

InterOpPool::~InterOpPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread &t : workers_)
    t.join();
}

void InterOpPool::run(const std::function<void(int)> &body) {
  if (workers_.empty()) {
    body(0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    body_ = &body;
    active_ = int(workers_.size());
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  body(0);
  std::unique_lock<std::mutex> lock(mu_);
  // The workers' bodies return once the work they share is done (or has
  // failed): waiting for them is waiting for steps already running.
  done_.wait(lock, [&] { return active_ == 0; });
  body_ = nullptr;
}

void InterOpPool::workerLoop(int index) {
  uint64_t seen = 0;
  while (true) {
    // A run starts right after the previous one, step after step: spin a
    // little before sleeping.
    spinUntil([&] { return generation_.load(std::memory_order_acquire) != seen; }, 100);
    const std::function<void(int)> *body;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] {
        return stopping_ || generation_.load(std::memory_order_relaxed) != seen;
      });
      if (stopping_)
        return;
      seen = generation_.load(std::memory_order_relaxed);
      body = body_;
    }
    (*body)(index);
    std::lock_guard<std::mutex> lock(mu_);
    if (--active_ == 0)
      done_.notify_all();
  }
}

} // namespace kiln
