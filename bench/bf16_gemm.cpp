// bf16 GEMMs on the CPU at the CPU GPT's shapes (examples/
// shakespeare_char_cpu.kiln: batch 12 x context 64 = 768 rows, d 128, MLP
// 512, QKV 384, vocabulary 65; forward and backward), three ways, each on
// the executor's parts (runtime/cpu/Gemm.h gemmParts) over a thread pool:
//   f32     the float32 GEMM (sgemm) on float32 operands: the baseline;
//   widen   bf16 operands widened to float32, sgemm, result rounded to bf16;
//   library the BLAS library's bf16 GEMM (oneMKL cblas_gemm_bf16bf16f32)
//           into float32, rounded to bf16;
//   dpbf16  Kiln's own bf16 GEMM on AVX512-BF16 dot products
//           (runtime/cpu/GemmBf16.h) into float32, rounded to bf16 (0 where
//           the CPU lacks the instruction).
// The executor times widen and library at a shape's first use and keeps
// the faster (runtime/cpu/HalfGemmCache.h); this program shows the numbers
// behind that choice. Median of `reps` calls after 3 warm-ups; GFLOP/s =
// 2 m n k batch / time.
// Build and run from the repository root after building kiln-run:
//   g++ -O2 -std=c++17 -I. -DKILN_HAVE_OPENBLAS=1 bench/bf16_gemm.cpp \
//     build/runtime/cpu/libKilnRuntimeCpu.a build/runtime/core/libKilnRuntimeCore.a \
//     -lopenblas -lfmt -ldl -lpthread -o build/bf16_gemm
//   build/bf16_gemm [threads=2] [reps=50]
// (KILN_BLAS=openblas: OpenBLAS has no bf16 GEMM here, so "library" is
// the widen path again.)
#include "runtime/core/Half.h"
#include "runtime/cpu/Blas.h"
#include "runtime/cpu/Gemm.h"
#include "runtime/cpu/ThreadPool.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <random>
#include <vector>

using namespace kiln;
using namespace kiln::cpu;

namespace {

struct Shape {
  const char *what;
  int64_t batch, m, n, k;
  bool ta, tb, rhsBatched;
};

template <typename F> double median(int reps, F f) {
  for (int i = 0; i < 3; ++i)
    f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

} // namespace

int main(int argc, char **argv) {
  int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  int reps = argc > 2 ? std::atoi(argv[2]) : 50;
  auto b = blas();
  if (!b) {
    fmt::print(stderr, "{}\n", b.status().message());
    return 1;
  }
  fmt::print("BLAS: {}; bf16 GEMM in the library: {}; {} threads, median of {}\n",
             (*b)->name, hasLibraryHalfGemm(program::DType::BF16) ? "yes" : "no", threads, reps);
  const Shape shapes[] = {
      {"qkv      x W", 1, 768, 384, 128, false, false, false},
      {"proj     x W", 1, 768, 128, 128, false, false, false},
      {"mlp up   x W", 1, 768, 512, 128, false, false, false},
      {"mlp down x W", 1, 768, 128, 512, false, false, false},
      {"lm head  x W", 1, 768, 65, 128, false, false, false},
      {"d mlp up   dY W^T", 1, 768, 128, 512, false, true, false},
      {"d mlp down dY W^T", 1, 768, 512, 128, false, true, false},
      {"d qkv      dY W^T", 1, 768, 128, 384, false, true, false},
      {"d lm head  dY W^T", 1, 768, 128, 65, false, true, false},
      {"dW mlp up   X^T dY", 1, 128, 512, 768, true, false, false},
      {"dW mlp down X^T dY", 1, 512, 128, 768, true, false, false},
      {"dW qkv      X^T dY", 1, 128, 384, 768, true, false, false},
      {"dW lm head  X^T dY", 1, 128, 65, 768, true, false, false},
      {"attn scores Q K^T", 48, 64, 64, 32, false, true, true},
  };
  ThreadPool pool(threads);
  RunParts run = [&](int64_t n, const std::function<void(int64_t)> &job) {
    if (n == 1 || threads == 1)
      serialParts(n, job);
    else
      pool.forEach(n, int(std::min<int64_t>(n, threads)), job);
  };
  fmt::print("{:<20} {:>16} {:>10} {:>10} {:>10} {:>10}  {}\n", "GEMM", "m x n x k", "f32 us",
             "widen us", "library us", "dpbf16 us", "GFLOP/s f32/widen/library/dpbf16");
  std::mt19937 rng(7);
  std::normal_distribution<float> dist;
  for (const Shape &sh : shapes) {
    MatmulShape s;
    s.batch = sh.batch;
    s.m = sh.m;
    s.n = sh.n;
    s.k = sh.k;
    s.transposeLhs = sh.ta;
    s.transposeRhs = sh.tb;
    s.lhsBatched = true;
    s.rhsBatched = sh.rhsBatched;
    int64_t nl, nr, no;
    gemmExtents(s, nl, nr, no);
    std::vector<float> af(static_cast<size_t>(nl)), bf(static_cast<size_t>(nr)), cf(static_cast<size_t>(no));
    std::vector<uint16_t> ah(af.size()), bh(bf.size()), ch(cf.size());
    for (size_t i = 0; i < af.size(); ++i)
      ah[i] = floatToHalf(program::DType::BF16, af[i] = dist(rng));
    for (size_t i = 0; i < bf.size(); ++i)
      bh[i] = floatToHalf(program::DType::BF16, bf[i] = dist(rng));
    int64_t parts = gemmParts(s);
    s.dtype = program::DType::F32;
    double f32 = median(reps, [&] {
      run(parts, [&](int64_t p) { matmulPart(s, af.data(), bf.data(), cf.data(), p, parts); });
    });
    s.dtype = program::DType::BF16;
    HalfGemmScratch scratch;
    double widen = median(reps, [&] {
      matmulHalf(s, ah.data(), bh.data(), ch.data(), HalfGemm::Widen, scratch, run);
    });
    double lib = median(reps, [&] {
      matmulHalf(s, ah.data(), bh.data(), ch.data(), HalfGemm::Library, scratch, run);
    });
    double dot = 0;
    if (hasDotProductHalfGemm(program::DType::BF16))
      dot = median(reps, [&] {
        matmulHalf(s, ah.data(), bh.data(), ch.data(), HalfGemm::DotProducts, scratch, run);
      });
    double flops = program::gemmFlops(s);
    fmt::print("{:<20} {:>16} {:>10.1f} {:>10.1f} {:>10.1f} {:>10.1f}  {:.0f}/{:.0f}/{:.0f}/{:.0f}\n",
               sh.what,
               fmt::format("{}{}x{}x{}{}{}", sh.batch > 1 ? fmt::format("{}x", sh.batch) : "",
                           sh.m, sh.n, sh.k, sh.ta ? " T" : " N", sh.tb ? "T" : "N"),
               f32 * 1e6, widen * 1e6, lib * 1e6, dot * 1e6, flops / f32 * 1e-9,
               flops / widen * 1e-9, flops / lib * 1e-9, dot > 0 ? flops / dot * 1e-9 : 0.0);
  }
  return 0;
}
