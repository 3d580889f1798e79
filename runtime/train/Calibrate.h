//===- Calibrate.h - The machine's measured peak, for the kernel stats -*- C++ -*-===//
//
// A profiled run measures once, at its start, what this machine can do, so
// the kernel stats can say how close each kernel comes to it (Overview.h):
// float32 GEMM FLOP/s through the CPU backend's BLAS (runtime/cpu/Blas.h)
// with the run's thread count, on square 1024 x 1024 matrices split into
// row blocks as the executor splits its GEMMs; and memory bandwidth from a
// streaming copy of 128 MiB (counted as read + written, as the kernel stats
// count a kernel's arguments). Best of three runs each; ~0.3 s in all.
// It also measures the machine kilnc --parallel=auto plans for
// (measureMachine, timeGemms).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_TRAIN_CALIBRATE_H
#define KILN_RUNTIME_TRAIN_CALIBRATE_H

#include "runtime/core/Machine.h"
#include "runtime/core/Status.h"
#include "runtime/train/Overview.h"

#include <string>
#include <vector>

namespace kiln::train {

/// Measures the CPU's peak with `threads` threads; an error where this
/// build has no BLAS.
Expected<MachinePeak> measureCpuPeak(int threads);

/// The parallelism planner's machine (runtime/core/Machine.h), measured
/// for `devices` in-process devices sharing the CPUs this process may use
/// (MeasureMachine.cpp, about 0.5 s): the CPU's peak, and over more than
/// one device the in-process all_reduce's latency and bus bandwidth.
/// Returns false with `error` set where this build cannot measure.
bool measureMachine(int devices, planner::Machine &m, std::string &error);

/// Times one call of each float32 GEMM shape of `shapes` with the CPU
/// backend's GEMM on one thread while every other core runs the same shape
/// (the other devices), into `m.gemmSeconds` (by gemmShapeKey); says how
/// in `m.gemmCalibration`. Without a BLAS: none timed, and says so.
void timeGemms(const std::vector<program::GemmParams> &shapes, planner::Machine &m);

} // namespace kiln::train

#endif // KILN_RUNTIME_TRAIN_CALIBRATE_H
