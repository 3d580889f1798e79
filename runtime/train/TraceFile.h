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
#include <functional>
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

/// A slice's argument: what the Chrome trace shows under "args" and the
/// TensorBoard profile (XPlane.h) as the event's stats.
struct TraceArg {
  enum Kind : uint8_t { Number, Bool, String, Strings };
  Kind kind = Number;
  std::string key;
  double value = 0;              ///< Number, Bool (0 or 1)
  std::string text;              ///< String
  std::vector<std::string> list; ///< Strings
  static TraceArg number(std::string key, double v) { return {Number, std::move(key), v, {}, {}}; }
  static TraceArg flag(std::string key, bool v) {
    return {Bool, std::move(key), v ? 1.0 : 0.0, {}, {}};
  }
  static TraceArg string(std::string key, std::string v) {
    return {String, std::move(key), 0, std::move(v), {}};
  }
  static TraceArg strings(std::string key, std::vector<std::string> v) {
    return {Strings, std::move(key), 0, {}, std::move(v)};
  }
};

/// The tracks of a device: the trainer's, queue 0's (kComputeTrack + q for
/// queue q), and inter-op worker w's (kWorkerTrack + w).
constexpr int kTrainerTrack = 1, kComputeTrack = 2, kWorkerTrack = 100;
/// "trainer", "compute (queue 0)", "communication (queue 1)", "compute worker 1".
std::string traceTrackName(int track);

/// One slice of the timeline: a span, or an idle gap of a step.
struct TraceSlice {
  int track = 0;
  int64_t begin = 0, end = 0; ///< nanoseconds since the trace's origin (src.shift applied)
  std::string name;           ///< "gpt.kiln:41 softmax", "gemm 64x256x64 NT", "step 3", "idle"
  std::string cat;            ///< the span's kind ("kernel", "gemm", ...; "idle")
  std::vector<TraceArg> args;
};

/// `src`'s slices, sorted by track and start, nested on each track (a
/// slice overlapping its neighbour by clock noise clipped), with the idle
/// gaps of each step on the compute track: what the Chrome trace and the
/// TensorBoard profile draw.
std::vector<TraceSlice> traceSlices(const TraceSource &src);

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

/// Renders one device's trace: renderTraceEvents (the Chrome trace's
/// events) or renderXSpace (XPlane.h: the TensorBoard profile's file).
using TraceRender = std::function<std::string(const TraceSource &)>;

/// Multi-process runs: every rank renders its events with `render`
/// (shifted to the earliest rank's origin, exchanged through `c`) and rank
/// 0 receives them all, in rank order; the other ranks get an empty list.
/// Collective over `c` (every rank calls it); its calls fail after c's
/// timeout.
Expected<std::vector<std::string>> gatherTrace(comm::Communicator &c, TraceSource src,
                                               const TraceRender &render = renderTraceEvents);

/// Every rank's `text` to rank 0, in rank order (the other ranks get an
/// empty list). Collective over `c`.
Expected<std::vector<std::string>> gatherText(comm::Communicator &c, std::string text);

} // namespace kiln::train

#endif // KILN_RUNTIME_TRAIN_TRACEFILE_H
