//===- OverviewTest.cpp - The step-time breakdown on synthetic spans ------===//
//
// runtime/train/Overview.h's arithmetic on hand-made spans whose answers
// are known exactly: gaps measured as idle, waits nested in other spans
// counted once, collectives that overlap compute, spans outside the steps
// (evaluation, checkpoint) kept out, and the check that catches spans that
// do not tile the step. Times are in milliseconds written as seconds; the
// tolerance, 1e-12 s, is rounding of sums of a few doubles.
//
//===----------------------------------------------------------------------===//
#include "runtime/train/Overview.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>

using namespace kiln;
using namespace kiln::train;

namespace {

constexpr double ms = 1e-3, tol = 1e-12;

Span span(Span::Kind k, double startMs, double lenMs, std::string name = "", int queue = 0) {
  Span s;
  s.kind = k;
  s.start = startMs * ms;
  s.seconds = lenMs * ms;
  s.name = std::move(name);
  s.queue = queue;
  return s;
}

Span step(int64_t n, double startMs, double lenMs) {
  Span s = span(Span::Step, startMs, lenMs, "step");
  s.step = n;
  return s;
}

TEST(Overview, GapsAreIdleAndThePartsAddUp) {
  std::vector<Span> spans = {
      step(1, 0, 10), span(Span::DataWait, 0, 1), span(Span::Kernel, 1, 2, "k0"),
      // gap 3..4
      span(Span::Gemm, 4, 4, "gemm 8x8x8 NN"),
      // gap 8..10 (reading the loss back)
  };
  Breakdown b = breakdown(spans);
  EXPECT_EQ(b.steps, 1);
  EXPECT_NEAR(b.step, 10 * ms, tol);
  EXPECT_NEAR(b.input, 1 * ms, tol);
  EXPECT_NEAR(b.kernel, 2 * ms, tol);
  EXPECT_NEAR(b.gemm, 4 * ms, tol);
  EXPECT_NEAR(b.idle, 3 * ms, tol);
  EXPECT_NEAR(b.coverage(), 1.0, 1e-9);
}

TEST(Overview, NestedWaitsCountOnce) {
  // The copy to the device waits for data inside itself: 2 ms of data
  // wait, 2 ms of copying, not 4 ms of copying.
  std::vector<Span> spans = {
      step(1, 0, 10),
      span(Span::HostToDevice, 0, 4),
      span(Span::DataWait, 1, 2),
      span(Span::Kernel, 4, 6, "k0"),
  };
  Breakdown b = breakdown(spans);
  EXPECT_NEAR(b.input, 2 * ms, tol);
  EXPECT_NEAR(b.hostToDevice, 2 * ms, tol);
  EXPECT_NEAR(b.kernel, 6 * ms, tol);
  EXPECT_NEAR(b.idle, 0, tol);
  EXPECT_NEAR(b.coverage(), 1.0, 1e-9);
}

TEST(Overview, OverlappedCollectivesAreShownNotSummed) {
  // An all-reduce runs 2..9 on queue 1; queue 0 computes until 6 and then
  // waits for it until 9: 3 ms exposed, 4 ms overlapped.
  std::vector<Span> spans = {
      step(1, 0, 10),
      span(Span::Kernel, 0, 6, "k0"),
      span(Span::Collective, 2, 7, "all_reduce", 1),
      span(Span::CollectiveWait, 6, 3, "all_reduce", 1),
      span(Span::Kernel, 9, 1, "k1"),
  };
  Breakdown b = breakdown(spans);
  EXPECT_NEAR(b.commExposed, 3 * ms, tol);
  EXPECT_NEAR(b.commOverlapped, 4 * ms, tol);
  EXPECT_NEAR(b.kernel, 7 * ms, tol);
  EXPECT_NEAR(b.idle, 0, tol);
  EXPECT_NEAR(b.coverage(), 1.0, 1e-9);
  // A synchronous collective: its run and its wait are the same time.
  std::vector<Span> sync = {
      step(1, 0, 4),
      span(Span::Collective, 0, 4, "all_reduce", 1),
      span(Span::CollectiveWait, 0, 4, "all_reduce", 1),
  };
  Breakdown s = breakdown(sync);
  EXPECT_NEAR(s.commExposed, 4 * ms, tol);
  EXPECT_NEAR(s.commOverlapped, 0, tol);
  EXPECT_NEAR(s.coverage(), 1.0, 1e-9);
}

TEST(Overview, CollectivesOverlappingEachOtherAreNotOverlappedWithCompute) {
  // A synchronous all-reduce on queue 0 (0..3) beside an asynchronous one
  // on queue 1 (0..4, waited for 3..4), then a kernel (4..5): 7 ms of run
  // time in a 5 ms step, all of it beside the other collective or waited
  // for, none beside compute (run - exposed would say 3 ms).
  std::vector<Span> spans = {
      step(1, 0, 5),
      span(Span::Collective, 0, 3, "all_reduce"),
      span(Span::CollectiveWait, 0, 3, "all_reduce"),
      span(Span::Collective, 0, 4, "all_reduce", 1),
      span(Span::CollectiveWait, 3, 1, "all_reduce", 1),
      span(Span::Kernel, 4, 1, "k0"),
  };
  Breakdown b = breakdown(spans);
  EXPECT_NEAR(b.commExposed, 4 * ms, tol);
  EXPECT_NEAR(b.commOverlapped, 0, tol);
  EXPECT_NEAR(b.coverage(), 1.0, 1e-9);
}

TEST(Overview, MeansOverStepsAndBetweenStepsApart) {
  std::vector<Span> spans = {
      step(1, 0, 10),
      span(Span::Kernel, 0, 10, "k0"),
      // An evaluation between the steps runs kernels: not part of a step.
      span(Span::Eval, 10, 5),
      span(Span::Kernel, 11, 3, "k0"),
      span(Span::Checkpoint, 15, 5),
      step(2, 20, 20),
      span(Span::Kernel, 20, 16, "k0"),
  };
  Breakdown b = breakdown(spans);
  EXPECT_EQ(b.steps, 2);
  EXPECT_EQ(b.firstStep, 1);
  EXPECT_EQ(b.lastStep, 2);
  EXPECT_NEAR(b.step, 15 * ms, tol);
  EXPECT_NEAR(b.kernel, 13 * ms, tol);
  EXPECT_NEAR(b.idle, 2 * ms, tol);
  EXPECT_EQ(b.evals, 1);
  EXPECT_NEAR(b.evalSeconds, 5 * ms, tol);
  EXPECT_EQ(b.checkpoints, 1);
  EXPECT_NEAR(b.kernelsPerStep, 1.0, tol);
}

TEST(Overview, SpansThatOverlapOnTheLoopThreadFailTheCheck) {
  // Two kernels the loop thread cannot have run at once: the parts then
  // exceed the step, and the check says so (120%).
  std::vector<Span> spans = {
      step(1, 0, 10),
      span(Span::Kernel, 0, 6, "k0"),
      span(Span::Kernel, 4, 6, "k1"),
  };
  Breakdown b = breakdown(spans);
  EXPECT_NEAR(b.coverage(), 1.2, 1e-9);
  std::string text = formatOverview(b, {}, {}, "");
  EXPECT_NE(text.find("parts add up to 120.0% of the measured 10.000 ms/step"), std::string::npos)
      << text;
}

TEST(Overview, InterOpThreadsStayOffTheLoopTimeline) {
  // A kernel on inter-op worker 1 runs alongside the loop thread's: it is
  // in the kernel stats but not in the breakdown's sum.
  Span worker = span(Span::Kernel, 0, 5, "k1");
  worker.thread = 1;
  std::vector<Span> spans = {step(1, 0, 10), span(Span::Kernel, 0, 10, "k0"), worker};
  Breakdown b = breakdown(spans);
  EXPECT_NEAR(b.kernel, 10 * ms, tol);
  EXPECT_NEAR(b.coverage(), 1.0, 1e-9);
  program::Program p;
  EXPECT_EQ(kernelStats(spans, p, b, {}).size(), 2u);
}

TEST(Overview, InterOpWorkersFillTheLoopThreadsGaps) {
  // The loop thread runs 0..2 and 8..10 and waits 2..8 while worker 1 runs
  // a GEMM 2..6 and worker 2 a kernel 3..7: that wait is 4 ms of GEMM
  // (2..6), 1 ms of kernel (6..7) and 1 ms idle (7..8).
  Span g = span(Span::Gemm, 2, 4, "gemm 8x8x8 NN");
  g.thread = 1;
  Span k = span(Span::Kernel, 3, 4, "k2");
  k.thread = 2;
  std::vector<Span> spans = {step(1, 0, 10), span(Span::Kernel, 0, 2, "k0"), g, k,
                             span(Span::Kernel, 8, 2, "k1")};
  Breakdown b = breakdown(spans);
  EXPECT_NEAR(b.gemm, 4 * ms, tol);
  EXPECT_NEAR(b.kernel, 5 * ms, tol);
  EXPECT_NEAR(b.idle, 1 * ms, tol);
  EXPECT_NEAR(b.coverage(), 1.0, 1e-9);
}

program::Program twoKernelProgram() {
  program::Program p;
  program::Kernel k;
  k.symbol = "k0_fused2_add_L3";
  k.ops = {"kiln.mul", "kiln.add"};
  k.locs = {"m.kiln:3:5", "m.kiln:4:5"};
  p.kernels.push_back(k);
  program::Function f;
  f.name = "train_step";
  program::Step g;
  g.kind = program::Step::Gemm;
  g.loc = "m.kiln:2:9";
  f.steps = {program::Step{}, g};
  p.functions.push_back(f);
  return p;
}

TEST(Overview, KernelStatsInModelTerms) {
  program::Program p = twoKernelProgram();
  Span k = span(Span::Kernel, 0, 2, "k0_fused2_add_L3");
  k.kernel = 0;
  k.planStep = 0;
  k.function = "train_step";
  k.flops = 1e6;
  k.bytes = 4e6;
  Span g = span(Span::Gemm, 2, 8, "gemm 8x8x8 NN");
  g.planStep = 1;
  g.function = "train_step";
  g.flops = 8e8;
  g.bytes = 1e6;
  std::vector<Span> spans = {step(1, 0, 10), k, g};
  Breakdown b = breakdown(spans);
  MachinePeak peak{200e9, 10e9, "test"};
  auto stats = kernelStats(spans, p, b, peak);
  ASSERT_EQ(stats.size(), 2u);
  // Sorted by time: the GEMM first, with its step's line.
  EXPECT_EQ(stats[0].kind, "gemm");
  EXPECT_EQ(stats[0].lines, std::vector<std::string>{"m.kiln:2:9"});
  EXPECT_NEAR(stats[0].stepShare, 0.8, 1e-9);
  EXPECT_NEAR(stats[0].gflops(), 100.0, 1e-6); // 8e8 FLOP in 8 ms
  // Roofline: 8e8 / 200e9 = 4 ms against 1e6 / 10e9 = 0.1 ms: compute,
  // 4 of 8 ms = 50% of peak.
  EXPECT_EQ(stats[0].bound, "compute");
  EXPECT_NEAR(stats[0].peakShare, 0.5, 1e-9);
  // The kernel: every line it serves and the ops it fuses.
  EXPECT_EQ(stats[1].name, "k0_fused2_add_L3");
  EXPECT_EQ(stats[1].lines.size(), 2u);
  EXPECT_EQ(stats[1].ops, (std::vector<std::string>{"kiln.mul", "kiln.add"}));
  EXPECT_NEAR(stats[1].gbps(), 2.0, 1e-9); // 4 MB in 2 ms
  EXPECT_EQ(stats[1].bound, "memory");     // 4e6 / 10e9 = 0.4 ms > 1e6 / 200e9
  EXPECT_NEAR(stats[1].peakShare, 0.2, 1e-9);
}

Breakdown parts(double input, double gemm, double kernel, double exposed, double idle) {
  Breakdown b;
  b.steps = 5;
  b.input = input * ms;
  b.gemm = gemm * ms;
  b.kernel = kernel * ms;
  b.commExposed = exposed * ms;
  b.idle = idle * ms;
  b.step = b.sum();
  return b;
}

TEST(Overview, OneRecommendation) {
  EXPECT_EQ(recommend(parts(30, 50, 10, 0, 10), {}).rfind("input-bound: 30.0% of the step", 0), 0u);
  EXPECT_NE(recommend(parts(30, 50, 10, 0, 10), {}).find("--prefetch or --data-workers"),
            std::string::npos);
  // Just under the threshold (20%): not input-bound.
  EXPECT_EQ(recommend(parts(19, 61, 10, 0, 10), {}).rfind("compute-bound in GEMMs", 0), 0u);
  EXPECT_EQ(recommend(parts(5, 40, 30, 20, 5), {}).rfind("communication-exposed", 0), 0u);
  // A pipeline: most of the exposed wait receives from a neighbour stage
  // (its bubble), which buckets cannot fix.
  KernelStat recv;
  recv.kind = "collective wait";
  recv.name = "recv";
  recv.seconds = 5 * 15 * ms; // 15 ms per step of the 20 exposed
  std::string bubble = recommend(parts(5, 40, 30, 20, 5), {recv});
  EXPECT_EQ(bubble.rfind("pipeline-bubble: 20.0% of the step", 0), 0u) << bubble;
  EXPECT_NE(bubble.find("15.000 ms of it sending or receiving"), std::string::npos) << bubble;
  EXPECT_NE(bubble.find("--pipeline interleaved"), std::string::npos) << bubble;
  recv.seconds = 5 * 5 * ms; // a quarter: the buckets' advice
  EXPECT_EQ(recommend(parts(5, 40, 30, 20, 5), {recv}).rfind("communication-exposed", 0), 0u);
  // Under MPI a blocking send waits for a stage that is not ready: sends
  // and receives together (5 + 6 of the 20 ms) are the bubble.
  KernelStat send = recv;
  send.name = "send";
  send.seconds = 5 * 6 * ms;
  EXPECT_EQ(recommend(parts(5, 40, 30, 20, 5), {recv, send}).rfind("pipeline-bubble", 0), 0u);
  EXPECT_EQ(recommend(parts(5, 30, 30, 5, 30), {}).rfind("idle: 30.0%", 0), 0u);
  Breakdown launch = parts(5, 10, 80, 0, 5);
  launch.kernelsPerStep = 400;
  launch.meanKernel = 2e-6;
  EXPECT_EQ(recommend(launch, {}).rfind("launch-bound: 400 kernels", 0), 0u);
  // Compute-bound in generated kernels names the top one and its line.
  KernelStat top;
  top.kind = "kernel";
  top.name = "k7_fused3_softmax_L9";
  top.lines = {"m.kiln:9:3"};
  top.ops = {"kiln.exp", "kiln.softmax"};
  top.stepShare = 0.4;
  std::string r = recommend(parts(5, 20, 70, 0, 5), {top});
  EXPECT_EQ(r.rfind("compute-bound in generated kernels: 70.0%", 0), 0u) << r;
  EXPECT_NE(r.find("k7_fused3_softmax_L9 at m.kiln:9:3"), std::string::npos) << r;
  EXPECT_EQ(recommend(parts(16, 20, 18, 12, 16), {}).rfind("no single part dominates", 0), 0u);
  EXPECT_EQ(recommend(Breakdown{}, {}).rfind("no profiled steps", 0), 0u);
}

TEST(Overview, StatsCsv) {
  KernelStat k;
  k.kind = "kernel";
  k.name = "k0";
  k.calls = 3;
  k.seconds = 0.5;
  k.lines = {"m.kiln:1:2", "m.kiln:3:4"};
  k.ops = {"kiln.add", "kiln.mul"};
  std::string path = ::testing::TempDir() + "overview-stats.csv";
  ASSERT_TRUE(writeStatsCsv(path, {k, k}));
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  EXPECT_EQ(text.rfind("kind,name,calls,total_s,mean_s,step_share,", 0), 0u) << text;
  EXPECT_NE(text.find("\"m.kiln:1:2;m.kiln:3:4\",\"kiln.add;kiln.mul\""), std::string::npos)
      << text;
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 3);
  std::remove(path.c_str());
  Status bad = writeStatsCsv("/nonexistent-dir/x.csv", {k});
  EXPECT_FALSE(bad);
  EXPECT_NE(bad.message().find("--stats-csv /nonexistent-dir/x.csv"), std::string::npos);
}

} // namespace
