//===- Attention.cpp - The fused attention ops' rules ---------------------===//
//
// kiln.attention and kiln.attention_grad: result types and verifiers, the
// gradient (attention -> attention_grad, which recomputes the probabilities
// from the saved row log-sum-exp), sharding (split over batch and heads
// only), precision (low in and out, fp32 statistics), row locality (a
// library step: whole operands), index uses (none) and cost (the T x S
// products, about half of them when causal).
//
//===----------------------------------------------------------------------===//
#include "dialects/kiln/ShapeRules.h"
#include "dialects/kiln/ops/Common.h"

#include <fmt/format.h>

#include <cmath>

using namespace mlir;
using namespace kiln;
using namespace kiln::ops;

//===----------------------------------------------------------------------===//
// Types and verifiers
//===----------------------------------------------------------------------===//

namespace {

/// The element type of the saved log-sum-exp: the query's, f32 for halves.
Type lseElementType(Type queryElement) {
  if (queryElement.isBF16() || queryElement.isF16())
    return Float32Type::get(queryElement.getContext());
  return queryElement;
}

/// Result types of kiln.attention from its query and value.
LogicalResult attentionTypes(Loc loc, Value query, Value value,
                             SmallVectorImpl<Type> &types) {
  RankedTensorType q, v;
  if (failed(ranked(loc, query, "query", q)) || failed(ranked(loc, value, "value", v)))
    return failure();
  if (q.getRank() != 4 || v.getRank() != 4)
    return emitOptionalError(loc, "query and value must be [batch, heads, sequence, head size]");
  ArrayRef<int64_t> qs = q.getShape();
  types.push_back(q.clone({qs[0], qs[1], qs[2], v.getDimSize(3)}));
  types.push_back(q.clone({qs[0], qs[1], qs[2]}, lseElementType(q.getElementType())));
  return success();
}

std::string shapeStr(ArrayRef<int64_t> s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i)
    out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

/// The checks both ops share: operand ranks, sizes and types, the mask's
/// shape, dropout's seed, causal's square scores.
LogicalResult verifyCommon(Operation *op, Value query, Value key, Value value, Value mask,
                           Value seed, double scale, bool causal, double dropout) {
  auto q = cast<RankedTensorType>(query.getType());
  auto k = cast<RankedTensorType>(key.getType());
  auto v = cast<RankedTensorType>(value.getType());
  if (q.getRank() != 4 || k.getRank() != 4 || v.getRank() != 4)
    return op->emitOpError("query, key and value must be [batch, heads, sequence, head size], got ")
           << shapeStr(q.getShape()) << ", " << shapeStr(k.getShape()) << ", "
           << shapeStr(v.getShape());
  if (q.getElementType() != k.getElementType() || q.getElementType() != v.getElementType())
    return op->emitOpError("query, key and value must have one element type");
  ArrayRef<int64_t> qs = q.getShape(), ks = k.getShape(), vs = v.getShape();
  if (ks[0] != qs[0] || vs[0] != qs[0])
    return op->emitOpError("query, key and value must have one batch size, got ")
           << qs[0] << ", " << ks[0] << ", " << vs[0];
  if (ks[1] != vs[1] || ks[2] != vs[2])
    return op->emitOpError("key ") << shapeStr(ks) << " and value " << shapeStr(vs)
                                   << " must have the same heads and sequence";
  if (ks[1] < 1 || qs[1] % ks[1] != 0)
    return op->emitOpError("the key/value heads (")
           << ks[1] << ") must divide the query heads (" << qs[1] << ")";
  if (ks[3] != qs[3])
    return op->emitOpError("query and key must have one head size, got ")
           << qs[3] << " and " << ks[3];
  if (!std::isfinite(scale))
    return op->emitOpError("scale must be finite");
  if (causal && qs[2] != ks[2])
    return op->emitOpError("causal attention needs as many queries as keys, got ")
           << qs[2] << " and " << ks[2];
  if (!(dropout >= 0.0 && dropout < 1.0))
    return op->emitOpError("dropout must be in [0, 1), got ") << dropout;
  if (dropout > 0.0 && !seed)
    return op->emitOpError("dropout > 0 needs a seed");
  if (mask) {
    auto m = cast<RankedTensorType>(mask.getType());
    Type me = m.getElementType();
    if (!me.isInteger(1) && me != q.getElementType())
      return op->emitOpError("the mask must be i1 (keep where true) or of the query's type "
                             "(added to the scores)");
    ArrayRef<int64_t> ms = m.getShape();
    bool ok = (ms.size() == 2 || ms.size() == 4) && ms[ms.size() - 2] == qs[2] &&
              ms[ms.size() - 1] == ks[2];
    if (ok && ms.size() == 4)
      ok = (ms[0] == 1 || ms[0] == qs[0]) && (ms[1] == 1 || ms[1] == qs[1]);
    if (!ok)
      return op->emitOpError("the mask must be [")
             << qs[2] << ", " << ks[2] << "] or [" << qs[0] << " or 1, " << qs[1]
             << " or 1, " << qs[2] << ", " << ks[2] << "], got " << shapeStr(ms);
  }
  return success();
}

} // namespace

LogicalResult AttentionOp::inferReturnTypes(MLIRContext *, Loc loc, Adaptor adaptor,
                                            SmallVectorImpl<Type> &types) {
  return attentionTypes(loc, adaptor.getQuery(), adaptor.getValue(), types);
}

LogicalResult AttentionGradOp::inferReturnTypes(MLIRContext *, Loc loc, Adaptor adaptor,
                                                SmallVectorImpl<Type> &types) {
  for (auto [v, what] : {std::pair{adaptor.getQuery(), "query"}, {adaptor.getKey(), "key"},
                         {adaptor.getValue(), "value"}}) {
    RankedTensorType t;
    if (failed(ranked(loc, v, what, t)))
      return failure();
    types.push_back(t);
  }
  return success();
}

LogicalResult AttentionOp::verify() {
  return verifyCommon(*this, getQuery(), getKey(), getValue(), getMask(), getSeed(),
                      getScale().convertToDouble(), getCausal(),
                      getDropout().convertToDouble());
}

LogicalResult AttentionGradOp::verify() {
  if (failed(verifyCommon(*this, getQuery(), getKey(), getValue(), getMask(), getSeed(),
                          getScale().convertToDouble(), getCausal(),
                          getDropout().convertToDouble())))
    return failure();
  SmallVector<Type> fwd;
  if (failed(attentionTypes(getLoc(), getQuery(), getValue(), fwd)))
    return failure();
  if (getOut().getType() != fwd[0] || getGrad().getType() != fwd[0])
    return emitOpError("out and grad must be ") << fwd[0] << ", the forward's result";
  if (getLse().getType() != fwd[1])
    return emitOpError("lse must be ") << fwd[1] << ", the forward's log-sum-exp";
  return success();
}

//===----------------------------------------------------------------------===//
// Gradient
//===----------------------------------------------------------------------===//

// dq, dk, dv from kiln.attention_grad; the mask and the seed get none (a
// float mask is taken as a constant: kiln-raise-attention raises only masks
// that no input or parameter reaches).
LogicalResult AttentionOp::buildGradients(OpBuilder &b, ArrayRef<Value> grads,
                                          SmallVectorImpl<Value> &out) {
  if (grads[1])
    return emitOpError("the log-sum-exp result has no gradient rule (only "
                       "kiln.attention_grad reads it)");
  SmallVector<Value, 3> qkv(3);
  if (grads[0]) {
    auto g = b.create<AttentionGradOp>(getLoc(), getQuery(), getKey(), getValue(),
                                       getResult(), getLse(), grads[0], getMask(),
                                       getSeed(), getScaleAttr(), getCausalAttr(),
                                       getDropoutAttr(), getSaltAttr());
    qkv = {g.getQueryGrad(), g.getKeyGrad(), g.getValueGrad()};
  }
  out.append(qkv.begin(), qkv.end());
  if (getMask())
    out.push_back({});
  if (getSeed())
    out.push_back({});
  return success();
}

//===----------------------------------------------------------------------===//
// Sharding: batch (data parallel) and heads (tensor parallel) only
//===----------------------------------------------------------------------===//

namespace {

/// The shared split of dims 0 and 1 of `main` (query-shaped operands), with
/// the mask split to match where its dimension is not 1; none where an
/// operand is unknown, partial, split along the sequence or head size, or
/// the splits disagree.
std::optional<std::array<SmallVector<std::string, 1>, 2>>
batchHeadSplit(ArrayRef<Opt> main, Value mask, const Opt *maskSharding) {
  std::array<SmallVector<std::string, 1>, 2> split;
  for (size_t i = 0; i < main.size(); ++i) {
    const Opt &s = main[i];
    if (!s || !s->partial.empty() || s->split.size() < 3)
      return std::nullopt;
    for (size_t d = 2; d < s->split.size(); ++d)
      if (!s->split[d].empty())
        return std::nullopt;
    for (int d = 0; d < 2; ++d) {
      if (i == 0)
        split[d] = s->split[d];
      else if (s->split[d] != split[d])
        return std::nullopt;
    }
  }
  if (mask) {
    if (!maskSharding || !*maskSharding || !(*maskSharding)->partial.empty())
      return std::nullopt;
    const TensorSharding &m = **maskSharding;
    auto shape = cast<RankedTensorType>(mask.getType()).getShape();
    size_t r = shape.size();
    for (size_t d = r - 2; d < r; ++d)
      if (!m.split[d].empty())
        return std::nullopt;
    if (r == 4)
      for (int d = 0; d < 2; ++d)
        if (shape[d] == 1 ? !m.split[d].empty() : m.split[d] != split[d])
          return std::nullopt;
    if (r == 2 && (!split[0].empty() || !split[1].empty()) && !m.isReplicated())
      return std::nullopt;
  }
  return split;
}

TensorSharding withSplit(Value v, const std::array<SmallVector<std::string, 1>, 2> &split) {
  TensorSharding s = TensorSharding::replicated(rankOf(v));
  s.split[0] = split[0];
  s.split[1] = split[1];
  return s;
}

} // namespace

ShardingResult AttentionOp::inferResultShardings(ArrayRef<Opt> in) {
  const Opt *mask = getMask() ? &in[3] : nullptr;
  auto split = batchHeadSplit(in.take_front(3), getMask(), mask);
  if (!split)
    return std::nullopt;
  return SmallVector<TensorSharding, 1>{withSplit(getResult(), *split),
                                        withSplit(getLse(), *split)};
}

ShardingResult AttentionGradOp::inferResultShardings(ArrayRef<Opt> in) {
  const Opt *mask = getMask() ? &in[6] : nullptr;
  auto split = batchHeadSplit(in.take_front(6), getMask(), mask);
  if (!split)
    return std::nullopt;
  return SmallVector<TensorSharding, 1>{withSplit(getQueryGrad(), *split),
                                        withSplit(getKeyGrad(), *split),
                                        withSplit(getValueGrad(), *split)};
}

//===----------------------------------------------------------------------===//
// Precision, row locality, index uses
//===----------------------------------------------------------------------===//

// bf16/f16 in and out (the products on the low type's dot products); the
// running maximum, sums, log-sum-exp and accumulators in fp32. Under
// autocast too: F.scaled_dot_product_attention runs in the low type.
PrecisionPolicy AttentionOp::getPrecisionPolicy() {
  return {PrecisionClass::Fp32Stats, PrecisionRule::Attention, PrecisionClass::Fp32Stats,
          PrecisionRule::AutocastLow};
}
PrecisionPolicy AttentionGradOp::getPrecisionPolicy() {
  return AttentionOp::getPrecisionPolicy();
}

// A library step of its own: kiln-fuse fuses nothing into it.
RowLocality AttentionOp::getRowLocality() { return noRows(getOperation()); }
RowLocality AttentionGradOp::getRowLocality() { return noRows(getOperation()); }
IndexUse AttentionOp::getIndexUse(unsigned) { return IndexUse::none(); }
IndexUse AttentionGradOp::getIndexUse(unsigned) { return IndexUse::none(); }

//===----------------------------------------------------------------------===//
// Cost
//===----------------------------------------------------------------------===//

namespace {
/// Query-key pairs computed: B H T S, about half when causal (T (T + 1) / 2
/// per row block).
double pairs(Value query, Value key, bool causal) {
  auto q = cast<RankedTensorType>(query.getType()).getShape();
  auto k = cast<RankedTensorType>(key.getType()).getShape();
  double rows = double(q[0]) * double(q[1]);
  double t = double(q[2]), s = double(k[2]);
  return rows * (causal ? t * (t + 1) / 2 : t * s);
}
int64_t headSize(Value v) { return cast<RankedTensorType>(v.getType()).getDimSize(3); }
} // namespace

// Forward: q kᵀ and p v (2 D each per pair), softmax about 5 per pair.
int64_t AttentionOp::estimateFlops() {
  double n = pairs(getQuery(), getKey(), getCausal());
  return int64_t(n * (2.0 * double(headSize(getQuery()) + headSize(getValue())) + 5.0));
}

// Backward: q kᵀ again, grad vᵀ, and the three gradient products (2 D each
// per pair), the probabilities and their gradient about 8 per pair.
int64_t AttentionGradOp::estimateFlops() {
  double n = pairs(getQuery(), getKey(), getCausal());
  double d = double(headSize(getQuery())), dv = double(headSize(getValue()));
  return int64_t(n * (2.0 * (3.0 * d + 2.0 * dv) + 8.0));
}
