//===- CountersTest.cpp - The perf guard's counters of a hand-built plan --===//
//
// countPlan() on a plan whose every number is known: one kernel step, a
// GEMM with an epilogue kernel (with and without a library epilogue), a
// copy and a collective, on two devices with different arenas.
//
//===----------------------------------------------------------------------===//
#include "runtime/core/Counters.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace {

using namespace kiln::program;

Buffer buffer(int64_t offset, int64_t bytes, Role role = Role::Temp) {
  Buffer b;
  b.role = role;
  b.shape = {bytes / 4};
  b.offset = offset;
  b.bytes = bytes;
  return b;
}

Program plan() {
  Program p;
  // 0: param (16 B), 1: input (32 B), 2: temp (64 B), 3: output (128 B),
  // 4: bias (8 B).
  p.buffers = {buffer(0, 16, Role::Param), buffer(64, 32, Role::Input),
               buffer(128, 64), buffer(192, 128, Role::Output),
               buffer(320, 8, Role::Param)};
  p.persistentBytes = 64;
  p.arenaBytes = 384;
  BufferPlan other = p; // device 1: a larger persistent region and arena
  other.persistentBytes = 96;
  other.arenaBytes = 416;
  p.otherDevices = {other};
  p.mesh.axes = {{"dp", 2}};
  p.queues = 2;

  Kernel relu;
  relu.symbol = "k0_relu";
  relu.ops = {"kiln.relu"};
  relu.flops = 10;
  Kernel biasGelu;
  biasGelu.symbol = "k1_add_gelu";
  biasGelu.ops = {"kiln.add", "kiln.gelu", "kiln.mul"};
  biasGelu.flops = 100;
  p.kernels = {relu, biasGelu};

  Function f;
  f.name = "train_step";
  f.scratchBytes = 256;
  Step k;
  k.kind = Step::Kernel;
  k.kernel = 0;
  k.args = {1, 2}; // 32 + 64 bytes
  Step g;
  g.kind = Step::Gemm;
  g.gemm.batch = 2;
  g.gemm.m = 3;
  g.gemm.n = 4;
  g.gemm.k = 5;       // 2 * 2*3*4*5 = 240 FLOPs
  g.args = {1, 0, 2}; // 32 + 16 + 64 bytes
  g.epilogue = 1;
  g.epilogueArgs = {2, 4, 3}; // 64 + 8 + 128 bytes
  Step g2 = g;                // the same with a library epilogue
  g2.lt.out = 3;
  g2.lt.bias = 4;
  Step c;
  c.kind = Step::Copy;
  c.args = {3, 0}; // 128 + 16 bytes
  Step coll;
  coll.kind = Step::Collective;
  coll.args = {0, 0};
  coll.collective.bytes = 4096;
  coll.queue = 1;
  f.steps = {k, g, g2, c, coll};
  Function e;
  e.name = "eval_step";
  e.scratchBytes = 32;
  e.steps = {k};
  p.functions = {f, e};
  return p;
}

TEST(Counters, CountsEveryStepKind) {
  Counters c = countPlan(plan());
  EXPECT_EQ(c.devices, 2);
  EXPECT_EQ(c.queues, 2);
  EXPECT_EQ(c.arenaBytes, 416); // the larger device's
  EXPECT_EQ(c.persistentBytes, 96);
  ASSERT_EQ(c.functions.size(), 2u);
  const FunctionCounters &t = c.functions[0];
  EXPECT_EQ(t.function, "train_step");
  EXPECT_EQ(t.steps, 5);
  EXPECT_EQ(t.kernels, 3); // the kernel step and two epilogues
  EXPECT_EQ(t.gemms, 2);
  EXPECT_EQ(t.copies, 1);
  EXPECT_EQ(t.flops, 10 + 2 * (240 + 100));
  EXPECT_EQ(t.bytes,
            (32 + 64) + 2 * ((32 + 16 + 64) + (64 + 8 + 128)) + (128 + 16));
  EXPECT_EQ(t.collectives, 1);
  EXPECT_EQ(t.collectiveBytes, 4096);
  EXPECT_EQ(t.peakBytes, 96 + 256);
  EXPECT_EQ(t.fusedOps,
            2 * 3); // the three-op epilogue, twice; relu is not fused
  EXPECT_EQ(t.cudaLaunches, -1);
  const FunctionCounters &e = c.functions[1];
  EXPECT_EQ(e.function, "eval_step");
  EXPECT_EQ(e.kernels, 1);
  EXPECT_EQ(e.gemms, 0);
  EXPECT_EQ(e.peakBytes, 96 + 32);
}

TEST(Counters, CudaLaunchesSkipLibraryEpilogues) {
  std::vector<std::vector<kiln::gpu::Launch>> launches(2);
  launches[0].resize(1); // relu: one launch
  launches[1].resize(
      2); // the epilogue: two launches (e.g. a row pass and a column pass)
  Counters c = countPlan(plan(), &launches);
  // kernel 1 + GEMM 1 + epilogue 2 + GEMM with library epilogue 1.
  EXPECT_EQ(c.functions[0].cudaLaunches, 1 + (1 + 2) + 1);
  EXPECT_EQ(c.functions[0].cudaGemmCalls, 2);
  EXPECT_EQ(c.functions[1].cudaLaunches, 1);
  EXPECT_EQ(c.functions[1].cudaGemmCalls, 0);
  auto j = nlohmann::ordered_json::parse(c.toJson());
  EXPECT_EQ(j["functions"]["train_step"]["cuda_gemm_calls"], 2);
}

// A head GEMM counts the library calls the runtime makes (gpu::planGemm):
// scores = Q K^T over 8 batch entries x 2 heads, q and k [8, T, 2, D] read
// in place: a call per head (2), or per entry (8) with the legacy plan.
TEST(Counters, CudaGemmCallsFollowTheGemmPlan) {
  Program p = plan();
  Step &g = p.functions[0].steps[1];
  const int64_t B = 8, H = 2, T = 4, D = 3;
  g.gemm = GemmParams();
  g.gemm.batch = B * H;
  g.gemm.m = g.gemm.n = T;
  g.gemm.k = D;
  g.gemm.transposeRhs = true;
  g.gemm.lhsBatched = g.gemm.rhsBatched = true;
  g.gemm.heads = H;
  g.gemm.lhsLayout = g.gemm.rhsLayout = {T * H * D, D, H * D};
  g.gemm.outLayout = {H * T * T, T * T, T};
  std::vector<std::vector<kiln::gpu::Launch>> launches(2);
  launches[0].resize(1);
  launches[1].resize(2);
  Counters c = countPlan(p, &launches);
  EXPECT_EQ(c.functions[0].cudaGemmCalls, H + 1);
  EXPECT_EQ(c.functions[0].cudaLaunches, 1 + (H + 2) + 1);
  Counters old = countPlan(p, &launches, kiln::gpu::GemmPlanForm::Legacy);
  EXPECT_EQ(old.functions[0].cudaGemmCalls, B + 1);
  EXPECT_EQ(old.functions[0].cudaLaunches, 1 + (B + 2) + 1);
}

TEST(Counters, JsonKeepsItsKeyOrder) {
  Counters c = countPlan(plan());
  std::string text = c.toJson();
  EXPECT_EQ(text, countPlan(plan()).toJson()); // deterministic
  auto j = nlohmann::ordered_json::parse(text);
  std::vector<std::string> top, counters;
  for (auto &[k, v] : j.items())
    top.push_back(k);
  for (auto &[k, v] : j["functions"]["train_step"].items())
    counters.push_back(k);
  EXPECT_EQ(top, (std::vector<std::string>{"devices", "queues", "arena_bytes",
                                           "persistent_bytes", "functions"}));
  EXPECT_EQ(counters,
            (std::vector<std::string>{
                "steps", "kernels", "gemms", "copies", "flops", "bytes",
                "collectives", "collective_bytes", "peak_bytes", "fused_ops"}));
  EXPECT_EQ(j["functions"].begin().key(),
            "train_step"); // plan order, not sorted
  EXPECT_EQ(j["functions"]["train_step"]["flops"], 10 + 2 * (240 + 100));
}

} // namespace
