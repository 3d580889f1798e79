//===- Autodiff.cpp - Reverse-mode differentiation of kiln programs -------===//
#include "passes/Passes.h"

#include "dialects/kiln/KilnOps.h"
#include "dialects/kiln/Sharding.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringMap.h"

using namespace mlir;

namespace kiln {
#define GEN_PASS_DEF_KILNAUTODIFFPASS
#include "passes/Passes.h.inc"

namespace {
bool isFloatTensor(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t && isa<FloatType>(t.getElementType());
}

Value zerosLike(OpBuilder &b, Location loc, Value v) {
  auto t = cast<RankedTensorType>(v.getType());
  Attribute zero = isa<FloatType>(t.getElementType())
                       ? Attribute(FloatAttr::get(t.getElementType(), 0.0))
                       : Attribute(IntegerAttr::get(t.getElementType(), 0));
  return b.create<ConstantOp>(loc, DenseElementsAttr::get(t, zero));
}
} // namespace

FailureOr<SmallVector<Value>> buildReverseSweep(OpBuilder &b, Value loss,
                                                ArrayRef<Value> wrt,
                                                int64_t *numOps, bool recompute,
                                                Value seed) {
  Block *block = b.getInsertionBlock();
  Location loc = loss.getLoc();
  // Forward ops are everything before the insertion point.
  SmallVector<Operation *> ops;
  for (auto it = block->begin(), ip = b.getInsertionPoint(); it != ip; ++it)
    ops.push_back(&*it);
  size_t sizeBefore = block->getOperations().size();

  // Values that depend on a wrt value (forward sweep) ...
  llvm::DenseSet<Value> dependsOnWrt(wrt.begin(), wrt.end());
  for (Operation *op : ops)
    for (Value operand : op->getOperands())
      if (dependsOnWrt.count(operand)) {
        for (Value r : op->getResults())
          if (isFloatTensor(r))
            dependsOnWrt.insert(r);
        break;
      }
  // ... and that the loss depends on (backward sweep).
  llvm::DenseSet<Value> reachesLoss{loss};
  for (Operation *op : llvm::reverse(ops)) {
    bool reaches = llvm::any_of(op->getResults(),
                                [&](Value r) { return reachesLoss.count(r); });
    if (reaches)
      for (Value operand : op->getOperands())
        reachesLoss.insert(operand);
  }
  auto active = [&](Value v) {
    return dependsOnWrt.count(v) && reachesLoss.count(v) && isFloatTensor(v);
  };

  // Recomputation: block tag -> its ops in forward order.
  llvm::StringMap<SmallVector<Operation *>> blocks;
  llvm::DenseMap<Operation *, Operation *> cloneOf;
  if (recompute)
    for (Operation *op : ops)
      if (auto tag = op->getAttrOfType<StringAttr>(KilnDialect::kBlockAttr))
        if (llvm::any_of(op->getResults(),
                         [&](Value r) { return reachesLoss.count(r); }))
          blocks[tag.getValue()].push_back(op);
  auto recomputeBlock = [&](StringRef tag) {
    SmallVector<Operation *> &blockOps = blocks[tag];
    llvm::DenseSet<Operation *> inBlock(blockOps.begin(), blockOps.end());
    IRMapping map;
    for (Operation *op : blockOps) {
      for (Value operand : op->getOperands()) {
        Operation *def = operand.getDefiningOp();
        if (!def || inBlock.count(def) || map.contains(operand) ||
            !isFloatTensor(operand) || isa<ConstantOp>(def))
          continue;
        map.map(operand, b.create<OptimizationBarrierOp>(loc, operand).getResult());
      }
      cloneOf[op] = b.clone(*op, map);
    }
    blocks.erase(tag);
  };

  llvm::DenseMap<Value, Value> adjoint;
  if (seed) {
    adjoint[loss] = seed;
  } else {
    auto t = cast<RankedTensorType>(loss.getType());
    adjoint[loss] = b.create<ConstantOp>(
        loc, DenseElementsAttr::get(t, FloatAttr::get(t.getElementType(), 1.0)));
  }
  for (Operation *op : llvm::reverse(ops)) {
    SmallVector<Value> resultGrads;
    bool any = false;
    for (Value r : op->getResults()) {
      Value g = active(r) ? adjoint.lookup(r) : Value();
      resultGrads.push_back(g);
      any |= bool(g);
    }
    if (!any)
      continue;
    bool needsOperandGrad =
        llvm::any_of(op->getOperands(), [&](Value v) { return active(v); });
    if (!needsOperandGrad)
      continue;
    // Pipeline stages: the ops built for `op`'s gradient (and its
    // recomputation) run on `op`'s stage (docs/parallel.md).
    Operation *mark = b.getInsertionPoint() == block->begin()
                          ? nullptr
                          : &*std::prev(b.getInsertionPoint());
    auto tagStage = [&, stage = op->getAttr(kStageAttr)] {
      if (!stage)
        return;
      for (auto it = mark ? std::next(mark->getIterator()) : block->begin();
           it != b.getInsertionPoint(); ++it)
        if (!it->hasAttr(kStageAttr))
          it->setAttr(kStageAttr, stage);
    };
    if (recompute)
      if (auto tag = op->getAttrOfType<StringAttr>(KilnDialect::kBlockAttr))
        if (blocks.count(tag.getValue()))
          recomputeBlock(tag.getValue());
    Operation *ruleOp = cloneOf.lookup(op) ? cloneOf.lookup(op) : op;
    auto rule = dyn_cast<GradientOpInterface>(ruleOp);
    if (!rule)
      return op->emitOpError()
             << "has no gradient rule but lies between a parameter and the "
                "loss; add GradientOpInterface to it";
    SmallVector<Value> operandGrads;
    if (failed(rule.buildGradients(b, resultGrads, operandGrads)))
      return op->emitOpError() << "gradient rule failed";
    if (operandGrads.size() != op->getNumOperands())
      return op->emitOpError() << "gradient rule returned "
                               << operandGrads.size() << " gradients for "
                               << op->getNumOperands() << " operands";
    for (auto [operand, g] : llvm::zip(op->getOperands(), operandGrads)) {
      if (!g || !active(operand))
        continue;
      if (g.getType() != operand.getType())
        return op->emitOpError() << "gradient rule produced " << g.getType()
                                 << " for an operand of type "
                                 << operand.getType();
      Value &acc = adjoint[operand];
      acc = acc ? b.create<AddOp>(loc, acc, g).getResult() : g;
    }
    tagStage();
  }
  SmallVector<Value> grads;
  for (Value w : wrt) {
    Value g = adjoint.lookup(w);
    grads.push_back(g ? g : zerosLike(b, loc, w));
  }
  if (numOps)
    *numOps = int64_t(block->getOperations().size() - sizeBefore);
  return grads;
}

void eraseDeadOps(Block &block) {
  bool changed = true;
  while (changed) {
    changed = false;
    for (Operation &op : llvm::make_early_inc_range(llvm::reverse(block))) {
      if (op.hasTrait<OpTrait::IsTerminator>() || !op.use_empty() ||
          !isPure(&op))
        continue;
      op.erase();
      changed = true;
    }
  }
}

namespace {
struct KilnAutodiffPass : impl::KilnAutodiffPassBase<KilnAutodiffPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto fwd = module.lookupSymbol<func::FuncOp>("forward");
    if (!fwd) {
      module.emitError() << "kiln-autodiff needs a func.func @forward";
      return signalPassFailure();
    }
    if (module.lookupSymbol("grad")) {
      module.emitError() << "@grad already exists";
      return signalPassFailure();
    }
    OpBuilder b(module.getBodyRegion());
    b.setInsertionPointToEnd(module.getBody());
    auto gradFn = b.create<func::FuncOp>(fwd.getLoc(), "grad",
                                         fwd.getFunctionType());
    Block *entry = gradFn.addEntryBlock();
    b.setInsertionPointToEnd(entry);
    IRMapping map;
    SmallVector<Value> params;
    for (auto [i, arg] : llvm::enumerate(fwd.getArguments())) {
      map.map(arg, entry->getArgument(i));
      if (fwd.getArgAttr(i, KilnDialect::kParamAttr))
        params.push_back(entry->getArgument(i));
      gradFn.setArgAttrs(i, fwd.getArgAttrDict(i));
    }
    func::ReturnOp ret;
    for (Operation &op : fwd.getBody().front()) {
      if (auto r = dyn_cast<func::ReturnOp>(op)) {
        ret = r;
        break;
      }
      b.clone(op, map);
    }
    if (!ret || ret.getNumOperands() == 0) {
      fwd.emitError() << "@forward must return the loss first";
      return signalPassFailure();
    }
    Value loss = map.lookup(ret.getOperand(0));
    int64_t n = 0;
    FailureOr<SmallVector<Value>> grads = buildReverseSweep(b, loss, params, &n);
    if (failed(grads))
      return signalPassFailure();
    numGradientOps = n;
    SmallVector<Value> results{loss};
    results.append(grads->begin(), grads->end());
    b.create<func::ReturnOp>(fwd.getLoc(), results);
    SmallVector<Type> resultTypes;
    for (Value v : results)
      resultTypes.push_back(v.getType());
    gradFn.setFunctionType(
        b.getFunctionType(entry->getArgumentTypes(), resultTypes));
    gradFn.setResultAttr(0, KilnDialect::kOutputAttr, b.getStringAttr("loss"));
    unsigned k = 1;
    for (auto [i, arg] : llvm::enumerate(fwd.getArguments()))
      if (auto name = fwd.getArgAttrOfType<StringAttr>(i, KilnDialect::kParamAttr))
        gradFn.setResultAttr(k++, KilnDialect::kOutputAttr,
                             b.getStringAttr("grad:" + name.getValue().str()));
    eraseDeadOps(*entry);
  }
};
} // namespace
} // namespace kiln
