//===- MixedPrecision.cpp - kiln-mixed-precision --------------------------===//
//
// Applies `precision = bf16 | fp16` to @forward, op by op, from the policy
// table (dialects/kiln/Precision.cpp): operands are cast to the type the
// op's class asks for, results take it. Parameters stay f32 in the
// signature (fp32 master weights); a low op reads one kiln.cast of each,
// made at the function entry (rule "master-weight-copy"), which
// kiln-train-step turns into a copy written by the update kernel. Results
// are returned in the declared types (the loss and logits in f32). What the
// pass leaves for its readers is in passes/Precision.h.
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"
#include "passes/Fusion.h"
#include "passes/Precision.h"

#include "dialects/kiln/KilnDialect.h"
#include "dialects/kiln/KilnOps.h"
#include "dialects/kiln/Precision.h"
#include "dialects/kiln/TrainSettings.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/DenseMap.h"

namespace kiln {
#define GEN_PASS_DEF_KILNMIXEDPRECISIONPASS
#include "passes/Passes.h.inc"
} // namespace kiln

using namespace mlir;

namespace kiln {
namespace {

/// The rule on casts that feed a Follow or Promote op (widening a narrower
/// operand to the widest input type).
constexpr llvm::StringLiteral kRulePromote = "promote-widest";

/// 1 for bf16/f16, 2 for f32, 3 for f64 (0: not a float).
int width(Type t) {
  if (t.isBF16() || t.isF16())
    return 1;
  if (t.isF32())
    return 2;
  if (t.isF64())
    return 3;
  return 0;
}

Type elementType(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t ? t.getElementType() : Type();
}

bool isFloatValue(Value v) {
  Type e = elementType(v);
  return e && isa<FloatType>(e);
}

/// The wider of two float types; two different half types widen to f32.
Type widest(Type a, Type b, MLIRContext *ctx) {
  if (!a)
    return b;
  if (!b || a == b)
    return a;
  if (width(a) == 1 && width(b) == 1)
    return Float32Type::get(ctx);
  return width(a) >= width(b) ? a : b;
}

class Rewriter {
public:
  Rewriter(func::FuncOp fn, Type low, bool kilnMode)
      : fn_(fn), entry_(fn.getBody().front()), low_(low), kilnMode_(kilnMode),
        f32_(Float32Type::get(fn.getContext())) {}

  LogicalResult run() {
    SmallVector<Operation *> ops;
    for (Operation &op : entry_)
      ops.push_back(&op);
    for (Operation *op : ops)
      if (failed(visit(op)))
        return failure();
    return success();
  }

private:
  func::FuncOp fn_;
  Block &entry_;
  Type low_;
  bool kilnMode_;
  Type f32_;
  /// Casts made so far, by (value, element type): reused.
  DenseMap<std::pair<Value, Type>, Value> casts_;
  /// The element type each retyped value had before the pass.
  DenseMap<Value, Type> original_;
  /// Where the next entry cast goes (after the previous ones).
  Operation *lastEntryCast_ = nullptr;

  bool isParam(Value v) {
    auto arg = dyn_cast<BlockArgument>(v);
    return arg && arg.getOwner() == &entry_ &&
           fn_.getArgAttr(arg.getArgNumber(), KilnDialect::kParamAttr);
  }

  Type originalType(Value v) {
    auto it = original_.find(v);
    return it != original_.end() ? it->second : elementType(v);
  }

  /// The type a Follow/Promote op sees for operand `v`: a parameter read by
  /// data movement in the kiln mode is its low copy.
  Type seenType(Value v) {
    if (kilnMode_ && isParam(v) && elementType(v).isF32())
      return low_;
    return elementType(v);
  }

  /// `v` as a tensor of element type `to`: `v` itself, an earlier cast, or a
  /// new kiln.cast right after v's definition (at the entry for arguments),
  /// located at `consumer`.
  Value castTo(Value v, Type to, Operation *consumer, StringRef rule) {
    if (elementType(v) == to)
      return v;
    auto key = std::make_pair(v, to);
    if (Value c = casts_.lookup(key))
      return c;
    OpBuilder b(fn_.getContext());
    Operation *def = v.getDefiningOp();
    // A splat constant (the frontend's scalars) is rounded here, once,
    // rather than cast in every step.
    if (auto k = dyn_cast_or_null<ConstantOp>(def)) {
      auto splat = dyn_cast<SplatElementsAttr>(k.getValue());
      auto fto = dyn_cast<FloatType>(to);
      if (splat && fto && isa<FloatType>(splat.getElementType())) {
        APFloat x = splat.getSplatValue<APFloat>();
        bool lost = false;
        x.convert(fto.getFloatSemantics(), APFloat::rmNearestTiesToEven, &lost);
        auto type = cast<RankedTensorType>(v.getType()).clone(to);
        b.setInsertionPointAfter(def);
        auto c = b.create<ConstantOp>(def->getLoc(), DenseElementsAttr::get(type, x));
        c->setAttr(kPrecisionRuleAttr, b.getStringAttr(rule));
        // A value the low type cannot hold: the precision report names it.
        // (Its model line goes with it: constants lose their locations when
        // later passes hoist and merge them.)
        if (lost)
          c->setAttr(kPrecisionRoundedFromAttr,
                     b.getDictionaryAttr(
                         {b.getNamedAttr("value", b.getF64FloatAttr(
                                                      splat.getSplatValue<APFloat>().convertToDouble())),
                          b.getNamedAttr("loc", b.getStringAttr(locString(def->getLoc())))}));
        if (Attribute block = def->getAttr(KilnDialect::kBlockAttr))
          c->setAttr(KilnDialect::kBlockAttr, block);
        casts_[key] = c.getResult();
        return c.getResult();
      }
    }
    if (def) {
      b.setInsertionPointAfter(def);
    } else if (lastEntryCast_) {
      b.setInsertionPointAfter(lastEntryCast_);
    } else {
      b.setInsertionPointToStart(&entry_);
    }
    bool master = isParam(v) && width(to) == 1;
    auto type = cast<RankedTensorType>(v.getType()).clone(to);
    auto c = b.create<CastOp>(consumer->getLoc(), type, v);
    c->setAttr(kPrecisionRuleAttr,
               b.getStringAttr(master ? StringRef(kRuleMasterWeightCopy) : rule));
    if (def)
      if (Attribute block = def->getAttr(KilnDialect::kBlockAttr))
        c->setAttr(KilnDialect::kBlockAttr, block);
    if (!def)
      lastEntryCast_ = c;
    casts_[key] = c.getResult();
    return c.getResult();
  }

  void retypeResults(Operation *op, Type to) {
    // An op with several results whose types follow from its operands
    // (kiln.attention's log-sum-exp stays f32): the types it infers.
    SmallVector<Type, 2> inferred;
    if (auto infer = dyn_cast<InferTypeOpInterface>(op); infer && op->getNumResults() > 1 &&
        succeeded(infer.inferReturnTypes(op->getContext(), op->getLoc(), op->getOperands(),
                                         op->getRawDictionaryAttrs(),
                                         op->getPropertiesStorage(), op->getRegions(),
                                         inferred))) {
      for (auto [r, t] : llvm::zip(op->getResults(), inferred))
        if (r.getType() != t) {
          original_[r] = elementType(r);
          r.setType(t);
        }
      return;
    }
    for (Value r : op->getResults()) {
      Type e = elementType(r);
      if (!e || !e.isF32() || e == to)
        continue;
      original_[r] = e;
      r.setType(cast<RankedTensorType>(r.getType()).clone(to));
    }
  }

  /// Every float operand as `to`; float results f32 -> `to`.
  void apply(Operation *op, Type to, StringRef rule) {
    for (OpOperand &o : op->getOpOperands())
      if (isFloatValue(o.get()))
        o.set(castTo(o.get(), to, op, rule));
    retypeResults(op, to);
  }

  /// Operands back to the types they had before the pass.
  void keep(Operation *op, StringRef rule) {
    for (OpOperand &o : op->getOpOperands())
      if (isFloatValue(o.get()))
        o.set(castTo(o.get(), originalType(o.get()), op, rule));
  }

  /// Whether the user typed `op` in something other than f32 (an explicit
  /// cast upstream, a float64 program): the pass leaves such ops alone.
  bool userTyped(Operation *op) {
    for (Value v : op->getOperands())
      if (isFloatValue(v) && !originalType(v).isF32())
        return true;
    for (Value v : op->getResults())
      if (isFloatValue(v) && !elementType(v).isF32())
        return true;
    return false;
  }

  /// add(matmul(...), broadcast_in_dim(parameter)) in either order.
  bool isLinearBias(Operation *op) {
    if (!isa<AddOp>(op))
      return false;
    auto isBias = [&](Value v) {
      if (auto b = v.getDefiningOp<BroadcastInDimOp>())
        v = b.getOperand();
      return isParam(v);
    };
    Value a = op->getOperand(0), b = op->getOperand(1);
    return (a.getDefiningOp<MatmulOp>() && isBias(b)) ||
           (b.getDefiningOp<MatmulOp>() && isBias(a));
  }

  LogicalResult visit(Operation *op) {
    MLIRContext *ctx = op->getContext();
    if (auto ret = dyn_cast<func::ReturnOp>(op)) {
      // The declared result types: the loss and the logits stay f32.
      ArrayRef<Type> results = fn_.getFunctionType().getResults();
      for (auto [o, t] : llvm::zip(op->getOpOperands(), results))
        if (auto rt = dyn_cast<RankedTensorType>(t))
          o.set(castTo(o.get(), rt.getElementType(), op, kRuleOutputFp32));
      return success();
    }
    if (op->hasAttr(kPrecisionRuleAttr)) // one of ours
      return success();
    bool hasFloat = llvm::any_of(op->getOperands(), isFloatValue) ||
                    llvm::any_of(op->getResults(), isFloatValue);
    std::optional<PrecisionPolicy> policy = lookupPrecisionPolicy(op);
    if (!policy)
      return op->emitOpError()
             << "has no mixed-precision policy (PrecisionOpInterface, answered in "
                "the op's family file under dialects/kiln/ops/); compile it with "
                "precision = fp32";
    if (!hasFloat)
      return success();
    if (userTyped(op) || policy->kiln == PrecisionClass::Keep) {
      keep(op, kRuleUserTyped);
      return success();
    }
    if (op->hasAttr(kPrecisionOverrideAttr)) {
      apply(op, f32_, kRuleUserOverride);
      op->setAttr(kPrecisionRuleAttr, StringAttr::get(ctx, kRuleUserOverride));
      return success();
    }
    PrecisionClass cls = kilnMode_ ? policy->kiln : policy->autocast;
    StringRef rule = precisionRuleName(kilnMode_ ? policy->kilnRule : policy->autocastRule);
    // autocast: a linear layer's bias add belongs to the GEMM, as in
    // F.linear (on autocast's lower-precision list, bias included).
    if (!kilnMode_ && isLinearBias(op)) {
      cls = PrecisionClass::Low;
      rule = precisionRuleName(MatmulOp::getPrecisionPolicy().autocastRule);
    }
    switch (cls) {
    case PrecisionClass::Low:
      // GEMMs always run low. Elementwise ops narrow with their inputs: one
      // whose (non-constant) inputs are all f32, such as arithmetic on the
      // loss after cross_entropy, stays f32 rather than round the loss.
      if (!isa<MatmulOp>(op) && llvm::none_of(op->getOperands(), [&](Value v) {
            return isFloatValue(v) && !v.getDefiningOp<ConstantOp>() &&
                   width(seenType(v)) == 1;
          }))
        return success();
      apply(op, low_, rule);
      return success();
    case PrecisionClass::Fp32Stats:
      apply(op, low_, rule);
      op->setAttr(kPrecisionRuleAttr, StringAttr::get(ctx, rule));
      return success();
    case PrecisionClass::Fp32:
      apply(op, f32_, rule);
      op->setAttr(kPrecisionRuleAttr, StringAttr::get(ctx, rule));
      return success();
    case PrecisionClass::Follow:
    case PrecisionClass::Promote: {
      // The widest input; splat constants (the frontend's scalars) do not
      // widen unless every input is one.
      Type to, toAll;
      for (Value v : op->getOperands()) {
        if (!isFloatValue(v))
          continue;
        toAll = widest(toAll, seenType(v), ctx);
        if (!v.getDefiningOp<ConstantOp>())
          to = widest(to, seenType(v), ctx);
      }
      if (!to)
        to = toAll;
      if (!to) // a source (constant, iota, random): keeps its type
        return success();
      apply(op, to, kRulePromote);
      return success();
    }
    case PrecisionClass::Keep:
      break;
    }
    return success();
  }
};

struct KilnMixedPrecisionPass
    : impl::KilnMixedPrecisionPassBase<KilnMixedPrecisionPass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    MLIRContext *ctx = module.getContext();
    TrainSettings train(module);
    std::string p = precision, m = mode;
    if (p.empty())
      p = train.precision();
    if (m.empty())
      m = train.string("precision_mode");
    if (m.empty())
      m = "kiln";
    if (p.empty() || p == "fp32" || p == "tf32")
      return; // nothing at all: fp32 programs are unchanged (tf32 is a GEMM mode)
    if (!train_rules::isPrecision(p)) {
      module.emitError() << "kiln-mixed-precision: precision '" << p
                         << "' is not fp32, tf32, bf16 or fp16";
      return signalPassFailure();
    }
    if (!train_rules::isPrecisionMode(m)) {
      module.emitError() << "kiln-mixed-precision: mode '" << m
                         << "' is not kiln or autocast";
      return signalPassFailure();
    }
    if (auto done = module->getAttrOfType<StringAttr>(kPrecisionAttr)) {
      if (done.getValue() == p)
        return; // already applied
      module.emitError() << "kiln-mixed-precision: the module is already in "
                         << done.getValue() << "; cannot apply " << p;
      return signalPassFailure();
    }
    auto forward = module.lookupSymbol<func::FuncOp>("forward");
    if (!forward || forward.isExternal()) {
      module.emitError() << "kiln-mixed-precision needs a func.func @forward "
                            "(the model from the frontend)";
      return signalPassFailure();
    }
    if (module.lookupSymbol("train_step") || module.lookupSymbol("grad")) {
      module.emitError() << "kiln-mixed-precision runs on @forward before "
                            "kiln-train-step/kiln-autodiff; this module already "
                            "has the training program";
      return signalPassFailure();
    }
    Type low = p == "bf16" ? Type(BFloat16Type::get(ctx)) : Type(Float16Type::get(ctx));
    Rewriter r(forward, low, m == "kiln");
    if (failed(r.run()))
      return signalPassFailure();
    module->setAttr(kPrecisionAttr, StringAttr::get(ctx, p));
    module->setAttr(kPrecisionModeAttr, StringAttr::get(ctx, m));
    forward.walk([&](CastOp c) {
      if (c->hasAttr(kPrecisionRuleAttr))
        ++numCasts;
    });
  }
};

} // namespace
} // namespace kiln
