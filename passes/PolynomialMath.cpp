//===- PolynomialMath.cpp - kiln-polynomial-math --------------------------===//
//
// Float32 math functions as polynomial approximations (upstream MLIR's
// patterns), so that the CPU kernels' transcendental functions vectorize.
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/Math/Transforms/Passes.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

using namespace mlir;

namespace kiln {
#define GEN_PASS_DEF_KILNPOLYNOMIALMATHPASS
#include "passes/Passes.h.inc"

namespace {
struct KilnPolynomialMathPass : impl::KilnPolynomialMathPassBase<KilnPolynomialMathPass> {
  void runOnOperation() override {
    RewritePatternSet patterns(&getContext());
    populateMathPolynomialApproximationPatterns(patterns);
    if (failed(applyPatternsAndFoldGreedily(getOperation(), std::move(patterns))))
      signalPassFailure();
  }
};
} // namespace

} // namespace kiln
