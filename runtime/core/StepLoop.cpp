//===- StepLoop.cpp - One loop over a function's steps --------------------===//
#include "runtime/core/StepLoop.h"

#include "runtime/core/InterOp.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <queue>

#include <fmt/format.h>

namespace kiln {

Status StepHooks::runAttention(const program::Step &s) {
  return Status::error(fmt::format(
      "this backend has no fused attention kernel for the plan's {} step ({}); compile "
      "the model with kilnc --attention=unfused",
      program::attentionLabel(s.attention), s.loc.empty() ? "?" : s.loc));
}

Status StepHooks::runCollective(const program::Step &s) {
  return Status::error(fmt::format(
      "this backend has no communicator: the plan's {} step exchanges data between "
      "devices; run it on a backend with a communicator",
      program::collectiveOpName(s.collective.op)));
}

Status StepHooks::startAsync(const program::Function &f, const program::Step &, size_t index) {
  return Status::internal(fmt::format("@{} step {}: this backend runs no queue concurrently "
                                      "with queue 0",
                                      f.name, index));
}

Status StepHooks::waitAsync(size_t index, double &) {
  return Status::internal(fmt::format("step {} was not started asynchronously", index));
}

void StepProfile::addCollective(const program::Step &s, double seconds) {
  Acc &a = collectives_[program::collectiveOpName(s.collective.op)];
  a.seconds += seconds;
  a.calls++;
}

void StepProfile::addCollectiveWait(const program::Step &s, double seconds) {
  Acc &a = waits_[program::collectiveOpName(s.collective.op)];
  a.seconds += seconds;
  a.calls++;
}

double StepProfile::collectiveSeconds() const {
  double t = 0;
  for (const auto &[op, a] : collectives_)
    t += a.seconds;
  return t;
}

double StepProfile::exposedCollectiveSeconds() const {
  double t = 0;
  for (const auto &[op, a] : waits_)
    t += a.seconds;
  return t;
}

std::vector<Backend::Timing> StepProfile::timings(const program::Program &p) const {
  std::vector<Backend::Timing> out;
  for (size_t k = 0; k < p.kernels.size() && k < kernels_.size(); ++k)
    if (kernels_[k].calls)
      out.push_back({p.kernels[k].symbol, p.kernels[k].op,
                     p.kernels[k].locs.empty() ? "" : p.kernels[k].locs[0],
                     kernels_[k].seconds, kernels_[k].calls});
  gemms_.appendTo(out);
  if (copy_.calls)
    out.push_back({"copy", "copy", "", copy_.seconds, copy_.calls});
  for (const auto &[op, a] : collectives_) {
    out.push_back({op, "collective", "", a.seconds, a.calls});
    auto w = waits_.find(op);
    if (w != waits_.end())
      out.push_back({op + " exposed", "collective wait", "", w->second.seconds, w->second.calls});
  }
  return out;
}

Status checkSingleDevice(const program::Program &p) {
  if (p.numDevices() != 1)
    return Status::error(fmt::format("the program runs over a mesh of {} devices; this "
                                     "backend runs one", p.numDevices()));
  for (const program::Function &f : p.functions)
    for (size_t i = 0; i < f.steps.size(); ++i)
      if (f.steps[i].kind == program::Step::Collective)
        return Status::error(fmt::format(
            "@{} step {} is a collective ({}); this backend has no communicator, so it "
            "runs programs without collectives only",
            f.name, i, program::collectiveOpName(f.steps[i].collective.op)));
  return Status::ok();
}

Status notHeld(const program::Program &p, int device, int id,
               const char *verb) {
  const program::Buffer &b = p.buffers[size_t(id)];
  return Status::error(fmt::format(
      "device {} (pipeline stage {}) cannot {} buffer {}: it lives on the "
      "devices of stage {} only; {} it on one of those",
      device, p.stageOf(device), verb,
      b.name.empty() ? std::to_string(id) : "'" + b.name + "'", b.stage, verb));
}

namespace {

/// "@train_step step 7 (all_reduce on queue 1 at m.kiln:9:3)": where a
/// collective's error came from (an asynchronous one surfaces later).
std::string stepWhere(const program::Function &f, size_t i) {
  const program::Step &s = f.steps[i];
  std::string what = s.kind == program::Step::Collective
                         ? program::collectiveOpName(s.collective.op)
                         : std::string(s.kind == program::Step::Copy ? "copy" : "kernel");
  return fmt::format("@{} step {} ({}{}{})", f.name, i, what,
                     s.queue ? fmt::format(" on queue {}", s.queue) : "",
                     s.loc.empty() ? "" : " at " + s.loc);
}

/// The bytes a step's buffers hold (every argument read or written once).
double argBytes(const program::Program &p, const std::vector<int> &args) {
  double b = 0;
  for (int a : args)
    if (a >= 0 && size_t(a) < p.buffers.size())
      b += double(p.buffers[size_t(a)].bytes);
  return b;
}

/// Adds the span of plan step `si` (or its GEMM epilogue kernel) to the
/// profile's tracer, if one is recording.
void traceStep(const program::Program &p, const program::Function &f, size_t si,
               StepProfile *profile, Span::Kind kind, double start, double seconds,
               bool epilogue = false, int thread = 0) {
  Tracer *t = profile ? profile->tracer : nullptr;
  if (!t || !t->enabled())
    return;
  const program::Step &s = f.steps[si];
  Span sp;
  sp.kind = kind;
  sp.start = start;
  sp.seconds = seconds;
  sp.queue = s.queue;
  sp.thread = thread;
  sp.planStep = int(si);
  sp.function = f.name;
  if (epilogue || s.kind == program::Step::Kernel) {
    int k = epilogue ? s.epilogue : s.kernel;
    sp.kernel = k;
    if (k >= 0 && size_t(k) < p.kernels.size()) {
      sp.name = p.kernels[size_t(k)].symbol;
      sp.flops = double(p.kernels[size_t(k)].flops);
    }
    sp.bytes = argBytes(p, epilogue ? s.epilogueArgs : s.args);
  } else if (s.kind == program::Step::Gemm) {
    sp.name = program::gemmLabel(s.gemm);
    sp.flops = program::gemmFlops(s.gemm);
    sp.bytes = argBytes(p, s.args);
  } else if (s.kind == program::Step::Attention) {
    sp.name = program::attentionLabel(s.attention);
    sp.flops = program::attentionFlops(s.attention);
    sp.bytes = argBytes(p, s.args);
  } else if (s.kind == program::Step::Copy) {
    sp.name = "copy";
    sp.bytes = argBytes(p, s.args);
  } else {
    sp.name = program::collectiveOpName(s.collective.op);
    sp.bytes = double(s.collective.bytes);
  }
  t->add(std::move(sp));
}

/// Holds `mu` (when not null) while it lives: the profile's sums when
/// several inter-op threads add to them.
std::unique_lock<std::mutex> lockIf(std::mutex *mu) {
  return mu ? std::unique_lock<std::mutex>(*mu) : std::unique_lock<std::mutex>();
}

/// Runs one step through the hooks (and its GEMM epilogue), timing it;
/// `thread` is the inter-op thread running it (its spans' track), and
/// `profileMu` (inter-op runs) guards the profile's sums.
Status runOne(const program::Program &p, const program::Function &f, size_t si,
              StepHooks &hooks, StepProfile *profile, bool library, int thread = 0,
              std::mutex *profileMu = nullptr) {
  const program::Step &s = f.steps[si];
  bool libraryEpilogue = s.kind == program::Step::Gemm && s.lt.valid() && library;
  Tracer *tracer = profile ? profile->tracer : nullptr;
  double start = tracer ? tracer->now() : 0;
  if (profile)
    if (Status r = hooks.beginTimed(); !r)
      return r;
  Status r = Status::ok();
  switch (s.kind) {
  case program::Step::Kernel:
    r = hooks.runKernel(s.kernel, s.args);
    break;
  case program::Step::Gemm:
    r = hooks.runGemm(s, libraryEpilogue);
    break;
  case program::Step::Copy:
    r = hooks.runCopy(s);
    break;
  case program::Step::Attention:
    r = hooks.runAttention(s);
    break;
  case program::Step::Collective:
    r = hooks.runCollective(s);
    break;
  }
  if (!r)
    return r;
  if (profile) {
    auto dt = hooks.endTimed();
    if (!dt)
      return dt.status();
    if (tracer)
      start = hooks.timedStart(start);
    auto lock = lockIf(profileMu);
    switch (s.kind) {
    case program::Step::Kernel:
      profile->addKernel(s.kernel, *dt);
      traceStep(p, f, si, profile, Span::Kernel, start, *dt, false, thread);
      break;
    case program::Step::Gemm:
      profile->addGemm(s, *dt, hooks.gemmName());
      traceStep(p, f, si, profile, Span::Gemm, start, *dt, false, thread);
      break;
    case program::Step::Attention: // a library call, profiled as GEMMs are
      profile->addGemm(s, *dt, "attention");
      traceStep(p, f, si, profile, Span::Gemm, start, *dt, false, thread);
      break;
    case program::Step::Copy:
      profile->addCopy(*dt);
      traceStep(p, f, si, profile, Span::Copy, start, *dt, false, thread);
      break;
    case program::Step::Collective:
      profile->addCollective(s, *dt);
      profile->addCollectiveWait(s, *dt); // queue 0 waited for all of it
      traceStep(p, f, si, profile, Span::Collective, start, *dt, false, thread);
      traceStep(p, f, si, profile, Span::CollectiveWait, start, *dt, false, thread);
      break;
    }
  }
  // A GEMM's epilogue kernel, unless the library call did its work.
  if (s.kind == program::Step::Gemm && s.epilogue >= 0 && !libraryEpilogue) {
    double estart = tracer ? tracer->now() : 0;
    if (profile)
      if (Status x = hooks.beginTimed(); !x)
        return x;
    if (Status x = hooks.runKernel(s.epilogue, s.epilogueArgs); !x)
      return x;
    if (profile) {
      auto dt = hooks.endTimed();
      if (!dt)
        return dt.status();
      if (tracer)
        estart = hooks.timedStart(estart);
      auto lock = lockIf(profileMu);
      profile->addKernel(s.epilogue, *dt);
      traceStep(p, f, si, profile, Span::Kernel, estart, *dt, /*epilogue=*/true, thread);
    }
  }
  return Status::ok();
}

/// Waits for asynchronously started step `i` of `f` and books it: the
/// wait as exposed communication (Span::CollectiveWait), the collective's
/// own run from `startedAt` (or, where the hooks run it inside the wait,
/// at the end of the wait) for as long as the backend says it ran.
/// `waiter`: the step that needs it (for the message), SIZE_MAX at the
/// end; `profileMu`: held while booking (inter-op threads), or null.
Status waitAndBook(const program::Program &p, const program::Function &f, size_t i,
                   size_t waiter, StepHooks &hooks, StepProfile *profile, double startedAt,
                   int thread, std::mutex *profileMu) {
  const program::Step &s = f.steps[i];
  Tracer *tracer = profile ? profile->tracer : nullptr;
  double waitStart = tracer ? tracer->now() : 0;
  if (profile)
    if (Status r = hooks.beginTimed(); !r)
      return r;
  double ran = -1;
  Status r = hooks.waitAsync(i, ran);
  if (!r)
    return Status::error(
        fmt::format("{}: {}{}", stepWhere(f, i), r.message(),
                    waiter == SIZE_MAX
                        ? ""
                        : fmt::format(" (surfaced when step {} waited for it)", waiter)),
        r.kind());
  if (!profile)
    return Status::ok();
  auto dt = hooks.endTimed();
  if (!dt)
    return dt.status();
  if (tracer)
    waitStart = hooks.timedStart(waitStart);
  if (s.kind == program::Step::Collective) {
    auto lock = lockIf(profileMu);
    profile->addCollective(s, std::max(ran, 0.0));
    profile->addCollectiveWait(s, *dt);
    // It may have begun later than started, behind its queue.
    double runStart = startedAt;
    if (hooks.asyncRunsInWait()) // it ran at the end of this wait
      runStart = std::max(runStart, waitStart + *dt - std::max(ran, 0.0));
    traceStep(p, f, i, profile, Span::Collective, runStart, std::max(ran, 0.0), false, thread);
    traceStep(p, f, i, profile, Span::CollectiveWait, waitStart, *dt, false, thread);
  }
  return Status::ok();
}

/// The steps a loop started asynchronously and has not waited for.
class Pending {
public:
  Pending(const program::Program &p, const program::Function &f, StepHooks &hooks,
          StepProfile *profile)
      : p_(p), f_(f), hooks_(hooks), profile_(profile), started_(f.steps.size(), false),
        startedAt_(f.steps.size(), 0.0) {}

  void started(size_t i) {
    started_[i] = true;
    order_.push_back(i);
    if (profile_ && profile_->tracer)
      startedAt_[i] = profile_->tracer->now();
  }
  /// Waits for started step `i`, if it is still pending; `waiter` is the
  /// step that needs it (for the message), or SIZE_MAX at the end.
  Status wait(size_t i, size_t waiter) {
    if (i >= started_.size() || !started_[i])
      return Status::ok();
    started_[i] = false;
    return waitAndBook(p_, f_, i, waiter, hooks_, profile_, startedAt_[i], 0, nullptr);
  }
  /// Waits for every pending step, in the order started; the first error.
  /// `waiter`: the step that needs them (SIZE_MAX: the function's end).
  Status drain(size_t waiter = SIZE_MAX) {
    Status first = Status::ok();
    for (size_t i : order_)
      if (Status r = wait(i, waiter); !r && first)
        first = r;
    order_.clear();
    return first;
  }

private:
  const program::Program &p_;
  const program::Function &f_;
  StepHooks &hooks_;
  StepProfile *profile_;
  std::vector<bool> started_;
  std::vector<double> startedAt_;
  std::vector<size_t> order_;
};

/// Runs steps [begin, end) of a function as the DAG their dependencies
/// describe, on the threads of an inter-op pool (docs/runtime.md "Inter-op
/// threads"). Every thread claims the ready step earliest in schedule
/// order, runs it with runOne() and releases the steps that waited only
/// for it. Steps that go to the backend's other queues (startAsync) and
/// collectives keep their schedule order among themselves, whatever the
/// threads do, so every device of a mesh makes the same communicator calls
/// in the same order: such a step starts once its dependencies are done
/// and every earlier one has started (a queue-0 collective: finished). A
/// step that depends on an asynchronous one waits for it on the thread
/// that is about to run it, as the in-order loop does.
class DagRun {
public:
  DagRun(const program::Program &p, const program::Function &f, size_t begin,
         size_t end, StepHooks &hooks, StepProfile *profile)
      : p_(p), f_(f), begin_(begin), end_(end), hooks_(hooks),
        profile_(profile), library_(hooks.libraryEpilogues()),
        concurrent_(hooks.concurrentQueues()), device_(hooks.meshDevice()) {
    size_t n = end - begin;
    remaining_.assign(n, 0);
    dependents_.assign(n, {});
    async_.assign(n, None);
    startedAt_.assign(n, 0.0);
    gateReady_.assign(n, false);
    for (size_t si = begin; si < end; ++si) {
      if (!runs(si)) // another stage's: met at once
        continue;
      ++count_;
      for (int d : f.steps[si].deps)
        if (size_t(d) >= begin && size_t(d) < si && runs(size_t(d))) {
          remaining_[si - begin]++;
          dependents_[size_t(d) - begin].push_back(si);
        }
      if (gated(si))
        gate_.push_back(si);
    }
  }

  Status run(InterOpPool &pool) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t si = begin_; si < end_; ++si)
        if (runs(si) && remaining_[si - begin_] == 0)
          makeReady(si);
      issueGated();
      update();
    }
    pool.run([this](int thread) { work(thread); });
    // Every step has run or been started, or one failed and the threads
    // finished what they were running: wait for what was started, in the
    // order started, so that nothing uses the arena after this returns.
    Status first = failed_ ? error_ : Status::ok();
    for (size_t si : started_)
      if (async_[si - begin_] == Started)
        if (Status r = waitStarted(si, SIZE_MAX, 0); !r && first)
          first = r;
    return first;
  }

private:
  enum Async : uint8_t { None, Started, Waiting, Waited };

  /// Steps kept in schedule order among themselves: collectives, and
  /// what goes to another queue.
  bool gated(size_t si) const {
    const program::Step &s = f_.steps[si];
    return s.kind == program::Step::Collective || (concurrent_ && s.queue != 0);
  }
  bool async(size_t si) const { return concurrent_ && f_.steps[si].queue != 0; }
  /// Whether this device runs step `si` (its stage's, or every stage's).
  bool runs(size_t si) const { return p_.runs(device_, f_.steps[si]); }

  // The helpers below run with mu_ held.
  void makeReady(size_t si) {
    if (gated(si))
      gateReady_[si - begin_] = true;
    else
      ready_.push(si);
  }
  /// Step `si` has finished (or, asynchronous, started): its dependents
  /// have one dependency less.
  void release(size_t si) {
    ++done_;
    for (size_t j : dependents_[si - begin_])
      if (--remaining_[j - begin_] == 0)
        makeReady(j);
  }
  /// Starts the gated steps that are next in order and ready.
  void issueGated() {
    while (!failed_ && !gateBusy_ && nextGate_ < gate_.size() &&
           gateReady_[gate_[nextGate_] - begin_]) {
      size_t si = gate_[nextGate_++];
      if (!async(si)) {
        gateBusy_ = true; // the next waits until this one has run
        ready_.push(si);
        continue;
      }
      if (profile_ && profile_->tracer)
        startedAt_[si - begin_] = profile_->tracer->now();
      Status r = hooks_.startAsync(f_, f_.steps[si], si);
      if (!r) {
        fail(wrapCollective(si, r));
        return;
      }
      async_[si - begin_] = Started;
      started_.push_back(si);
      release(si);
    }
  }
  void fail(Status r) {
    if (!failed_) {
      failed_ = true;
      error_ = std::move(r);
    }
  }
  bool over() const { return failed_ || done_ == count_; }
  /// Publishes the state to spinning threads and wakes sleeping ones.
  void update() {
    readyCount_.store(ready_.size(), std::memory_order_release);
    over_.store(over(), std::memory_order_release);
    if (sleepers_ > 0)
      cv_.notify_all();
  }

  Status wrapCollective(size_t si, Status r) const {
    if (!r && f_.steps[si].kind == program::Step::Collective &&
        r.message().rfind("@" + f_.name, 0) != 0)
      return Status::error(fmt::format("{}: {}", stepWhere(f_, si), r.message()), r.kind());
    return r;
  }

  /// Waits (mu_ not held) for asynchronous step `si` to finish, timing
  /// the wait as exposed communication, as Pending::wait does; another
  /// thread may already be waiting for it.
  Status waitStarted(size_t si, size_t waiter, int thread) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      while (async_[si - begin_] == Waiting)
        cv_.wait(lock);
      if (async_[si - begin_] != Started)
        return Status::ok();
      async_[si - begin_] = Waiting;
    }
    Status r = waitAsyncStep(si, waiter, thread);
    std::lock_guard<std::mutex> lock(mu_);
    async_[si - begin_] = Waited;
    cv_.notify_all();
    return r;
  }
  Status waitAsyncStep(size_t i, size_t waiter, int thread) {
    return waitAndBook(p_, f_, i, waiter, hooks_, profile_, startedAt_[i - begin_], thread,
                       &profileMu_);
  }

  /// One thread's share: claim, run, release, until the run is over.
  void work(int thread) {
    while (true) {
      // Spin briefly for a ready step (the common case between two short
      // kernels), then sleep until one is released or the run is over.
      InterOpPool::spinUntil(
          [&] {
            return readyCount_.load(std::memory_order_acquire) > 0 ||
                   over_.load(std::memory_order_acquire);
          },
          100);
      size_t si;
      {
        std::unique_lock<std::mutex> lock(mu_);
        while (ready_.empty() && !over()) {
          ++sleepers_;
          bool woken = cv_.wait_for(lock, std::chrono::seconds(10),
                                    [&] { return !ready_.empty() || over(); });
          --sleepers_;
          // Nothing ready, nothing running, not over: a dependency that can
          // never be met (the plan's, or this scheduler's, fault).
          if (!woken && running_ == 0 && ready_.empty() && !over()) {
            fail(Status::internal(fmt::format(
                "@{}: the inter-op scheduler has no step to run and {} of {} "
                "steps left (step {} waits for a dependency that never "
                "finishes); rerun with --inter-op-threads 1 and report this",
                f_.name, count_ - done_, count_, firstUnfinished())));
            update();
          }
        }
        if (over())
          return;
        si = ready_.top();
        ready_.pop();
        ++running_;
        update();
      }
      Status r = Status::ok();
      for (int d : f_.steps[si].deps)
        if (size_t(d) >= begin_ && size_t(d) < si && async(size_t(d)))
          if (r = waitStarted(size_t(d), si, thread); !r)
            break;
      if (r)
        r = wrapCollective(si, runOne(p_, f_, si, hooks_, profile_, library_, thread,
                                      profile_ ? &profileMu_ : nullptr));
      std::lock_guard<std::mutex> lock(mu_);
      --running_;
      if (!r) {
        fail(std::move(r));
      } else {
        release(si);
        if (gated(si)) {
          gateBusy_ = false;
        }
        issueGated();
      }
      update();
    }
  }
  size_t firstUnfinished() const {
    for (size_t si = begin_; si < end_; ++si)
      if (runs(si) && remaining_[si - begin_] > 0)
        return si;
    return end_;
  }

  const program::Program &p_;
  const program::Function &f_;
  size_t begin_, end_;
  StepHooks &hooks_;
  StepProfile *profile_;
  bool library_, concurrent_;
  int device_;       ///< the hooks' mesh device: its stage's steps run
  size_t count_ = 0; ///< steps in [begin_, end_) this device runs

  std::mutex mu_; ///< guards everything below but the atomics
  std::condition_variable cv_;
  std::vector<int> remaining_;                  ///< unmet dependencies
  std::vector<std::vector<size_t>> dependents_; ///< steps waiting for each
  std::priority_queue<size_t, std::vector<size_t>, std::greater<size_t>> ready_;
  std::vector<Async> async_;
  std::vector<double> startedAt_;
  std::vector<size_t> started_; ///< asynchronous steps, in the order started
  std::vector<size_t> gate_;    ///< gated steps, in schedule order
  std::vector<bool> gateReady_;
  size_t nextGate_ = 0;
  bool gateBusy_ = false;
  size_t done_ = 0;
  int running_ = 0, sleepers_ = 0;
  bool failed_ = false;
  Status error_ = Status::ok();
  std::mutex profileMu_;
  std::atomic<size_t> readyCount_{0};
  std::atomic<bool> over_{false};
};

} // namespace

Status runSteps(const program::Program &p, const program::Function &f, size_t begin,
                size_t end, StepHooks &hooks, StepProfile *profile) {
  end = std::min(end, f.steps.size());
  if (InterOpPool *pool = hooks.interOp(); pool && pool->threads() > 1 && begin < end)
    return DagRun(p, f, begin, end, hooks, profile).run(*pool);
  bool library = hooks.libraryEpilogues();
  bool concurrent = hooks.concurrentQueues();
  Pending pending(p, f, hooks, profile);
  int device = hooks.meshDevice();
  for (size_t si = begin; si < end; ++si) {
    const program::Step &s = f.steps[si];
    if (!p.runs(device, s)) // another pipeline stage's step
      continue;
    Status r = Status::ok();
    if (concurrent) {
      // What this step waits for on other queues; its own queue keeps order.
      for (int d : s.deps)
        if (size_t(d) < f.steps.size() && f.steps[size_t(d)].queue != s.queue)
          if (r = pending.wait(size_t(d), si); !r)
            break;
      if (r && s.queue != 0) {
        r = hooks.startAsync(f, s, si);
        if (r)
          pending.started(si);
      } else if (r) {
        // A backend that makes started collectives only when waited for
        // would make them all inside this synchronous one: wait for them
        // first, so that each is booked and traced as itself.
        if (s.kind == program::Step::Collective && hooks.asyncRunsInWait())
          r = pending.drain(si);
        if (r)
          r = runOne(p, f, si, hooks, profile, library);
      }
    } else {
      r = runOne(p, f, si, hooks, profile, library);
    }
    if (!r && s.kind == program::Step::Collective && r.message().rfind("@" + f.name, 0) != 0)
      r = Status::error(fmt::format("{}: {}", stepWhere(f, si), r.message()), r.kind());
    if (!r) {
      (void)pending.drain(); // nothing may still use the arena
      return r;
    }
  }
  return pending.drain();
}

} // namespace kiln
