//===- Passes.h - Kiln passes ------------------------------------*- C++ -*-===//
#ifndef KILN_PASSES_PASSES_H
#define KILN_PASSES_PASSES_H

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"
#include "mlir/IR/PatternMatch.h"

#include "llvm/ADT/StringMap.h"

#include <memory>
#include <vector>

namespace kiln {

#define GEN_PASS_DECL
#include "passes/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "passes/Passes.h.inc"

/// The unit attribute kiln-mark-forward puts on every op of @train_step's
/// first forward pass; the plan reads and removes it (compiler/plan/).
inline constexpr llvm::StringLiteral kForwardMarkAttr = "kiln.plan.forward";

/// Tags kiln-train-step puts on @train_step when the module's mesh has a
/// `dp` axis of size > 1, for kiln-data-parallel (docs/parallel.md): the op
/// whose result is a parameter's accumulated local gradient (its name), the
/// local loss, and the global gradient norm. The pass removes them.
inline constexpr llvm::StringLiteral kDpGradAttr = "kiln.dp.grad";
inline constexpr llvm::StringLiteral kDpLossAttr = "kiln.dp.loss";
inline constexpr llvm::StringLiteral kDpGradNormAttr = "kiln.dp.grad_norm";

/// On an arith.truncf to bf16/f16 that kiln-lower-to-linalg puts at the end
/// of an f32 accumulation (a reduction, matmul or scatter_add over a low
/// type): kiln-widen-low-precision rounds it only where it is stored, never
/// for a use inside the kernel (fp32 statistics; an explicit kiln.cast's
/// truncf, which has no such attribute, is always a rounding point).
inline constexpr llvm::StringLiteral kAccumulatorAttr = "kiln_accumulator";

/// The rounding points of a low-precision kernel (docs/training.md "Kernels:
/// low-precision storage, fp32 arithmetic"): every kiln op of a kernel whose
/// result is bf16/f16 rounds it to that type, inside a fused kernel as when
/// it is stored, so the bits do not depend on what is fused with what (nor,
/// therefore, on sharding, ZeRO or the device count). The ops that
/// softmax, log_softmax, layer_norm and cross_entropy decompose into are not
/// rounding points (their statistics stay f32); the decomposed op's result
/// is. markRoundingPoints() puts kRoundAttr on the kiln ops before the
/// decomposition, which moves it to each decomposed op's result; the CPU
/// lowering then puts it on the scalar op (or accumulation end) computing
/// the value, and kiln-widen-low-precision rounds there; the CUDA emitter
/// rounds where the kiln op has it.
inline constexpr llvm::StringLiteral kRoundAttr = "kiln_round";
void markRoundingPoints(mlir::Operation *root);

/// The reverse sweep shared by kiln-autodiff and kiln-train-step. The ops
/// that compute `loss` must already be in the builder's block; gradients are
/// appended at the builder's insertion point. Returns one gradient per `wrt`
/// value (a zero constant where the loss does not depend on it), or failure
/// after emitting an error on an op without a gradient rule.
///
/// With `recompute`, the forward ops of each block (ops tagged with the same
/// `kiln.block`) are cloned just before that block's backward ops, on
/// `kiln.optimization_barrier`s of the block's inputs, and the gradient
/// rules read the clones: activations inside a block are then dead after the
/// forward pass, at the price of running each block's forward twice. The
/// values are bit-identical.
///
/// `seed`, when given, is the adjoint of `loss` (a value of its type
/// defined before the insertion point) instead of the constant 1: fp16 loss
/// scaling seeds the sweep with the scale (docs/training.md).
mlir::FailureOr<llvm::SmallVector<mlir::Value>>
buildReverseSweep(mlir::OpBuilder &builder, mlir::Value loss,
                  llvm::ArrayRef<mlir::Value> wrt, int64_t *numOps = nullptr,
                  bool recompute = false, mlir::Value seed = {});

/// Erases pure ops whose results are unused, in `block`, to a fixpoint.
void eraseDeadOps(mlir::Block &block);

/// The scalar (arith/math) computation of one elementwise kiln op on
/// `operands`, or null when `op` is not elementwise (kiln-lower-to-linalg's
/// loop bodies; code generation builds one-loop kernels with it).
mlir::Value buildScalarOp(mlir::Operation *op, mlir::OpBuilder &b, mlir::Location loc,
                          mlir::ValueRange operands);
/// softmax, log_softmax, layer_norm and cross_entropy decomposed into kiln
/// primitives (reductions, broadcasts, elementwise ops).
void populateKilnDecompositionPatterns(mlir::RewritePatternSet &patterns);

/// The indexing map through which a kiln.broadcast_in_dim reads its operand
/// (size-1 dimensions pinned to 0).
mlir::AffineMap broadcastMap(mlir::Operation *broadcastInDim);

/// Pipeline parallelism: the stage that owns each parameter (by name),
/// the stage of its first use in @forward (kiln-pipeline-stages' tags);
/// empty without stages. kiln-pipeline places parameters and their
/// optimizer state there; kiln-data-parallel keeps buckets within a stage.
llvm::StringMap<int64_t> pipelineOwners(mlir::ModuleOp module);

/// One unit of a pipeline schedule: model chunk `chunk`'s forward (phase 0)
/// or backward (phase 1) of micro-batch `mb`; without interleaving a chunk
/// is a stage.
struct PipelineUnit {
  int64_t chunk, phase, mb;
};
/// The units device `device` of `devices` runs, in order, under `schedule`
/// ("gpipe", "1f1b" or "interleaved" with `virtualStages` chunks per
/// device) with `microBatches` micro-batches: the order kiln-pipeline
/// gives @train_step.
std::vector<PipelineUnit> pipelineOrder(int64_t device, int64_t devices, int64_t virtualStages,
                                        int64_t microBatches, llvm::StringRef schedule);

} // namespace kiln

#endif // KILN_PASSES_PASSES_H
