//===- GpuCostTest.cpp - The GPU cost model on hand-built plans -----------===//
//
// gpu::predict() on plans whose every number is chosen: the bandwidth roof
// of a wide copy, the Little's-law limits of narrow loads and of one block,
// strided column reads, the chunked scatter_add, library GEMMs split into many calls, TF32, the
// host-bound plan of tiny kernels and what CUDA graphs change, and the
// device table. The expected values are written out from the model's
// constants (runtime/core/GpuCost.cpp), so a change of a constant shows
// here as well as in the perf guard's pinned predictions.
//
//===----------------------------------------------------------------------===//
#include "runtime/core/Counters.h"
#include "runtime/core/GpuCost.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace {

using namespace kiln;
using program::Buffer;
using program::DType;
using program::Program;
using program::Step;

const gpu::DeviceSpec &device(const char *name) {
  const gpu::DeviceSpec *d = gpu::DeviceSpec::find(name);
  EXPECT_NE(d, nullptr) << name;
  return *d;
}

Buffer buffer(int64_t bytes, DType t = DType::F32) {
  Buffer b;
  b.dtype = t;
  b.shape = {bytes / int64_t(program::dtypeBytes(t))};
  b.bytes = bytes;
  return b;
}

gpu::Launch launch(const std::string &form, int64_t grid, int64_t block = 256) {
  gpu::Launch l;
  l.function = "f";
  l.form = form;
  l.grid[0] = grid;
  l.block[0] = block;
  return l;
}

/// One kernel step reading buffer 0 and writing buffer 1, launched as `l`.
struct OneKernel {
  Program p;
  std::vector<std::vector<gpu::Launch>> launches;
  OneKernel(int64_t bytesEach, DType t, const gpu::Launch &l, int steps = 1) {
    p.buffers = {buffer(bytesEach, t), buffer(bytesEach, t)};
    p.arenaBytes = 2 * bytesEach;
    program::Kernel k;
    k.symbol = "k0";
    p.kernels = {k};
    program::Function f;
    f.name = "train_step";
    Step s;
    s.kind = Step::Kernel;
    s.kernel = 0;
    s.args = {0, 1};
    f.steps.assign(size_t(steps), s);
    p.functions = {f};
    launches = {{l}};
  }
  gpu::CostReport predict(const char *dev, gpu::CostOptions o = {}) const {
    return gpu::predict(p, p.functions[0], launches, device(dev), o);
  }
};

TEST(GpuCost, DeviceTable) {
  EXPECT_EQ(device("h200").name, "H200");
  EXPECT_EQ(device("H100").name, "H100-SXM");
  EXPECT_EQ(device("h100-sxm").name, "H100-SXM");
  EXPECT_EQ(device("A100").name, "A100-SXM");
  EXPECT_EQ(gpu::DeviceSpec::find("v100"), nullptr);
  EXPECT_EQ(gpu::DeviceSpec::find("h"), nullptr);
}

// A 1 GiB float4 copy fills the GPU: bandwidth-bound at 90% of HBM.
TEST(GpuCost, WideCopyRunsAtTheBandwidthRoof) {
  const double bytes = double(1 << 30);
  OneKernel k(1 << 29, DType::F32, launch("elementwise(float4)", 4096));
  gpu::CostReport r = k.predict("H200");
  double want = bytes / (4.8e12 * 0.90) + 1.5e-6; // + the gap between kernels
  EXPECT_NEAR(r.seconds, want, want * 1e-9);
  EXPECT_EQ(r.items.at(0).bound, "memory");
  // The H100's 3.35 TB/s: slower by the bandwidth ratio.
  double h100 = k.predict("H100-SXM").seconds - 1.5e-6;
  EXPECT_NEAR(h100 / (r.seconds - 1.5e-6), 4.8 / 3.35, 1e-9);
}

// Two-byte loads at full occupancy: 132 SMs x 2048 threads x 2 B x 2 loads
// in flight per 0.8 us = 1.35 TB/s, well under the roof.
TEST(GpuCost, NarrowLoadsAreLatencyLimited) {
  OneKernel k(1 << 29, DType::BF16, launch("elementwise", 4096));
  double inflight = 132 * 2048.0 * 2 * 2 / 0.8e-6;
  double want = double(1 << 30) / inflight + 1.5e-6;
  EXPECT_NEAR(k.predict("H200").seconds, want, want * 1e-9);
  OneKernel wide(1 << 29, DType::BF16, launch("elementwise(float4)", 4096));
  EXPECT_GT(k.predict("H200").seconds, 3 * wide.predict("H200").seconds);
}

// One block summing a whole tensor (a k = 1 column reduction) keeps only
// 256 threads' loads in flight: 256 x 4 B x 2 / 0.8 us = 2.56 GB/s.
TEST(GpuCost, OneBlockIsSlow) {
  OneKernel k(1 << 20, DType::F32, launch("columns(block per column)", 1));
  double want = double(2 << 20) / (256 * 4.0 * 2 / 0.8e-6) + 1.5e-6;
  EXPECT_NEAR(k.predict("H200").seconds, want, want * 1e-9);
}

// A block per column over many columns reads one element per 32-byte
// sector; half of the wasted sectors come from L2.
TEST(GpuCost, StridedColumnsWasteSectors) {
  OneKernel strided(64 << 20, DType::F32, launch("columns(block per column)", 384));
  OneKernel tiled(64 << 20, DType::F32, launch("columns(tiles, split)", 384 / 32 * 40));
  double moved = double(128 << 20) * (1 + 7 * 0.5);
  double threads = 384 * 256.0;
  double want = moved / std::min(4.8e12 * 0.9, threads * 32 * 2 / 0.8e-6) + 1.5e-6;
  EXPECT_NEAR(strided.predict("H200").seconds, want, want * 1e-9);
  // The tiles read 4 bytes per lane, coalesced: latency-limited at 480
  // blocks, yet faster than paying for 4.5x the bytes.
  EXPECT_GT(strided.predict("H200").seconds, 1.2 * tiled.predict("H200").seconds);
}

/// The GPU config's embedding gradient: scatter_add of 16384 indices into
/// 65 rows of 384 (updates [16384, 384] f32, indices i32, output [65, 384]).
struct Scatter {
  Program p;
  std::vector<std::vector<gpu::Launch>> launches;
  explicit Scatter(std::vector<gpu::Launch> ls) {
    p.buffers = {buffer(16384 * 384 * 4), buffer(16384 * 4, DType::I32), buffer(65 * 384 * 4)};
    p.arenaBytes = 1;
    program::Kernel k;
    k.symbol = "k0";
    k.numInputs = 2;
    p.kernels = {k};
    program::Function f;
    f.name = "train_step";
    Step s;
    s.kind = Step::Kernel;
    s.kernel = 0;
    s.args = {0, 1, 2};
    f.steps = {s};
    p.functions = {f};
    launches = {std::move(ls)};
  }
  gpu::CostReport predict() const {
    return gpu::predict(p, p.functions[0], launches, device("H200"));
  }
};

// The walk reads every index per thread, one dependent L2 hit each: 16384
// x 300 cycles at 1.98 GHz. The chunks read the updates once (127 chunks
// of 130 indices, a thread per column per chunk) and write and read back
// 127 partials of the output's size (12.7 MB each way): Little's-law
// bound at 48768 and 25088 threads.
TEST(GpuCost, ChunkedScatterReadsOnce) {
  Scatter walk({launch("scatter(by row)", 98)});
  Scatter chunks({launch("scatter(chunks)", 381, 128), launch("scatter(chunk sums)", 98)});
  const gpu::DeviceSpec &h200 = device("H200");
  double walkWant = 16384 * h200.l2LatencyCycles / h200.clockHz + 1.5e-6;
  EXPECT_NEAR(walk.predict().seconds, walkWant, walkWant * 1e-9);
  double partials = 127.0 * 65 * 384 * 4;
  double in = 16384.0 * 384 * 4 + 16384 * 4;
  double first = (in + partials) / (381 * 128 * 4.0 * 2 / 0.8e-6);
  double second = (partials + 65 * 384 * 4) / (98 * 256 * 4.0 * 2 / 0.8e-6);
  double want = first + second + 2 * 1.5e-6;
  gpu::CostReport r = chunks.predict();
  EXPECT_NEAR(r.seconds, want, want * 1e-9);
  ASSERT_EQ(r.items.size(), 1u);
  EXPECT_EQ(r.items[0].launches, 2);
  EXPECT_DOUBLE_EQ(r.items[0].bytes, in + 2 * partials + 65 * 384 * 4);
  EXPECT_LT(r.seconds, 0.3e-3);
  EXPECT_GT(walk.predict().seconds, 10 * r.seconds);
}

/// One GEMM step of `batch` matrices m x n x k.
Program gemmPlan(int64_t batch, int64_t m, int64_t n, int64_t k, DType t) {
  Program p;
  int64_t e = program::dtypeBytes(t);
  p.buffers = {buffer(batch * m * k * e, t), buffer(batch * k * n * e, t),
               buffer(batch * m * n * e, t)};
  p.arenaBytes = 1;
  program::Function f;
  f.name = "train_step";
  Step s;
  s.kind = Step::Gemm;
  s.gemm.batch = batch;
  s.gemm.m = m;
  s.gemm.n = n;
  s.gemm.k = k;
  s.gemm.dtype = t;
  s.gemm.lhsBatched = s.gemm.rhsBatched = true;
  s.args = {0, 1, 2};
  f.steps = {s};
  p.functions = {f};
  return p;
}

// The fp32 attention GEMM of the GPU config (384 matrices of 256x256x64):
// 64 calls of 6 matrices fill a few dozen of 132 SMs and pay the fixed
// per-call cost 64 times; one call of all 384 fills every SM.
TEST(GpuCost, SplitHeadGemmsAreSlow) {
  Program p = gemmPlan(384, 256, 256, 64, DType::F32);
  const auto &f = p.functions[0];
  gpu::CostOptions split;
  split.gemmSplit = [](const program::GemmParams &) { return gpu::GemmCalls{64, 6}; };
  gpu::CostReport one = gpu::predict(p, f, {}, device("H200"));
  gpu::CostReport many = gpu::predict(p, f, {}, device("H200"), split);
  EXPECT_EQ(one.libraryCalls, 1);
  EXPECT_EQ(many.libraryCalls, 64);
  // One call: 1536 tiles = 12 waves on 132 SMs (fill 1536/1584);
  // max(compute, memory) + 5 us fixed + 1.5 us gap.
  double flops = 2.0 * 384 * 256 * 256 * 64;
  double compute = flops / (66.9e12 * 0.75 * (1536.0 / 1584.0));
  double memory = double(p.buffers[0].bytes + p.buffers[1].bytes + p.buffers[2].bytes) /
                  (4.8e12 * 0.9);
  double want = std::max(compute, memory) + 5e-6 + 1.5e-6;
  EXPECT_NEAR(one.seconds, want, want * 1e-9);
  // The split: 24 tiles per call, too short a K (64) to split further ->
  // 24 of 132 slots busy.
  double perCall = std::max(flops / 64 / (66.9e12 * 0.75 * (24.0 / 132.0)), memory / 64);
  EXPECT_NEAR(many.seconds, 64 * (perCall + 5e-6 + 1.5e-6), 1e-12);
  EXPECT_GT(many.seconds, 4 * one.seconds);
}

// A large GEMM is compute-bound: TF32 on tensor cores beats fp32 on FMA
// pipes by the peaks' ratio, and bf16 by more.
TEST(GpuCost, Tf32AndHalfGemms) {
  Program f32 = gemmPlan(1, 4096, 4096, 4096, DType::F32);
  Program bf16 = gemmPlan(1, 4096, 4096, 4096, DType::BF16);
  gpu::CostOptions tf32;
  tf32.tf32 = true;
  double plain = gpu::predict(f32, f32.functions[0], {}, device("H100")).seconds;
  double fast = gpu::predict(f32, f32.functions[0], {}, device("H100"), tf32).seconds;
  double half = gpu::predict(bf16, bf16.functions[0], {}, device("H100")).seconds;
  EXPECT_GT(plain / fast, 5);
  EXPECT_LT(half, fast);
  // Compute-bound: the same on the H200 (same SMs and clocks).
  EXPECT_DOUBLE_EQ(gpu::predict(f32, f32.functions[0], {}, device("H200")).seconds, plain);
}

// A thousand tiny kernels: the host's 2.5 us per launch is slower than the
// GPU's work, so the plan is host-bound; a CUDA graph removes the per-launch
// host cost and shortens the gaps.
TEST(GpuCost, TinyKernelsAreHostBoundWithoutGraphs) {
  OneKernel k(4096, DType::F32, launch("elementwise", 4), 1000);
  gpu::CostReport plain = k.predict("H200");
  EXPECT_NEAR(plain.hostSeconds, 1000 * 2.5e-6, 1e-12);
  EXPECT_DOUBLE_EQ(plain.seconds, plain.hostSeconds);
  gpu::CostOptions graphs;
  graphs.cudaGraphs = true;
  gpu::CostReport replay = k.predict("H200", graphs);
  EXPECT_DOUBLE_EQ(replay.hostSeconds, 10e-6); // one graph launch
  EXPECT_LT(replay.seconds, 0.7 * plain.seconds);
  EXPECT_EQ(replay.launches, 1000);
}

// The counters carry each device's prediction when the plan has launches.
TEST(GpuCost, CountersCarryPredictions) {
  OneKernel k(1 << 20, DType::F32, launch("elementwise(float4)", 256));
  nlohmann::json j = nlohmann::json::parse(program::countPlan(k.p, &k.launches).toJson());
  const auto &f = j["functions"]["train_step"];
  ASSERT_TRUE(f.contains("gpu_ms_h200"));
  EXPECT_TRUE(f.contains("gpu_ms_h100_sxm"));
  EXPECT_TRUE(f.contains("gpu_ms_a100_sxm"));
  EXPECT_NEAR(f["gpu_ms_h200"].get<double>(), k.predict("H200").seconds * 1e3, 0.0005);
  // Without launches (a CPU plan): no predictions.
  nlohmann::json cpu = nlohmann::json::parse(program::countPlan(k.p).toJson());
  EXPECT_FALSE(cpu["functions"]["train_step"].contains("gpu_ms_h200"));
}

} // namespace
