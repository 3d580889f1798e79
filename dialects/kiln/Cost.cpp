//===- Cost.cpp - FLOP estimates that count another element ---------------===//
//
// CostOpInterface's estimateFlops for the ops whose flops are not per result
// element (KilnOps.td declares each op's flops per element once; the
// interface's default multiplies them by the result's elements).
//
//===----------------------------------------------------------------------===//
#include "dialects/kiln/KilnOps.h"

using namespace mlir;

namespace kiln {

namespace {
int64_t elements(Value v) { return cast<ShapedType>(v.getType()).getNumElements(); }
} // namespace

// Reductions: per input element.
int64_t ReduceSumOp::estimateFlops() { return getFlopsPerElement() * elements(getOperand()); }
int64_t ReduceMeanOp::estimateFlops() { return getFlopsPerElement() * elements(getOperand()); }
int64_t ReduceMaxOp::estimateFlops() { return getFlopsPerElement() * elements(getOperand()); }

// Per logit.
int64_t CrossEntropyOp::estimateFlops() {
  return getFlopsPerElement() * elements(getLogits());
}

// Per result element and k: a multiply and an add for each of k products.
int64_t MatmulOp::estimateFlops() {
  auto lt = cast<RankedTensorType>(getLhs().getType());
  int64_t k = getTransposeLhs() ? lt.getDimSize(lt.getRank() - 2)
                                : lt.getDimSize(lt.getRank() - 1);
  return getFlopsPerElement() * elements(getResult()) * k;
}

} // namespace kiln
