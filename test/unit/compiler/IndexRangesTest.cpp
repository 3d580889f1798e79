//===- IndexRangesTest.cpp - The one rule for what an integer input may take
//
// compiler/IndexRanges.h serves the artifact's manifest and kilnc's random
// inputs alike. Each path that bounds an index: cross_entropy targets,
// gather and scatter_add indices, a one-hot against an iota, through
// reshape, concat and an integer cast; the narrowest wins; a float cast, a
// table operand or an unrelated use bounds nothing.
//
//===----------------------------------------------------------------------===//
#include "compiler/IndexRanges.h"
#include "dialects/kiln/KilnDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"

#include <gtest/gtest.h>

namespace {

const char *kModule = R"mlir(
func.func @step(%t: tensor<11x7xf32>, %a: tensor<3xi32> {kiln.input = "a"},
                %b: tensor<2xi32> {kiln.input = "b"}, %c: tensor<5xi64> {kiln.input = "c"},
                %d: tensor<5xi32> {kiln.input = "d"}, %e: tensor<4xi32> {kiln.input = "e"},
                %u: tensor<5x3xf32>, %z: tensor<5x9xf32>, %x: tensor<3x2x7xf32>) -> (tensor<3x2x7xf32>, tensor<4x3xf32>, tensor<f32>, tensor<4xf32>) {
  %ab = kiln.concat %a, %b dim = 0 : tensor<3xi32>, tensor<2xi32> -> tensor<5xi32>
  %r = kiln.reshape %ab : tensor<5xi32> -> tensor<5xi32>
  %g = kiln.gather %t[%r] axis = 0 : tensor<11x7xf32>, tensor<5xi32> -> tensor<5x7xf32>
  %g3 = kiln.gather %t[%a] axis = 1 : tensor<11x7xf32>, tensor<3xi32> -> tensor<11x3xf32>
  %ci = kiln.cast %c : tensor<5xi64> -> tensor<5xi32>
  %s = kiln.scatter_add %u[%ci] axis = 0 : tensor<5x3xf32>, tensor<5xi32> -> tensor<4x3xf32>
  %ce = kiln.cross_entropy %z, %d reduction = mean : tensor<5x9xf32>, tensor<5xi32> -> tensor<f32>
  %ef = kiln.cast %e : tensor<4xi32> -> tensor<4xf32>
  return %x, %s, %ce, %ef : tensor<3x2x7xf32>, tensor<4x3xf32>, tensor<f32>, tensor<4xf32>
}
)mlir";

TEST(IndexRanges, EveryIndexingUseAndTheNarrowestWins) {
  mlir::MLIRContext ctx;
  ctx.loadDialect<kiln::KilnDialect, mlir::func::FuncDialect>();
  mlir::OwningOpRef<mlir::ModuleOp> m = mlir::parseSourceString<mlir::ModuleOp>(kModule, &ctx);
  ASSERT_TRUE(m);
  std::map<std::string, kiln::IndexRange> r = kiln::inputIndexRanges(*m);
  // a: rows of the 11-row table through concat and reshape, and columns of
  // the 7-column one directly: the narrower.
  ASSERT_TRUE(r.count("a"));
  EXPECT_EQ(r["a"].hi, 7);
  EXPECT_EQ(r["a"].from, "kiln.gather indices (a table of 7 rows)");
  ASSERT_TRUE(r.count("b"));
  EXPECT_EQ(r["b"].hi, 11);
  ASSERT_TRUE(r.count("c")); // through an integer cast into scatter_add
  EXPECT_EQ(r["c"].hi, 4);
  EXPECT_EQ(r["c"].from, "kiln.scatter_add indices (a table of 4 rows)");
  ASSERT_TRUE(r.count("d"));
  EXPECT_EQ(r["d"].hi, 9);
  EXPECT_EQ(r["d"].from, "kiln.cross_entropy targets (9 classes)");
  EXPECT_FALSE(r.count("e")) << "a float cast does not index";
  // The per-value form that kilnc's random inputs use.
  auto fn = m->lookupSymbol<mlir::func::FuncOp>("step");
  EXPECT_EQ(kiln::indexRangeOf(fn.getArgument(3))->hi, 4);
  EXPECT_FALSE(kiln::indexRangeOf(fn.getArgument(0))); // the table, not an index
}

} // namespace
