//===- Counters.h - What a call of an entry point costs ---------*- C++ -*-===//
//
// Deterministic counters of a compiled plan, per entry point (@train_step,
// @eval_step, @predict): the kernels and GEMMs one call runs, its FLOPs and
// bytes moved as the plan estimates them, its collectives and their bytes,
// and the arena it needs. No timing: the same plan gives the same numbers
// on any machine, which makes them a performance guard's currency
// (`kilnc --emit=counters`, scripts/perf-guard.py, docs/testing.md
// "Performance guard").
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CORE_COUNTERS_H
#define KILN_RUNTIME_CORE_COUNTERS_H

#include "runtime/core/GemmPlan.h"
#include "runtime/core/GpuPlan.h"
#include "runtime/core/Program.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kiln::program {

/// One entry point's counters, for one call on one device (on a mesh, the
/// device with the largest arena, and with pipeline stages the steps it
/// runs: its stage's and the stage -1 ones).
struct FunctionCounters {
  std::string function;
  int64_t steps = 0; ///< plan steps of every kind
  /// Calls of generated kernels: kernel steps plus GEMM epilogue kernels.
  int64_t kernels = 0;
  int64_t gemms = 0;  ///< library matrix products
  int64_t attention = 0; ///< fused attention steps (forward and backward)
  int64_t copies = 0; ///< copy steps (updates that could not be in place)
  /// FLOP estimate: Kernel::flops of every generated kernel call plus
  /// 2*batch*m*n*k per GEMM (program::gemmFlops).
  int64_t flops = 0;
  /// Bytes moved, as the step loop's spans account them: every buffer a
  /// kernel, GEMM (and its epilogue) or copy names, once per argument.
  int64_t bytes = 0;
  int64_t collectives = 0;     ///< collective steps
  int64_t collectiveBytes = 0; ///< Collective::bytes summed (per device)
  /// Peak memory of the call: the persistent region (parameters, optimizer
  /// state) plus this function's scratch peak.
  int64_t peakBytes = 0;
  /// Ops computed inside kernels that fuse several ops (per call).
  int64_t fusedOps = 0;
  /// CUDA launches per call: every generated kernel launch (each program
  /// kernel's launch list; a GEMM's epilogue runs in the library call where
  /// it has one, the CUDA backend's default) plus every cuBLASLt call
  /// (cudaGemmCalls; a call may itself launch more than one kernel, e.g. a
  /// split-K reduction, which no plan can know), or -1 when the plan has no
  /// CUDA launches.
  int64_t cudaLaunches = -1;
  /// cuBLASLt calls per call of the function: each GEMM step's
  /// gpu::planGemm calls (runtime/core/GemmPlan.h), or -1 as cudaLaunches.
  int64_t cudaGemmCalls = -1;
  /// With CUDA launches: the GPU cost model's predicted milliseconds per call
  /// on each device of its table (runtime/core/GpuCost.h), rounded to 1 us,
  /// as ("h100_sxm", ms) pairs in the table's order.
  std::vector<std::pair<std::string, double>> gpuMs;
};

struct Counters {
  int devices = 1;
  int queues = 1;
  int64_t arenaBytes = 0;                  ///< the largest device arena
  int64_t persistentBytes = 0;             ///< its persistent region
  std::vector<FunctionCounters> functions; ///< in plan order

  /// JSON with a fixed key order (functions in plan order, counters in the
  /// order of FunctionCounters), ending in a newline.
  std::string toJson() const;
};

/// Counts `p`; `cudaLaunches` (per program kernel, as gpu::Plan::kernels)
/// adds FunctionCounters::cudaLaunches and cudaGemmCalls, with GEMMs split
/// into library calls as `gemmForm` says (KILN_GEMM_PLAN on the devices).
Counters
countPlan(const Program &p,
          const std::vector<std::vector<gpu::Launch>> *cudaLaunches = nullptr,
          gpu::GemmPlanForm gemmForm = gpu::GemmPlanForm::Heads);

} // namespace kiln::program

#endif // KILN_RUNTIME_CORE_COUNTERS_H
