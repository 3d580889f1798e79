// What a parallelFor costs on this machine (issue 15 item 5): for a body of
// W microseconds of arithmetic split in two, the time of the call inline
// (one thread) and on a 2-thread pool, with G microseconds of serial work
// between calls (the worker spinning for G < KILN_SPIN_US, else asleep).
// Build and run from the repository root after building kiln-run:
//   g++ -O2 -std=c++17 -I. bench/threads/pool_overhead.cpp \
//     build/runtime/cpu/libKilnRuntimeCpu.a -lpthread -o build/pool_overhead
//   build/pool_overhead
#include "runtime/cpu/ThreadPool.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

using Clock = std::chrono::steady_clock;

static volatile double sink;
/// About `us` microseconds of dependent arithmetic (calibrated below).
static double spinWork(double iters) {
  double x = 1.0;
  for (long i = 0; i < long(iters); ++i)
    x = x * 1.0000001 + 1e-9;
  return x;
}

int main() {
  auto t0 = Clock::now();
  sink = spinWork(1e7);
  double itersPerUs = 1e7 / std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  kiln::cpu::ThreadPool pool(2);
  std::printf("work_us gap_us  inline_us  pool_us  helped  (medians of 2000 calls; helped: calls a worker ran a chunk of)\n");
  for (double gap : {0.0, 50.0, 1000.0})
    for (double w : {1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0}) {
      std::vector<double> in, par;
      int helped = 0;
      for (int r = 0; r < 2000; ++r) {
        sink = spinWork(gap * itersPerUs);
        auto a = Clock::now();
        sink = spinWork(w * itersPerUs);
        auto b = Clock::now();
        sink = spinWork(gap * itersPerUs);
        auto c = Clock::now();
        pool.parallelFor(2, 1, [&](int64_t, int64_t) { sink = spinWork(w / 2 * itersPerUs); });
        auto d = Clock::now();
        helped += pool.lastCallerChunks() < 2;
        in.push_back(std::chrono::duration<double, std::micro>(b - a).count());
        par.push_back(std::chrono::duration<double, std::micro>(d - c).count());
      }
      std::nth_element(in.begin(), in.begin() + 1000, in.end());
      std::nth_element(par.begin(), par.begin() + 1000, par.end());
      std::printf("%7.0f %6.0f %10.2f %8.2f %6.1f%%\n", w, gap, in[1000], par[1000], helped / 20.0);
    }
}
