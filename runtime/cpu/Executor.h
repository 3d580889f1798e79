//===- Executor.h - Runs a compiled program on the CPU -----------*- C++ -*-===//
//
// One arena (64-byte aligned, zeroed) laid out by the compiler's plan;
// run(name) walks an entry point's steps with the step loop
// (runtime/core/StepLoop.h), this executor's hooks doing the work:
// generated kernels get the buffer pointers their signature lists, GEMMs go
// to BLAS, copies are memcpy, steps are timed with steady_clock.
// Results do not depend on the thread counts (no step depends on timing: a
// split kernel's pieces are fixed by the compiler and write disjoint rows,
// a GEMM's parts are fixed by its shape, each one sequential BLAS call).
// With inter-op threads (ExecutorOptions::interOpThreads > 1), independent
// steps run at once on an InterOpPool; they share the intra-op ThreadPool:
// a step that finds it running another step's pieces runs its own pieces
// on its inter-op thread (the same pieces, so the same bits).
//
// Several devices (docs/parallel.md "Executors"): given a Communicator
// (ExecutorOptions), the executor runs one device of a mesh program: its
// arena is laid out by program.plan(device), and collective steps call the
// communicator with pointers into it. With pipeline stages it runs only its
// stage's steps (and the stage -1 ones), and write()/read() refuse the
// buffers of other stages (they are not in its arena). Every collective goes
// through one communication thread per executor, in schedule order (so every
// member makes the same calls in the same order, whatever overlaps); a step on
// queue 1 is started there and the step loop goes on, a queue-0 collective
// is waited for at once. Or, with ExecutorOptions::commThread Off, no
// communication thread: the collectives are made, in the same order, on
// the executor's own thread when a step first waits for them. Steps that depend
// on a queue-1 step wait for it (runtime/core/StepLoop.h).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CPU_EXECUTOR_H
#define KILN_RUNTIME_CPU_EXECUTOR_H

#include "runtime/comm/Communicator.h"
#include "runtime/core/Backend.h"
#include "runtime/core/Collectives.h"
#include "runtime/core/InterOp.h"
#include "runtime/core/Program.h"
#include "runtime/core/StepLoop.h"
#include "runtime/cpu/HalfGemmCache.h"
#include "runtime/cpu/Jit.h"
#include "runtime/cpu/ThreadPool.h"

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace kiln::cpu {

struct ExecutorOptions {
  /// Threads (>= 1) that run the pieces of split kernels and BLAS: with N
  /// devices in one process, each one's share (threadShare()).
  int threads = 1;
  /// Not owned; must outlive the executor. Null: one device, and a plan
  /// over a mesh or with collective steps is refused.
  comm::Communicator *communicator = nullptr;
  /// This executor's device in the mesh (= its world rank); -1: the
  /// communicator's rank().
  int device = -1;
  /// Threads (>= 1) that run independent plan steps at once (the step
  /// loop's DAG; runtime/core/InterOp.h); 1: one step at a time, in
  /// schedule order. Each device of a mesh has its own.
  int interOpThreads = 1;
  /// Where collectives run (docs/parallel.md "One core per rank"): On, a
  /// communication thread (queue-1 steps overlap compute); Off, on the
  /// executor's own thread, each queue-1 step when a step first waits for
  /// it (no second thread on the device's cores); Auto, On (measured
  /// faster on shared cores, even with one thread per device). Results are
  /// the same bits either way.
  enum class CommThread { Auto, On, Off };
  CommThread commThread = CommThread::Auto;
  /// Where the choice between the two ways of running a bf16/f16 GEMM is
  /// remembered (runtime/cpu/HalfGemmCache.h): the kernel cache's
  /// directory; "" keeps choices in memory (measured again next run).
  std::string cacheDir;
  /// bf16/f16 GEMMs: "measure" (time both ways at a shape's first use, keep
  /// the faster), "widen" or "library"; "" reads KILN_HALF_GEMM (default
  /// measure).
  std::string halfGemm;
};

class Executor : public Backend, private StepHooks {
public:
  /// Resolves every kernel symbol in `lib` (may be null for a program
  /// without kernels); `threads` >= 1 threads run the pieces of split
  /// kernels and BLAS.
  static Expected<std::unique_ptr<Executor>>
  create(const program::Program &program, std::unique_ptr<KernelLibrary> lib,
         int threads);
  /// One device of a mesh program when options.communicator is set: the
  /// communicator's size must be the mesh's device count.
  static Expected<std::unique_ptr<Executor>>
  create(const program::Program &program, std::unique_ptr<KernelLibrary> lib,
         const ExecutorOptions &options);
  ~Executor();

  /// Device `device`'s share of `total` threads split over `devices` in one
  /// process: total / devices, the remainder to the first devices, at
  /// least 1 (so N devices on fewer cores never oversubscribe by more than
  /// one thread each).
  static int threadShare(int total, int devices, int device);

  /// This executor's device in the mesh (0 without a communicator).
  int device() const { return device_; }
  /// Where the run is, for collective error messages ("training step 12");
  /// each collective's context is this, then its step.
  void setContext(std::string context) override { context_ = std::move(context); }
  /// The step profile (collectives' run and exposed time included).
  const StepProfile &profile() const { return profile_; }

  const program::Program &program() const override { return program_; }
  std::string describe() const override;
  /// Buffer `buffer` in this device's arena.
  void *data(int buffer) { return arena_ + layout_->buffers[size_t(buffer)].offset; }
  template <typename T> T *as(int buffer) { return static_cast<T *>(data(buffer)); }

  Status write(int id, const void *src, size_t bytes) override;
  Status read(int id, void *dst, size_t bytes) override;
  Status runSteps(const std::string &function, size_t begin, size_t end) override;
  Status synchronize() override { return Status::ok(); }

  /// Per-step timing (off by default): seconds per kernel symbol ("gemm",
  /// "copy" for library steps), accumulated over runs.
  void setProfiling(bool on) override { profiling_ = on; }
  void setTracer(Tracer *t) override {
    profile_.tracer = t;
    if (t)
      profiling_ = true;
  }
  std::vector<Timing> timings() override { return profile_.timings(program_); }

private:
  Executor() = default;
  // The step loop's hooks.
  /// Runs one generated kernel (all of its pieces) on `args`' buffers.
  Status runKernel(int kernel, const std::vector<int> &args) override;
  Status runGemm(const program::Step &s, bool libraryEpilogue) override;
  Status runCopy(const program::Step &s) override;
  Status runAttention(const program::Step &s) override;
  /// Threads to share a float32 GEMM's `parts` (runtime/cpu/Split.h).
  int gemmThreads(const program::GemmParams &g, int64_t parts) const;
  /// How bf16/f16 GEMM step `s` runs: its remembered choice, or measured
  /// now on the step's own buffers (the output is written again after).
  HalfGemm halfGemmMethod(const program::Step &s, const RunParts &run);
  const char *gemmName() const override { return "gemm (BLAS)"; }
  /// Per thread (inter-op threads time their own steps).
  Status beginTimed() override;
  Expected<double> endTimed() override;
  InterOpPool *interOp() override { return interOp_.get(); }
  int meshDevice() const override { return device_; }

  // Collectives (with a communicator): through the communication thread.
  Status runCollective(const program::Step &s) override;
  bool concurrentQueues() const override { return comm_ != nullptr; }
  Status startAsync(const program::Function &f, const program::Step &s, size_t index) override;
  Status waitAsync(size_t index, double &seconds) override;
  /// ", 2 inter-op threads" when there are more than one, else "".
  std::string interOpNote() const;
  bool asyncRunsInWait() const override { return queue_ && queue_->isInline(); }
  /// The communicator call for collective step `s` on this device.
  Status communicate(const program::Step &s);

  program::Program program_;
  const program::BufferPlan *layout_ = nullptr; ///< program_.plan(device_)
  int device_ = 0;
  comm::Communicator *comm_ = nullptr;
  std::string context_;
  std::unique_ptr<CollectiveQueue> queue_; ///< with a communicator
  const program::Function *current_ = nullptr; ///< the function runSteps runs
  std::map<size_t, uint64_t> asyncTickets_; ///< started step index -> ticket
  std::mutex ticketsMu_; ///< asyncTickets_ (inter-op threads wait for steps)
  std::unique_ptr<KernelLibrary> lib_;
  std::vector<KernelFn> fns_;
  char *arena_ = nullptr;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<InterOpPool> interOp_; ///< with more than one inter-op thread
  bool profiling_ = false;
  StepProfile profile_;
  enum class HalfMode { Measure, Widen, Library, DotProducts } halfMode_ = HalfMode::Measure;
  std::unique_ptr<HalfGemmCache> halfCache_;
};

} // namespace kiln::cpu

#endif // KILN_RUNTIME_CPU_EXECUTOR_H
