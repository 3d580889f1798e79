//===- Fiber.h - Fibers and stacks for emulated threads ---------*- C++ -*-===//
//
// Every emulated CUDA thread runs on its own stack as a fiber: it runs until
// it blocks (a barrier, a warp primitive) or returns, then switches back to
// the scheduler on the OS thread's own stack. On x86-64 the switch is a few
// instructions (callee-saved registers, MXCSR and the x87 control word);
// elsewhere, or with KILN_EMU_USE_UCONTEXT, it is ucontext (slower: a signal
// mask system call per switch). AddressSanitizer is told about every switch.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CUDA_EMU_FIBER_H
#define KILN_RUNTIME_CUDA_EMU_FIBER_H

#include "runtime/core/Status.h"

#include <cstddef>
#include <vector>

#if defined(__x86_64__) && !defined(KILN_EMU_USE_UCONTEXT)
#define KILN_EMU_FIBER_ASM 1
#else
#define KILN_EMU_FIBER_ASM 0
#include <ucontext.h>
#endif

namespace kiln::cuda::emu {

/// A suspended execution context: the scheduler's or a fiber's.
struct FiberContext {
#if KILN_EMU_FIBER_ASM
  void *sp = nullptr; ///< saved stack pointer (registers are on the stack)
#else
  ucontext_t uc;
#endif
  void (*entry)(void *) = nullptr; ///< set until the fiber first runs
  void *arg = nullptr;
  // AddressSanitizer bookkeeping (unused otherwise).
  const void *stackBottom = nullptr;
  size_t stackSize = 0;
  void *fakeStack = nullptr;
};

/// Prepares `fiber` to call entry(arg) on [stack, stack + size) when it is
/// first switched to. `entry` must never return: a finished fiber switches
/// away with fiberSwitch(..., /*leaving=*/true).
void fiberInit(FiberContext &fiber, void *stack, size_t size,
               void (*entry)(void *), void *arg);

/// Saves the running context into `from` and resumes `to`; returns when
/// something switches back to `from`. `leaving` says `from` is never resumed.
void fiberSwitch(FiberContext &from, FiberContext &to, bool leaving = false);

/// Fiber stacks of one size, each above a guard page (an overflow faults
/// instead of corrupting a neighbour), allocated lazily and kept for reuse.
class StackPool {
public:
  StackPool() = default;
  ~StackPool();
  StackPool(const StackPool &) = delete;
  StackPool &operator=(const StackPool &) = delete;

  /// Makes stacks of `bytes` (rounded up to pages) available; frees the old
  /// ones if the size changes.
  void setStackBytes(size_t bytes);
  size_t stackBytes() const { return bytes_; }
  /// The lowest address of stack `index`, allocating it on first use.
  Expected<void *> stack(size_t index);

private:
  void release();
  size_t bytes_ = 0;
  size_t page_ = 0;
  std::vector<void *> mappings_; ///< guard page + stack, one per fiber
};

} // namespace kiln::cuda::emu

#endif // KILN_RUNTIME_CUDA_EMU_FIBER_H
