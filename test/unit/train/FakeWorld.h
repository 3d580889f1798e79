//===- FakeWorld.h - A test communicator for the trainer --------*- C++ -*-===//
//
// Enough of runtime/comm's contract for the multi-rank trainer's tests:
// all_reduce (sum, mean, max over f32 and i32; member order), all_gather,
// a deadline on every wait naming the ranks that did not arrive and the
// caller's context, and abort(). Groups must be the whole world. The real
// communicators (runtime/comm, part C) have their own tests; this one
// keeps the trainer's tests independent of them.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_TEST_UNIT_TRAIN_FAKEWORLD_H
#define KILN_TEST_UNIT_TRAIN_FAKEWORLD_H

#include "runtime/comm/Communicator.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace kiln::test {

class FakeWorld {
public:
  explicit FakeWorld(int n)
      : n_(n), send_(size_t(n)), arrived_(size_t(n), false) {}

  /// Every rank deposits `send`; once all have, each runs `combine` over all
  /// sends, then waits until all are done (so no buffer goes away early).
  Status exchange(
      int rank, const char *op, const std::string &context, double timeout,
      const void *send,
      const std::function<void(const std::vector<const void *> &)> &combine) {
    std::unique_lock<std::mutex> lock(mu_);
    auto deadline =
        std::chrono::steady_clock::now() +
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double>(timeout));
    // Phase 1: arrive.
    int64_t gen = gen_;
    send_[size_t(rank)] = send;
    arrived_[size_t(rank)] = true;
    if (++count_ == n_) {
      ++gen_;
      cv_.notify_all();
    }
    while (gen_ == gen && !aborted_)
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout &&
          gen_ == gen) {
        std::string missing;
        for (int r = 0; r < n_; ++r)
          if (!arrived_[size_t(r)])
            missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        abortLocked(fmt::format(
            "rank {}: {} timed out after {} s ({}); rank(s) {} did not "
            "arrive",
            rank, op, timeout, context, missing));
        return Status::error(why_);
      }
    if (aborted_)
      return Status::error(
          fmt::format("rank {}: {} ({}) aborted: {}", rank, op, context, why_));
    combine(send_);
    // Phase 2: leave together.
    if (++done_ == n_) {
      count_ = done_ = 0;
      std::fill(arrived_.begin(), arrived_.end(), false);
      ++gen2_;
      cv_.notify_all();
    }
    int64_t g2 = gen2_;
    while (gen2_ == g2 && done_ != 0 && !aborted_)
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout)
        break;
    return aborted_ ? Status::error(why_) : Status::ok();
  }
  void abort(const std::string &why) {
    std::lock_guard<std::mutex> lock(mu_);
    abortLocked(why);
  }
  int size() const { return n_; }

private:
  void abortLocked(const std::string &why) {
    if (!aborted_)
      why_ = why;
    aborted_ = true;
    cv_.notify_all();
  }
  int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<const void *> send_;
  std::vector<bool> arrived_;
  int count_ = 0, done_ = 0;
  int64_t gen_ = 0, gen2_ = 0;
  bool aborted_ = false;
  std::string why_;
};

class FakeComm : public comm::Communicator {
public:
  FakeComm(std::shared_ptr<FakeWorld> w, int rank)
      : w_(std::move(w)), rank_(rank) {}
  static std::vector<std::unique_ptr<comm::Communicator>>
  world(int n, double timeout) {
    auto w = std::make_shared<FakeWorld>(n);
    std::vector<std::unique_ptr<comm::Communicator>> out;
    for (int r = 0; r < n; ++r) {
      out.push_back(std::make_unique<FakeComm>(w, r));
      out.back()->setTimeout(timeout);
    }
    return out;
  }
  int rank() const override { return rank_; }
  int size() const override { return w_->size(); }
  const char *kind() const override { return "in-process"; }

  Status allReduce(const void *send, void *recv, int64_t count,
                   ElementType type, comm::Reduction r,
                   const comm::Group & = {}) override {
    std::vector<char> out(size_t(count) * dtypeBytes(type));
    Status s = w_->exchange(
        rank_, "all_reduce", context(), timeout(), send,
        [&](const std::vector<const void *> &all) {
          for (int64_t e = 0; e < count; ++e) {
            if (type == ElementType::F32) {
              float acc = static_cast<const float *>(all[0])[e];
              for (size_t m = 1; m < all.size(); ++m) {
                float v = static_cast<const float *>(all[m])[e];
                acc = r == comm::Reduction::Max ? std::max(acc, v) : acc + v;
              }
              if (r == comm::Reduction::Mean)
                acc /= float(all.size());
              std::memcpy(out.data() + e * 4, &acc, 4);
            } else {
              int32_t acc = static_cast<const int32_t *>(all[0])[e];
              for (size_t m = 1; m < all.size(); ++m) {
                int32_t v = static_cast<const int32_t *>(all[m])[e];
                acc = r == comm::Reduction::Max ? std::max(acc, v) : acc + v;
              }
              std::memcpy(out.data() + e * 4, &acc, 4);
            }
          }
        });
    if (s)
      std::memcpy(recv, out.data(), out.size());
    return s;
  }
  Status reduceScatter(const void *, void *, int64_t, ElementType,
                       comm::Reduction, const comm::Group & = {}) override {
    return Status::internal("FakeComm: no reduce_scatter");
  }
  Status allGather(const void *send, void *recv, int64_t sendCount,
                   ElementType type, const comm::Group & = {}) override {
    size_t bytes = size_t(sendCount) * dtypeBytes(type);
    std::vector<char> out(bytes * size_t(size()));
    Status s =
        w_->exchange(rank_, "all_gather", context(), timeout(), send,
                     [&](const std::vector<const void *> &all) {
                       for (size_t m = 0; m < all.size(); ++m)
                         std::memcpy(out.data() + m * bytes, all[m], bytes);
                     });
    if (s)
      std::memcpy(recv, out.data(), out.size());
    return s;
  }
  Status broadcast(void *, int64_t, ElementType, int,
                   const comm::Group & = {}) override {
    return Status::internal("FakeComm: no broadcast");
  }
  Status send(const void *, int64_t, ElementType, int) override {
    return Status::internal("FakeComm: no send");
  }
  Status recv(void *, int64_t, ElementType, int) override {
    return Status::internal("FakeComm: no recv");
  }
  void abort(const std::string &why) override { w_->abort(why); }

private:
  std::shared_ptr<FakeWorld> w_;
  int rank_;
};

} // namespace kiln::test

#endif // KILN_TEST_UNIT_TRAIN_FAKEWORLD_H
