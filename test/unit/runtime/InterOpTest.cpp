//===- InterOpTest.cpp - The step loop's DAG run on inter-op threads -------===//
//
// The scheduler behind --inter-op-threads with fake hooks (no kernels, no
// arena): each plan step is a kernel step whose kernel id is its index, so
// the hooks know which step they run. Concurrency is proved with barriers
// that fail after a deadline (never with timing): two steps that may run at
// once must both reach the barrier. Ordering is checked on a global
// sequence counter (a step's start after each dependency's end) under
// random delays.
//
//===----------------------------------------------------------------------===//
#include "runtime/core/InterOp.h"
#include "runtime/core/Program.h"
#include "runtime/core/StepLoop.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <random>
#include <map>
#include <set>
#include <thread>

namespace {

using namespace kiln;
using namespace kiln::program;

/// `n` kernel steps (step i calls kernel i) with the given dependencies.
struct Plan {
  Program p;
  Function f;
  Plan(size_t n, const std::vector<std::vector<int>> &deps) {
    f.name = "train_step";
    for (size_t i = 0; i < n; ++i) {
      Kernel k;
      k.symbol = "k" + std::to_string(i);
      p.kernels.push_back(k);
      Step s;
      s.kind = Step::Kernel;
      s.kernel = int(i);
      if (i < deps.size())
        s.deps = deps[i];
      f.steps.push_back(s);
    }
  }
};

/// Waits until `parties` threads have arrived, or fails after 20 s (the
/// steps that should meet here were not run at once).
class Barrier {
public:
  explicit Barrier(int parties) : parties_(parties) {}
  bool arriveAndWait() {
    std::unique_lock<std::mutex> lock(mu_);
    if (++arrived_ == parties_)
      cv_.notify_all();
    return cv_.wait_for(lock, std::chrono::seconds(20), [&] { return arrived_ >= parties_; });
  }

private:
  std::mutex mu_;
  std::condition_variable cv_;
  int parties_, arrived_ = 0;
};

/// Records, per step, the sequence numbers of its start and end, and how
/// many steps ran at once; `action` runs inside each step.
class FakeHooks : public StepHooks {
public:
  FakeHooks(size_t n, int threads) : start(n, -1), end(n, -1) {
    if (threads > 1)
      pool = std::make_unique<InterOpPool>(threads);
  }
  std::function<Status(int)> action;
  std::vector<int64_t> start, end;
  std::atomic<int64_t> seq{0};
  std::atomic<int> running{0}, mostAtOnce{0}, calls{0};
  std::unique_ptr<InterOpPool> pool;
  std::set<std::thread::id> threadIds;
  std::mutex mu;

  Status runKernel(int kernel, const std::vector<int> &) override {
    calls++;
    start[size_t(kernel)] = seq++;
    int now = ++running;
    int most = mostAtOnce.load();
    while (now > most && !mostAtOnce.compare_exchange_weak(most, now)) {
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      threadIds.insert(std::this_thread::get_id());
    }
    Status r = action ? action(kernel) : Status::ok();
    --running;
    end[size_t(kernel)] = seq++;
    return r;
  }
  Status runGemm(const Step &, bool) override { return Status::ok(); }
  Status runCopy(const Step &) override { return Status::ok(); }
  const char *gemmName() const override { return "gemm"; }
  Status beginTimed() override { return Status::ok(); }
  Expected<double> endTimed() override { return 0.0; }
  InterOpPool *interOp() override { return pool.get(); }
};

/// Every dependency ended before its dependent started.
void expectOrdered(const Function &f, const FakeHooks &h) {
  for (size_t i = 0; i < f.steps.size(); ++i) {
    ASSERT_GE(h.start[i], 0) << "step " << i << " did not run";
    for (int d : f.steps[i].deps)
      EXPECT_LT(h.end[size_t(d)], h.start[i]) << "step " << i << " started before step " << d
                                               << " ended";
  }
}

TEST(InterOpPool, RunsTheBodyOnEveryThreadAtOnce) {
  InterOpPool pool(4);
  EXPECT_EQ(pool.threads(), 4);
  for (int round = 0; round < 3; ++round) {
    Barrier b(4);
    std::atomic<int> met{0}, mask{0};
    pool.run([&](int t) {
      mask |= 1 << t;
      met += b.arriveAndWait();
    });
    EXPECT_EQ(met.load(), 4);
    EXPECT_EQ(mask.load(), 0xf);
  }
}

TEST(InterOp, AChainRunsInOrderOneAtATime) {
  std::vector<std::vector<int>> deps(12);
  for (int i = 1; i < 12; ++i)
    deps[size_t(i)] = {i - 1};
  Plan plan(12, deps);
  FakeHooks h(12, 4);
  // Long enough that a second thread, if one were wrongly let in, overlaps.
  h.action = [](int) {
    std::this_thread::sleep_for(std::chrono::microseconds(300));
    return Status::ok();
  };
  ASSERT_TRUE(runSteps(plan.p, plan.f, 0, 12, h, nullptr));
  expectOrdered(plan.f, h);
  EXPECT_EQ(h.mostAtOnce.load(), 1);
  for (size_t i = 0; i < 12; ++i)
    EXPECT_EQ(h.start[i], int64_t(2 * i));
}

TEST(InterOp, TheTwoSidesOfADiamondRunAtOnce) {
  // 0 -> {1, 2} -> 3: with two threads, 1 and 2 meet at a barrier (with one
  // thread they could not: the barrier would time out and the step fail).
  Plan plan(4, {{}, {0}, {0}, {1, 2}});
  FakeHooks h(4, 2);
  Barrier b(2);
  h.action = [&](int k) {
    if ((k == 1 || k == 2) && !b.arriveAndWait())
      return Status::error("steps 1 and 2 did not run at once");
    return Status::ok();
  };
  Status r = runSteps(plan.p, plan.f, 0, 4, h, nullptr);
  ASSERT_TRUE(r) << r.message();
  expectOrdered(plan.f, h);
  EXPECT_EQ(h.mostAtOnce.load(), 2);
}

TEST(InterOp, IndependentStepsRunOnEveryThread) {
  Plan plan(4, {});
  FakeHooks h(4, 4);
  Barrier b(4);
  h.action = [&](int) {
    return b.arriveAndWait() ? Status::ok() : Status::error("the four steps did not meet");
  };
  Status r = runSteps(plan.p, plan.f, 0, 4, h, nullptr);
  ASSERT_TRUE(r) << r.message();
  EXPECT_EQ(h.threadIds.size(), 4u);
}

TEST(InterOp, OneThreadIsTheInOrderLoop) {
  Plan plan(6, {});
  FakeHooks h(6, 1);
  ASSERT_TRUE(runSteps(plan.p, plan.f, 0, 6, h, nullptr));
  for (size_t i = 0; i < 6; ++i)
    EXPECT_EQ(h.start[i], int64_t(2 * i));
}

TEST(InterOp, DependenciesHoldUnderRandomDelays) {
  for (int threads : {2, 3, 4})
    for (unsigned seed = 1; seed <= 4; ++seed) {
      std::mt19937 rng(seed * 7919 + unsigned(threads));
      size_t n = 150;
      std::vector<std::vector<int>> deps(n);
      for (size_t i = 1; i < n; ++i) {
        int k = int(rng() % 3);
        for (int j = 0; j < k; ++j)
          deps[i].push_back(int(rng() % i));
        std::sort(deps[i].begin(), deps[i].end());
        deps[i].erase(std::unique(deps[i].begin(), deps[i].end()), deps[i].end());
      }
      Plan plan(n, deps);
      FakeHooks h(n, threads);
      std::vector<int> delay(n);
      for (int &d : delay)
        d = int(rng() % 200);
      h.action = [&](int k) {
        std::this_thread::sleep_for(std::chrono::microseconds(delay[size_t(k)]));
        return Status::ok();
      };
      ASSERT_TRUE(runSteps(plan.p, plan.f, 0, n, h, nullptr));
      expectOrdered(plan.f, h);
      EXPECT_EQ(h.calls.load(), int(n));
    }
}

TEST(InterOp, ARangeRunsOnlyItsSteps) {
  // As gradient accumulation runs parts of a function: the dependencies
  // before `begin` are taken as met.
  Plan plan(8, {{}, {0}, {1}, {2}, {}, {4}, {5}, {3, 6}});
  FakeHooks h(8, 2);
  ASSERT_TRUE(runSteps(plan.p, plan.f, 3, 7, h, nullptr));
  for (size_t i = 0; i < 8; ++i)
    EXPECT_EQ(h.start[i] >= 0, i >= 3 && i < 7) << "step " << i;
}

TEST(InterOp, AnErrorStopsTheRunAfterWhatIsRunning) {
  // Step 2 fails while step 1 (independent of it) is running: the run
  // returns step 2's error once step 1 has finished; nothing that depends
  // on step 2 starts.
  Plan plan(6, {{}, {0}, {0}, {2}, {1, 2}, {}});
  for (int threads : {2, 4}) {
    FakeHooks h(6, threads);
    std::atomic<bool> failed{false};
    h.action = [&](int k) {
      if (k == 1) {
        // Runs until step 2 has failed (no timing: a flag, with a deadline).
        auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (!failed && std::chrono::steady_clock::now() < until)
          std::this_thread::yield();
      }
      if (k == 2) {
        failed = true;
        return Status::error("step 2 failed on purpose");
      }
      return Status::ok();
    };
    Status r = runSteps(plan.p, plan.f, 0, 6, h, nullptr);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.message(), "step 2 failed on purpose");
    EXPECT_EQ(h.running.load(), 0);
    EXPECT_GE(h.end[1], 0) << "step 1 was still running when the run returned";
    EXPECT_EQ(h.start[3], -1);
    EXPECT_EQ(h.start[4], -1);
    // Step 5 is independent: it may have run (around the failure), but
    // whatever started has ended.
    for (size_t i = 0; i < 6; ++i)
      EXPECT_EQ(h.start[i] >= 0, h.end[i] >= 0) << "step " << i;
  }
}

/// Collectives on queue 1 through startAsync/waitAsync (a backend with a
/// communication queue): they start in schedule order whatever the
/// threads do, and a queue-0 step that needs one waits for it first.
class AsyncHooks : public FakeHooks {
public:
  using FakeHooks::FakeHooks;
  std::vector<size_t> startOrder;
  std::vector<int64_t> waited;
  bool concurrentQueues() const override { return true; }
  Status startAsync(const Function &, const Step &, size_t index) override {
    std::lock_guard<std::mutex> lock(mu);
    startOrder.push_back(index);
    return Status::ok();
  }
  Status waitAsync(size_t index, double &seconds) override {
    seconds = 0;
    waited[index] = seq++;
    return Status::ok();
  }
};

TEST(InterOp, CollectivesStartInScheduleOrder) {
  // Producers 0, 2, 4, 6 (queue 0) each feed a collective 1, 3, 5, 7
  // (queue 1); step 8 needs every collective. The producers run in any
  // order (reverse delays), the collectives start as 1, 3, 5, 7.
  std::vector<std::vector<int>> deps = {{}, {0}, {}, {2}, {}, {4}, {}, {6}, {1, 3, 5, 7}};
  for (int threads : {2, 4}) {
    Plan plan(9, deps);
    for (int c : {1, 3, 5, 7}) {
      Step &s = plan.f.steps[size_t(c)];
      s.kind = Step::Collective;
      s.queue = 1;
      s.args = {0, 0};
    }
    plan.p.queues = 2;
    AsyncHooks h(9, threads);
    h.waited.assign(9, -1);
    h.action = [&](int k) {
      std::this_thread::sleep_for(std::chrono::microseconds(400 - 50 * k));
      return Status::ok();
    };
    Status r = runSteps(plan.p, plan.f, 0, 9, h, nullptr);
    ASSERT_TRUE(r) << r.message();
    EXPECT_EQ(h.startOrder, (std::vector<size_t>{1, 3, 5, 7}));
    for (int c : {1, 3, 5, 7})
      EXPECT_LT(h.waited[size_t(c)], h.start[8]) << "collective " << c;
  }
}

} // namespace

namespace {

/// Collectives on queue 0 (run by the thread that takes them): in schedule
/// order, each succeeding.
class SyncCollectiveHooks : public FakeHooks {
public:
  using FakeHooks::FakeHooks;
  std::vector<size_t> order;
  Status runCollective(const Step &s) override {
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(s.args[0]); // the test puts the step index there
    return Status::ok();
  }
};

TEST(InterOp, QueueZeroCollectivesRunInScheduleOrder) {
  // Eight independent collectives and eight independent kernels,
  // interleaved: the kernels may overtake, the collectives keep order.
  std::vector<std::vector<int>> deps(16);
  for (int threads : {2, 4}) {
    Plan plan(16, deps);
    for (size_t i = 0; i < 16; i += 2) {
      Step &s = plan.f.steps[i];
      s.kind = Step::Collective;
      s.args = {int(i), int(i)};
    }
    SyncCollectiveHooks h(16, threads);
    h.action = [](int k) {
      std::this_thread::sleep_for(std::chrono::microseconds(50 * (k % 5)));
      return Status::ok();
    };
    Status r = runSteps(plan.p, plan.f, 0, 16, h, nullptr);
    ASSERT_TRUE(r) << r.message();
    EXPECT_EQ(h.order, (std::vector<size_t>{0, 2, 4, 6, 8, 10, 12, 14}));
    EXPECT_EQ(h.calls.load(), 8);
  }
}

} // namespace

namespace {

/// Random plans whose buffers overlap at random (as liveness reuses
/// scratch memory): both dependency rules must order every pair of steps
/// that conflict on some byte (read-write, write-read, write-write),
/// directly or through other steps: what makes the DAG run safe. The
/// exact rule's direct dependencies are all real conflicts.
TEST(Dependencies, EveryConflictIsOrderedOnRandomPlans) {
  std::mt19937 rng(17);
  for (int round = 0; round < 40; ++round) {
    Program p;
    for (int b = 0; b < 24; ++b) {
      Buffer buf;
      buf.offset = int64_t(rng() % 128) * 4;
      buf.bytes = int64_t(1 + rng() % 32) * 4;
      buf.shape = {buf.bytes / 4};
      p.buffers.push_back(buf);
    }
    Function f;
    f.name = "train_step";
    for (int i = 0; i < 60; ++i) {
      Kernel k;
      k.numArgs = 1 + int(rng() % 4);
      k.numInputs = int(rng() % size_t(k.numArgs));
      for (int w = k.numInputs; w < k.numArgs; ++w)
        k.writes.push_back(w);
      if (k.numInputs > 0 && rng() % 4 == 0)
        k.writes.push_back(0); // an update in place
      p.kernels.push_back(k);
      Step s;
      s.kind = Step::Kernel;
      s.kernel = i;
      for (int a = 0; a < k.numArgs; ++a)
        s.args.push_back(int(rng() % p.buffers.size()));
      f.steps.push_back(s);
    }
    auto overlaps = [&](int a, int b) {
      const Buffer &x = p.buffers[size_t(a)], &y = p.buffers[size_t(b)];
      return x.offset < y.offset + y.bytes && y.offset < x.offset + x.bytes;
    };
    size_t n = f.steps.size();
    std::vector<std::vector<int>> reads(n), writes(n);
    for (size_t i = 0; i < n; ++i)
      stepAccesses(p, f.steps[i], reads[i], writes[i]);
    auto conflict = [&](size_t i, size_t j) {
      for (int a : writes[i])
        for (int b : reads[j])
          if (overlaps(a, b))
            return true;
      for (int a : reads[i])
        for (int b : writes[j])
          if (overlaps(a, b))
            return true;
      for (int a : writes[i])
        for (int b : writes[j])
          if (overlaps(a, b))
            return true;
      return false;
    };
    for (bool exact : {false, true}) {
      Function g = f;
      if (exact)
        exactDependencies(p, g);
      else
        computeDependencies(p, g);
      // reach[j][i]: j waits for i, directly or not.
      std::vector<std::vector<bool>> reach(n, std::vector<bool>(n, false));
      for (size_t j = 0; j < n; ++j)
        for (int d : g.steps[j].deps) {
          ASSERT_LT(size_t(d), j);
          reach[j][size_t(d)] = true;
          for (size_t i = 0; i < n; ++i)
            if (reach[size_t(d)][i])
              reach[j][i] = true;
          if (exact) {
            EXPECT_TRUE(conflict(size_t(d), j))
                << "exact: step " << j << " waits for step " << d << " without a conflict";
          }
        }
      for (size_t j = 0; j < n; ++j)
        for (size_t i = 0; i < j; ++i)
          if (conflict(i, j)) {
            EXPECT_TRUE(reach[j][i]) << (exact ? "exact" : "computeDependencies") << ": step "
                                     << j << " conflicts with step " << i
                                     << " but does not wait for it (round " << round << ")";
          }
    }
  }
}

} // namespace

namespace {

/// Profiled and traced: each span names the inter-op thread that ran it
/// (one trace track per thread), and the profile counts every call once.
TEST(InterOp, SpansNameTheirThread) {
  Plan plan(4, {{}, {0}, {0}, {1, 2}});
  FakeHooks h(4, 2);
  Barrier b(2);
  h.action = [&](int k) {
    if ((k == 1 || k == 2) && !b.arriveAndWait())
      return Status::error("steps 1 and 2 did not run at once");
    return Status::ok();
  };
  Tracer tracer;
  tracer.setEnabled(true);
  StepProfile profile(4);
  profile.tracer = &tracer;
  Status r = runSteps(plan.p, plan.f, 0, 4, h, &profile);
  ASSERT_TRUE(r) << r.message();
  std::vector<Span> spans = tracer.spans();
  ASSERT_EQ(spans.size(), 4u);
  std::map<int, int> threadOf;
  for (const Span &s : spans) {
    EXPECT_GE(s.thread, 0);
    EXPECT_LT(s.thread, 2);
    threadOf[s.planStep] = s.thread;
  }
  EXPECT_NE(threadOf[1], threadOf[2]); // they met at the barrier: two threads
  std::vector<Backend::Timing> t = profile.timings(plan.p);
  ASSERT_EQ(t.size(), 4u);
  for (const Backend::Timing &x : t)
    EXPECT_EQ(x.calls, 1);
}

} // namespace
