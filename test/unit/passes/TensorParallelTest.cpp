//===- TensorParallelTest.cpp - The tensor-parallel step on the reference grid ===//
//
// kiln-tensor-parallel checked numerically with no runtime involved: the
// tp = N per-device programs (@train_step, @eval_step), run on the
// reference interpreter's process grid (collectives in member order), each
// device given its blocks of the split parameters and optimizer state,
// against the 1-device program on the same batch, over 5 AdamW steps with
// clipping active; then the blocks are joined back into the logical
// parameters and compared. Also dp x tp = 2 x 2 against one device on the
// 2-times batch.
//
//===----------------------------------------------------------------------===//
#include "test/unit/passes/Grid.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

using namespace mlir;
using namespace kiln::testgrid;

namespace {

Model mlp() { return {inputs("tp_mlp.kiln"), {{"hidden", "32"}}, 4, 0.2, 10}; }
/// Column-parallel layers whose outputs must be gathered whole.
Model gatherMlp() { return {inputs("tp_gather.kiln"), {}, 4, 0.2, 10}; }
Model gpt() {
  return {example("shakespeare_char_cpu.kiln"),
          {{"layers", "1"}, {"d", "16"}, {"ctx", "8"}, {"heads", "2"}},
          2, 0.1, 65};
}
Model gptBias() { return {inputs("tp_gpt.kiln"), {{"layers", "1"}, {"ctx", "8"}}, 2, 0.1, 65}; }
/// A vocabulary of 68 (tp = 2 and 4 divide it): the tied embedding and
/// lm_head split on their rows, the cross-entropy vocabulary-parallel.
Model gptVocab() {
  return {inputs("tp_gpt.kiln"), {{"layers", "1"}, {"ctx", "8"}, {"vocab", "68"}}, 2, 0.1, 68};
}

class TensorParallel : public ::testing::Test {
protected:
  void SetUp() override { ctx_.loadDialect<kiln::KilnDialect, func::FuncDialect>(); }
  /// dp x tp against one device on the dp-times batch.
  void check(const Model &s, int64_t dp, int64_t tp, int64_t zero = 0) {
    OwningOpRef<ModuleOp> one = compile(ctx_, s, 1, 1, dp * s.batch);
    ASSERT_TRUE(one);
    auto data = makeData(*one, s.classes);
    Trace ref = train(*one, 1, 1, data);
    OwningOpRef<ModuleOp> m = compile(ctx_, s, dp, tp, s.batch, 1, 0, "", zero);
    ASSERT_TRUE(m);
    if (zero > 0) // ZeRO really blocks tensor-parallel state over dp
      EXPECT_TRUE(hasZeroInsideTp(*m));
    Trace t = train(*m, dp, tp, data);
    expectClose(t, ref,
                s.path + " dp=" + std::to_string(dp) + " tp=" + std::to_string(tp) +
                    " zero=" + std::to_string(zero));
    EXPECT_GT(ref.norm[0], s.gradClip) << "clipping should be active";
  }
  MLIRContext ctx_;
};

TEST_F(TensorParallel, MlpTp2EqualsOneDevice) { check(mlp(), 1, 2); }
TEST_F(TensorParallel, MlpTp4EqualsOneDevice) { check(mlp(), 1, 4); }
TEST_F(TensorParallel, GptTp2EqualsOneDevice) { check(gpt(), 1, 2); }
TEST_F(TensorParallel, GptWithBiasesTp2EqualsOneDevice) { check(gptBias(), 1, 2); }
TEST_F(TensorParallel, GptWithBiasesTp4EqualsOneDevice) { check(gptBias(), 1, 4); }
TEST_F(TensorParallel, MlpDp2Tp2EqualsOneDeviceOnTheTwiceBatch) { check(mlp(), 2, 2); }
TEST_F(TensorParallel, GatheredColumnOutputsTp2EqualsOneDevice) { check(gatherMlp(), 1, 2); }
TEST_F(TensorParallel, GatheredColumnOutputsTp4EqualsOneDevice) { check(gatherMlp(), 1, 4); }
TEST_F(TensorParallel, VocabParallelGptTp2EqualsOneDevice) { check(gptVocab(), 1, 2); }
TEST_F(TensorParallel, VocabParallelGptTp4EqualsOneDevice) { check(gptVocab(), 1, 4); }
TEST_F(TensorParallel, VocabParallelGptDp2Tp2EqualsOneDeviceOnTheTwiceBatch) {
  check(gptVocab(), 2, 2);
}
TEST_F(TensorParallel, GptDp2Tp2EqualsOneDeviceOnTheTwiceBatch) { check(gptBias(), 2, 2); }
/// ZeRO over dp inside tp: each device's tp block of the optimizer state
/// (ZeRO-1), and of the gradients (ZeRO-2), cut again over its dp group.
TEST_F(TensorParallel, GptDp2Tp2Zero1EqualsOneDeviceOnTheTwiceBatch) {
  check(gptBias(), 2, 2, 1);
}
TEST_F(TensorParallel, VocabParallelGptDp2Tp2Zero2EqualsOneDeviceOnTheTwiceBatch) {
  check(gptVocab(), 2, 2, 2);
}

/// Dropout of attention's probabilities (split by heads): the masks depend
/// on the device's tp coordinate ("tp_rank"), so tp devices do not draw the
/// same mask for their different heads; giving both devices coordinate 0
/// changes the result.
TEST_F(TensorParallel, SplitDropoutDrawsPerTpDevice) {
  std::string src = readFile(inputs("tp_gpt.kiln"));
  std::string from = "causal = true, bias = true)";
  size_t at = src.find(from);
  ASSERT_NE(at, std::string::npos);
  src.replace(at, from.size(), "causal = true, bias = true, dropout = 0.5)");
  std::string path = ::testing::TempDir() + "/tp_gpt_dropout.kiln";
  std::ofstream(path) << src;
  Model s{path, {{"layers", "1"}, {"ctx", "8"}}, 2, 0.1, 65};
  OwningOpRef<ModuleOp> m = compile(ctx_, s, 1, 2, s.batch);
  ASSERT_TRUE(m);
  bool hasRank = false;
  auto step = m->lookupSymbol<func::FuncOp>("train_step");
  for (unsigned i = 0; i < step.getNumArguments(); ++i)
    hasRank |= attr(step, i, kiln::KilnDialect::kInputAttr) == "tp_rank";
  ASSERT_TRUE(hasRank);
  auto data = makeData(*m, s.classes);
  Trace own = train(*m, 1, 2, data);
  Trace same = train(*m, 1, 2, data, /*checkReplicas=*/true, /*sameTpRank=*/true);
  ASSERT_EQ(own.loss.size(), same.loss.size());
  EXPECT_NE(own.loss[0], same.loss[0]);
  EXPECT_GT(worstOf(own, same), 10.0);
}

/// The cutting helpers of this test agree with each other (the reference
/// for the runtime's own cutting).
TEST(TensorParallelCut, JoinInvertsCut) {
  Tensor t = Tensor::zeros(Elem::F32, {6, 4});
  for (size_t k = 0; k < t.f.size(); ++k)
    t.f[k] = double(k);
  for (auto [dim, outer] : {std::pair<int64_t, int64_t>{0, 1}, {0, 3}, {1, 1}, {1, 2}}) {
    std::vector<Tensor> blocks;
    for (int64_t c = 0; c < 2; ++c)
      blocks.push_back(cut(t, dim, outer, 2, c));
    EXPECT_EQ(join(blocks, dim, outer).f, t.f) << dim << " " << outer;
  }
  // [6, 4] on dim 0 in 3 parts over 2: device 1 holds rows 1, 3, 5.
  Tensor b = cut(t, 0, 3, 2, 1);
  EXPECT_EQ(b.shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(b.f[0], 4.0);
  EXPECT_EQ(b.f[4], 12.0);
  EXPECT_EQ(b.f[8], 20.0);
}

/// The tolerance is not vacuous: skipping the tp all-reduces is caught.
TEST(TensorParallelTolerance, AMissingAllReduceIsCaught) {
  MLIRContext ctx;
  ctx.loadDialect<kiln::KilnDialect, func::FuncDialect>();
  Model s = mlp();
  OwningOpRef<ModuleOp> one = compile(ctx, s, 1, 1, s.batch);
  ASSERT_TRUE(one);
  auto data = makeData(*one, s.classes);
  Trace ref = train(*one, 1, 1, data);
  OwningOpRef<ModuleOp> m = compile(ctx, s, 1, 2, s.batch);
  ASSERT_TRUE(m);
  int64_t removed = 0;
  m->lookupSymbol<func::FuncOp>("train_step").walk([&](kiln::AllReduceOp op) {
    if (op.getType().getRank() > 0) {
      op.getResult().replaceAllUsesWith(op.getOperand());
      ++removed;
    }
  });
  EXPECT_GT(removed, 0);
  Trace bad = train(*m, 1, 2, data, /*checkReplicas=*/false);
  EXPECT_GT(worstOf(bad, ref), 10.0) << "a missing all-reduce must be far outside the tolerance";
}

} // namespace
