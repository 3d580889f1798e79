//===- Materialize.cpp ---------------------------------------------------===//
//
// Groups into kiln.fusion ops (materialize: members moved into an isolated
// region, cheap producers and constants cloned in, the body re-sorted) and
// the placement of kernels whose outputs are smaller than their inputs.
//
//===----------------------------------------------------------------------===//
#include "passes/fusion/Grouper.h"
#include "passes/Fusion.h"
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

namespace kiln::fusion {


/// Moves every group into a kiln.fusion op at its last member's position,
/// clones constants and duplicated values into the bodies, and re-sorts the
/// block so every value is defined before it is used.
LogicalResult Grouper::materialize() {
  MLIRContext *ctx = fn_.getContext();
  OpBuilder b(ctx);
  auto recomputed = [&](Value v) { return isCloneable(v) || duplicable(v); };

  // Reshapes whose results no other member reads produce no code (their
  // buffer is the operand's): they leave their group.
  for (Group &G : groups_) {
    bool changed = true;
    while (changed && G.members.size() > 1) {
      changed = false;
      for (size_t i = 0; i < G.members.size(); ++i) {
        Operation *m = G.members[i];
        if (!isa<ReshapeOp>(m) || isCloneable(m->getOperand(0)))
          continue;
        bool readInside = llvm::any_of(m->getResult(0).getUsers(), [&](Operation *u) {
          return llvm::is_contained(G.members, u);
        });
        if (readInside)
          continue;
        groupId_.erase(m);
        G.members.erase(G.members.begin() + i);
        changed = true;
        break;
      }
    }
  }

  // Values that ops outside every fusion read (GEMM operands, results,
  // barriers, folded transposes) but that are otherwise recomputed:
  // materialise them with a kernel of their own, just after their producer.
  auto needsBuffer = [&](Operation *user) {
    Role r = roles_.lookup(user);
    return isa<func::ReturnOp>(user) || r == Role::Alias || r == Role::Folded ||
           r == Role::Collective || r == Role::Gemm || r == Role::Library ||
           (isa<ReshapeOp>(user) && groupOf(user) < 0);
  };
  llvm::SetVector<Value> toMaterialize;
  for (Operation &op : block_)
    if (needsBuffer(&op))
      for (Value v : op.getOperands())
        if (v.getDefiningOp() && recomputed(v))
          toMaterialize.insert(v);

  auto buildFusion = [&](ArrayRef<Operation *> members, StringRef kind, int64_t rows,
                         llvm::SmallPtrSetImpl<Operation *> &memberSet,
                         ArrayRef<Value> forcedOutputs, Operation *insertAfter) {
    llvm::SetVector<Value> inputs;
    llvm::SetVector<Operation *> cloned; // constant / duplicated cones, in order
    std::function<void(Value)> collect = [&](Value v) {
      Operation *d = v.getDefiningOp();
      if (d && memberSet.count(d))
        return;
      if (d && recomputed(v)) {
        for (Value o : d->getOperands())
          collect(o);
        cloned.insert(d);
        return;
      }
      inputs.insert(v);
    };
    for (Operation *m : members) {
      if (isa<MatmulOp, AttentionOp, AttentionGradOp>(m)) { // a library call reads buffers
        for (Value v : m->getOperands())
          inputs.insert(v);
        continue;
      }
      for (Value v : m->getOperands())
        collect(v);
    }
    SmallVector<Value> outputs(forcedOutputs.begin(), forcedOutputs.end());
    for (Operation *m : members)
      for (Value r : m->getResults())
        if (!llvm::is_contained(outputs, r) &&
            (members.size() == 1 || llvm::any_of(r.getUsers(), [&](Operation *u) {
               return !memberSet.count(u);
             })))
          outputs.push_back(r);
    b.setInsertionPointAfter(insertAfter);
    SmallVector<Type> outTypes;
    for (Value v : outputs)
      outTypes.push_back(v.getType());
    Location loc = members.back()->getLoc();
    auto fusion = b.create<FusionOp>(loc, outTypes, inputs.getArrayRef(),
                                     b.getStringAttr(kind), b.getI64IntegerAttr(rows));
    if (Attribute st = members.back()->getAttr(kStageAttr))
      fusion->setAttr(kStageAttr, st);
    Block *body = new Block();
    fusion.getBody().push_back(body);
    IRMapping map;
    for (Value v : inputs)
      map.map(v, body->addArgument(v.getType(), v.getLoc()));
    OpBuilder ib = OpBuilder::atBlockEnd(body);
    for (Operation *c : cloned)
      if (!map.contains(c->getResult(0)))
        ib.clone(*c, map);
    for (Operation *m : members) {
      if (memberSet.count(m) && m->getBlock() == &block_) {
        m->moveBefore(body, body->end());
        for (OpOperand &use : m->getOpOperands())
          if (Value nv = map.lookupOrNull(use.get()))
            use.set(nv);
      }
    }
    ib.setInsertionPointToEnd(body);
    SmallVector<Value> yielded;
    for (Value v : outputs)
      yielded.push_back(map.lookupOrDefault(v));
    ib.create<YieldOp>(loc, yielded);
    return std::make_pair(fusion, outputs);
  };

  // Materialising kernels: clones of the recomputed cone, one output.
  for (Value v : toMaterialize) {
    b.setInsertionPointAfter(v.getDefiningOp());
    llvm::SetVector<Value> inputs;
    llvm::SetVector<Operation *> cone;
    std::function<void(Value)> collect = [&](Value x) {
      Operation *d = x.getDefiningOp();
      if (d && recomputed(x)) {
        for (Value o : d->getOperands())
          collect(o);
        cone.insert(d);
        return;
      }
      inputs.insert(x);
    };
    collect(v);
    auto t = tensorType(v);
    auto f = b.create<FusionOp>(v.getLoc(), TypeRange{v.getType()}, inputs.getArrayRef(),
                                b.getStringAttr("elementwise"),
                                b.getI64IntegerAttr(t.getRank()));
    if (Attribute st = v.getDefiningOp()->getAttr(kStageAttr))
      f->setAttr(kStageAttr, st);
    Block *body = new Block();
    f.getBody().push_back(body);
    IRMapping map;
    for (Value x : inputs)
      map.map(x, body->addArgument(x.getType(), x.getLoc()));
    OpBuilder ib = OpBuilder::atBlockEnd(body);
    for (Operation *c : cone)
      ib.clone(*c, map);
    ib.create<YieldOp>(v.getLoc(), ValueRange{map.lookup(v)});
    v.replaceUsesWithIf(f.getResult(0), [&](OpOperand &use) {
      return use.getOwner()->getBlock() == &block_ && needsBuffer(use.getOwner());
    });
  }

  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    if (find(int(gi)) != int(gi) || groups_[gi].members.empty())
      continue;
    Group &G = groups_[gi];
    if (llvm::all_of(G.members, [](Operation *m) { return isa<ReshapeOp>(m); }))
      continue; // reshapes alone are aliases
    llvm::SmallPtrSet<Operation *, 16> members(G.members.begin(), G.members.end());
    Kind kind = G.kind;
    int64_t rows = kind == Kind::Column ? 0 : G.rows;
    if (G.members.size() == 1 && kind == Kind::Single) {
      Operation *m = G.members.front();
      RowLocality ri = rowInfo(m);
      Role r = roles_[m];
      if (isElementwiseOp(m) || isa<BroadcastInDimOp, TransposeOp, SliceOp, PadOp, ConcatOp,
                                    GatherOp, IotaOp, DropoutOp, RandomOp>(m))
        kind = Kind::Elementwise, rows = ri.maxRows;
      else if (isa<ReduceSumOp, ReduceMeanOp, ReduceMaxOp, SoftmaxOp, LogSoftmaxOp,
                   LayerNormOp, CrossEntropyOp>(m))
        kind = ri.maxRows > 0 ? Kind::Row : Kind::Column, rows = ri.maxRows;
      (void)r;
    }
    if (kind == Kind::Gemm)
      rows = G.rows;
    const char *kindStr = kind == Kind::Gemm && G.members.size() == 1 ? "gemm" : kindName(kind);
    auto [fusion, outputs] = buildFusion(G.members, kindStr, rows, members, {}, G.members.back());
    Block *body = &fusion.getBlock();
    for (auto [v, r] : llvm::zip(outputs, fusion.getResults()))
      v.replaceUsesWithIf(r, [&](OpOperand &use) { return use.getOwner()->getBlock() != body; });
  }
  // Duplicated values whose every reader is now a fusion are dead.
  bool sorted = sortTopologically(&block_);
  eraseDeadOps(block_);
  if (!sorted)
    return fn_.emitOpError() << "kiln-fuse made a cycle (a Kiln bug)";
  placeShrinkingKernels();
  return success();
}

/// A kernel runs where its last member was; one that writes fewer bytes
/// than it reads (a reduction, or an epilogue that pulled it towards a late
/// consumer) moves up to just after its last input, so its inputs die
/// sooner.
void Grouper::placeShrinkingKernels() {
  auto bytes = [](TypeRange types) {
    int64_t n = 0;
    for (Type t : types)
      if (auto rt = dyn_cast<RankedTensorType>(t))
        n += rt.getNumElements() * std::max<int64_t>(1, rt.getElementTypeBitWidth() / 8);
    return n;
  };
  SmallVector<FusionOp> fusions(block_.getOps<FusionOp>());
  for (FusionOp f : fusions) {
    // Only inputs that can die count (arguments live throughout).
    SmallVector<Type> freed;
    for (Value v : f.getOperands())
      if (!isa<BlockArgument>(v))
        freed.push_back(v.getType());
    if (bytes(f.getResultTypes()) >= bytes(freed))
      continue;
    // Parameter updates stay late: moved early they would run before the
    // backward ops that still read the old values.
    if (llvm::any_of(f->getUsers(), [](Operation *u) { return isa<func::ReturnOp>(u); }))
      continue;
    // Readers of an overlapped collective (a gradient bucket's unpacking)
    // stay where the data-parallel pass put them, at their first use:
    // moved up they would make the compute queue wait for the collective.
    if (llvm::any_of(f.getOperands(), [](Value v) {
          Operation *d = v.getDefiningOp();
          return d && d->hasAttr(KilnDialect::kOverlapAttr);
        }))
      continue;
    Operation *after = nullptr;
    for (Value v : f.getOperands()) {
      Operation *d = v.getDefiningOp();
      if (d && d->getBlock() == &block_ && (!after || after->isBeforeInBlock(d)))
        after = d;
    }
    if (!after)
      f->moveBefore(&block_.front());
    else if (after->getNextNode() != f.getOperation())
      f->moveAfter(after);
  }
}


} // namespace kiln::fusion
