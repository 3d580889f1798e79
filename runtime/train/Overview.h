//===- Overview.h - Where a training step's time goes, from its spans -*- C++ -*-===//
//
// `kiln-run train --profile` records the spans of runtime/core/Trace.h for
// the steps after the first (profileWindow) and reads them here:
//
//   - the step-time breakdown: per profiled step, the time the loop's
//     thread spent waiting for data, copying the batch to the device, in
//     GEMMs, in generated kernels, in copies and waiting for collectives
//     (exposed communication), each from its spans (a span's time less the
//     spans nested in it), and idle: the gaps between consecutive spans of
//     the loop's thread inside the step, MEASURED, not a remainder (where
//     inter-op workers ran kernels during such a gap, that part of it is
//     compute: Span::thread > 0). So the
//     parts adding up to the measured step (the mean Step span) is a check
//     of the spans, printed with the breakdown ("parts add up to 99.2% of
//     the measured 41.3 ms/step"). The time collectives ran while the
//     loop's thread computed (overlapped) is shown, not summed.
//     Evaluations and checkpoint writes happen between steps: separate.
//   - one recommendation: the part that dominates, by the thresholds below
//     (docs/profiling.md "Overview").
//   - kernel stats: per generated kernel (by symbol), GEMM (by shape), copy
//     and collective (by op): calls, total and mean time, share of the step,
//     achieved GFLOP/s and GB/s from the compiler's estimates (a kernel's
//     FLOPs and argument bytes, a GEMM's 2mnk), the fraction of the
//     machine's measured peak its roofline bound is, model lines and the
//     ops it fuses.
//
// Only runtime/core: no MLIR, no backend. The machine's peak is measured by
// runtime/train/Calibrate.h (the CPU backend's BLAS).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_TRAIN_OVERVIEW_H
#define KILN_RUNTIME_TRAIN_OVERVIEW_H

#include "runtime/core/Program.h"
#include "runtime/core/Status.h"
#include "runtime/core/Trace.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::train {

struct TrainOptions;

/// Sets `o`'s trace window to what a profile covers: every step of the run
/// but its first `warmup` (compiling, first touches of memory, filling the
/// prefetch queue), via TrainOptions::traceWarmup. Steps before the window
/// are not recorded at all.
void profileWindow(TrainOptions &o, int64_t warmup = 1);

/// The machine's measured peak (Calibrate.h); 0: not measured.
struct MachinePeak {
  double flops = 0;     ///< FLOP/s of a large float32 GEMM
  double bandwidth = 0; ///< bytes/s of a streaming copy
  std::string how;      ///< "sgemm 2048^3 through OpenBLAS on 16 threads, ..."
};

/// Mean seconds per profiled step of each part (Overview.h's header).
struct Breakdown {
  int64_t steps = 0; ///< profiled steps (Step spans)
  int64_t firstStep = -1, lastStep = -1;
  double step = 0;           ///< mean Step span
  double input = 0;          ///< DataWait
  double hostToDevice = 0;   ///< HostToDevice
  double gemm = 0;           ///< Gemm
  double kernel = 0;         ///< Kernel
  double copy = 0;           ///< Copy
  double commExposed = 0;    ///< CollectiveWait
  double commOverlapped = 0; ///< a collective ran while the loop computed (not summed)
  double idle = 0;           ///< gaps on the loop's thread inside the step
  /// Kernel and GEMM calls per step, and their mean time.
  double kernelsPerStep = 0, meanKernel = 0;
  /// Between steps (not in the sum): evaluations and checkpoint writes.
  int64_t evals = 0, checkpoints = 0;
  double evalSeconds = 0, checkpointSeconds = 0; ///< totals
  /// The parts that add up to the step (every part but commOverlapped).
  double sum() const { return input + hostToDevice + gemm + kernel + copy + commExposed + idle; }
  /// sum() / step (1 when the spans tile the step exactly).
  double coverage() const { return step > 0 ? sum() / step : 0; }
};

/// The breakdown of the Step spans in `spans` (every other span is placed
/// by its time: the loop thread's spans inside a Step span are its parts).
Breakdown breakdown(const std::vector<Span> &spans);

/// One row of the kernel stats.
struct KernelStat {
  std::string kind; ///< "kernel", "gemm", "copy", "collective", "collective wait"
  std::string name; ///< symbol, GEMM label, "copy", collective op
  int64_t calls = 0;
  double seconds = 0;             ///< total over the profiled steps
  double flops = 0;               ///< total estimated FLOPs (0: none)
  double bytes = 0;               ///< total bytes (kernel arguments, collective bytes)
  double stepShare = 0;           ///< seconds / (profiled steps x mean step)
  double peakShare = 0;           ///< roofline bound / seconds (0: no peak measured)
  std::string bound;              ///< "compute" or "memory": which roof bounds it
  std::vector<std::string> lines; ///< model-file locations it serves
  std::vector<std::string> ops;   ///< ops it computes (fused), in order
  double mean() const { return calls ? seconds / double(calls) : 0; }
  double gflops() const { return seconds > 0 ? flops / seconds / 1e9 : 0; }
  double gbps() const { return seconds > 0 ? bytes / seconds / 1e9 : 0; }
};

/// Kernel stats of the spans inside the Step spans, sorted by total time
/// (longest first). `p` names kernels' lines and ops and GEMMs' lines.
std::vector<KernelStat> kernelStats(const std::vector<Span> &spans, const program::Program &p,
                                    const Breakdown &b, const MachinePeak &peak);

/// Thresholds of the recommendation (docs/profiling.md "Overview").
struct Thresholds {
  double input = 0.20;        ///< data wait + host-to-device above this share: input-bound
  double comm = 0.15;         ///< exposed communication above this share
  double idle = 0.20;         ///< idle above this share
  double launchKernels = 100; ///< at least this many kernels per step ...
  double launchMean = 10e-6;  ///< ... with a mean below this (seconds) ...
  double launchShare = 0.30;  ///< ... taking more than this share: launch-bound
  double compute = 0.50;      ///< GEMMs or generated kernels above this share
};

/// The one most important recommendation, in plain words: "input-bound:
/// ...", "communication-exposed: ...", "idle: ...", "launch-bound: ...",
/// "compute-bound in GEMMs: ...", "compute-bound in generated kernels:
/// ...", or "no single part dominates ...".
std::string recommend(const Breakdown &b, const std::vector<KernelStat> &stats,
                      const Thresholds &t = {});

/// The overview as kiln-run prints it: header (`who`: "rank 0 of 4 on
/// cpu:4", the peak), breakdown with its check, the recommendation, the top
/// `top` kernel stats rows and how many more there are.
std::string formatOverview(const Breakdown &b, const std::vector<KernelStat> &stats,
                           const MachinePeak &peak, const std::string &who, size_t top = 15);

/// A pipeline-parallel run's per-stage breakdown (docs/profiling.md
/// "Pipeline stages"): one device's row, from its own spans, for rank 0 to
/// print under the overview: its stage, mean step, compute (GEMMs, kernels,
/// copies) and its share, the exposed waits (for the neighbour's sends and
/// receives, and collectives) and idle time, their sum as the bubble, and
/// its `top` kernels by time per step.
std::string formatStageRow(const std::vector<Span> &spans, const program::Program &p, int rank,
                           int stage, size_t top = 3);

/// The header of the rows formatStageRow() makes.
std::string stageHeader();

/// Device `rank`'s position along mesh axis `axis` ("pp"), or -1 when the
/// mesh has no such axis.
int meshCoordinate(const program::Mesh &m, const std::string &axis, int rank);

/// Writes every row with every column to `path` as CSV (a header row,
/// numbers unformatted, lists ';'-separated).
Status writeStatsCsv(const std::string &path, const std::vector<KernelStat> &stats);

} // namespace kiln::train

#endif // KILN_RUNTIME_TRAIN_OVERVIEW_H
