//===- KilnOps.cpp - Operations of the kiln dialect -----------------------===//
#include "dialects/kiln/KilnOps.h"
#include "dialects/kiln/ShapeRules.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/Matchers.h"
#include "mlir/IR/PatternMatch.h"

using namespace mlir;
using namespace kiln;

#include "dialects/kiln/KilnEnums.cpp.inc"
#include "dialects/kiln/KilnInterfaces.cpp.inc"

#define GET_OP_CLASSES
#include "dialects/kiln/KilnOps.cpp.inc"

//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

namespace {
using Loc = std::optional<Location>;

/// Operand types are only checked by the verifier, which runs after type
/// inference when parsing: inference must therefore cope with any type.
LogicalResult ranked(Loc loc, Value v, StringRef what, RankedTensorType &out) {
  out = v ? dyn_cast<RankedTensorType>(v.getType()) : RankedTensorType();
  if (!out || !out.hasStaticShape())
    return emitOptionalError(loc, what, " must be a statically shaped tensor");
  return success();
}

SplatElementsAttr splat(Attribute a) {
  return dyn_cast_if_present<SplatElementsAttr>(a);
}

bool isSplatOf(Attribute a, double value) {
  SplatElementsAttr s = splat(a);
  if (!s)
    return false;
  Type et = s.getElementType();
  if (isa<FloatType>(et))
    return s.getSplatValue<APFloat>().isExactlyValue(value);
  if (et.isInteger(1))
    return false;
  if (isa<IntegerType>(et))
    return s.getSplatValue<APInt>().getSExtValue() == static_cast<int64_t>(value) &&
           static_cast<double>(static_cast<int64_t>(value)) == value;
  return false;
}

/// Folds `lhs op rhs` when both are splat constants.
template <typename FloatFn, typename IntFn>
Attribute foldSplats(Attribute lhs, Attribute rhs, ShapedType type,
                     FloatFn floatFn, IntFn intFn) {
  SplatElementsAttr l = splat(lhs), r = splat(rhs);
  if (!l || !r || l.getType() != type || r.getType() != type)
    return {};
  Type et = type.getElementType();
  if (isa<FloatType>(et)) {
    APFloat v = floatFn(l.getSplatValue<APFloat>(), r.getSplatValue<APFloat>());
    return SplatElementsAttr::get(type, FloatAttr::get(et, v));
  }
  if (isa<IntegerType>(et) && !et.isInteger(1)) {
    std::optional<APInt> v =
        intFn(l.getSplatValue<APInt>(), r.getSplatValue<APInt>());
    if (!v)
      return {};
    return SplatElementsAttr::get(type, IntegerAttr::get(et, *v));
  }
  return {};
}

/// Splat constants change shape freely: reshape, broadcast, transpose.
OpFoldResult reshapeSplat(Attribute operand, Type resultType) {
  if (SplatElementsAttr s = splat(operand))
    return SplatElementsAttr::get(cast<ShapedType>(resultType),
                                  s.getSplatValue<Attribute>());
  return {};
}
} // namespace

//===----------------------------------------------------------------------===//
// Type inference for ops whose result has the type of their first operand
//===----------------------------------------------------------------------===//

#define KILN_RESULT_TYPE_OF(OP, GETTER)                                        \
  LogicalResult OP::inferReturnTypes(MLIRContext *, Loc loc, Adaptor adaptor,  \
                                     SmallVectorImpl<Type> &types) {           \
    if (!adaptor.GETTER())                                                     \
      return emitOptionalError(loc, "missing operand");                        \
    types.push_back(adaptor.GETTER().getType());                               \
    return success();                                                          \
  }

KILN_RESULT_TYPE_OF(DropoutOp, getOperand)
#undef KILN_RESULT_TYPE_OF

//===----------------------------------------------------------------------===//
// ConstantOp / IotaOp
//===----------------------------------------------------------------------===//

LogicalResult ConstantOp::inferReturnTypes(MLIRContext *, Loc loc,
                                           Adaptor adaptor,
                                           SmallVectorImpl<Type> &types) {
  ElementsAttr value = adaptor.getValue();
  if (!value)
    return emitOptionalError(loc, "needs an elements attribute");
  types.push_back(value.getType());
  return success();
}

LogicalResult ConstantOp::verify() {
  if (getValue().getType() != getType())
    return emitOpError() << "value has type " << getValue().getType()
                         << " but the result is " << getType();
  return success();
}

OpFoldResult ConstantOp::fold(FoldAdaptor) { return getValue(); }

LogicalResult IotaOp::verify() {
  return shape::axis(getLoc(), getType().getRank(), getDim(), "dim");
}

//===----------------------------------------------------------------------===//
// Elementwise
//===----------------------------------------------------------------------===//

// neg(neg(x)) => x
OpFoldResult NegOp::fold(FoldAdaptor) {
  if (auto inner = getOperand().getDefiningOp<NegOp>())
    return inner.getOperand();
  return {};
}

LogicalResult CastOp::verify() {
  if (getOperand().getType().getShape() != getType().getShape())
    return emitOpError() << "changes the shape from "
                         << shape::str(getOperand().getType().getShape())
                         << " to " << shape::str(getType().getShape())
                         << "; a cast only changes the element type";
  return success();
}

// cast(x : T -> T) => x
OpFoldResult CastOp::fold(FoldAdaptor) {
  if (getOperand().getType() == getType())
    return getOperand();
  return {};
}

// x + (-0.0) => x and, for integers, x + 0 => x (x + (+0.0) is not an
// identity: -0.0 + 0.0 = +0.0); splat + splat => splat
OpFoldResult AddOp::fold(FoldAdaptor adaptor) {
  auto isAdditiveIdentity = [&](Attribute a) {
    SplatElementsAttr s = splat(a);
    if (!s)
      return false;
    if (isa<FloatType>(s.getElementType())) {
      APFloat v = s.getSplatValue<APFloat>();
      return v.isZero() && v.isNegative();
    }
    return isSplatOf(a, 0);
  };
  if (isAdditiveIdentity(adaptor.getRhs()))
    return getLhs();
  if (isAdditiveIdentity(adaptor.getLhs()))
    return getRhs();
  return foldSplats(
      adaptor.getLhs(), adaptor.getRhs(), getType(),
      [](APFloat a, const APFloat &b) { a.add(b, APFloat::rmNearestTiesToEven); return a; },
      [](const APInt &a, const APInt &b) -> std::optional<APInt> { return a + b; });
}

namespace {
/// add(pad(x), pad(y)) => pad(concat(x, y)) when both pads fill with 0.0,
/// have no interior padding, and place their operands side by side along
/// one axis (equal padding on every other axis). The gradient of a split
/// (slices of one tensor, such as attention's q, k, v) is such a sum, one
/// pad per slice; this turns it into one concatenation, and a chain of them
/// into one concat with no padding left (pad's fold drops that).
struct AddOfAdjacentPads : OpRewritePattern<AddOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(AddOp op, PatternRewriter &rw) const override {
    auto a = op.getLhs().getDefiningOp<PadOp>(), b = op.getRhs().getDefiningOp<PadOp>();
    if (!a || !b)
      return rw.notifyMatchFailure(op, "operands are not both pads");
    auto zeroPad = [](PadOp p) {
      return p.getValue().isZero() && llvm::all_of(p.getInterior(), [](int64_t i) { return i == 0; });
    };
    if (!zeroPad(a) || !zeroPad(b))
      return rw.notifyMatchFailure(op, "a pad with interior padding or a nonzero value");
    RankedTensorType ta = a.getOperand().getType(), tb = b.getOperand().getType();
    if (ta.getElementType() != tb.getElementType())
      return failure();
    int64_t rank = ta.getRank(), axis = -1;
    for (int64_t d = 0; d < rank; ++d) {
      if (a.getLow()[d] == b.getLow()[d] && a.getHigh()[d] == b.getHigh()[d] &&
          ta.getDimSize(d) == tb.getDimSize(d))
        continue;
      if (axis >= 0)
        return rw.notifyMatchFailure(op, "the pads differ on more than one axis");
      axis = d;
    }
    if (axis < 0)
      return rw.notifyMatchFailure(op, "the pads overlap everywhere");
    // Which operand comes first along the axis, and are they adjacent?
    PadOp first = a, second = b;
    if (b.getLow()[axis] < a.getLow()[axis])
      std::swap(first, second);
    int64_t firstEnd = first.getLow()[axis] + first.getOperand().getType().getDimSize(axis);
    if (firstEnd != second.getLow()[axis])
      return rw.notifyMatchFailure(op, "the padded operands are not side by side");
    // Concat inputs, splicing concats already built along the same axis.
    SmallVector<Value> inputs;
    for (PadOp p : {first, second}) {
      auto c = p.getOperand().getDefiningOp<ConcatOp>();
      if (c && c.getDim() == axis)
        inputs.append(c.getInputs().begin(), c.getInputs().end());
      else
        inputs.push_back(p.getOperand());
    }
    Value cat = rw.create<ConcatOp>(op.getLoc(), inputs, rw.getI64IntegerAttr(axis));
    SmallVector<int64_t> low(first.getLow()), high(first.getHigh());
    high[axis] = second.getHigh()[axis];
    rw.replaceOpWithNewOp<PadOp>(op, op.getType(), cat, rw.getDenseI64ArrayAttr(low),
                                 rw.getDenseI64ArrayAttr(high), first.getInteriorAttr(),
                                 first.getValueAttr());
    return success();
  }
};
} // namespace

void AddOp::getCanonicalizationPatterns(RewritePatternSet &results, MLIRContext *ctx) {
  results.add<AddOfAdjacentPads>(ctx);
}

// x - 0 => x
OpFoldResult SubOp::fold(FoldAdaptor adaptor) {
  if (isSplatOf(adaptor.getRhs(), 0))
    return getLhs();
  return foldSplats(
      adaptor.getLhs(), adaptor.getRhs(), getType(),
      [](APFloat a, const APFloat &b) { a.subtract(b, APFloat::rmNearestTiesToEven); return a; },
      [](const APInt &a, const APInt &b) -> std::optional<APInt> { return a - b; });
}

// x * 1 => x, 1 * x => x
OpFoldResult MulOp::fold(FoldAdaptor adaptor) {
  if (isSplatOf(adaptor.getRhs(), 1))
    return getLhs();
  if (isSplatOf(adaptor.getLhs(), 1))
    return getRhs();
  return foldSplats(
      adaptor.getLhs(), adaptor.getRhs(), getType(),
      [](APFloat a, const APFloat &b) { a.multiply(b, APFloat::rmNearestTiesToEven); return a; },
      [](const APInt &a, const APInt &b) -> std::optional<APInt> { return a * b; });
}

// x / 1 => x
OpFoldResult DivOp::fold(FoldAdaptor adaptor) {
  if (isSplatOf(adaptor.getRhs(), 1))
    return getLhs();
  return foldSplats(
      adaptor.getLhs(), adaptor.getRhs(), getType(),
      [](APFloat a, const APFloat &b) { a.divide(b, APFloat::rmNearestTiesToEven); return a; },
      [](const APInt &a, const APInt &b) -> std::optional<APInt> {
        if (b.isZero() || (a.isMinSignedValue() && b.isAllOnes()))
          return std::nullopt;
        return a.sdiv(b);
      });
}

// x ^ 1 => x
OpFoldResult PowOp::fold(FoldAdaptor adaptor) {
  if (isSplatOf(adaptor.getRhs(), 1))
    return getLhs();
  return {};
}

LogicalResult CompareOp::inferReturnTypes(MLIRContext *ctx, Loc loc,
                                          Adaptor adaptor,
                                          SmallVectorImpl<Type> &types) {
  RankedTensorType lhs;
  if (failed(ranked(loc, adaptor.getLhs(), "lhs", lhs)))
    return failure();
  types.push_back(lhs.clone(IntegerType::get(ctx, 1)));
  return success();
}

LogicalResult SelectOp::verify() {
  if (getPred().getType().getShape() != getType().getShape())
    return emitOpError() << "predicate has shape "
                         << shape::str(getPred().getType().getShape())
                         << " but the values have shape "
                         << shape::str(getType().getShape())
                         << "; broadcast the predicate first";
  return success();
}

//===----------------------------------------------------------------------===//
// BroadcastInDimOp
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

//===----------------------------------------------------------------------===//
// Reductions
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

//===----------------------------------------------------------------------===//
// MatmulOp
//===----------------------------------------------------------------------===//

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
// ReshapeOp
//===----------------------------------------------------------------------===//

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

//===----------------------------------------------------------------------===//
// Neural-network composites
//===----------------------------------------------------------------------===//

LogicalResult SoftmaxOp::verify() {
  return shape::axis(getLoc(), getType().getRank(), getAxis(), "axis");
}
LogicalResult LogSoftmaxOp::verify() {
  return shape::axis(getLoc(), getType().getRank(), getAxis(), "axis");
}

LogicalResult LayerNormOp::inferReturnTypes(MLIRContext *, Loc loc,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &types) {
  RankedTensorType in, scale, bias;
  if (failed(ranked(loc, adaptor.getOperand(), "operand", in)))
    return failure();
  ArrayRef<int64_t> scaleShape, biasShape;
  if (adaptor.getScale()) {
    if (failed(ranked(loc, adaptor.getScale(), "scale", scale)))
      return failure();
    scaleShape = scale.getShape();
  }
  if (adaptor.getBias()) {
    if (failed(ranked(loc, adaptor.getBias(), "bias", bias)))
      return failure();
    biasShape = bias.getShape();
  }
  for (RankedTensorType t : {scale, bias})
    if (t && t.getElementType() != in.getElementType())
      return emitOptionalError(loc, "scale and bias must have the operand's "
                                    "element type ",
                               in.getElementType(), ", got ",
                               t.getElementType());
  if (failed(shape::layerNorm(loc, in.getShape(),
                              scale ? &scaleShape : nullptr,
                              bias ? &biasShape : nullptr)))
    return failure();
  types.push_back(in);
  return success();
}

LogicalResult CrossEntropyOp::inferReturnTypes(MLIRContext *, Loc loc,
                                               Adaptor adaptor,
                                               SmallVectorImpl<Type> &types) {
  RankedTensorType logits, targets;
  shape::Shape out;
  if (failed(ranked(loc, adaptor.getLogits(), "logits", logits)) ||
      failed(ranked(loc, adaptor.getTargets(), "targets", targets)) ||
      failed(shape::crossEntropy(
          loc, logits.getShape(), targets.getShape(),
          adaptor.getReduction() != LossReduction::none, out)))
    return failure();
  types.push_back(logits.clone(out));
  return success();
}

LogicalResult DropoutOp::verify() {
  double rate = getRate().convertToDouble();
  if (!(rate >= 0.0 && rate < 1.0))
    return emitOpError() << "rate " << rate << " must be in [0, 1)";
  return success();
}

// dropout(x, rate = 0) => x
OpFoldResult DropoutOp::fold(FoldAdaptor) {
  if (getRate().isZero())
    return getOperand();
  return {};
}

//===----------------------------------------------------------------------===//
// PadOp / ScatterAddOp
//===----------------------------------------------------------------------===//

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
// Collectives
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
// kiln.fusion
//===----------------------------------------------------------------------===//

LogicalResult FusionOp::verify() {
  static const char *kinds[] = {"elementwise", "row_reduction", "column_reduction",
                                "gemm", "gemm_epilogue", "single"};
  if (!llvm::is_contained(kinds, getKind()))
    return emitOpError() << "has unknown kind '" << getKind()
                         << "' (elementwise, row_reduction, column_reduction, "
                            "gemm, gemm_epilogue or single)";
  Block &block = getBlock();
  if (block.getNumArguments() != getInputs().size())
    return emitOpError() << "has " << getInputs().size() << " inputs but its body takes "
                         << block.getNumArguments() << " arguments";
  for (auto [i, pair] : llvm::enumerate(llvm::zip(getInputs(), block.getArguments())))
    if (std::get<0>(pair).getType() != std::get<1>(pair).getType())
      return emitOpError() << "input " << i << " has type " << std::get<0>(pair).getType()
                           << " but the body argument has type "
                           << std::get<1>(pair).getType();
  auto yield = cast<YieldOp>(block.getTerminator());
  if (yield.getValues().getTypes() != getResultTypes())
    return emitOpError() << "yields " << yield.getValues().size()
                         << " values whose types differ from its results";
  if (getRows() < 0)
    return emitOpError() << "rows must be >= 0";
  return success();
}
