//===- Generator.h - Kernel formation and the plan, shared -------*- C++ -*-===//
//
// Internal to compiler/: the state compileProgram() (Codegen.cpp) builds
// while it turns the functions of a training program into kernels, steps and
// a buffer plan. Kernels.cpp forms the kernel funcs from kiln.fusion groups
// (makeKernel, row pieces); plan/ forms the steps, assigns buffers and
// prints the plan; cpu/Lowering.cpp lowers the kernel module to LLVM.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_COMPILER_GENERATOR_H
#define KILN_COMPILER_GENERATOR_H

#include "compiler/Codegen.h"
#include "dialects/kiln/KilnOps.h"
#include "passes/Fusion.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringMap.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace kiln::codegen {

/// The program's element type of an MLIR element type; false if none.
bool toDType(mlir::Type t, program::DType &out);
mlir::RankedTensorType tensorOf(mlir::Value v);
/// The splat value of a constant (possibly reshaped or broadcast), or null.
mlir::Attribute splatValue(mlir::Value v);
/// Estimated floating-point operations of one op (the fusion report).
int64_t estimateFlops(mlir::Operation *op);

/// One step before buffers are assigned: operands and results are values.
struct VStep {
  program::Step::Kind kind;
  int kernel = -1;
  llvm::SmallVector<mlir::Value> ins, outs;
  program::GemmParams gemm;
  std::string loc;
  /// A GEMM's epilogue kernel, its inputs (the GEMM's result among them) and
  /// outputs.
  int epilogue = -1;
  llvm::SmallVector<mlir::Value> epiIns, epiOuts;
  /// The epilogue as a library epilogue (LtEpilogue), when it is one: the
  /// bias (outside value), the result and pre-activation (fusion results,
  /// or the GEMM's own value for a pre-activation without bias).
  bool lt = false;
  program::LtEpilogue::Activation ltAct = program::LtEpilogue::Activation::None;
  mlir::Value ltBias, ltOut, ltAux;
  /// Outputs written over an input (a parameter update over the old value):
  /// (output value, input value); the output has no buffer of its own.
  llvm::SmallVector<std::pair<mlir::Value, mlir::Value>> tied;
  /// A collective step: what it exchanges (its buffers are ins[0] and
  /// outs[0]); `overlap`: it carries kiln.overlap and runs on queue 1.
  program::Collective coll;
  /// An attention step: the fused call (its buffers: ins then outs).
  program::AttentionParams attention;
  bool overlap = false;
  /// The pipeline stage that runs the step (kiln.stage), or -1: every device.
  int stage = -1;
};

class Generator {
public:
  /// `printIRAfterAll`: print the module after every pass of kernel
  /// formation, to stderr (kilnc --print-ir-after-all).
  Generator(mlir::ModuleOp module, bool fusion, std::string &error,
            bool printIRAfterAll = false);

  /// Compiles @train_step, @eval_step and @predict (those that exist).
  mlir::LogicalResult run();

  program::Program takeProgram() { return std::move(prog_); }
  std::vector<Refusal> takeRefusals() { return std::move(refusals_); }
  std::map<std::string, ActivationMemory> takeActivations() { return std::move(activations_); }
  mlir::OwningOpRef<mlir::ModuleOp> takeKernels() { return std::move(kernels_); }
  mlir::OwningOpRef<mlir::ModuleOp> takeNeutralKernels() { return std::move(neutral_); }

private:
  mlir::LogicalResult fail(mlir::Operation *op, const std::string &why);

  static int64_t align(int64_t v) { return (v + 63) / 64 * 64; }
  static program::Buffer makeBuffer(mlir::RankedTensorType t, program::Role role,
                                    const std::string &name);
  int persistentBuffer(const std::string &name, program::Role role, int stage,
                       mlir::RankedTensorType t);

  // Kernel formation (Kernels.cpp).
  mlir::FailureOr<int> makeKernel(llvm::ArrayRef<mlir::Operation *> members,
                                  llvm::ArrayRef<mlir::Value> ins,
                                  llvm::ArrayRef<mlir::Value> outs, llvm::StringRef kind,
                                  int64_t rows,
                                  llvm::SmallVectorImpl<std::pair<unsigned, unsigned>> &ties);

  // Steps and the buffer plan (compiler/plan/).
  mlir::Value root(mlir::Value v);
  void matchLtEpilogue(FusionOp fusion, MatmulOp mm, llvm::ArrayRef<mlir::Operation *> epi,
                       llvm::ArrayRef<mlir::Value> outs, VStep &s);
  mlir::LogicalResult gemmStep(FusionOp fusion, MatmulOp mm, VStep &s);
  /// A kernel of kind "attention": its one kiln.attention or
  /// kiln.attention_grad as Step::Attention.
  mlir::LogicalResult attentionStep(FusionOp fusion, mlir::Operation *op, VStep &s);
  mlir::LogicalResult pipelineSteps(mlir::Operation *op, std::vector<VStep> &steps);
  mlir::LogicalResult collectiveStep(mlir::Operation *op, VStep &s);
  mlir::LogicalResult compileFunction(mlir::func::FuncOp fn);
  static void exactDependencies(const program::Program &p, program::Function &f);
  mlir::LogicalResult assignBuffers(mlir::func::FuncOp fn, std::vector<VStep> &steps,
                                    mlir::func::ReturnOp ret);
  /// Runs kernel formation (buildKernelFormationPipeline) on the module,
  /// keeping what each function needs from before it.
  mlir::LogicalResult formKernels();

  mlir::ModuleOp module_;
  mlir::MLIRContext *ctx_;
  std::string &error_;
  mlir::OwningOpRef<mlir::ModuleOp> kernels_;
  /// The kernels without CPU pieces (one func per program kernel, in order).
  mlir::OwningOpRef<mlir::ModuleOp> neutral_;
  program::Program prog_;
  llvm::StringMap<int> kernelByKey_;
  llvm::DenseMap<mlir::Value, mlir::Value> alias_;
  std::vector<int> scratchIds_; ///< offsets relative to the scratch base
  /// Pipeline stages (docs/parallel.md): where each stage's persistent
  /// buffers end (key -1: the buffers every device holds), and each
  /// function's scratch peak per stage.
  std::map<int, int64_t> persistentEnd_;
  std::map<int, int64_t> scratchPeak_;
  /// Per function, per step: the queue it runs on (1: a kiln.overlap
  /// collective), set again after computeDependencies().
  std::vector<std::vector<int>> queues_;
  bool fusion_ = true;
  bool printIRAfterAll_ = false;
  /// What kernel formation leaves for each compiled function: the head
  /// transposes its GEMMs read (foldedIn) or write (foldedOut) in place,
  /// found before kiln-fuse, and its refused fusions.
  struct FormedFunction {
    llvm::DenseSet<mlir::Operation *> foldedIn, foldedOut;
    std::vector<FusionRefusal> refusals;
  };
  std::map<std::string, FormedFunction> formed_;
  std::vector<Refusal> refusals_;
  /// Head transposes a GEMM reads (foldedIn) or writes (foldedOut) in place.
  llvm::DenseSet<mlir::Operation *> foldedIn_, foldedOut_;
  /// For the function being compiled: whether it has kiln-mark-forward's
  /// marks; the
  /// step results that are forward values; the steps that compute anything
  /// else (backward, the optimizer, the other micro-batches).
  bool hasForward_ = false;
  llvm::DenseSet<mlir::Value> forwardValues_;
  std::vector<bool> otherSteps_;
  std::map<std::string, ActivationMemory> activations_;
};

} // namespace kiln::codegen

#endif // KILN_COMPILER_GENERATOR_H
