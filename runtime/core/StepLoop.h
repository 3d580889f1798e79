//===- StepLoop.h - One loop over a function's steps, with backend hooks -*- C++ -*-===//
//
// Every backend runs an entry point the same way: walk its steps in order,
// dispatch each by kind to the backend, and (when profiling) time it. The
// walk, the kind switch and the profile's bookkeeping live here once; a
// backend supplies StepHooks: how to run a kernel, a GEMM (with its library
// epilogue, where the backend applies those), a copy and a collective, and
// how to time a region (the CPU with steady_clock, CUDA with an event pair
// on its compute stream). Each timed step also becomes a trace span
// (Trace.h) when a tracer is set.
//
// Queues and dependencies (plan v2): a backend that runs its queues
// concurrently (StepHooks::concurrentQueues()) gets every step on a queue
// other than 0 through startAsync(), and the loop goes on with the next
// step; before a step on queue 0 runs, the loop waits (waitAsync()) for each
// started step it depends on (Step::deps), and before it returns, for every
// step it started. A step on queue q > 0 was started after every queue-0
// step before it in schedule order, and the backend runs one queue's steps
// in the order started, so its own dependencies hold when queue 0 is
// synchronous (the CPU); a backend whose queue 0 is itself asynchronous
// (CUDA streams) orders the start after queue 0's work with an event. An
// asynchronous step's error surfaces at the wait, prefixed with the step's
// function, index, op and model-file location. Backends that do not run
// queues concurrently (the default) run every step in schedule order, so
// the dependencies, which point to earlier steps, hold trivially.
//
// Inter-op threads: where StepHooks::interOp() gives a pool of N > 1
// threads, the loop runs the steps as the DAG of their dependencies, up to
// N at once (each thread claims the ready step earliest in schedule
// order); collectives and other queues' steps keep their schedule order
// among themselves (docs/runtime.md "Inter-op threads"). Spans then carry
// the thread that ran them (Span::thread), and the profile's seconds are
// summed over threads (they may exceed the wall time).
//
// Pipeline stages (plan v2, docs/runtime.md "Pipeline stages"): the
// loop runs only the steps of the hooks' device's stage and the stage -1
// ones (StepHooks::meshDevice()); the others are neither run, timed,
// traced nor waited for, and a dependency on one of them is met at once.
//
// Profile: a collective's seconds are its own run time; the seconds queue 0
// spent waiting for it (all of a synchronous one's) are also counted as
// exposed communication, so overlapped time = run time - exposed time.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CORE_STEPLOOP_H
#define KILN_RUNTIME_CORE_STEPLOOP_H

#include "runtime/core/Backend.h"
#include "runtime/core/Program.h"
#include "runtime/core/Status.h"
#include "runtime/core/Trace.h"

#include <cstddef>
#include <map>
#include <string>
#include <vector>

namespace kiln {

class InterOpPool;

/// What a backend does for each kind of step.
class StepHooks {
public:
  virtual ~StepHooks() = default;
  /// Runs generated kernel `kernel` (all its pieces) on buffers `args`.
  virtual Status runKernel(int kernel, const std::vector<int> &args) = 0;
  /// Runs a GEMM step's product. `libraryEpilogue`: the step has a library
  /// epilogue (Step::lt) and the backend applies it in the call, writing
  /// lt.out (and lt.aux); the loop then skips the epilogue kernel.
  virtual Status runGemm(const program::Step &s, bool libraryEpilogue) = 0;
  /// Copies args[0] into args[1].
  virtual Status runCopy(const program::Step &s) = 0;
  /// Runs a fused attention step (program::AttentionParams); the default
  /// says the backend has no attention kernel.
  virtual Status runAttention(const program::Step &s);
  /// Runs a collective step; the default says the backend cannot.
  virtual Status runCollective(const program::Step &s);
  /// Whether steps on queues other than 0 run concurrently with queue 0
  /// (through startAsync/waitAsync); false: every step in order, here.
  virtual bool concurrentQueues() const { return false; }
  /// Starts step `index` of `f` (on queue s.queue > 0) and returns without
  /// waiting for it; steps of one queue run in the order started. Only
  /// called where concurrentQueues(); the default refuses.
  virtual Status startAsync(const program::Function &f, const program::Step &s, size_t index);
  /// Waits (blocks the caller, or orders queue 0 after it) until started
  /// step `index` has finished; returns its error if it failed, and sets
  /// `seconds` to its run time when known (else leaves it negative).
  virtual Status waitAsync(size_t index, double &seconds);
  /// Whether a started step runs only when it is waited for, inside
  /// waitAsync() (a CPU device with no communication thread): its span then
  /// ends with the wait instead of starting where it was started.
  virtual bool asyncRunsInWait() const { return false; }
  /// Whether GEMM steps with a library epilogue run it in the GEMM call.
  virtual bool libraryEpilogues() const { return false; }
  /// The profile's name for this backend's GEMMs, e.g. "gemm (BLAS)".
  virtual const char *gemmName() const = 0;
  /// Starts a timed region; endTimed() returns its seconds once the work
  /// queued since beginTimed() has finished (profiling only).
  virtual Status beginTimed() = 0;
  virtual Expected<double> endTimed() = 0;
  /// After endTimed(): when the timed region started on the tracer's clock
  /// (Trace.h), given `hostStart`, the host's time just before beginTimed().
  /// The default is `hostStart`; a device that times with its own clock
  /// (CUDA events) places the start on the host timeline from that clock.
  virtual double timedStart(double hostStart) { return hostStart; }
  /// Threads that run independent steps at once (runtime/core/InterOp.h),
  /// or null: one step at a time, in schedule order. With a pool of N > 1
  /// threads, the hooks are called from N threads at once (on different
  /// steps); beginTimed/endTimed pair up per thread; startAsync and
  /// waitAsync may come from any of them, never two startAsync at once.
  virtual InterOpPool *interOp() { return nullptr; }
  /// The device of the mesh these hooks run (0: one device). The loop runs
  /// only the steps of its pipeline stage (Program::stageOf) and the stage
  /// -1 ones; a dependency on a step it skips is met.
  virtual int meshDevice() const { return 0; }
};

/// Per-step timing accumulated over runs: seconds and calls per kernel,
/// GEMMs by shape, copies, collectives by op.
class StepProfile {
public:
  explicit StepProfile(size_t kernels = 0) : kernels_(kernels) {}
  /// Where each timed step also goes as a Span (Trace.h) while the tracer
  /// is enabled: kernels (with Program::kernels' FLOP estimate and their
  /// arguments' bytes), GEMMs (label, FLOPs), copies, collectives (run
  /// time on their queue, bytes) and queue 0's waits for them. Null: none.
  Tracer *tracer = nullptr;
  void addKernel(int kernel, double seconds) {
    kernels_[size_t(kernel)].seconds += seconds;
    kernels_[size_t(kernel)].calls++;
  }
  void addGemm(const program::Step &s, double seconds, const char *name) {
    gemms_.add(s, seconds, name);
  }
  void addCopy(double seconds) {
    copy_.seconds += seconds;
    copy_.calls++;
  }
  /// A collective's run time.
  void addCollective(const program::Step &s, double seconds);
  /// Time queue 0 waited for a collective (exposed communication): all of
  /// a synchronous collective's run time, the wait for an asynchronous one.
  void addCollectiveWait(const program::Step &s, double seconds);
  /// Collectives' run time and the part of it queue 0 waited for, summed
  /// over every op and run; overlapped = collectiveSeconds - exposed.
  double collectiveSeconds() const;
  double exposedCollectiveSeconds() const;
  /// Kernels (with their first model line), GEMMs by shape, copies, then
  /// collectives by op ("all_reduce", op "collective": run time) each with
  /// its exposed time ("all_reduce exposed", op "collective wait"): what
  /// Backend::timings() returns.
  std::vector<Backend::Timing> timings(const program::Program &p) const;

private:
  struct Acc {
    double seconds = 0;
    int64_t calls = 0;
  };
  std::vector<Acc> kernels_;
  Backend::GemmTimings gemms_;
  Acc copy_;
  std::map<std::string, Acc> collectives_, waits_;
};

/// Whether a backend of one device without a communicator can run `p`:
/// an error naming the mesh size, or the first collective step, if not.
/// Executors call it when they are created, so such a plan is refused at
/// load, not half-way through a step.
Status checkSingleDevice(const program::Program &p);

/// The error of a backend asked to `verb` ("read", "write") buffer `id`,
/// which device `device` does not hold (another pipeline stage's).
Status notHeld(const program::Program &p, int device, int id, const char *verb);

/// Runs steps [begin, end) of `f` (end clipped to its length) in order
/// through `hooks` (or, where hooks.interOp() has N > 1 threads, as the DAG
/// of Step::deps, up to N steps at once: each as soon as the steps it
/// depends on have finished, the earliest in schedule order first;
/// collectives and other queues' steps start in schedule order); with `profile`, times each step (a GEMM and its
/// epilogue kernel separately) into it. Steps on queues > 0 run
/// asynchronously where the hooks run queues concurrently (above); every
/// started step has finished when this returns. Stops at the first error
/// (after waiting for the steps already started, and for those other
/// inter-op threads are running).
Status runSteps(const program::Program &p, const program::Function &f, size_t begin,
                size_t end, StepHooks &hooks, StepProfile *profile);

} // namespace kiln

#endif // KILN_RUNTIME_CORE_STEPLOOP_H
