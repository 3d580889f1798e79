//===- StepLoop.cpp - One loop over a function's steps --------------------===//
#include "runtime/core/StepLoop.h"

#include <algorithm>

#include <fmt/format.h>

namespace kiln {

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
               bool epilogue = false) {
  Tracer *t = profile ? profile->tracer : nullptr;
  if (!t || !t->enabled())
    return;
  const program::Step &s = f.steps[si];
  Span sp;
  sp.kind = kind;
  sp.start = start;
  sp.seconds = seconds;
  sp.queue = s.queue;
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
  } else if (s.kind == program::Step::Copy) {
    sp.name = "copy";
    sp.bytes = argBytes(p, s.args);
  } else {
    sp.name = program::collectiveOpName(s.collective.op);
    sp.bytes = double(s.collective.bytes);
  }
  t->add(std::move(sp));
}

/// Runs one step through the hooks (and its GEMM epilogue), timing it.
Status runOne(const program::Program &p, const program::Function &f, size_t si,
              StepHooks &hooks, StepProfile *profile, bool library) {
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
    switch (s.kind) {
    case program::Step::Kernel:
      profile->addKernel(s.kernel, *dt);
      traceStep(p, f, si, profile, Span::Kernel, start, *dt);
      break;
    case program::Step::Gemm:
      profile->addGemm(s, *dt, hooks.gemmName());
      traceStep(p, f, si, profile, Span::Gemm, start, *dt);
      break;
    case program::Step::Copy:
      profile->addCopy(*dt);
      traceStep(p, f, si, profile, Span::Copy, start, *dt);
      break;
    case program::Step::Collective:
      profile->addCollective(s, *dt);
      profile->addCollectiveWait(s, *dt); // queue 0 waited for all of it
      traceStep(p, f, si, profile, Span::Collective, start, *dt);
      traceStep(p, f, si, profile, Span::CollectiveWait, start, *dt);
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
      profile->addKernel(s.epilogue, *dt);
      traceStep(p, f, si, profile, Span::Kernel, estart, *dt, /*epilogue=*/true);
    }
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
    const program::Step &s = f_.steps[i];
    double waitStart = profile_ && profile_->tracer ? profile_->tracer->now() : 0;
    if (profile_)
      if (Status r = hooks_.beginTimed(); !r)
        return r;
    double ran = -1;
    Status r = hooks_.waitAsync(i, ran);
    if (!r)
      return Status::error(
          fmt::format("{}: {}{}", stepWhere(f_, i), r.message(),
                      waiter == SIZE_MAX
                          ? ""
                          : fmt::format(" (surfaced when step {} waited for it)", waiter)),
          r.kind());
    if (profile_) {
      auto dt = hooks_.endTimed();
      if (!dt)
        return dt.status();
      if (s.kind == program::Step::Collective) {
        profile_->addCollective(s, std::max(ran, 0.0));
        profile_->addCollectiveWait(s, *dt);
        // Its run: from when it was started, for as long as it ran (the
        // backend's measure; it may have begun later, behind its queue).
        double runStart = startedAt_[i];
        if (hooks_.asyncRunsInWait()) // it ran at the end of this wait
          runStart = std::max(runStart, waitStart + *dt - std::max(ran, 0.0));
        traceStep(p_, f_, i, profile_, Span::Collective, runStart, std::max(ran, 0.0));
        traceStep(p_, f_, i, profile_, Span::CollectiveWait, waitStart, *dt);
      }
    }
    return Status::ok();
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

} // namespace

Status runSteps(const program::Program &p, const program::Function &f, size_t begin,
                size_t end, StepHooks &hooks, StepProfile *profile) {
  end = std::min(end, f.steps.size());
  bool library = hooks.libraryEpilogues();
  bool concurrent = hooks.concurrentQueues();
  Pending pending(p, f, hooks, profile);
  for (size_t si = begin; si < end; ++si) {
    const program::Step &s = f.steps[si];
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
