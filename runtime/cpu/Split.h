//===- Split.h - How many threads a step is worth ----------------*- C++ -*-===//
//
// The CPU executor hands a step's pieces (a split kernel's row pieces, a
// GEMM's parts) to the thread pool only when the step is long enough for a
// second thread to pay for itself: waking a worker, moving the step's data
// to another core's cache and waiting for the last piece cost microseconds,
// and a small model's kernels take one or two. The decision depends on the
// step's size only (never on timing), and it changes only which thread runs
// a piece, never the pieces: results are bit-identical whatever it decides.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CPU_SPLIT_H
#define KILN_RUNTIME_CPU_SPLIT_H

#include <cstdint>

namespace kiln::cpu {

/// The rates behind the estimate, measured on the development machines
/// (docs/runtime.md "Threads"): one thread's arithmetic in generated
/// kernels and in BLAS, its memory traffic, and the single-thread time a
/// step must have per thread it is given.
struct SplitModel {
  double kernelFlopsPerNs = 20; ///< generated kernels (exp, division, ...)
  double gemmFlopsPerNs = 50;   ///< BLAS sgemm on small and middle shapes
  double bytesPerNs = 20;       ///< reads plus writes, cache to core
  double minNanosPerThread = 10000;
};

/// The model in use: the defaults, or KILN_SPLIT_MIN_US (the single-thread
/// microseconds a step needs per thread; 0 splits every step) read once.
const SplitModel &splitModel();

/// Estimated single-thread nanoseconds of a generated kernel call, or of
/// a GEMM (`gemm`: flops at the BLAS rate).
double estimateNanos(const SplitModel &m, double flops, double bytes, bool gemm);

/// The number of threads to run a step of `pieces` independent pieces and
/// `nanos` estimated single-thread time on, out of `threads`: 1 (run it
/// inline, on the calling thread) below 2 * minNanosPerThread, else
/// nanos / minNanosPerThread, at most `threads` and `pieces`.
int splitThreads(const SplitModel &m, double nanos, int64_t pieces, int threads);

} // namespace kiln::cpu

#endif // KILN_RUNTIME_CPU_SPLIT_H
