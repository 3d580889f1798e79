//===- KernelFusion.cpp - kiln-kernel-elementwise-fusion ------------------===//
//
// linalg's elementwise fusion inside each kernel, with producers fused into
// every consumer (the upstream pass fuses single-use producers only). A
// value that several ops of a kernel read (a softmax's exponentials, read
// by the row sum and by the division; layer_norm's normalized input) is
// then recomputed in each loop nest instead of materialised in a
// temporary buffer, so fused ops exchange no intermediate arrays; only
// reduction results (one value per row) stay in memory.
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Linalg/Transforms/Transforms.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

using namespace mlir;

namespace kiln {
#define GEN_PASS_DEF_KILNKERNELELEMENTWISEFUSIONPASS
#include "passes/Passes.h.inc"

namespace {
struct KilnKernelElementwiseFusionPass
    : impl::KilnKernelElementwiseFusionPassBase<KilnKernelElementwiseFusionPass> {
  void runOnOperation() override {
    MLIRContext *ctx = &getContext();
    RewritePatternSet patterns(ctx);
    linalg::ControlFusionFn always = [](OpOperand *fused) {
      return fused->get().getDefiningOp() != nullptr;
    };
    linalg::populateElementwiseOpsFusionPatterns(patterns, always);
    // The end of an f32 accumulation over bf16/f16 (kAccumulatorAttr: a
    // reduction's truncation) moves through the reshapes after it, so that
    // it fuses into the reduction's readers and the statistic stays f32
    // there (kiln-widen-low-precision). Only those generics: f32 kernels
    // are unchanged.
    linalg::ControlFusionFn accumulatorEnd = [](OpOperand *fused) {
      auto g = fused->get().getDefiningOp<linalg::GenericOp>();
      if (!g)
        return false;
      bool found = false;
      g.getRegion().walk([&](arith::TruncFOp t) { found = found || t->hasAttr(kAccumulatorAttr); });
      return found;
    };
    linalg::populateFoldReshapeOpsByExpansionPatterns(patterns, accumulatorEnd);
    linalg::populateConstantFoldLinalgOperations(patterns, always);
    linalg::GenericOp::getCanonicalizationPatterns(patterns, ctx);
    tensor::ExpandShapeOp::getCanonicalizationPatterns(patterns, ctx);
    tensor::CollapseShapeOp::getCanonicalizationPatterns(patterns, ctx);
    ctx->getLoadedDialect<linalg::LinalgDialect>()->getCanonicalizationPatterns(patterns);
    GreedyRewriteConfig config;
    config.useTopDownTraversal = true;
    if (failed(applyPatternsAndFoldGreedily(getOperation(), std::move(patterns), config)))
      signalPassFailure();
  }
};
} // namespace

} // namespace kiln
