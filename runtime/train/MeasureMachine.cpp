//===- MeasureMachine.cpp - The planner's machine, measured ---------------===//
//
// What kilnc --parallel=auto's cost model needs of this machine
// (runtime/core/Machine.h), measured: the CPU's peak (measureCpuPeak), the
// in-process communicator's latency and bus bandwidth, and the GEMM shapes
// the candidates run, each timed through the CPU backend's GEMM.
//
//===----------------------------------------------------------------------===//
#include "runtime/train/Calibrate.h"

#include "runtime/comm/InProcess.h"
#include "runtime/core/Cpus.h"

#include <fmt/format.h>

#ifdef KILN_HAVE_BLAS
#include "runtime/cpu/Gemm.h"
#include "runtime/cpu/ThreadPool.h"
#endif

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

namespace kiln::train {
namespace {

/// Times `reps` iterations on every rank of an in-process world of `n`
/// threads, after two untimed ones: each copies `workBytes` between two
/// buffers of its own (compute between collectives, so that the ranks meet
/// as devices do, not in lockstep) and then, when `reduce`, all-reduces
/// `count` floats. The slowest rank's mean seconds per iteration.
bool timeAllReduce(int n, int64_t count, int64_t workBytes, bool reduce,
                   int reps, double &seconds, std::string &error) {
  auto comms = comm::makeInProcessCommunicators(n);
  std::vector<std::vector<float>> bufs(static_cast<size_t>(n));
  std::vector<std::vector<char>> src(static_cast<size_t>(n)),
      dst(static_cast<size_t>(n));
  std::vector<double> took(static_cast<size_t>(n), 0.0);
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      size_t i = size_t(r);
      bufs[i].assign(size_t(count), 1.0f);
      src[i].assign(size_t(workBytes), 1);
      dst[i].assign(size_t(workBytes), 0);
      auto &c = *comms[i];
      c.setTimeout(10);
      auto iteration = [&] {
        if (workBytes > 0)
          std::memcpy(dst[i].data(), src[i].data(), size_t(workBytes));
        if (!reduce)
          return true;
        Status s = c.allReduce(bufs[i].data(), bufs[i].data(), count,
                               ElementType::F32, comm::Reduction::Mean);
        if (!s)
          errors[i] = s.message();
        return bool(s);
      };
      for (int w = 0; w < 2; ++w)
        if (!iteration())
          return;
      auto t0 = std::chrono::steady_clock::now();
      for (int k = 0; k < reps; ++k)
        if (!iteration())
          return;
      took[i] =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
              .count() /
          reps;
    });
  for (auto &t : threads)
    t.join();
  for (const std::string &e : errors)
    if (!e.empty()) {
      error = "measuring the in-process all_reduce: " + e;
      return false;
    }
  seconds = *std::max_element(took.begin(), took.end());
  return true;
}

} // namespace

/// Times one call of each distinct float32 GEMM shape of `shapes` with the
/// CPU backend's GEMM, its parts run in order on one thread (a device's
/// thread), while every other core runs the same shape (the other devices).
void timeGemms(const std::vector<program::GemmParams> &shapes, planner::Machine &m) {
#ifdef KILN_HAVE_BLAS
  struct Shape {
    const program::GemmParams *g;
    std::vector<std::vector<float>> a, b, o; // per thread
    int64_t parts = 1;
    int reps = 1;
    double best = 1e30;
  };
  cpu::ThreadPool pool(m.cores);
  size_t c = size_t(m.cores);
  std::vector<Shape> todo(shapes.size());
  for (size_t i = 0; i < shapes.size(); ++i) {
    Shape &s = todo[i];
    s.g = &shapes[i];
    int64_t lhs = 0, rhs = 0, out = 0;
    cpu::gemmExtents(*s.g, lhs, rhs, out);
    s.a.assign(c, std::vector<float>(size_t(lhs), 0.5f));
    s.b.assign(c, std::vector<float>(size_t(rhs), 0.25f));
    s.o.assign(c, std::vector<float>(size_t(out), 0.0f));
    s.parts = cpu::gemmParts(*s.g);
    // Enough calls for ~0.2 ms at the peak rate, at least 1.
    double est = program::gemmFlops(*s.g) / (m.machineFlops / double(c));
    s.reps = int(std::clamp(2e-4 / std::max(est, 1e-9), 1.0, 50.0));
  }
  auto run = [&](Shape &s) {
    pool.forEach(m.cores, m.cores, [&](int64_t t) {
      size_t k = size_t(t);
      for (int r = 0; r < s.reps; ++r)
        for (int64_t part = 0; part < s.parts; ++part)
          cpu::matmulPart(*s.g, s.a[k].data(), s.b[k].data(), s.o[k].data(),
                          part, s.parts);
    });
  };
  // Rounds over every shape, the best of each: a neighbour's load in one
  // round then slows every layout's shapes alike, not one layout's.
  constexpr int rounds = 3;
  auto start = std::chrono::steady_clock::now();
  for (Shape &s : todo)
    run(s); // warm-up: pages, caches
  for (int round = 0; round < rounds; ++round)
    for (Shape &s : todo) {
      auto t0 = std::chrono::steady_clock::now();
      run(s);
      s.best = std::min(s.best, std::chrono::duration<double>(
                                    std::chrono::steady_clock::now() - t0)
                                    .count());
    }
  for (const Shape &s : todo)
    m.gemmSeconds[planner::gemmShapeKey(*s.g)] = s.best / s.reps;
  double total =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  m.gemmCalibration = fmt::format(
      "{} float32 GEMM shapes of the plans timed through the CPU backend's "
      "GEMM on 1 thread while all {} cores run one, best of {} rounds ({:.0f} "
      "ms)",
      shapes.size(), m.cores, rounds, total * 1e3);
#else
  m.gemmCalibration = "this kilnc has no BLAS: every GEMM at the sgemm rate";
#endif
}

bool measureMachine(int devices, planner::Machine &m, std::string &error) {
  m.devices = std::max(1, devices);
  m.cores = cpuBudget().usable(); // the CPUs kilnc may use, not the machine's
  // Every core at once (one sgemm and one copy block per thread), as N
  // devices that each use their share run together.
  auto peak = measureCpuPeak(m.cores);
  if (!peak) {
    error = peak.status().message();
    return false;
  }
  m.machineFlops = peak->flops;
  m.machineBandwidth = peak->bandwidth;
  shareMachine(m);
  m.calibration = peak->how;
  if (m.devices == 1) {
    m.commCalibration = "one device: no communication";
    m.commLatency = 0;
    m.commBusBandwidth = 1;
    return true;
  }
  // Latency: what a 4-byte all_reduce adds to a loop of 8 MiB copies on
  // every rank (the cost of meeting between compute, wake-ups included);
  // bandwidth: a 4 MiB all_reduce (the size of the gradient buckets of small
  // models) less the lockstep latency of a 4-byte one.
  constexpr int64_t work = int64_t(8) << 20;
  constexpr int64_t big = int64_t(1) << 20; // f32 elements
  double tSmall = 0, tBig = 0, meet = 1e30;
  if (!timeAllReduce(m.devices, 1, 0, true, 100, tSmall, error) ||
      !timeAllReduce(m.devices, big, 0, true, 8, tBig, error))
    return false;
  // The meeting cost is a difference of two noisy loop times: the smallest
  // of three interleaved rounds.
  for (int round = 0; round < 3; ++round) {
    double tWork = 0, tWorkSmall = 0;
    if (!timeAllReduce(m.devices, 1, work, false, 10, tWork, error) ||
        !timeAllReduce(m.devices, 1, work, true, 10, tWorkSmall, error))
      return false;
    meet = std::min(meet, tWorkSmall - tWork);
  }
  double n = double(m.devices);
  m.commLatency = std::max(tSmall, meet);
  m.commBusBandwidth =
      4.0 * double(big) * 2 * (n - 1) / n / std::max(tBig - tSmall, 0.2 * tBig);
  // Between copies the meeting can cost less than the loops' noise: the
  // difference is then at or below zero, and said to be nothing measurable.
  std::string between = meet >= 0.05e-6
                            ? fmt::format("{:.1f} us between 8 MiB copies", meet * 1e6)
                            : std::string("nothing measurable between 8 MiB copies");
  m.commCalibration = fmt::format(
      "in-process all_reduce(mean) over {} threads: 4 bytes {:.1f} us in "
      "lockstep and {} (best of 3); 4 MiB {:.2f} ms",
      m.devices, tSmall * 1e6, between, tBig * 1e3);
  return true;
}

} // namespace kiln::train
