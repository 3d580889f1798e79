//===- Calibrate.cpp - The machine's measured peak -------------------------===//
#include "runtime/train/Calibrate.h"

#include <fmt/format.h>

#ifdef KILN_HAVE_BLAS
#include "runtime/cpu/Blas.h"
#include "runtime/cpu/ThreadPool.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>
#endif

namespace kiln::train {

#ifdef KILN_HAVE_BLAS
namespace {

/// The best of `reps` timings of `f`, after one untimed run.
template <typename F> double best(int reps, F &&f) {
  f();
  double b = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    b = std::min(b, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return b;
}

} // namespace

Expected<MachinePeak> measureCpuPeak(int threads) {
  auto lib = cpu::blas();
  if (!lib)
    return lib.status();
  cpu::Blas::Sgemm sgemm = (*lib)->sgemm;
  threads = std::max(threads, 1);
  cpu::ThreadPool pool(threads);
  // GEMM: every thread multiplies its own n x n matrices, 8 calls per
  // timing; the best of n = 256 and 512. (Larger sizes run slower here:
  // one thread's MKL reaches ~94 GFLOP/s at 256^3 but ~35 at 1024^3 on the
  // development machine, so a large size would understate the peak.)
  double bestFlops = 0;
  int bestN = 0;
  for (int n : {256, 512}) {
    size_t nn = size_t(n) * size_t(n);
    std::vector<float> a(nn * size_t(threads)), b(nn * size_t(threads)), c(nn * size_t(threads));
    for (size_t i = 0; i < a.size(); ++i) {
      a[i] = float(i % 7) * 0.25f - 0.75f;
      b[i] = float(i % 5) * 0.5f - 1.0f;
    }
    constexpr int calls = 8;
    double t = best(3, [&] {
      pool.forEach(threads, threads, [&](int64_t p) {
        size_t o = size_t(p) * nn;
        for (int r = 0; r < calls; ++r)
          sgemm(cpu::kCblasRowMajor, cpu::kCblasNoTrans, cpu::kCblasNoTrans, n, n, n, 1.f,
                a.data() + o, n, b.data() + o, n, 0.f, c.data() + o, n);
      });
    });
    double flops = 2.0 * n * n * double(n) * calls * threads / t;
    if (flops > bestFlops) {
      bestFlops = flops;
      bestN = n;
    }
  }
  // Bandwidth: a 128 MiB copy in one block per thread (pages touched first).
  constexpr size_t bytes = size_t(128) << 20;
  std::unique_ptr<char[]> src(new char[bytes]), dst(new char[bytes]);
  std::memset(src.get(), 1, bytes);
  std::memset(dst.get(), 0, bytes);
  size_t chunk = (bytes + size_t(threads) - 1) / size_t(threads);
  double tc = best(3, [&] {
    pool.forEach(threads, threads, [&](int64_t p) {
      size_t lo = size_t(p) * chunk, hi = std::min(bytes, lo + chunk);
      if (lo < hi)
        std::memcpy(dst.get() + lo, src.get() + lo, hi - lo);
    });
  });
  MachinePeak peak;
  peak.flops = bestFlops;
  peak.bandwidth = 2.0 * double(bytes) / tc;
  peak.how = fmt::format("sgemm {}^3 through {} on {} thread{}; a copy of {} MiB", bestN,
                         (*lib)->name, threads, threads == 1 ? "" : "s", bytes >> 20);
  return peak;
}
#else
Expected<MachinePeak> measureCpuPeak(int) {
  return Status::error("this kiln-run has no BLAS: the machine's peak is not measured");
}
#endif

} // namespace kiln::train
