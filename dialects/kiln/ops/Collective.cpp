//===- Collective.cpp - The collectives' rules -----------------------------===//
//
// kiln.all_reduce, reduce_scatter, all_gather, transfer and
// collective_broadcast: verifiers (against the module's mesh), gradients
// (each collective's transpose), sharding, precision (they follow their
// input), row locality (none: a collective is a plan step of its own) and
// index uses (none).
//
//===----------------------------------------------------------------------===//
#include "dialects/kiln/ShapeRules.h"
#include "dialects/kiln/ops/Common.h"

using namespace mlir;
using namespace kiln;
using namespace kiln::ops;

//===----------------------------------------------------------------------===//
// Verifiers
//===----------------------------------------------------------------------===//


namespace {
/// The size of `axis` in the module's mesh, or an error naming the op.
FailureOr<int64_t> groupSize(Operation *op, StringRef axis) {
  int64_t n = meshAxisSize(op, axis);
  if (n < 1)
    return op->emitOpError() << "axis '" << axis
                             << "' is not an axis of the module's mesh (kiln.mesh)";
  return n;
}

/// Checks that `result` is `operand` with dim `dim` scaled: multiplied by
/// `n` (all_gather) or divided by it (reduce_scatter).
LogicalResult checkScaledDim(Operation *op, RankedTensorType operand,
                             RankedTensorType result, int64_t dim, int64_t n, bool gather) {
  if (operand.getElementType() != result.getElementType())
    return op->emitOpError() << "operand and result element types differ";
  if (dim < 0 || dim >= operand.getRank())
    return op->emitOpError() << "dim " << dim << " is out of range for rank "
                             << operand.getRank();
  SmallVector<int64_t> expected(operand.getShape());
  if (gather) {
    expected[dim] *= n;
  } else {
    if (expected[dim] % n != 0)
      return op->emitOpError() << "dim " << dim << " of size " << expected[dim]
                               << " does not split into " << n << " equal blocks";
    expected[dim] /= n;
  }
  if (ArrayRef<int64_t>(expected) != result.getShape())
    return op->emitOpError() << "result has shape " << shape::str(result.getShape())
                             << " but expected " << shape::str(expected);
  return success();
}
} // namespace

LogicalResult AllReduceOp::verify() { return groupSize(*this, getAxis()); }

LogicalResult ReduceScatterOp::verify() {
  FailureOr<int64_t> n = groupSize(*this, getAxis());
  if (failed(n))
    return failure();
  return checkScaledDim(*this, getOperand().getType(), getType(), getDim(), *n, false);
}

LogicalResult AllGatherOp::verify() {
  FailureOr<int64_t> n = groupSize(*this, getAxis());
  if (failed(n))
    return failure();
  return checkScaledDim(*this, getOperand().getType(), getType(), getDim(), *n, true);
}

LogicalResult TransferOp::verify() {
  FailureOr<int64_t> n = groupSize(*this, getAxis());
  if (failed(n))
    return failure();
  if (getFrom() < 0 || getFrom() >= *n || getTo() < 0 || getTo() >= *n)
    return emitOpError() << "moves from " << getFrom() << " to " << getTo()
                         << " but axis '" << getAxis() << "' has coordinates 0.."
                         << *n - 1;
  if (getFrom() == getTo())
    return emitOpError() << "moves a value from stage " << getFrom() << " to itself";
  return success();
}

LogicalResult CollectiveBroadcastOp::verify() {
  FailureOr<int64_t> n = groupSize(*this, getAxis());
  if (failed(n))
    return failure();
  if (getRoot() < 0 || getRoot() >= *n)
    return emitOpError() << "root " << getRoot() << " is not a coordinate of axis '"
                         << getAxis() << "' (0.." << *n - 1 << ")";
  return success();
}


//===----------------------------------------------------------------------===//
// Gradients
//===----------------------------------------------------------------------===//


//===----------------------------------------------------------------------===//
// Collectives. The convention (docs/parallel.md): a gradient is of the sum
// over the group of every device's loss, so a cotangent is a partial sum
// and each rule is the collective's transpose: all_reduce(sum) -> all_reduce
// (sum), all_reduce(mean) -> all_reduce(mean), all_gather <-> reduce_scatter
// (sum). max and min have no gradient here.
//===----------------------------------------------------------------------===//


LogicalResult AllReduceOp::buildGradients(OpBuilder &b, ArrayRef<Value> grads,
                                          SmallVectorImpl<Value> &out) {
  if (!grads[0]) {
    out.push_back({});
    return success();
  }
  if (getReduction() != CollectiveReduction::sum && getReduction() != CollectiveReduction::mean)
    return emitOpError() << "has no gradient for reduction '"
                         << stringifyCollectiveReduction(getReduction()) << "'";
  out.push_back(b.create<AllReduceOp>(getLoc(), grads[0], getAxis(), getReduction()));
  return success();
}

LogicalResult ReduceScatterOp::buildGradients(OpBuilder &b, ArrayRef<Value> grads,
                                              SmallVectorImpl<Value> &out) {
  if (!grads[0]) {
    out.push_back({});
    return success();
  }
  if (getReduction() != CollectiveReduction::sum)
    return emitOpError() << "has a gradient only for reduction 'sum'";
  out.push_back(b.create<AllGatherOp>(getLoc(), getOperand().getType(), grads[0], getAxis(),
                                      getDim()));
  return success();
}

LogicalResult AllGatherOp::buildGradients(OpBuilder &b, ArrayRef<Value> grads,
                                          SmallVectorImpl<Value> &out) {
  if (!grads[0]) {
    out.push_back({});
    return success();
  }
  out.push_back(b.create<ReduceScatterOp>(getLoc(), getOperand().getType(), grads[0],
                                          getAxis(), CollectiveReduction::sum, getDim()));
  return success();
}

//===----------------------------------------------------------------------===//
// Sharding
//===----------------------------------------------------------------------===//

namespace {
using Result = ShardingResult;

Result allReduceRule(Operation *op, ArrayRef<Opt> in) {
  if (!in[0])
    return std::nullopt;
  TensorSharding out = *in[0];
  StringRef axis = cast<AllReduceOp>(op).getAxis();
  llvm::erase(out.partial, axis.str());
  return one(out);
}

Result reduceScatterRule(Operation *op, ArrayRef<Opt> in) {
  auto rs = cast<ReduceScatterOp>(op);
  if (!in[0] || !in[0]->isPartial(rs.getAxis()))
    return std::nullopt;
  TensorSharding out = *in[0];
  llvm::erase(out.partial, rs.getAxis().str());
  out.split[rs.getDim()].push_back(rs.getAxis().str());
  return one(out);
}

Result allGatherRule(Operation *op, ArrayRef<Opt> in) {
  auto ag = cast<AllGatherOp>(op);
  if (!in[0])
    return std::nullopt;
  TensorSharding out = *in[0];
  auto &d = out.split[ag.getDim()];
  if (!d.empty() && d.back() == ag.getAxis())
    d.pop_back();
  return one(out);
}
} // namespace

ShardingResult AllReduceOp::inferResultShardings(ArrayRef<Opt> in) {
  return allReduceRule(getOperation(), in);
}
ShardingResult ReduceScatterOp::inferResultShardings(ArrayRef<Opt> in) {
  return reduceScatterRule(getOperation(), in);
}
ShardingResult AllGatherOp::inferResultShardings(ArrayRef<Opt> in) {
  return allGatherRule(getOperation(), in);
}
// Point-to-point moves between pipeline stages: no sharding to propagate.
ShardingResult TransferOp::inferResultShardings(ArrayRef<Opt>) { return std::nullopt; }
ShardingResult CollectiveBroadcastOp::inferResultShardings(ArrayRef<Opt>) {
  return std::nullopt;
}

#define KILN_COLLECTIVE_RULES(OP)                                              \
  PrecisionPolicy OP::getPrecisionPolicy() { return precision::kFollow; }      \
  RowLocality OP::getRowLocality() { return noRows(getOperation()); }          \
  IndexUse OP::getIndexUse(unsigned) { return IndexUse::none(); }
KILN_COLLECTIVE_RULES(AllReduceOp)
KILN_COLLECTIVE_RULES(ReduceScatterOp)
KILN_COLLECTIVE_RULES(AllGatherOp)
KILN_COLLECTIVE_RULES(TransferOp)
KILN_COLLECTIVE_RULES(CollectiveBroadcastOp)
#undef KILN_COLLECTIVE_RULES
