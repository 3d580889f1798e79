//===- TraceFile.h - A run's spans as a Chrome trace / Perfetto file -*- C++ -*-===//
//
// `kiln-run train --trace FILE` writes the spans of a step window
// (runtime/core/Trace.h) in the Chrome trace event format's JSON object form
// ({"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}),
// which ui.perfetto.dev, chrome://tracing and Perfetto's trace processor
// load (docs/profiling.md "Trace"):
//   - a process per device of the run ("rank 0 · cpu (2 threads)");
//   - its threads (tracks): "trainer" (steps, waits for data, host-to-device
//     copies, evaluations, checkpoints), "compute (queue 0)" (kernels,
//     GEMMs, copies, the waits for collectives, idle gaps), one per further
//     queue ("communication (queue 1)": collectives), one per inter-op
//     worker ("compute worker 1");
//   - complete events ("ph": "X", ts and dur in microseconds) named for
//     what a reader looks for: "gpt.kiln:41 softmax" (a kernel's first model
//     line and main op), "gemm 64x256x64 NT", "all_reduce", "wait
//     all_reduce", "data wait", "idle", with their model lines, FLOPs,
//     bytes and rates as args.
// Slices on one track nest properly (a slice that overlaps its neighbour
// by clock noise is clipped), which Perfetto requires.
//
// Several ranks: each renders its own events with its clock's offset from
// the earliest origin (gatherTrace), rank 0 writes the file.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_TRAIN_TRACEFILE_H
#define KILN_RUNTIME_TRAIN_TRACEFILE_H

#include "runtime/comm/Communicator.h"
#include "runtime/core/Program.h"
#include "runtime/core/Status.h"
#include "runtime/core/Trace.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kiln::train {

/// --trace-steps A:B: steps A (inclusive) to B (exclusive), the trainer's
/// step index (a progress line's step number minus one); 0 <= A < B.
Expected<std::pair<int64_t, int64_t>> parseTraceSteps(const std::string &text);

/// The steps a run of [start, end) traces for the window [from, to): that
/// window clipped to the run, or, for from < 0 (no --trace-steps), the 10
/// steps after 2 warm-up steps from `start` (from `start` when the run is
/// too short for a warm-up), clipped to the run. May be empty (from == to).
std::pair<int64_t, int64_t> traceWindow(int64_t from, int64_t to, int64_t start, int64_t end);

/// Checks that `path` can be written (without changing it), so a bad
/// --trace fails before training rather than after it.
Status checkTraceFile(const std::string &path);

/// One device's spans to render.
struct TraceSource {
  const Tracer *tracer = nullptr;
  const program::Program *program = nullptr;
  /// The process's name in the trace: "rank 0 · cpu (2 threads)".
  std::string process;
  /// The device's rank in the run (the file's pid is rank + 1).
  int pid = 0;
  /// Seconds added to every span's start: the tracer's origin minus the
  /// trace's common origin (the earliest of the run's tracers).
  double shift = 0;
};

/// The gaps on a step's compute track shorter than this are not shown as
/// "idle" slices (the loop's own bookkeeping between two steps).
constexpr double kMinIdleSeconds = 5e-6;

/// `src`'s events (metadata, then its slices, by track), as JSON objects
/// separated by commas without the enclosing array: the pieces
/// writeTraceFile() joins.
std::string renderTraceEvents(const TraceSource &src);

/// The tracer's origin on the host's steady clock, in nanoseconds since
/// the clock's epoch (processes on one host share it).
int64_t originNanos(const Tracer &t);

/// Writes the trace file: the event pieces of every device (empty pieces
/// are skipped) and `otherData` (key, already-rendered JSON value).
Status writeTraceFile(const std::string &path, const std::vector<std::string> &pieces,
                      const std::vector<std::pair<std::string, std::string>> &otherData);

/// A JSON string literal of `s` (quotes included).
std::string jsonString(const std::string &s);

/// `path` made absolute (symbolic links resolved) when it names an
/// existing file; otherwise as given.
std::string absolutePath(const std::string &path);

/// The otherData entries that say where the trace's model file and
/// artifact are, so a checker run from any folder finds them: `artifact`
/// (absolute), `model_file` (the model file's absolute path, which kilnc
/// records in the artifact; the path as compiled where the artifact
/// predates that), `model_file_name`, `model_file_sha256` (of its
/// contents) and `model_file_as_compiled` (the path kilnc was given, which
/// the kernels' model lines name).
std::vector<std::pair<std::string, std::string>>
traceSourceInfo(const std::string &artifact, const std::string &sourcePath,
                const std::string &sourceAbsPath, const std::string &sourceHash);

/// Multi-process runs: every rank renders its events (shifted to the
/// earliest rank's origin, exchanged through `c`) and rank 0 receives them
/// all, in rank order; the other ranks get an empty list. Collective over
/// `c` (every rank calls it); its calls fail after c's timeout.
Expected<std::vector<std::string>> gatherTrace(comm::Communicator &c, TraceSource src);

/// Every rank's `text` to rank 0, in rank order (the other ranks get an
/// empty list). Collective over `c`.
Expected<std::vector<std::string>> gatherText(comm::Communicator &c, std::string text);

} // namespace kiln::train

#endif // KILN_RUNTIME_TRAIN_TRACEFILE_H
