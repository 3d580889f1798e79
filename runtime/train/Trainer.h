//===- Trainer.h - The training loop -----------------------------*- C++ -*-===//
//
// A Trainer runs @train_step of one Model for a range of steps: it feeds
// batches from a DataSource (prefetched on a thread), logs progress,
// evaluates on validation data, and writes checkpoints that a later run
// resumes from bit for bit (the program derives data windows and dropout
// seeds from (seed, step)).
//
// Replicas: a Trainer owns no global state. Its model (with the backend),
// data sources, output sink and stop flag all come from the caller, so N
// trainers can run as threads of one process or as N processes. Options
// carry rank and world size; rank 0 prints, writes the loss log and saves
// checkpoints, the others only train. A multi-device program (a mesh of N
// devices, docs/parallel.md) exchanges gradients inside @train_step through
// the model's communicator; the trainer gives each replica its part of
// every global batch (DataShard), its "replica" input, the step as the
// communicator's context for messages, agrees with the others on stopping,
// and gathers ZeRO-sharded state for checkpoints (Replicas.h runs them).
//
//   Trainer::open()    what `kiln-run train` does: data and resume
//                      checkpoint (or --init weights) from the options,
//                      then the backend
//   Trainer::create()  for a caller that made the backend and data itself
//   run()              the steps, then the final checkpoint
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_TRAIN_TRAINER_H
#define KILN_RUNTIME_TRAIN_TRAINER_H

#include "runtime/train/DataSource.h"
#include "runtime/train/Model.h"
#include "runtime/train/Output.h"
#include "runtime/core/Trace.h"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace kiln::train {

/// One step's metrics, for TrainOptions::onStep.
struct StepMetrics {
  int64_t step = 0;
  float loss = 0, gradNorm = 0, lr = 0;
  /// Loss scaling (fp16): the scale after this step and the steps skipped
  /// so far; NaN and -1 for a program without a scaler.
  float lossScale = NAN;
  int64_t skippedSteps = -1;
};

/// What the progress line says at each log interval, for TrainOptions::onLog
/// (rank 0 only; also with `quiet`).
struct LogPoint {
  int64_t step = 0;        ///< steps done (the progress line's "step N/...")
  double loss = 0;         ///< mean training loss over the interval
  float lr = 0, gradNorm = 0; ///< the interval's last step's
  double itemsPerSecond = 0;  ///< tokens (or samples) of the global batch per second
  bool tokens = false;        ///< whether the items are tokens
  double msPerStep = 0;       ///< mean wall time per step over the interval
  /// Loss scaling: the scale after the interval's last step and the steps
  /// skipped so far (overflowing gradients); NaN and -1 without a scaler.
  float lossScale = NAN;
  int64_t skippedSteps = -1;
};

/// An evaluation's result, for TrainOptions::onEval (rank 0 only).
struct EvalPoint {
  int64_t step = 0;     ///< steps done when it ran
  double loss = 0;      ///< mean validation loss
  double accuracy = -1; ///< classifiers only; < 0: none
};

/// Unset values (-1, "") take the model's train section or the defaults
/// kiln-run documents.
struct TrainOptions {
  std::string artifact; ///< the artifact's path: messages, the default checkpoint
  int64_t steps = -1;   ///< train up to this step (exclusive)
  /// Train this many epochs of .npy data (steps: DataSource::epochSteps);
  /// exclusive with `steps`. Default: the train section's steps or epochs.
  int64_t epochs = -1;
  /// Where an epoch's batches end (default: the train section's
  /// last_batch, else LastBatch::Wrap).
  std::optional<LastBatch> lastBatch;
  int64_t logInterval = -1; ///< default: the train section's, else 10
  int64_t evalInterval = -1; ///< 0: never evaluate
  int64_t evalSteps = -1;    ///< batches per evaluation (default 20)
  int64_t checkpointEvery = -1; ///< default: checkpoint_interval, else evalInterval; 0: only at the end
  std::string data, valData;    ///< token file or .npy directory
  std::string checkpoint;       ///< default MODEL.ckpt.safetensors
  std::string resume;           ///< a checkpoint to continue from
  /// Resume even though the artifact's global batch differs from the
  /// checkpoint's (otherwise refused: docs/parallel.md "Resuming keeps
  /// the global batch").
  bool allowBatchChange = false;
  /// --init: parameters from a safetensors file, optimizer state fresh
  /// (readInitWeights); not with `resume`.
  InitWeights init;
  std::string lossLog;          ///< "step loss grad_norm" per line
  std::optional<uint64_t> seed; ///< data seed (default: the train section's)
  bool inOrder = false;         ///< .npy data in file order, not shuffled
  bool quiet = false, profile = false;
  /// This replica's place among `worldSize` (rank 0 prints and saves).
  int rank = 0, worldSize = 1;
  /// Set (e.g. by a SIGINT handler) to stop after the current step; the
  /// trainer then saves a checkpoint and reports `interrupted`.
  const std::atomic<bool> *stop = nullptr;
  /// Called after every step (on every rank).
  std::function<void(const StepMetrics &)> onStep;
  /// Called on rank 0 at each log interval and after each evaluation (the
  /// TensorBoard writer, runtime/train/TensorBoard.h).
  std::function<void(const LogPoint &)> onLog;
  std::function<void(const EvalPoint &)> onEval;
  /// Where this replica's spans go (runtime/core/Trace.h), or null: the
  /// trainer attaches it to the backend (Backend::setTracer) and records,
  /// for steps in [traceFrom, traceTo), every plan step plus one span per
  /// training step (Span::Step: from the wait for its batch to its loss
  /// read back), the wait for data (DataWait), the batch's copy to the
  /// device (HostToDevice), evaluations (Eval) and checkpoint writes
  /// (Checkpoint). Not owned.
  Tracer *tracer = nullptr;
  /// traceFrom < 0: the default window, train::traceWindow() (TraceFile.h).
  int64_t traceFrom = 0, traceTo = INT64_MAX;
  /// Steps at the start of this run (after a resume: from its step) left
  /// out of the window (warm-up; Overview.h's profileWindow sets it).
  int64_t traceWarmup = 0;
  /// Set by whoever runs several replicas when one of them failed: the
  /// others stop waiting (a stalled replica of a fault test wakes).
  const std::atomic<bool> *cancel = nullptr;
  /// The input pipeline (docs/runtime.md "The input pipeline"): batches
  /// the loader runs ahead of the step, and threads making them (results
  /// do not depend on either); .npy training rows shuffled through a window
  /// of this many rows (0: a uniform permutation per epoch, as without it);
  /// seconds a step waits for its batch before the run fails.
  int prefetch = 3, dataWorkers = 1;
  int64_t shuffleBuffer = 0;
  double dataTimeout = 600;
  /// Loss scaling (docs/training.md "When every step is skipped"): the run
  /// fails when this many steps in a row were skipped (overflowing
  /// gradients), or when every step of a run was; 0: never fails on skips
  /// (the warning at kWarnSkippedInARow in a row stays).
  int64_t maxSkippedSteps = 100;
};

/// Steps in a row the loss scaler skipped before the trainer warns (once).
inline constexpr int64_t kWarnSkippedInARow = 10;

struct TrainResult {
  int64_t start = 0;  ///< the first step this run took
  int64_t next = 0;   ///< the step a resume continues from
  float loss = 0;     ///< the last step's loss
  double valLoss = 0; ///< the last evaluation's loss (NaN: none)
  double seconds = 0;
  bool interrupted = false; ///< stopped by TrainOptions::stop
  /// Left the run on purpose (KILN_FAULT_INJECT=rank-exit in-process): the
  /// other replicas find it missing at their next collective.
  bool left = false;
  std::string checkpoint;   ///< where it was saved
};

/// A fault for tests (KILN_FAULT_INJECT, docs/testing.md): `rank-exit@S:R`
/// makes rank R leave the run when step S starts (a process ends with exit
/// code 3; an in-process replica stops without a word), `rank-stall@S:R`
/// makes it stop responding there (it sleeps until cancelled or killed).
/// Parsed from `spec`; none for other specs (the checkpoint faults).
struct RankFault {
  enum Kind { None, Exit, Stall } kind = None;
  int64_t step = 0;
  int rank = 0;
  static RankFault parse(const char *spec);
};

/// A slow data source for tests (KILN_FAULT_INJECT=slow-data@MS,
/// docs/testing.md): producing each training batch takes MS milliseconds
/// more, in the prefetching thread (so enough prefetch could hide it).
struct DataFault {
  int64_t slowMs = 0;
  static DataFault parse(const char *spec);
};

class Trainer {
public:
  /// Opens the data and the resume checkpoint (or the --init weights)
  /// named in `o` (errors before any kernel is compiled), creates the
  /// backend with `make`, writes the --init parameters, then as create().
  static Expected<std::unique_ptr<Trainer>> open(Model &m, const TrainOptions &o,
                                                 const BackendFactory &make, Sink out);
  /// `m` has its backend (Model::compile/attach); `val` may be null.
  /// Applies `resume`, says what will run, opens the loss log.
  static Expected<std::unique_ptr<Trainer>> create(Model &m, const TrainOptions &o,
                                                   std::shared_ptr<const DataSource> train,
                                                   std::shared_ptr<const DataSource> val,
                                                   const ckpt::Checkpoint *resume, Sink out);
  ~Trainer();
  Trainer(const Trainer &) = delete;
  Trainer &operator=(const Trainer &) = delete;

  /// Trains until the last step, a stop request, or a non-finite loss (an
  /// error; the checkpoint is then left as it was), and saves a checkpoint.
  Expected<TrainResult> run();

private:
  Trainer(Model &m) : m_(m) {}
  bool leader() const { return o_.rank == 0; }
  void say(Channel c, const std::string &text) const;
  /// Whether to stop after this step: the stop flag, agreed between the
  /// replicas of a multi-device run (a MAX all-reduce) so all stop together.
  Expected<bool> agreeStop(int64_t step);
  /// Before the first step: every rank runs the same steps (start, end),
  /// evaluates and checkpoints at the same steps and draws from the same
  /// data seed; ranks launched with different options would wait for each
  /// other's collectives until the deadline. An error naming the ranks and
  /// the settings that differ from rank 0's.
  Status agreeOnRun();
  /// Applies fault_ at the start of `step`; true: leave the run.
  bool injectFault(int64_t step);

  Model &m_;
  TrainOptions o_;
  Sink out_;
  std::shared_ptr<const DataSource> train_, val_;
  uint64_t seed_ = 0;
  int64_t start_ = 0, steps_ = 0, evalInterval_ = 0, evalSteps_ = 0, ckptEvery_ = 0;
  int64_t epochs_ = 0; ///< training by epochs: how many (0: by steps)
  std::string ckptPath_;
  std::vector<int> inputs_;
  int replicaIn_ = -1;
  /// A data-parallel step that agrees on stopping itself (its scalars'
  /// one all_reduce, docs/parallel.md "Scalars in one exchange"): the
  /// "stop" input this process's flag goes into, and the "stop" output,
  /// the count of devices that asked; -1 where the step has none.
  int stopIn_ = -1, stopOut_ = -1;
  float stopVotes_ = 0; ///< the last step's "stop" output

  int tpRankIn_ = -1; ///< "tp_rank" (Model::tpRankInput)
  RankFault fault_;
  DataFault dataFault_;
  int stepIn_ = -1, lossId_ = -1, normId_ = -1, lrId_ = -1;
  /// Loss scaling's outputs (docs/training.md), -1 without a scaler.
  int scaleId_ = -1, skippedId_ = -1;
  int64_t items_ = 0; ///< tokens or samples per step
  bool tokens_ = false;
  std::FILE *lossLog_ = nullptr;
};

} // namespace kiln::train

#endif // KILN_RUNTIME_TRAIN_TRAINER_H
