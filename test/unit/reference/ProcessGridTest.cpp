//===- ProcessGridTest.cpp - Unit tests for the reference process grid ----===//
//
// The grid's geometry (ranks, coordinates, the groups of a collective over an
// axis), a grid run against single runs of the interpreter (bit-for-bit: the
// same code on the same inputs) and the rendezvous collectives will meet at.
//
//===----------------------------------------------------------------------===//
#include "reference/ProcessGrid.h"
#include "dialects/kiln/KilnDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <thread>
#include <vector>

namespace {

using kiln::interp::GridAxis;
using kiln::interp::ProcessGrid;
using kiln::interp::Rendezvous;
using kiln::interp::Tensor;
using kiln::interp::Elem;

TEST(ProcessGridTest, OneProcessByDefault) {
  ProcessGrid grid;
  EXPECT_EQ(grid.size(), 1);
  EXPECT_TRUE(grid.coords(0).empty());
  EXPECT_EQ(grid.rank({}), 0);
}

TEST(ProcessGridTest, RanksAndGroups) {
  ProcessGrid grid;
  std::string error;
  ASSERT_TRUE(ProcessGrid::create({{"dp", 2}, {"tp", 3}}, grid, error)) << error;
  EXPECT_EQ(grid.size(), 6);
  EXPECT_EQ(grid.coords(4), (std::vector<int64_t>{1, 1}));
  for (int64_t r = 0; r < grid.size(); ++r)
    EXPECT_EQ(grid.rank(grid.coords(r)), r);
  EXPECT_EQ(grid.groups("tp"),
            (std::vector<std::vector<int64_t>>{{0, 1, 2}, {3, 4, 5}}));
  EXPECT_EQ(grid.groups("dp"),
            (std::vector<std::vector<int64_t>>{{0, 3}, {1, 4}, {2, 5}}));
  EXPECT_TRUE(grid.groups("pp").empty());
}

TEST(ProcessGridTest, RejectsBadAxes) {
  ProcessGrid grid;
  std::string error;
  EXPECT_FALSE(ProcessGrid::create({{"dp", 2}, {"dp", 2}}, grid, error));
  EXPECT_EQ(error, "process grid axis 'dp' appears twice");
  EXPECT_FALSE(ProcessGrid::create({{"dp", 0}}, grid, error));
  EXPECT_EQ(error, "process grid axis 'dp' has size 0; sizes start at 1");
  EXPECT_FALSE(ProcessGrid::create({{"", 2}}, grid, error));
  EXPECT_EQ(error, "process grid axis 0 has no name");
}

class ProcessGridRunTest : public ::testing::Test {
protected:
  ProcessGridRunTest() {
    ctx_.loadDialect<kiln::KilnDialect, mlir::func::FuncDialect>();
    module_ = mlir::parseSourceString<mlir::ModuleOp>(R"mlir(
func.func @f(%a: tensor<2x3xf32>, %b: tensor<3x2xf32>) -> (tensor<2x2xf32>, tensor<2x3xf32>) {
  %0 = kiln.matmul %a, %b : tensor<2x3xf32>, tensor<3x2xf32> -> tensor<2x2xf32>
  %1 = kiln.tanh %a : tensor<2x3xf32>
  return %0, %1 : tensor<2x2xf32>, tensor<2x3xf32>
}
)mlir", &ctx_);
  }

  mlir::func::FuncOp fn() {
    return module_ ? module_->lookupSymbol<mlir::func::FuncOp>("f")
                   : mlir::func::FuncOp();
  }

  /// Fresh, non-zero inputs that differ between processes.
  static std::vector<Tensor> inputs(int seed) {
    Tensor a = Tensor::zeros(Elem::F32, {2, 3});
    Tensor b = Tensor::zeros(Elem::F32, {3, 2});
    for (int64_t k = 0; k < 6; ++k) {
      a.f[k] = kiln::interp::roundTo(Elem::F32, std::sin(1.0 + seed * 7 + k));
      b.f[k] = kiln::interp::roundTo(Elem::F32, std::cos(2.0 + seed * 5 + k));
    }
    return {a, b};
  }

  mlir::MLIRContext ctx_;
  mlir::OwningOpRef<mlir::ModuleOp> module_;
};

// Without collectives each process computes exactly what one run of the
// interpreter computes on its inputs: compared bit for bit.
TEST_F(ProcessGridRunTest, EachProcessEqualsASingleRun) {
  ASSERT_TRUE(fn());
  ProcessGrid grid;
  std::string error;
  ASSERT_TRUE(ProcessGrid::create({{"dp", 2}}, grid, error)) << error;
  std::vector<std::vector<Tensor>> args = {inputs(0), inputs(1)};
  std::vector<std::vector<Tensor>> results;
  ASSERT_TRUE(grid.run(fn(), args, results, error)) << error;
  ASSERT_EQ(results.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    std::vector<Tensor> single;
    ASSERT_TRUE(kiln::interp::run(fn(), args[r], single, error)) << error;
    ASSERT_EQ(results[r].size(), single.size());
    for (size_t i = 0; i < single.size(); ++i) {
      EXPECT_EQ(results[r][i].shape, single[i].shape);
      EXPECT_EQ(results[r][i].f, single[i].f) << "process " << r << " result " << i;
    }
  }
  EXPECT_NE(results[0][0].f, results[1][0].f) << "the processes' inputs differ";
}

TEST_F(ProcessGridRunTest, ReportsTheFailingProcess) {
  ASSERT_TRUE(fn());
  ProcessGrid grid;
  std::string error;
  ASSERT_TRUE(ProcessGrid::create({{"dp", 2}}, grid, error)) << error;
  std::vector<std::vector<Tensor>> results;
  EXPECT_FALSE(grid.run(fn(), {inputs(0)}, results, error));
  EXPECT_EQ(error, "a grid of 2 processes needs 2 argument lists, got 1");
  EXPECT_FALSE(grid.run(fn(), {inputs(0), {}}, results, error));
  EXPECT_EQ(error, "process 1: @f takes 2 arguments, got 0");
}

// Three rounds between three threads: every member leaves each round with all
// contributions in member order.
TEST(RendezvousTest, EveryMemberGetsEveryContribution) {
  constexpr int kMembers = 3, kRounds = 3;
  Rendezvous meet(kMembers);
  std::vector<std::vector<std::vector<Tensor>>> got(kMembers);
  std::vector<std::thread> threads;
  for (int m = 0; m < kMembers; ++m)
    threads.emplace_back([&, m] {
      for (int round = 0; round < kRounds; ++round) {
        Tensor t = Tensor::zeros(Elem::F32, {});
        t.f[0] = 10 * round + m + 1;
        std::vector<Tensor> all;
        if (meet.exchange(m, t, all))
          got[m].push_back(all);
      }
    });
  for (std::thread &t : threads)
    t.join();
  for (int m = 0; m < kMembers; ++m) {
    ASSERT_EQ(got[m].size(), size_t(kRounds)) << "member " << m;
    for (int round = 0; round < kRounds; ++round) {
      ASSERT_EQ(got[m][round].size(), size_t(kMembers));
      for (int k = 0; k < kMembers; ++k)
        EXPECT_EQ(got[m][round][k].f[0], 10 * round + k + 1);
    }
  }
}

TEST(RendezvousTest, AbortWakesTheWaiting) {
  Rendezvous meet(2);
  bool ok = true;
  std::thread waiter([&] {
    std::vector<Tensor> all;
    ok = meet.exchange(0, Tensor::zeros(Elem::F32, {}), all);
  });
  meet.abort();
  waiter.join();
  EXPECT_FALSE(ok);
  std::vector<Tensor> all;
  EXPECT_FALSE(meet.exchange(1, Tensor::zeros(Elem::F32, {}), all));
}

} // namespace
