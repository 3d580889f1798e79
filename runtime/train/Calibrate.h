//===- Calibrate.h - The machine's measured peak, for the kernel stats -*- C++ -*-===//
//
// A profiled run measures once, at its start, what this machine can do, so
// the kernel stats can say how close each kernel comes to it (Overview.h):
// float32 GEMM FLOP/s through the CPU backend's BLAS (runtime/cpu/Blas.h)
// with the run's thread count, on square 1024 x 1024 matrices split into
// row blocks as the executor splits its GEMMs; and memory bandwidth from a
// streaming copy of 128 MiB (counted as read + written, as the kernel stats
// count a kernel's arguments). Best of three runs each; ~0.3 s in all.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_TRAIN_CALIBRATE_H
#define KILN_RUNTIME_TRAIN_CALIBRATE_H

#include "runtime/core/Status.h"
#include "runtime/train/Overview.h"

namespace kiln::train {

/// Measures the CPU's peak with `threads` threads; an error where this
/// build has no BLAS.
Expected<MachinePeak> measureCpuPeak(int threads);

} // namespace kiln::train

#endif // KILN_RUNTIME_TRAIN_CALIBRATE_H
