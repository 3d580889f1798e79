//===- Pipelines.h - The pass pipelines kilnc runs ---------------*- C++ -*-===//
//
// Every pass pipeline the compiler runs, in one place, each also registered
// with kiln-opt (registerKilnPipelines) so lit tests reach it:
//   kiln-train-pipeline     @forward -> the training program (kilnc, before
//                           code generation; compiler/Training.cpp)
//   kiln-cpu-kernel-lowering  the kernel module (kiln on memrefs) -> the LLVM
//                           dialect (compiler/cpu/Lowering.cpp)
// Fusion (kiln-fuse) is not a pipeline of its own: code generation calls
// fuseFunction (passes/Fusion.h) per function, to keep each function's
// refused fusions for the fusion report.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_PASSES_PIPELINES_H
#define KILN_PASSES_PIPELINES_H

#include "mlir/IR/DialectRegistry.h"
#include "mlir/Pass/PassManager.h"

namespace kiln {

/// kiln-train-step (with `grad-only`), canonicalize, cse.
void buildTrainProgramPipeline(mlir::OpPassManager &pm, bool gradOnly = false);

/// kiln-lower-to-linalg, elementwise fusion inside kernels, one-shot
/// bufferization, loops, polynomial math and the conversions to the LLVM
/// dialect (bare-pointer calling convention). Needs the external models of
/// registerCpuKernelLoweringInterfaces in the context.
void buildCpuKernelLoweringPipeline(mlir::OpPassManager &pm);

/// The bufferization and deallocation interfaces of the upstream dialects
/// the CPU kernel lowering bufferizes.
void registerCpuKernelLoweringInterfaces(mlir::DialectRegistry &registry);

/// Registers both pipelines with the pass registry (kiln-opt).
void registerKilnPipelines();

} // namespace kiln

#endif // KILN_PASSES_PIPELINES_H
