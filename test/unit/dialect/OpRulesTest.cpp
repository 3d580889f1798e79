//===- OpRulesTest.cpp - Every kiln op answers every rule interface -------===//
//
// The generic passes read an op's rules only through its interfaces
// (dialects/kiln/OpRules.h): sharding (kiln-data-parallel,
// kiln-tensor-parallel), precision (kiln-mixed-precision), row locality
// (kiln-fuse), index uses (the manifest's input ranges) and, for the ops
// that compute, cost. Every op of the dialect but the kernel-level
// kiln.fusion and kiln.yield must answer each; a new op that does not
// fails here (and in the build, where KilnOps.td's Kiln_ComputeOp declares
// them). Also pins a few answers the passes rely on.
//
//===----------------------------------------------------------------------===//
#include "dialects/kiln/KilnDialect.h"
#include "dialects/kiln/KilnOps.h"
#include "dialects/kiln/Sharding.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"

#include <gtest/gtest.h>

#include <string>

namespace {

bool kernelLevel(llvm::StringRef op) { return op == "kiln.fusion" || op == "kiln.yield"; }

TEST(OpRulesTest, EveryOpAnswersEveryInterface) {
  mlir::MLIRContext ctx;
  ctx.loadDialect<kiln::KilnDialect>();
  int ops = 0;
  for (mlir::RegisteredOperationName name : ctx.getRegisteredOperations()) {
    if (name.getDialectNamespace() != "kiln")
      continue;
    ++ops;
    std::string op = name.getStringRef().str();
    bool expected = !kernelLevel(op);
    EXPECT_EQ(name.hasInterface<kiln::ShardingOpInterface>(), expected) << op << ": sharding";
    EXPECT_EQ(name.hasInterface<kiln::PrecisionOpInterface>(), expected) << op << ": precision";
    EXPECT_EQ(name.hasInterface<kiln::RowLocalityOpInterface>(), expected)
        << op << ": row locality";
    EXPECT_EQ(name.hasInterface<kiln::IndexUseOpInterface>(), expected) << op << ": index uses";
  }
  EXPECT_GT(ops, 45);
}

/// Parses `body` as a function over `args` and returns its ops in order.
struct Parsed {
  mlir::MLIRContext ctx;
  mlir::OwningOpRef<mlir::ModuleOp> module;
  std::vector<mlir::Operation *> ops;
  explicit Parsed(const std::string &text) {
    ctx.loadDialect<kiln::KilnDialect, mlir::func::FuncDialect>();
    module = mlir::parseSourceString<mlir::ModuleOp>(text, &ctx);
    if (module)
      module->walk([&](mlir::Operation *op) {
        if (op->getDialect() && op->getDialect()->getNamespace() == "kiln")
          ops.push_back(op);
      });
  }
};

TEST(OpRulesTest, AnswersThePassesRelyOn) {
  Parsed p(R"(
    func.func @f(%x: tensor<8x16xf32>, %t: tensor<8xi32>, %w: tensor<50x16xf32>,
                 %i: tensor<8xi64>) -> tensor<f32> {
      %a = kiln.relu %x : tensor<8x16xf32>
      %s = kiln.softmax %a axis = 1 : tensor<8x16xf32>
      %g = kiln.gather %w[%i] axis = 0 : tensor<50x16xf32>, tensor<8xi64> -> tensor<8x16xf32>
      %l = kiln.cross_entropy %s, %t reduction = mean : tensor<8x16xf32>, tensor<8xi32> -> tensor<f32>
      return %l : tensor<f32>
    })");
  ASSERT_TRUE(p.module);
  ASSERT_EQ(p.ops.size(), 4u);
  auto rows = [&](int i) { return llvm::cast<kiln::RowLocalityOpInterface>(p.ops[i]).getRowLocality(); };
  EXPECT_EQ(rows(0).maxRows, 2);   // relu: every dimension
  EXPECT_EQ(rows(1).maxRows, 1);   // softmax over axis 1: its rows
  EXPECT_EQ(rows(2).maxRows, 1);   // gather along 0: the indices' rows
  EXPECT_FALSE(rows(2).rowShaped[0]); // the table is read whole
  EXPECT_EQ(rows(3).maxRows, 0);   // a mean loss needs every row

  auto use = [&](int i, unsigned operand) {
    return llvm::cast<kiln::IndexUseOpInterface>(p.ops[i]).getIndexUse(operand);
  };
  EXPECT_EQ(use(2, 1).kind, kiln::IndexUse::Bounded);
  EXPECT_EQ(use(2, 1).hi, 50);
  EXPECT_EQ(use(3, 1).kind, kiln::IndexUse::Bounded);
  EXPECT_EQ(use(3, 1).hi, 16);
  EXPECT_EQ(use(3, 0).kind, kiln::IndexUse::None);

  // Rows split over dp pass through relu and softmax (its axis is whole);
  // a mean loss of split rows is a partial sum over dp.
  kiln::TensorSharding rowsSplit = kiln::TensorSharding::splitOn(2, 0, "dp");
  auto relu = kiln::inferResultShardings(p.ops[0], {rowsSplit});
  ASSERT_TRUE(relu);
  EXPECT_EQ((*relu)[0], rowsSplit);
  auto ce = kiln::inferResultShardings(p.ops[3], {rowsSplit, kiln::TensorSharding::splitOn(1, 0, "dp")});
  ASSERT_TRUE(ce);
  EXPECT_TRUE((*ce)[0].isPartial("dp"));
  // softmax over a split axis cannot run without a reshard.
  EXPECT_FALSE(kiln::inferResultShardings(p.ops[1], {kiln::TensorSharding::splitOn(2, 1, "dp")}));
}

} // namespace
