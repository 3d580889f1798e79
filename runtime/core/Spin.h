//===- Spin.h - Spin briefly for a condition before blocking -----*- C++ -*-===//
//
// Kernels and plan steps are often tens of microseconds long, far shorter
// than a futex sleep and wake, so a thread waiting for one spins first.
// The spin yields the core every 16 pauses (about a microsecond): where the
// thread it waits for shares this core (other processes hold the rest), a
// spin that never yields keeps it from running for a whole time slice.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CORE_SPIN_H
#define KILN_RUNTIME_CORE_SPIN_H

#include <chrono>
#include <sched.h>

namespace kiln {

/// Spins until `ready()` is true (returns true) or about `micros`
/// microseconds have passed (returns false; the caller then blocks).
template <typename Ready> bool spinUntil(Ready ready, int micros) {
  auto start = std::chrono::steady_clock::now();
  for (int i = 0;; ++i) {
    if (ready())
      return true;
    if ((i & 15) == 15)
      sched_yield();
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
    if ((i & 63) == 63 &&
        std::chrono::steady_clock::now() - start > std::chrono::microseconds(micros))
      return false;
  }
}

} // namespace kiln

#endif // KILN_RUNTIME_CORE_SPIN_H
