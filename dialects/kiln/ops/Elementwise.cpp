//===- Elementwise.cpp - The elementwise ops' rules ------------------------===//
//
// kiln.constant, the unary ops (neg ... sin, gelu), cast, the binary ops
// (add ... min), compare and select: verifiers and folders, gradients,
// sharding (by linearity), precision, row locality, index uses, and the
// scalar semantics every back end reads (dialects/kiln/Elementwise.h).
//
// Adding a unary op: its line in KilnOps.td, then here its gradient
// (KILN_UNARY_GRAD), its rules (KILN_ELEMENTWISE_RULES) and its scalar
// semantics entry; the frontend's builtin names it. The CPU, CUDA, emulator
// and reference back ends follow from the scalar entry.
//
//===----------------------------------------------------------------------===//
#include "dialects/kiln/Elementwise.h"
#include "dialects/kiln/ShapeRules.h"
#include "dialects/kiln/ops/Common.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/Matchers.h"
#include "mlir/IR/PatternMatch.h"

#include <fmt/format.h>

#include <cmath>

using namespace mlir;
using namespace kiln;
using namespace kiln::ops;

//===----------------------------------------------------------------------===//
// Verifiers and folders
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
// Gradients
//===----------------------------------------------------------------------===//

#define KILN_UNARY_GRAD(OP, BODY)                                              \
  LogicalResult OP::buildGradients(OpBuilder &b, ArrayRef<Value> grads,        \
                                   SmallVectorImpl<Value> &out) {              \
    return unary(*this, b, grads, out,                                         \
                 [&](G &h, Value x, Value y, Value g) -> Value { BODY });      \
  }

// d(-x) = -g
KILN_UNARY_GRAD(NegOp, return h.neg(g);)
// d|x| = g * sign(x)
KILN_UNARY_GRAD(AbsOp, return h.select(h.cmp(CompareDirection::ge, x, h.zerosLike(x)), g, h.neg(g));)
// d e^x = g * y
KILN_UNARY_GRAD(ExpOp, return h.mul(g, y);)
// d ln x = g / x
KILN_UNARY_GRAD(LogOp, return h.div(g, x);)
// d sqrt x = g / (2 y)
KILN_UNARY_GRAD(SqrtOp, return h.div(g, h.scale(y, 2.0));)
// d x^-1/2 = -1/2 g y / x
KILN_UNARY_GRAD(RsqrtOp, return h.scale(h.div(h.mul(g, y), x), -0.5);)
// d tanh x = g (1 - y^2)
KILN_UNARY_GRAD(TanhOp, return h.mul(g, h.sub(h.splat(y, 1.0), h.mul(y, y)));)
// d sigmoid x = g y (1 - y)
KILN_UNARY_GRAD(SigmoidOp, return h.mul(g, h.mul(y, h.sub(h.splat(y, 1.0), y)));)
// d silu x = g s (1 + x (1 - s)), s = sigmoid(x)
KILN_UNARY_GRAD(SiluOp, {
  Value s = h.b.create<SigmoidOp>(h.loc, x);
  Value one = h.splat(s, 1.0);
  return h.mul(g, h.mul(s, h.add(one, h.mul(x, h.sub(one, s)))));
})
// d relu x = g where x > 0
// d relu(x) = g where x > 0, read off the result (relu(x) > 0 exactly
// where x > 0, NaN included): the backward then keeps no pre-activation,
// and a GEMM + bias + ReLU is one library call on a GPU (cuBLASLt's
// RELU_BIAS epilogue).
KILN_UNARY_GRAD(ReluOp, return h.select(h.cmp(CompareDirection::gt, y, h.zerosLike(y)), g, h.zerosLike(g));)
// d erf x = g 2/sqrt(pi) e^(-x^2)
KILN_UNARY_GRAD(ErfOp, return h.mul(g, h.scale(h.exp(h.neg(h.mul(x, x))), 2.0 / std::sqrt(M_PI)));)
// d cos x = -g sin x
KILN_UNARY_GRAD(CosOp, return h.neg(h.mul(g, h.sin(x)));)
// d sin x = g cos x
KILN_UNARY_GRAD(SinOp, return h.mul(g, h.cos(x));)

// d softplus x = g sigmoid(x)
KILN_UNARY_GRAD(SoftplusOp, return h.mul(g, h.b.create<SigmoidOp>(h.loc, x));)
#undef KILN_UNARY_GRAD

// erf:  d = Phi(x) + x phi(x),  Phi = (1 + erf(x/sqrt2))/2, phi = e^(-x^2/2)/sqrt(2 pi)
// tanh: u = c (x + a x^3), t = tanh u,
//       d = (1 + t)/2 + x/2 (1 - t^2) c (1 + 3 a x^2),  c = sqrt(2/pi), a = 0.044715
LogicalResult GeluOp::buildGradients(OpBuilder &b, ArrayRef<Value> grads,
                                     SmallVectorImpl<Value> &out) {
  G h{b, getLoc()};
  Value g = grads[0], x = getOperand();
  if (!g) {
    out.push_back({});
    return success();
  }
  Value d;
  if (getApproximation() == GeluApproximation::erf) {
    // gelu(x) = x * cdf(x): the backward reads cdf back from the forward's
    // result (y / x) instead of evaluating erf again, the costlier half of
    // the derivative. Where |x| < 1e-20, cdf(x) is 0.5 to float precision
    // and y / x would lose digits to underflow.
    // In f16 (mixed precision) 1e-20 is 0 and x = 0 would give 0 / 0: the
    // threshold is then f16's smallest normal, 6.1e-5, below which
    // cdf = 0.5 is within 3e-5 (f16's unit roundoff is 4.9e-4).
    Value y = getResult();
    double tinyValue = 1e-20;
    if (auto ft = dyn_cast<FloatType>(h.type(x).getElementType()))
      tinyValue = std::max(
          tinyValue, llvm::APFloat::getSmallestNormalized(ft.getFloatSemantics()).convertToDouble());
    Value tiny = h.cmp(CompareDirection::lt, b.create<AbsOp>(getLoc(), x), h.splat(x, tinyValue));
    Value cdf = h.select(tiny, h.splat(x, 0.5), h.div(y, x));
    Value pdf = h.scale(h.exp(h.scale(h.mul(x, x), -0.5)), 1.0 / std::sqrt(2.0 * M_PI));
    d = h.add(cdf, h.mul(x, pdf));
  } else {
    const double c = std::sqrt(2.0 / M_PI), a = 0.044715;
    Value x2 = h.mul(x, x);
    Value u = h.scale(h.add(x, h.scale(h.mul(x2, x), a)), c);
    Value t = h.tanh(u);
    Value one = h.splat(x, 1.0);
    Value left = h.scale(h.add(one, t), 0.5);
    Value sech2 = h.sub(one, h.mul(t, t));
    Value du = h.scale(h.add(one, h.scale(x2, 3.0 * a)), c);
    d = h.add(left, h.mul(h.scale(x, 0.5), h.mul(sech2, du)));
  }
  out.push_back(h.mul(g, d));
  return success();
}

// d cast(x) = cast back (floats only; integers are not differentiable)
LogicalResult CastOp::buildGradients(OpBuilder &b, ArrayRef<Value> grads,
                                     SmallVectorImpl<Value> &out) {
  if (!grads[0] || !isa<FloatType>(getOperand().getType().getElementType()) ||
      !isa<FloatType>(getType().getElementType())) {
    out.push_back({});
    return success();
  }
  out.push_back(b.create<CastOp>(getLoc(), getOperand().getType(), grads[0]));
  return success();
}

// d(a + b) = g, g
LogicalResult AddOp::buildGradients(OpBuilder &b, ArrayRef<Value> grads,
                                    SmallVectorImpl<Value> &out) {
  out.append({grads[0], grads[0]});
  return success();
}

// d(a - b) = g, -g
LogicalResult SubOp::buildGradients(OpBuilder &b, ArrayRef<Value> grads,
                                    SmallVectorImpl<Value> &out) {
  G h{b, getLoc()};
  Value g = grads[0];
  out.append({g, g ? h.neg(g) : Value()});
  return success();
}

// d(a * b) = g b, g a
LogicalResult MulOp::buildGradients(OpBuilder &b, ArrayRef<Value> grads,
                                    SmallVectorImpl<Value> &out) {
  G h{b, getLoc()};
  Value g = grads[0];
  out.append({g ? h.mul(g, getRhs()) : Value(), g ? h.mul(g, getLhs()) : Value()});
  return success();
}

// d(a / b) = g / b, -g y / b
LogicalResult DivOp::buildGradients(OpBuilder &b, ArrayRef<Value> grads,
                                    SmallVectorImpl<Value> &out) {
  G h{b, getLoc()};
  Value g = grads[0];
  if (!g || !isa<FloatType>(getType().getElementType())) {
    out.append({Value(), Value()});
    return success();
  }
  out.append({h.div(g, getRhs()), h.neg(h.div(h.mul(g, getResult()), getRhs()))});
  return success();
}

// d(a ^ b) = g b a^(b-1), g y ln a
LogicalResult PowOp::buildGradients(OpBuilder &b, ArrayRef<Value> grads,
                                    SmallVectorImpl<Value> &out) {
  G h{b, getLoc()};
  Value g = grads[0], a = getLhs(), e = getRhs();
  if (!g) {
    out.append({Value(), Value()});
    return success();
  }
  Value da = h.mul(g, h.mul(e, b.create<PowOp>(getLoc(), a, h.sub(e, h.splat(e, 1.0)))));
  Value de = h.mul(g, h.mul(getResult(), h.log(a)));
  out.append({da, de});
  return success();
}

// Ties go to the lhs: d max(a, b) = g where a >= b, g where a < b, and
// d min(a, b) = g where a <= b, g where a > b.
template <typename OpT>
static LogicalResult extremumGradients(OpT op, CompareDirection takeLhs,
                                       OpBuilder &b, ArrayRef<Value> grads,
                                       SmallVectorImpl<Value> &out) {
  G h{b, op.getLoc()};
  Value g = grads[0];
  if (!g || !isa<FloatType>(op.getType().getElementType())) {
    out.append({Value(), Value()});
    return success();
  }
  Value takeA = h.cmp(takeLhs, op.getLhs(), op.getRhs());
  Value z = h.zerosLike(g);
  out.append({h.select(takeA, g, z), h.select(takeA, z, g)});
  return success();
}

LogicalResult MaxOp::buildGradients(OpBuilder &b, ArrayRef<Value> grads,
                                    SmallVectorImpl<Value> &out) {
  return extremumGradients(*this, CompareDirection::ge, b, grads, out);
}

LogicalResult MinOp::buildGradients(OpBuilder &b, ArrayRef<Value> grads,
                                    SmallVectorImpl<Value> &out) {
  return extremumGradients(*this, CompareDirection::le, b, grads, out);
}

// d select(p, a, b) = -, g where p, g where !p
LogicalResult SelectOp::buildGradients(OpBuilder &b, ArrayRef<Value> grads,
                                       SmallVectorImpl<Value> &out) {
  G h{b, getLoc()};
  Value g = grads[0];
  if (!g || !isa<FloatType>(getType().getElementType())) {
    out.append({Value(), Value(), Value()});
    return success();
  }
  Value z = h.zerosLike(g);
  out.append({Value(), h.select(getPred(), g, z), h.select(getPred(), z, g)});
  return success();
}

//===----------------------------------------------------------------------===//
// Sharding
//===----------------------------------------------------------------------===//

/// Elementwise: split operands agree (replicated ones are taken as the local
/// slice); partial sums pass through linear ops only.
ShardingResult kiln::ops::elementwiseShardings(Operation *op, ArrayRef<Opt> in,
                                               Linearity linearity) {
  int64_t rank = rankOf(op->getResult(0));
  TensorSharding out = TensorSharding::replicated(rank);
  bool haveSplit = false;
  SmallVector<int> partialAt;
  for (auto [i, s] : llvm::enumerate(in)) {
    if (!s)
      return std::nullopt;
    if (!s->partial.empty())
      partialAt.push_back(int(i));
    TensorSharding noPartial = *s;
    noPartial.partial.clear();
    if (noPartial.isReplicated())
      continue;
    if (int64_t(s->split.size()) != rank)
      return std::nullopt;
    if (haveSplit && noPartial.split != out.split)
      return std::nullopt;
    out.split = noPartial.split;
    haveSplit = true;
  }
  if (partialAt.empty())
    return one(out);
  const TensorSharding &p = *in[partialAt[0]];
  bool linear = false;
  switch (linearity) {
  case Linearity::None:
    break;
  case Linearity::Unary:
    linear = true;
    break;
  case Linearity::Sum:
    linear = partialAt.size() == in.size() &&
             llvm::all_of(in, [&](const Opt &o) { return o->partial == p.partial; });
    break;
  case Linearity::OneFactor:
    linear = partialAt.size() == 1;
    break;
  case Linearity::Numerator:
    linear = partialAt.size() == 1 && partialAt[0] == 0;
    break;
  }
  if (!linear || haveSplit)
    return std::nullopt;
  out.partial = p.partial;
  return one(out);
}

//===----------------------------------------------------------------------===//
// Sharding, precision, row locality and index uses
//===----------------------------------------------------------------------===//

namespace {
using P = PrecisionClass;
using R = PrecisionRule;
using namespace kiln::precision;
constexpr PrecisionPolicy kRsqrt{P::Low, R::Elementwise, P::Fp32, R::AutocastFp32};
constexpr PrecisionPolicy kCast{P::Keep, R::UserCast, P::Keep, R::UserCast};
constexpr PrecisionPolicy kPromote{P::Promote, R::None, P::Promote, R::None};
} // namespace

KILN_ELEMENTWISE_RULES(NegOp, Linearity::Unary, kElementwise)
KILN_ELEMENTWISE_RULES(AbsOp, Linearity::None, kElementwise)
KILN_ELEMENTWISE_RULES(ExpOp, Linearity::None, kExpLogPow)
KILN_ELEMENTWISE_RULES(LogOp, Linearity::None, kExpLogPow)
KILN_ELEMENTWISE_RULES(SqrtOp, Linearity::None, kElementwise)
KILN_ELEMENTWISE_RULES(RsqrtOp, Linearity::None, kRsqrt)
KILN_ELEMENTWISE_RULES(TanhOp, Linearity::None, kActivation)
KILN_ELEMENTWISE_RULES(SigmoidOp, Linearity::None, kActivation)
KILN_ELEMENTWISE_RULES(SiluOp, Linearity::None, kActivation)
KILN_ELEMENTWISE_RULES(ReluOp, Linearity::None, kActivation)
KILN_ELEMENTWISE_RULES(ErfOp, Linearity::None, kActivation)
KILN_ELEMENTWISE_RULES(CosOp, Linearity::None, kActivation)
KILN_ELEMENTWISE_RULES(SinOp, Linearity::None, kActivation)
KILN_ELEMENTWISE_RULES(SoftplusOp, Linearity::None, kActivation)
KILN_ELEMENTWISE_RULES(GeluOp, Linearity::None, kActivation)
KILN_ELEMENTWISE_RULES(AddOp, Linearity::Sum, kElementwise)
KILN_ELEMENTWISE_RULES(SubOp, Linearity::Sum, kElementwise)
KILN_ELEMENTWISE_RULES(MulOp, Linearity::OneFactor, kElementwise)
KILN_ELEMENTWISE_RULES(DivOp, Linearity::Numerator, kElementwise)
KILN_ELEMENTWISE_RULES(PowOp, Linearity::None, kExpLogPow)
KILN_ELEMENTWISE_RULES(MaxOp, Linearity::None, kElementwise)
KILN_ELEMENTWISE_RULES(MinOp, Linearity::None, kElementwise)
KILN_ELEMENTWISE_RULES(SelectOp, Linearity::None, kElementwise)

// A constant is the same on every device and needs no rows.
ShardingResult ConstantOp::inferResultShardings(ArrayRef<Opt>) {
  return replicatedShardings(getOperation());
}
PrecisionPolicy ConstantOp::getPrecisionPolicy() { return kFollow; }
RowLocality ConstantOp::getRowLocality() { return noRows(getOperation()); }
IndexUse ConstantOp::getIndexUse(unsigned) { return IndexUse::none(); }

// A cast is linear; an integer cast moves an index unchanged.
ShardingResult CastOp::inferResultShardings(ArrayRef<Opt> in) {
  return elementwiseShardings(getOperation(), in, Linearity::Unary);
}
PrecisionPolicy CastOp::getPrecisionPolicy() { return kCast; }
RowLocality CastOp::getRowLocality() { return allRows(getOperation()); }
IndexUse CastOp::getIndexUse(unsigned) {
  return isa<IntegerType>(getType().getElementType()) ? IndexUse::follow() : IndexUse::none();
}

// An equality against a kiln.iota is a one-hot of class indices (nll_loss,
// cross_entropy on probabilities: docs/language.md): the other side takes
// [0, the iota's size along its dimension).
ShardingResult CompareOp::inferResultShardings(ArrayRef<Opt> in) {
  return elementwiseShardings(getOperation(), in, Linearity::None);
}
PrecisionPolicy CompareOp::getPrecisionPolicy() { return kPromote; }
RowLocality CompareOp::getRowLocality() { return allRows(getOperation()); }
IndexUse CompareOp::getIndexUse(unsigned operand) {
  if (getDirection() != CompareDirection::eq)
    return IndexUse::none();
  Value other = getOperation()->getOperand(1 - operand);
  auto iota = other.getDefiningOp<IotaOp>();
  if (!iota)
    return IndexUse::none();
  int64_t hi = cast<RankedTensorType>(other.getType()).getDimSize(iota.getDim());
  return IndexUse::bounded(hi, fmt::format("class indices against kiln.iota ({} classes)", hi));
}

//===----------------------------------------------------------------------===//
// Scalar semantics (dialects/kiln/Elementwise.h)
//===----------------------------------------------------------------------===//

namespace kiln::elementwise_table {

std::string cudaFloatLiteral(double v, bool isDouble) {
  if (std::isnan(v))
    return isDouble ? "__longlong_as_double(0x7ff8000000000000ll)" : "__int_as_float(0x7fc00000)";
  if (std::isinf(v))
    return v > 0 ? (isDouble ? "__longlong_as_double(0x7ff0000000000000ll)"
                             : "__int_as_float(0x7f800000)")
                 : (isDouble ? "__longlong_as_double(0xfff0000000000000ll)"
                             : "__int_as_float(0xff800000)");
  std::string s = fmt::format("{:.17g}", v);
  if (s.find_first_of(".eE") == std::string::npos)
    s += ".0";
  return isDouble ? s : s + "f";
}

std::string CudaOperands::fn(const char *name) const {
  return fmt::format("{}{}({})", name, suffix(), a[0]);
}

Value ScalarOperands::f(double v) const {
  return b.create<arith::ConstantOp>(loc, t, b.getFloatAttr(t, v));
}

Value ScalarOperands::i(int64_t v) const {
  return b.create<arith::ConstantOp>(loc, t, b.getIntegerAttr(t, v));
}

namespace {

double gelu(double x, bool tanhForm) {
  if (!tanhForm)
    return 0.5 * x * (1.0 + std::erf(x * M_SQRT1_2));
  const double c = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
}

/// A float op with an integer twin: picks by the operand type.
template <typename F, typename I> Value fi(const ScalarOperands &s) {
  return s.isFloat ? s.b.create<F>(s.loc, s.a[0], s.a[1]).getResult()
                   : s.b.create<I>(s.loc, s.a[0], s.a[1]).getResult();
}

using S = const ScalarOperands &;
using C = const CudaOperands &;

const Entry kEntries[] = {
    // --- unary ----------------------------------------------------------
    {"kiln.neg", 1, [](double x, double) { return -x; },
     [](C c) { return "(-" + c.a[0] + ")"; },
     [](S s) {
       return s.isFloat ? s.b.create<arith::NegFOp>(s.loc, s.a[0]).getResult()
                        : s.b.create<arith::SubIOp>(s.loc, s.i(0), s.a[0]).getResult();
     }},
    {"kiln.abs", 1, [](double x, double) { return std::fabs(x); },
     [](C c) { return c.isFloat ? c.fn("fabs") : fmt::format("({0} < 0 ? -{0} : {0})", c.a[0]); },
     [](S s) {
       return s.isFloat ? s.b.create<math::AbsFOp>(s.loc, s.a[0]).getResult()
                        : s.b.create<math::AbsIOp>(s.loc, s.a[0]).getResult();
     }},
    {"kiln.exp", 1, [](double x, double) { return std::exp(x); },
     [](C c) { return c.fn("exp"); },
     [](S s) -> Value { return s.b.create<math::ExpOp>(s.loc, s.a[0]); }},
    {"kiln.log", 1, [](double x, double) { return std::log(x); },
     [](C c) { return c.fn("log"); },
     [](S s) -> Value { return s.b.create<math::LogOp>(s.loc, s.a[0]); }},
    {"kiln.sqrt", 1, [](double x, double) { return std::sqrt(x); },
     [](C c) { return c.fn("sqrt"); },
     [](S s) -> Value { return s.b.create<math::SqrtOp>(s.loc, s.a[0]); }},
    // 1 / sqrt(x): math.rsqrt has no LLVM lowering in MLIR 19
    {"kiln.rsqrt", 1, [](double x, double) { return 1.0 / std::sqrt(x); },
     [](C c) { return fmt::format("({} / {})", c.lit(1.0), c.fn("sqrt")); },
     [](S s) -> Value {
       return s.b.create<arith::DivFOp>(s.loc, s.f(1.0), s.b.create<math::SqrtOp>(s.loc, s.a[0]));
     }},
    {"kiln.tanh", 1, [](double x, double) { return std::tanh(x); },
     [](C c) { return c.fn("tanh"); },
     [](S s) -> Value { return s.b.create<math::TanhOp>(s.loc, s.a[0]); }},
    {"kiln.erf", 1, [](double x, double) { return std::erf(x); },
     [](C c) { return c.fn("erf"); },
     [](S s) -> Value { return s.b.create<math::ErfOp>(s.loc, s.a[0]); }},
    {"kiln.cos", 1, [](double x, double) { return std::cos(x); },
     [](C c) { return c.fn("cos"); },
     [](S s) -> Value { return s.b.create<math::CosOp>(s.loc, s.a[0]); }},
    {"kiln.sin", 1, [](double x, double) { return std::sin(x); },
     [](C c) { return c.fn("sin"); },
     [](S s) -> Value { return s.b.create<math::SinOp>(s.loc, s.a[0]); }},
    // 1 / (1 + e^-x)
    {"kiln.sigmoid", 1, [](double x, double) { return 1.0 / (1.0 + std::exp(-x)); },
     [](C c) {
       return fmt::format("({} / ({} + {}{}(-{})))", c.lit(1.0), c.lit(1.0), "exp", c.suffix(),
                          c.a[0]);
     },
     [](S s) -> Value {
       return s.b.create<arith::DivFOp>(
           s.loc, s.f(1.0),
           s.b.create<arith::AddFOp>(
               s.loc, s.f(1.0),
               s.b.create<math::ExpOp>(s.loc, s.b.create<arith::NegFOp>(s.loc, s.a[0]))));
     }},
    // x / (1 + e^-x) (SiLU, swish)
    {"kiln.silu", 1, [](double x, double) { return x / (1.0 + std::exp(-x)); },
     [](C c) {
       return fmt::format("({} / ({} + exp{}(-{})))", c.a[0], c.lit(1.0), c.suffix(), c.a[0]);
     },
     [](S s) -> Value {
       return s.b.create<arith::DivFOp>(
           s.loc, s.a[0],
           s.b.create<arith::AddFOp>(
               s.loc, s.f(1.0),
               s.b.create<math::ExpOp>(s.loc, s.b.create<arith::NegFOp>(s.loc, s.a[0]))));
     }},
    // max(x, 0); NaN stays NaN (arith.maximumf)
    // max(x, 0) + log1p(e^-|x|): no overflow for large x, and e^x to full
    // precision for very negative x (PyTorch's softplus with beta = 1 and no
    // threshold).
    {"kiln.softplus", 1,
     [](double x, double) { return std::max(x, 0.0) + std::log1p(std::exp(-std::fabs(x))); },
     [](C c) {
       return fmt::format("(fmax{0}({1}, {2}) + log1p{0}(exp{0}(-fabs{0}({1}))))", c.suffix(),
                          c.a[0], c.lit(0.0));
     },
     [](S s) -> Value {
       Value e = s.b.create<math::ExpOp>(
           s.loc, s.b.create<arith::NegFOp>(s.loc, s.b.create<math::AbsFOp>(s.loc, s.a[0])));
       return s.b.create<arith::AddFOp>(s.loc,
                                        s.b.create<arith::MaximumFOp>(s.loc, s.a[0], s.f(0.0)),
                                        s.b.create<math::Log1pOp>(s.loc, e));
     }},
    {"kiln.relu", 1, [](double x, double) { return (x != x || x > 0) ? x : 0.0; },
     [](C c) {
       return c.isFloat ? fmt::format("(({0} != {0} || {0} > {1}) ? {0} : {1})", c.a[0], c.lit(0.0))
                        : fmt::format("({0} > 0 ? {0} : 0)", c.a[0]);
     },
     [](S s) {
       return s.isFloat ? s.b.create<arith::MaximumFOp>(s.loc, s.a[0], s.f(0.0)).getResult()
                        : s.b.create<arith::MaxSIOp>(s.loc, s.a[0], s.i(0)).getResult();
     }},
    // x Phi(x) = x/2 (1 + erf(x / sqrt 2))
    {"kiln.gelu(erf)", 1, [](double x, double) { return gelu(x, false); },
     [](C c) {
       return fmt::format("({1} * {0} * ({2} + erf{4}({0} * {3})))", c.a[0], c.lit(0.5),
                          c.lit(1.0), c.lit(M_SQRT1_2), c.suffix());
     },
     [](S s) -> Value {
       Value x = s.a[0], half = s.f(0.5);
       Value inner =
           s.b.create<math::ErfOp>(s.loc, s.b.create<arith::MulFOp>(s.loc, x, s.f(M_SQRT1_2)));
       return s.b.create<arith::MulFOp>(s.loc, s.b.create<arith::MulFOp>(s.loc, half, x),
                                        s.b.create<arith::AddFOp>(s.loc, s.f(1.0), inner));
     }},
    // x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    {"kiln.gelu(tanh)", 1, [](double x, double) { return gelu(x, true); },
     [](C c) {
       return fmt::format("({1} * {0} * ({2} + tanh{5}({3} * ({0} + {4} * {0} * {0} * {0}))))",
                          c.a[0], c.lit(0.5), c.lit(1.0), c.lit(std::sqrt(2.0 / M_PI)),
                          c.lit(0.044715), c.suffix());
     },
     [](S s) -> Value {
       Value x = s.a[0], half = s.f(0.5);
       Value x3 = s.b.create<arith::MulFOp>(s.loc, x, s.b.create<arith::MulFOp>(s.loc, x, x));
       Value u = s.b.create<arith::MulFOp>(
           s.loc, s.f(std::sqrt(2.0 / M_PI)),
           s.b.create<arith::AddFOp>(s.loc, x,
                                     s.b.create<arith::MulFOp>(s.loc, s.f(0.044715), x3)));
       Value inner = s.b.create<math::TanhOp>(s.loc, u);
       return s.b.create<arith::MulFOp>(s.loc, s.b.create<arith::MulFOp>(s.loc, half, x),
                                        s.b.create<arith::AddFOp>(s.loc, s.f(1.0), inner));
     }},
    // --- binary ---------------------------------------------------------
    {"kiln.add", 2, [](double x, double y) { return x + y; },
     [](C c) { return fmt::format("({} + {})", c.a[0], c.a[1]); },
     [](S s) { return fi<arith::AddFOp, arith::AddIOp>(s); }},
    {"kiln.sub", 2, [](double x, double y) { return x - y; },
     [](C c) { return fmt::format("({} - {})", c.a[0], c.a[1]); },
     [](S s) { return fi<arith::SubFOp, arith::SubIOp>(s); }},
    {"kiln.mul", 2, [](double x, double y) { return x * y; },
     [](C c) { return fmt::format("({} * {})", c.a[0], c.a[1]); },
     [](S s) { return fi<arith::MulFOp, arith::MulIOp>(s); }},
    {"kiln.div", 2, [](double x, double y) { return x / y; },
     [](C c) { return fmt::format("({} / {})", c.a[0], c.a[1]); },
     [](S s) { return fi<arith::DivFOp, arith::DivSIOp>(s); }},
    {"kiln.pow", 2, [](double x, double y) { return std::pow(x, y); },
     [](C c) { return fmt::format("pow{}({}, {})", c.suffix(), c.a[0], c.a[1]); },
     [](S s) -> Value { return s.b.create<math::PowFOp>(s.loc, s.a[0], s.a[1]); }},
    // NaN if either operand is NaN (arith.maximumf / minimumf)
    {"kiln.max", 2,
     [](double x, double y) { return std::isnan(x) || std::isnan(y) ? NAN : std::max(x, y); },
     [](C c) {
       return c.isFloat ? fmt::format("{}({}, {})", c.isDouble ? "kiln_maxd" : "kiln_maxf", c.a[0], c.a[1])
                        : fmt::format("max({}, {})", c.a[0], c.a[1]);
     },
     [](S s) { return fi<arith::MaximumFOp, arith::MaxSIOp>(s); }},
    {"kiln.min", 2,
     [](double x, double y) { return std::isnan(x) || std::isnan(y) ? NAN : std::min(x, y); },
     [](C c) {
       return c.isFloat ? fmt::format("{}({}, {})", c.isDouble ? "kiln_mind" : "kiln_minf", c.a[0], c.a[1])
                        : fmt::format("min({}, {})", c.a[0], c.a[1]);
     },
     [](S s) { return fi<arith::MinimumFOp, arith::MinSIOp>(s); }},
};

} // namespace

llvm::ArrayRef<Entry> entries() { return kEntries; }

const Entry *lookup(Operation *op) {
  llvm::StringRef name = op->getName().getStringRef();
  std::string key = name.str();
  if (auto g = dyn_cast<GeluOp>(op))
    key += g.getApproximation() == GeluApproximation::erf ? "(erf)" : "(tanh)";
  for (const Entry &e : kEntries)
    if (key == e.name)
      return &e;
  return nullptr;
}

} // namespace kiln::elementwise_table
