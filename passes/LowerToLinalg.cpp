//===- LowerToLinalg.cpp - kiln ops to linalg on tensors ------------------===//
//
// The first step of the CPU (and later the GPU) code path: each kiln op
// becomes upstream MLIR on tensors (linalg.generic with arith/math bodies,
// linalg.transpose, tensor reshapes, arith.constant). Upstream bufferization
// and the LLVM lowering take it from there (see test/codegen/).
//
// Every kiln op is covered: softmax, log_softmax, layer_norm and
// cross_entropy by decomposition into kiln primitives, scatter_add by an
// scf.for, random and dropout by the counter-based hash of
// runtime/core/Random.h in i64 arithmetic.
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"
#include "passes/Fusion.h"

#include "dialects/kiln/Elementwise.h"
#include "dialects/kiln/KilnOps.h"
#include "runtime/core/Random.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

#include <cmath>

using namespace mlir;

namespace kiln {
#define GEN_PASS_DEF_KILNLOWERTOLINALGPASS
#include "passes/Passes.h.inc"

namespace {

using Body = function_ref<Value(OpBuilder &, Location, ValueRange)>;

/// The combiner of a float reduction may be reassociated (docs/codegen.md,
/// "CPU code": vectorized reductions).
constexpr arith::FastMathFlags kReassoc = arith::FastMathFlags::reassoc;

RankedTensorType tt(Value v) { return cast<RankedTensorType>(v.getType()); }

Value emptyLike(OpBuilder &b, Location loc, RankedTensorType t) {
  return b.create<tensor::EmptyOp>(loc, t.getShape(), t.getElementType());
}

/// A linalg.generic over `out`'s iteration space (plus `extraDims`
/// reduction dims) computing body(inputs..., out element).
Value generic(OpBuilder &b, Location loc, RankedTensorType resultType,
              ValueRange inputs, ArrayRef<AffineMap> inputMaps, AffineMap outMap,
              ArrayRef<utils::IteratorType> iters, Value init, Body body) {
  SmallVector<AffineMap> maps(inputMaps.begin(), inputMaps.end());
  maps.push_back(outMap);
  auto op = b.create<linalg::GenericOp>(
      loc, TypeRange{resultType}, inputs, ValueRange{init}, maps, iters,
      [&](OpBuilder &nb, Location nl, ValueRange args) {
        nb.create<linalg::YieldOp>(nl, body(nb, nl, args));
      });
  return op.getResult(0);
}

/// Elementwise: identity maps, all loops parallel.
Value elementwise(OpBuilder &b, Location loc, RankedTensorType resultType,
                  ValueRange inputs, Body body) {
  int64_t rank = resultType.getRank();
  AffineMap id = b.getMultiDimIdentityMap(rank);
  SmallVector<AffineMap> maps(inputs.size(), id);
  SmallVector<utils::IteratorType> iters(rank, utils::IteratorType::parallel);
  return generic(b, loc, resultType, inputs, maps, id, iters,
                 emptyLike(b, loc, resultType), body);
}

Value fconst(OpBuilder &b, Location loc, Type t, double v) {
  return b.create<arith::ConstantOp>(loc, t, b.getFloatAttr(t, v));
}

/// bf16 and f16 are storage types: reductions, matmuls and scatter_add
/// over them accumulate in f32 (docs/dialect.md, "Element types").
bool isLowFloat(Type t) { return t.isBF16() || t.isF16(); }
/// The type an accumulation over `et` runs in.
Type accumulatorType(Type et) { return isLowFloat(et) ? Float32Type::get(et.getContext()) : et; }

/// An f32 accumulator tensor to `to` (bf16/f16): a truncf tagged
/// kAccumulatorAttr, which kiln-widen-low-precision rounds only where it is
/// stored, unless `of` (the op accumulated) is a rounding point
/// (kRoundAttr): then it rounds for its uses inside the kernel too. Identity
/// when `to` is not a low type.
Value endAccumulation(OpBuilder &b, Location loc, Value acc, RankedTensorType to, Operation *of) {
  if (!isLowFloat(to.getElementType()))
    return acc;
  bool round = of->hasAttr(kRoundAttr);
  return elementwise(b, loc, to, acc, [&](OpBuilder &nb, Location l, ValueRange a) -> Value {
    auto t = nb.create<arith::TruncFOp>(l, to.getElementType(), a[0]);
    t->setAttr(kAccumulatorAttr, nb.getUnitAttr());
    if (round)
      t->setAttr(kRoundAttr, nb.getUnitAttr());
    return t;
  });
}

/// `v` replaces `op`: a rounding point stays one (decompositions).
void keepRounding(Operation *op, Value v) {
  if (Operation *d = v.getDefiningOp(); d && op->hasAttr(kRoundAttr))
    d->setAttr(kRoundAttr, UnitAttr::get(op->getContext()));
}

} // namespace

/// The scalar computation of one elementwise kiln op, or null if `op` is
/// not elementwise.
Value buildScalarOp(Operation *op, OpBuilder &b, Location loc, ValueRange a) {
  Type t = a.empty() ? Type() : a[0].getType();
  bool f = t && isa<FloatType>(t);
  // Arithmetic: dialects/kiln/Elementwise.cpp's table.
  if (const elementwise_table::Entry *e = elementwise_table::lookup(op))
    return e->build(elementwise_table::ScalarOperands{b, loc, a, t, f});
  if (auto c = dyn_cast<CompareOp>(op)) {
    if (f) {
      arith::CmpFPredicate p;
      switch (c.getDirection()) {
      case CompareDirection::eq: p = arith::CmpFPredicate::OEQ; break;
      case CompareDirection::ne: p = arith::CmpFPredicate::UNE; break;
      case CompareDirection::lt: p = arith::CmpFPredicate::OLT; break;
      case CompareDirection::le: p = arith::CmpFPredicate::OLE; break;
      case CompareDirection::gt: p = arith::CmpFPredicate::OGT; break;
      case CompareDirection::ge: p = arith::CmpFPredicate::OGE; break;
      }
      return b.create<arith::CmpFOp>(loc, p, a[0], a[1]);
    }
    arith::CmpIPredicate p;
    switch (c.getDirection()) {
    case CompareDirection::eq: p = arith::CmpIPredicate::eq; break;
    case CompareDirection::ne: p = arith::CmpIPredicate::ne; break;
    case CompareDirection::lt: p = arith::CmpIPredicate::slt; break;
    case CompareDirection::le: p = arith::CmpIPredicate::sle; break;
    case CompareDirection::gt: p = arith::CmpIPredicate::sgt; break;
    case CompareDirection::ge: p = arith::CmpIPredicate::sge; break;
    }
    return b.create<arith::CmpIOp>(loc, p, a[0], a[1]);
  }
  if (isa<SelectOp>(op)) return b.create<arith::SelectOp>(loc, a[0], a[1], a[2]);
  if (auto c = dyn_cast<CastOp>(op)) {
    Type to = c.getType().getElementType();
    Value x = a[0];
    Type from = x.getType();
    if (from == to)
      return x;
    if (to.isInteger(1))
      return isa<FloatType>(from)
                 ? b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::UNE, x, fconst(b, loc, from, 0.0)).getResult()
                 : b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ne, x, b.create<arith::ConstantOp>(loc, from, b.getIntegerAttr(from, 0))).getResult();
    if (isa<FloatType>(from) && isa<FloatType>(to))
      return from.getIntOrFloatBitWidth() < to.getIntOrFloatBitWidth()
                 ? b.create<arith::ExtFOp>(loc, to, x).getResult()
                 : b.create<arith::TruncFOp>(loc, to, x).getResult();
    if (isa<FloatType>(from))
      return b.create<arith::FPToSIOp>(loc, to, x);
    if (isa<FloatType>(to))
      return from.isInteger(1) ? b.create<arith::UIToFPOp>(loc, to, x).getResult()
                               : b.create<arith::SIToFPOp>(loc, to, x).getResult();
    unsigned fw = from.getIntOrFloatBitWidth(), tw = to.getIntOrFloatBitWidth();
    if (fw < tw)
      return from.isInteger(1) ? b.create<arith::ExtUIOp>(loc, to, x).getResult()
                               : b.create<arith::ExtSIOp>(loc, to, x).getResult();
    return b.create<arith::TruncIOp>(loc, to, x);
  }
  return {};
}

namespace {
/// buildScalarOp, with the rounding point of `op` (kRoundAttr) moved to the
/// scalar op computing its value.
Value scalar(Operation *op, OpBuilder &b, Location loc, ValueRange a) {
  Value s = buildScalarOp(op, b, loc, a);
  if (s && op->hasAttr(kRoundAttr) && isLowFloat(s.getType()))
    if (Operation *d = s.getDefiningOp(); d && d->getBlock() == b.getInsertionBlock())
      d->setAttr(kRoundAttr, b.getUnitAttr());
  return s;
}

/// Every elementwise kiln op, one pattern.
struct LowerElementwise : RewritePattern {
  LowerElementwise(MLIRContext *ctx) : RewritePattern(MatchAnyOpTypeTag(), 1, ctx) {}
  LogicalResult matchAndRewrite(Operation *op, PatternRewriter &rw) const override {
    if (op->getDialect() == nullptr || !isa<KilnDialect>(op->getDialect()) ||
        op->getNumResults() != 1)
      return failure();
    if (!op->hasTrait<OpTrait::Elementwise>() && !isa<CastOp, SelectOp>(op))
      return rw.notifyMatchFailure(op, "not elementwise");
    RankedTensorType rt = tt(op->getResult(0));
    Value r = elementwise(rw, op->getLoc(), rt, op->getOperands(),
                          [&](OpBuilder &b, Location loc, ValueRange args) {
                            return scalar(op, b, loc, args.drop_back());
                          });
    rw.replaceOp(op, r);
    return success();
  }
};

struct LowerConstant : OpRewritePattern<ConstantOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(ConstantOp op, PatternRewriter &rw) const override {
    rw.replaceOpWithNewOp<arith::ConstantOp>(op, cast<TypedAttr>(op.getValue()));
    return success();
  }
};

struct LowerIota : OpRewritePattern<IotaOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(IotaOp op, PatternRewriter &rw) const override {
    RankedTensorType rt = op.getType();
    Type et = rt.getElementType();
    int64_t dim = op.getDim();
    Value r = elementwise(rw, op.getLoc(), rt, {}, [&](OpBuilder &b, Location loc, ValueRange) -> Value {
      Value i = b.create<linalg::IndexOp>(loc, dim);
      Value n = b.create<arith::IndexCastOp>(loc, b.getI64Type(), i);
      if (isa<FloatType>(et))
        return b.create<arith::SIToFPOp>(loc, et, n);
      return et.getIntOrFloatBitWidth() < 64 ? b.create<arith::TruncIOp>(loc, et, n).getResult() : n;
    });
    rw.replaceOp(op, r);
    return success();
  }
};

struct LowerBroadcast : OpRewritePattern<BroadcastInDimOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(BroadcastInDimOp op, PatternRewriter &rw) const override {
    RankedTensorType in = op.getOperand().getType(), out = op.getType();
    SmallVector<AffineExpr> exprs;
    for (auto [i, d] : llvm::enumerate(op.getDims()))
      exprs.push_back(in.getDimSize(i) == 1 && out.getDimSize(d) != 1
                          ? rw.getAffineConstantExpr(0)
                          : rw.getAffineDimExpr(d));
    AffineMap inMap = AffineMap::get(out.getRank(), 0, exprs, rw.getContext());
    SmallVector<utils::IteratorType> iters(out.getRank(), utils::IteratorType::parallel);
    Value r = generic(rw, op.getLoc(), out, op.getOperand(), inMap,
                      rw.getMultiDimIdentityMap(out.getRank()), iters,
                      emptyLike(rw, op.getLoc(), out),
                      [](OpBuilder &, Location, ValueRange a) { return a[0]; });
    rw.replaceOp(op, r);
    return success();
  }
};

/// reduce_sum / reduce_mean / reduce_max: a reduction generic into the kept
/// dims, a division for the mean, an expand_shape for keepdims.
template <typename OpT>
struct LowerReduce : OpRewritePattern<OpT> {
  using OpRewritePattern<OpT>::OpRewritePattern;
  LogicalResult matchAndRewrite(OpT op, PatternRewriter &rw) const override {
    Location loc = op.getLoc();
    RankedTensorType in = op.getOperand().getType();
    Type et = in.getElementType();
    bool isMax = std::is_same_v<OpT, ReduceMaxOp>, isMean = std::is_same_v<OpT, ReduceMeanOp>;
    ArrayRef<int64_t> axes = op.getAxes();
    SmallVector<int64_t> kept;
    SmallVector<AffineExpr> outExprs;
    SmallVector<utils::IteratorType> iters;
    int64_t count = 1;
    for (int64_t d = 0; d < in.getRank(); ++d) {
      bool reduced = llvm::is_contained(axes, d);
      iters.push_back(reduced ? utils::IteratorType::reduction : utils::IteratorType::parallel);
      if (reduced) {
        count *= in.getDimSize(d);
      } else {
        kept.push_back(in.getDimSize(d));
        outExprs.push_back(rw.getAffineDimExpr(d));
      }
    }
    Type inType = et;
    et = accumulatorType(et);
    auto outType = RankedTensorType::get(kept, et);
    TypedAttr initAttr;
    if (isa<FloatType>(et))
      initAttr = rw.getFloatAttr(et, isMax ? -INFINITY : 0.0);
    else
      initAttr = rw.getIntegerAttr(et, isMax ? APInt::getSignedMinValue(et.getIntOrFloatBitWidth()).getSExtValue() : 0);
    Value initScalar = rw.create<arith::ConstantOp>(loc, initAttr);
    Value init = rw.create<linalg::FillOp>(loc, initScalar, emptyLike(rw, loc, outType)).getResult(0);
    AffineMap outMap = AffineMap::get(in.getRank(), 0, outExprs, rw.getContext());
    Value r = generic(rw, loc, outType, op.getOperand(), rw.getMultiDimIdentityMap(in.getRank()),
                      outMap, iters, init, [&](OpBuilder &b, Location l, ValueRange a) -> Value {
                        bool f = isa<FloatType>(et);
                        Value x = a[0];
                        if (inType != et)
                          x = b.create<arith::ExtFOp>(l, et, x);
                        // reassoc: the loop vectorizer may then keep
                        // several partial results (a tree in vector lanes);
                        // the order is fixed by the compiled code, so
                        // results still do not depend on the thread count.
                        if (isMax)
                          return f ? b.create<arith::MaximumFOp>(l, x, a[1], kReassoc).getResult()
                                   : b.create<arith::MaxSIOp>(l, x, a[1]).getResult();
                        return f ? b.create<arith::AddFOp>(l, x, a[1], kReassoc).getResult()
                                 : b.create<arith::AddIOp>(l, x, a[1]).getResult();
                      });
    if (isMean) {
      double inv = 1.0 / double(count);
      r = elementwise(rw, loc, outType, r, [&](OpBuilder &b, Location l, ValueRange a) -> Value {
        return b.create<arith::MulFOp>(l, a[0], fconst(b, l, et, inv));
      });
    }
    if (op.getKeepdims()) {
      // Group each kept dim with the reduced (size-1) dims around it.
      SmallVector<ReassociationIndices> groups;
      ReassociationIndices pending;
      for (int64_t d = 0; d < in.getRank(); ++d) {
        pending.push_back(d);
        if (!llvm::is_contained(axes, d)) {
          groups.push_back(pending);
          pending.clear();
        }
      }
      if (!pending.empty() && !groups.empty())
        groups.back().append(pending.begin(), pending.end());
      r = rw.create<tensor::ExpandShapeOp>(loc, op.getType().clone(et), r, groups);
    }
    // After the expand, so that the truncation fuses into the reduction's
    // readers (softmax, layer_norm: an f32 statistic, never rounded inside
    // the kernel).
    rw.replaceOp(op, endAccumulation(rw, loc, r, op.getType(), op));
    return success();
  }
};

struct LowerMatmul : OpRewritePattern<MatmulOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(MatmulOp op, PatternRewriter &rw) const override {
    Location loc = op.getLoc();
    RankedTensorType lt = op.getLhs().getType(), rt = op.getRhs().getType(), ot = op.getType();
    int64_t batch = ot.getRank() - 2, n = ot.getRank() + 1; // loops: batch.., m, n, k
    auto d = [&](int64_t i) { return rw.getAffineDimExpr(i); };
    AffineExpr m = d(batch), nn = d(batch + 1), k = d(batch + 2);
    auto batchExprs = [&](RankedTensorType t) {
      SmallVector<AffineExpr> e;
      if (t.getRank() > 2)
        for (int64_t i = 0; i < batch; ++i)
          e.push_back(d(i));
      return e;
    };
    SmallVector<AffineExpr> le = batchExprs(lt), re = batchExprs(rt), oe;
    for (AffineExpr e : op.getTransposeLhs() ? SmallVector<AffineExpr>{k, m} : SmallVector<AffineExpr>{m, k})
      le.push_back(e);
    for (AffineExpr e : op.getTransposeRhs() ? SmallVector<AffineExpr>{nn, k} : SmallVector<AffineExpr>{k, nn})
      re.push_back(e);
    for (int64_t i = 0; i < batch; ++i)
      oe.push_back(d(i));
    oe.append({m, nn});
    SmallVector<utils::IteratorType> iters(n - 1, utils::IteratorType::parallel);
    iters.push_back(utils::IteratorType::reduction);
    Type et = accumulatorType(ot.getElementType());
    bool f = isa<FloatType>(et);
    RankedTensorType lowType = ot;
    ot = ot.clone(et);
    Value zero = rw.create<arith::ConstantOp>(loc, f ? TypedAttr(rw.getFloatAttr(et, 0.0)) : TypedAttr(rw.getIntegerAttr(et, 0)));
    Value init = rw.create<linalg::FillOp>(loc, zero, emptyLike(rw, loc, ot)).getResult(0);
    auto map = [&](ArrayRef<AffineExpr> e) { return AffineMap::get(n, 0, e, rw.getContext()); };
    Value r = generic(rw, loc, ot, {op.getLhs(), op.getRhs()}, {map(le), map(re)}, map(oe), iters, init,
                      [&](OpBuilder &b, Location l, ValueRange a) -> Value {
                        if (f) {
                          Value x = a[0], y = a[1];
                          if (x.getType() != et) x = b.create<arith::ExtFOp>(l, et, x);
                          if (y.getType() != et) y = b.create<arith::ExtFOp>(l, et, y);
                          return b.create<arith::AddFOp>(l, a[2], b.create<arith::MulFOp>(l, x, y));
                        }
                        return b.create<arith::AddIOp>(l, a[2], b.create<arith::MulIOp>(l, a[0], a[1]));
                      });
    rw.replaceOp(op, endAccumulation(rw, loc, r, lowType, op));
    return success();
  }
};

struct LowerTranspose : OpRewritePattern<TransposeOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(TransposeOp op, PatternRewriter &rw) const override {
    Value init = emptyLike(rw, op.getLoc(), op.getType());
    auto t = rw.create<linalg::TransposeOp>(op.getLoc(), op.getOperand(), init, op.getPermutation());
    rw.replaceOp(op, t.getResult());
    return success();
  }
};

/// Row-major reshape between static tensor types through one dimension.
Value reshapeVia1D(OpBuilder &b, Location loc, Value v, RankedTensorType to) {
  RankedTensorType from = tt(v);
  if (from == to)
    return v;
  auto all = [](int64_t rank) {
    ReassociationIndices g;
    for (int64_t i = 0; i < rank; ++i)
      g.push_back(i);
    return SmallVector<ReassociationIndices>{g};
  };
  auto flatT = RankedTensorType::get({from.getNumElements()}, from.getElementType());
  Value flat = from.getRank() == 1 ? v
               : from.getRank() == 0
                   ? b.create<tensor::ExpandShapeOp>(loc, flatT, v, SmallVector<ReassociationIndices>{}).getResult()
                   : b.create<tensor::CollapseShapeOp>(loc, flatT, v, all(from.getRank())).getResult();
  if (to.getRank() == 1)
    return flat;
  if (to.getRank() == 0)
    return b.create<tensor::CollapseShapeOp>(loc, to, flat, SmallVector<ReassociationIndices>{});
  return b.create<tensor::ExpandShapeOp>(loc, to, flat, all(to.getRank()));
}

/// Row-major reshape: collapse to one dimension, expand to the target.
struct LowerReshape : OpRewritePattern<ReshapeOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(ReshapeOp op, PatternRewriter &rw) const override {
    rw.replaceOp(op, reshapeVia1D(rw, op.getLoc(), op.getOperand(), op.getType()));
    return success();
  }
};

//===----------------------------------------------------------------------===//
// Composite ops: decomposed into kiln primitives, which the patterns above
// then lower (one greedy run does both).
//===----------------------------------------------------------------------===//

/// Helpers that build kiln ops for decompositions.
struct K {
  PatternRewriter &rw;
  Location loc;
  Value bcastKeep(Value keep, RankedTensorType to) { // keepdims shape -> full
    SmallVector<int64_t> dims;
    for (int64_t d = 0; d < to.getRank(); ++d)
      dims.push_back(d);
    return rw.create<BroadcastInDimOp>(loc, to, keep, dims);
  }
  Value reduceKeep(Value x, int64_t axis, int kind) { // 0 sum 1 mean 2 max
    RankedTensorType t = tt(x);
    SmallVector<int64_t> shape(t.getShape());
    shape[axis] = 1;
    auto rt = t.clone(shape);
    auto axes = rw.getDenseI64ArrayAttr({axis});
    if (kind == 0) return rw.create<ReduceSumOp>(loc, rt, x, axes, rw.getUnitAttr());
    if (kind == 1) return rw.create<ReduceMeanOp>(loc, rt, x, axes, rw.getUnitAttr());
    return rw.create<ReduceMaxOp>(loc, rt, x, axes, rw.getUnitAttr());
  }
  Value splat(Value like, double v) {
    RankedTensorType t = tt(like);
    return rw.create<ConstantOp>(loc, DenseElementsAttr::get(t, rw.getFloatAttr(t.getElementType(), v)));
  }
};

// softmax(x) = e / sum(e), e = exp(x - max(x)); log_softmax = (x - m) - log(sum e)
template <typename OpT>
struct DecomposeSoftmax : OpRewritePattern<OpT> {
  using OpRewritePattern<OpT>::OpRewritePattern;
  LogicalResult matchAndRewrite(OpT op, PatternRewriter &rw) const override {
    K k{rw, op.getLoc()};
    Value x = op.getOperand();
    RankedTensorType t = tt(x);
    int64_t axis = op.getAxis();
    Value shifted = rw.create<SubOp>(op.getLoc(), x, k.bcastKeep(k.reduceKeep(x, axis, 2), t));
    Value e = rw.create<ExpOp>(op.getLoc(), shifted);
    Value s = k.bcastKeep(k.reduceKeep(e, axis, 0), t);
    Value r = std::is_same_v<OpT, SoftmaxOp>
                  ? rw.create<DivOp>(op.getLoc(), e, s).getResult()
                  : rw.create<SubOp>(op.getLoc(), shifted, rw.create<LogOp>(op.getLoc(), s)).getResult();
    keepRounding(op, r);
    rw.replaceOp(op, r);
    return success();
  }
};

// (x - mean) * rsqrt(var + eps) * scale + bias over the last axis
struct DecomposeLayerNorm : OpRewritePattern<LayerNormOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(LayerNormOp op, PatternRewriter &rw) const override {
    K k{rw, op.getLoc()};
    Location loc = op.getLoc();
    Value x = op.getOperand();
    RankedTensorType t = tt(x);
    int64_t last = t.getRank() - 1;
    Value xc = rw.create<SubOp>(loc, x, k.bcastKeep(k.reduceKeep(x, last, 1), t));
    Value var = k.reduceKeep(rw.create<MulOp>(loc, xc, xc), last, 1);
    Value rstd = rw.create<RsqrtOp>(loc, rw.create<AddOp>(loc, var, k.splat(var, op.getEpsilon().convertToDouble())));
    Value y = rw.create<MulOp>(loc, xc, k.bcastKeep(rstd, t));
    if (Value g = op.getScale())
      y = rw.create<MulOp>(loc, y, rw.create<BroadcastInDimOp>(loc, t, g, ArrayRef<int64_t>{last}));
    if (Value b = op.getBias())
      y = rw.create<AddOp>(loc, y, rw.create<BroadcastInDimOp>(loc, t, b, ArrayRef<int64_t>{last}));
    keepRounding(op, y);
    rw.replaceOp(op, y);
    return success();
  }
};

// loss_i = -log_softmax(z)_i[t_i], picked with a one-hot select; then
// mean/sum/none
struct DecomposeCrossEntropy : OpRewritePattern<CrossEntropyOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(CrossEntropyOp op, PatternRewriter &rw) const override {
    K k{rw, op.getLoc()};
    Location loc = op.getLoc();
    Value z = op.getLogits(), tgt = op.getTargets();
    RankedTensorType zt = tt(z), ttT = tt(tgt);
    int64_t cls = zt.getRank() - 1;
    Value lsm = rw.create<LogSoftmaxOp>(loc, z, rw.getI64IntegerAttr(cls));
    auto it = zt.clone(ttT.getElementType());
    Value classes = rw.create<IotaOp>(loc, it, rw.getI64IntegerAttr(cls));
    SmallVector<int64_t> lead;
    for (int64_t d = 0; d < cls; ++d)
      lead.push_back(d);
    Value tb = rw.create<BroadcastInDimOp>(loc, it, tgt, lead);
    Value hot = rw.create<CompareOp>(loc, CompareDirection::eq, classes, tb);
    Value picked = rw.create<SelectOp>(loc, hot, lsm, k.splat(lsm, 0.0));
    auto perType = zt.clone(ttT.getShape());
    Value per = rw.create<NegOp>(loc, rw.create<ReduceSumOp>(
        loc, perType, picked, rw.getDenseI64ArrayAttr({cls}), UnitAttr()));
    if (op.getReduction() == LossReduction::none) {
      keepRounding(op, per);
      rw.replaceOp(op, per);
      return success();
    }
    SmallVector<int64_t> all;
    for (int64_t d = 0; d < perType.getRank(); ++d)
      all.push_back(d);
    auto scalarT = RankedTensorType::get({}, zt.getElementType());
    auto axesAttr = rw.getDenseI64ArrayAttr(all);
    Value loss = op.getReduction() == LossReduction::mean
                     ? rw.create<ReduceMeanOp>(loc, scalarT, per, axesAttr, UnitAttr()).getResult()
                     : rw.create<ReduceSumOp>(loc, scalarT, per, axesAttr, UnitAttr()).getResult();
    keepRounding(op, loss);
    rw.replaceOp(op, loss);
    return success();
  }
};

//===----------------------------------------------------------------------===//
// Data movement: slices, padding, concatenation, gather
//===----------------------------------------------------------------------===//

struct LowerSlice : OpRewritePattern<SliceOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(SliceOp op, PatternRewriter &rw) const override {
    SmallVector<int64_t> sizes(op.getType().getShape());
    rw.replaceOpWithNewOp<tensor::ExtractSliceOp>(op, op.getType(), op.getOperand(),
                                                  ValueRange{}, ValueRange{}, ValueRange{},
                                                  op.getStart(), sizes, op.getStride());
    return success();
  }
};

Value filled(PatternRewriter &rw, Location loc, RankedTensorType t, double v) {
  Type et = t.getElementType();
  TypedAttr a = isa<FloatType>(et) ? TypedAttr(rw.getFloatAttr(et, v))
                                   : TypedAttr(rw.getIntegerAttr(et, int64_t(v)));
  Value c = rw.create<arith::ConstantOp>(loc, a);
  return rw.create<linalg::FillOp>(loc, c, emptyLike(rw, loc, t)).getResult(0);
}

// pad: fill with the value, insert the operand with stride interior + 1
struct LowerPad : OpRewritePattern<PadOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(PadOp op, PatternRewriter &rw) const override {
    Value base = filled(rw, op.getLoc(), op.getType(), op.getValue().convertToDouble());
    SmallVector<int64_t> sizes(op.getOperand().getType().getShape()), strides;
    for (int64_t i : op.getInterior())
      strides.push_back(i + 1);
    rw.replaceOpWithNewOp<tensor::InsertSliceOp>(op, op.getOperand(), base, ValueRange{},
                                                 ValueRange{}, ValueRange{}, op.getLow(),
                                                 sizes, strides);
    return success();
  }
};

struct LowerConcat : OpRewritePattern<ConcatOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(ConcatOp op, PatternRewriter &rw) const override {
    Value acc = emptyLike(rw, op.getLoc(), op.getType());
    int64_t offset = 0, dim = op.getDim();
    for (Value in : op.getInputs()) {
      RankedTensorType t = tt(in);
      SmallVector<int64_t> offsets(t.getRank(), 0), sizes(t.getShape()), strides(t.getRank(), 1);
      offsets[dim] = offset;
      acc = rw.create<tensor::InsertSliceOp>(op.getLoc(), in, acc, ValueRange{}, ValueRange{},
                                             ValueRange{}, offsets, sizes, strides);
      offset += t.getDimSize(dim);
    }
    rw.replaceOp(op, acc);
    return success();
  }
};

// gather: a generic over the result that reads the table with tensor.extract
// at (outer dims, clamp(index), inner dims)
struct LowerGather : OpRewritePattern<GatherOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(GatherOp op, PatternRewriter &rw) const override {
    Location loc = op.getLoc();
    RankedTensorType out = op.getType(), table = op.getOperand().getType();
    RankedTensorType idx = op.getIndices().getType();
    int64_t axis = op.getAxis(), ir = idx.getRank();
    SmallVector<AffineExpr> idxExprs;
    for (int64_t i = 0; i < ir; ++i)
      idxExprs.push_back(rw.getAffineDimExpr(axis + i));
    AffineMap idxMap = AffineMap::get(out.getRank(), 0, idxExprs, rw.getContext());
    SmallVector<utils::IteratorType> iters(out.getRank(), utils::IteratorType::parallel);
    Value tableV = op.getOperand();
    Value r = generic(rw, loc, out, op.getIndices(), idxMap, rw.getMultiDimIdentityMap(out.getRank()),
                      iters, emptyLike(rw, loc, out), [&](OpBuilder &b, Location l, ValueRange a) -> Value {
                        Value row = b.create<arith::IndexCastOp>(l, b.getIndexType(), a[0]);
                        Value zero = b.create<arith::ConstantIndexOp>(l, 0);
                        Value maxRow = b.create<arith::ConstantIndexOp>(l, table.getDimSize(axis) - 1);
                        row = b.create<arith::MaxSIOp>(l, zero, b.create<arith::MinSIOp>(l, row, maxRow));
                        SmallVector<Value> at;
                        for (int64_t d = 0; d < axis; ++d)
                          at.push_back(b.create<linalg::IndexOp>(l, d));
                        at.push_back(row);
                        for (int64_t d = axis + 1; d < table.getRank(); ++d)
                          at.push_back(b.create<linalg::IndexOp>(l, d - 1 + ir));
                        return b.create<tensor::ExtractOp>(l, tableV, at);
                      });
    rw.replaceOp(op, r);
    return success();
  }
};

//===----------------------------------------------------------------------===//
// Random numbers and dropout: the counter-based hash of runtime/core/Random.h
// in i64 arithmetic, per element, inside a generic
//===----------------------------------------------------------------------===//

struct Hash {
  OpBuilder &b;
  Location loc;
  Value c(uint64_t v) {
    return b.create<arith::ConstantOp>(loc, b.getI64Type(), b.getIntegerAttr(b.getI64Type(), APInt(64, v)));
  }
  /// random::mix, step by step from its constants.
  Value mix(Value x) {
    x = b.create<arith::AddIOp>(loc, x, c(random::kMixIncrement));
    for (const random::MixRound &r : random::kMixRounds)
      x = b.create<arith::MulIOp>(loc, b.create<arith::XOrIOp>(loc, x, b.create<arith::ShRUIOp>(loc, x, c(r.shift))), c(r.multiplier));
    return b.create<arith::XOrIOp>(loc, x, b.create<arith::ShRUIOp>(loc, x, c(random::kMixFinalShift)));
  }
  /// bits(seed, salt, i) with `keyed` = mix(seed ^ mix(salt)) precomputed.
  Value bits(Value keyed, Value i) { return mix(b.create<arith::AddIOp>(loc, keyed, i)); }
  /// (bits >> 40 [+ 1]) * 2^-24 as f64
  Value unit(Value bitsV, bool plusOne) {
    Value top = b.create<arith::ShRUIOp>(loc, bitsV, c(random::kUnitShift));
    if (plusOne)
      top = b.create<arith::AddIOp>(loc, top, c(1));
    Value f = b.create<arith::UIToFPOp>(loc, b.getF64Type(), top);
    return b.create<arith::MulFOp>(loc, f, fconst(b, loc, b.getF64Type(), random::kUnitScale));
  }
  /// The element's row-major linear index as i64.
  Value linearIndex(RankedTensorType t) {
    Value k = c(0);
    for (int64_t d = 0; d < t.getRank(); ++d) {
      Value i = b.create<arith::IndexCastOp>(loc, b.getI64Type(), b.create<linalg::IndexOp>(loc, d));
      k = b.create<arith::AddIOp>(loc, b.create<arith::MulIOp>(loc, k, c(uint64_t(t.getDimSize(d)))), i);
    }
    return k;
  }
};

/// mix(seed ^ mix(salt)), outside the generic.
Value keyedSeed(PatternRewriter &rw, Location loc, Value seedTensor, int64_t salt) {
  Value seed = rw.create<tensor::ExtractOp>(loc, seedTensor, ValueRange{});
  Hash h{rw, loc};
  return h.mix(rw.create<arith::XOrIOp>(loc, seed, h.c(random::mix(uint64_t(salt)))));
}

struct LowerRandom : OpRewritePattern<RandomOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(RandomOp op, PatternRewriter &rw) const override {
    Location loc = op.getLoc();
    RankedTensorType t = op.getType();
    Value keyed = keyedSeed(rw, loc, op.getSeed(), op.getSalt());
    bool normal = op.getDistribution() == RandomDistribution::normal;
    Value r = elementwise(rw, loc, t, {}, [&](OpBuilder &b, Location l, ValueRange) -> Value {
      Hash h{b, l};
      Value k = h.linearIndex(t);
      Value v;
      if (!normal) {
        v = h.unit(h.bits(keyed, k), false);
      } else { // Box-Muller in f64, as the interpreter
        Value two = h.c(2);
        Value k2 = b.create<arith::MulIOp>(l, k, two);
        Value u1 = h.unit(h.bits(keyed, k2), true);
        Value u2 = h.unit(h.bits(keyed, b.create<arith::AddIOp>(l, k2, h.c(1))), false);
        Type f64 = b.getF64Type();
        Value rad = b.create<math::SqrtOp>(l, b.create<arith::MulFOp>(l, fconst(b, l, f64, -2.0), b.create<math::LogOp>(l, u1)));
        v = b.create<arith::MulFOp>(l, rad, b.create<math::CosOp>(l, b.create<arith::MulFOp>(l, fconst(b, l, f64, random::kTwoPi), u2)));
      }
      Type et = t.getElementType();
      return et.isF64() ? v : b.create<arith::TruncFOp>(l, et, v).getResult();
    });
    rw.replaceOp(op, r);
    return success();
  }
};

struct LowerDropout : OpRewritePattern<DropoutOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(DropoutOp op, PatternRewriter &rw) const override {
    Location loc = op.getLoc();
    RankedTensorType t = op.getType();
    Value keyed = keyedSeed(rw, loc, op.getSeed(), op.getSalt());
    double rate = op.getRate().convertToDouble();
    Value r = elementwise(rw, loc, t, op.getOperand(), [&](OpBuilder &b, Location l, ValueRange a) -> Value {
      Hash h{b, l};
      Value u = h.unit(h.bits(keyed, h.linearIndex(t)), false);
      Value keep = b.create<arith::CmpFOp>(l, arith::CmpFPredicate::OGE, u, fconst(b, l, b.getF64Type(), rate));
      Type et = t.getElementType();
      Value scaled = b.create<arith::MulFOp>(l, a[0], fconst(b, l, et, 1.0 / (1.0 - rate)));
      return b.create<arith::SelectOp>(l, keep, scaled, fconst(b, l, et, 0.0));
    });
    rw.replaceOp(op, r);
    return success();
  }
};

// scatter_add: a loop over index positions j adding updates[:, j, :] into
// result[:, clamp(idx[j]), :] (data-dependent rows: not a linalg.generic).
struct LowerScatterAdd : OpRewritePattern<ScatterAddOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(ScatterAddOp op, PatternRewriter &rw) const override {
    Location loc = op.getLoc();
    RankedTensorType res = op.getType(), idxT = op.getIndices().getType();
    int64_t axis = op.getAxis(), outer = 1, inner = 1, n = res.getDimSize(axis);
    for (int64_t d = 0; d < axis; ++d) outer *= res.getDimSize(d);
    for (int64_t d = axis + 1; d < res.getRank(); ++d) inner *= res.getDimSize(d);
    int64_t m = idxT.getNumElements();
    Type low = res.getElementType(), et = accumulatorType(low);
    auto u3T = RankedTensorType::get({outer, m, inner}, low);
    auto r3T = RankedTensorType::get({outer, n, inner}, et);
    auto rowT = RankedTensorType::get({outer, 1, inner}, et);
    auto uRowT = RankedTensorType::get({outer, 1, inner}, low);
    Value u3 = reshapeVia1D(rw, loc, op.getUpdates(), u3T);
    Value idx = reshapeVia1D(rw, loc, op.getIndices(), RankedTensorType::get({m}, idxT.getElementType()));
    Value init = filled(rw, loc, r3T, 0.0);
    Value lb = rw.create<arith::ConstantIndexOp>(loc, 0);
    Value ub = rw.create<arith::ConstantIndexOp>(loc, m);
    Value one = rw.create<arith::ConstantIndexOp>(loc, 1);
    auto loop = rw.create<scf::ForOp>(loc, lb, ub, one, ValueRange{init},
        [&](OpBuilder &b, Location l, Value j, ValueRange iter) {
          Value acc = iter[0];
          Value raw = b.create<tensor::ExtractOp>(l, idx, ValueRange{j});
          Value row = b.create<arith::IndexCastOp>(l, b.getIndexType(), raw);
          Value zero = b.create<arith::ConstantIndexOp>(l, 0);
          Value last = b.create<arith::ConstantIndexOp>(l, n - 1);
          row = b.create<arith::MaxSIOp>(l, zero, b.create<arith::MinSIOp>(l, row, last));
          SmallVector<OpFoldResult> offU{b.getIndexAttr(0), j, b.getIndexAttr(0)};
          SmallVector<OpFoldResult> offR{b.getIndexAttr(0), row, b.getIndexAttr(0)};
          SmallVector<OpFoldResult> sizes{b.getIndexAttr(outer), b.getIndexAttr(1), b.getIndexAttr(inner)};
          SmallVector<OpFoldResult> strides(3, b.getIndexAttr(1));
          Value u = b.create<tensor::ExtractSliceOp>(l, uRowT, u3, offU, sizes, strides);
          Value cur = b.create<tensor::ExtractSliceOp>(l, rowT, acc, offR, sizes, strides);
          Value sum = elementwise(b, l, rowT, ValueRange{u, cur}, [&](OpBuilder &nb, Location nl, ValueRange a) -> Value {
            Value x = a[0];
            if (low != et)
              x = nb.create<arith::ExtFOp>(nl, et, x);
            return isa<FloatType>(et) ? nb.create<arith::AddFOp>(nl, x, a[1]).getResult()
                                      : nb.create<arith::AddIOp>(nl, x, a[1]).getResult();
          });
          Value next = b.create<tensor::InsertSliceOp>(l, sum, acc, offR, sizes, strides);
          b.create<scf::YieldOp>(l, next);
        });
    Value r = reshapeVia1D(rw, loc, loop.getResult(0), res.clone(et));
    rw.replaceOp(op, endAccumulation(rw, loc, r, res, op));
    return success();
  }
};

//===----------------------------------------------------------------------===//
// kiln.fusion: one loop nest for elementwise kernels, else the members
//===----------------------------------------------------------------------===//

/// The indexing map that reads a broadcast operand (kiln.broadcast_in_dim
/// semantics: size-1 dims are pinned to 0).
} // namespace

AffineMap broadcastMap(Operation *o) {
  auto op = cast<BroadcastInDimOp>(o);
  RankedTensorType in = op.getOperand().getType(), out = op.getType();
  SmallVector<AffineExpr> exprs;
  MLIRContext *ctx = op.getContext();
  for (auto [i, d] : llvm::enumerate(op.getDims()))
    exprs.push_back(in.getDimSize(i) == 1 && out.getDimSize(d) != 1
                        ? getAffineConstantExpr(0, ctx)
                        : getAffineDimExpr(d, ctx));
  return AffineMap::get(out.getRank(), 0, exprs, ctx);
}

namespace {

/// An elementwise fusion as one multi-output linalg.generic: every input is
/// read once per point (through a broadcast map where the fusion
/// broadcasts it), every member is computed once, every output written once.
/// Returns failure (nothing changed) when a member has no scalar form.
LogicalResult lowerSingleLoop(FusionOp f, OpBuilder &b) {
  Location loc = f.getLoc();
  Block &body = f.getBlock();
  RankedTensorType anchor = cast<RankedTensorType>(f.getResult(0).getType());
  int64_t rank = anchor.getRank();
  AffineMap id = b.getMultiDimIdentityMap(rank);
  // Scalar members that only depend on scalar inputs: computed once, before
  // the loop (the patterns lower them).
  IRMapping hoisted;
  for (auto [arg, operand] : llvm::zip(body.getArguments(), f.getOperands()))
    hoisted.map(arg, operand);
  for (Operation &m : body.without_terminator())
    if (isLoopInvariantMember(&m))
      b.clone(m, hoisted);
  // Inputs: (outer value, map), deduplicated.
  SmallVector<Value> ins;
  SmallVector<AffineMap> maps;
  llvm::DenseMap<Value, int> identityIndex;
  llvm::DenseMap<Operation *, int> broadcastIndex;
  for (Operation &m : body.without_terminator()) {
    if (isLoopInvariantMember(&m))
      continue;
    if (auto bc = dyn_cast<BroadcastInDimOp>(m)) {
      Value src = bc.getOperand();
      Value o = hoisted.lookupOrNull(src);
      if (!o) // a dense constant: materialise it once, outside
        o = b.clone(*src.getDefiningOp())->getResult(0);
      broadcastIndex[&m] = int(ins.size());
      ins.push_back(o);
      maps.push_back(broadcastMap(bc));
      continue;
    }
    if (isa<ConstantOp>(m))
      continue;
    for (Value v : m.getOperands())
      if (isa<BlockArgument>(v) && !identityIndex.count(v)) {
        identityIndex[v] = int(ins.size());
        ins.push_back(hoisted.lookup(v));
        maps.push_back(id);
      }
  }
  SmallVector<Value> inits;
  SmallVector<Type> resultTypes;
  for (Value r : f.getResults()) {
    RankedTensorType t = cast<RankedTensorType>(r.getType());
    inits.push_back(emptyLike(b, loc, t));
    resultTypes.push_back(t);
    maps.push_back(id);
  }
  SmallVector<utils::IteratorType> iters(rank, utils::IteratorType::parallel);
  bool ok = true;
  auto generic = b.create<linalg::GenericOp>(
      loc, resultTypes, ins, inits, maps, iters,
      [&](OpBuilder &nb, Location nl, ValueRange args) {
        llvm::DenseMap<Value, Value> scalarOf;
        for (auto [v, i] : identityIndex)
          scalarOf[v] = args[i];
        for (Operation &m : body.without_terminator()) {
          if (isLoopInvariantMember(&m))
            continue;
          Value s;
          if (auto c = dyn_cast<ConstantOp>(m)) {
            auto dense = cast<DenseElementsAttr>(c.getValue());
            if (!dense.isSplat())
              continue; // read through broadcasts only
            s = nb.create<arith::ConstantOp>(nl, cast<TypedAttr>(dense.getSplatValue<Attribute>()));
          } else if (isa<BroadcastInDimOp>(m)) {
            s = args[broadcastIndex[&m]];
          } else {
            SmallVector<Value> operands;
            for (Value v : m.getOperands())
              operands.push_back(scalarOf.lookup(v));
            if (llvm::is_contained(operands, Value())) {
              ok = false;
              break;
            }
            s = scalar(&m, nb, nl, operands);
          }
          if (!s) {
            ok = false;
            break;
          }
          scalarOf[m.getResult(0)] = s;
        }
        SmallVector<Value> yields;
        for (Value v : body.getTerminator()->getOperands()) {
          Value s = ok ? scalarOf.lookup(v) : Value();
          if (!s) {
            ok = false;
            s = nb.create<arith::ConstantOp>(nl, nb.getZeroAttr(getElementTypeOrSelf(v.getType())));
          }
          yields.push_back(s);
        }
        nb.create<linalg::YieldOp>(nl, yields);
      });
  if (!ok) {
    generic->erase();
    return failure(); // the hoisted clones are dead and fold away
  }
  f.replaceAllUsesWith(generic.getResults());
  f->erase();
  return success();
}

/// Replaces a fusion by its members (the lowering patterns take it from
/// there).
void inlineFusion(FusionOp f) {
  Block &body = f.getBlock();
  for (auto [arg, operand] : llvm::zip(body.getArguments(), f.getOperands()))
    arg.replaceAllUsesWith(operand);
  Operation *yield = body.getTerminator();
  SmallVector<Value> values(yield->getOperands());
  for (Operation &m : llvm::make_early_inc_range(body.without_terminator()))
    m.moveBefore(f);
  f.replaceAllUsesWith(values);
  f->erase();
}

} // namespace

void markRoundingPoints(Operation *root) {
  root->walk([](Operation *op) {
    if (!op->getDialect() || !isa<KilnDialect>(op->getDialect()) || isa<FusionOp>(op))
      return;
    if (llvm::any_of(op->getResultTypes(),
                     [](Type t) { return isLowFloat(getElementTypeOrSelf(t)); }))
      op->setAttr(kRoundAttr, UnitAttr::get(op->getContext()));
  });
}

void populateKilnDecompositionPatterns(RewritePatternSet &patterns) {
  patterns.add<DecomposeSoftmax<SoftmaxOp>, DecomposeSoftmax<LogSoftmaxOp>, DecomposeLayerNorm,
               DecomposeCrossEntropy>(patterns.getContext());
}

namespace {

struct KilnLowerToLinalgPass : impl::KilnLowerToLinalgPassBase<KilnLowerToLinalgPass> {
  using KilnLowerToLinalgPassBase::KilnLowerToLinalgPassBase;
  void runOnOperation() override {
    MLIRContext *ctx = &getContext();
    markRoundingPoints(getOperation());
    SmallVector<FusionOp> fusions;
    getOperation()->walk([&](FusionOp f) { fusions.push_back(f); });
    for (FusionOp f : fusions) {
      OpBuilder b(f);
      if (!isSingleLoopFusion(f) || failed(lowerSingleLoop(f, b)))
        inlineFusion(f);
    }
    RewritePatternSet patterns(ctx);
    patterns.add<LowerElementwise, LowerConstant, LowerIota, LowerBroadcast,
                 LowerReduce<ReduceSumOp>, LowerReduce<ReduceMeanOp>,
                 LowerReduce<ReduceMaxOp>, LowerMatmul, LowerTranspose,
                 LowerReshape, DecomposeSoftmax<SoftmaxOp>,
                 DecomposeSoftmax<LogSoftmaxOp>, DecomposeLayerNorm,
                 DecomposeCrossEntropy, LowerSlice, LowerPad, LowerConcat,
                 LowerGather, LowerRandom, LowerDropout, LowerScatterAdd>(ctx);
    GreedyRewriteConfig config;
    config.enableRegionSimplification = GreedySimplifyRegionLevel::Disabled;
    if (failed(applyPatternsAndFoldGreedily(getOperation(), std::move(patterns), config)))
      return signalPassFailure();
    if (allowPartial)
      return;
    bool failedAny = false;
    getOperation()->walk([&](Operation *op) {
      if (op->getDialect() && isa<KilnDialect>(op->getDialect())) {
        op->emitOpError() << "has no CPU lowering yet";
        failedAny = true;
      }
    });
    if (failedAny)
      signalPassFailure();
  }
};

} // namespace
} // namespace kiln
