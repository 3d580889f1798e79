//===- Planner.h - kilnc --parallel=auto: choose pp x dp x tp -*- C++ -*-===//
//
// The parallelism planner (docs/parallel.md "The planner"). For a device
// count N it compiles every layout pp x dp x tp = N (ZeRO 0, 1, 2 where
// dp > 1, tp = 1 and pp = 1; 1, 2, 4 or 8 micro-batches where pp > 1) in
// process, as kilnc would with --devices N --pp P --tp T --zero K
// --micro-batches M,
// reads each per-device plan (memory, GEMM FLOPs, kernel bytes, collectives)
// and predicts its step time from the machine's constants, which it takes
// as data (runtime/core/Machine.h): measured by the runtime at planning
// time (runtime/train/Calibrate.h: sgemm FLOP/s and copy bandwidth, the
// in-process communicator's all-reduce latency and bandwidth, the
// candidates' GEMM shapes timed), which kilnc passes in (MachineProbe), or
// given (--planner-machine). It ranks the layouts that fit the memory
// budget by predicted time per training row and explains the choice.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_COMPILER_PLANNER_PLANNER_H
#define KILN_COMPILER_PLANNER_PLANNER_H

#include "runtime/core/Machine.h"
#include "runtime/core/Program.h"
#include "runtime/core/Status.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace kiln::planner {

/// The machine from given constants instead of measurements (kilnc
/// --planner-machine, for tests): "cores=2,gflops=100,gbps=20,latency-us=50,
/// busbw-gbps=4", totals for the machine; GEMMs then run at the sgemm rate.
bool parseMachine(const std::string &text, int devices, Machine &m,
                  std::string &error);

/// How the planner learns the machine it plans for: kilnc passes the
/// runtime's measurements (runtime/train/Calibrate.h: measureMachine,
/// timeGemms); a front end without them gives constants (parseMachine).
struct MachineProbe {
  /// Measures the machine for N in-process devices; false with `error`
  /// set where it cannot.
  std::function<bool(int devices, Machine &m, std::string &error)> measure;
  /// Times the candidates' float32 GEMM shapes into Machine::gemmSeconds.
  std::function<void(const std::vector<program::GemmParams> &shapes, Machine &m)> timeGemms;
};

/// One collective axis's traffic in a step.
struct AxisTraffic {
  int64_t count = 0;
  int64_t bytes =
      0; ///< Collective::bytes summed (what each device contributes)
};

/// One pipeline stage of a candidate (pp > 1): its devices' plan and the
/// replay of the steps they run (the stage's and those of stage -1).
struct StageCost {
  int64_t arenaBytes = 0, persistentBytes = 0; ///< its largest device plan
  double seconds = 0;        ///< the replay of its steps, all micro-batches
  double computeSeconds = 0; ///< GEMMs, kernels and copies of those steps
};

struct Candidate {
  int64_t pp = 1, dp = 1, tp = 1;
  int64_t microBatches = 1; ///< pp > 1: grad_accum = micro-batches per step
  /// pp > 1: model chunks per device; above 1 the interleaved 1F1B schedule
  /// (--pipeline interleaved --virtual-stages V), else plain 1F1B.
  int64_t virtualStages = 1;
  int zero = 0;
  bool applicable = true;
  std::string reason;       ///< why not applicable (the compiler's first line)
  program::Program program; ///< the per-device plan (kept until predicted)
  // From the per-device plan of @train_step.
  int64_t peakBytes = 0, persistentBytes = 0, arenaBytes = 0;
  int64_t gemmFlops = 0;             ///< GEMM FLOPs per device per step
  int64_t gemms = 0, timedGemms = 0; ///< GEMM steps, those with a timed shape
  int64_t kernelBytes =
      0; ///< bytes named by non-GEMM kernels, epilogues and copies
  int64_t steps = 0;
  std::map<std::string, AxisTraffic> traffic; ///< by mesh axis
  int64_t rowsPerStep = 0;       ///< global batch: dp * batch * grad_accum
  std::vector<StageCost> stages; ///< pp > 1: per stage, in stage order
  /// pp > 1: send/recv transfers per step (a send and its recv count once)
  /// and their bytes; their predicted seconds, and the bubble's.
  int64_t transfers = 0, transferBytes = 0;
  double transferSeconds = 0, bubbleSeconds = 0;
  // The prediction (seconds per step).
  double gemmSeconds = 0, kernelSeconds = 0, commSeconds = 0,
         exposedCommSeconds = 0;
  double stepSeconds = 0;
  bool fits = true;

  /// "dp=2 tp=1 zero=0"; with pp > 1 "pp=2 dp=1 tp=1 M=4" (ZeRO is 0),
  /// interleaved "pp=2 dp=1 tp=1 M=4 V=2".
  std::string layout() const;
  std::string flags() const; ///< "--devices 2 --pp 2 --micro-batches 4"
  /// The pipeline's idle fraction (p - 1) / (V M + p - 1); 0 without one.
  double bubbleFraction() const {
    return pp > 1 ? double(pp - 1) / double(virtualStages * microBatches + pp - 1) : 0;
  }
  double secondsPerRow() const { return stepSeconds / double(rowsPerStep); }
  int64_t memoryBytes() const { return std::max(peakBytes, arenaBytes); }
};

struct Options {
  int64_t devices = 1;
  std::optional<int64_t> budgetBytes; ///< memory per device
  bool fusion = true;
  /// A layout with a larger model-parallel degree pp x tp (then a larger
  /// tp) is chosen over one with a smaller only when it is predicted faster
  /// per row by more than this fraction: the
  /// spread of the predictions against measured step times
  /// (docs/parallel.md "The planner").
  double margin = 0.10;
  std::string modelName, modelPath;
  /// A machine file (kiln-run devices --calibrate) to read instead of
  /// measuring the machine (kilnc --machine).
  std::string machineFile;
};

struct Result {
  std::vector<Candidate> candidates; ///< in enumeration order
  std::vector<size_t> ranking;       ///< applicable candidates, best first
  std::optional<size_t> fastest;     ///< the best predicted that fits
  /// The best of the smallest pp x tp (then tp) that fits within the margin
  /// of `fastest`.
  std::optional<size_t> chosen;
  std::string error; ///< set when nothing fits (exit 1)
};

/// Compiles every layout of `module` (as the frontend built it; it is not
/// changed), times the float32 GEMM shapes their plans run (into
/// `machine.gemmSeconds`, through `probe` where the machine was measured)
/// and predicts each. `diagnostics` is the string the
/// context's diagnostic handler appends to; the planner clears it per
/// candidate.
Result plan(mlir::ModuleOp module, const Options &options, Machine &machine,
            const MachineProbe &probe, std::string &diagnostics);

/// The report: machine constants, the model, the ranked table, the choice.
void printReport(const Result &r, const Options &options,
                 const Machine &machine, llvm::raw_ostream &os);

/// kilnc --parallel=auto over `module` (configured; a model with @forward):
/// the machine measured through `probe`, or from `machineSpec`
/// (parseMachine) where given,
/// every layout planned, the report printed to `os` and the chosen layout set
/// on `module` (setLayout). options.devices 0: the train section's (1
/// without one); options.modelName empty: the module's name or the model
/// file's stem. Fails with a user error naming the flags.
Status chooseLayout(mlir::ModuleOp module, Options &options,
                    const std::optional<std::string> &machineSpec, const MachineProbe &probe,
                    std::string &diagnostics, llvm::raw_ostream &os);

/// Parses "123", "64MiB", "1.5 GiB", "512KiB" into bytes; false when it is
/// none of those.
bool parseSize(const std::string &text, int64_t &bytes);

} // namespace kiln::planner

#endif // KILN_COMPILER_PLANNER_PLANNER_H
