//===- RaiseAttention.cpp - kiln-raise-attention ---------------------------===//
//
// Raises softmax(q kᵀ * c [+ mask]) v, written from primitives, into one
// kiln.attention (Passes.td says the pattern). Each rank-4 softmax gets a
// remark, kept on the module for the fusion report: what was raised, or the
// first reason it was not.
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"
#include "passes/Fusion.h"

#include "dialects/kiln/KilnDialect.h"
#include "dialects/kiln/KilnOps.h"
#include "dialects/kiln/TrainSettings.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Verifier.h"

#include <fmt/format.h>

#include <cmath>

using namespace mlir;

namespace kiln {
#define GEN_PASS_DEF_KILNRAISEATTENTIONPASS
#include "passes/Passes.h.inc"

namespace {

RankedTensorType typeOf(Value v) { return cast<RankedTensorType>(v.getType()); }

/// The value every element of `v` has, when `v` is a float splat constant
/// (possibly broadcast or reshaped).
std::optional<double> splatValue(Value v) {
  while (Operation *d = v.getDefiningOp()) {
    if (isa<BroadcastInDimOp, ReshapeOp>(d)) {
      v = d->getOperand(0);
      continue;
    }
    auto c = dyn_cast<ConstantOp>(d);
    auto s = c ? dyn_cast<SplatElementsAttr>(c.getValue()) : SplatElementsAttr();
    if (!s || !isa<FloatType>(s.getElementType()))
      return std::nullopt;
    return s.getSplatValue<APFloat>().convertToDouble();
  }
  return std::nullopt;
}

bool isIota(Value v, int64_t dim) {
  auto i = v.getDefiningOp<IotaOp>();
  return i && int64_t(i.getDim()) == dim;
}

/// rows >= cols over [T, T] (compare ge of iota 0 and iota 1, or le of the
/// two swapped): the causal mask.
bool isCausalMask(Value m) {
  auto c = m.getDefiningOp<CompareOp>();
  if (!c || typeOf(m).getRank() != 2 || typeOf(m).getDimSize(0) != typeOf(m).getDimSize(1))
    return false;
  CompareDirection d = c.getDirection();
  return (d == CompareDirection::ge && isIota(c.getLhs(), 0) && isIota(c.getRhs(), 1)) ||
         (d == CompareDirection::le && isIota(c.getLhs(), 1) && isIota(c.getRhs(), 0));
}

/// Whether `v` is computed from constants only (no function argument: no
/// input, no parameter reaches it).
bool isConstantLike(Value v) {
  SmallVector<Value> work{v};
  llvm::DenseSet<Value> seen;
  while (!work.empty()) {
    Value x = work.pop_back_val();
    if (!seen.insert(x).second)
      continue;
    Operation *d = x.getDefiningOp();
    if (!d)
      return false;
    for (Value o : d->getOperands())
      work.push_back(o);
  }
  return true;
}

/// A [B, H, T, S] mask operand in the forms kiln.attention takes: the
/// operand of a broadcast over batch and heads ([T, S] or [B|1, H|1, T, S]),
/// or the value itself.
Value maskOperand(Value m) {
  if (auto b = m.getDefiningOp<BroadcastInDimOp>()) {
    auto in = typeOf(b.getOperand());
    ArrayRef<int64_t> dims = b.getDims();
    if (in.getRank() == 2 && dims == ArrayRef<int64_t>{2, 3})
      return b.getOperand();
    if (in.getRank() == 4 && dims == ArrayRef<int64_t>{0, 1, 2, 3})
      return b.getOperand();
  }
  return m;
}

struct Match {
  Value q, k, v, mask, seed;
  double scale = 1.0, dropout = 0.0;
  int64_t salt = 0;
  bool causal = false;
  MatmulOp scores, out;
  /// The ops between q kᵀ and p v, users before producers (the order they
  /// are erased in): [dropout], softmax, [mask], [scale].
  SmallVector<Operation *> chain;
  SoftmaxOp softmax;
  std::string what; ///< "causal, dropout 0.1", for the remark
};

/// The attention rooted at `sm`, or the reason it is none.
FailureOr<Match> match(SoftmaxOp sm, std::string &why) {
  auto fail = [&](std::string reason) -> FailureOr<Match> {
    why = std::move(reason);
    return failure();
  };
  Match m;
  m.softmax = sm;
  RankedTensorType st = typeOf(sm.getResult());
  if (sm.getAxis() != uint64_t(st.getRank() - 1))
    return fail(fmt::format("the softmax is over axis {} of a rank-4 tensor, not the last (the "
                            "keys): attention normalises each query's row of scores",
                            sm.getAxis()));
  // Forward: [dropout] then p v.
  Value p = sm.getResult();
  if (!p.hasOneUse())
    return fail("the probabilities have other uses (the fused op does not keep them)");
  Operation *user = *p.getUsers().begin();
  if (auto d = dyn_cast<DropoutOp>(user)) {
    m.dropout = d.getRate().convertToDouble();
    m.seed = d.getSeed();
    m.salt = d.getSalt();
    m.chain.push_back(d);
    p = d.getResult();
    if (!p.hasOneUse())
      return fail("the dropped probabilities have other uses");
    user = *p.getUsers().begin();
  }
  auto pv = dyn_cast<MatmulOp>(user);
  if (!pv || pv.getLhs() != p || pv.getTransposeLhs() || pv.getTransposeRhs())
    return fail("the probabilities do not feed a matmul with the values (p v)");
  m.out = pv;
  m.v = pv.getRhs();
  m.chain.push_back(sm);
  if (typeOf(m.v).getRank() != 4)
    return fail("the values are not [batch, heads, keys, head size]");
  // Backward: [mask] then [scale] then q kᵀ.
  Value s = sm.getOperand();
  auto single = [&](Value x, const char *what) -> LogicalResult {
    if (!x.hasOneUse()) {
      why = fmt::format("the {} have other uses", what);
      return failure();
    }
    return success();
  };
  if (failed(single(s, "masked scores")))
    return failure();
  if (auto sel = s.getDefiningOp<SelectOp>()) {
    std::optional<double> fill = splatValue(sel.getOnFalse());
    if (!fill || !(std::isinf(*fill) && *fill < 0))
      return fail("the mask fills with something other than -inf (the fused op drops masked "
                  "keys exactly)");
    Value mask = maskOperand(sel.getPred());
    if (isCausalMask(mask))
      m.causal = true;
    else
      m.mask = mask;
    m.chain.push_back(sel);
    s = sel.getOnTrue();
  } else if (auto add = s.getDefiningOp<AddOp>()) {
    Value a = add.getLhs(), b = add.getRhs();
    // The scores are the operand computed by a matmul or a scale of one.
    auto isScores = [](Value x) {
      Operation *d = x.getDefiningOp();
      return d && (isa<MatmulOp>(d) || isa<MulOp, DivOp>(d));
    };
    Value mask = isScores(a) ? b : a;
    s = isScores(a) ? a : b;
    if (!isConstantLike(mask))
      return fail("the additive mask depends on an input or a parameter (the fused op gives a "
                  "mask no gradient)");
    m.mask = maskOperand(mask);
    m.chain.push_back(add);
  }
  if (failed(single(s, "scores")))
    return failure();
  if (auto mul = s.getDefiningOp<MulOp>()) {
    std::optional<double> c = splatValue(mul.getRhs());
    Value x = mul.getLhs();
    if (!c) {
      c = splatValue(mul.getLhs());
      x = mul.getRhs();
    }
    if (!c)
      return fail("the scores are scaled by a tensor, not a constant");
    m.scale = *c;
    m.chain.push_back(mul);
    s = x;
  } else if (auto div = s.getDefiningOp<DivOp>()) {
    std::optional<double> c = splatValue(div.getRhs());
    if (!c || *c == 0)
      return fail("the scores are divided by a tensor, not a constant");
    m.scale = 1.0 / *c;
    m.chain.push_back(div);
    s = div.getLhs();
  }
  if (failed(single(s, "scores")))
    return failure();
  auto qk = s.getDefiningOp<MatmulOp>();
  if (!qk || qk.getTransposeLhs())
    return fail("the scores are not a matmul of the queries with the keys (q kᵀ)");
  m.scores = qk;
  m.q = qk.getLhs();
  if (qk.getTransposeRhs()) {
    m.k = qk.getRhs();
  } else if (auto t = qk.getRhs().getDefiningOp<TransposeOp>();
             t && t.getPermutation() == ArrayRef<int64_t>{0, 1, 3, 2}) {
    m.k = t.getOperand();
  } else {
    return fail("the keys are not transposed (q kᵀ needs transpose_rhs or a [0, 1, 3, 2] "
                "transpose)");
  }
  if (typeOf(m.q).getRank() != 4 || typeOf(m.k).getRank() != 4)
    return fail("the queries and keys are not [batch, heads, sequence, head size]");
  m.what = m.causal ? "causal" : m.mask ? "masked" : "unmasked";
  if (m.dropout > 0)
    m.what += fmt::format(", dropout {}", m.dropout);
  m.what += fmt::format(", scale {:.6g}", m.scale);
  return m;
}

struct KilnRaiseAttentionPass
    : impl::KilnRaiseAttentionPassBase<KilnRaiseAttentionPass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    std::string mode = TrainSettings(module).string("attention");
    if (mode == "unfused")
      return;
    int64_t threshold = mode == "fused" ? 0 : int64_t(minKeys);
    SmallVector<std::string> names(functions.begin(), functions.end());
    if (names.empty())
      names.push_back("forward");
    SmallVector<Attribute> remarks;
    if (auto old = module->getAttrOfType<ArrayAttr>(KilnDialect::kAttentionRemarksAttr))
      remarks.append(old.begin(), old.end());
    for (const std::string &name : names) {
      auto fn = module.lookupSymbol<func::FuncOp>(name);
      if (!fn)
        continue;
      SmallVector<SoftmaxOp> softmaxes;
      fn.walk([&](SoftmaxOp sm) {
        if (typeOf(sm.getResult()).getRank() == 4)
          softmaxes.push_back(sm);
      });
      for (SoftmaxOp sm : softmaxes) {
        std::string where = locString(sm.getLoc()), why;
        FailureOr<Match> m = match(sm, why);
        if (failed(m)) {
          remarks.push_back(StringAttr::get(
              module.getContext(), fmt::format("{}: attention not raised: {}", where, why)));
          continue;
        }
        int64_t keys = typeOf(m->k).getDimSize(2);
        if (keys < threshold) {
          remarks.push_back(StringAttr::get(
              module.getContext(),
              fmt::format("{}: attention not raised: {} keys, fewer than {} (attention = auto: "
                          "over few keys the unfused GEMMs and softmax kernel are faster on the "
                          "CPU; attention = fused raises it anyway)",
                          where, keys, threshold)));
          continue;
        }
        std::string error;
        if (failed(raise(*m, error))) {
          remarks.push_back(StringAttr::get(
              module.getContext(), fmt::format("{}: attention not raised: {}", where, error)));
          continue;
        }
        remarks.push_back(StringAttr::get(
            module.getContext(),
            fmt::format("{}: raised kiln.attention ({}) from {} ops", where, m->what,
                        m->chain.size() + 2)));
      }
    }
    if (!remarks.empty())
      module->setAttr(KilnDialect::kAttentionRemarksAttr, ArrayAttr::get(module.getContext(), remarks));
  }

  /// Builds the op in place of p v; the chain's ops then have no use left.
  LogicalResult raise(Match &m, std::string &error) {
    OpBuilder b(m.out);
    Location loc = m.softmax->getLoc(); // the model line of the attention
    Value mask = m.mask;
    // The op's verifier, run before anything changes: shapes it rejects
    // (a mask it cannot broadcast, causal over a rectangle) stay unfused.
    auto op = b.create<AttentionOp>(
        loc, m.q, m.k, m.v, mask, m.dropout > 0 ? m.seed : Value(),
        b.getF64FloatAttr(m.scale), m.causal ? b.getUnitAttr() : UnitAttr(),
        b.getF64FloatAttr(m.dropout), b.getI64IntegerAttr(m.salt));
    if (op.getResult().getType() != m.out.getType()) {
      op.erase();
      error = "the fused op's result type differs from the matmul's";
      return failure();
    }
    {
      // Diagnostics of the verifier become the remark, not an error.
      ScopedDiagnosticHandler quiet(op.getContext(), [&](Diagnostic &d) {
        error = d.str();
        return success();
      });
      if (failed(mlir::verify(op))) {
        op.erase();
        return failure();
      }
    }
    for (NamedAttribute a : m.softmax->getDiscardableAttrs()) // kiln.block
      op->setAttr(a.getName(), a.getValue());
    m.out.getResult().replaceAllUsesWith(op.getResult());
    m.out.erase();
    for (Operation *o : m.chain)
      o->erase();
    if (m.scores->use_empty())
      m.scores.erase();
    return success();
  }
};

} // namespace
} // namespace kiln
