//===- PipelineTest.cpp - The pipeline-parallel step on the reference grid ===//
//
// kiln-pipeline checked numerically with no runtime involved: the
// stage-predicated programs (@train_step, @eval_step, @predict) run on the
// reference interpreter's process grid, each device running only its
// stage's ops and meeting the others at kiln.transfer and
// kiln.collective_broadcast, against the one-device program with the same
// micro-batches (grad_accum) on the same data, over 5 AdamW steps with
// clipping active; parameters are taken from their owner stage and
// compared. Layouts: layers placed by hand over 3 devices (the textbook
// 100 -> 1000 -> 1000 -> 10 MLP), the cost model's cut of the CPU GPT,
// GPipe and 1F1B over 4 micro-batches, pp x dp, and dp x tp x pp =
// 2 x 2 x 2 on 8 devices.
//
//===----------------------------------------------------------------------===//
#include "test/unit/passes/Grid.h"
#include "passes/Passes.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

using namespace mlir;
using namespace kiln::testgrid;

namespace {

/// The textbook model; `hidden` 200 keeps the float64 interpreter quick
/// (test/runtime/pp-train.test runs the full 1000 compiled).
Model mlp3() { return {inputs("pp_mlp3.kiln"), {{"hidden", "200"}}, 8, 0.5, 10}; }
Model mlp3Full() { return {inputs("pp_mlp3.kiln"), {}, 8, 0.5, 10}; }
/// The CPU GPT example, small: its stages cut by the cost model.
Model gpt() {
  return {example("shakespeare_char_cpu.kiln"),
          {{"layers", "2"}, {"d", "16"}, {"ctx", "8"}, {"heads", "2"}},
          2, 0.1, 65};
}
/// nanoGPT's GPT example, small, with its dropout (0.2) on: the masks are
/// a function of the step, the site and the element, the same on any stage.
Model gptDropout() {
  return {example("shakespeare_char.kiln"),
          {{"layers", "2"}, {"d", "16"}, {"ctx", "8"}, {"heads", "2"}},
          2, 0.1, 65};
}
/// Two blocks per stage placed by hand (repeat ... as h, i), with biases
/// and tensor-parallel hints for dp x tp x pp.
Model gptPlaced() { return {inputs("pp_gpt.kiln"), {{"ctx", "8"}, {"d", "16"}}, 2, 0.1, 65}; }

class Pipeline : public ::testing::Test {
protected:
  void SetUp() override { ctx_.loadDialect<kiln::KilnDialect, func::FuncDialect>(); }
  /// pp stages (x dp x tp) over `micro` micro-batches against one device
  /// with the same micro-batches on the dp-times batch.
  void check(const Model &s, int64_t pp, int64_t micro, const std::string &schedule,
             int64_t dp = 1, int64_t tp = 1, int64_t zero = 0) {
    OwningOpRef<ModuleOp> one = compile(ctx_, s, 1, 1, dp * s.batch, 1, micro);
    ASSERT_TRUE(one);
    auto data = makeData(*one, s.classes);
    Trace ref = train(*one, 1, 1, data);
    OwningOpRef<ModuleOp> m = compile(ctx_, s, dp, tp, s.batch, pp, micro, schedule, zero);
    ASSERT_TRUE(m);
    // Every op of the step runs on one stage or is cheap everywhere; the
    // stages really split the work.
    int64_t staged = 0, transfers = 0;
    m->lookupSymbol<func::FuncOp>("train_step").walk([&](Operation *op) {
      staged += op->hasAttr(kiln::kStageAttr);
      transfers += isa<kiln::TransferOp>(op);
    });
    EXPECT_GT(staged, 0);
    EXPECT_GT(transfers, 0);
    if (zero > 0) // ZeRO really blocks tensor-parallel state over dp
      EXPECT_TRUE(hasZeroInsideTp(*m));
    Trace t = train(*m, dp, tp, data, /*checkReplicas=*/true, /*sameTpRank=*/false, pp);
    expectClose(t, ref,
                s.path + " pp=" + std::to_string(pp) + " M=" + std::to_string(micro) + " " +
                    schedule + " dp=" + std::to_string(dp) + " tp=" + std::to_string(tp) +
                    " zero=" + std::to_string(zero));
    EXPECT_GT(ref.norm[0], s.gradClip) << "clipping should be active";
  }
  MLIRContext ctx_;
};

TEST_F(Pipeline, HandPlacedMlpOverThreeDevicesEqualsOneDevice) { check(mlp3(), 3, 1, ""); }
TEST_F(Pipeline, HandPlacedMlpGPipeFourMicroBatches) { check(mlp3(), 3, 4, "gpipe"); }
TEST_F(Pipeline, HandPlacedMlp1F1BFourMicroBatches) { check(mlp3(), 3, 4, "1f1b"); }
TEST_F(Pipeline, TextbookMlpFullWidth) { check(mlp3Full(), 3, 1, ""); }
TEST_F(Pipeline, GptCutByCostModelGPipe) { check(gpt(), 2, 4, "gpipe"); }
TEST_F(Pipeline, GptCutByCostModel1F1B) { check(gpt(), 2, 4, "1f1b"); }
TEST_F(Pipeline, GptWithDropoutCutByCostModel1F1B) { check(gptDropout(), 2, 4, "1f1b"); }
TEST_F(Pipeline, GptPlacedByHand1F1B) { check(gptPlaced(), 2, 4, "1f1b"); }
TEST_F(Pipeline, MlpPp3Dp2EqualsOneDeviceOnTheTwiceBatch) { check(mlp3(), 3, 2, "1f1b", 2); }
TEST_F(Pipeline, GptDp2Tp2Pp2OnEightDevices) { check(gptPlaced(), 2, 2, "1f1b", 2, 2); }
/// ... with ZeRO-1 over each stage's dp devices inside tp.
TEST_F(Pipeline, GptDp2Tp2Pp2Zero1OnEightDevices) {
  check(gptPlaced(), 2, 2, "1f1b", 2, 2, 1);
}

/// Interleaved 1F1B: 2 chunks per device, the cost model cutting the GPT
/// into 4; alone and with dp = 2.
TEST_F(Pipeline, GptInterleavedTwoChunksPerDevice) { check(gpt(), 2, 4, "interleaved"); }
TEST_F(Pipeline, GptInterleavedDp2) { check(gpt(), 2, 2, "interleaved", 2); }

/// The interleaved order (Megatron-LM's): device d's i-th forward is
/// micro-batch (i / (D V)) D + i mod D of local chunk (i / D) mod V; 2 (D -
/// d - 1) + (V - 1) D warm-up forwards, then one forward and one backward
/// in turn. Pinned for D = V = 2, M = 4 (docs/parallel.md shows the same
/// lines from kilnc); for D = 4, V = 3, M = 8 every device runs each of
/// its chunks' forward and backward of every micro-batch exactly once, a
/// forward before its backward.
TEST(PipelineOrder, InterleavedIsMegatronsOrder) {
  auto str = [](int64_t d, int64_t D, int64_t V, int64_t M) {
    std::string s;
    for (const kiln::PipelineUnit &u : kiln::pipelineOrder(d, D, V, M, "interleaved"))
      s += (s.empty() ? "" : " ") + std::string(u.phase ? "B" : "F") + std::to_string(u.chunk) +
           "." + std::to_string(u.mb);
    return s;
  };
  EXPECT_EQ(str(0, 2, 2, 4),
            "F0.0 F0.1 F2.0 F2.1 F0.2 B2.0 F0.3 B2.1 F2.2 B0.0 F2.3 B0.1 B2.2 B2.3 B0.2 B0.3");
  EXPECT_EQ(str(1, 2, 2, 4),
            "F1.0 F1.1 F3.0 B3.0 F3.1 B3.1 F1.2 B1.0 F1.3 B1.1 F3.2 B3.2 F3.3 B3.3 B1.2 B1.3");
  // One chunk per device is plain 1F1B.
  std::string plain;
  for (const kiln::PipelineUnit &u : kiln::pipelineOrder(0, 2, 1, 4, "interleaved"))
    plain += std::string(u.phase ? "B" : "F") + std::to_string(u.mb);
  EXPECT_EQ(plain, "F0F1B0F2B1F3B2B3");
  const int64_t D = 4, V = 3, M = 8;
  for (int64_t d = 0; d < D; ++d) {
    std::map<std::tuple<int64_t, int64_t, int64_t>, int> seen;
    std::vector<kiln::PipelineUnit> order = kiln::pipelineOrder(d, D, V, M, "interleaved");
    ASSERT_EQ(order.size(), size_t(2 * V * M));
    for (const kiln::PipelineUnit &u : order) {
      EXPECT_EQ(u.chunk % D, d);
      EXPECT_LT(u.mb, M);
      auto fwd = std::make_tuple(u.chunk, int64_t(0), u.mb);
      auto key = std::make_tuple(u.chunk, u.phase, u.mb);
      if (u.phase == 1)
        EXPECT_EQ(seen.count(fwd), 1u) << "backward before forward";
      EXPECT_EQ(++seen[key], 1);
    }
    // Warm-up: forwards before the first backward.
    int64_t warm = 0;
    while (order[size_t(warm)].phase == 0)
      ++warm;
    EXPECT_EQ(warm, std::min(2 * (D - d - 1) + (V - 1) * D, V * M) + 1) << "device " << d;
  }
}

/// The order each stage runs: with GPipe every forward of a stage comes
/// before its first backward; with 1F1B stage 0 of 2 starts its first
/// backward after 2 forwards (p - s = 2 micro-batches in flight).
TEST_F(Pipeline, ScheduleOrdersEachStage) {
  for (std::string sched : {"gpipe", "1f1b"}) {
    OwningOpRef<ModuleOp> m = compile(ctx_, gpt(), 1, 1, 2, 2, 4, sched);
    ASSERT_TRUE(m);
    // Forward transfers (stage 0 -> 1) before the first backward one
    // (1 -> 0) of an activation-sized value, in stage 0's program order.
    int forwardBeforeBackward = 0;
    bool backwardSeen = false;
    m->lookupSymbol<func::FuncOp>("train_step").walk([&](kiln::TransferOp t) {
      if (t.getType().getRank() < 3)
        return; // scalars, the embedding table and its gradient
      if (t.getFrom() == 1)
        backwardSeen = true;
      else if (!backwardSeen)
        ++forwardBeforeBackward;
    });
    EXPECT_EQ(forwardBeforeBackward, sched == "gpipe" ? 4 : 2) << sched;
  }
}

} // namespace
