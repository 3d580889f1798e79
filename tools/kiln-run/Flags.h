//===- Flags.h - kiln-run's flags and output, shared by its commands -*- C++ -*-===//
//
// Private to tools/kiln-run: the flags of train, eval, sample and check,
// how errors and runtime/train's reports are printed, and the stop
// signals. Train.cpp is the train command, Commands.cpp the others.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_TOOLS_KILN_RUN_FLAGS_H
#define KILN_TOOLS_KILN_RUN_FLAGS_H

#include "runtime/core/Status.h"
#include "runtime/train/Devices.h"
#include "runtime/train/Launch.h"
#include "runtime/train/Trainer.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kiln::run {

using train::Channel;

/// `kiln-run train` under a launcher of several processes, until the
/// communicator exists: the first error (a flag, the artifact, --device) is
/// held here instead of printed, and the ranks agree on it once they can
/// talk (reportStartError()), so that it is printed once, by rank 0, and
/// names the ranks when not all of them hit it.
struct HeldError {
  bool hold = false;
  std::optional<Status> status;
};
extern HeldError gHeld;

/// Prints `s` as kiln-run's error (or holds it, see HeldError); returns the
/// exit code.
int fail(const Status &s);
/// A flag error: `m` and a pointer to --help.
int usage(const std::string &m);
/// Prints what runtime/train reports.
void print(Channel c, const std::string &text);
/// Command-line flags of train, eval, sample and check.
struct Flags {
  std::string artifact;
  int64_t steps = -1, logInterval = -1, evalInterval = -1, evalSteps = -1;
  int64_t epochs = -1; ///< --epochs (train): the steps of this many epochs
  std::string lastBatch; ///< --last-batch drop|wrap; "": the train section's
  int64_t checkpointEvery = -1, tokens = 200, topK = 0;
  int threads = 0;
  int interOpThreads = 1; ///< --inter-op-threads (CPU)
  std::string device = "cpu"; ///< cpu, cuda, cuda:N, cuda-emu
  std::string data, valData, checkpoint, resume, cacheDir, vocab, lossLog;
  std::string statsCsv; ///< --stats-csv: every kernel stats row (implies --profile)
  std::string prompt = "\n";
  bool promptGiven = false;
  double temperature = 0.8;
  double tolerance = 1e-4;   ///< kiln-run check
  double collectiveTimeout = 300; ///< seconds a collective may wait for the others
  bool threadsSet = false;
  std::string against = "cpu"; ///< kiln-run check: the reference device
  uint64_t seed = 0;
  bool seedSet = false, profile = false, noCache = false, quiet = false;
  bool inOrder = false; ///< .npy training data in file order, no shuffling
  bool allowBatchChange = false; ///< resume with another global batch
  bool logPlacement = false; ///< --log-placement: where each step runs, first
  std::string tensorboard; ///< --tensorboard DIR: scalars for TensorBoard
  int64_t prefetch = 3, dataWorkers = 1, shuffleBuffer = 0; ///< the input pipeline
  int64_t maxSkippedSteps = 100; ///< --max-skipped-steps (loss scaling; 0: never fail)
  std::vector<std::string> args; ///< as given (train: the resume hint repeats them)
  train::InitWeights init; ///< --init FILE, --init-rename FROM=TO, --init-ignore NAME
  std::string trace;    ///< --trace FILE (train)
  int64_t traceFrom = -1, traceTo = -1; ///< --trace-steps A:B; -1: the default window
  std::string profileRun; ///< the TensorBoard profile's run name (profileRunName)

  /// --tensorboard DIR with --trace FILE or --trace-steps A:B: the traced
  /// steps also go to DIR/plugins/profile (TensorBoard's Profile tab).
  bool tensorboardProfile() const {
    return !tensorboard.empty() && (!trace.empty() || traceFrom >= 0);
  }
  /// Some steps are traced: into --trace's file, the TensorBoard profile, or both.
  bool traced() const { return !trace.empty() || tensorboardProfile(); }
};

/// Counts are bounded so that nothing downstream overflows (a step count,
/// an ETA) or asks the system for more than it has (threads).
inline constexpr int64_t kMaxCount = 1'000'000'000'000; // 1e12
/// Threads a device's pool (or the inter-op pool) may start: far above any
/// machine's cores, below what the system refuses.
inline constexpr int64_t kMaxThreads = 1024;
/// A collective's deadline (seconds): a time point this far ahead still
/// fits the clocks' 64-bit nanoseconds (about 292 years) with room to spare.
inline constexpr double kMaxCollectiveTimeout = 1e7;

Status parseFlags(const std::vector<std::string> &args, Flags &f);
/// The device options the flags (and the environment) ask for.
train::DeviceOptions deviceOptions(const Flags &f);
/// The backend --device names, created as the flags say.
train::BackendFactory backendFor(const Flags &f);
/// Parses the flags and opens the artifact; returns 0, or the exit code.
int begin(const std::vector<std::string> &args, Flags &f, std::unique_ptr<train::Model> &m);
/// --log-placement: where each step of `fn` runs, on stdout.
void logPlacement(const train::Model &m, const std::string &fn);
std::optional<uint64_t> seedOf(const Flags &f);

/// Ctrl-C (SIGINT, SIGTERM, SIGUSR1) during training: the trainer stops
/// after the step and saves.
extern std::atomic<bool> gInterrupted;
/// As invoked (setProgram), for the resume hint.
extern std::string gProgram;
void catchStops();
void releaseStops();

} // namespace kiln::run

#endif // KILN_TOOLS_KILN_RUN_FLAGS_H
