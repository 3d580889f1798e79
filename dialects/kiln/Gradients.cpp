//===- Gradients.cpp - Reverse-mode rules of kiln ops ---------------------===//
//
// One buildGradients() per differentiable op (GradientOpInterface). Each gets
// the gradient of the loss with respect to the op's result (`g`) and returns
// one gradient per operand, or null for operands that are not differentiable
// (indices, predicates, seeds). Rules use kiln ops only, so the train step
// stays in the dialect and fuses like the forward pass.
//
//===----------------------------------------------------------------------===//
#include "dialects/kiln/KilnOps.h"

#include "mlir/IR/Builders.h"

#include <algorithm>
#include <cmath>

using namespace mlir;
using namespace kiln;

namespace {

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

} // namespace

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

// d softmax = y (g - sum(g y))   along the axis
LogicalResult SoftmaxOp::buildGradients(OpBuilder &b, ArrayRef<Value> grads,
                                        SmallVectorImpl<Value> &out) {
  G h{b, getLoc()};
  Value g = grads[0], y = getResult();
  if (!g) {
    out.push_back({});
    return success();
  }
  // bf16/f16 (mixed precision): the dot product and the difference in f32.
  constexpr llvm::StringLiteral rule = "softmax-fp32-stats";
  Value y0 = y;
  g = h.toF32(g, rule);
  y = h.toF32(y, rule);
  Value dot = h.expand(h.sum(h.mul(g, y), {int64_t(getAxis())}, true), h.type(y));
  out.push_back(h.toTypeOf(h.mul(y, h.sub(g, dot)), y0, rule));
  return success();
}

// d log_softmax = g - e^y sum(g)   along the axis
LogicalResult LogSoftmaxOp::buildGradients(OpBuilder &b, ArrayRef<Value> grads,
                                           SmallVectorImpl<Value> &out) {
  G h{b, getLoc()};
  Value g = grads[0], y = getResult();
  if (!g) {
    out.push_back({});
    return success();
  }
  Value s = h.expand(h.sum(g, {int64_t(getAxis())}, true), h.type(y));
  out.push_back(h.sub(g, h.mul(h.exp(y), s)));
  return success();
}

// xh = (x - mean) rstd, y = xh gamma + beta:
//   dbeta = sum g, dgamma = sum g xh, dxh = g gamma,
//   dx = rstd (dxh - mean(dxh) - xh mean(dxh xh))     (means over the last axis)
LogicalResult LayerNormOp::buildGradients(OpBuilder &b, ArrayRef<Value> grads,
                                          SmallVectorImpl<Value> &out) {
  G h{b, getLoc()};
  Value g = grads[0], x = getOperand();
  if (!g) {
    out.push_back({});
    if (getScale()) out.push_back({});
    if (getBias()) out.push_back({});
    return success();
  }
  // bf16/f16 (mixed precision): mean, variance and the sums in f32.
  constexpr llvm::StringLiteral rule = "layer-norm-fp32-stats";
  Value x0 = x;
  x = h.toF32(x, rule);
  g = h.toF32(g, rule);
  RankedTensorType t = h.type(x);
  int64_t last = t.getRank() - 1, n = t.getDimSize(last);
  auto mean = [&](Value v) {
    return h.expand(h.scale(h.sum(v, {last}, true), 1.0 / double(n)), t);
  };
  Value xc = h.sub(x, mean(x));
  Value var = mean(h.mul(xc, xc));
  Value rstd = b.create<RsqrtOp>(getLoc(), h.add(var, h.splat(var, getEpsilon().convertToDouble())));
  Value xh = h.mul(xc, rstd);
  SmallVector<int64_t> lead;
  for (int64_t d = 0; d < last; ++d)
    lead.push_back(d);
  Value dxh = g;
  if (Value gamma = getScale())
    dxh = h.mul(g, h.broadcast(h.toF32(gamma, rule), t, {last}));
  Value dx = h.mul(rstd, h.sub(h.sub(dxh, mean(dxh)), h.mul(xh, mean(h.mul(dxh, xh)))));
  out.push_back(h.toTypeOf(dx, x0, rule));
  if (getScale())
    out.push_back(h.toTypeOf(h.sum(h.mul(g, xh), lead), getScale(), rule));
  if (getBias())
    out.push_back(h.toTypeOf(h.sum(g, lead), getBias(), rule));
  return success();
}

// loss_i = logsumexp(z_i) - z_i[t_i]:  dz = (softmax(z) - onehot(t)) * g_i
// (g_i = g / N for mean, g for sum, g[i] for none)
LogicalResult CrossEntropyOp::buildGradients(OpBuilder &b,
                                             ArrayRef<Value> grads,
                                             SmallVectorImpl<Value> &out) {
  G h{b, getLoc()};
  Value g = grads[0], z = getLogits(), t = getTargets();
  if (!g) {
    out.append({Value(), Value()});
    return success();
  }
  RankedTensorType zt = h.type(z), tt = h.type(t);
  int64_t cls = zt.getRank() - 1;
  Value p = b.create<SoftmaxOp>(getLoc(), z, b.getI64IntegerAttr(cls));
  Value classes = b.create<IotaOp>(getLoc(), zt.clone(tt.getElementType()),
                                   b.getI64IntegerAttr(cls));
  SmallVector<int64_t> lead;
  for (int64_t d = 0; d < cls; ++d)
    lead.push_back(d);
  Value tb = h.broadcast(t, zt.clone(tt.getElementType()), lead);
  Value hot = h.select(h.cmp(CompareDirection::eq, classes, tb), h.splat(z, 1.0),
                       h.zerosLike(z));
  Value scale;
  if (getReduction() == LossReduction::none) {
    scale = h.broadcast(g, zt, lead);
  } else {
    double n = getReduction() == LossReduction::mean
                   ? double(tt.getNumElements()) : 1.0;
    scale = h.broadcast(h.scale(g, 1.0 / n), zt, {});
  }
  out.push_back(h.mul(h.sub(p, hot), scale));
  out.push_back({});
  return success();
}

// d dropout(x) = dropout(g) with the same seed and salt (same mask, same scale)
LogicalResult DropoutOp::buildGradients(OpBuilder &b, ArrayRef<Value> grads,
                                        SmallVectorImpl<Value> &out) {
  if (!grads[0]) {
    out.append({Value(), Value()});
    return success();
  }
  out.push_back(b.create<DropoutOp>(getLoc(), grads[0], getSeed(), getRate(),
                                    getSalt()));
  out.push_back({});
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
// Collectives. The convention (docs/parallel.md): a gradient is of the sum
// over the group of every device's loss, so a cotangent is a partial sum
// and each rule is the collective's transpose: all_reduce(sum) -> all_reduce
// (sum), all_reduce(mean) -> all_reduce(mean), all_gather <-> reduce_scatter
// (sum). max and min have no gradient here.
//===----------------------------------------------------------------------===//

namespace kiln {

LogicalResult AllReduceOp::buildGradients(OpBuilder &b, ArrayRef<Value> grads,
                                          SmallVectorImpl<Value> &out) {
  if (!grads[0]) {
    out.push_back({});
    return success();
  }
  if (getReduction() != CollectiveReduction::sum && getReduction() != CollectiveReduction::mean)
    return emitOpError() << "has no gradient for reduction '"
                         << stringifyCollectiveReduction(getReduction()) << "'";
  out.push_back(b.create<AllReduceOp>(getLoc(), grads[0], getAxis(), getReduction()));
  return success();
}

LogicalResult ReduceScatterOp::buildGradients(OpBuilder &b, ArrayRef<Value> grads,
                                              SmallVectorImpl<Value> &out) {
  if (!grads[0]) {
    out.push_back({});
    return success();
  }
  if (getReduction() != CollectiveReduction::sum)
    return emitOpError() << "has a gradient only for reduction 'sum'";
  out.push_back(b.create<AllGatherOp>(getLoc(), getOperand().getType(), grads[0], getAxis(),
                                      getDim()));
  return success();
}

LogicalResult AllGatherOp::buildGradients(OpBuilder &b, ArrayRef<Value> grads,
                                          SmallVectorImpl<Value> &out) {
  if (!grads[0]) {
    out.push_back({});
    return success();
  }
  out.push_back(b.create<ReduceScatterOp>(getLoc(), getOperand().getType(), grads[0],
                                          getAxis(), CollectiveReduction::sum, getDim()));
  return success();
}

} // namespace kiln
