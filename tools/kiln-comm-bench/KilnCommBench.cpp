//===- KilnCommBench.cpp - Kiln's all_reduce against a plain MPI_Allreduce ===//
//
//   mpirun -np 2 kiln-comm-bench [--sizes 1,4,16] [--iters 20] [--warmup 3]
//   [--json] kiln-comm-bench --in-process 2 [...]
//
// For each size (MiB of f32), times Kiln's all_reduce (sum, member-order,
// runtime/comm/Mpi.h) and MPI_Allreduce(MPI_SUM) of the same bytes, and
// prints milliseconds per call (the slowest rank's mean) and bandwidth:
// algbw = bytes / time, busbw = algbw * 2(n-1)/n (nccl-tests' convention,
// the bytes each rank moves in a ring all-reduce). --in-process N times the
// in-process communicator with N threads instead (no MPI). Only rank 0
// prints. bench/ uses --json.
//
//===----------------------------------------------------------------------===//

#include "runtime/comm/InProcess.h"
#include "runtime/comm/Mpi.h"

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>
#include <string>
#include <thread>
#include <vector>

using namespace kiln;
using namespace kiln::comm;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  std::vector<double> sizesMiB{1, 4, 16};
  int iters = 20, warmup = 3, inProcess = 0;
  bool json = false;
};

int usage(const char *why) {
  std::fprintf(
      stderr,
      "error: %s\nusage: mpirun -np N kiln-comm-bench [--sizes 1,4,16] "
      "[--iters 20] "
      "[--warmup 3] [--json]\n       kiln-comm-bench --in-process N [...]\n",
      why);
  return 1;
}

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct Row {
  double bytes, kilnMs, mpiMs; // mpiMs < 0: not measured
};

void print(const Options &o, int n, const char *kind,
           const std::vector<Row> &rows) {
  double bus = n > 1 ? 2.0 * (n - 1) / n : 1.0;
  if (o.json) {
    std::printf("{\"ranks\": %d, \"communicator\": \"%s\", \"dtype\": \"f32\", "
                "\"iters\": %d, "
                "\"rows\": [",
                n, kind, o.iters);
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row &r = rows[i];
      std::printf(
          "%s{\"bytes\": %.0f, \"kiln_ms\": %.4f, \"kiln_algbw_gbs\": %.3f, "
          "\"kiln_busbw_gbs\": %.3f",
          i ? ", " : "", r.bytes, r.kilnMs, r.bytes / r.kilnMs / 1e6,
          bus * r.bytes / r.kilnMs / 1e6);
      if (r.mpiMs >= 0)
        std::printf(", \"mpi_ms\": %.4f, \"mpi_algbw_gbs\": %.3f, "
                    "\"mpi_busbw_gbs\": %.3f",
                    r.mpiMs, r.bytes / r.mpiMs / 1e6,
                    bus * r.bytes / r.mpiMs / 1e6);
      std::printf("}");
    }
    std::printf("]}\n");
    return;
  }
  std::printf("all_reduce (sum, f32), %d ranks, %s communicator, %d iterations "
              "after %d warm-up\n",
              n, kind, o.iters, o.warmup);
  std::printf("%10s %10s %12s %12s", "MiB", "kiln ms", "kiln algbw",
              "kiln busbw");
  bool mpi = !rows.empty() && rows[0].mpiMs >= 0;
  if (mpi)
    std::printf(" %10s %12s %12s %8s", "MPI ms", "MPI algbw", "MPI busbw",
                "kiln/MPI");
  std::printf("\n");
  for (const Row &r : rows) {
    std::printf("%10.2f %10.3f %10.2f GB/s %7.2f GB/s", r.bytes / (1 << 20),
                r.kilnMs, r.bytes / r.kilnMs / 1e6,
                bus * r.bytes / r.kilnMs / 1e6);
    if (mpi)
      std::printf(" %10.3f %7.2f GB/s %7.2f GB/s %8.2f", r.mpiMs,
                  r.bytes / r.mpiMs / 1e6, bus * r.bytes / r.mpiMs / 1e6,
                  r.mpiMs / r.kilnMs);
    std::printf("\n");
  }
}

int runInProcess(const Options &o) {
  int n = o.inProcess;
  std::vector<Row> rows;
  for (double mib : o.sizesMiB) {
    int64_t count = int64_t(mib * (1 << 20) / 4);
    auto comms = makeInProcessCommunicators(n);
    std::vector<double> took(n);
    std::vector<Status> st(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        std::vector<float> send(count, 1.0f + r), recv(count);
        for (int i = 0; i < o.warmup + o.iters && st[r]; ++i) {
          if (i == o.warmup) {
            st[r] = comms[r]->allReduce(send.data(), recv.data(), 1,
                                        ElementType::F32,
                                        Reduction::Sum); // a barrier
            took[r] = 0;
          }
          auto t0 = Clock::now();
          st[r] = comms[r]->allReduce(send.data(), recv.data(), count,
                                      ElementType::F32, Reduction::Sum);
          if (i >= o.warmup)
            took[r] += seconds(t0, Clock::now());
        }
      });
    for (auto &t : threads)
      t.join();
    for (int r = 0; r < n; ++r)
      if (!st[r]) {
        std::fprintf(stderr, "error: %s\n", st[r].message().c_str());
        return 1;
      }
    double slowest = 0;
    for (double t : took)
      slowest = std::max(slowest, t);
    rows.push_back({double(count) * 4, slowest / o.iters * 1e3, -1});
  }
  print(o, n, "in-process", rows);
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char * {
      return i + 1 < argc ? argv[++i] : nullptr;
    };
    if (a == "--json") {
      o.json = true;
    } else if (a == "--iters" || a == "--warmup" || a == "--in-process") {
      const char *v = next();
      if (!v || std::atoi(v) < (a == "--warmup" ? 0 : 1))
        return usage(fmt::format("{} needs a positive number", a).c_str());
      (a == "--iters"    ? o.iters
       : a == "--warmup" ? o.warmup
                         : o.inProcess) = std::atoi(v);
    } else if (a == "--sizes") {
      const char *v = next();
      if (!v)
        return usage("--sizes needs a list of MiB, e.g. 1,4,16");
      o.sizesMiB.clear();
      for (const char *p = v; *p;) {
        char *end = nullptr;
        double s = std::strtod(p, &end);
        if (end == p || s <= 0)
          return usage(
              fmt::format("--sizes {}: not a list of positive MiB", v).c_str());
        o.sizesMiB.push_back(s);
        p = *end == ',' ? end + 1 : end;
      }
    } else if (a == "--help" || a == "-h") {
      usage("help");
      return 0;
    } else {
      return usage(fmt::format("unknown argument {}", a).c_str());
    }
  }
  if (o.inProcess)
    return runInProcess(o);

  Expected<std::unique_ptr<MpiCommunicator>> comm = MpiCommunicator::create();
  if (!comm) {
    std::fprintf(stderr, "error: %s\n", comm.status().message().c_str());
    return comm.status().exitCode();
  }
  MpiCommunicator &c = **comm;
  c.setTimeout(120);
  int n = c.size();
  std::vector<Row> rows;
  for (double mib : o.sizesMiB) {
    int64_t count = int64_t(mib * (1 << 20) / 4);
    std::vector<float> send(count, 1.0f + c.rank()), recv(count), ref(count);
    double kiln = 0, mpi = 0;
    for (int i = 0; i < o.warmup + o.iters; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      auto t0 = Clock::now();
      if (Status s = c.allReduce(send.data(), recv.data(), count,
                                 ElementType::F32, Reduction::Sum);
          !s) {
        std::fprintf(stderr, "error: %s\n", s.message().c_str());
        return 1;
      }
      auto t1 = Clock::now();
      MPI_Barrier(MPI_COMM_WORLD);
      auto t2 = Clock::now();
      MPI_Allreduce(send.data(), ref.data(), int(count), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
      auto t3 = Clock::now();
      if (i >= o.warmup) {
        kiln += seconds(t0, t1);
        mpi += seconds(t2, t3);
      }
    }
    // Integers in f32: every order gives the same sum, so the two agree.
    if (std::memcmp(recv.data(), ref.data(), count * 4) != 0) {
      std::fprintf(
          stderr,
          "error: rank %d: Kiln's all_reduce and MPI_Allreduce disagree\n",
          c.rank());
      return 2;
    }
    double times[2] = {kiln, mpi}, slowest[2];
    MPI_Allreduce(times, slowest, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    rows.push_back({double(count) * 4, slowest[0] / o.iters * 1e3,
                    slowest[1] / o.iters * 1e3});
  }
  if (c.rank() == 0)
    print(o, n, "mpi", rows);
  return 0;
}
