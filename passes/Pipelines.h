//===- Pipelines.h - The pass pipelines kilnc runs ---------------*- C++ -*-===//
//
// Every pass pipeline the compiler runs, in one place, each also registered
// with kiln-opt (registerKilnPipelines) so lit tests reach it:
//   kiln-train-pipeline     @forward -> the training program (kilnc, before
//                           code generation; compiler/Training.cpp)
//   kiln-cpu-kernel-lowering  the kernel module (kiln on memrefs) -> the LLVM
//                           dialect (compiler/cpu/Lowering.cpp)
//   kiln-kernel-formation   the training program -> kernels: kiln-split-losses,
//                           kiln-mark-forward, kiln-fuse on @train_step,
//                           @eval_step and @predict (code generation,
//                           compiler/plan/Generator.cpp)
//
//===----------------------------------------------------------------------===//
#ifndef KILN_PASSES_PIPELINES_H
#define KILN_PASSES_PIPELINES_H

#include "passes/Fusion.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/Pass/PassManager.h"

namespace kiln {

/// kiln-train-step (with `grad-only`), canonicalize, cse.
void buildTrainProgramPipeline(mlir::OpPassManager &pm, bool gradOnly = false);

/// kiln-split-losses, kiln-mark-forward and kiln-fuse (one op per kernel
/// without `fusion`) on the functions code generation compiles; each
/// function's refused fusions go to `refusals` when given.
void buildKernelFormationPipeline(mlir::OpPassManager &pm, bool fusion,
                                  FusionRefusalsByFunction *refusals = nullptr);

/// The functions of the training program code generation compiles, in order.
llvm::ArrayRef<std::string> compiledFunctions();

/// kiln-lower-to-linalg, elementwise fusion inside kernels, one-shot
/// bufferization, loops, polynomial math and the conversions to the LLVM
/// dialect (bare-pointer calling convention). Needs the external models of
/// registerCpuKernelLoweringInterfaces in the context.
void buildCpuKernelLoweringPipeline(mlir::OpPassManager &pm);

/// The bufferization and deallocation interfaces of the upstream dialects
/// the CPU kernel lowering bufferizes.
void registerCpuKernelLoweringInterfaces(mlir::DialectRegistry &registry);

/// Prints the module after every pass of `pm` that changes it, to stderr
/// (kilnc --print-ir-after-all, --print-kernel-ir-after-all); turns off the
/// context's multithreading, which IR printing needs.
void printAfterEveryPass(mlir::PassManager &pm);

/// Registers the pipelines with the pass registry (kiln-opt).
void registerKilnPipelines();

} // namespace kiln

#endif // KILN_PASSES_PIPELINES_H
