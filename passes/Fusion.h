//===- Fusion.h - Grouping a function's ops into kernels ---------*- C++ -*-===//
//
// kiln-fuse: every op of a function that computes something becomes a
// member of exactly one `kiln.fusion` op, the unit of code generation
// (docs/codegen.md "Fusion"). The grouping is greedy, in schedule order,
// under these rules:
//
//   - a group is convex: no path leaves it and comes back (checked with the
//     transitive set of groups each op depends on), so the fused function
//     can be re-sorted topologically;
//   - its members share leading "row" dimensions: each member is row-local
//     over them (an output row depends on the same row of its row-shaped
//     operands and on whole operands), reductions reduce only later
//     dimensions. Row groups run one row (or a block of rows) per thread
//     block on a GPU and per piece on the CPU;
//   - a group whose reductions reduce leading dimensions is a column
//     reduction: only epilogue ops on the reduced shape and sibling
//     reductions of the same shape join it;
//   - a float32 kiln.matmul is a library GEMM: elementwise ops on its
//     result may join it as an epilogue, nothing reads into it;
//   - small values that do not depend on rows (masks from iotas, scalars of
//     the learning-rate schedule) are recomputed in every group that reads
//     them instead of being materialised (cheap producers are duplicated;
//     expensive ones never are);
//   - attention's head-split transposes read or written only by batched
//     GEMMs are folded into the GEMM (a strided layout) and stay outside.
//
// Every producer -> consumer edge that is not fused is recorded with the
// rule that refused it (kilnc --fusion-report, kiln-opt --kiln-fuse=remarks).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_PASSES_FUSION_H
#define KILN_PASSES_FUSION_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Pass/Pass.h"
#include "llvm/ADT/DenseSet.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kiln {

struct FusionOptions {
  /// false: one op per kernel (kilnc --no-fusion).
  bool enabled = true;
  /// Elementwise ops on a GEMM's result join it as an epilogue.
  bool gemmEpilogues = true;
  /// Recompute small row-independent values in each consumer group.
  bool duplicateCheap = true;
  /// The largest value (elements) that is recomputed per consumer group
  /// or per row instead of materialised.
  int64_t maxDuplicatedElements = 4096;
  /// The most ops sibling optimizer updates merge into one kernel.
  size_t maxSiblingOps = 100;
};

/// A producer -> consumer edge that was not fused, and why.
struct FusionRefusal {
  std::string producer, producerLoc, consumer, consumerLoc;
  std::string rule; ///< "rule-name: explanation"
  mlir::Location where; ///< the consumer's location (for remarks)
};

/// The refused edges of each function kiln-fuse ran on, by function name.
using FusionRefusalsByFunction = std::map<std::string, std::vector<FusionRefusal>>;

/// kiln-fuse with `options` on `functions` (all when empty), recording each
/// function's refused edges into `refusals` when given (the fusion report).
std::unique_ptr<mlir::Pass> createKilnFusePass(const FusionOptions &options,
                                               llvm::ArrayRef<std::string> functions,
                                               FusionRefusalsByFunction *refusals);

/// Groups the ops of `fn` into kiln.fusion ops and re-sorts the body. With
/// fusion disabled every op gets a fusion of its own. Appends refused edges
/// to `refusals` when given.
mlir::LogicalResult fuseFunction(mlir::func::FuncOp fn, const FusionOptions &options,
                                 std::vector<FusionRefusal> *refusals = nullptr);

/// A float32 [0, 2, 1, 3] transpose of a rank-4 tensor (attention's head
/// split or merge), which a GEMM can read or write in place.
bool isHeadTranspose(mlir::Operation *op);
/// A float32 kiln.matmul of rank-4 operands and result (per-head GEMMs).
bool isHeadMatmul(mlir::Operation *op);
/// Head transposes in `block` that GEMMs read (`in`: every user is a head
/// matmul) or write (`out`: the only user of a head matmul) in place.
void findFoldedTransposes(mlir::Block &block, llvm::DenseSet<mlir::Operation *> &in,
                          llvm::DenseSet<mlir::Operation *> &out);
/// Values kernels recompute instead of reading from memory: constants, and
/// reshapes/broadcasts of them.
bool isCloneable(mlir::Value v);
/// Ops whose every output element depends only on the same element of each
/// same-shape operand.
bool isElementwiseOp(mlir::Operation *op);
/// "file:line:col" of the first file location inside `loc`, or "".
std::string locString(mlir::Location loc);

/// The largest number of leading result dimensions over which `op` is
/// row-local (each result row depends only on the same row of the operands
/// read by rows and on the whole of the others); `rowShaped[i]` says how
/// operand i is read. Ops without a row structure return 0.
int64_t rowLocality(mlir::Operation *op, llvm::SmallVectorImpl<bool> &rowShaped);

/// Whether an elementwise kiln.fusion can run as one loop nest (a single
/// multi-output linalg.generic): every member is an elementwise op on the
/// fusion's shape or a broadcast of an input or constant, and every output
/// has that shape. Such a kernel reads each input element before writing the
/// same element of its outputs, so an output may overwrite a same-shape
/// input.
bool isSingleLoopFusion(mlir::Operation *fusion);
/// A scalar member of an elementwise fusion computed only from scalar inputs,
/// constants and other such members (computed once, before the loop).
bool isLoopInvariantMember(mlir::Operation *member);

} // namespace kiln

#endif // KILN_PASSES_FUSION_H
