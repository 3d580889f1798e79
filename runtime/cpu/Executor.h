//===- Executor.h - Runs a compiled program on the CPU -----------*- C++ -*-===//
//
// One arena (64-byte aligned, zeroed) laid out by the compiler's plan;
// run(name) walks an entry point's steps with the step loop
// (runtime/core/StepLoop.h), this executor's hooks doing the work:
// generated kernels get the buffer pointers their signature lists, GEMMs go
// to BLAS, copies are memcpy, steps are timed with steady_clock.
// Results are deterministic for a given thread count (no step depends on
// timing: a split kernel's pieces are fixed by the compiler and write
// disjoint rows, BLAS splits work by thread count).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CPU_EXECUTOR_H
#define KILN_RUNTIME_CPU_EXECUTOR_H

#include "runtime/core/Backend.h"
#include "runtime/core/Program.h"
#include "runtime/core/StepLoop.h"
#include "runtime/cpu/Jit.h"
#include "runtime/cpu/ThreadPool.h"

#include <chrono>
#include <memory>
#include <vector>

namespace kiln::cpu {

class Executor : public Backend, private StepHooks {
public:
  /// Resolves every kernel symbol in `lib`; `threads` >= 1 threads run the
  /// pieces of split kernels and BLAS.
  static Expected<std::unique_ptr<Executor>>
  create(const program::Program &program, std::unique_ptr<KernelLibrary> lib,
         int threads);
  ~Executor();

  const program::Program &program() const override { return program_; }
  std::string describe() const override;
  void *data(int buffer) { return arena_ + program_.buffers[buffer].offset; }
  template <typename T> T *as(int buffer) { return static_cast<T *>(data(buffer)); }

  Status write(int id, const void *src, size_t bytes) override;
  Status read(int id, void *dst, size_t bytes) override;
  Status runSteps(const std::string &function, size_t begin, size_t end) override;
  Status synchronize() override { return Status::ok(); }

  /// Per-step timing (off by default): seconds per kernel symbol ("gemm",
  /// "copy" for library steps), accumulated over runs.
  void setProfiling(bool on) override { profiling_ = on; }
  std::vector<Timing> timings() override { return profile_.timings(program_); }

private:
  Executor() = default;
  // The step loop's hooks.
  /// Runs one generated kernel (all of its pieces) on `args`' buffers.
  Status runKernel(int kernel, const std::vector<int> &args) override;
  Status runGemm(const program::Step &s, bool libraryEpilogue) override;
  Status runCopy(const program::Step &s) override;
  /// Threads to share a float32 GEMM's `parts` (runtime/cpu/Split.h).
  int gemmThreads(const program::GemmParams &g, int64_t parts) const;
  const char *gemmName() const override { return "gemm (BLAS)"; }
  Status beginTimed() override;
  Expected<double> endTimed() override;

  program::Program program_;
  std::unique_ptr<KernelLibrary> lib_;
  std::vector<KernelFn> fns_;
  char *arena_ = nullptr;
  std::unique_ptr<ThreadPool> pool_;
  void *ptrs_[4096]; ///< a kernel call's buffer pointers
  bool profiling_ = false;
  std::chrono::steady_clock::time_point timedStart_;
  StepProfile profile_;
};

} // namespace kiln::cpu

#endif // KILN_RUNTIME_CPU_EXECUTOR_H
