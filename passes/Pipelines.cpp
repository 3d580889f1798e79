//===- Pipelines.cpp - The pass pipelines kilnc runs ----------------------===//
#include "passes/Pipelines.h"

#include "passes/Passes.h"

#include "mlir/Conversion/AffineToStandard/AffineToStandard.h"
#include "mlir/Conversion/ArithToLLVM/ArithToLLVM.h"
#include "mlir/Conversion/ControlFlowToLLVM/ControlFlowToLLVM.h"
#include "mlir/Conversion/FuncToLLVM/ConvertFuncToLLVMPass.h"
#include "mlir/Conversion/IndexToLLVM/IndexToLLVM.h"
#include "mlir/Conversion/MathToLLVM/MathToLLVM.h"
#include "mlir/Conversion/MathToLibm/MathToLibm.h"
#include "mlir/Conversion/MemRefToLLVM/MemRefToLLVM.h"
#include "mlir/Conversion/ReconcileUnrealizedCasts/ReconcileUnrealizedCasts.h"
#include "mlir/Conversion/SCFToControlFlow/SCFToControlFlow.h"
#include "mlir/Dialect/Arith/Transforms/BufferDeallocationOpInterfaceImpl.h"
#include "mlir/Dialect/Arith/Transforms/BufferizableOpInterfaceImpl.h"
#include "mlir/Dialect/Bufferization/Pipelines/Passes.h"
#include "mlir/Dialect/Bufferization/Transforms/OneShotAnalysis.h"
#include "mlir/Dialect/Bufferization/Transforms/Passes.h"
#include "mlir/Dialect/ControlFlow/Transforms/BufferDeallocationOpInterfaceImpl.h"
#include "mlir/Dialect/ControlFlow/Transforms/BufferizableOpInterfaceImpl.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Linalg/Passes.h"
#include "mlir/Dialect/Linalg/Transforms/BufferizableOpInterfaceImpl.h"
#include "mlir/Dialect/MemRef/Transforms/AllocationOpInterfaceImpl.h"
#include "mlir/Dialect/MemRef/Transforms/Passes.h"
#include "mlir/Dialect/SCF/Transforms/BufferDeallocationOpInterfaceImpl.h"
#include "mlir/Dialect/SCF/Transforms/BufferizableOpInterfaceImpl.h"
#include "mlir/Dialect/Tensor/Transforms/BufferizableOpInterfaceImpl.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"

using namespace mlir;

namespace kiln {

void buildTrainProgramPipeline(OpPassManager &pm, bool gradOnly) {
  KilnTrainStepPassOptions options;
  options.gradOnly = gradOnly;
  // Attention written from primitives as kiln.attention (train setting
  // attention = fused, the default).
  pm.addPass(createKilnRaiseAttentionPass());
  // Mixed precision on @forward (a no-op without precision = bf16|fp16).
  pm.addPass(createKilnMixedPrecisionPass());
  // Pipeline stages of @forward when kiln.mesh has pp > 1 (a no-op
  // otherwise): kiln-train-step's clones and gradients keep them.
  pm.addPass(createKilnPipelineStagesPass());
  pm.addPass(createKilnTrainStepPass(options));
  // Tensor parallelism when kiln.mesh has tp > 1 (a no-op otherwise).
  pm.addPass(createKilnTensorParallelPass());
  // Data parallelism when kiln.mesh has dp > 1 (a no-op without a mesh, so
  // single-device programs are unchanged); before canonicalization, which
  // would fold the tagged ops.
  pm.addPass(createKilnDataParallelPass());
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createCSEPass());
  // Pipeline parallelism when kiln.mesh has pp > 1: after the passes above,
  // so the ops they create get stages too.
  pm.addPass(createKilnPipelinePass());
}

void buildCpuKernelLoweringPipeline(OpPassManager &pm) {
  pm.addPass(createKilnLowerToLinalgPass());
  pm.addPass(createCanonicalizerPass());
  // Fuses every elementwise producer into its consumers inside a kernel
  // (splat constants and broadcasts included), so no intermediate array is
  // materialised between fused ops.
  pm.addPass(createKilnKernelElementwiseFusionPass());
  pm.addPass(createCanonicalizerPass());
  // bf16/f16: f32 arithmetic between loads and stores, one rounding per
  // stored value (a no-op for f32 kernels).
  pm.addPass(createKilnWidenLowPrecisionPass());
  pm.addPass(bufferization::createEmptyTensorEliminationPass());
  bufferization::OneShotBufferizationOptions opts;
  opts.allowReturnAllocsFromLoops = true;
  // Copies as linalg.copy (later loops), never memref.copy's call into
  // MLIR's C runner library, which the runtime does not link.
  opts.memCpyFn = [](OpBuilder &b, Location loc, Value from, Value to) {
    b.create<linalg::CopyOp>(loc, from, to);
    return success();
  };
  pm.addPass(bufferization::createOneShotBufferizePass(opts));
  bufferization::BufferDeallocationPipelineOptions dealloc;
  bufferization::buildBufferDeallocationPipeline(pm, dealloc);
  pm.addPass(createCanonicalizerPass());
  pm.addNestedPass<func::FuncOp>(createConvertLinalgToLoopsPass());
  pm.addPass(createConvertSCFToCFPass());
  pm.addPass(memref::createExpandStridedMetadataPass());
  pm.addPass(createLowerAffinePass());
  pm.addPass(createKilnPolynomialMathPass());
  // bf16 <-> f32 as integer ops (LLVM costs its bfloat conversions as
  // scalar and vectorizes bf16 kernels 2 lanes wide); f32 kernels have none.
  pm.addPass(createKilnExpandBF16Pass());
  // LLVM intrinsics first (fma, sqrt, ... vectorize); libm only for what
  // has no intrinsic (float64 erf, ...).
  pm.addPass(createConvertMathToLLVMPass());
  pm.addPass(createConvertMathToLibmPass());
  pm.addPass(createFinalizeMemRefToLLVMConversionPass());
  pm.addPass(createArithToLLVMConversionPass());
  pm.addPass(createConvertIndexToLLVMPass());
  pm.addPass(createConvertControlFlowToLLVMPass());
  ConvertFuncToLLVMPassOptions funcOpts;
  funcOpts.useBarePtrCallConv = true;
  pm.addPass(createConvertFuncToLLVMPass(funcOpts));
  pm.addPass(createReconcileUnrealizedCastsPass());
}

void registerCpuKernelLoweringInterfaces(DialectRegistry &registry) {
  arith::registerBufferizableOpInterfaceExternalModels(registry);
  arith::registerBufferDeallocationOpInterfaceExternalModels(registry);
  cf::registerBufferizableOpInterfaceExternalModels(registry);
  cf::registerBufferDeallocationOpInterfaceExternalModels(registry);
  linalg::registerBufferizableOpInterfaceExternalModels(registry);
  memref::registerAllocationOpInterfaceExternalModels(registry);
  scf::registerBufferizableOpInterfaceExternalModels(registry);
  scf::registerBufferDeallocationOpInterfaceExternalModels(registry);
  tensor::registerBufferizableOpInterfaceExternalModels(registry);
}

void printAfterEveryPass(PassManager &pm) {
  pm.getContext()->disableMultithreading(); // IR printing needs it
  pm.enableIRPrinting(/*shouldPrintBeforePass=*/nullptr,
                      /*shouldPrintAfterPass=*/[](Pass *, Operation *) { return true; },
                      /*printModuleScope=*/true, /*printAfterOnlyOnChange=*/true,
                      /*printAfterOnlyOnFailure=*/false, llvm::errs());
}

llvm::ArrayRef<std::string> compiledFunctions() {
  static const std::string names[] = {"train_step", "eval_step", "predict"};
  return names;
}

void buildKernelFormationPipeline(OpPassManager &pm, bool fusion,
                                  FusionRefusalsByFunction *refusals) {
  KilnSplitLossesPassOptions split;
  split.functions = compiledFunctions();
  pm.addPass(createKilnSplitLossesPass(split));
  pm.addPass(createKilnMarkForwardPass());
  FusionOptions fuse;
  fuse.enabled = fusion;
  pm.addPass(createKilnFusePass(fuse, compiledFunctions(), refusals));
}

namespace {
struct KernelFormationOptions : PassPipelineOptions<KernelFormationOptions> {
  Option<bool> noFusion{*this, "no-fusion", llvm::cl::desc("One op per kernel (kilnc --no-fusion)"),
                        llvm::cl::init(false)};
};

struct TrainPipelineOptions : PassPipelineOptions<TrainPipelineOptions> {
  Option<bool> gradOnly{*this, "grad-only",
                        llvm::cl::desc("Build @grad only (kilnc --gradcheck)"),
                        llvm::cl::init(false)};
};
} // namespace

void registerKilnPipelines() {
  PassPipelineRegistration<TrainPipelineOptions>(
      "kiln-train-pipeline",
      "kiln-mixed-precision, kiln-train-step, kiln-data-parallel, canonicalize, cse: @forward to the training program (kilnc)",
      [](OpPassManager &pm, const TrainPipelineOptions &o) {
        buildTrainProgramPipeline(pm, o.gradOnly);
      });
  PassPipelineRegistration<KernelFormationOptions>(
      "kiln-kernel-formation",
      "kiln-split-losses, kiln-mark-forward, kiln-fuse: the training program to kernels (kilnc's code generation)",
      [](OpPassManager &pm, const KernelFormationOptions &o) {
        buildKernelFormationPipeline(pm, !o.noFusion);
      });
  PassPipelineRegistration<>(
      "kiln-cpu-kernel-lowering",
      "The kernel module (kiln on memrefs) to the LLVM dialect (kilnc's CPU code)",
      [](OpPassManager &pm) { buildCpuKernelLoweringPipeline(pm); });
}

} // namespace kiln
