//===- CollectivesTest.cpp - Reference semantics of the collectives -------===//
//
// kiln.all_reduce, kiln.reduce_scatter and kiln.all_gather evaluated by the
// reference interpreter on a process grid (reference/ProcessGrid.h): each op
// on a 2x2 grid (dp x tp) against values computed here, the groups of each
// axis, the fixed member order of a sum, the single-process rules, the
// rendezvous deadline naming the missing member, a failing process aborting
// the others, and the gradient rules (Gradients.cpp) checked numerically:
// the reverse sweep of all_gather and all_reduce(sum), run on the grid,
// equals the gradient of the sum over devices of every device's loss.
//
// Tolerance: every input is a small integer or a sum of two, exact in f32,
// so results are compared for equality except where rounding is the point.
//
//===----------------------------------------------------------------------===//
#include "dialects/kiln/KilnDialect.h"
#include "passes/Passes.h"
#include "reference/ProcessGrid.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace {

using kiln::interp::Elem;
using kiln::interp::GridAxis;
using kiln::interp::ProcessGrid;
using kiln::interp::Rendezvous;
using kiln::interp::Tensor;

Tensor vec(std::vector<double> v) {
  Tensor t = Tensor::zeros(Elem::F32, {int64_t(v.size())});
  t.f = std::move(v);
  return t;
}

class CollectivesTest : public ::testing::Test {
protected:
  CollectivesTest() { ctx_.loadDialect<kiln::KilnDialect, mlir::func::FuncDialect>(); }

  mlir::func::FuncOp parse(const std::string &src, const char *name = "f") {
    module_ = mlir::parseSourceString<mlir::ModuleOp>(src, &ctx_);
    EXPECT_TRUE(module_) << "cannot parse:\n" << src;
    return module_ ? module_->lookupSymbol<mlir::func::FuncOp>(name) : mlir::func::FuncOp();
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

constexpr const char *kEveryOp = R"mlir(
module attributes {kiln.mesh = {axes = ["dp", "tp"], shape = array<i64: 2, 2>}} {
func.func @f(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>,
                                    tensor<2xf32>, tensor<8xf32>, tensor<4xf32>) {
  %0 = kiln.all_reduce %x axis = "dp" reduction = sum : tensor<4xf32>
  %1 = kiln.all_reduce %x axis = "tp" reduction = mean : tensor<4xf32>
  %2 = kiln.all_reduce %x axis = "dp" reduction = max : tensor<4xf32>
  %3 = kiln.all_reduce %x axis = "tp" reduction = min : tensor<4xf32>
  %4 = kiln.reduce_scatter %x axis = "dp" reduction = sum dim = 0 : tensor<4xf32> -> tensor<2xf32>
  %5 = kiln.all_gather %x axis = "tp" dim = 0 : tensor<4xf32> -> tensor<8xf32>
  %6 = kiln.all_reduce %x axis = "tp" reduction = sum : tensor<4xf32>
  return %0, %1, %2, %3, %4, %5, %6 : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>,
                                      tensor<2xf32>, tensor<8xf32>, tensor<4xf32>
}
}
)mlir";

// Process r = 2 * dp + tp holds x[k] = 10 r + k (+ 1 on odd k, so values
// differ in both directions). dp groups: {0, 2}, {1, 3}; tp: {0, 1}, {2, 3}.
TEST_F(CollectivesTest, EveryOpOnATwoByTwoGrid) {
  mlir::func::FuncOp fn = parse(kEveryOp);
  ASSERT_TRUE(fn);
  ProcessGrid g = grid({{"dp", 2}, {"tp", 2}});
  auto x = [](int64_t r) {
    std::vector<double> v(4);
    for (int k = 0; k < 4; ++k)
      v[k] = 10.0 * double(r) + k + (k % 2 ? (r % 2 ? -3 : 5) : 0);
    return v;
  };
  std::vector<std::vector<Tensor>> args, results;
  for (int64_t r = 0; r < 4; ++r)
    args.push_back({vec(x(r))});
  std::string error;
  ASSERT_TRUE(g.run(fn, args, results, error)) << error;
  for (int64_t r = 0; r < 4; ++r) {
    int64_t dp = r / 2, tp = r % 2;
    int64_t dpPeer = 2 * (1 - dp) + tp, tpPeer = 2 * dp + (1 - tp);
    // Members in group order: the one with coordinate 0 first.
    std::vector<double> a = x(dp == 0 ? r : dpPeer), b = x(dp == 0 ? dpPeer : r);
    std::vector<double> c = x(tp == 0 ? r : tpPeer), d = x(tp == 0 ? tpPeer : r);
    const std::vector<Tensor> &got = results[size_t(r)];
    ASSERT_EQ(got.size(), 7u);
    for (int k = 0; k < 4; ++k) {
      EXPECT_EQ(got[0].f[k], a[k] + b[k]) << "sum over dp, process " << r << " element " << k;
      EXPECT_EQ(got[1].f[k], (c[k] + d[k]) / 2) << "mean over tp, process " << r;
      EXPECT_EQ(got[2].f[k], std::max(a[k], b[k])) << "max over dp, process " << r;
      EXPECT_EQ(got[3].f[k], std::min(c[k], d[k])) << "min over tp, process " << r;
      EXPECT_EQ(got[6].f[k], c[k] + d[k]) << "sum over tp, process " << r;
    }
    // reduce_scatter: member dp keeps block dp of the sum over dp.
    ASSERT_EQ(got[4].shape, (std::vector<int64_t>{2}));
    for (int k = 0; k < 2; ++k)
      EXPECT_EQ(got[4].f[k], a[2 * dp + k] + b[2 * dp + k]) << "process " << r;
    // all_gather: the tp group's tensors, member 0 first.
    ASSERT_EQ(got[5].shape, (std::vector<int64_t>{8}));
    for (int k = 0; k < 4; ++k) {
      EXPECT_EQ(got[5].f[k], c[k]) << "process " << r;
      EXPECT_EQ(got[5].f[4 + k], d[k]) << "process " << r;
    }
  }
  // The groups differ: dp and tp sums are not the same tensor.
  EXPECT_NE(results[0][0].f, results[0][6].f);
}

// ((x0 + x1) + x2) in f32: 1 + 1e8 rounds to 1e8 (f32 spacing there is 8),
// so the sum is 0; any other order, or a float64 sum, gives 1.
TEST_F(CollectivesTest, SumsInMemberOrderRoundingEachStep) {
  mlir::func::FuncOp fn = parse(R"mlir(
module attributes {kiln.mesh = {axes = ["dp"], shape = array<i64: 3>}} {
func.func @f(%x: tensor<1xf32>) -> tensor<1xf32> {
  %0 = kiln.all_reduce %x axis = "dp" reduction = sum : tensor<1xf32>
  return %0 : tensor<1xf32>
}
}
)mlir");
  ASSERT_TRUE(fn);
  ProcessGrid g = grid({{"dp", 3}});
  std::vector<std::vector<Tensor>> results;
  std::string error;
  ASSERT_TRUE(g.run(fn, {{vec({1.0})}, {vec({1e8})}, {vec({-1e8})}}, results, error)) << error;
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(results[size_t(r)][0].f[0], 0.0) << "process " << r;
  ASSERT_TRUE(g.run(fn, {{vec({1e8})}, {vec({-1e8})}, {vec({1.0})}}, results, error)) << error;
  EXPECT_EQ(results[0][0].f[0], 1.0);
}

TEST_F(CollectivesTest, OneProcessRunsAxesOfSizeOneOnly) {
  mlir::func::FuncOp fn = parse(R"mlir(
module attributes {kiln.mesh = {axes = ["dp", "tp"], shape = array<i64: 1, 2>}} {
func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> {
  %0 = kiln.all_reduce %x axis = "dp" reduction = mean : tensor<2xf32>
  %1 = kiln.all_gather %0 axis = "dp" dim = 0 : tensor<2xf32> -> tensor<2xf32>
  %2 = kiln.reduce_scatter %1 axis = "dp" reduction = sum dim = 0 : tensor<2xf32> -> tensor<2xf32>
  return %2 : tensor<2xf32>
}
func.func @g(%x: tensor<2xf32>) -> tensor<2xf32> {
  %0 = kiln.all_reduce %x axis = "tp" reduction = sum : tensor<2xf32> loc("m.kiln":7:3)
  return %0 : tensor<2xf32>
}
}
)mlir");
  ASSERT_TRUE(fn);
  std::vector<Tensor> out;
  std::string error;
  ASSERT_TRUE(kiln::interp::run(fn, {vec({3.0, -5.0})}, out, error)) << error;
  EXPECT_EQ(out[0].f, (std::vector<double>{3.0, -5.0}));
  out.clear();
  auto g = module_->lookupSymbol<mlir::func::FuncOp>("g");
  EXPECT_FALSE(kiln::interp::run(g, {vec({3.0, -5.0})}, out, error));
  EXPECT_EQ(error, "interpreter: 'kiln.all_reduce' at loc(\"m.kiln\":7:3): a collective over "
                   "mesh axis 'tp' of size 2 needs a process grid (interp::ProcessGrid::run), "
                   "not a single-process run");
}

TEST_F(CollectivesTest, GridMustBeTheModulesMesh) {
  mlir::func::FuncOp fn = parse(kEveryOp);
  ASSERT_TRUE(fn);
  ProcessGrid g = grid({{"dp", 4}});
  std::vector<std::vector<Tensor>> args(4, {vec({1, 2, 3, 4})}), results;
  std::string error;
  EXPECT_FALSE(g.run(fn, args, results, error));
  EXPECT_EQ(error, "the process grid (dp=4) is not the module's kiln.mesh (dp=2 x tp=2): run it "
                   "on a grid with the mesh's axes");
}

TEST(RendezvousDeadlineTest, TimeoutNamesTheMissingMember) {
  Rendezvous meet(3, 0.2, {4, 5, 6});
  std::string e0, e2;
  bool ok0 = true, ok2 = true;
  auto start = std::chrono::steady_clock::now();
  std::thread t0([&] {
    std::vector<Tensor> all;
    ok0 = meet.exchange(0, vec({1}), all, e0);
  });
  std::thread t2([&] {
    std::vector<Tensor> all;
    ok2 = meet.exchange(2, vec({1}), all, e2);
  });
  t0.join();
  t2.join();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_FALSE(ok0);
  EXPECT_FALSE(ok2);
  // Whichever waited out the deadline names process 5; the other was woken
  // by its abort and says so.
  std::string timedOut = e0.rfind("timed out", 0) == 0 ? e0 : e2;
  std::string woken = e0.rfind("timed out", 0) == 0 ? e2 : e0;
  EXPECT_EQ(timedOut, "timed out after 0.2 s waiting for process 5 (the members that did not "
                      "arrive)");
  EXPECT_EQ(woken.rfind("aborted: process ", 0), 0u) << woken;
  EXPECT_NE(woken.find("waiting for process 5"), std::string::npos) << woken;
  EXPECT_GE(secs, 0.2);
  EXPECT_LT(secs, 5.0) << "the deadline is 0.2 s";
  // Later exchanges fail at once.
  std::vector<Tensor> all;
  std::string e1;
  EXPECT_FALSE(meet.exchange(1, vec({1}), all, e1));
  EXPECT_EQ(e1.rfind("aborted: ", 0), 0u);
}

// Process 1 fails before its collective (wrong arguments); process 0, waiting
// at the rendezvous with a 60 s deadline, is aborted at once, and the error
// names process 1.
TEST_F(CollectivesTest, AFailingProcessAbortsTheOthers) {
  mlir::func::FuncOp fn = parse(R"mlir(
module attributes {kiln.mesh = {axes = ["dp"], shape = array<i64: 2>}} {
func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> {
  %0 = kiln.all_reduce %x axis = "dp" reduction = sum : tensor<2xf32>
  return %0 : tensor<2xf32>
}
}
)mlir");
  ASSERT_TRUE(fn);
  ProcessGrid g = grid({{"dp", 2}});
  std::vector<std::vector<Tensor>> results;
  std::string error;
  auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(g.run(fn, {{vec({1, 2})}, {}}, results, error));
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(error, "process 1: @f takes 1 arguments, got 0");
  EXPECT_LT(secs, 10.0) << "process 0 must be aborted, not left to its 60 s deadline";
}

// The gradient is of the sum over devices of every device's loss
// (Gradients.cpp). With L = sum_d [ sum(all_gather(w_d) * c_d) +
// sum(all_reduce_sum(v_d) * e_d) ]: dL/dw_d = block d of sum_e c_e (a
// reduce_scatter), dL/dv_d = sum_e e_e (an all_reduce of the cotangents).
TEST_F(CollectivesTest, GradientRulesHoldOnTheGrid) {
  parse(R"mlir(
module attributes {kiln.mesh = {axes = ["dp"], shape = array<i64: 2>}} {
func.func @forward(%w: tensor<2xf32> {kiln.param = "w"}, %v: tensor<3xf32> {kiln.param = "v"},
                   %c: tensor<4xf32> {kiln.input = "c"}, %e: tensor<3xf32> {kiln.input = "e"})
    -> (tensor<f32> {kiln.output = "loss"}) {
  %g = kiln.all_gather %w axis = "dp" dim = 0 : tensor<2xf32> -> tensor<4xf32>
  %m = kiln.mul %g, %c : tensor<4xf32>
  %s = kiln.reduce_sum %m axes = [0] : tensor<4xf32> -> tensor<f32>
  %r = kiln.all_reduce %v axis = "dp" reduction = sum : tensor<3xf32>
  %n = kiln.mul %r, %e : tensor<3xf32>
  %t = kiln.reduce_sum %n axes = [0] : tensor<3xf32> -> tensor<f32>
  %l = kiln.add %s, %t : tensor<f32>
  return %l : tensor<f32>
}
}
)mlir", "forward");
  ASSERT_TRUE(module_);
  mlir::PassManager pm(&ctx_);
  pm.addPass(kiln::createKilnAutodiffPass());
  ASSERT_TRUE(mlir::succeeded(pm.run(*module_)));
  auto grad = module_->lookupSymbol<mlir::func::FuncOp>("grad");
  ASSERT_TRUE(grad);
  ProcessGrid g = grid({{"dp", 2}});
  std::vector<std::vector<double>> c = {{1, -2, 3, 5}, {7, 11, -13, 17}};
  std::vector<std::vector<double>> e = {{2, 4, -6}, {-1, 9, 3}};
  std::vector<std::vector<Tensor>> args, results;
  for (int d = 0; d < 2; ++d)
    args.push_back({vec({0.5 + d, -1.5}), vec({1, 2, 3 + d}), vec(c[d]), vec(e[d])});
  std::string error;
  ASSERT_TRUE(g.run(grad, args, results, error)) << error;
  for (int d = 0; d < 2; ++d) {
    ASSERT_EQ(results[d].size(), 3u);
    const Tensor &dw = results[d][1], &dv = results[d][2];
    for (int k = 0; k < 2; ++k)
      EXPECT_EQ(dw.f[k], c[0][2 * d + k] + c[1][2 * d + k]) << "dw, device " << d;
    for (int k = 0; k < 3; ++k)
      EXPECT_EQ(dv.f[k], e[0][k] + e[1][k]) << "dv, device " << d;
  }
  // And the loss each device reports is its own term: a forward check.
  double s0 = 0.5 * 1 + -1.5 * -2 + 1.5 * 3 + -1.5 * 5, t0 = 2 * 2 + 4 * 4 + 7 * -6;
  EXPECT_EQ(results[0][0].f[0], s0 + t0);
}

} // namespace
