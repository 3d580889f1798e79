//===- TensorParallelVocab.cpp - Vocabulary-parallel rewrites ------------===//
//
// kiln-tensor-parallel's rewrites of ops on a value split over its
// vocabulary or class axis (Megatron's vocab-parallel embedding and loss):
// gather and scatter_add of a table split on its rows, softmax and
// cross_entropy over a split last axis, and the whole of a split value
// (wholeOf: an all-gather).
//
//===----------------------------------------------------------------------===//
#include "passes/parallel/TensorParallelRewriter.h"

namespace kiln::tp {


std::pair<Value, Value> Rewriter::localIndices(Value idx, int64_t size, Location l) {
  auto it = localIndices_.find(idx);
  if (it != localIndices_.end())
    return it->second;
  RankedTensorType t = tensorTypeOf(idx);
  int64_t local = size / n_;
  Value rel = b_.create<SubOp>(l, idx, bcast(l, offsetOf(l, size, t.getElementType()), t));
  Value zero = splat(l, t, 0), limit = splat(l, t, double(local));
  Value ge = b_.create<CompareOp>(l, CompareDirection::ge, rel, zero);
  Value lt = b_.create<CompareOp>(l, CompareDirection::lt, rel, limit);
  auto b1 = RankedTensorType::get(t.getShape(), b_.getI1Type());
  Value in = b_.create<SelectOp>(l, ge, lt, splat(l, b1, 0));
  Value clamped = b_.create<SelectOp>(l, in, rel, zero);
  localIndices_[idx] = {clamped, in};
  return {clamped, in};
}

/// gather of rows of a table split on its rows: each device looks up the
/// indices in its own rows (others clamped to row 0 and zeroed), so the
/// result is a partial sum over tp (Megatron's vocabulary-parallel
/// embedding; the all-reduce comes where a whole value is first needed).
LogicalResult Rewriter::vocabGather(GatherOp g) {
  Location l = g.getLoc();
  if (g.getAxis() != 0 || of(g.getIndices()).split() || of(g.getIndices()).partial)
    return g.emitError() << "kiln-tensor-parallel: gather at " << locString(l)
                         << " of a table split over tp on another axis than its rows";
  int64_t rows = tensorTypeOf(g.getOperand()).getDimSize(0);
  auto [clamped, in] = localIndices(g.getIndices(), rows, l);
  g.getIndicesMutable().assign(clamped);
  RankedTensorType rt = tensorTypeOf(g.getResult());
  b_.setInsertionPointAfter(g);
  auto mt = RankedTensorType::get(rt.getShape(), b_.getI1Type());
  SmallVector<int64_t> dims;
  for (int64_t i = 0; i < tensorTypeOf(in).getRank(); ++i)
    dims.push_back(i);
  Value mask = b_.create<BroadcastInDimOp>(l, mt, in, b_.getDenseI64ArrayAttr(dims));
  auto sel = b_.create<SelectOp>(l, mask, g.getResult(), splat(l, rt, 0));
  g.getResult().replaceAllUsesExcept(sel.getResult(), sel.getOperation());
  tp_[g.getResult()] = Tp();
  tp_[sel.getResult()] = Tp{-1, 1, true};
  return success();
}

/// scatter_add into a table split on its rows (the embedding's gradient):
/// each device adds the updates of its own rows, locally.
std::optional<LogicalResult> Rewriter::vocabScatter(ScatterAddOp sa) {
  if (sa.getAxis() != 0 || of(sa.getUpdates()).split() || of(sa.getIndices()).split())
    return std::nullopt;
  // The gradient of a lookup in a vocabulary-split table: the same indices
  // gathered from a split table of this type.
  RankedTensorType rt = tensorTypeOf(sa.getResult());
  bool vocab = false;
  for (auto &[idx, loc] : localIndices_)
    (void)loc, vocab |= idx == sa.getIndices();
  if (!vocab)
    return std::nullopt;
  Tp table;
  for (BlockArgument a : f_.getArguments())
    if (of(a).split() && of(a).dim == 0 && tensorTypeOf(a).getShape() == rt.getShape())
      table = of(a);
  if (!table.split())
    return std::nullopt;
  Location l = sa.getLoc();
  if (of(sa.getUpdates()).partial)
    sa.getUpdatesMutable().assign(allReduce(sa.getUpdates(), l, sa));
  auto [clamped, in] = localIndices(sa.getIndices(), rt.getDimSize(0), l);
  RankedTensorType ut = tensorTypeOf(sa.getUpdates());
  auto mt = RankedTensorType::get(ut.getShape(), b_.getI1Type());
  SmallVector<int64_t> dims;
  for (int64_t i = 0; i < tensorTypeOf(in).getRank(); ++i)
    dims.push_back(i);
  Value mask = b_.create<BroadcastInDimOp>(l, mt, in, b_.getDenseI64ArrayAttr(dims));
  Value upd = b_.create<SelectOp>(l, mask, sa.getUpdates(), splat(l, ut, 0));
  sa.getUpdatesMutable().assign(upd);
  sa.getIndicesMutable().assign(clamped);
  tp_[sa.getResult()] = Tp{0, 1, false};
  if (failed(localType(rt, tp_[sa.getResult()], l)))
    return LogicalResult(failure());
  return LogicalResult(success());
}

/// softmax over a split last axis: the row maximum and the sum of
/// exponentials all-reduced over tp (max, then sum).
LogicalResult Rewriter::splitSoftmax(SoftmaxOp sm) {
  Location l = sm.getLoc();
  Value x = sm.getOperand();
  if (of(x).partial || of(x).outer != 1)
    return sm.emitError() << "kiln-tensor-parallel: softmax at " << locString(l)
                          << " of a partial or q/k/v-split value";
  RankedTensorType t = tensorTypeOf(x);
  int64_t a = int64_t(sm.getAxis());
  SmallVector<int64_t> rowShape(t.getShape()), dims;
  rowShape[size_t(a)] = 1;
  for (int64_t i = 0; i < t.getRank(); ++i)
    dims.push_back(i);
  auto rowT = RankedTensorType::get(rowShape, t.getElementType());
  auto axes = b_.getDenseI64ArrayAttr({a});
  Value mLocal = b_.create<ReduceMaxOp>(l, rowT, x, axes, b_.getUnitAttr());
  Value m = allReduceWith(l, mLocal, CollectiveReduction::max,
                          "softmax over the vocabulary split: the row maximum");
  Value e = b_.create<ExpOp>(l, b_.create<SubOp>(l, x, b_.create<BroadcastInDimOp>(
                                                         l, t, m, b_.getDenseI64ArrayAttr(dims))));
  Value sLocal = b_.create<ReduceSumOp>(l, rowT, e, axes, b_.getUnitAttr());
  Value s = allReduceWith(l, sLocal, CollectiveReduction::sum,
                          "softmax over the vocabulary split: the sum of exponentials");
  Value p = b_.create<DivOp>(l, e, b_.create<BroadcastInDimOp>(l, t, s,
                                                               b_.getDenseI64ArrayAttr(dims)));
  for (Value v : {e, p})
    tp_[v] = of(x);
  tp_[e.getDefiningOp()->getOperand(0)] = of(x);
  tp_[e.getDefiningOp()->getOperand(0).getDefiningOp()->getOperand(1)] = of(x);
  tp_[p.getDefiningOp()->getOperand(1)] = of(x);
  sm.getResult().replaceAllUsesWith(p);
  sm.erase();
  return success();
}

/// cross_entropy of logits split on the vocabulary (Megatron's
/// vocabulary-parallel cross-entropy): logsumexp from an all-reduced row
/// maximum and sum of exponentials, the target's logit from the device that
/// holds it (a partial sum), then the reduction.
LogicalResult Rewriter::vocabCrossEntropy(CrossEntropyOp ce) {
  Location l = ce.getLoc();
  Value x = ce.getLogits(), y = ce.getTargets();
  if (of(x).partial || of(x).outer != 1 || of(y).split() || of(y).partial)
    return ce.emitError() << "kiln-tensor-parallel: cross_entropy at " << locString(l)
                          << " of partial logits or split targets";
  RankedTensorType t = tensorTypeOf(x), yt = tensorTypeOf(y);
  int64_t a = t.getRank() - 1, classes = t.getDimSize(a);
  SmallVector<int64_t> rowShape(t.getShape()), dims, ydims;
  rowShape[size_t(a)] = 1;
  for (int64_t i = 0; i < t.getRank(); ++i)
    dims.push_back(i);
  for (int64_t i = 0; i < yt.getRank(); ++i)
    ydims.push_back(i);
  auto rowT = RankedTensorType::get(rowShape, t.getElementType());
  auto axes = b_.getDenseI64ArrayAttr({a});
  auto bc = [&](Value v, RankedTensorType to, ArrayRef<int64_t> d) {
    return b_.create<BroadcastInDimOp>(l, to, v, b_.getDenseI64ArrayAttr(d)).getResult();
  };
  Tp split = of(x);
  Value m = allReduceWith(l, b_.create<ReduceMaxOp>(l, rowT, x, axes, b_.getUnitAttr()),
                          CollectiveReduction::max,
                          "cross-entropy over the vocabulary split: the row maximum");
  Value shifted = b_.create<SubOp>(l, x, bc(m, t, dims));
  Value e = b_.create<ExpOp>(l, shifted);
  tp_[shifted] = split;
  tp_[shifted.getDefiningOp()->getOperand(1)] = split;
  tp_[e] = split;
  Value s = allReduceWith(l, b_.create<ReduceSumOp>(l, rowT, e, axes, b_.getUnitAttr()),
                          CollectiveReduction::sum,
                          "cross-entropy over the vocabulary split: the sum of exponentials");
  Value lse = b_.create<AddOp>(l, b_.create<LogOp>(l, s), m);
  // The target's logit: this device's classes are [rank * C/T, (rank+1) * C/T).
  auto it = RankedTensorType::get(t.getShape(), yt.getElementType());
  Value iota = b_.create<IotaOp>(l, it, b_.getI64IntegerAttr(a));
  Value cls = b_.create<AddOp>(l, iota, bcast(l, offsetOf(l, classes, yt.getElementType()), it));
  Value eq = b_.create<CompareOp>(l, CompareDirection::eq, cls, bc(y, it, ydims));
  Value picked = b_.create<SelectOp>(l, eq, x, splat(l, t, 0));
  for (Value v : {iota, cls, eq, picked})
    tp_[v] = split;
  tp_[cls.getDefiningOp()->getOperand(1)] = split;
  tp_[eq.getDefiningOp()->getOperand(1)] = split;
  tp_[picked.getDefiningOp()->getOperand(2)] = split;
  Value tgt = allReduceWith(l, b_.create<ReduceSumOp>(l, rowT, picked, axes, b_.getUnitAttr()),
                            CollectiveReduction::sum,
                            "cross-entropy over the vocabulary split: the target's logit");
  Value per = b_.create<SubOp>(l, lse, tgt); // [..., 1]
  auto perT = RankedTensorType::get(yt.getShape(), t.getElementType());
  Value perRow = b_.create<ReshapeOp>(l, perT, per);
  Value out;
  auto all = b_.getDenseI64ArrayAttr(ydims);
  auto scalar = RankedTensorType::get({}, t.getElementType());
  switch (ce.getReduction()) {
  case LossReduction::mean:
    out = b_.create<ReduceMeanOp>(l, scalar, perRow, all, UnitAttr());
    break;
  case LossReduction::sum:
    out = b_.create<ReduceSumOp>(l, scalar, perRow, all, UnitAttr());
    break;
  case LossReduction::none:
    out = perRow;
    break;
  }
  ce.getResult().replaceAllUsesWith(out);
  ce.erase();
  return success();
}

/// A value split over tp made whole: all-gathered along its split
/// dimension (moved first and back, the plan gathering dimension 0).
Value Rewriter::wholeOf(Value v, Location l, const std::string &why) {
  Tp t = of(v);
  RankedTensorType type = tensorTypeOf(v);
  SmallVector<int64_t> perm, inv(size_t(type.getRank())), shape;
  perm.push_back(t.dim);
  for (int64_t i = 0; i < type.getRank(); ++i)
    if (i != t.dim)
      perm.push_back(i);
  for (auto [i, p] : llvm::enumerate(perm)) {
    inv[size_t(p)] = int64_t(i);
    shape.push_back(type.getDimSize(p));
  }
  auto moved = RankedTensorType::get(shape, type.getElementType());
  Value front = b_.create<TransposeOp>(l, moved, v, b_.getDenseI64ArrayAttr(perm));
  tp_[front] = Tp{0, 1, false};
  ++collectives_;
  Value whole = b_.create<AllGatherOp>(
      NameLoc::get(b_.getStringAttr("tp: " + why), l), moved, front,
      b_.getStringAttr(kAxis), b_.getI64IntegerAttr(0));
  tp_[whole] = Tp();
  Value back = b_.create<TransposeOp>(l, type, whole, b_.getDenseI64ArrayAttr(inv));
  tp_[back] = Tp();
  return back;
}

} // namespace kiln::tp
