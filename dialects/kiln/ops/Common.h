//===- Common.h - Helpers of the op family files ---------------*- C++ -*-===//
//
// Private to dialects/kiln/ops/: the builder the gradient rules are written
// with, the folders' splat helpers, and the shared rule pieces (row
// locality, sharding) with the macros that declare the common answers.
// Each family file (Elementwise, Shape, Reduction, Indexing, Composite,
// Collective) holds every rule of its ops: verifier, folder, gradient,
// sharding, precision, row locality, index use and cost.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_DIALECTS_KILN_OPS_COMMON_H
#define KILN_DIALECTS_KILN_OPS_COMMON_H

#include "dialects/kiln/KilnOps.h"
#include "dialects/kiln/OpRules.h"

#include "mlir/IR/Builders.h"

#include <algorithm>
#include <optional>

namespace kiln::ops {

using namespace mlir;
using Loc = std::optional<Location>;

//===----------------------------------------------------------------------===//
// Verifiers and folders
//===----------------------------------------------------------------------===//

/// Operand types are only checked by the verifier, which runs after type
/// inference when parsing: inference must therefore cope with any type.
inline LogicalResult ranked(Loc loc, Value v, StringRef what, RankedTensorType &out) {
  out = v ? dyn_cast<RankedTensorType>(v.getType()) : RankedTensorType();
  if (!out || !out.hasStaticShape())
    return emitOptionalError(loc, what, " must be a statically shaped tensor");
  return success();
}

inline SplatElementsAttr splat(Attribute a) {
  return dyn_cast_if_present<SplatElementsAttr>(a);
}

inline bool isSplatOf(Attribute a, double value) {
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
inline OpFoldResult reshapeSplat(Attribute operand, Type resultType) {
  if (SplatElementsAttr s = splat(operand))
    return SplatElementsAttr::get(cast<ShapedType>(resultType),
                                  s.getSplatValue<Attribute>());
  return {};
}

//===----------------------------------------------------------------------===//
// Gradients
//===----------------------------------------------------------------------===//

/// Small builder helpers so each rule reads like its formula.
struct G {
  OpBuilder &b;
  Location loc;

  RankedTensorType type(Value v) { return cast<RankedTensorType>(v.getType()); }
  Value add(Value x, Value y) { return b.create<AddOp>(loc, x, y); }
  Value sub(Value x, Value y) { return b.create<SubOp>(loc, x, y); }
  Value mul(Value x, Value y) { return b.create<MulOp>(loc, x, y); }
  Value div(Value x, Value y) { return b.create<DivOp>(loc, x, y); }
  Value neg(Value x) { return b.create<NegOp>(loc, x); }
  Value exp(Value x) { return b.create<ExpOp>(loc, x); }
  Value log(Value x) { return b.create<LogOp>(loc, x); }
  Value tanh(Value x) { return b.create<TanhOp>(loc, x); }
  Value erf(Value x) { return b.create<ErfOp>(loc, x); }
  Value sin(Value x) { return b.create<SinOp>(loc, x); }
  Value cos(Value x) { return b.create<CosOp>(loc, x); }
  /// A constant with x's type, every element `v`.
  Value splat(Value like, double v) {
    RankedTensorType t = type(like);
    Attribute a = isa<FloatType>(t.getElementType())
                      ? Attribute(FloatAttr::get(t.getElementType(), v))
                      : Attribute(IntegerAttr::get(t.getElementType(),
                                                   static_cast<int64_t>(v)));
    return b.create<ConstantOp>(loc, DenseElementsAttr::get(t, a));
  }
  Value scale(Value x, double v) { return mul(x, splat(x, v)); }
  /// Mixed precision: a bf16/f16 value as f32 (a kiln.cast carrying the
  /// op's policy rule, passes/Precision.h), so rules whose statistics must
  /// stay fp32 compute in f32; any other value unchanged.
  Value toF32(Value x, StringRef rule) {
    if (!x || !isHalf(x))
      return x;
    auto c = b.create<CastOp>(loc, type(x).clone(b.getF32Type()), x);
    c->setAttr("kiln.precision.rule", b.getStringAttr(rule));
    return c;
  }
  /// `x` (f32) back in `like`'s element type.
  Value toTypeOf(Value x, Value like, StringRef rule) {
    if (!x || type(x).getElementType() == type(like).getElementType())
      return x;
    auto c = b.create<CastOp>(loc, type(x).clone(type(like).getElementType()), x);
    c->setAttr("kiln.precision.rule", b.getStringAttr(rule));
    return c;
  }
  bool isHalf(Value x) {
    Type e = type(x).getElementType();
    return e.isBF16() || e.isF16();
  }
  Value cmp(CompareDirection d, Value x, Value y) {
    return b.create<CompareOp>(loc, d, x, y);
  }
  Value select(Value p, Value x, Value y) {
    return b.create<SelectOp>(loc, p, x, y);
  }
  Value zerosLike(Value x) { return splat(x, 0.0); }
  Value reshape(Value x, RankedTensorType t) {
    if (x.getType() == t)
      return x;
    return b.create<ReshapeOp>(loc, t, x);
  }
  Value transpose(Value x, ArrayRef<int64_t> perm) {
    return b.create<TransposeOp>(loc, x, perm);
  }
  /// Sums over `axes` (any order), dropping them.
  Value sum(Value x, SmallVector<int64_t> axes, bool keepdims = false) {
    if (axes.empty())
      return x;
    llvm::sort(axes);
    RankedTensorType t = type(x);
    SmallVector<int64_t> shape;
    for (int64_t d = 0; d < t.getRank(); ++d) {
      if (!llvm::is_contained(axes, d))
        shape.push_back(t.getDimSize(d));
      else if (keepdims)
        shape.push_back(1);
    }
    return b.create<ReduceSumOp>(loc, t.clone(shape), x,
                                 b.getDenseI64ArrayAttr(axes),
                                 keepdims ? b.getUnitAttr() : UnitAttr());
  }
  /// Broadcasts x (whose dims map to `dims` of `to`) to `to`.
  Value broadcast(Value x, RankedTensorType to, ArrayRef<int64_t> dims) {
    if (x.getType() == to)
      return x;
    return b.create<BroadcastInDimOp>(loc, to, x, dims);
  }
  /// Broadcasts a keepdims-shaped x (same rank, 1s on reduced axes) to `to`.
  Value expand(Value x, RankedTensorType to) {
    SmallVector<int64_t> dims;
    for (int64_t d = 0; d < to.getRank(); ++d)
      dims.push_back(d);
    return broadcast(x, to, dims);
  }
  /// Sums the leading dims of `g` so it has `targetRank` dims.
  Value sumLeading(Value g, int64_t targetRank) {
    SmallVector<int64_t> axes;
    for (int64_t d = 0; d < type(g).getRank() - targetRank; ++d)
      axes.push_back(d);
    return sum(g, axes);
  }
  Value matmul(Value x, Value y, bool tx, bool ty) {
    return b.create<MatmulOp>(loc, x, y, tx ? b.getUnitAttr() : UnitAttr(),
                              ty ? b.getUnitAttr() : UnitAttr());
  }
};

/// Rules of elementwise ops with one operand, in terms of x, y = f(x), g.
template <typename OpT, typename Fn>
LogicalResult unary(OpT op, OpBuilder &b, ArrayRef<Value> grads,
                    SmallVectorImpl<Value> &out, Fn rule) {
  G h{b, op.getLoc()};
  out.push_back(grads[0] ? rule(h, op.getOperand(), op.getResult(), grads[0])
                         : Value());
  return success();
}

//===----------------------------------------------------------------------===//
// Rule pieces (Common.cpp)
//===----------------------------------------------------------------------===//

using Opt = OperandSharding;

int64_t rankOf(Value v);
/// One result's sharding.
ShardingResult one(TensorSharding s);
/// Every result replicated (constants, index functions).
ShardingResult replicatedShardings(Operation *op);
/// Elementwise ops: split operands agree (replicated ones are taken as the
/// local slice); partial sums pass through where the op is linear
/// (ops/Elementwise.cpp).
ShardingResult elementwiseShardings(Operation *op, ArrayRef<Opt> in, Linearity linear);

/// Row-local over every dimension of the result, every operand read by rows.
RowLocality allRows(Operation *op);
/// Row-local over no dimension: the op needs its whole input (a GEMM, a
/// collective, a constant).
RowLocality noRows(Operation *op);
/// Row-local over the first `rows` dimensions, every operand by rows.
RowLocality firstRows(Operation *op, int64_t rows);

} // namespace kiln::ops

/// The rules of an elementwise op: sharding by its linearity, precision
/// `POLICY`, row-local over every dimension, no index operand.
#define KILN_ELEMENTWISE_RULES(OP, LINEARITY, POLICY)                          \
  ::kiln::ShardingResult OP::inferResultShardings(                             \
      ::llvm::ArrayRef<::kiln::OperandSharding> in) {                          \
    return ::kiln::ops::elementwiseShardings(getOperation(), in, LINEARITY);   \
  }                                                                            \
  ::kiln::PrecisionPolicy OP::getPrecisionPolicy() { return POLICY; }          \
  ::kiln::RowLocality OP::getRowLocality() {                                   \
    return ::kiln::ops::allRows(getOperation());                               \
  }                                                                            \
  ::kiln::IndexUse OP::getIndexUse(unsigned) { return ::kiln::IndexUse::none(); }

#endif // KILN_DIALECTS_KILN_OPS_COMMON_H
