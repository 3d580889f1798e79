//===- Executor.h - Runs a compiled program on the CPU -----------*- C++ -*-===//
//
// One arena (64-byte aligned, zeroed) laid out by the compiler's plan;
// run(name) walks an entry point's steps: generated kernels get the buffer
// pointers their signature lists, GEMMs go to BLAS, copies are memcpy.
// Results are deterministic for a given thread count (no step depends on
// timing: a split kernel's pieces are fixed by the compiler and write
// disjoint rows, BLAS splits work by thread count).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CPU_EXECUTOR_H
#define KILN_RUNTIME_CPU_EXECUTOR_H

#include "runtime/core/Backend.h"
#include "runtime/core/Program.h"
#include "runtime/cpu/Jit.h"
#include "runtime/cpu/ThreadPool.h"

#include <memory>
#include <vector>

namespace kiln::cpu {

class Executor : public Backend {
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
  std::vector<Timing> timings() override;

private:
  Executor() = default;
  /// Runs one generated kernel (all of its pieces) on `args`' buffers.
  void runKernel(int kernel, const std::vector<int> &args, void **ptrs);
  program::Program program_;
  std::unique_ptr<KernelLibrary> lib_;
  std::vector<KernelFn> fns_;
  char *arena_ = nullptr;
  std::unique_ptr<ThreadPool> pool_;
  bool profiling_ = false;
  std::vector<double> kernelSeconds_;
  std::vector<int64_t> kernelCalls_;
  double copySeconds_ = 0;
  int64_t copyCalls_ = 0;
  GemmTimings gemms_;
};

} // namespace kiln::cpu

#endif // KILN_RUNTIME_CPU_EXECUTOR_H
