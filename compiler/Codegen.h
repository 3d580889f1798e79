//===- Codegen.h - From the training program to kernels and a plan -*- C++ -*-===//
//
// compileProgram() turns @train_step, @eval_step and @predict into the
// kernel level (docs/codegen.md):
//   1. kernel groups: every compute op becomes one kernel (a func.func on
//      memrefs in a separate kernel module); constants and reshapes of them
//      are cloned into the kernels that read them; reshapes and
//      optimization barriers alias their operand's buffer; float32
//      kiln.matmul becomes a library GEMM step. Identical kernels (same ops,
//      types and attributes) are emitted once and shared.
//   2. the buffer plan: parameters and optimizer state in a persistent
//      region, updated in place where the update is elementwise and the old
//      value is dead; every other value gets scratch memory by first-fit over
//      its live range, reused across values that are never live together.
//   3. CPU code: the kernel module goes through kiln-lower-to-linalg,
//      bufferization, loops and the LLVM dialect to LLVM IR; each kernel gets
//      a packed entry point `void <symbol>(void **buffers)`; the result is
//      LLVM bitcode, compiled for the host by the runtime (ORC).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_COMPILER_CODEGEN_H
#define KILN_COMPILER_CODEGEN_H

#include "runtime/core/Program.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/raw_ostream.h"

#include <string>

namespace kiln {

/// A producer -> consumer edge the fusion pass did not fuse, and why.
struct Refusal {
  std::string function, producer, producerLoc, consumer, consumerLoc;
  std::string rule; ///< "rule-name: explanation"
};

struct CompiledProgram {
  program::Program program;
  mlir::OwningOpRef<mlir::ModuleOp> kernels; ///< kernel module (kiln level)
  /// The same kernels without the CPU's row pieces: func @<symbol> per
  /// program kernel, in order (the CUDA emitter's input).
  mlir::OwningOpRef<mlir::ModuleOp> neutralKernels;
  std::string bitcode;                       ///< LLVM bitcode of every kernel
  std::string llvmIR;                        ///< textual IR, when asked for
  std::vector<Refusal> refusals;             ///< fusions not done
};

struct CodegenOptions {
  bool emitLLVM = true;     ///< lower to LLVM and produce bitcode
  bool keepLLVMText = false;
  /// Group ops into fused kernels; false keeps one op per kernel.
  bool fusion = true;
  /// Print the kernel module after every pass of the CPU lowering, to
  /// stderr (kilnc --print-kernel-ir-after-all).
  bool printKernelIRAfterAll = false;
};

/// Needs a module on which buildTrainProgram() ran. Returns failure with
/// `error` set on an unsupported construct.
mlir::FailureOr<CompiledProgram> compileProgram(mlir::ModuleOp module,
                                                const CodegenOptions &options,
                                                std::string &error);

/// The schedule and memory plan, for humans (kilnc --emit=plan).
void printPlan(const program::Program &program, llvm::raw_ostream &os);

/// Every kernel of @train_step (kind, ops, model lines, estimated FLOPs and
/// bytes moved) and every fusion the pass refused, with its rule
/// (kilnc --fusion-report).
void printFusionReport(const program::Program &program,
                       const std::vector<Refusal> &refusals, llvm::raw_ostream &os);

} // namespace kiln

#endif // KILN_COMPILER_CODEGEN_H
