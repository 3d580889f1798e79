//===- KernelFormation.cpp - kiln-split-losses, kiln-mark-forward ----------===//
//
// The passes of kernel formation before kiln-fuse (Pipelines.h,
// buildKernelFormationPipeline): the cross_entropy split and the marking of
// @train_step's first forward pass.
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"

#include "dialects/kiln/KilnDialect.h"
#include "dialects/kiln/KilnOps.h"
#include "dialects/kiln/Sharding.h"
#include "dialects/kiln/TrainSettings.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

using namespace mlir;

namespace kiln {
#define GEN_PASS_DEF_KILNSPLITLOSSESPASS
#define GEN_PASS_DEF_KILNMARKFORWARDPASS
#include "passes/Passes.h.inc"

namespace {

/// cross_entropy(mean|sum) -> cross_entropy(none) and a reduction over
/// every row.
void splitLoss(CrossEntropyOp ce) {
  OpBuilder b(ce);
  auto targets = cast<RankedTensorType>(ce.getTargets().getType());
  auto perType = RankedTensorType::get(
      targets.getShape(), cast<RankedTensorType>(ce.getLogits().getType()).getElementType());
  Value per = b.create<CrossEntropyOp>(ce.getLoc(), perType, ce.getLogits(), ce.getTargets(),
                                       LossReduction::none);
  if (Attribute st = ce->getAttr(kStageAttr))
    per.getDefiningOp()->setAttr(kStageAttr, st);
  SmallVector<int64_t> all;
  for (int64_t d = 0; d < perType.getRank(); ++d)
    all.push_back(d);
  Value total;
  if (ce.getReduction() == LossReduction::mean)
    total = b.create<ReduceMeanOp>(ce.getLoc(), ce.getType(), per, b.getDenseI64ArrayAttr(all),
                                   UnitAttr());
  else
    total = b.create<ReduceSumOp>(ce.getLoc(), ce.getType(), per, b.getDenseI64ArrayAttr(all),
                                  UnitAttr());
  if (Attribute st = ce->getAttr(kStageAttr))
    total.getDefiningOp()->setAttr(kStageAttr, st);
  ce.replaceAllUsesWith(total);
  ce.erase();
}

struct KilnSplitLossesPass : impl::KilnSplitLossesPassBase<KilnSplitLossesPass> {
  using KilnSplitLossesPassBase::KilnSplitLossesPassBase;
  void runOnOperation() override {
    for (func::FuncOp fn : getOperation().getOps<func::FuncOp>()) {
      if (!functions.empty() && !llvm::is_contained(functions, fn.getSymName().str()))
        continue;
      SmallVector<CrossEntropyOp> losses;
      fn.walk([&](CrossEntropyOp ce) {
        if (ce.getReduction() != LossReduction::none)
          losses.push_back(ce);
      });
      for (CrossEntropyOp ce : losses)
        splitLoss(ce);
    }
  }
};

/// The op computing the first micro-batch's loss in @train_step, or null
/// where the step's form is not one kiln-train-step and the parallel passes
/// write.
Operation *forwardLoss(ModuleOp module, func::FuncOp fn) {
  auto ret = cast<func::ReturnOp>(fn.getBody().front().getTerminator());
  Value v;
  for (unsigned i = 0; i < fn.getNumResults(); ++i)
    if (auto o = fn.getResultAttrOfType<StringAttr>(i, KilnDialect::kOutputAttr))
      if (o.getValue() == "loss")
        v = ret.getOperand(i);
  if (!v)
    return nullptr;
  TrainSettings train(module);
  int64_t k = train.gradAccum();
  bool deterministic = train.deterministicDevices();
  bool mesh = getMesh(module).axisSize("dp") > 1;
  if (mesh) {
    // The scalars in one all_reduce (kiln-data-parallel): [cast] [div by N]
    // reshape(slice(all_reduce(concat(reshape([cast] loss), ...)))).
    Value w = v;
    if (auto c = w.getDefiningOp<CastOp>())
      w = c.getOperand();
    if (auto d = w.getDefiningOp<DivOp>())
      w = d.getLhs();
    auto r = w.getDefiningOp<ReshapeOp>();
    auto sl = r ? r.getOperand().getDefiningOp<SliceOp>() : SliceOp();
    auto all = sl ? sl.getOperand().getDefiningOp<AllReduceOp>() : AllReduceOp();
    auto cc = all ? all->getOperand(0).getDefiningOp<ConcatOp>() : ConcatOp();
    if (cc && !cc->getOperands().empty()) {
      v = cc->getOperand(0);
      if (auto r0 = v.getDefiningOp<ReshapeOp>())
        v = r0.getOperand();
      if (auto c0 = v.getDefiningOp<CastOp>())
        v = c0.getOperand();
    } else {
      auto ar = v.getDefiningOp<AllReduceOp>();
      if (!ar)
        return nullptr;
      v = ar->getOperand(0);
    }
  }
  // (1/K) * ...: folded away where K = 1.
  auto one = [](Value c) {
    auto cst = c.getDefiningOp<ConstantOp>();
    auto d = cst ? dyn_cast<DenseFPElementsAttr>(cst.getValue()) : DenseFPElementsAttr();
    return d && d.isSplat() && d.getSplatValue<APFloat>().isExactlyValue(1.0);
  };
  if (k > 1 || mesh) {
    auto mul = v.getDefiningOp<MulOp>();
    if (mul && (k > 1 || one(mul.getRhs())))
      v = mul.getLhs();
    else if (k > 1)
      return nullptr;
  }
  // The first micro-batch's loss: the left operand of each add, down a
  // chain of k - 1 adds or (deterministic = "devices") a pairwise tree of
  // log2(k) levels, whose leaves may be casts to float32.
  for (int64_t i = 1; i < k; ++i) {
    auto add = v.getDefiningOp<AddOp>();
    if (!add)
      break;
    v = add.getLhs();
  }
  if (auto c = v.getDefiningOp<CastOp>(); c && deterministic)
    v = c.getOperand();
  return v.getDefiningOp();
}

struct KilnMarkForwardPass : impl::KilnMarkForwardPassBase<KilnMarkForwardPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto fn = module.lookupSymbol<func::FuncOp>("train_step");
    Operation *loss = fn ? forwardLoss(module, fn) : nullptr;
    if (!loss)
      return;
    Block &block = fn.getBody().front();
    UnitAttr mark = UnitAttr::get(module.getContext());
    SmallVector<Operation *> work{loss};
    while (!work.empty()) {
      Operation *op = work.pop_back_val();
      if (op->hasAttr(kForwardMarkAttr))
        continue;
      op->setAttr(kForwardMarkAttr, mark);
      for (Value v : op->getOperands())
        if (Operation *d = v.getDefiningOp(); d && d->getBlock() == &block)
          work.push_back(d);
    }
  }
};

} // namespace

} // namespace kiln
