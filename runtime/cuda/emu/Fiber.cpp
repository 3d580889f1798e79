//===- Fiber.cpp - Cooperative contexts and stacks for emulated threads ---===//
#include "runtime/cuda/emu/Fiber.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define KILN_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KILN_EMU_ASAN 1
#endif
#endif
#ifndef KILN_EMU_ASAN
#define KILN_EMU_ASAN 0
#endif
#if KILN_EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

namespace kiln::cuda::emu {

namespace {

/// The context being left by the switch in progress on this OS thread: the
/// resumed side records that stack's bounds for AddressSanitizer, and a
/// fiber starting for the first time finds its entry point through it.
thread_local FiberContext *switchingFrom = nullptr;
thread_local FiberContext *switchingTo = nullptr;

/// Runs on the destination side of every switch.
inline void afterSwitch(FiberContext &self) {
#if KILN_EMU_ASAN
  FiberContext *from = switchingFrom;
  __sanitizer_finish_switch_fiber(self.fakeStack, &from->stackBottom,
                                  &from->stackSize);
#else
  (void)self;
#endif
}

/// The first code a fiber runs.
[[noreturn]] void fiberStart() {
  FiberContext &self = *switchingTo;
#if KILN_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &switchingFrom->stackBottom,
                                  &switchingFrom->stackSize);
#endif
  void (*entry)(void *) = self.entry;
  void *arg = self.arg;
  self.entry = nullptr;
  entry(arg);
  __builtin_trap(); // entry switches away for good instead of returning
}

} // namespace

#if KILN_EMU_FIBER_ASM

extern "C" void kiln_emu_swap_x86_64(void **saveSp, void *loadSp);
extern "C" void kiln_emu_start_x86_64();
extern "C" [[noreturn]] __attribute__((visibility("hidden"))) void
kiln_emu_fiber_start() {
  fiberStart();
}

// kiln_emu_swap_x86_64(saveSp, loadSp): pushes the System V callee-saved
// registers and the floating-point control state, stores the stack pointer
// in *saveSp, switches to loadSp and pops the same frame from there.
// A fresh fiber's frame "returns" into kiln_emu_start_x86_64 with a 16-byte
// aligned stack, which calls kiln_emu_fiber_start.
asm(R"(
  .text
  .p2align 4
  .globl kiln_emu_swap_x86_64
  .hidden kiln_emu_swap_x86_64
  .type kiln_emu_swap_x86_64, @function
kiln_emu_swap_x86_64:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size kiln_emu_swap_x86_64, .-kiln_emu_swap_x86_64

  .p2align 4
  .globl kiln_emu_start_x86_64
  .hidden kiln_emu_start_x86_64
  .type kiln_emu_start_x86_64, @function
kiln_emu_start_x86_64:
  xorl %ebp, %ebp
  call kiln_emu_fiber_start
  ud2
  .size kiln_emu_start_x86_64, .-kiln_emu_start_x86_64
)");

void fiberInit(FiberContext &fiber, void *stack, size_t size,
               void (*entry)(void *), void *arg) {
  fiber.entry = entry;
  fiber.arg = arg;
  fiber.stackBottom = stack;
  fiber.stackSize = size;
  fiber.fakeStack = nullptr;
  // The frame kiln_emu_swap_x86_64 pops: control word, 6 registers, return
  // address. After the pops and `ret`, %rsp = top - 16 (16-byte aligned, as a
  // call instruction expects it before pushing its return address).
  uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + size) & ~uintptr_t(15);
  auto *frame = reinterpret_cast<uint64_t *>(top - 16 - 64);
  uint32_t mxcsr;
  uint16_t fpucw;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpucw));
  frame[0] = uint64_t(mxcsr) | (uint64_t(fpucw) << 32);
  for (int i = 1; i <= 6; ++i) // r15, r14, r13, r12, rbx, rbp
    frame[i] = 0;
  frame[7] = reinterpret_cast<uint64_t>(&kiln_emu_start_x86_64);
  fiber.sp = frame;
}

void fiberSwitch(FiberContext &from, FiberContext &to, bool leaving) {
  switchingFrom = &from;
  switchingTo = &to;
#if KILN_EMU_ASAN
  __sanitizer_start_switch_fiber(leaving ? nullptr : &from.fakeStack,
                                 to.stackBottom, to.stackSize);
#else
  (void)leaving;
#endif
  kiln_emu_swap_x86_64(&from.sp, to.sp);
  afterSwitch(from);
}

#else // ucontext

namespace {
void ucontextStart() { fiberStart(); }
} // namespace

void fiberInit(FiberContext &fiber, void *stack, size_t size,
               void (*entry)(void *), void *arg) {
  fiber.entry = entry;
  fiber.arg = arg;
  fiber.stackBottom = stack;
  fiber.stackSize = size;
  fiber.fakeStack = nullptr;
  getcontext(&fiber.uc);
  fiber.uc.uc_stack.ss_sp = stack;
  fiber.uc.uc_stack.ss_size = size;
  fiber.uc.uc_link = nullptr;
  makecontext(&fiber.uc, ucontextStart, 0);
}

void fiberSwitch(FiberContext &from, FiberContext &to, bool leaving) {
  switchingFrom = &from;
  switchingTo = &to;
#if KILN_EMU_ASAN
  __sanitizer_start_switch_fiber(leaving ? nullptr : &from.fakeStack,
                                 to.stackBottom, to.stackSize);
#else
  (void)leaving;
#endif
  swapcontext(&from.uc, &to.uc);
  afterSwitch(from);
}

#endif

//===--- StackPool --------------------------------------------------------===//

StackPool::~StackPool() { release(); }

void StackPool::release() {
  for (void *m : mappings_)
    if (m)
      munmap(m, bytes_ + page_);
  mappings_.clear();
}

void StackPool::setStackBytes(size_t bytes) {
  if (!page_)
    page_ = size_t(sysconf(_SC_PAGESIZE));
  size_t rounded = (bytes + page_ - 1) / page_ * page_;
  if (rounded == bytes_)
    return;
  release();
  bytes_ = rounded;
}

Expected<void *> StackPool::stack(size_t index) {
  if (index >= mappings_.size())
    mappings_.resize(index + 1, nullptr);
  if (!mappings_[index]) {
    void *m = mmap(nullptr, bytes_ + page_, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
      return Status::error(fmt::format(
          "CUDA emulator: cannot map a {} KiB stack for emulated thread {}: {}",
          bytes_ / 1024, index, std::strerror(errno)));
    if (mprotect(m, page_, PROT_NONE) != 0) {
      munmap(m, bytes_ + page_);
      return Status::error(
          fmt::format("CUDA emulator: cannot protect a stack guard page: {}",
                      std::strerror(errno)));
    }
    mappings_[index] = m;
  }
  return static_cast<char *>(mappings_[index]) + page_;
}

} // namespace kiln::cuda::emu
