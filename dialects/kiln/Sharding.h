//===- Sharding.h - Per-tensor sharding over a device mesh -------*- C++ -*-===//
//
// How a tensor of the per-device program relates to the logical (global)
// tensor, after GSPMD and Shardy: for each dimension, the mesh axes it is
// split over (major to minor: block-split, device coordinate on the first
// axis outermost), plus the axes over which the per-device values are
// partial sums (the logical tensor is their sum; a mean-normalised loss's
// partials are reduced by a mean). An axis named nowhere is replicated.
//
// Attribute form (on ops, as `kiln.sharding`, one per result):
//   {split = [["dp"], []], partial = []}        rows split over dp
//   {split = [[], []], partial = ["dp"]}        a partial sum over dp
//
// Each op's rule is its ShardingOpInterface answer, in its family file
// (dialects/kiln/ops/); docs/parallel.md says what the rules cover.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_DIALECTS_KILN_SHARDING_H
#define KILN_DIALECTS_KILN_SHARDING_H

#include "dialects/kiln/KilnDialect.h"
#include "dialects/kiln/OpRules.h"

#include "mlir/IR/Attributes.h"
#include "mlir/IR/Block.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Diagnostics.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SmallVector.h"

#include <optional>
#include <string>

namespace kiln {

/// The op attribute holding each result's sharding (an array, one
/// dictionary per result).
inline constexpr llvm::StringLiteral kShardingAttr = "kiln.sharding";
/// The argument/result attribute of a ZeRO-sharded buffer:
/// {axis = "dp", shape = array<i64: logical shape>}; the buffer holds block
/// d (the device's coordinate on axis) of the row-major flattening of the
/// logical tensor, zero-padded to a multiple of the axis size. Tensor
/// parallelism: {axis = "tp", dim = D, outer = K, shape}, the device's block
/// of dimension D (Buffer::shardDim); with zero = "dp" as well, ZeRO blocks
/// that block over dp (Buffer::zeroAxis).
inline constexpr llvm::StringLiteral kShardAttr = "kiln.shard";

/// The mesh of the train settings `devices` (all devices) and `tp`: none for
/// one device, ["dp"] without tensor parallelism, ["dp", "tp"] of shape
/// [devices / tp, tp] with it (tp innermost: a tp group is adjacent ranks).
/// With pp > 1 stages, ["pp", "dp"] or ["pp", "dp", "tp"]: pp outermost, so a
/// stage is a block of dp x tp adjacent devices.
MeshShape meshFor(int64_t devices, int64_t tp, int64_t pp = 1);

/// The pipeline stage an op runs on (docs/parallel.md "Pipeline
/// parallelism"): `kiln.stage = s`; ops without it run on every device.
inline constexpr llvm::StringLiteral kStageAttr = "kiln.stage";
/// The stage of `op`, or -1 (every device).
int64_t stageOf(mlir::Operation *op);
/// Interleaved 1F1B (train setting pipeline = "interleaved"): the model
/// chunks ("virtual stages") each pipeline device runs, the train setting
/// virtual_stages (default 2); 1 for the other schedules. Between
/// kiln-pipeline-stages and the end of kiln-pipeline, kiln.stage numbers a
/// chunk, 0 .. pp x V - 1 (chunk c runs on device c mod pp); after it, a
/// device, as without interleaving.
int64_t virtualStages(mlir::ModuleOp module);

/// Whether tensor parallelism over `tp` devices splits the parameter whose
/// @forward argument has attributes `attrs` and type `type`: it carries a
/// `kiln.tp = {dim, outer}` hint, and for an embedding table (kiln.layer =
/// "embedding", vocabulary parallelism) tp divides its rows (otherwise the
/// table stays whole). kiln-train-step and kiln-tensor-parallel agree on it.
inline bool tpSplits(mlir::DictionaryAttr attrs, mlir::Type type, int64_t tp) {
  auto hint = attrs ? attrs.getAs<mlir::DictionaryAttr>("kiln.tp") : mlir::DictionaryAttr();
  if (!hint || tp <= 1)
    return false;
  auto layer = attrs.getAs<mlir::StringAttr>("kiln.layer");
  auto dim = hint.getAs<mlir::IntegerAttr>("dim");
  auto t = mlir::dyn_cast<mlir::RankedTensorType>(type);
  if (layer && layer.getValue() == "embedding")
    return dim && t && dim.getInt() < t.getRank() && t.getDimSize(dim.getInt()) % tp == 0;
  return true;
}

/// {split = [[...], ...], partial = [...]}
mlir::DictionaryAttr shardingToAttr(mlir::MLIRContext *ctx, const TensorSharding &s);
/// Parses the attribute form; on failure reports through `emitError`.
std::optional<TensorSharding>
shardingFromAttr(mlir::Attribute attr,
                 llvm::function_ref<mlir::InFlightDiagnostic()> emitError);
/// Checks `s` against a tensor type and mesh: one entry per dimension, every
/// axis a mesh axis used at most once, split dimensions divisible by the
/// product of their axes' sizes (for logical shapes; pass `logical = false`
/// for per-device shapes, which need no divisibility).
mlir::LogicalResult verifySharding(const TensorSharding &s, mlir::RankedTensorType type,
                                   const MeshShape &mesh, bool logical,
                                   llvm::function_ref<mlir::InFlightDiagnostic()> emitError);
/// "[[dp], []] partial [dp]" for messages.
std::string shardingToString(const TensorSharding &s);

/// The shardings of `op`'s results given its operands' (std::nullopt:
/// unknown, e.g. a value that differs per device without being a split,
/// such as the "replica" input), by the op's ShardingOpInterface. Returns
/// std::nullopt for an op without the interface (kiln.fusion) and when the
/// operands' shardings are not ones the op can take without resharding
/// (e.g. a nonlinear op of a partial sum).
std::optional<llvm::SmallVector<TensorSharding, 1>>
inferResultShardings(mlir::Operation *op,
                     llvm::ArrayRef<std::optional<TensorSharding>> operands);

/// Propagates shardings through `block` in order, from `known` (argument
/// shardings on entry; every value the table can infer on return).
void propagateShardings(mlir::Block &block,
                        llvm::DenseMap<mlir::Value, TensorSharding> &known);

} // namespace kiln

#endif // KILN_DIALECTS_KILN_SHARDING_H
