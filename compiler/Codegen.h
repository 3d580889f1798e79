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

#include <map>
#include <string>
#include <vector>

namespace kiln {

/// A producer -> consumer edge the fusion pass did not fuse, and why.
struct Refusal {
  std::string function, producer, producerLoc, consumer, consumerLoc;
  std::string rule; ///< "rule-name: explanation"
};

/// The activation memory of @train_step: the buffers of forward values
/// (those the first micro-batch's loss depends on) that a step computing
/// something else reads: what backward keeps of forward, after fusion and
/// buffer planning (recomputation and fused recomputes included). kilnc
/// --emit=plan prints it; --precision-report compares two programs' by it.
struct ActivationMemory {
  int64_t bytes = 0, buffers = 0;
  std::map<std::string, int64_t> bytesByType; ///< "f32", "bf16", ...
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
  /// kiln-raise-attention's remarks (what was raised, or why not), one line
  /// each, "file:line:col: ...".
  std::vector<std::string> attentionRemarks;
  /// Per function name: its activation memory (@train_step only).
  std::map<std::string, ActivationMemory> activations;
};

struct CodegenOptions {
  bool emitLLVM = true;     ///< lower to LLVM and produce bitcode
  bool keepLLVMText = false;
  /// Group ops into fused kernels; false keeps one op per kernel.
  bool fusion = true;
  /// Print the kernel module after every pass of the CPU lowering, to
  /// stderr (kilnc --print-kernel-ir-after-all).
  bool printKernelIRAfterAll = false;
  /// Print the module after every pass of kernel formation (kiln-split-losses,
  /// kiln-mark-forward, kiln-fuse), to stderr (kilnc --print-ir-after-all).
  bool printIRAfterAll = false;
};

/// Needs a module on which buildTrainProgram() ran. Returns failure with
/// `error` set on an unsupported construct.
mlir::FailureOr<CompiledProgram> compileProgram(mlir::ModuleOp module,
                                                const CodegenOptions &options,
                                                std::string &error);

/// The schedule and memory plan, for humans (kilnc --emit=plan).
void printPlan(const program::Program &program, llvm::raw_ostream &os,
               const std::map<std::string, ActivationMemory> &activations = {});

/// Training memory per device by the ZeRO paper's accounting (Rajbhandari
/// et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
/// Models", 2020, section 5.1): for Psi parameters, parameters and
/// gradients take b*Psi bytes each (b: the element size, 4 for fp32) and the
/// optimizer state K*Psi (K = 8 for fp32 Adam's m and v, 4 for SGD with
/// momentum, 0 for plain SGD). Plain data parallelism keeps all of it on
/// every device; ZeRO-1 shards the optimizer state over the N devices,
/// ZeRO-2 the gradients too. Activations and scratch are not in it (the
/// plan's arena says those). With tensor parallelism (a parameter sharded
/// with kiln.shard's dim), Psi counts such a parameter by its local block,
/// all a device holds of it, its gradient and its optimizer state; N is the
/// size of the "dp" axis where the mesh has one. `stage` >= 0 (pipeline
/// parallelism): only the parameters that stage's devices hold.
struct ZeroMemory {
  int64_t psi = 0;     ///< parameter count
  int64_t devices = 1; ///< N: the devices the state is sharded over
  int64_t paramBytes = 0, gradBytes = 0, optimizerBytes = 0;
  int64_t plainDP() const { return paramBytes + gradBytes + optimizerBytes; }
  int64_t zero1() const { return paramBytes + gradBytes + ceilDiv(optimizerBytes); }
  int64_t zero2() const { return paramBytes + ceilDiv(gradBytes + optimizerBytes); }

private:
  int64_t ceilDiv(int64_t b) const { return (b + devices - 1) / devices; }
};
/// The accounting for a compiled program: Psi from its parameter buffers,
/// the optimizer state from the state buffers named "slot:param" (their
/// logical size: a parameter's element count times the slot's element
/// size), N from the mesh.
ZeroMemory zeroMemory(const program::Program &program, int stage = -1);
/// Prints the three rows (plain DP, ZeRO-1, ZeRO-2), each line starting
/// with `indent`.
void printZeroMemory(const ZeroMemory &m, llvm::raw_ostream &os, const std::string &indent);
/// Pipeline parallelism: the same accounting per stage, `stages[s]` counting
/// the parameters stage s holds (a device holds one stage's), N the
/// data-parallel replicas of a stage (devices / (pp x tp)); a header, then
/// each stage's Psi and its three rows.
void printStageZeroMemory(const std::vector<ZeroMemory> &stages, llvm::raw_ostream &os,
                          const std::string &indent);

/// Every kernel of @train_step (kind, ops, model lines, estimated FLOPs and
/// bytes moved) and every fusion the pass refused, with its rule
/// (kilnc --fusion-report).
void printFusionReport(const program::Program &program,
                       const std::vector<Refusal> &refusals,
                       const std::vector<std::string> &attentionRemarks, llvm::raw_ostream &os);

} // namespace kiln

#endif // KILN_COMPILER_CODEGEN_H
