//===- PipelineTest.cpp - Pipeline stages on the reference process grid ---===//
//
// Stage-predicated programs run by the reference interpreter on a process
// grid (reference/ProcessGrid.h, "Pipeline stages"): ops with `kiln.stage`
// run only on the processes of that stage ("pp" coordinate), kiln.transfer
// moves a value between two stages, kiln.collective_broadcast hands the
// root's value to every stage. Checked: exact values on every process of a
// pp=2 and a pp=2 x dp=2 grid, which results each process holds, a 3-stage
// chain with a value sent back to stage 0 (through a kiln.fusion), the error
// for reading another stage's value, and mismatched programs failing within
// the deadline instead of hanging.
//
// Every input is a small integer or half of one, so every result is exact in
// f32 and compared for equality.
//
//===----------------------------------------------------------------------===//
#include "dialects/kiln/KilnDialect.h"
#include "reference/ProcessGrid.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

namespace {

using kiln::interp::Elem;
using kiln::interp::GridAxis;
using kiln::interp::Options;
using kiln::interp::ProcessGrid;
using kiln::interp::Tensor;

Tensor tensor(std::vector<int64_t> shape, std::vector<double> v) {
  Tensor t = Tensor::zeros(Elem::F32, std::move(shape));
  EXPECT_EQ(int64_t(v.size()), t.numel());
  t.f = std::move(v);
  return t;
}

double secondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

class PipelineTest : public ::testing::Test {
protected:
  PipelineTest() { ctx_.loadDialect<kiln::KilnDialect, mlir::func::FuncDialect>(); }

  // Parsed and verified (kiln.stage is a dialect attribute). The misplaced
  // stage on a transfer in AReceiverThatNeverComesTimesOut verifies (the
  // verifier checks the value, not the op) and the interpreter must survive it.
  mlir::func::FuncOp parse(const std::string &src) {
    mlir::ParserConfig config(&ctx_);
    module_ = mlir::parseSourceString<mlir::ModuleOp>(src, config);
    EXPECT_TRUE(module_) << "cannot parse:\n" << src;
    return module_ ? module_->lookupSymbol<mlir::func::FuncOp>("f") : mlir::func::FuncOp();
  }

  static ProcessGrid grid(std::vector<GridAxis> axes) {
    ProcessGrid g;
    std::string error;
    EXPECT_TRUE(ProcessGrid::create(std::move(axes), g, error)) << error;
    return g;
  }

  mlir::MLIRContext ctx_;
  mlir::OwningOpRef<mlir::ModuleOp> module_;
};

// Stage 0: y = x @ w0; y moves to stage 1; stage 1: z = relu(y) * w1,
// s = sum(z); the loss s is broadcast from stage 1 to every stage. With
// `%MESH%` and `%REDUCE%` filled in by the tests.
constexpr const char *kTwoStages = R"mlir(
module attributes {kiln.mesh = %MESH%} {
func.func @f(%x: tensor<2x3xf32>, %w0: tensor<3x2xf32>, %w1: tensor<2xf32>)
    -> (tensor<f32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<f32>) {
  %y = kiln.matmul %x, %w0 {kiln.stage = 0 : i64} : tensor<2x3xf32>, tensor<3x2xf32> -> tensor<2x2xf32>
  %t = kiln.transfer %y axis = "pp" from = 0 to = 1 : tensor<2x2xf32>
  %r = kiln.relu %t {kiln.stage = 1 : i64} : tensor<2x2xf32>
  %b = kiln.broadcast_in_dim %w1, dims = [1] {kiln.stage = 1 : i64} : tensor<2xf32> -> tensor<2x2xf32>
  %z = kiln.mul %r, %b {kiln.stage = 1 : i64} : tensor<2x2xf32>
  %s = kiln.reduce_sum %z axes = [0, 1] {kiln.stage = 1 : i64} : tensor<2x2xf32> -> tensor<f32>
  %REDUCE%
  %l = kiln.collective_broadcast %m axis = "pp" root = 1 : tensor<f32>
  return %l, %y, %z, %s : tensor<f32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<f32>
}
}
)mlir";

std::string twoStages(const std::string &mesh, const std::string &reduce) {
  std::string s = kTwoStages;
  s.replace(s.find("%MESH%"), 6, mesh);
  s.replace(s.find("%REDUCE%"), 8, reduce);
  return s;
}

// x @ w0 = [[-3, 11], [14, -23]]; relu: [[0, 11], [14, 0]]; times w1 =
// [2, -0.5]: [[0, -5.5], [28, 0]]; sum 22.5.
const std::vector<double> kX = {1, -2, 3, 4, 5, -6}, kW0 = {1, 0, 2, -1, 0, 3};
const std::vector<double> kW1 = {2, -0.5};

TEST_F(PipelineTest, TwoStagesComputeAndBroadcastTheLoss) {
  mlir::func::FuncOp fn = parse(twoStages(R"({axes = ["pp"], shape = array<i64: 2>})",
                                          "%m = kiln.neg %s {kiln.stage = 1 : i64} : tensor<f32>"));
  ASSERT_TRUE(fn);
  ProcessGrid g = grid({{"pp", 2}});
  // Each stage gets junk where the other stage's parameters go: stage 1's
  // results must come from stage 0's x and w0, stage 0 never reads w1.
  std::vector<std::vector<Tensor>> args = {
      {tensor({2, 3}, kX), tensor({3, 2}, kW0), tensor({2}, {99, 99})},
      {tensor({2, 3}, {7, 7, 7, 7, 7, 7}), tensor({3, 2}, {5, 5, 5, 5, 5, 5}), tensor({2}, kW1)}};
  std::vector<std::vector<Tensor>> results;
  std::string error;
  ASSERT_TRUE(g.run(fn, args, results, error)) << error;
  ASSERT_EQ(results.size(), 2u);
  ASSERT_EQ(results[0].size(), 4u);
  ASSERT_EQ(results[1].size(), 4u);
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(results[r][0].absent) << "the broadcast loss reaches process " << r;
    EXPECT_EQ(results[r][0].shape, std::vector<int64_t>{});
    EXPECT_EQ(results[r][0].f, std::vector<double>{-22.5}) << "process " << r;
  }
  // y exists on stage 0 only, z and s on stage 1 only.
  EXPECT_FALSE(results[0][1].absent);
  EXPECT_EQ(results[0][1].f, (std::vector<double>{-3, 11, 14, -23}));
  EXPECT_TRUE(results[0][2].absent);
  EXPECT_TRUE(results[0][2].f.empty() && results[0][2].shape.empty());
  EXPECT_TRUE(results[0][3].absent);
  EXPECT_TRUE(results[1][1].absent);
  EXPECT_TRUE(results[1][1].f.empty());
  ASSERT_FALSE(results[1][2].absent);
  EXPECT_EQ(results[1][2].shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(results[1][2].f, (std::vector<double>{0, -5.5, 28, 0}));
  ASSERT_FALSE(results[1][3].absent);
  EXPECT_EQ(results[1][3].f, std::vector<double>{22.5});
}

// pp=2 x dp=2: ranks 2 * pp + dp. Stage 0 of replica d sends to stage 1 of
// replica d (rank d to rank 2 + d); stage 1 sums the replicas' losses over
// dp, and the broadcast over pp hands the total to stage 0 of each replica.
TEST_F(PipelineTest, StagesAndReplicas) {
  mlir::func::FuncOp fn = parse(twoStages(
      R"({axes = ["pp", "dp"], shape = array<i64: 2, 2>})",
      R"(%m = kiln.all_reduce %s axis = "dp" reduction = sum {kiln.stage = 1 : i64} : tensor<f32>)"));
  ASSERT_TRUE(fn);
  ProcessGrid g = grid({{"pp", 2}, {"dp", 2}});
  std::vector<double> x1 = kX; // replica 1's batch: twice replica 0's
  for (double &v : x1)
    v *= 2;
  Tensor junkX = tensor({2, 3}, {7, 7, 7, 7, 7, 7}), junkW0 = tensor({3, 2}, {5, 5, 5, 5, 5, 5});
  std::vector<std::vector<Tensor>> args = {
      {tensor({2, 3}, kX), tensor({3, 2}, kW0), tensor({2}, {99, 99})},
      {tensor({2, 3}, x1), tensor({3, 2}, kW0), tensor({2}, {99, 99})},
      {junkX, junkW0, tensor({2}, kW1)},
      {junkX, junkW0, tensor({2}, kW1)}};
  std::vector<std::vector<Tensor>> results;
  std::string error;
  ASSERT_TRUE(g.run(fn, args, results, error)) << error;
  ASSERT_EQ(results.size(), 4u);
  // Replica 1: y = [[-6, 22], [28, -46]], z = [[0, -11], [56, 0]], s = 45.
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(results[r].size(), 4u);
    ASSERT_FALSE(results[r][0].absent) << "process " << r;
    EXPECT_EQ(results[r][0].f, std::vector<double>{67.5}) << "process " << r;
  }
  EXPECT_EQ(results[0][1].f, (std::vector<double>{-3, 11, 14, -23}));
  EXPECT_EQ(results[1][1].f, (std::vector<double>{-6, 22, 28, -46}));
  EXPECT_EQ(results[2][2].f, (std::vector<double>{0, -5.5, 28, 0}));
  EXPECT_EQ(results[3][2].f, (std::vector<double>{0, -11, 56, 0}));
  EXPECT_EQ(results[2][3].f, std::vector<double>{22.5});
  EXPECT_EQ(results[3][3].f, std::vector<double>{45});
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(results[r][2].absent && results[r][3].absent) << "process " << r;
    EXPECT_TRUE(results[2 + r][1].absent) << "process " << 2 + r;
  }
}

// 0 -> 1 -> 2 -> 0: stage 0 doubles x, stage 1 squares it in a kiln.fusion,
// stage 2 negates it, and stage 0 adds the returned value to x. x = [1, 2, 3]:
// a = [2, 4, 6], b = [4, 16, 36], c = [-4, -16, -36], d = [-3, -14, -33].
TEST_F(PipelineTest, ThreeStageChainSendsBack) {
  mlir::func::FuncOp fn = parse(R"mlir(
module attributes {kiln.mesh = {axes = ["pp"], shape = array<i64: 3>}} {
func.func @f(%x: tensor<3xf32>) -> (tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>) {
  %a = kiln.add %x, %x {kiln.stage = 0 : i64} : tensor<3xf32>
  %a1 = kiln.transfer %a axis = "pp" from = 0 to = 1 : tensor<3xf32>
  %b = kiln.fusion "elementwise" rows = 0 ins(%a1) {kiln.stage = 1 : i64} : (tensor<3xf32>) -> tensor<3xf32> {
  ^bb0(%u: tensor<3xf32>):
    %sq = kiln.mul %u, %u : tensor<3xf32>
    kiln.yield %sq : tensor<3xf32>
  }
  %b2 = kiln.transfer %b axis = "pp" from = 1 to = 2 : tensor<3xf32>
  %c = kiln.neg %b2 {kiln.stage = 2 : i64} : tensor<3xf32>
  %c0 = kiln.transfer %c axis = "pp" from = 2 to = 0 : tensor<3xf32>
  %d = kiln.add %c0, %x {kiln.stage = 0 : i64} : tensor<3xf32>
  return %d, %a, %b, %c : tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>
}
}
)mlir");
  ASSERT_TRUE(fn);
  ProcessGrid g = grid({{"pp", 3}});
  std::vector<std::vector<Tensor>> args = {
      {tensor({3}, {1, 2, 3})}, {tensor({3}, {50, 60, 70})}, {tensor({3}, {-8, -9, -10})}};
  std::vector<std::vector<Tensor>> results;
  std::string error;
  ASSERT_TRUE(g.run(fn, args, results, error)) << error;
  ASSERT_EQ(results.size(), 3u);
  const std::vector<std::vector<double>> want = {
      {-3, -14, -33}, {2, 4, 6}, {4, 16, 36}, {-4, -16, -36}};
  // Result i is held by process: d, a on 0; b on 1; c on 2.
  const int holder[4] = {0, 0, 1, 2};
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(results[r].size(), 4u);
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(results[r][i].absent, holder[i] != r) << "process " << r << " result " << i;
      if (holder[i] == r) {
        EXPECT_EQ(results[r][i].f, want[i]) << "process " << r << " result " << i;
      }
    }
  }
}

// Stage 1 reads stage 0's y without a transfer before the transfer itself:
// process 1 fails naming the op, its location and both stages; process 0,
// waiting for it at the transfer with the default 60 s deadline, is aborted
// at once.
TEST_F(PipelineTest, ReadingAnotherStagesValueFails) {
  mlir::func::FuncOp fn = parse(R"mlir(
module attributes {kiln.mesh = {axes = ["pp"], shape = array<i64: 2>}} {
func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> {
  %y = kiln.neg %x {kiln.stage = 0 : i64} : tensor<2xf32> loc("p.kiln":3:5)
  %bad = kiln.relu %y {kiln.stage = 1 : i64} : tensor<2xf32> loc("p.kiln":4:5)
  %t = kiln.transfer %y axis = "pp" from = 0 to = 1 : tensor<2xf32>
  return %t : tensor<2xf32>
}
}
)mlir");
  ASSERT_TRUE(fn);
  ProcessGrid g = grid({{"pp", 2}});
  std::vector<std::vector<Tensor>> results;
  std::string error;
  auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(g.run(fn, {{tensor({2}, {1, 2})}, {tensor({2}, {3, 4})}}, results, error));
  EXPECT_EQ(error, "process 1: interpreter: 'kiln.relu' at loc(\"p.kiln\":4:5): runs on stage 1 "
                   "but reads operand #0, a value of stage 0 ('kiln.neg' at "
                   "loc(\"p.kiln\":3:5)), which this process (stage 1 on 'pp') does not hold: "
                   "values cross stages only through kiln.transfer (a compiler bug)");
  EXPECT_LT(secondsSince(start), 10.0) << "process 0 must be aborted, not left to its deadline";
}

// An op without kiln.stage runs everywhere, so it may read only values every
// stage holds; a kiln.fusion is checked like any op.
TEST_F(PipelineTest, AnUnstagedOpOrAFusionReadingOneStagesValueFails) {
  mlir::func::FuncOp fn = parse(R"mlir(
module attributes {kiln.mesh = {axes = ["pp"], shape = array<i64: 2>}} {
func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> {
  %y = kiln.neg %x {kiln.stage = 1 : i64} : tensor<2xf32> loc("p.kiln":3:5)
  %z = kiln.abs %y : tensor<2xf32> loc("p.kiln":4:5)
  return %z : tensor<2xf32>
}
}
)mlir");
  ASSERT_TRUE(fn);
  ProcessGrid g = grid({{"pp", 2}});
  std::vector<std::vector<Tensor>> results;
  std::string error;
  EXPECT_FALSE(g.run(fn, {{tensor({2}, {1, 2})}, {tensor({2}, {3, 4})}}, results, error));
  EXPECT_EQ(error, "process 0: interpreter: 'kiln.abs' at loc(\"p.kiln\":4:5): runs on every "
                   "stage but reads operand #0, a value of stage 1 ('kiln.neg' at "
                   "loc(\"p.kiln\":3:5)), which this process (stage 0 on 'pp') does not hold: "
                   "values cross stages only through kiln.transfer (a compiler bug)");

  fn = parse(R"mlir(
module attributes {kiln.mesh = {axes = ["pp", "dp"], shape = array<i64: 2, 1>}} {
func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> {
  %y = kiln.neg %x {kiln.stage = 0 : i64} : tensor<2xf32> loc("p.kiln":3:5)
  %z = kiln.fusion "elementwise" rows = 0 ins(%x, %y) {kiln.stage = 1 : i64} : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32> {
  ^bb0(%u: tensor<2xf32>, %v: tensor<2xf32>):
    %s = kiln.add %u, %v : tensor<2xf32>
    kiln.yield %s : tensor<2xf32>
  } loc("p.kiln":4:5)
  return %z : tensor<2xf32>
}
}
)mlir");
  ASSERT_TRUE(fn);
  g = grid({{"pp", 2}, {"dp", 1}});
  EXPECT_FALSE(g.run(fn, {{tensor({2}, {1, 2})}, {tensor({2}, {3, 4})}}, results, error));
  EXPECT_EQ(error, "process 1: interpreter: 'kiln.fusion' at loc(\"p.kiln\":4:5): runs on stage "
                   "1 but reads operand #1, a value of stage 0 ('kiln.neg' at "
                   "loc(\"p.kiln\":3:5)), which this process (stage 1 on 'pp') does not hold: "
                   "values cross stages only through kiln.transfer (a compiler bug)");
}

// A transfer that (wrongly) carries kiln.stage = 0 is skipped by its
// receiver: stage 1 never receives, and the sender fails at the deadline
// naming process 1 instead of hanging.
TEST_F(PipelineTest, AReceiverThatNeverComesTimesOut) {
  mlir::func::FuncOp fn = parse(R"mlir(
module attributes {kiln.mesh = {axes = ["pp"], shape = array<i64: 2>}} {
func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> {
  %t = kiln.transfer %x axis = "pp" from = 0 to = 1 {kiln.stage = 0 : i64} : tensor<2xf32> loc("p.kiln":3:5)
  return %t : tensor<2xf32>
}
}
)mlir");
  ASSERT_TRUE(fn);
  ProcessGrid g = grid({{"pp", 2}});
  Options options;
  options.collectiveTimeoutSeconds = 0.2;
  std::vector<std::vector<Tensor>> results;
  std::string error;
  auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(
      g.run(fn, {{tensor({2}, {1, 2})}, {tensor({2}, {3, 4})}}, results, error, options));
  double secs = secondsSince(start);
  EXPECT_EQ(error, "process 0: interpreter: 'kiln.transfer' at loc(\"p.kiln\":3:5): transfer "
                   "over 'pp' from 0 to 1 (process 0 to process 1): timed out after 0.2 s "
                   "waiting for process 1 (the members that did not arrive)");
  EXPECT_GE(secs, 0.2);
  EXPECT_LT(secs, 5.0) << "the deadline is 0.2 s";
}

// The same misplaced stage, followed by a transfer back: process 0 sends at
// the first transfer while process 1 sends at the second, so both sides of
// the pair's first meeting send. Both fail at once (well before the 60 s
// deadline), saying the transfers do not pair up.
TEST_F(PipelineTest, TransfersThatDoNotPairUpFail) {
  mlir::func::FuncOp fn = parse(R"mlir(
module attributes {kiln.mesh = {axes = ["pp"], shape = array<i64: 2>}} {
func.func @f(%x: tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>) {
  %t = kiln.transfer %x axis = "pp" from = 0 to = 1 {kiln.stage = 0 : i64} : tensor<2xf32>
  %u = kiln.transfer %x axis = "pp" from = 1 to = 0 : tensor<2xf32>
  return %t, %u : tensor<2xf32>, tensor<2xf32>
}
}
)mlir");
  ASSERT_TRUE(fn);
  ProcessGrid g = grid({{"pp", 2}});
  std::vector<std::vector<Tensor>> results;
  std::string error;
  auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(g.run(fn, {{tensor({2}, {1, 2})}, {tensor({2}, {3, 4})}}, results, error));
  std::string fromZero = "process 0: interpreter: 'kiln.transfer' at loc(\"-\":4:8): transfer "
                         "over 'pp' from 0 to 1 (process 0 to process 1): process 1 sends at "
                         "this point as well: the transfers between the two do not pair up in "
                         "program order";
  std::string fromOne = "process 1: interpreter: 'kiln.transfer' at loc(\"-\":5:8): transfer "
                        "over 'pp' from 1 to 0 (process 1 to process 0): process 0 sends at "
                        "this point as well: the transfers between the two do not pair up in "
                        "program order";
  EXPECT_TRUE(error == fromZero || error == fromOne) << error;
  EXPECT_LT(secondsSince(start), 10.0);
}

// The receiver fails on its own (its inputs are wrong) before the transfer:
// the sender is aborted at once and the error names the receiver.
TEST_F(PipelineTest, AFailingReceiverAbortsTheSender) {
  mlir::func::FuncOp fn = parse(twoStages(R"({axes = ["pp"], shape = array<i64: 2>})",
                                          "%m = kiln.neg %s {kiln.stage = 1 : i64} : tensor<f32>"));
  ASSERT_TRUE(fn);
  ProcessGrid g = grid({{"pp", 2}});
  std::vector<std::vector<Tensor>> args = {
      {tensor({2, 3}, kX), tensor({3, 2}, kW0), tensor({2}, kW1)},
      {tensor({2, 3}, kX), tensor({3, 2}, kW0), tensor({3}, {1, 2, 3})}};
  std::vector<std::vector<Tensor>> results;
  std::string error;
  auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(g.run(fn, args, results, error));
  EXPECT_EQ(error, "process 1: argument 2 of @f has the wrong type or shape");
  EXPECT_LT(secondsSince(start), 10.0) << "process 0 must be aborted, not left to its deadline";
}

// Without a grid, a module with two stages cannot run; with one stage (no
// "pp" axis) kiln.stage = 0 runs and a broadcast over an axis of size 1 is
// the identity.
TEST_F(PipelineTest, SingleProcessRuns) {
  mlir::func::FuncOp fn = parse(twoStages(R"({axes = ["pp"], shape = array<i64: 2>})",
                                          "%m = kiln.neg %s {kiln.stage = 1 : i64} : tensor<f32>"));
  ASSERT_TRUE(fn);
  std::vector<Tensor> out;
  std::string error;
  EXPECT_FALSE(kiln::interp::run(
      fn, {tensor({2, 3}, kX), tensor({3, 2}, kW0), tensor({2}, kW1)}, out, error));
  EXPECT_NE(error.find("'kiln.matmul'"), std::string::npos) << error;
  EXPECT_NE(error.find("has kiln.stage = 0 and the module's mesh has 2 pipeline stages on 'pp': "
                       "run it on a process grid (interp::ProcessGrid::run)"),
            std::string::npos)
      << error;

  fn = parse(R"mlir(
module attributes {kiln.mesh = {axes = ["dp"], shape = array<i64: 1>}} {
func.func @f(%x: tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>) {
  %y = kiln.neg %x {kiln.stage = 0 : i64} : tensor<2xf32>
  %z = kiln.collective_broadcast %y axis = "dp" root = 0 : tensor<2xf32>
  return %y, %z : tensor<2xf32>, tensor<2xf32>
}
}
)mlir");
  ASSERT_TRUE(fn);
  out.clear();
  ASSERT_TRUE(kiln::interp::run(fn, {tensor({2}, {1, -2})}, out, error)) << error;
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].f, (std::vector<double>{-1, 2}));
  EXPECT_EQ(out[1].f, (std::vector<double>{-1, 2}));
  EXPECT_FALSE(out[1].absent);
}

} // namespace
