//===- Machine.h - The machine as the parallelism planner sees it -*- C++ -*-===//
//
// The constants the planner's cost model (compiler/planner/Planner.h)
// predicts a layout's step time from, as data: the CPU's GEMM FLOP/s and
// copy bandwidth, the communicator's latency and bus bandwidth, and the
// seconds of each GEMM shape the candidates run. The runtime measures them
// (runtime/train/Calibrate.h: measureMachine, timeGemms); a test gives them
// (kilnc --planner-machine).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CORE_MACHINE_H
#define KILN_RUNTIME_CORE_MACHINE_H

#include "runtime/core/Program.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <string>

namespace kiln::planner {

/// The machine as the cost model sees it, per device of N in-process
/// devices sharing `cores` cores.
struct Machine {
  bool measured = true; ///< false: constants given (parseMachine)
  int cores = 1;
  int devices = 1;
  int threadsPerDevice = 1;
  double coreShare =
      1; ///< cores each device gets: min(threads, cores / devices)
  double machineFlops = 0;     ///< sgemm FLOP/s of all cores at once
  double machineBandwidth = 0; ///< copy bytes/s of all cores at once
  double deviceFlops = 0, deviceBandwidth = 0; ///< machine * coreShare / cores
  double commLatency = 0; ///< seconds per collective call (a 4-byte all_reduce)
  double commBusBandwidth = 0; ///< bytes/s, nccl-tests' busbw of an all_reduce
  std::string calibration;     ///< how the compute constants were measured
  /// Seconds of one call of each float32 GEMM shape the candidates run
  /// (by gemmShapeKey), timed on one thread while every core runs one.
  std::map<std::string, double> gemmSeconds;
  std::string gemmCalibration;
  std::string
      commCalibration; ///< how the communication constants were measured
};

/// Each device's share of the machine, from cores, devices and the
/// machine's rates: kiln-run's split of the cores between in-process
/// replicas (threadsPerDevice, coreShare) and that share of the rates
/// (deviceFlops, deviceBandwidth).
inline void shareMachine(Machine &m) {
  m.threadsPerDevice = std::max(1, m.cores / m.devices);
  m.coreShare = std::min(double(m.threadsPerDevice), double(m.cores) / double(m.devices));
  m.deviceFlops = m.machineFlops * m.coreShare / double(m.cores);
  m.deviceBandwidth = m.machineBandwidth * m.coreShare / double(m.cores);
}

/// The machine from its totals, in the units kilnc --planner-machine and the
/// machine file write them: GFLOP/s, GB/s, microseconds, GB/s of bus
/// bandwidth; each device's share follows (shareMachine).
inline void setMachineTotals(Machine &m, int cores, double gflops, double gbps, double latencyUs,
                             double busbwGbps) {
  m.cores = std::max(1, cores);
  m.machineFlops = gflops * 1e9;
  m.machineBandwidth = gbps * 1e9;
  shareMachine(m);
  m.commLatency = latencyUs * 1e-6;
  m.commBusBandwidth = busbwGbps * 1e9;
}

/// The key of a GEMM shape in Machine::gemmSeconds: its label and layouts.
inline std::string gemmShapeKey(const program::GemmParams &g) {
  auto lay = [](const program::MatrixLayout &l) {
    return fmt::format("{}/{}/{}", l.outer, l.inner, l.ld);
  };
  return fmt::format("{} {} {} {} {} {}{}", program::gemmLabel(g), g.heads, lay(g.lhsLayout),
                     lay(g.rhsLayout), lay(g.outLayout), g.lhsBatched ? "B" : "-",
                     g.rhsBatched ? "B" : "-");
}

/// The machine file `kiln-run devices --calibrate` writes and `kilnc
/// --parallel=auto --machine FILE` reads: a first line "kiln-machine 1",
/// then `key = value` lines (devices, cores, gflops, gbps, latency-us,
/// busbw-gbps: machine totals; calibration and comm-calibration: quoted
/// text), `#` comments.
std::string machineFileText(const Machine &m);
/// Reads a machine file (`path` names it in messages: "path:line: why").
/// The GEMM shapes are not in it: the planner times them (measured = true).
bool parseMachineFile(const std::string &text, const std::string &path, Machine &m,
                      std::string &error);

} // namespace kiln::planner

#endif // KILN_RUNTIME_CORE_MACHINE_H
