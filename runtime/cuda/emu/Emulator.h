//===- Emulator.h - Run CUDA kernels on the CPU, for tests ------*- C++ -*-===//
//
// The CUDA emulator runs kernels written against runtime/cuda/kiln_cuda.h
// and compiled by the host C++ compiler (Module.h) on the CPU, with CUDA's
// execution model: a grid of blocks, each block's threads run as
// cooperatively scheduled fibers that meet at __syncthreads and at warp
// primitives. It is a test tool for generated kernels where no GPU is
// available; results are emulation, never GPU results.
//
// Execution is deterministic: blocks run in linear order (x fastest), and
// within a block threads run in a fixed order, each until it blocks. Misuse
// that CUDA leaves undefined or that hangs a GPU — a deadlock, a warp
// primitive whose mask names a lane that exited or went elsewhere, a barrier
// some threads skip — comes back as a Status naming the kernel, the block,
// the threads and the source lines (kiln_cuda.h lists the rules).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CUDA_EMU_EMULATOR_H
#define KILN_RUNTIME_CUDA_EMU_EMULATOR_H

#define KILN_EMU_ABI_ONLY
#include "runtime/cuda/kiln_cuda.h"
#undef KILN_EMU_ABI_ONLY

#include "runtime/core/Status.h"

#include <cstddef>
#include <cstdint>
#include <string>

namespace kiln::cuda::emu {

/// A kernel's emulator entry point, `name__emu` (defined by KILN_EMU_SHIM):
/// runs the kernel for one emulated thread. `params` follows cuLaunchKernel:
/// entry i points at the value of kernel parameter i.
using Shim = KilnEmuShim;

/// Grid or block extents.
struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

struct LaunchOptions {
  /// The kernel's name, for messages.
  std::string kernel = "kernel";
  /// Report what CUDA leaves undefined but a GPU may tolerate: a barrier
  /// released because the missing threads exited, threads meeting at
  /// __syncthreads from different source lines, a warp primitive whose mask
  /// names an exited or non-existent lane. Off: PTX's rules (exited threads
  /// count as arrived; absent lanes are skipped and read as poison).
  bool strict = true;
  /// Stack per emulated thread; 0: $KILN_EMU_STACK_KIB, else 64 KiB.
  size_t stackBytes = 0;
  /// OS threads running blocks (each with its own fibers); 0:
  /// $KILN_EMU_THREADS, else 1. With more than one, blocks run concurrently
  /// (atomics are real atomics; float atomics then lose determinism).
  unsigned threads = 0;
  /// The largest dynamic shared memory a launch may ask for (48 KiB, CUDA's
  /// limit unless the kernel opts in to more).
  size_t maxDynamicSharedBytes = 48 * 1024;
  /// Fill dynamic shared memory with 0xff bytes (a NaN for float, half and
  /// bfloat16) before each block, so that reads of unwritten shared memory
  /// show in results.
  bool poisonSharedMemory = true;
};

/// What a launch did.
struct LaunchStats {
  uint64_t blocks = 0;
  uint64_t threads = 0;
  uint64_t switches = 0; ///< fiber switches into emulated threads
  unsigned osThreads = 1;
  double seconds = 0;
};

/// Runs `shim` over `grid` x `block` with `dynamicSharedBytes` of dynamic
/// shared memory per block. Validates the configuration as a CUDA launch
/// would (block up to 1024 threads, (1024, 1024, 64); grid up to
/// (2^31-1, 65535, 65535)). Returns the first error by block order; the
/// kernel's writes up to that point stay. Different OS threads may launch at
/// the same time; a kernel may not launch (no dynamic parallelism). A stack
/// overflow is reported on stderr and then kills the process, as a crash in
/// any kernel does.
Status launch(Shim shim, Dim3 grid, Dim3 block, size_t dynamicSharedBytes,
              void **params, const LaunchOptions &options = {},
              LaunchStats *stats = nullptr);

} // namespace kiln::cuda::emu

#endif // KILN_RUNTIME_CUDA_EMU_EMULATOR_H
