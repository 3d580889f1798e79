//===- CpuTest.cpp - Thread pool and BLAS matmul --------------------------===//
#include "runtime/cpu/Blas.h"
#include "runtime/cpu/Gemm.h"
#include "runtime/cpu/GemmBf16.h"
#include "runtime/cpu/HalfGemmCache.h"
#include "runtime/core/Half.h"
#include "runtime/cpu/Split.h"
#include "runtime/cpu/ThreadPool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <numeric>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>
#include <random>
#include <thread>

using namespace kiln::cpu;

namespace {

TEST(ThreadPool, ChunksCoverTheRangeDeterministically) {
  for (int64_t n : {0, 1, 7, 100, 1001})
    for (int threads : {1, 2, 3, 8})
      for (int64_t grain : {1, 16, 1000}) {
        auto c = ThreadPool::chunks(n, grain, threads);
        int64_t next = 0;
        for (auto [b, e] : c) {
          EXPECT_EQ(b, next);
          EXPECT_GT(e, b);
          next = e;
        }
        EXPECT_EQ(next, n);
        EXPECT_LE(int64_t(c.size()), threads);
        EXPECT_EQ(c, ThreadPool::chunks(n, grain, threads)); // no timing involved
      }
}

TEST(ThreadPool, EveryIndexRunsOnceAndSumsAreReproducible) {
  ThreadPool pool(3);
  EXPECT_EQ(pool.threads(), 3);
  std::vector<float> x(100003);
  std::mt19937 rng(1);
  std::normal_distribution<float> dist;
  for (float &v : x)
    v = dist(rng);
  auto sum = [&] {
    auto parts = ThreadPool::chunks(int64_t(x.size()), 1024, pool.threads());
    std::vector<float> partial(parts.size(), 0.0f);
    std::vector<std::atomic<int>> hits(x.size());
    pool.parallelFor(int64_t(x.size()), 1024, [&](int64_t b, int64_t e) {
      size_t chunk = 0;
      while (parts[chunk].first != b)
        ++chunk;
      for (int64_t i = b; i < e; ++i) {
        partial[chunk] += x[size_t(i)];
        hits[size_t(i)]++;
      }
    });
    for (auto &h : hits)
      EXPECT_EQ(h.load(), 1);
    return std::accumulate(partial.begin(), partial.end(), 0.0f);
  };
  float first = sum();
  for (int r = 0; r < 20; ++r)
    EXPECT_EQ(sum(), first); // bit-identical run to run
}

TEST(ThreadPool, NestedCallsRunInline) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  pool.parallelFor(4, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      pool.parallelFor(10, 1, [&](int64_t c, int64_t d) { total += d - c; });
  });
  EXPECT_EQ(total.load(), 40);
}

// Many short loops, with pauses long enough for the workers to fall asleep
// between some of them, and loops from two threads at once (one of them
// runs inline): every index runs exactly once, whichever thread claims it.
TEST(ThreadPool, ClaimsNeverLoseOrRepeatAChunk) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(64);
  auto loop = [&](int64_t n) {
    pool.parallelFor(n, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        hits[size_t(i)]++;
    });
  };
  for (int r = 0; r < 3000; ++r) {
    int64_t n = 1 + r % 64;
    loop(n);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(hits[size_t(i)].exchange(0), 1) << "loop " << r << " index " << i;
    if (r % 500 == 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(2)); // workers sleep
  }
  std::atomic<int64_t> total{0};
  auto count = [&] {
    for (int r = 0; r < 2000; ++r)
      pool.parallelFor(10, 1, [&](int64_t b, int64_t e) { total += e - b; });
  };
  std::thread other(count);
  count();
  other.join();
  EXPECT_EQ(total.load(), 2 * 2000 * 10);
}

// A loop of one chunk, or on a pool of one thread, runs on the caller.
TEST(ThreadPool, OneChunkRunsOnTheCaller) {
  ThreadPool one(1), two(2);
  std::thread::id caller = std::this_thread::get_id(), ran;
  one.parallelFor(100, 1, [&](int64_t, int64_t) { ran = std::this_thread::get_id(); });
  EXPECT_EQ(ran, caller);
  EXPECT_EQ(one.lastCallerChunks(), 1);
  two.parallelFor(100, 100, [&](int64_t, int64_t) { ran = std::this_thread::get_id(); });
  EXPECT_EQ(ran, caller);
  EXPECT_EQ(two.lastCallerChunks(), 1);
}

// The split decision (runtime/cpu/Split.h): a step below twice the minimum
// per thread runs inline; above it, one thread per minimum, at most the
// pool's threads and the step's pieces; no minimum splits everything.
TEST(Split, ThreadsFollowTheWorkSize) {
  SplitModel m;
  m.minNanosPerThread = 20000;
  EXPECT_EQ(splitThreads(m, 0, 8, 2), 1);
  EXPECT_EQ(splitThreads(m, 39999, 8, 2), 1);
  EXPECT_EQ(splitThreads(m, 40000, 8, 2), 2);
  EXPECT_EQ(splitThreads(m, 1e9, 8, 2), 2);
  EXPECT_EQ(splitThreads(m, 1e9, 3, 16), 3);  // no more threads than pieces
  EXPECT_EQ(splitThreads(m, 1e9, 1, 16), 1);
  EXPECT_EQ(splitThreads(m, 100000, 64, 16), 5); // 100 us: 5 threads of 20 us
  EXPECT_EQ(splitThreads(m, 1e9, 64, 1), 1);
  m.minNanosPerThread = 0;
  EXPECT_EQ(splitThreads(m, 0, 8, 2), 2);
  EXPECT_EQ(splitThreads(m, 0, 8, 16), 8);
}

// The estimate behind it (runtime/cpu/Split.h, 10 us per thread): the
// small character model's slices (256x64 out of 256x192: 256 KiB moved,
// ~13 us) run inline; its 8x32x256x64 feed-forward GEMMs (4 MFLOP, ~84 us)
// and the GPT CPU config's softmax (3 MFLOP, 1.5 MiB: ~230 us) split.
TEST(Split, DefaultModelKeepsSmallKernelsInline) {
  SplitModel m;
  EXPECT_EQ(m.minNanosPerThread, 10000);
  EXPECT_EQ(splitThreads(m, estimateNanos(m, 0, 262144, false), 8, 2), 1);
  EXPECT_EQ(splitThreads(m, estimateNanos(m, 2.0 * 8 * 32 * 256 * 64,
                                          4.0 * (8 * 32 * 64 + 256 * 64 + 8 * 32 * 256), true),
                         8, 2),
            2);
  EXPECT_EQ(splitThreads(m, estimateNanos(m, 2953216, 1572864, false), 12, 2), 2);
}

// forEach runs every piece once, on at most the threads it is given.
TEST(ThreadPool, ForEachRunsEveryPieceOnceOnAtMostItsThreads) {
  ThreadPool pool(4);
  for (int threads : {1, 2, 4, 8})
    for (int64_t n : {1, 2, 7, 64}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      std::mutex mu;
      // Per call: which workers claim pieces may differ from call to call,
      // so the bound holds for each call, not for their union.
      for (int r = 0; r < 50; ++r) {
        std::vector<std::thread::id> ran;
        pool.forEach(n, threads, [&](int64_t i) {
          hits[size_t(i)]++;
          std::lock_guard<std::mutex> lock(mu);
          if (std::find(ran.begin(), ran.end(), std::this_thread::get_id()) == ran.end())
            ran.push_back(std::this_thread::get_id());
        });
        EXPECT_LE(int64_t(ran.size()), std::max<int64_t>(1, threads)) << n << " pieces";
        if (threads == 1 || n == 1) {
          EXPECT_EQ(ran, std::vector<std::thread::id>{std::this_thread::get_id()});
        }
      }
      for (auto &h : hits)
        EXPECT_EQ(h.load(), 50);
    }
}

// Matmul against a double-precision reference; float32 BLAS with K <= 37
// terms of magnitude ~1 stays within 1e-5 relative of the exact result.
void checkMatmul(MatmulShape s) {
  int64_t aRows = s.transposeLhs ? s.k : s.m, aCols = s.transposeLhs ? s.m : s.k;
  int64_t bRows = s.transposeRhs ? s.n : s.k, bCols = s.transposeRhs ? s.k : s.n;
  std::vector<float> a((s.lhsBatched ? s.batch : 1) * aRows * aCols);
  std::vector<float> b((s.rhsBatched ? s.batch : 1) * bRows * bCols);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (float &v : a) v = dist(rng);
  for (float &v : b) v = dist(rng);
  std::vector<float> c(s.batch * s.m * s.n, NAN);
  matmul(s, a.data(), b.data(), c.data());
  for (int64_t p = 0; p < s.batch; ++p)
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t j = 0; j < s.n; ++j) {
        double ref = 0;
        for (int64_t q = 0; q < s.k; ++q) {
          double av = a[(s.lhsBatched ? p * s.m * s.k : 0) +
                        (s.transposeLhs ? q * s.m + i : i * s.k + q)];
          double bv = b[(s.rhsBatched ? p * s.k * s.n : 0) +
                        (s.transposeRhs ? j * s.k + q : q * s.n + j)];
          ref += av * bv;
        }
        double got = c[p * s.m * s.n + i * s.n + j];
        ASSERT_NEAR(got, ref, 1e-5 * std::max(1.0, std::fabs(ref)))
            << "batch " << p << " (" << i << ", " << j << ")";
      }
}

TEST(Gemm, AllTransposeAndBatchCombinations) {
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (auto [ab, bb] : {std::pair{true, true}, {true, false}, {false, true}}) {
        MatmulShape s;
        s.batch = 3;
        s.m = 5;
        s.n = 7;
        s.k = 37;
        s.transposeLhs = ta;
        s.transposeRhs = tb;
        s.lhsBatched = ab;
        s.rhsBatched = bb;
        SCOPED_TRACE(testing::Message() << "ta " << ta << " tb " << tb
                                        << " lhs batched " << ab << " rhs batched " << bb);
        checkMatmul(s);
      }
}

// Splitting a batched GEMM into parts of whole batches gives the same bits
// as one call, for every layout and part count; row splits (the folded
// batch, or batch 1) give the right values, and the executor fixes their
// part count by shape (gemmParts), never by thread count.
TEST(Gemm, PartsMatchOneCall) {
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (auto [ab, bb] : {std::pair{true, true}, {true, false}, {false, true}})
        for (int64_t batch : {1, 3})
        for (auto [m, n] : {std::pair<int64_t, int64_t>{150, 19}, {100, 150}}) {
          // m = 100: fewer than 128 rows, so single products split columns.
          MatmulShape s;
          s.batch = batch;
          s.m = m;
          s.n = n;
          s.k = 53;
          s.transposeLhs = ta;
          s.transposeRhs = tb;
          s.lhsBatched = ab;
          s.rhsBatched = bb;
          int64_t aSize = (ab ? batch : 1) * s.m * s.k, bSize = (bb ? batch : 1) * s.k * s.n;
          std::vector<float> a(aSize), b(bSize);
          std::mt19937 rng(11);
          std::uniform_real_distribution<float> dist(-1, 1);
          for (float &v : a) v = dist(rng);
          for (float &v : b) v = dist(rng);
          std::vector<float> whole(batch * s.m * s.n);
          matmul(s, a.data(), b.data(), whole.data());
          for (int64_t parts : {2, 3, 5}) {
            std::vector<float> split(whole.size(), NAN);
            for (int64_t p = 0; p < parts; ++p)
              matmulPart(s, a.data(), b.data(), split.data(), p, parts);
            bool wholeBatches = !foldsBatch(s) && batch >= parts;
            for (size_t i = 0; i < whole.size(); ++i) {
              if (wholeBatches)
                ASSERT_EQ(whole[i], split[i]) << "element " << i << " parts " << parts;
              else
                ASSERT_NEAR(whole[i], split[i], 1e-5 * std::max(1.0f, std::fabs(whole[i])))
                    << "element " << i << " parts " << parts;
            }
          }
        }
}

// The part count is a function of the shape: blocks of at least 64 rows
// (or, for products of fewer than 128 rows, 64 columns), at most 4; whole
// batches for unfolded batches; one part for small products.
TEST(Gemm, PartCountsByShape) {
  auto parts = [](int64_t batch, int64_t m, int64_t n, int64_t k, bool ta, bool lhsBatched,
                  bool rhsBatched) {
    MatmulShape s;
    s.batch = batch;
    s.m = m;
    s.n = n;
    s.k = k;
    s.transposeLhs = ta;
    s.lhsBatched = lhsBatched;
    s.rhsBatched = rhsBatched;
    return gemmParts(s);
  };
  EXPECT_EQ(parts(12, 64, 512, 128, false, true, false), 4); // folded: 768 rows
  EXPECT_EQ(parts(1, 128, 512, 768, true, false, false), 2); // weight gradient: 2 x 64 rows
  EXPECT_EQ(parts(1, 65, 128, 768, true, false, false), 2);  // 65 rows: 2 x 64 columns
  EXPECT_EQ(parts(1, 65, 100, 768, true, false, false), 1);  // too narrow to split
  EXPECT_EQ(parts(48, 64, 64, 32, false, true, true), 48);   // whole batches
  EXPECT_EQ(parts(1, 16, 16, 16, false, false, false), 1);   // small
}

// Half-precision GEMMs (bf16, f16): operands widened exactly, products
// accumulated in float32, the result rounded to nearest even once. Against
// a double reference rounded to the type: within one unit of the last place
// (the float32 accumulation may land on the other side of a rounding
// boundary) plus float32 accumulation error.
TEST(Gemm, HalfPrecisionTyped) {
  for (kiln::program::DType dt : {kiln::program::DType::BF16, kiln::program::DType::F16}) {
    MatmulShape s;
    s.batch = 2;
    s.m = 9;
    s.n = 11;
    s.k = 33;
    s.transposeRhs = true;
    s.lhsBatched = s.rhsBatched = true;
    s.dtype = dt;
    int ulpBits = dt == kiln::program::DType::BF16 ? 8 : 11;
    // Values that are exact in both types: multiples of 2^-6 in [-2, 2).
    std::mt19937 rng(13);
    auto value = [&] { return float(int(rng() % 256) - 128) / 64.0f; };
    auto encode = [&](float v) { // exact for these values
      uint32_t u;
      std::memcpy(&u, &v, 4);
      if (dt == kiln::program::DType::BF16)
        return uint16_t(u >> 16);
      if (v == 0)
        return uint16_t((u >> 16) & 0x8000u);
      int e = int((u >> 23) & 255) - 127 + 15;
      return uint16_t(((u >> 16) & 0x8000u) | (uint32_t(e) << 10) | ((u >> 13) & 1023u));
    };
    std::vector<float> af(size_t(s.batch * s.m * s.k)), bf(size_t(s.batch * s.n * s.k));
    std::vector<uint16_t> a(af.size()), b(bf.size()), c(size_t(s.batch * s.m * s.n), 0xffff);
    for (size_t i = 0; i < af.size(); ++i) a[i] = encode(af[i] = value());
    for (size_t i = 0; i < bf.size(); ++i) b[i] = encode(bf[i] = value());
    matmulTyped(s, a.data(), b.data(), c.data());
    for (int64_t p = 0; p < s.batch; ++p)
      for (int64_t i = 0; i < s.m; ++i)
        for (int64_t j = 0; j < s.n; ++j) {
          double ref = 0;
          for (int64_t q = 0; q < s.k; ++q)
            ref += double(af[size_t((p * s.m + i) * s.k + q)]) *
                   double(bf[size_t((p * s.n + j) * s.k + q)]);
          uint16_t h = c[size_t((p * s.m + i) * s.n + j)];
          float got;
          if (dt == kiln::program::DType::BF16) {
            uint32_t u = uint32_t(h) << 16;
            std::memcpy(&got, &u, 4);
          } else {
            int e = (h >> 10) & 31, m = h & 1023;
            double mag = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
            got = float((h & 0x8000) ? -mag : mag);
          }
          double ulp = std::ldexp(std::max(std::fabs(ref), 1e-3), -ulpBits);
          ASSERT_NEAR(got, ref, ulp + 1e-6 * std::fabs(ref))
              << kiln::program::dtypeName(dt) << " batch " << p << " (" << i << ", " << j << ")";
        }
  }
}

// KILN_BLAS's choices: OpenBLAS always loads; MKL (when installed: PyPI's
// mkl, which scripts/setup.sh installs) computes the same products within
// float32 rounding; unknown names and bad paths are errors that say what to
// do.
TEST(Blas, Choices) {
  auto ob = loadBlas("openblas");
  ASSERT_TRUE(ob) << ob.status().message();
  EXPECT_FALSE(ob->mkl);
  EXPECT_EQ(ob->name.rfind("OpenBLAS (", 0), 0u) << ob->name;

  auto bad = loadBlas("atlas");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.status().message().find("use auto, mkl, openblas or the path"), std::string::npos);
  auto path = loadBlas("/nonexistent/libmkl_rt.so.3");
  ASSERT_FALSE(path);
  EXPECT_NE(path.status().message().find("/nonexistent/libmkl_rt.so.3"), std::string::npos);

  auto autoChoice = loadBlas("");
  ASSERT_TRUE(autoChoice);
  auto mkl = loadBlas("mkl");
  if (!mkl) {
    EXPECT_FALSE(autoChoice->mkl);
    EXPECT_NE(autoChoice->mklMissing.find("could not be loaded"), std::string::npos);
    GTEST_SKIP() << "no Intel MKL here: " << mkl.status().message();
  }
  EXPECT_TRUE(autoChoice->mkl); // auto prefers MKL where it loads
  EXPECT_EQ(mkl->name.rfind("Intel oneMKL", 0), 0u) << mkl->name;
  const int m = 70, n = 90, k = 300;
  std::vector<float> a(m * k), b(k * n), c1(m * n), c2(m * n);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (float &v : a) v = dist(rng);
  for (float &v : b) v = dist(rng);
  ob->sgemm(kCblasRowMajor, kCblasNoTrans, kCblasNoTrans, m, n, k, 1, a.data(), k, b.data(), n,
            0, c1.data(), n);
  mkl->sgemm(kCblasRowMajor, kCblasNoTrans, kCblasNoTrans, m, n, k, 1, a.data(), k, b.data(), n,
             0, c2.data(), n);
  // 300 products of magnitude <= 1, float32 accumulated in different orders.
  for (int i = 0; i < m * n; ++i)
    ASSERT_NEAR(c1[i], c2[i], 2e-5 * std::max(1.0f, std::fabs(c1[i]))) << i;
}

// Head-split layouts (a [0, 2, 1, 3] transpose folded into the GEMM): Q and
// K stored as [B, T, H, D], S = Q K^T per (b, h) written as [B, T, H, T].
TEST(Gemm, StridedHeadLayouts) {
  const int64_t B = 2, H = 3, T = 5, D = 4;
  std::vector<float> q(B * T * H * D), k(B * T * H * D), out(B * T * H * T, NAN);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (float &v : q) v = dist(rng);
  for (float &v : k) v = dist(rng);
  MatmulShape s;
  s.batch = B * H;
  s.m = T;
  s.n = T;
  s.k = D;
  s.transposeRhs = true;
  s.lhsBatched = s.rhsBatched = true;
  s.heads = H;
  s.lhsLayout = {T * H * D, D, H * D};
  s.rhsLayout = {T * H * D, D, H * D};
  s.outLayout = {T * H * T, T, H * T};
  for (int64_t parts : {1, 4})
    for (int64_t p = 0; p < parts; ++p)
      matmulPart(s, q.data(), k.data(), out.data(), p, parts);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j < T; ++j) {
          double ref = 0;
          for (int64_t d = 0; d < D; ++d)
            ref += double(q[((b * T + i) * H + h) * D + d]) * k[((b * T + j) * H + h) * D + d];
          ASSERT_NEAR(out[((b * T + i) * H + h) * T + j], ref, 1e-5)
              << "b " << b << " h " << h << " (" << i << ", " << j << ")";
        }
}

} // namespace

// bf16/f16 GEMMs both ways (runtime/cpu/Gemm.h, HalfGemm): widened to
// float32 for sgemm, and the BLAS library's own half-precision GEMM (oneMKL's
// cblas_gemm_bf16bf16f32 / cblas_gemm_f16f16f32), on fresh random inputs,
// against a double reference of the same (rounded) inputs. Both accumulate
// each k-term dot product in float32: |error| <= k 2^-24 sum|a||b| before
// the output rounding, which adds at most the unit roundoff: 2^-8 relative
// for bf16 (8 significant bits), 2^-11 for f16 (11). With several threads, the same bits as one.
namespace {

using kiln::program::DType;

/// The exact value of 16-bit pattern `h`.
double halfValue(DType t, uint16_t h) { return double(kiln::halfToFloat(t, h)); }

struct HalfCase {
  MatmulShape s;
  std::vector<uint16_t> a, b;
  HalfCase(DType t, int64_t batch, int64_t m, int64_t n, int64_t k, bool ta, bool tb,
           bool rhsBatched, unsigned seed) {
    s.dtype = t;
    s.batch = batch;
    s.m = m;
    s.n = n;
    s.k = k;
    s.transposeLhs = ta;
    s.transposeRhs = tb;
    s.lhsBatched = true;
    s.rhsBatched = rhsBatched;
    int64_t nl, nr, no;
    gemmExtents(s, nl, nr, no);
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist;
    for (int64_t i = 0; i < nl; ++i) a.push_back(kiln::floatToHalf(t, dist(rng)));
    for (int64_t i = 0; i < nr; ++i) b.push_back(kiln::floatToHalf(t, dist(rng)));
  }
  std::vector<uint16_t> run(HalfGemm m, const RunParts &run) const {
    int64_t nl, nr, no;
    gemmExtents(s, nl, nr, no);
    std::vector<uint16_t> c(size_t(no), 0x7fff);
    HalfGemmScratch scratch;
    matmulHalf(s, a.data(), b.data(), c.data(), m, scratch, run);
    return c;
  }
  /// Checks `c` against double products of the rounded inputs.
  void check(const std::vector<uint16_t> &c, const char *what) const {
    double unit = std::ldexp(1.0, s.dtype == DType::BF16 ? -8 : -11);
    for (int64_t p = 0; p < s.batch; ++p)
      for (int64_t i = 0; i < s.m; ++i)
        for (int64_t j = 0; j < s.n; ++j) {
          double ref = 0, mag = 0;
          for (int64_t q = 0; q < s.k; ++q) {
            int64_t ai = (s.transposeLhs ? q * s.m + i : i * s.k + q) + p * s.m * s.k;
            int64_t bi = (s.transposeRhs ? j * s.k + q : q * s.n + j) +
                         (s.rhsBatched ? p * s.k * s.n : 0);
            double x = halfValue(s.dtype, a[size_t(ai)]) * halfValue(s.dtype, b[size_t(bi)]);
            ref += x;
            mag += std::fabs(x);
          }
          double acc = double(s.k) * std::ldexp(1.0, -24) * mag;
          double got = halfValue(s.dtype, c[size_t((p * s.m + i) * s.n + j)]);
          ASSERT_LE(std::fabs(got - ref), acc + unit * (std::fabs(ref) + acc))
              << what << " " << kiln::program::gemmLabel(s) << " "
              << kiln::program::dtypeName(s.dtype) << " batch " << p << " (" << i << ", " << j
              << ")";
        }
  }
};

std::vector<HalfCase> halfCases(DType t) {
  return {HalfCase(t, 1, 200, 130, 70, false, false, false, 1),  // row parts
          HalfCase(t, 3, 40, 300, 64, false, true, false, 2),    // folded batch, column parts
          HalfCase(t, 6, 33, 17, 45, true, false, true, 3),      // whole batches
          HalfCase(t, 1, 96, 65, 128, true, true, false, 4)};    // both transposed
}

RunParts poolParts(ThreadPool &pool) {
  return [&pool](int64_t n, const std::function<void(int64_t)> &job) {
    pool.forEach(n, int(std::min<int64_t>(n, pool.threads())), job);
  };
}

} // namespace

TEST(HalfGemm, WidenedAgainstDouble) {
  ThreadPool pool(3);
  for (DType t : {DType::BF16, DType::F16})
    for (const HalfCase &c : halfCases(t)) {
      std::vector<uint16_t> one = c.run(HalfGemm::Widen, serialParts);
      c.check(one, "widened");
      EXPECT_EQ(c.run(HalfGemm::Widen, poolParts(pool)), one) << "threads changed the bits";
    }
}

// Kiln's own bf16 GEMM on AVX512-BF16 dot products: the same cases, the
// same tolerance (float32 accumulation, in pairs), bits independent of the
// threads; plus edges of its 8 x 32 blocks and an odd k.
TEST(HalfGemm, DotProductsAgainstDouble) {
  if (!hasDotProductHalfGemm(DType::BF16))
    GTEST_SKIP() << "this CPU has no AVX512-BF16 (VDPBF16PS); bf16 GEMMs widen or use the "
                    "library here";
  EXPECT_FALSE(hasDotProductHalfGemm(DType::F16));
  ThreadPool pool(3);
  std::vector<HalfCase> cases = halfCases(DType::BF16);
  cases.push_back(HalfCase(DType::BF16, 1, 9, 33, 1, false, false, false, 5));   // k = 1
  cases.push_back(HalfCase(DType::BF16, 1, 17, 65, 129, false, true, false, 6)); // odd k
  cases.push_back(HalfCase(DType::BF16, 2, 7, 31, 33, true, true, true, 7));     // under a block
  for (const HalfCase &c : cases) {
    std::vector<uint16_t> one = c.run(HalfGemm::DotProducts, serialParts);
    c.check(one, "dpbf16");
    EXPECT_EQ(c.run(HalfGemm::DotProducts, poolParts(pool)), one) << "threads changed the bits";
  }
}

// The dot-product GEMM's bf16 stores (rounded in registers) against its
// float32 result rounded by floatToHalf: the same bits, overflow to
// infinity, NaN and ties included; with op(B) packed per call and packed
// once beforehand.
TEST(HalfGemm, DotProductsRoundLikeFloatToHalf) {
  if (!hasDpBf16())
    GTEST_SKIP() << "this CPU has no AVX512-BF16";
  const int m = 19, n = 45, k = 7;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-3, 3);
  std::vector<uint16_t> a(size_t(m) * k), b(size_t(k) * n);
  for (auto &x : a)
    x = kiln::floatToHalf(DType::BF16, u(rng));
  for (auto &x : b)
    x = kiln::floatToHalf(DType::BF16, u(rng));
  a[0] = kiln::floatToHalf(DType::BF16, 3e38f); // row 0 overflows to +-inf
  b[0] = kiln::floatToHalf(DType::BF16, 3e38f);
  a[size_t(k)] = 0x7fc1;                          // row 1: NaN with a payload
  std::vector<float> f(size_t(m) * n);
  gemmBf16DotProducts(kCblasRowMajor, kCblasNoTrans, kCblasNoTrans, m, n, k, 1.0f, a.data(), k,
                      b.data(), n, 0.0f, f.data(), n);
  std::vector<uint16_t> want(f.size());
  for (size_t i = 0; i < f.size(); ++i)
    want[i] = kiln::floatToHalf(DType::BF16, f[i]);
  EXPECT_TRUE(std::isinf(f[0]));
  EXPECT_TRUE(std::isnan(f[size_t(n)]));
  std::vector<uint16_t> got(f.size(), 0x1234);
  gemmBf16ToBf16(false, false, m, n, k, a.data(), k, b.data(), n, nullptr, got.data(), n);
  EXPECT_EQ(got, want);
  std::vector<uint32_t> panels(size_t(bf16Panels(n)) * bf16PanelWords(k));
  packBf16Panels(false, b.data(), n, k, n, 0, bf16Panels(n), panels.data());
  std::fill(got.begin(), got.end(), 0x1234);
  gemmBf16ToBf16(false, false, m, n, k, a.data(), k, nullptr, 0, panels.data(), got.data(), n);
  EXPECT_EQ(got, want);
}

TEST(HalfGemm, LibraryAgainstDouble) {
  for (DType t : {DType::BF16, DType::F16}) {
    if (!hasLibraryHalfGemm(t))
      GTEST_SKIP() << "the BLAS library (" << (blas() ? (*blas())->name : "none")
                   << ") has no " << kiln::program::dtypeName(t)
                   << " GEMM; oneMKL has (python3 -m pip install mkl)";
    ThreadPool pool(3);
    for (const HalfCase &c : halfCases(t)) {
      std::vector<uint16_t> one = c.run(HalfGemm::Library, serialParts);
      c.check(one, "library");
      EXPECT_EQ(c.run(HalfGemm::Library, poolParts(pool)), one) << "threads changed the bits";
    }
  }
}

// The choice cache: a second reader finds what the first remembered; a
// damaged line is skipped with a warning (the others still read); lines of
// another machine are kept when the file is rewritten.
TEST(HalfGemm, ChoiceCache) {
  std::string dir = ::testing::TempDir() + "/kiln-half-gemm-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  std::string path = dir + "/half-gemm-v2.txt";
  std::filesystem::remove(path);
  MatmulShape s;
  s.dtype = DType::BF16;
  s.m = 768;
  s.n = 512;
  s.k = 128;
  std::string k1 = halfGemmKey(s);
  s.dtype = DType::F16;
  std::string k2 = halfGemmKey(s);
  EXPECT_NE(k1, k2);
  {
    HalfGemmCache c(path, "cpu|blas");
    EXPECT_FALSE(c.lookup(k1));
    c.remember(k1, {HalfGemm::Library, 2e-4, 1e-4, 3e-4});
    c.remember(k2, {HalfGemm::Widen, 1e-4, 2e-4, 0});
  }
  {
    HalfGemmCache other(path, "another cpu|blas"); // reads none of them
    EXPECT_FALSE(other.lookup(k1));
    other.remember(k1, {HalfGemm::Widen, 1e-4, 3e-4});
  }
  HalfGemmCache c(path, "cpu|blas");
  EXPECT_EQ(c.skipped(), 0);
  ASSERT_TRUE(c.lookup(k1));
  EXPECT_EQ(c.lookup(k1)->method, HalfGemm::Library);
  EXPECT_NEAR(c.lookup(k1)->librarySeconds, 1e-4, 1e-9);
  EXPECT_NEAR(c.lookup(k1)->dotSeconds, 3e-4, 1e-9);
  EXPECT_EQ(c.lookup(k2)->method, HalfGemm::Widen);
  {
    HalfGemmCache dot(path, "cpu|blas");
    dot.remember(k2, {HalfGemm::DotProducts, 2e-4, 2e-4, 1e-4});
  }
  HalfGemmCache reread(path, "cpu|blas");
  EXPECT_EQ(reread.lookup(k2)->method, HalfGemm::DotProducts);
  {
    HalfGemmCache back(path, "cpu|blas");
    back.remember(k2, {HalfGemm::Widen, 1e-4, 2e-4, 0});
  }
  // Damage k1's line: flip its choice without fixing the check.
  std::string text;
  {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  size_t at = text.find(k1 + " library");
  ASSERT_NE(at, std::string::npos);
  text.replace(at + k1.size() + 1, 7, "widen  ");
  text += "garbage\n";
  {
    std::ofstream out(path);
    out << text;
  }
  HalfGemmCache damaged(path, "cpu|blas");
  EXPECT_EQ(damaged.skipped(), 2);
  EXPECT_FALSE(damaged.lookup(k1)); // measured again
  ASSERT_TRUE(damaged.lookup(k2));
  EXPECT_EQ(damaged.lookup(k2)->method, HalfGemm::Widen);
  HalfGemmCache missing(dir + "/none/half-gemm-v2.txt", "cpu|blas"); // no file: empty
  EXPECT_FALSE(missing.lookup(k1));
  missing.remember(k1, {HalfGemm::Widen, 1, 2}); // an unwritable path is no error
  EXPECT_TRUE(missing.lookup(k1));
  std::filesystem::remove_all(dir);
}
