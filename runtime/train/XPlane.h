//===- XPlane.h - A run's spans for TensorBoard's Profile tab ----*- C++ -*-===//
//
// `kiln-run train --tensorboard DIR` with a traced window (--trace FILE or
// --trace-steps A:B) also writes the trace where TensorBoard's profile
// plugin (PyPI tensorboard-plugin-profile, which serves xprof) finds it:
//
//   DIR/plugins/profile/<run>/rank<N>.xplane.pb
//
// one file per device of the run (the plugin's "hosts"), <run> the run's
// start in UTC ("2026_12_06_03_14_01", TensorFlow's own naming). The plugin
// reads nothing but XSpace protobufs there (its TOOLS table: `xplane.pb`;
// it builds the trace viewer, the overview and the other tools from them),
// so each file is one serialized tensorflow.profiler.XSpace (xplane.proto in
// tsl/profiler/protobuf), written from its published field numbers with the
// protobuf wire encoders of TensorBoard.h (no protobuf library):
//   XSpace: planes = 1, hostnames = 4
//   XPlane: id = 1, name = 2, lines = 3, event_metadata = 4 (map<int64,
//     XEventMetadata>), stat_metadata = 5 (map<int64, XStatMetadata>)
//   XLine: id = 1, name = 2, timestamp_ns = 3, events = 4, display_name = 11
//   XEvent: metadata_id = 1, offset_ps = 2, duration_ps = 3, stats = 4
//   XStat: metadata_id = 1, double_value = 2, int64_value = 4, str_value = 5
//   XEventMetadata / XStatMetadata: id = 1, name = 2
//   a map entry: key = 1, value = 2.
// The device's spans are the plane "/host:CPU" (the plane the plugin's
// trace viewer draws for a host), one line per track of the Chrome trace
// (TraceFile.h: "trainer", "compute (queue 0)", "communication (queue 1)",
// "compute worker 1"; displayed as "trainer — rank 0 · cpu (2 threads)"),
// each slice an event named as there, its args the event's stats.
// Times: as in the Chrome trace, from the earliest tracer's origin
// (timestamp_ns 0; events picoseconds from there: the plugin keeps times
// in int64 picoseconds, which nanoseconds since 1970 would overflow;
// docs/profiling.md "TensorBoard's Profile tab").
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_TRAIN_XPLANE_H
#define KILN_RUNTIME_TRAIN_XPLANE_H

#include "runtime/core/Status.h"
#include "runtime/train/TraceFile.h"

#include <ctime>
#include <string>
#include <utility>
#include <vector>

namespace kiln::train {

/// The plane the plugin's trace viewer shows a host's threads from.
constexpr const char *kHostPlaneName = "/host:CPU";

/// `src`'s slices (traceSlices) as a serialized XSpace of one plane, for
/// the machine `hostname`.
std::string renderXSpace(const TraceSource &src, const std::string &hostname);

/// This machine's name (gethostname; "localhost" when it has none).
std::string machineName();

/// The profile run's name for a run started at `t`: "YYYY_MM_DD_HH_MM_SS" (UTC).
std::string profileRunName(std::time_t t);

/// DIR/plugins/profile/<run>.
std::string profileRunDir(const std::string &logdir, const std::string &run);

/// The plugin's name of device `rank`'s file: "rank<N>" (+ ".xplane.pb").
std::string profileHostName(int rank);

/// Checks that the run directory can be made and written, without leaving
/// it behind, so a bad --tensorboard fails before training.
Status checkProfileDir(const std::string &logdir, const std::string &run);

/// Where writeProfile() wrote.
struct ProfileFiles {
  std::string dir;                ///< DIR/plugins/profile/<run>
  std::vector<std::string> files; ///< dir/<host>.xplane.pb, in the order given
};

/// Writes one `<host>.xplane.pb` per (host, serialized XSpace) into a new
/// run directory (made with its parents); empty spaces are skipped. When
/// `run` exists already (another run started in the same second), the
/// directory is `<run>_2`, `<run>_3`, ...: runs never mix their files.
Expected<ProfileFiles> writeProfile(const std::string &logdir, const std::string &run,
                                    const std::vector<std::pair<std::string, std::string>> &hosts);

} // namespace kiln::train

#endif // KILN_RUNTIME_TRAIN_XPLANE_H
