//===- Fusion.cpp - kiln-fuse: grouping ops into kernels ------------------===//
//
// See Fusion.h for the rules. The grouping works on a function's body in
// schedule order with a union-find of groups; each op carries the set of
// groups it depends on (transitively), which makes the convexity check of a
// join a bit test. Then every group becomes a kiln.fusion op (members moved
// into its isolated region, cheap producers and constants cloned in) and
// the body is re-sorted topologically.
//
//===----------------------------------------------------------------------===//
#include "passes/Fusion.h"
#include "passes/fusion/Grouper.h"
#include "passes/Passes.h"

#include "dialects/kiln/KilnOps.h"
#include "dialects/kiln/Sharding.h"

#include "mlir/Analysis/TopologicalSortUtils.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/BitVector.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SetVector.h"

#include <fmt/format.h>

using namespace mlir;

namespace kiln {
#define GEN_PASS_DEF_KILNFUSEPASS
#include "passes/Passes.h.inc"

std::string locString(Location loc) {
  std::string out;
  loc->walk([&](Location l) {
    if (auto f = dyn_cast<FileLineColLoc>(l)) {
      out = fmt::format("{}:{}:{}", f.getFilename().str(), f.getLine(), f.getColumn());
      return WalkResult::interrupt();
    }
    return WalkResult::advance();
  });
  return out;
}

bool isCloneable(Value v) {
  Operation *def = v.getDefiningOp();
  if (!def)
    return false;
  if (isa<ConstantOp>(def))
    return true;
  if (isa<ReshapeOp, BroadcastInDimOp>(def))
    return isCloneable(def->getOperand(0));
  return false;
}

bool isElementwiseOp(Operation *op) {
  return op->hasTrait<OpTrait::Elementwise>() ||
         isa<AddOp, SubOp, MulOp, DivOp, PowOp, MaxOp, MinOp, CompareOp, SelectOp,
             CastOp>(op);
}

namespace {
/// A [0, 2, 1, 3] transpose of a rank-4 tensor of any float type.
bool isAnyHeadTranspose(Operation *op) {
  auto t = dyn_cast_or_null<TransposeOp>(op);
  if (!t)
    return false;
  auto type = cast<RankedTensorType>(t.getType());
  return type.getRank() == 4 && isa<FloatType>(type.getElementType()) &&
         t.getPermutation() == ArrayRef<int64_t>{0, 2, 1, 3};
}
} // namespace

// f32 only: the strided GEMMs are float32 (attention steps take any float
// type, findFoldedTransposes).
bool isHeadTranspose(Operation *op) {
  return isAnyHeadTranspose(op) &&
         cast<RankedTensorType>(op->getResult(0).getType()).getElementType().isF32();
}

bool isHeadMatmul(Operation *op) {
  auto mm = dyn_cast_or_null<MatmulOp>(op);
  return mm && cast<RankedTensorType>(mm.getType()).getElementType().isF32() &&
         cast<RankedTensorType>(mm.getLhs().getType()).getRank() == 4 &&
         cast<RankedTensorType>(mm.getRhs().getType()).getRank() == 4 &&
         cast<RankedTensorType>(mm.getType()).getRank() == 4;
}

namespace {
/// Whether `use` reads a [B, H, N, D] operand of kiln.attention or
/// kiln.attention_grad that the step can read sequence-major: q, k, v (and
/// the gradient's incoming grad).
bool isAttentionHeadOperand(OpOperand &use) {
  unsigned i = use.getOperandNumber();
  if (isa<AttentionOp>(use.getOwner()))
    return i < 3;
  if (isa<AttentionGradOp>(use.getOwner()))
    return i < 3 || i == 5;
  return false;
}
} // namespace

void findFoldedTransposes(Block &block, llvm::DenseSet<Operation *> &in,
                          llvm::DenseSet<Operation *> &out) {
  in.clear();
  out.clear();
  for (Operation &op : block) {
    if (!isAnyHeadTranspose(&op) || isCloneable(op.getOperand(0)))
      continue;
    bool f32 = isHeadTranspose(&op);
    if (!op.getResult(0).use_empty() &&
        llvm::all_of(op.getResult(0).getUses(), [&](OpOperand &u) {
          return (f32 && isHeadMatmul(u.getOwner())) || isAttentionHeadOperand(u);
        }))
      in.insert(&op);
  }
  for (Operation &op : block) {
    if (isa<AttentionOp, AttentionGradOp>(op)) {
      // A result read by one head transpose (and, for the forward's output,
      // by attention_grad, which then reads it sequence-major too).
      for (Value r : op.getResults()) {
        Operation *t = nullptr;
        bool ok = true;
        for (OpOperand &u : r.getUses()) {
          if (isAnyHeadTranspose(u.getOwner()) && !in.count(u.getOwner()) && !t)
            t = u.getOwner();
          else if (!(isa<AttentionGradOp>(u.getOwner()) && u.getOperandNumber() == 3))
            ok = false;
        }
        if (t && ok)
          out.insert(t);
      }
      continue;
    }
    if (!isHeadMatmul(&op) || !op.getResult(0).hasOneUse())
      continue;
    Operation *user = *op.getResult(0).getUsers().begin();
    if (isHeadTranspose(user) && !in.count(user))
      out.insert(user);
  }
}

using fusion::Grouper;
using fusion::rowInfo;
using fusion::tensorType;


int64_t rowLocality(Operation *op, SmallVectorImpl<bool> &rowShaped) {
  RowLocality ri = rowInfo(op);
  rowShaped.assign(ri.rowShaped.begin(), ri.rowShaped.end());
  return ri.maxRows;
}

bool isLoopInvariantMember(Operation *m) {
  if (m->getNumResults() != 1 || tensorType(m->getResult(0)).getRank() != 0 ||
      !(isElementwiseOp(m) || isa<ConstantOp>(m)))
    return false;
  for (Value v : m->getOperands()) {
    if (isa<BlockArgument>(v)) {
      if (tensorType(v).getRank() != 0)
        return false;
      continue;
    }
    if (!isLoopInvariantMember(v.getDefiningOp()))
      return false;
  }
  return true;
}

bool isSingleLoopFusion(Operation *op) {
  auto f = dyn_cast<FusionOp>(op);
  if (!f || f.getKind() != "elementwise" || f.getNumResults() == 0)
    return false;
  ArrayRef<int64_t> shape = tensorType(f.getResult(0)).getShape();
  if (shape.empty())
    return false;
  for (Value r : f.getResults())
    if (tensorType(r).getShape() != shape)
      return false;
  Block &body = f.getBlock();
  for (Operation &m : body.without_terminator()) {
    if (auto c = dyn_cast<ConstantOp>(m)) {
      // splats become scalars; dense constants are only read by broadcasts
      auto dense = dyn_cast<DenseElementsAttr>(c.getValue());
      if (!dense)
        return false;
      if (!dense.isSplat() && llvm::any_of(m.getUsers(), [](Operation *u) {
            return !isa<BroadcastInDimOp>(u);
          }))
        return false;
      continue;
    }
    if (isLoopInvariantMember(&m))
      continue; // computed once, before the loop
    if (auto bc = dyn_cast<BroadcastInDimOp>(m)) {
      Value src = bc.getOperand();
      bool outside = isa<BlockArgument>(src) || isa_and_nonnull<ConstantOp>(src.getDefiningOp()) ||
                     isLoopInvariantMember(src.getDefiningOp());
      if (!outside || tensorType(bc.getResult()).getShape() != shape)
        return false;
      continue;
    }
    if (!isElementwiseOp(&m) || m.getNumResults() != 1 ||
        tensorType(m.getResult(0)).getShape() != shape)
      return false;
    for (Value v : m.getOperands())
      if (isa<BlockArgument>(v) && tensorType(v).getShape() != shape)
        return false;
  }
  for (Value v : body.getTerminator()->getOperands())
    if (!v.getDefiningOp() || isLoopInvariantMember(v.getDefiningOp()) ||
        tensorType(v).getShape() != shape)
      return false;
  return true;
}

LogicalResult fuseFunction(func::FuncOp fn, const FusionOptions &options,
                           std::vector<FusionRefusal> *refusals) {
  Grouper g(fn, options, refusals);
  return g.run();
}

namespace {
struct KilnFusePass : impl::KilnFusePassBase<KilnFusePass> {
  using KilnFusePassBase::KilnFusePassBase;
  KilnFusePass(const FusionOptions &o, ArrayRef<std::string> fns,
               FusionRefusalsByFunction *collect)
      : base_(o), collect_(collect) {
    disable = !o.enabled;
    gemmEpilogues = o.gemmEpilogues;
    duplicateCheap = o.duplicateCheap;
    functions = SmallVector<std::string>(fns);
  }
  void runOnOperation() override {
    FusionOptions o = base_;
    o.enabled = !disable;
    o.gemmEpilogues = gemmEpilogues;
    o.duplicateCheap = duplicateCheap;
    for (func::FuncOp fn : llvm::make_early_inc_range(getOperation().getOps<func::FuncOp>())) {
      if (!functions.empty() && !llvm::is_contained(functions, fn.getSymName().str()))
        continue;
      std::vector<FusionRefusal> refusals;
      if (failed(fuseFunction(fn, o, remarks || collect_ ? &refusals : nullptr)))
        return signalPassFailure();
      if (remarks)
        for (const FusionRefusal &r : refusals)
          emitRemark(r.where) << "not fused with " << r.producer << ": " << r.rule;
      if (collect_)
        (*collect_)[fn.getSymName().str()] = std::move(refusals);
    }
  }

private:
  FusionOptions base_;
  FusionRefusalsByFunction *collect_ = nullptr;
};
} // namespace

std::unique_ptr<Pass> createKilnFusePass(const FusionOptions &options,
                                         ArrayRef<std::string> functions,
                                         FusionRefusalsByFunction *refusals) {
  return std::make_unique<KilnFusePass>(options, functions, refusals);
}

} // namespace kiln

