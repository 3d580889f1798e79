//===- Indexing.cpp - The index ops' rules ---------------------------------===//
//
// kiln.iota, gather, scatter_add and random (functions of an element's
// index): verifiers, gradients, sharding, precision, row locality and the
// ranges their integer index operands must lie in.
//
//===----------------------------------------------------------------------===//
#include "dialects/kiln/ShapeRules.h"
#include "dialects/kiln/ops/Common.h"

#include <fmt/format.h>

using namespace mlir;
using namespace kiln;
using namespace kiln::ops;

//===----------------------------------------------------------------------===//
// Verifiers
//===----------------------------------------------------------------------===//

LogicalResult IotaOp::verify() {
  return shape::axis(getLoc(), getType().getRank(), getDim(), "dim");
}

LogicalResult GatherOp::inferReturnTypes(MLIRContext *, Loc loc,
                                         Adaptor adaptor,
                                         SmallVectorImpl<Type> &types) {
  RankedTensorType in, idx;
  shape::Shape out;
  if (failed(ranked(loc, adaptor.getOperand(), "operand", in)) ||
      failed(ranked(loc, adaptor.getIndices(), "indices", idx)) ||
      failed(shape::gather(loc, in.getShape(), idx.getShape(),
                           adaptor.getAxis(), out)))
    return failure();
  types.push_back(in.clone(out));
  return success();
}

LogicalResult ScatterAddOp::verify() {
  auto upd = getUpdates().getType();
  auto idx = getIndices().getType();
  auto res = getType();
  if (upd.getElementType() != res.getElementType())
    return emitOpError() << "updates and result element types differ";
  shape::Shape expected;
  if (failed(shape::gather(getLoc(), res.getShape(), idx.getShape(),
                           getAxis(), expected)))
    return failure();
  if (ArrayRef<int64_t>(expected) != upd.getShape())
    return emitOpError() << "updates have shape " << shape::str(upd.getShape())
                         << " but gathering " << shape::str(idx.getShape())
                         << " indices from " << shape::str(res.getShape())
                         << " along axis " << getAxis() << " gives "
                         << shape::str(expected);
  return success();
}


//===----------------------------------------------------------------------===//
// Gradients
//===----------------------------------------------------------------------===//


// d gather(table, idx) = scatter_add(g, idx) into the table's shape
LogicalResult GatherOp::buildGradients(OpBuilder &b, ArrayRef<Value> grads,
                                       SmallVectorImpl<Value> &out) {
  if (!grads[0] || !isa<FloatType>(getType().getElementType())) {
    out.append({Value(), Value()});
    return success();
  }
  out.push_back(b.create<ScatterAddOp>(getLoc(), getOperand().getType(),
                                       grads[0], getIndices(), getAxis()));
  out.push_back({});
  return success();
}

// d scatter_add(u, idx) = gather(g, idx)
LogicalResult ScatterAddOp::buildGradients(OpBuilder &b, ArrayRef<Value> grads,
                                           SmallVectorImpl<Value> &out) {
  if (!grads[0]) {
    out.append({Value(), Value()});
    return success();
  }
  out.push_back(b.create<GatherOp>(getLoc(), getUpdates().getType(), grads[0],
                                   getIndices(), getAxis()));
  out.push_back({});
  return success();
}

//===----------------------------------------------------------------------===//
// Sharding
//===----------------------------------------------------------------------===//

namespace {
using Result = ShardingResult;

/// gather: a replicated table read at split indices gives rows split like
/// the indices (an embedding lookup of a split batch).
Result gatherRule(Operation *op, ArrayRef<Opt> in) {
  auto g = cast<GatherOp>(op);
  if (!in[0] || !in[1] || !in[0]->isReplicated() || !in[1]->partial.empty())
    return std::nullopt;
  TensorSharding out = TensorSharding::replicated(rankOf(g.getResult()));
  for (auto [i, s] : llvm::enumerate(in[1]->split))
    out.split[g.getAxis() + i] = s;
  return one(out);
}

/// scatter_add (the gradient of gather): updates and indices split over an
/// axis sum into a partial over it.
Result scatterAddRule(Operation *op, ArrayRef<Opt> in) {
  auto s = cast<ScatterAddOp>(op);
  if (!in[0] || !in[1] || !in[0]->partial.empty())
    return std::nullopt;
  TensorSharding out = TensorSharding::replicated(rankOf(s.getResult()));
  int64_t n = rankOf(s.getIndices()), ax = int64_t(s.getAxis());
  for (auto [i, axes] : llvm::enumerate(in[0]->split)) {
    bool indexDim = int64_t(i) >= ax && int64_t(i) < ax + n;
    if (!indexDim) {
      int64_t o = int64_t(i) < ax ? int64_t(i) : int64_t(i) - n + 1;
      out.split[o] = axes;
    } else {
      out.partial.append(axes.begin(), axes.end());
    }
  }
  llvm::sort(out.partial);
  return one(out);
}

/// The size of `v` along `axis`, or 0 for a scalar.
int64_t extent(Value v, int64_t axis) {
  auto t = cast<RankedTensorType>(v.getType());
  return t.getRank() == 0 ? 0 : t.getDimSize(axis);
}
} // namespace

ShardingResult GatherOp::inferResultShardings(ArrayRef<Opt> in) {
  return gatherRule(getOperation(), in);
}
ShardingResult ScatterAddOp::inferResultShardings(ArrayRef<Opt> in) {
  return scatterAddRule(getOperation(), in);
}
ShardingResult IotaOp::inferResultShardings(ArrayRef<Opt>) {
  return replicatedShardings(getOperation());
}
// The draws' seed mixes in the replica where dropout asks for it: unknown.
ShardingResult RandomOp::inferResultShardings(ArrayRef<Opt>) { return std::nullopt; }

//===----------------------------------------------------------------------===//
// Precision
//===----------------------------------------------------------------------===//

PrecisionPolicy IotaOp::getPrecisionPolicy() { return precision::kFollow; }
PrecisionPolicy GatherOp::getPrecisionPolicy() { return precision::kFollow; }
PrecisionPolicy RandomOp::getPrecisionPolicy() { return precision::kFollow; }
// Sums of many updates accumulate in fp32.
PrecisionPolicy ScatterAddOp::getPrecisionPolicy() {
  return {PrecisionClass::Fp32, PrecisionRule::Accumulate, PrecisionClass::Fp32,
          PrecisionRule::Accumulate};
}

//===----------------------------------------------------------------------===//
// Row locality
//===----------------------------------------------------------------------===//

// A function of the element's index: row-local everywhere, its operands
// (random's seed) read whole.
RowLocality IotaOp::getRowLocality() { return firstRows(getOperation(), rankOf(getResult())); }
RowLocality RandomOp::getRowLocality() {
  RowLocality info = firstRows(getOperation(), rankOf(getResult()));
  info.rowShaped.assign(info.rowShaped.size(), false);
  return info;
}

// Along axis 0 the result's rows are the indices' rows and the table is read
// whole; along a later axis the rows before it are the table's.
RowLocality GatherOp::getRowLocality() {
  RowLocality info = noRows(getOperation());
  if (getAxis() == 0) {
    info.maxRows = rankOf(getIndices());
    info.rowShaped[0] = false;
  } else {
    info.maxRows = getAxis();
    info.rowShaped[1] = false;
  }
  return info;
}

RowLocality ScatterAddOp::getRowLocality() { return noRows(getOperation()); }

//===----------------------------------------------------------------------===//
// Index uses
//===----------------------------------------------------------------------===//

IndexUse GatherOp::getIndexUse(unsigned operand) {
  if (operand != 1)
    return IndexUse::none();
  int64_t hi = extent(getOperand(), getAxis());
  return IndexUse::bounded(hi, fmt::format("kiln.gather indices (a table of {} rows)", hi));
}

IndexUse ScatterAddOp::getIndexUse(unsigned operand) {
  if (operand != 1)
    return IndexUse::none();
  int64_t hi = extent(getResult(), getAxis());
  return IndexUse::bounded(hi, fmt::format("kiln.scatter_add indices (a table of {} rows)", hi));
}

IndexUse IotaOp::getIndexUse(unsigned) { return IndexUse::none(); }
IndexUse RandomOp::getIndexUse(unsigned) { return IndexUse::none(); }
