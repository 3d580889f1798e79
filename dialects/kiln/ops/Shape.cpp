//===- Shape.cpp - The data-movement ops' rules ----------------------------===//
//
// kiln.broadcast_in_dim, reshape, transpose, slice, concat, pad and
// optimization_barrier: verifiers and folders, gradients, sharding,
// precision (they follow their input), row locality and index uses (an
// index moved by them keeps its range).
//
//===----------------------------------------------------------------------===//
#include "dialects/kiln/ShapeRules.h"
#include "dialects/kiln/ops/Common.h"

#include "mlir/IR/Matchers.h"
#include "mlir/IR/PatternMatch.h"

using namespace mlir;
using namespace kiln;
using namespace kiln::ops;

//===----------------------------------------------------------------------===//
// Verifiers and folders
//===----------------------------------------------------------------------===//


LogicalResult BroadcastInDimOp::verify() {
  if (getOperand().getType().getElementType() != getType().getElementType())
    return emitOpError() << "changes the element type from "
                         << getOperand().getType().getElementType() << " to "
                         << getType().getElementType();
  return shape::broadcastInDim(getLoc(), getOperand().getType().getShape(),
                               getDims(), getType().getShape());
}

// broadcast(splat) => splat; broadcast(x : T -> T) => x
OpFoldResult BroadcastInDimOp::fold(FoldAdaptor adaptor) {
  if (getOperand().getType() == getType())
    return getOperand();
  return reshapeSplat(adaptor.getOperand(), getType());
}

namespace {
// broadcast(broadcast(x, d1), d2) => broadcast(x, d2[d1[i]])
struct ComposeBroadcasts : OpRewritePattern<BroadcastInDimOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(BroadcastInDimOp op,
                                PatternRewriter &rewriter) const override {
    auto inner = op.getOperand().getDefiningOp<BroadcastInDimOp>();
    if (!inner)
      return rewriter.notifyMatchFailure(op, "operand is not a broadcast");
    SmallVector<int64_t> dims;
    for (int64_t d : inner.getDims())
      dims.push_back(op.getDims()[d]);
    rewriter.replaceOpWithNewOp<BroadcastInDimOp>(op, op.getType(),
                                                  inner.getOperand(), dims);
    return success();
  }
};
} // namespace

void BroadcastInDimOp::getCanonicalizationPatterns(RewritePatternSet &results,
                                                   MLIRContext *ctx) {
  results.add<ComposeBroadcasts>(ctx);
}


LogicalResult ReshapeOp::verify() {
  auto in = getOperand().getType();
  if (in.getElementType() != getType().getElementType())
    return emitOpError() << "changes the element type from "
                         << in.getElementType() << " to "
                         << getType().getElementType();
  int64_t a = 0, b = 0;
  if (!shape::numElements(in.getShape(), a) ||
      !shape::numElements(getType().getShape(), b))
    return emitOpError() << "has a shape whose element count overflows";
  if (a != b)
    return emitOpError() << "cannot reshape " << shape::str(in.getShape())
                         << " (" << a << " elements) to "
                         << shape::str(getType().getShape()) << " (" << b
                         << " elements)";
  return success();
}

// reshape(x : T -> T) => x; reshape(splat) => splat
OpFoldResult ReshapeOp::fold(FoldAdaptor adaptor) {
  if (getOperand().getType() == getType())
    return getOperand();
  return reshapeSplat(adaptor.getOperand(), getType());
}

namespace {
// reshape(reshape(x)) => reshape(x)
struct ComposeReshapes : OpRewritePattern<ReshapeOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(ReshapeOp op,
                                PatternRewriter &rewriter) const override {
    auto inner = op.getOperand().getDefiningOp<ReshapeOp>();
    if (!inner)
      return rewriter.notifyMatchFailure(op, "operand is not a reshape");
    rewriter.replaceOpWithNewOp<ReshapeOp>(op, op.getType(),
                                           inner.getOperand());
    return success();
  }
};
} // namespace

void ReshapeOp::getCanonicalizationPatterns(RewritePatternSet &results,
                                            MLIRContext *ctx) {
  results.add<ComposeReshapes>(ctx);
}

//===----------------------------------------------------------------------===//
// TransposeOp
//===----------------------------------------------------------------------===//

LogicalResult TransposeOp::inferReturnTypes(MLIRContext *, Loc loc,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &types) {
  RankedTensorType in;
  shape::Shape out;
  if (failed(ranked(loc, adaptor.getOperand(), "operand", in)) ||
      failed(shape::transpose(loc, in.getShape(), adaptor.getPermutation(),
                              out)))
    return failure();
  types.push_back(in.clone(out));
  return success();
}

// transpose(x, identity) => x; transpose(splat) => splat
OpFoldResult TransposeOp::fold(FoldAdaptor adaptor) {
  bool identity = true;
  for (auto [i, p] : llvm::enumerate(getPermutation()))
    identity &= static_cast<int64_t>(i) == p;
  if (identity)
    return getOperand();
  return reshapeSplat(adaptor.getOperand(), getType());
}

namespace {
// transpose(transpose(x, p1), p2) => transpose(x, p1[p2[i]])
struct ComposeTransposes : OpRewritePattern<TransposeOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(TransposeOp op,
                                PatternRewriter &rewriter) const override {
    auto inner = op.getOperand().getDefiningOp<TransposeOp>();
    if (!inner)
      return rewriter.notifyMatchFailure(op, "operand is not a transpose");
    SmallVector<int64_t> perm;
    for (int64_t p : op.getPermutation())
      perm.push_back(inner.getPermutation()[p]);
    rewriter.replaceOpWithNewOp<TransposeOp>(op, inner.getOperand(), perm);
    return success();
  }
};
} // namespace

void TransposeOp::getCanonicalizationPatterns(RewritePatternSet &results,
                                              MLIRContext *ctx) {
  results.add<ComposeTransposes>(ctx);
}

//===----------------------------------------------------------------------===//
// SliceOp / ConcatOp / GatherOp
//===----------------------------------------------------------------------===//

LogicalResult SliceOp::inferReturnTypes(MLIRContext *, Loc loc,
                                        Adaptor adaptor,
                                        SmallVectorImpl<Type> &types) {
  RankedTensorType in;
  shape::Shape out;
  if (failed(ranked(loc, adaptor.getOperand(), "operand", in)) ||
      failed(shape::slice(loc, in.getShape(), adaptor.getStart(),
                          adaptor.getLimit(), adaptor.getStride(), out)))
    return failure();
  types.push_back(in.clone(out));
  return success();
}

// slice(x) taking everything => x
OpFoldResult SliceOp::fold(FoldAdaptor adaptor) {
  if (getOperand().getType() == getType())
    return getOperand();
  return reshapeSplat(adaptor.getOperand(), getType());
}

LogicalResult ConcatOp::inferReturnTypes(MLIRContext *, Loc loc,
                                         Adaptor adaptor,
                                         SmallVectorImpl<Type> &types) {
  SmallVector<SmallVector<int64_t>> shapes;
  Type elementType;
  for (Value v : adaptor.getInputs()) {
    RankedTensorType t;
    if (failed(ranked(loc, v, "input", t)))
      return failure();
    if (elementType && t.getElementType() != elementType)
      return emitOptionalError(loc, "inputs have different element types (",
                               elementType, " and ", t.getElementType(), ")");
    elementType = t.getElementType();
    shapes.emplace_back(t.getShape());
  }
  shape::Shape out;
  if (failed(shape::concat(loc, shapes, adaptor.getDim(), out)))
    return failure();
  types.push_back(RankedTensorType::get(out, elementType));
  return success();
}

// pad(x) with no padding at all => x
OpFoldResult PadOp::fold(FoldAdaptor) {
  auto none = [](ArrayRef<int64_t> a) { return llvm::all_of(a, [](int64_t v) { return v == 0; }); };
  if (none(getLow()) && none(getHigh()) && none(getInterior()) &&
      getOperand().getType() == getType())
    return getOperand();
  return {};
}

// concat(x) => x
OpFoldResult ConcatOp::fold(FoldAdaptor) {
  if (getInputs().size() == 1)
    return getInputs().front();
  return {};
}

LogicalResult PadOp::inferReturnTypes(MLIRContext *, Loc loc, Adaptor adaptor,
                                      SmallVectorImpl<Type> &types) {
  RankedTensorType in;
  if (failed(ranked(loc, adaptor.getOperand(), "operand", in)))
    return failure();
  ArrayRef<int64_t> low = adaptor.getLow(), high = adaptor.getHigh(),
                    interior = adaptor.getInterior();
  size_t rank = in.getRank();
  if (low.size() != rank || high.size() != rank || interior.size() != rank)
    return emitOptionalError(loc, "low, high and interior need ", rank,
                             " entries each (the operand's rank)");
  SmallVector<int64_t> out;
  for (size_t d = 0; d < rank; ++d) {
    if (low[d] < 0 || high[d] < 0 || interior[d] < 0)
      return emitOptionalError(loc, "padding amounts must be >= 0 (dim ", d,
                               ")");
    int64_t n = in.getDimSize(d);
    out.push_back(low[d] + n + (n - 1) * interior[d] + high[d]);
  }
  types.push_back(in.clone(out));
  return success();
}


//===----------------------------------------------------------------------===//
// Gradients
//===----------------------------------------------------------------------===//


// d broadcast(x) = sum of g over the broadcast dims, reshaped to x
LogicalResult BroadcastInDimOp::buildGradients(OpBuilder &b,
                                               ArrayRef<Value> grads,
                                               SmallVectorImpl<Value> &out) {
  G h{b, getLoc()};
  Value g = grads[0];
  if (!g) {
    out.push_back({});
    return success();
  }
  RankedTensorType in = getOperand().getType(), res = getType();
  SmallVector<int64_t> axes;
  for (int64_t d = 0; d < res.getRank(); ++d) {
    auto it = llvm::find(getDims(), d);
    if (it == getDims().end())
      axes.push_back(d);
    else if (in.getDimSize(it - getDims().begin()) == 1 && res.getDimSize(d) != 1)
      axes.push_back(d);
  }
  out.push_back(h.reshape(h.sum(g, axes), in));
  return success();
}

// d reshape(x) = reshape(g)
LogicalResult ReshapeOp::buildGradients(OpBuilder &b, ArrayRef<Value> grads,
                                        SmallVectorImpl<Value> &out) {
  G h{b, getLoc()};
  out.push_back(grads[0] ? h.reshape(grads[0], getOperand().getType()) : Value());
  return success();
}

// d transpose(x, p) = transpose(g, p^-1)
LogicalResult TransposeOp::buildGradients(OpBuilder &b, ArrayRef<Value> grads,
                                          SmallVectorImpl<Value> &out) {
  G h{b, getLoc()};
  if (!grads[0]) {
    out.push_back({});
    return success();
  }
  SmallVector<int64_t> inverse(getPermutation().size());
  for (auto [i, p] : llvm::enumerate(getPermutation()))
    inverse[p] = i;
  out.push_back(h.transpose(grads[0], inverse));
  return success();
}

// d slice(x) = g padded back to x's shape with zeros
LogicalResult SliceOp::buildGradients(OpBuilder &b, ArrayRef<Value> grads,
                                      SmallVectorImpl<Value> &out) {
  if (!grads[0]) {
    out.push_back({});
    return success();
  }
  RankedTensorType in = getOperand().getType(), res = getType();
  SmallVector<int64_t> low, high, interior;
  for (int64_t d = 0; d < in.getRank(); ++d) {
    int64_t n = res.getDimSize(d), s = getStride()[d];
    int64_t last = getStart()[d] + (n - 1) * s;
    low.push_back(getStart()[d]);
    interior.push_back(s - 1);
    high.push_back(in.getDimSize(d) - 1 - last);
  }
  out.push_back(b.create<PadOp>(
      getLoc(), grads[0], b.getDenseI64ArrayAttr(low), b.getDenseI64ArrayAttr(high),
      b.getDenseI64ArrayAttr(interior), b.getF64FloatAttr(0.0)));
  return success();
}

// d pad(x) = the strided slice of g where x's elements landed
LogicalResult PadOp::buildGradients(OpBuilder &b, ArrayRef<Value> grads,
                                    SmallVectorImpl<Value> &out) {
  if (!grads[0]) {
    out.push_back({});
    return success();
  }
  RankedTensorType in = getOperand().getType();
  SmallVector<int64_t> start, limit, stride;
  for (int64_t d = 0; d < in.getRank(); ++d) {
    int64_t s = getInterior()[d] + 1;
    start.push_back(getLow()[d]);
    limit.push_back(getLow()[d] + (in.getDimSize(d) - 1) * s + 1);
    stride.push_back(s);
  }
  out.push_back(b.create<SliceOp>(getLoc(), grads[0], start, limit, stride));
  return success();
}

// d concat(x1, x2, ...) = the slices of g
LogicalResult ConcatOp::buildGradients(OpBuilder &b, ArrayRef<Value> grads,
                                       SmallVectorImpl<Value> &out) {
  RankedTensorType res = getType();
  int64_t offset = 0, dim = getDim();
  for (Value in : getInputs()) {
    RankedTensorType t = cast<RankedTensorType>(in.getType());
    if (!grads[0]) {
      out.push_back({});
      continue;
    }
    SmallVector<int64_t> start(res.getRank(), 0), limit(res.getShape()),
        stride(res.getRank(), 1);
    start[dim] = offset;
    limit[dim] = offset + t.getDimSize(dim);
    out.push_back(b.create<SliceOp>(getLoc(), grads[0], start, limit, stride));
    offset += t.getDimSize(dim);
  }
  return success();
}

// d barrier(x) = g
LogicalResult OptimizationBarrierOp::buildGradients(OpBuilder &b,
                                                    ArrayRef<Value> grads,
                                                    SmallVectorImpl<Value> &out) {
  out.push_back(grads[0]);
  return success();
}

//===----------------------------------------------------------------------===//
// Sharding
//===----------------------------------------------------------------------===//

namespace {
using Result = ShardingResult;

Result broadcastRule(Operation *op, ArrayRef<Opt> in) {
  auto b = cast<BroadcastInDimOp>(op);
  if (!in[0])
    return std::nullopt;
  TensorSharding out = TensorSharding::replicated(rankOf(b.getResult()));
  auto opType = cast<RankedTensorType>(b.getOperand().getType());
  auto resType = cast<RankedTensorType>(b.getType());
  for (auto [i, d] : llvm::enumerate(b.getDims())) {
    if (!in[0]->split[i].empty() && opType.getDimSize(i) != resType.getDimSize(d))
      return std::nullopt; // a split size-1 dimension being repeated
    out.split[d] = in[0]->split[i];
  }
  out.partial = in[0]->partial;
  return one(out);
}

/// Reshape keeps a split of dimension 0 (a block split of the outermost
/// dimension is a contiguous chunk of the row-major order, whatever the
/// shapes), and a split of dimension d > 0 when the result has a dimension e
/// with the same product of the dimensions before it: block c of d is then
/// the same stretch of each row-major run as block c of e (tensor
/// parallelism's [B, T, C] <-> [B, T, heads, D] and [B, T, F] <-> [B*T, F];
/// the pass checks that e divides).
Result reshapeRule(Operation *op, ArrayRef<Opt> in) {
  if (!in[0])
    return std::nullopt;
  auto from = cast<RankedTensorType>(op->getOperand(0).getType());
  auto to = cast<RankedTensorType>(op->getResult(0).getType());
  TensorSharding out = TensorSharding::replicated(to.getRank());
  out.partial = in[0]->partial;
  int splits = 0;
  for (auto [d, axes] : llvm::enumerate(in[0]->split)) {
    if (axes.empty())
      continue;
    if (out.split.empty() || ++splits > 1)
      return std::nullopt;
    if (d == 0) {
      out.split[0] = axes;
      continue;
    }
    int64_t prefix = 1;
    for (int64_t i = 0; i < int64_t(d); ++i)
      prefix *= from.getDimSize(i);
    int64_t p = 1, e = 0;
    while (e < to.getRank() && (p < prefix || to.getDimSize(e) == 1))
      p *= to.getDimSize(e++);
    if (p != prefix || e >= to.getRank())
      return std::nullopt;
    out.split[size_t(e)] = axes;
  }
  return one(out);
}

Result transposeRule(Operation *op, ArrayRef<Opt> in) {
  if (!in[0])
    return std::nullopt;
  auto t = cast<TransposeOp>(op);
  TensorSharding out = TensorSharding::replicated(rankOf(t.getResult()));
  for (auto [i, p] : llvm::enumerate(t.getPermutation()))
    out.split[i] = in[0]->split[p];
  out.partial = in[0]->partial;
  return one(out);
}

/// Slices and pads keep the splits of the dimensions they leave whole; a
/// slice of split dimension 0 (a micro-batch of each device's rows) stays
/// split.
Result sliceRule(Operation *op, ArrayRef<Opt> in) {
  if (!in[0])
    return std::nullopt;
  auto s = cast<SliceOp>(op);
  auto t = cast<RankedTensorType>(s.getOperand().getType());
  for (auto [d, axes] : llvm::enumerate(in[0]->split)) {
    bool whole = s.getStart()[d] == 0 && s.getLimit()[d] == t.getDimSize(d) &&
                 s.getStride()[d] == 1;
    if (!axes.empty() && !whole && d != 0)
      return std::nullopt;
  }
  return one(*in[0]);
}

Result padRule(Operation *op, ArrayRef<Opt> in) {
  if (!in[0])
    return std::nullopt;
  auto p = cast<PadOp>(op);
  for (auto [d, axes] : llvm::enumerate(in[0]->split))
    if (!axes.empty() && (p.getLow()[d] || p.getHigh()[d] || p.getInterior()[d]))
      return std::nullopt;
  if (!in[0]->partial.empty() && p.getValue().convertToDouble() != 0.0)
    return std::nullopt;
  return one(*in[0]);
}

Result concatRule(Operation *op, ArrayRef<Opt> in) {
  int64_t dim = cast<ConcatOp>(op).getDim();
  Result r = elementwiseShardings(op, in, Linearity::Sum); // splits agree, partials as for add
  if (!r)
    return std::nullopt;
  if (!(*r)[0].split[dim].empty())
    return std::nullopt;
  return r;
}

/// The first dimensions of `a` and `b` that agree.
int64_t commonPrefix(ArrayRef<int64_t> a, ArrayRef<int64_t> b) {
  int64_t n = 0;
  while (n < int64_t(a.size()) && n < int64_t(b.size()) && a[n] == b[n])
    ++n;
  return n;
}
} // namespace

ShardingResult BroadcastInDimOp::inferResultShardings(ArrayRef<Opt> in) {
  return broadcastRule(getOperation(), in);
}
ShardingResult ReshapeOp::inferResultShardings(ArrayRef<Opt> in) {
  return reshapeRule(getOperation(), in);
}
ShardingResult TransposeOp::inferResultShardings(ArrayRef<Opt> in) {
  return transposeRule(getOperation(), in);
}
ShardingResult SliceOp::inferResultShardings(ArrayRef<Opt> in) {
  return sliceRule(getOperation(), in);
}
ShardingResult PadOp::inferResultShardings(ArrayRef<Opt> in) {
  return padRule(getOperation(), in);
}
ShardingResult ConcatOp::inferResultShardings(ArrayRef<Opt> in) {
  return concatRule(getOperation(), in);
}
ShardingResult OptimizationBarrierOp::inferResultShardings(ArrayRef<Opt> in) {
  if (!in[0])
    return std::nullopt;
  return one(*in[0]);
}

//===----------------------------------------------------------------------===//
// Precision: data movement follows its input (autocast promotes a concat's)
//===----------------------------------------------------------------------===//

PrecisionPolicy BroadcastInDimOp::getPrecisionPolicy() { return precision::kFollow; }
PrecisionPolicy ReshapeOp::getPrecisionPolicy() { return precision::kFollow; }
PrecisionPolicy TransposeOp::getPrecisionPolicy() { return precision::kFollow; }
PrecisionPolicy SliceOp::getPrecisionPolicy() { return precision::kFollow; }
PrecisionPolicy PadOp::getPrecisionPolicy() { return precision::kFollow; }
PrecisionPolicy ConcatOp::getPrecisionPolicy() {
  return {PrecisionClass::Follow, PrecisionRule::None, PrecisionClass::Promote, PrecisionRule::None};
}
PrecisionPolicy OptimizationBarrierOp::getPrecisionPolicy() { return precision::kFollow; }

//===----------------------------------------------------------------------===//
// Row locality
//===----------------------------------------------------------------------===//

// The largest p for which the operand is read by rows (its dimensions are
// the result's first p) or whole (none of them maps to a row dimension).
RowLocality BroadcastInDimOp::getRowLocality() {
  RowLocality info = noRows(getOperation());
  RankedTensorType in = getOperand().getType(), out = getType();
  ArrayRef<int64_t> dims = getDims();
  for (int64_t p = out.getRank(); p >= 0; --p) {
    bool row = true, whole = true;
    for (int64_t d = 0; d < p; ++d) {
      auto it = llvm::find(dims, d);
      bool mapped = it != dims.end() && in.getDimSize(it - dims.begin()) != 1;
      int64_t i = it - dims.begin();
      row &= mapped && i == d && in.getDimSize(i) == out.getDimSize(d);
      whole &= !mapped;
    }
    if (row || whole) {
      info.maxRows = p;
      info.rowShaped[0] = row && p > 0;
      return info;
    }
  }
  return info;
}

RowLocality ReshapeOp::getRowLocality() {
  return firstRows(getOperation(),
                   commonPrefix(getOperand().getType().getShape(), getType().getShape()));
}

RowLocality TransposeOp::getRowLocality() {
  ArrayRef<int64_t> perm = getPermutation();
  int64_t rows = 0;
  while (rows < int64_t(perm.size()) && perm[rows] == rows)
    ++rows;
  return firstRows(getOperation(), rows);
}

RowLocality SliceOp::getRowLocality() {
  RankedTensorType in = getOperand().getType(), out = getType();
  ArrayRef<int64_t> start = getStart(), stride = getStride();
  int64_t rows = 0;
  while (rows < out.getRank() && start[rows] == 0 && stride[rows] == 1 &&
         in.getDimSize(rows) == out.getDimSize(rows))
    ++rows;
  return firstRows(getOperation(), rows);
}

RowLocality PadOp::getRowLocality() {
  ArrayRef<int64_t> lo = getLow(), hi = getHigh(), in = getInterior();
  int64_t rows = 0;
  while (rows < getType().getRank() && lo[rows] == 0 && hi[rows] == 0 && in[rows] == 0)
    ++rows;
  return firstRows(getOperation(), rows);
}

RowLocality ConcatOp::getRowLocality() { return firstRows(getOperation(), getDim()); }

// A barrier produces no code: kiln-fuse gives it its own role.
RowLocality OptimizationBarrierOp::getRowLocality() { return noRows(getOperation()); }

//===----------------------------------------------------------------------===//
// Index uses: these move an index unchanged (a pad's fill and a barrier
// do not count)
//===----------------------------------------------------------------------===//

IndexUse BroadcastInDimOp::getIndexUse(unsigned) { return IndexUse::follow(); }
IndexUse ReshapeOp::getIndexUse(unsigned) { return IndexUse::follow(); }
IndexUse TransposeOp::getIndexUse(unsigned) { return IndexUse::follow(); }
IndexUse SliceOp::getIndexUse(unsigned) { return IndexUse::follow(); }
IndexUse ConcatOp::getIndexUse(unsigned) { return IndexUse::follow(); }
IndexUse PadOp::getIndexUse(unsigned) { return IndexUse::none(); }
IndexUse OptimizationBarrierOp::getIndexUse(unsigned) { return IndexUse::none(); }
