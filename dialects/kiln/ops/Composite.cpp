//===- Composite.cpp - The neural-network composites' rules ----------------===//
//
// kiln.softmax, log_softmax, layer_norm, cross_entropy and dropout: result
// types and verifiers, gradients, sharding (row-wise over the last axis),
// precision (fp32 statistics), row locality, index uses (cross_entropy's
// targets) and cost.
//
//===----------------------------------------------------------------------===//
#include "dialects/kiln/ShapeRules.h"
#include "dialects/kiln/ops/Common.h"

#include <fmt/format.h>

using namespace mlir;
using namespace kiln;
using namespace kiln::ops;

//===----------------------------------------------------------------------===//
// Verifiers
//===----------------------------------------------------------------------===//

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
// Gradients
//===----------------------------------------------------------------------===//


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

//===----------------------------------------------------------------------===//
// Sharding
//===----------------------------------------------------------------------===//

namespace {
using Result = ShardingResult;

/// Row-wise ops over the last axis: splits of other dimensions carry over.
Result lastAxisRule(Operation *op, ArrayRef<Opt> in) {
  if (!in[0] || !in[0]->partial.empty() || !in[0]->split.back().empty())
    return std::nullopt;
  for (size_t i = 1; i < in.size(); ++i)
    if (!in[i] || !in[i]->isReplicated())
      return std::nullopt;
  return one(*in[0]);
}

Result crossEntropyRule(Operation *op, ArrayRef<Opt> in) {
  auto ce = cast<CrossEntropyOp>(op);
  if (!in[0] || !in[1] || !in[0]->partial.empty() || !in[0]->split.back().empty())
    return std::nullopt;
  if (ce.getReduction() == LossReduction::none)
    return one(*in[1]);
  TensorSharding out;
  for (const auto &axes : in[1]->split)
    out.partial.append(axes.begin(), axes.end());
  llvm::sort(out.partial);
  return one(out);
}

/// Dropout: the mask is drawn per device (its seed mixes in the replica), so
/// the result is split like the operand; a replicated operand gives an
/// unknown (per-device) result.
Result dropoutRule(Operation *, ArrayRef<Opt> in) {
  if (!in[0] || in[0]->isReplicated() || !in[0]->partial.empty())
    return std::nullopt;
  return one(*in[0]);
}
} // namespace

ShardingResult SoftmaxOp::inferResultShardings(ArrayRef<Opt> in) {
  return lastAxisRule(getOperation(), in);
}
ShardingResult LogSoftmaxOp::inferResultShardings(ArrayRef<Opt> in) {
  return lastAxisRule(getOperation(), in);
}
ShardingResult LayerNormOp::inferResultShardings(ArrayRef<Opt> in) {
  return lastAxisRule(getOperation(), in);
}
ShardingResult CrossEntropyOp::inferResultShardings(ArrayRef<Opt> in) {
  return crossEntropyRule(getOperation(), in);
}
ShardingResult DropoutOp::inferResultShardings(ArrayRef<Opt> in) {
  return dropoutRule(getOperation(), in);
}

//===----------------------------------------------------------------------===//
// Precision: statistics in fp32 (softmax and layer_norm inside the kernel)
//===----------------------------------------------------------------------===//

namespace {
using P = PrecisionClass;
using R = PrecisionRule;
} // namespace

PrecisionPolicy SoftmaxOp::getPrecisionPolicy() {
  return {P::Fp32Stats, R::Softmax, P::Fp32, R::AutocastFp32};
}
PrecisionPolicy LogSoftmaxOp::getPrecisionPolicy() {
  return {P::Fp32, R::LogSoftmax, P::Fp32, R::AutocastFp32};
}
PrecisionPolicy LayerNormOp::getPrecisionPolicy() {
  return {P::Fp32Stats, R::LayerNorm, P::Fp32, R::AutocastFp32};
}
PrecisionPolicy CrossEntropyOp::getPrecisionPolicy() {
  return {P::Fp32, R::Loss, P::Fp32, R::AutocastFp32};
}
PrecisionPolicy DropoutOp::getPrecisionPolicy() { return precision::kFollow; }

//===----------------------------------------------------------------------===//
// Row locality: row-wise over the dimensions before the normalised axis
//===----------------------------------------------------------------------===//

RowLocality SoftmaxOp::getRowLocality() { return firstRows(getOperation(), getAxis()); }
RowLocality LogSoftmaxOp::getRowLocality() { return firstRows(getOperation(), getAxis()); }

// The scale and bias are the last axis: read whole.
RowLocality LayerNormOp::getRowLocality() {
  RowLocality info = firstRows(getOperation(), rankOf(getResult()) - 1);
  for (size_t i = 1; i < info.rowShaped.size(); ++i)
    info.rowShaped[i] = false;
  return info;
}

// Per-row losses are row-local; a mean or sum needs every row.
RowLocality CrossEntropyOp::getRowLocality() {
  return firstRows(getOperation(), getReduction() == LossReduction::none
                                       ? rankOf(getLogits()) - 1
                                       : 0);
}

// Elementwise in its operand; the seed scalar is read whole.
RowLocality DropoutOp::getRowLocality() {
  RowLocality info = allRows(getOperation());
  info.rowShaped[1] = false;
  return info;
}

//===----------------------------------------------------------------------===//
// Index uses: cross_entropy's targets are class indices
//===----------------------------------------------------------------------===//

IndexUse CrossEntropyOp::getIndexUse(unsigned operand) {
  if (operand != 1)
    return IndexUse::none();
  auto logits = cast<RankedTensorType>(getLogits().getType());
  int64_t hi = logits.getRank() == 0 ? 0 : logits.getDimSize(logits.getRank() - 1);
  return IndexUse::bounded(hi, fmt::format("kiln.cross_entropy targets ({} classes)", hi));
}
IndexUse SoftmaxOp::getIndexUse(unsigned) { return IndexUse::none(); }
IndexUse LogSoftmaxOp::getIndexUse(unsigned) { return IndexUse::none(); }
IndexUse LayerNormOp::getIndexUse(unsigned) { return IndexUse::none(); }
IndexUse DropoutOp::getIndexUse(unsigned) { return IndexUse::none(); }

//===----------------------------------------------------------------------===//
// Cost
//===----------------------------------------------------------------------===//

// Per logit.
int64_t CrossEntropyOp::estimateFlops() {
  return getFlopsPerElement() * cast<ShapedType>(getLogits().getType()).getNumElements();
}
