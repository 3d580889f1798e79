//===- Common.cpp - Rule pieces shared by the op families -----------------===//
#include "dialects/kiln/ops/Common.h"

namespace kiln::ops {

int64_t rankOf(Value v) { return cast<RankedTensorType>(v.getType()).getRank(); }

ShardingResult one(TensorSharding s) { return SmallVector<TensorSharding, 1>{std::move(s)}; }

ShardingResult replicatedShardings(Operation *op) {
  SmallVector<TensorSharding, 1> out;
  for (Value r : op->getResults())
    out.push_back(TensorSharding::replicated(rankOf(r)));
  return out;
}

RowLocality firstRows(Operation *op, int64_t rows) {
  RowLocality info;
  info.maxRows = rows;
  info.rowShaped.assign(op->getNumOperands(), true);
  return info;
}

RowLocality noRows(Operation *op) { return firstRows(op, 0); }

RowLocality allRows(Operation *op) {
  if (op->getNumResults() != 1)
    return noRows(op);
  return firstRows(op, rankOf(op->getResult(0)));
}

} // namespace kiln::ops
