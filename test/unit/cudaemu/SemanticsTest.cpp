//===- SemanticsTest.cpp - Warp primitives, barriers and misuse reports ---===//
//
// The lane arithmetic of every warp primitive against CUDA's documented
// rules (written out independently here), barrier variants, and the errors
// the emulator must report instead of hanging: divergent barriers,
// deadlocks, lanes missing from a shuffle, bad masks and widths, __trap.
//
//===----------------------------------------------------------------------===//
#include "test/unit/cudaemu/EmuTest.h"

#include <cmath>

namespace kiln::cuda::emu::test {
namespace {

/// The CUDA Programming Guide's description of each shuffle, per lane.
int expectedShuffle(int kind, int lane, int arg, int width) {
  const int group = lane / width * width, inGroup = lane % width;
  switch (kind) {
  case 0: // __shfl_sync: lane srcLane % width of the caller's group
    return group + arg % width;
  case 1: // __shfl_up_sync: lane - delta, unchanged below the group start
    return inGroup >= arg ? lane - arg : lane;
  case 2: // __shfl_down_sync: lane + delta, unchanged past the group end
    return inGroup + arg < width ? lane + arg : lane;
  default: { // __shfl_xor_sync: lane ^ mask; later groups give the own value
    int src = lane ^ arg;
    return src >= group + width ? lane : src;
  }
  }
}

TEST(CudaEmuSemantics, WarpPrimitives) {
  for (int width : {32, 16, 8, 4}) {
    std::vector<int> out(9 * 64, -1);
    std::vector<double> dout(2 * 64, -1);
    int *po = out.data();
    double *pd = dout.data();
    void *params[] = {&po, &pd, &width};
    ASSERT_TRUE(kernels("warp").launch("primitives", {1}, {64}, 0, params));
    for (int t = 0; t < 64; ++t) {
      const int lane = t & 31, base = t - lane;
      const int args[] = {5, 3, 3, 5};
      for (int k = 0; k < 4; ++k)
        EXPECT_EQ(out[size_t(k * 64 + t)],
                  100 + base + expectedShuffle(k, lane, args[k], width))
            << "primitive " << k << " thread " << t << " width " << width;
      unsigned ballot = 0;
      for (int l = 0; l < 32; ++l)
        if ((base + l) % 3 == 0)
          ballot |= 1u << l;
      EXPECT_EQ(unsigned(out[size_t(4 * 64 + t)]), ballot) << t;
      EXPECT_EQ(out[size_t(5 * 64 + t)], base == 0 ? 1 : 0) << t; // t == 7
      EXPECT_EQ(out[size_t(6 * 64 + t)], base == 0 ? 1 : 0) << t; // t < 40
      EXPECT_EQ(out[size_t(7 * 64 + t)], 32 * base + 496) << t;   // sum of ids
      EXPECT_EQ(out[size_t(8 * 64 + t)], 20 - base) << t;         // max(20 - t)
      EXPECT_EQ(dout[size_t(t)], 0.25 + (t ^ 1)) << t;
      EXPECT_EQ(dout[size_t(64 + t)], lane == 31 ? t : t + 1) << t;
    }
  }
}

TEST(CudaEmuSemantics, HalfWarpsShuffleOnTheirOwn) {
  std::vector<int> out(64, -1);
  int *po = out.data();
  void *params[] = {&po};
  ASSERT_TRUE(kernels("warp").launch("split_halves", {1}, {64}, 0, params));
  for (int t = 0; t < 64; ++t) {
    const int lane = t & 31;
    if (lane == 15) // reads lane 16, outside its mask: poison (0x7fc0bad0)
      EXPECT_EQ(out[size_t(t)], t + 0x7fc0bad0) << t;
    else if (lane < 16)
      EXPECT_EQ(out[size_t(t)], t + t + 1) << t;
    else
      EXPECT_EQ(out[size_t(t)], t + (t ^ 1)) << t;
  }
}

TEST(CudaEmuSemantics, ActiveMaskGroupsLanesByCallSite) {
  std::vector<unsigned> out(64, 0);
  unsigned *po = out.data();
  void *params[] = {&po};
  ASSERT_TRUE(kernels("warp").launch("active_mask", {1}, {64}, 0, params));
  for (int t = 0; t < 64; ++t)
    EXPECT_EQ(out[size_t(t)], (t & 31) < 10 ? 0x3ffu : ~0x3ffu) << t;
}

TEST(CudaEmuSemantics, BarrierVariantsAndSyncwarp) {
  std::vector<int> out(4 * 96, -1);
  int *po = out.data();
  void *params[] = {&po};
  ASSERT_TRUE(kernels("warp").launch("barrier_variants", {2}, {96}, 0, params));
  for (int t = 0; t < 96; ++t) {
    EXPECT_EQ(out[size_t(t)], 32) << t;         // t % 3 == 0
    EXPECT_EQ(out[size_t(96 + t)], 1) << t;     // all t < 1000
    EXPECT_EQ(out[size_t(2 * 96 + t)], 1) << t; // t == 77 exists
    EXPECT_EQ(out[size_t(3 * 96 + t)], 2 * (t ^ 1)) << t;
  }
}

TEST(CudaEmuSemantics, WarpsAreConsecutiveLinearIds) {
  std::vector<int> out(128, -1);
  int *po = out.data();
  void *params[] = {&po};
  ASSERT_TRUE(kernels("warp").launch("block3d", {1}, {8, 4, 2}, 0, params));
  for (int t = 0; t < 64; ++t) {
    EXPECT_EQ(out[size_t(t)], t / 32 * 32) << t;
    EXPECT_EQ(out[size_t(64 + t)], t % 32) << t;
  }
}

// kiln_warp_max/kiln_block_max propagate a NaN that one lane holds (fmaxf
// would drop it, unlike the CPU's maximumf); double sums stay double (1 +
// 2^-40 per lane is lost in float).
TEST(CudaEmuSemantics, PreludeReductionsKeepNaNAndDoubles) {
  std::vector<float> x(64), out(192, -1);
  std::vector<double> dx(64), dout(128, -1);
  for (int t = 0; t < 64; ++t) {
    x[size_t(t)] = float(t % 7) - 3;
    dx[size_t(t)] = 1 + std::ldexp(1.0, -40);
  }
  x[40] = std::nanf(""); // second warp only
  const float *px = x.data();
  float *po = out.data();
  const double *pdx = dx.data();
  double *pdo = dout.data();
  void *params[] = {&px, &po, &pdx, &pdo};
  ASSERT_TRUE(kernels("warp").launch("reductions", {1}, {64}, 0, params));
  for (int t = 0; t < 64; ++t) {
    if (t < 32)
      EXPECT_EQ(out[size_t(t)], 3.0f) << t;
    else
      EXPECT_TRUE(std::isnan(out[size_t(t)])) << "warp max, lane " << t;
    EXPECT_TRUE(std::isnan(out[size_t(64 + t)])) << "block max, thread " << t;
    EXPECT_TRUE(std::isnan(out[size_t(128 + t)])) << "block sum, thread " << t;
    EXPECT_EQ(dout[size_t(t)], 32 * (1 + std::ldexp(1.0, -40))) << t;
    EXPECT_EQ(dout[size_t(64 + t)], 64 * (1 + std::ldexp(1.0, -40))) << t;
  }
}

//===--- Misuse is reported, never a hang ---------------------------------===//

Status runErrorKernel(const std::string &kernel, unsigned threads,
                      bool strict = true) {
  std::vector<float> x(64, 1.0f);
  float *px = x.data();
  void *params[] = {&px};
  LaunchOptions options;
  options.strict = strict;
  return kernels("errors").launch(kernel, {2}, {threads}, 0, params, options);
}

std::string line(const std::string &marker) {
  return "line " + std::to_string(markerLine("errors", marker));
}

TEST(CudaEmuErrors, SyncthreadsSkippedByExitedThreads) {
  Status s = runErrorKernel("barrier_divergence", 64);
  ASSERT_FALSE(s);
  EXPECT_CONTAINS(s.message(),
                  "CUDA emulator: kernel 'barrier_divergence', block (0,0,0)");
  EXPECT_CONTAINS(s.message(),
                  "barrier divergence: threads 0..15 wait at __syncthreads (" +
                      line("barrier_divergence") + ")");
  EXPECT_CONTAINS(s.message(), "threads 16..63 exited");
  // PTX's rule (exited threads count as arrived) lets it finish.
  EXPECT_TRUE(runErrorKernel("barrier_divergence", 64, /*strict=*/false));
}

TEST(CudaEmuErrors, SyncthreadsAtDifferentLines) {
  Status s = runErrorKernel("barrier_sites", 64);
  ASSERT_FALSE(s);
  EXPECT_CONTAINS(s.message(),
                  "divergent barrier: threads 0..31 wait at __syncthreads (" +
                      line("barrier_sites_a") + ") while threads 32..63");
  EXPECT_CONTAINS(s.message(), line("barrier_sites_b"));
  EXPECT_TRUE(runErrorKernel("barrier_sites", 64, /*strict=*/false));
}

TEST(CudaEmuErrors, DeadlockBetweenBarrierAndShuffle) {
  for (bool strict : {true, false}) {
    Status s = runErrorKernel("barrier_vs_shuffle", 32, strict);
    ASSERT_FALSE(s);
    EXPECT_CONTAINS(s.message(), "deadlock: no thread can proceed");
    EXPECT_CONTAINS(s.message(), "threads 0..15: wait at __syncthreads (" +
                                     line("barrier_vs_shuffle_bar") + ")");
    EXPECT_CONTAINS(s.message(),
                    "threads 16..31: wait at __shfl_xor_sync (" +
                        line("barrier_vs_shuffle_shfl") +
                        ", mask 0xffffffff) for lanes 0..15 of warp 0");
  }
}

TEST(CudaEmuErrors, ShuffleLaneExitsWhileOthersWait) {
  Status s = runErrorKernel("shuffle_after_exit", 32);
  ASSERT_FALSE(s);
  EXPECT_CONTAINS(s.message(),
                  "thread 5 (lane 5 of warp 0) exited while lanes 0..4 of "
                  "warp 0 wait for it in __shfl_xor_sync (" +
                      line("shuffle_after_exit") + ", mask 0xffffffff)");
}

TEST(CudaEmuErrors, ShuffleNamesAnExitedLane) {
  Status s = runErrorKernel("shuffle_exited_first", 32);
  ASSERT_FALSE(s);
  EXPECT_CONTAINS(s.message(),
                  "thread 1 (lane 1 of warp 0) calls __shfl_down_sync (" +
                      line("shuffle_exited_first") +
                      ", mask 0xffffffff), but in warp 0 lanes 0 have exited");
  // Non-strict: lane 0 no longer takes part; lane 31 reads its own value.
  EXPECT_TRUE(runErrorKernel("shuffle_exited_first", 32, /*strict=*/false));
}

TEST(CudaEmuErrors, ShuffleLanesDivergeIntoDifferentShuffles) {
  Status s = runErrorKernel("shuffle_diverged", 32);
  ASSERT_FALSE(s);
  EXPECT_CONTAINS(s.message(), "deadlock");
  EXPECT_CONTAINS(s.message(),
                  "threads 0..15: wait at __shfl_xor_sync (" +
                      line("shuffle_diverged_xor") +
                      ", mask 0xffffffff) for lanes 16..31 of warp 0");
  EXPECT_CONTAINS(s.message(),
                  "threads 16..31: wait at __shfl_down_sync (" +
                      line("shuffle_diverged_down") +
                      ", mask 0xffffffff) for lanes 0..15 of warp 0");
}

TEST(CudaEmuErrors, FullMaskInPartialWarp) {
  Status s = runErrorKernel("partial_warp", 48);
  ASSERT_FALSE(s);
  EXPECT_CONTAINS(s.message(),
                  "lanes 16..31 do not exist (the block has 48 threads)");
  EXPECT_TRUE(runErrorKernel("partial_warp", 48, /*strict=*/false));
}

TEST(CudaEmuErrors, MaskWithoutTheCallingLane) {
  Status s = runErrorKernel("mask_without_self", 32);
  ASSERT_FALSE(s);
  EXPECT_CONTAINS(s.message(), "whose mask does not include its own lane 0");
}

TEST(CudaEmuErrors, ShuffleWidthNotAPowerOfTwo) {
  Status s = runErrorKernel("bad_width", 32);
  ASSERT_FALSE(s);
  EXPECT_CONTAINS(s.message(),
                  "with width 12; the width must be a power of two");
}

TEST(CudaEmuErrors, TrapStopsTheKernel) {
  Status s = runErrorKernel("trap_kernel", 32);
  ASSERT_FALSE(s);
  EXPECT_CONTAINS(s.message(),
                  "thread 3 (lane 3 of warp 0) stopped the kernel: "
                  "__trap() called (" +
                      line("trap") + ")");
}

TEST(CudaEmuErrors, LaunchAfterAnErrorStillWorks) {
  ASSERT_FALSE(runErrorKernel("barrier_vs_shuffle", 32));
  ASSERT_FALSE(runErrorKernel("trap_kernel", 32));
  std::vector<int> out(64, -1);
  int *po = out.data();
  void *params[] = {&po};
  ASSERT_TRUE(kernels("warp").launch("split_halves", {1}, {64}, 0, params));
  EXPECT_EQ(out[0], 1);
}

TEST(CudaEmuErrors, InvalidLaunchConfigurations) {
  std::vector<float> x(64, 1.0f);
  float *px = x.data();
  void *params[] = {&px};
  const Module &m = kernels("errors");
  Status s = m.launch("trap_kernel", {1}, {2048}, 0, params);
  EXPECT_CONTAINS(s.message(), "has 2048 threads; CUDA allows at most 1024");
  s = m.launch("trap_kernel", {1}, {32, 1, 65}, 0, params);
  EXPECT_CONTAINS(s.message(), "(1024, 1024, 64) per dimension");
  s = m.launch("trap_kernel", {0}, {32}, 0, params);
  EXPECT_CONTAINS(s.message(), "must not be empty");
  s = m.launch("trap_kernel", {1, 70000}, {32}, 0, params);
  EXPECT_CONTAINS(s.message(), "exceeds CUDA's (2^31-1, 65535, 65535)");
  s = m.launch("trap_kernel", {1}, {32}, 64 * 1024, params);
  EXPECT_CONTAINS(s.message(), "65536 bytes of dynamic shared memory exceed");
  s = m.launch("no_such_kernel", {1}, {32}, 0, params);
  EXPECT_CONTAINS(s.message(), "has no kernel 'no_such_kernel'");
}

} // namespace
} // namespace kiln::cuda::emu::test
