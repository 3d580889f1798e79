//===- Reduction.cpp - The reductions' and the contraction's rules ---------===//
//
// kiln.reduce_sum, reduce_mean, reduce_max and matmul: result types,
// gradients, sharding (a split reduced or contracted dimension becomes a
// partial sum), precision, row locality and cost.
//
//===----------------------------------------------------------------------===//
#include "dialects/kiln/ShapeRules.h"
#include "dialects/kiln/ops/Common.h"

using namespace mlir;
using namespace kiln;
using namespace kiln::ops;

//===----------------------------------------------------------------------===//
// Verifiers and folders
//===----------------------------------------------------------------------===//


#define KILN_REDUCE_INFER(OP)                                                  \
  LogicalResult OP::inferReturnTypes(MLIRContext *, Loc loc, Adaptor adaptor,  \
                                     SmallVectorImpl<Type> &types) {           \
    RankedTensorType in;                                                       \
    shape::Shape out;                                                          \
    if (failed(ranked(loc, adaptor.getOperand(), "operand", in)) ||            \
        failed(shape::reduce(loc, in.getShape(), adaptor.getAxes(),            \
                             adaptor.getKeepdims(), out)))                     \
      return failure();                                                        \
    types.push_back(in.clone(out));                                            \
    return success();                                                          \
  }
KILN_REDUCE_INFER(ReduceSumOp)
KILN_REDUCE_INFER(ReduceMeanOp)
KILN_REDUCE_INFER(ReduceMaxOp)
#undef KILN_REDUCE_INFER


LogicalResult MatmulOp::inferReturnTypes(MLIRContext *, Loc loc,
                                         Adaptor adaptor,
                                         SmallVectorImpl<Type> &types) {
  RankedTensorType lhs, rhs;
  shape::Shape out;
  if (failed(ranked(loc, adaptor.getLhs(), "lhs", lhs)) ||
      failed(ranked(loc, adaptor.getRhs(), "rhs", rhs)))
    return failure();
  if (lhs.getElementType() != rhs.getElementType())
    return emitOptionalError(loc, "operands have different element types (",
                             lhs.getElementType(), " and ",
                             rhs.getElementType(), "); cast one first");
  if (failed(shape::matmul(loc, lhs.getShape(), rhs.getShape(),
                           adaptor.getTransposeLhs(), adaptor.getTransposeRhs(),
                           out)))
    return failure();
  types.push_back(lhs.clone(out));
  return success();
}


//===----------------------------------------------------------------------===//
// Gradients
//===----------------------------------------------------------------------===//


// d reduce(x) = g broadcast back over the reduced axes (mean: divided by N;
// max: only where x equals the maximum)
template <typename OpT>
static Value broadcastBack(OpT op, G &h, Value g) {
  RankedTensorType in = op.getOperand().getType();
  if (op.getKeepdims())
    return h.expand(g, in);
  SmallVector<int64_t> dims;
  for (int64_t d = 0; d < in.getRank(); ++d)
    if (!llvm::is_contained(op.getAxes(), d))
      dims.push_back(d);
  return h.broadcast(g, in, dims);
}

LogicalResult ReduceSumOp::buildGradients(OpBuilder &b, ArrayRef<Value> grads,
                                          SmallVectorImpl<Value> &out) {
  G h{b, getLoc()};
  out.push_back(grads[0] ? broadcastBack(*this, h, grads[0]) : Value());
  return success();
}

LogicalResult ReduceMeanOp::buildGradients(OpBuilder &b, ArrayRef<Value> grads,
                                           SmallVectorImpl<Value> &out) {
  G h{b, getLoc()};
  if (!grads[0]) {
    out.push_back({});
    return success();
  }
  int64_t n = 1;
  for (int64_t a : getAxes())
    n *= getOperand().getType().getDimSize(a);
  out.push_back(h.scale(broadcastBack(*this, h, grads[0]), 1.0 / double(n)));
  return success();
}

LogicalResult ReduceMaxOp::buildGradients(OpBuilder &b, ArrayRef<Value> grads,
                                          SmallVectorImpl<Value> &out) {
  G h{b, getLoc()};
  if (!grads[0] || !isa<FloatType>(getType().getElementType())) {
    out.push_back({});
    return success();
  }
  Value gx = broadcastBack(*this, h, grads[0]);
  Value yx = broadcastBack(*this, h, getResult());
  Value isMax = h.cmp(CompareDirection::eq, getOperand(), yx);
  out.push_back(h.select(isMax, gx, h.zerosLike(gx)));
  return success();
}

// C = A' B' with A' = tl ? A^T : A, B' = tr ? B^T : B:
//   dA' = g B'^T,  dB' = A'^T g; an operand without batch dims gets the sum
//   over the batch (computed as one flattened GEMM when the layout allows).
LogicalResult MatmulOp::buildGradients(OpBuilder &b, ArrayRef<Value> grads,
                                       SmallVectorImpl<Value> &out) {
  G h{b, getLoc()};
  Value g = grads[0], A = getLhs(), B = getRhs();
  if (!g || !isa<FloatType>(getType().getElementType())) {
    out.append({Value(), Value()});
    return success();
  }
  bool tl = getTransposeLhs(), tr = getTransposeRhs();
  RankedTensorType ta = h.type(A), tb = h.type(B), tg = h.type(g);
  int64_t batchRank = tg.getRank() - 2;

  // Folds the batch dims of an operand in [batch..., R, C] layout into R.
  auto flatten = [&](Value v) {
    RankedTensorType t = h.type(v);
    int64_t rows = 1;
    for (int64_t d = 0; d < t.getRank() - 1; ++d)
      rows *= t.getDimSize(d);
    return h.reshape(v, t.clone({rows, t.getDimSize(t.getRank() - 1)}));
  };

  // dA
  Value dA = !tl ? h.matmul(g, B, false, !tr)
                 : (tr ? h.matmul(B, g, true, true) : h.matmul(B, g, false, true));
  if (h.type(dA).getRank() > ta.getRank())
    dA = h.sumLeading(dA, ta.getRank());

  // dB
  Value dB;
  if (tb.getRank() == 2 && batchRank > 0 && ta.getRank() > 2 && !tl) {
    // A is [batch..., M, K] and g is [batch..., M, N]: one GEMM over batch*M.
    Value a2 = flatten(A), g2 = flatten(g);
    dB = tr ? h.matmul(g2, a2, true, false) : h.matmul(a2, g2, true, false);
  } else if (!tr) {
    dB = tl ? h.matmul(A, g, false, false) : h.matmul(A, g, true, false);
  } else {
    dB = tl ? h.matmul(g, A, true, true) : h.matmul(g, A, true, false);
  }
  if (h.type(dB).getRank() > tb.getRank())
    dB = h.sumLeading(dB, tb.getRank());
  out.append({dA, dB});
  return success();
}

//===----------------------------------------------------------------------===//
// Sharding
//===----------------------------------------------------------------------===//

namespace {
using Result = ShardingResult;

/// Reductions: a split reduced dimension becomes a partial sum (reduce_sum,
/// reduce_mean: the mean of equal-sized blocks' means); max has no partial
/// form here.
Result reduceRule(Operation *op, ArrayRef<Opt> in) {
  if (!in[0])
    return std::nullopt;
  ArrayRef<int64_t> axes = op->getAttrOfType<DenseI64ArrayAttr>("axes").asArrayRef();
  bool keep = op->hasAttr("keepdims");
  TensorSharding out;
  out.partial = in[0]->partial;
  bool max = isa<ReduceMaxOp>(op);
  if (max && !out.partial.empty())
    return std::nullopt;
  for (auto [d, axesOfDim] : llvm::enumerate(in[0]->split)) {
    bool reduced = llvm::is_contained(axes, int64_t(d));
    if (!reduced) {
      out.split.push_back(axesOfDim);
      continue;
    }
    if (!axesOfDim.empty()) {
      if (max)
        return std::nullopt;
      out.partial.append(axesOfDim.begin(), axesOfDim.end());
    }
    if (keep)
      out.split.emplace_back();
  }
  llvm::sort(out.partial);
  return one(out);
}

/// lhs [b..., M, K] x rhs [b..., K, N]: a contraction dimension split over
/// the same axes on both sides gives a partial sum; batch, M and N splits
/// carry over. One partial operand (the other replicated) stays partial.
Result matmulRule(Operation *op, ArrayRef<Opt> in) {
  auto mm = cast<MatmulOp>(op);
  if (!in[0] || !in[1])
    return std::nullopt;
  int64_t lr = rankOf(mm.getLhs()), rr = rankOf(mm.getRhs()), r = rankOf(mm.getResult());
  auto L = in[0]->split, R = in[1]->split;
  // Row/column/contraction dimensions of each side.
  int64_t lm = mm.getTransposeLhs() ? lr - 1 : lr - 2, lk = mm.getTransposeLhs() ? lr - 2 : lr - 1;
  int64_t rk = mm.getTransposeRhs() ? rr - 1 : rr - 2, rn = mm.getTransposeRhs() ? rr - 2 : rr - 1;
  TensorSharding out = TensorSharding::replicated(r);
  if (L[lk] != R[rk])
    return std::nullopt;
  if (!in[0]->partial.empty() && !in[1]->partial.empty())
    return std::nullopt;
  out.partial = !in[0]->partial.empty() ? in[0]->partial : in[1]->partial;
  out.partial.append(L[lk].begin(), L[lk].end());
  llvm::sort(out.partial);
  // Batch dimensions, aligned on the right of the batch block.
  int64_t lb = lr - 2, rb = rr - 2, ob = r - 2;
  for (int64_t i = 0; i < ob; ++i) {
    int64_t li = i - (ob - lb), ri = i - (ob - rb);
    SmallVector<std::string, 1> s;
    if (li >= 0)
      s = L[li];
    if (ri >= 0 && !R[ri].empty()) {
      if (!s.empty() && s != R[ri])
        return std::nullopt;
      s = R[ri];
    }
    out.split[i] = s;
  }
  out.split[r - 2] = L[lm];
  out.split[r - 1] = R[rn];
  return one(out);
}
} // namespace

#define KILN_REDUCE_RULES(OP, POLICY)                                          \
  ShardingResult OP::inferResultShardings(ArrayRef<Opt> in) {                  \
    return reduceRule(getOperation(), in);                                     \
  }                                                                            \
  PrecisionPolicy OP::getPrecisionPolicy() { return POLICY; }                  \
  RowLocality OP::getRowLocality() {                                           \
    ArrayRef<int64_t> axes = getAxes();                                        \
    return firstRows(getOperation(), axes.empty() ? rankOf(getResult())        \
                                                  : *llvm::min_element(axes)); \
  }                                                                            \
  IndexUse OP::getIndexUse(unsigned) { return IndexUse::none(); }

KILN_REDUCE_RULES(ReduceSumOp, (PrecisionPolicy{PrecisionClass::Fp32, PrecisionRule::Reduction,
                                               PrecisionClass::Fp32, PrecisionRule::AutocastFp32}))
KILN_REDUCE_RULES(ReduceMeanOp, (PrecisionPolicy{PrecisionClass::Fp32, PrecisionRule::Reduction,
                                                PrecisionClass::Promote, PrecisionRule::None}))
KILN_REDUCE_RULES(ReduceMaxOp, (PrecisionPolicy{PrecisionClass::Follow, PrecisionRule::None,
                                               PrecisionClass::Promote, PrecisionRule::None}))
#undef KILN_REDUCE_RULES

// A GEMM reads whole operands: kiln-fuse gives it a library call.
ShardingResult MatmulOp::inferResultShardings(ArrayRef<Opt> in) {
  return matmulRule(getOperation(), in);
}
PrecisionPolicy MatmulOp::getPrecisionPolicy() {
  return {PrecisionClass::Low, PrecisionRule::Gemm, PrecisionClass::Low, PrecisionRule::AutocastLow};
}
RowLocality MatmulOp::getRowLocality() { return noRows(getOperation()); }
IndexUse MatmulOp::getIndexUse(unsigned) { return IndexUse::none(); }

//===----------------------------------------------------------------------===//
// Cost
//===----------------------------------------------------------------------===//

namespace {
int64_t elements(Value v) { return cast<ShapedType>(v.getType()).getNumElements(); }
} // namespace

// Reductions: per input element.
int64_t ReduceSumOp::estimateFlops() { return getFlopsPerElement() * elements(getOperand()); }
int64_t ReduceMeanOp::estimateFlops() { return getFlopsPerElement() * elements(getOperand()); }
int64_t ReduceMaxOp::estimateFlops() { return getFlopsPerElement() * elements(getOperand()); }

// Per result element and k: a multiply and an add for each of k products.
int64_t MatmulOp::estimateFlops() {
  auto lt = cast<RankedTensorType>(getLhs().getType());
  int64_t k = getTransposeLhs() ? lt.getDimSize(lt.getRank() - 2)
                                : lt.getDimSize(lt.getRank() - 1);
  return getFlopsPerElement() * elements(getResult()) * k;
}

