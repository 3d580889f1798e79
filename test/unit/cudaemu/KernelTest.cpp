//===- KernelTest.cpp - Emulated kernels against host references ----------===//
//
// Each kernel in kernels/ runs through Module::compile and launch() and is
// compared with a double-precision host reference. Tolerances: the kernels
// accumulate in float, so a sum of n terms may differ from the exact one by
// about n * 2^-24 * sum|x| (we allow that bound); single operations are
// within a few float ulps; 16-bit outputs within one ulp of their format
// (the reference and the kernel may round a value near a rounding boundary
// differently after float math).
//
//===----------------------------------------------------------------------===//
#include "test/unit/cudaemu/EmuTest.h"

#include <cmath>
#include <cstring>

namespace kiln::cuda::emu::test {
namespace {

float halfToFloat(uint16_t h) { // reference decoder (independent of prelude)
  int e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return float((h & 0x8000) ? -v : v);
}

uint16_t bf16Bits(float f) { // reference RNE rounding, finite inputs
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t lower = x & 0xffff, upper = x >> 16;
  if (lower > 0x8000 || (lower == 0x8000 && (upper & 1)))
    ++upper;
  return uint16_t(upper);
}

float bf16ToFloat(uint16_t b) {
  uint32_t x = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

double sumBound(const std::vector<double> &terms) {
  double s = 0;
  for (double t : terms)
    s += std::fabs(t);
  return double(terms.size() + 1) * std::ldexp(1.0, -24) * s + 1e-30;
}

TEST(CudaEmuKernels, GridStrideElementwise) {
  const uint32_t seed = freshSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (long long n : {1LL, 31LL, 1000LL, 4099LL}) {
    std::vector<float> x = randomFloats(rng, size_t(n), -4.0f, 4.0f);
    std::vector<float> y(size_t(n), 0.0f);
    float a = 1.5f, b = -0.25f;
    float *py = y.data();
    const float *px = x.data();
    void *params[] = {&py, &px, &a, &b, &n};
    // 3 blocks of 128: fewer threads than elements, so every thread loops.
    ASSERT_TRUE(kernels("elementwise").launch("axpb", {3}, {128}, 0, params))
        << n;
    for (long long i = 0; i < n; ++i)
      ASSERT_NEAR(y[i], std::fma(double(a), x[i], double(b)),
                  1e-6 * std::fabs(y[i]) + 1e-7)
          << "i=" << i << " n=" << n;
  }
}

TEST(CudaEmuKernels, HalfInBfloat16Out) {
  const uint32_t seed = freshSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  long long n = 777;
  std::vector<uint16_t> x(static_cast<size_t>(n)), y(static_cast<size_t>(n), 0);
  std::uniform_int_distribution<int> mant(0, 1023), expo(10, 17), sign(0, 1);
  for (uint16_t &h : x) // |x| in [2^-5, 8): GELU's interesting range
    h = uint16_t((sign(rng) << 15) | (expo(rng) << 10) | mant(rng));
  uint16_t *py = y.data();
  const uint16_t *px = x.data();
  void *params[] = {&py, &px, &n};
  ASSERT_TRUE(kernels("elementwise").launch("gelu_h2b", {2}, {96}, 0, params));
  for (long long i = 0; i < n; ++i) {
    double v = halfToFloat(x[size_t(i)]);
    double ref =
        0.5 * v * (1 + std::tanh(0.7978845608 * (v + 0.044715 * v * v * v)));
    float got = bf16ToFloat(y[size_t(i)]);
    // One bfloat16 ulp (2^-7 relative) plus float math near the rounding.
    ASSERT_NEAR(got, ref, std::fabs(ref) * 0x1p-7 + 1e-6) << "i=" << i;
  }
}

TEST(CudaEmuKernels, TwoDimensionalGrid) {
  const uint32_t seed = freshSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  int rows = 37, cols = 53;
  std::vector<float> x = randomFloats(rng, size_t(rows * cols), -3, 3);
  std::vector<float> scale = randomFloats(rng, size_t(cols), -2, 2);
  std::vector<float> out(x.size(), 0.0f);
  float *po = out.data();
  const float *px = x.data(), *ps = scale.data();
  void *params[] = {&po, &px, &ps, &rows, &cols};
  ASSERT_TRUE(kernels("elementwise")
                  .launch("scale_cols_2d", {(53 + 15) / 16, (37 + 7) / 8},
                          {16, 8}, 0, params));
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      double v = x[size_t(r * cols + c)];
      double ref = v * scale[size_t(c)] + std::exp(-std::fabs(v));
      ASSERT_NEAR(out[size_t(r * cols + c)], ref, 4e-7 * (std::fabs(ref) + 1));
    }
}

TEST(CudaEmuKernels, Float4BodyAndScalarTail) {
  const uint32_t seed = freshSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (long long n : {3LL, 4LL, 1021LL, 4096LL}) {
    std::vector<float> x = randomFloats(rng, size_t(n) + 4, -1, 1);
    std::vector<float> y(size_t(n) + 4, 123.0f); // the slack must stay put
    float s = -3.0f;
    float *py = y.data();
    const float *px = x.data();
    void *params[] = {&py, &px, &s, &n};
    ASSERT_TRUE(kernels("vector").launch("scale4", {2}, {64}, 0, params));
    for (long long i = 0; i < n; ++i)
      ASSERT_EQ(y[size_t(i)], s * x[size_t(i)]) << "i=" << i << " n=" << n;
    for (size_t i = size_t(n); i < y.size(); ++i)
      ASSERT_EQ(y[i], 123.0f) << "wrote past n at " << i;
  }
}

TEST(CudaEmuKernels, LargeStackFrames) {
  std::vector<float> x = {1.0f, 2.0f, -0.5f, 4.0f}, out(4, 0.0f);
  int n = 7; // sum of k for k < 7 is 21
  float *po = out.data();
  const float *px = x.data();
  void *params[] = {&po, &px, &n};
  LaunchOptions options;
  options.stackBytes = 256 * 1024; // the kernel needs ~96 KiB of stack
  ASSERT_TRUE(
      kernels("vector").launch("big_frame", {1}, {4}, 0, params, options));
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(out[size_t(i)], 21.0f * x[size_t(i)]) << i;
}

TEST(CudaEmuKernelsDeathTest, StackOverflowIsNamed) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const Module &m = kernels("vector");
  std::vector<float> x = {1.0f, 2.0f, -0.5f, 4.0f}, out(4, 0.0f);
  int n = 7;
  float *po = out.data();
  const float *px = x.data();
  void *params[] = {&po, &px, &n};
  LaunchOptions options;
  options.stackBytes = 64 * 1024; // too small for big_frame
  EXPECT_DEATH((void)m.launch("big_frame", {1}, {4}, 0, params, options),
               "stack overflow in kernel 'big_frame', emulated thread 0 of "
               "block \\(0,0,0\\): its stack has 64 KiB");
}

TEST(CudaEmuKernels, WarpPerRowReduction) {
  const uint32_t seed = freshSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  int rows = 45, cols = 300;
  std::vector<float> x = randomFloats(rng, size_t(rows * cols), -1, 1);
  std::vector<float> out(size_t(rows), 0.0f);
  float *po = out.data();
  const float *px = x.data();
  void *params[] = {&po, &px, &rows, &cols};
  // 4 warps per block, 12 blocks = 48 warps for 45 rows: 3 warps leave.
  ASSERT_TRUE(
      kernels("reduce").launch("row_sum_warp", {12}, {32, 4}, 0, params));
  for (int r = 0; r < rows; ++r) {
    std::vector<double> terms(x.begin() + r * cols, x.begin() + (r + 1) * cols);
    double ref = 0;
    for (double t : terms)
      ref += t;
    ASSERT_NEAR(out[size_t(r)], ref, sumBound(terms)) << "row " << r;
  }
}

TEST(CudaEmuKernels, BlockReductionWarpZeroFinishes) {
  const uint32_t seed = freshSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  int rows = 9, cols = 1000;
  for (unsigned threads : {32u, 256u, 1024u}) {
    std::vector<float> x = randomFloats(rng, size_t(rows * cols), -1, 1);
    std::vector<float> out(size_t(rows), 0.0f);
    float *po = out.data();
    const float *px = x.data();
    void *params[] = {&po, &px, &cols};
    ASSERT_TRUE(kernels("reduce").launch("row_sum_block", {unsigned(rows)},
                                         {threads}, 0, params))
        << threads;
    for (int r = 0; r < rows; ++r) {
      std::vector<double> terms(x.begin() + r * cols,
                                x.begin() + (r + 1) * cols);
      double ref = 0;
      for (double t : terms)
        ref += t;
      ASSERT_NEAR(out[size_t(r)], ref, sumBound(terms))
          << "row " << r << ", " << threads << " threads";
    }
  }
}

TEST(CudaEmuKernels, ColumnReduction) {
  const uint32_t seed = freshSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  int rows = 200, cols = 130;
  std::vector<float> x = randomFloats(rng, size_t(rows * cols), -1, 1);
  std::vector<float> out(size_t(cols), 0.0f);
  float *po = out.data();
  const float *px = x.data();
  void *params[] = {&po, &px, &rows, &cols};
  ASSERT_TRUE(kernels("reduce").launch("col_sum", {3}, {64}, 0, params));
  for (int c = 0; c < cols; ++c) {
    std::vector<double> terms;
    double ref = 0;
    for (int r = 0; r < rows; ++r) {
      terms.push_back(x[size_t(r * cols + c)]);
      ref += terms.back();
    }
    ASSERT_NEAR(out[size_t(c)], ref, sumBound(terms)) << "column " << c;
  }
}

TEST(CudaEmuKernels, AtomicAccumulation) {
  const uint32_t seed = freshSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  long long n = 10007;
  std::vector<float> x = randomFloats(rng, size_t(n), -1, 1);
  std::vector<double> terms(x.begin(), x.end());
  double ref = 0;
  int positives = 0;
  for (float v : x) {
    ref += v;
    positives += v > 0;
  }
  for (unsigned threads : {1u, 3u}) {
    float sum = 0.0f;
    int count = 0;
    float *ps = &sum;
    int *pc = &count;
    const float *px = x.data();
    void *params[] = {&ps, &pc, &px, &n};
    LaunchOptions options;
    options.threads = threads; // several OS threads: real atomics
    ASSERT_TRUE(
        kernels("reduce").launch("atomic_sum", {7}, {128}, 0, params, options));
    EXPECT_EQ(count, positives) << threads << " OS threads";
    EXPECT_NEAR(sum, ref, sumBound(terms)) << threads << " OS threads";
  }
}

std::vector<double> softmaxRef(const float *row, int cols) {
  double m = -INFINITY, s = 0;
  for (int c = 0; c < cols; ++c)
    m = std::max(m, double(row[c]));
  std::vector<double> out(static_cast<size_t>(cols));
  for (int c = 0; c < cols; ++c)
    s += out[size_t(c)] = std::exp(row[c] - m);
  for (double &v : out)
    v /= s;
  return out;
}

TEST(CudaEmuKernels, SoftmaxWithDynamicSharedMemory) {
  const uint32_t seed = freshSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  int rows = 21, cols = 333;
  std::vector<float> x = randomFloats(rng, size_t(rows * cols), -8, 8);
  std::vector<float> y(x.size(), 0.0f), again(x.size(), 0.0f);
  const float *px = x.data();
  size_t shared = size_t(cols + 32) * sizeof(float);
  for (std::vector<float> *out : {&y, &again}) {
    float *py = out->data();
    void *params[] = {&py, &px, &cols};
    ASSERT_TRUE(kernels("softmax").launch("softmax_rows", {unsigned(rows)},
                                          {128}, shared, params));
  }
  // Emulation is deterministic: the same bits on every run.
  EXPECT_EQ(0, std::memcmp(y.data(), again.data(), y.size() * sizeof(float)));
  for (int r = 0; r < rows; ++r) {
    std::vector<double> ref = softmaxRef(&x[size_t(r * cols)], cols);
    for (int c = 0; c < cols; ++c) // exp and a normalised sum in float
      ASSERT_NEAR(y[size_t(r * cols + c)], ref[size_t(c)],
                  2e-6 * ref[size_t(c)] + 1e-9)
          << "row " << r << " col " << c;
  }
}

TEST(CudaEmuKernels, LayerNormThreeOutputsBfloat16) {
  const uint32_t seed = freshSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  int rows = 6, cols = 384;
  float eps = 1e-5f;
  std::vector<float> xf = randomFloats(rng, size_t(rows * cols), -3, 3);
  std::vector<uint16_t> x(xf.size()), y(xf.size(), 0);
  for (size_t i = 0; i < xf.size(); ++i)
    x[i] = bf16Bits(xf[i]);
  std::vector<float> gamma = randomFloats(rng, size_t(cols), 0.5f, 1.5f);
  std::vector<float> beta = randomFloats(rng, size_t(cols), -0.5f, 0.5f);
  std::vector<float> mean(static_cast<size_t>(rows)),
      rstd(static_cast<size_t>(rows));
  uint16_t *py = y.data();
  float *pm = mean.data(), *pr = rstd.data();
  const uint16_t *px = x.data();
  const float *pg = gamma.data(), *pb = beta.data();
  void *params[] = {&py, &pm, &pr, &px, &pg, &pb, &cols, &eps};
  ASSERT_TRUE(kernels("softmax").launch("layernorm_bf16", {unsigned(rows)},
                                        {256}, 0, params));
  for (int r = 0; r < rows; ++r) {
    double mu = 0, var = 0;
    for (int c = 0; c < cols; ++c)
      mu += bf16ToFloat(x[size_t(r * cols + c)]);
    mu /= cols;
    for (int c = 0; c < cols; ++c) {
      double d = bf16ToFloat(x[size_t(r * cols + c)]) - mu;
      var += d * d;
    }
    double rs = 1.0 / std::sqrt(var / cols + eps);
    EXPECT_NEAR(mean[size_t(r)], mu, 1e-5);
    EXPECT_NEAR(rstd[size_t(r)], rs, 1e-5 * rs);
    for (int c = 0; c < cols; ++c) {
      double ref =
          (bf16ToFloat(x[size_t(r * cols + c)]) - mu) * rs * gamma[size_t(c)] +
          beta[size_t(c)];
      ASSERT_NEAR(bf16ToFloat(y[size_t(r * cols + c)]), ref,
                  std::fabs(ref) * 0x1p-7 + 1e-5)
          << "row " << r << " col " << c;
    }
  }
}

TEST(CudaEmuKernels, SeveralOsThreadsGiveTheSameBits) {
  const uint32_t seed = freshSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  int rows = 40, cols = 200;
  std::vector<float> x = randomFloats(rng, size_t(rows * cols), -5, 5);
  std::vector<float> one(x.size()), three(x.size());
  const float *px = x.data();
  size_t shared = size_t(cols + 32) * sizeof(float);
  for (auto [out, threads] : {std::pair{&one, 1u}, std::pair{&three, 3u}}) {
    float *py = out->data();
    void *params[] = {&py, &px, &cols};
    LaunchOptions options;
    options.threads = threads;
    LaunchStats stats;
    ASSERT_TRUE(kernels("softmax").launch("softmax_rows", {unsigned(rows)},
                                          {64}, shared, params, options,
                                          &stats));
    EXPECT_EQ(stats.osThreads, threads);
    EXPECT_EQ(stats.blocks, uint64_t(rows));
  }
  EXPECT_EQ(0,
            std::memcmp(one.data(), three.data(), one.size() * sizeof(float)));
}

/// Not a benchmark gate: prints the emulator's speed on a realistic row
/// kernel (768 rows, 128 threads per row) so regressions are visible.
TEST(CudaEmuKernels, SoftmaxThroughput) {
  const uint32_t seed = freshSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  int rows = 768, cols = 768;
  std::vector<float> x = randomFloats(rng, size_t(rows) * cols, -4, 4);
  std::vector<float> y(x.size(), 0.0f);
  float *py = y.data();
  const float *px = x.data();
  void *params[] = {&py, &px, &cols};
  LaunchStats stats;
  ASSERT_TRUE(kernels("softmax").launch("softmax_rows", {unsigned(rows)}, {128},
                                        size_t(cols + 32) * 4, params, {},
                                        &stats));
  std::printf("[ emulator ] softmax %d x %d, 128 threads/row: %.3f s, %llu "
              "fiber switches (%.1f M/s)\n",
              rows, cols, stats.seconds, (unsigned long long)stats.switches,
              stats.switches / stats.seconds / 1e6);
  std::vector<double> ref = softmaxRef(&x[size_t(rows - 1) * cols], cols);
  for (int c = 0; c < cols; ++c)
    ASSERT_NEAR(y[size_t(rows - 1) * cols + c], ref[size_t(c)],
                2e-6 * ref[size_t(c)] + 1e-9);
}

} // namespace
} // namespace kiln::cuda::emu::test
