//===- ExpandBF16.cpp - kiln-expand-bf16 ----------------------------------===//
//
// bf16 <-> f32 conversions as integer ops (upstream MLIR's bf16 expansion
// patterns alone, without the rest of arith-expand), so that the CPU
// kernels that load or store bf16 vectorize as wide as f32 ones.
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Arith/Transforms/Passes.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

using namespace mlir;

namespace kiln {
#define GEN_PASS_DEF_KILNEXPANDBF16PASS
#include "passes/Passes.h.inc"

namespace {
struct KilnExpandBF16Pass : impl::KilnExpandBF16PassBase<KilnExpandBF16Pass> {
  void runOnOperation() override {
    RewritePatternSet patterns(&getContext());
    arith::populateExpandBFloat16Patterns(patterns);
    if (failed(
            applyPatternsAndFoldGreedily(getOperation(), std::move(patterns))))
      signalPassFailure();
  }
};
} // namespace

} // namespace kiln
