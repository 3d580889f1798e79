//===- Grouping.cpp ------------------------------------------------------===//
//
// The Grouper's join rules (canJoin, canMerge), its walk over the function
// (run) and the merges of sibling optimizer updates (siblingMerges).
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

void Grouper::refuse(Operation *producer, Operation *consumer, std::string rule) {
  if (!refusals_ || !options_.enabled || !refused_.insert({producer, consumer}).second)
    return;
  FusionRefusal r{{}, {}, {}, {}, {}, consumer->getLoc()};
  r.producer = producer->getName().getStringRef().str();
  r.producerLoc = locString(producer->getLoc());
  r.consumer = consumer->getName().getStringRef().str();
  r.consumerLoc = locString(consumer->getLoc());
  r.rule = std::move(rule);
  refusals_->push_back(std::move(r));
}

/// Small, row-independent values computed by cheap ops from constants, small
/// function arguments and other such values (the learning-rate schedule, a
/// causal mask from iotas): every group that reads one recomputes it.
bool Grouper::duplicable(Value v, int depth) {
  if (!options_.enabled || !options_.duplicateCheap)
    return false;
  auto it = duplicable_.find(v);
  if (it != duplicable_.end())
    return it->second;
  bool ok = false;
  Operation *def = v.getDefiningOp();
  auto t = dyn_cast<RankedTensorType>(v.getType());
  // A broadcast of a function argument is an index map on a buffer: every
  // reader reads the argument through it.
  // So is a broadcast of a recomputed value (a causal mask over heads).
  if (auto bc = dyn_cast_or_null<BroadcastInDimOp>(def))
    if (isa<BlockArgument>(bc.getOperand()) || isCloneable(bc.getOperand()) ||
        (depth < 24 && duplicable(bc.getOperand(), depth + 1))) {
      duplicable_[v] = true;
      return true;
    }
  // Cheap producers only: transcendental functions are recomputed only on
  // scalars (the learning-rate schedule's cosine), never on tensors.
  if (def && t && t.getNumElements() <= options_.maxDuplicatedElements && depth < 24 &&
      def->getNumResults() == 1 &&
      (isElementwiseOp(def) || isa<BroadcastInDimOp, ReshapeOp, IotaOp>(def)) &&
      !(isExpensive(def) && t.getNumElements() > 1) && !foldedIn_.count(def) &&
      !foldedOut_.count(def)) {
    ok = true;
    for (Value operand : def->getOperands()) {
      if (isCloneable(operand) || duplicable(operand, depth + 1))
        continue;
      auto ot = dyn_cast<RankedTensorType>(operand.getType());
      // A scalar function argument (the step counter) is read by each copy.
      if (isa<BlockArgument>(operand) && ot && ot.getNumElements() == 1)
        continue;
      ok = false;
      break;
    }
  }
  duplicable_[v] = ok;
  return ok;
}

Role Grouper::roleOf(Operation *op) {
  if (isa<ConstantOp>(op))
    return Role::Skip;
  if (isa<ReshapeOp, BroadcastInDimOp>(op) && isCloneable(op->getResult(0)))
    return Role::Skip;
  if (foldedIn_.count(op) || foldedOut_.count(op))
    return Role::Folded;
  if (isa<OptimizationBarrierOp>(op))
    return Role::Alias;
  if (isa<AllReduceOp, ReduceScatterOp, AllGatherOp, TransferOp, CollectiveBroadcastOp>(op))
    return Role::Collective; // communication, never code: fused with nothing
  if (op->getNumResults() == 1 && duplicable(op->getResult(0)))
    return Role::Skip;
  if (isa<AttentionOp, AttentionGradOp>(op)) // the backend's fused attention
    return Role::Library;
  if (auto mm = dyn_cast<MatmulOp>(op)) { // f32, f16, bf16: a library GEMM
    Type et = tensorType(mm.getResult()).getElementType();
    return et.isF32() || et.isF16() || et.isBF16() ? Role::Gemm : Role::Single;
  }
  if (!options_.enabled)
    return isa<ReshapeOp>(op) ? Role::Alias : Role::Single;
  if (isElementwiseOp(op) ||
      isa<BroadcastInDimOp, TransposeOp, ReshapeOp, SliceOp, PadOp, ConcatOp, GatherOp,
          IotaOp, DropoutOp, RandomOp>(op))
    return Role::Elementwise;
  if (isa<ReduceSumOp, ReduceMeanOp, ReduceMaxOp, SoftmaxOp, LogSoftmaxOp, LayerNormOp,
          CrossEntropyOp>(op))
    return Role::Reduction;
  return Role::Single;
}

int Grouper::newGroup(Operation *op, Kind kind) {
  int id = int(groups_.size());
  Group g;
  g.kind = kind;
  g.members.push_back(op);
  g.extDeps.resize(0);
  RowLocality ri = rowInfo(op);
  g.rows = ri.maxRows;
  if (op->getNumResults() == 1) {
    ArrayRef<int64_t> shape = tensorType(op->getResult(0)).getShape();
    g.rowShape.assign(shape.begin(), shape.begin() + std::min<int64_t>(g.rows, shape.size()));
  }
  if (kind == Kind::Gemm) {
    g.gemm = op;
    g.rows = tensorType(op->getResult(0)).getRank() - 1;
    g.rowShape.assign(tensorType(op->getResult(0)).getShape().begin(),
                      tensorType(op->getResult(0)).getShape().end() - 1);
  }
  if (kind == Kind::Row && g.rows == 0) {
    g.kind = Kind::Column;
    ArrayRef<int64_t> in = tensorType(op->getOperand(0)).getShape();
    g.reducedShape.assign(in.begin(), in.end());
    if (auto axes = op->getAttrOfType<DenseI64ArrayAttr>("axes"))
      g.reducedAxes.assign(axes.asArrayRef().begin(), axes.asArrayRef().end());
    else
      g.reducedAxes.push_back(-1); // composite ops reducing everything
  }
  groups_.push_back(std::move(g));
  parent_.push_back(id);
  groupId_[op] = id;
  return id;
}

/// Whether group `g` can take `op` (and the groups `others`, which also feed
/// it): "" or the rule that refuses. `newRows` is the group's row count
/// afterwards.
std::string Grouper::canJoin(int g, Operation *op, ArrayRef<int> others, int64_t &newRows) {
  Group &G = groups_[g];
  Role role = roles_[op];
  // Pipeline stages: a kernel runs on one stage (or on every device).
  if (stageOf(G.members.front()) != stageOf(op))
    return "stage: the op runs on pipeline stage " + std::to_string(stageOf(op)) +
           " and the kernel on stage " + std::to_string(stageOf(G.members.front()));
  for (int o : others)
    if (stageOf(groups_[o].members.front()) != stageOf(op))
      return "stage: a kernel to merge runs on another pipeline stage";
  SmallVector<int> all{g};
  all.append(others.begin(), others.end());
  auto inAll = [&](int x) { return llvm::is_contained(all, x); };

  if (!G.closedBy.empty())
    return G.closedBy;
  for (int o : others)
    if (!groups_[o].closedBy.empty())
      return groups_[o].closedBy;

  // Kind rules.
  if (G.kind == Kind::Single || G.kind == Kind::Library)
    return "producer-kind: " + G.members.front()->getName().getStringRef().str() +
           " has no fused kernel form";
  if (role == Role::Library)
    return "consumer-is-library: " + op->getName().getStringRef().str() +
           " is a library step that reads whole buffers (its operands are materialised)";
  if (role == Role::Gemm)
    return "consumer-is-gemm: a library GEMM reads whole buffers (its operands are "
           "materialised)";
  if (role != Role::Elementwise && role != Role::Reduction)
    return "consumer-kind: " + op->getName().getStringRef().str() +
           " has no fused kernel form";

  // Convexity: no operand from outside may depend on the groups (the
  // schedule rule above implies it; checked for safety).
  for (Value operand : op->getOperands()) {
    Operation *def = operand.getDefiningOp();
    if (!def || isCloneable(operand))
      continue;
    int dg = groupOf(def);
    if (dg >= 0 && inAll(dg))
      continue;
    auto it = deps_.find(def);
    if (it == deps_.end())
      continue;
    for (int x : all)
      if (contains(it->second, x))
        return "cycle: " + def->getName().getStringRef().str() +
               (locString(def->getLoc()).empty() ? "" : " at " + locString(def->getLoc())) +
               " depends on the producer's kernel and feeds this op; fusing would make a "
               "cycle";
  }

  RowLocality ri = rowInfo(op);
  RankedTensorType out = tensorType(op->getResult(0));
  ArrayRef<int64_t> outShape = out.getShape();

  if (G.kind == Kind::Gemm) {
    if (!options_.gemmEpilogues)
      return "producer-is-gemm: GEMM epilogues are disabled";
    if (role != Role::Elementwise || !isElementwiseOp(op))
      return "producer-is-gemm: only elementwise ops join a GEMM as its epilogue (" +
             op->getName().getStringRef().str() + " is not elementwise)";
    if (llvm::any_of(op->getResult(0).getUsers(),
                     [&](Operation *u) { return roles_.lookup(u) == Role::Reduction; }))
      return "producer-is-gemm: the value feeds a reduction, which fuses with it instead of "
             "the GEMM";
    if (outShape != tensorType(G.gemm->getResult(0)).getShape())
      return "producer-is-gemm: an epilogue has the GEMM result's shape (" +
             shapeString(outShape) + " vs " +
             shapeString(tensorType(G.gemm->getResult(0)).getShape()) + ")";
    for (Value operand : op->getOperands()) {
      int dg = operand.getDefiningOp() ? groupOf(operand.getDefiningOp()) : -1;
      if (dg >= 0 && dg != g && inAll(dg))
        return "producer-is-gemm: a GEMM epilogue reads no other kernel's values";
    }
    for (int o : others)
      if (groups_[o].kind == Kind::Gemm)
        return "producer-is-gemm: two GEMMs never share a kernel";
      else
        return "producer-is-gemm: a GEMM epilogue reads no other kernel's values";
    newRows = G.rows;
    return "";
  }
  for (int o : others) {
    if (groups_[o].kind == Kind::Gemm || groups_[o].kind == Kind::Single ||
        groups_[o].kind == Kind::Library)
      return "producer-is-gemm: a GEMM's result is read whole";
    if (std::string why = canMerge(g, o); !why.empty())
      return why;
  }

  if (G.kind == Kind::Column) {
    // Epilogue ops on reduced values, or sibling reductions of the same shape.
    bool readsPrologue = false;
    for (Value operand : op->getOperands()) {
      Operation *def = operand.getDefiningOp();
      if (def && inAll(groupOf(def)) && !isa<ReduceSumOp, ReduceMeanOp, ReduceMaxOp,
                                              CrossEntropyOp>(def) &&
          !columnEpilogue_.count(operand))
        readsPrologue = true;
    }
    if (role == Role::Elementwise && !readsPrologue) {
      // Optimizer updates (which read parameters and state) stay out: as a
      // one-loop kernel of their own they update in place and merge with
      // their siblings.
      for (Value operand : op->getOperands())
        if (isa<BlockArgument>(operand) && !duplicable(operand))
          return "column-epilogue: an epilogue after a column reduction reads no function "
                 "argument (an optimizer update runs as a one-loop kernel, in place)";
      bool reducedShape = llvm::any_of(G.members, [&](Operation *m) {
        return isa<ReduceSumOp, ReduceMeanOp, ReduceMaxOp, CrossEntropyOp>(m) &&
               tensorType(m->getResult(0)).getShape() == outShape;
      });
      if (!reducedShape || out.getNumElements() > options_.maxDuplicatedElements)
        return "column-epilogue: an epilogue after a column reduction works on values of "
               "the reduced shape only (" + shapeString(outShape) + ")";
      newRows = 0;
      return "";
    }
    if (role == Role::Reduction && ri.maxRows == 0) {
      SmallVector<int64_t> axes;
      if (auto a = op->getAttrOfType<DenseI64ArrayAttr>("axes"))
        axes.assign(a.asArrayRef().begin(), a.asArrayRef().end());
      else
        axes.push_back(-1);
      if (tensorType(op->getOperand(0)).getShape() == ArrayRef<int64_t>(G.reducedShape) &&
          axes == G.reducedAxes) {
        newRows = 0;
        return "";
      }
      return "column-sibling: sibling reductions share a kernel only with the same "
             "shape and axes";
    }
    return "reduction-epilogue: after a column reduction only elementwise ops on the "
           "reduced values join its kernel";
  }

  // Elementwise and row groups: the row dimensions must agree.
  int64_t p = std::min<int64_t>(G.rows, ri.maxRows);
  p = std::min<int64_t>(p, commonPrefix(outShape, G.rowShape));
  for (int o : others)
    p = std::min<int64_t>(p, std::min<int64_t>(groups_[o].rows,
                                               commonPrefix(groups_[o].rowShape, G.rowShape)));
  bool dependsOnRows = false;
  for (auto [i, operand] : llvm::enumerate(op->getOperands())) {
    Operation *def = operand.getDefiningOp();
    bool member = def && inAll(groupOf(def)) && !isCloneable(operand);
    bool byRows = ri.rowShaped[i];
    if (member && !byRows && rowDependent(operand))
      return "rows: " + op->getName().getStringRef().str() +
             " reads a row-dependent value of the producer's kernel whole";
    if (byRows && (!member || rowDependent(operand)) && !isCloneable(operand) &&
        !duplicable(operand))
      dependsOnRows = true;
  }
  if (role == Role::Reduction && ri.maxRows == 0) {
    // A reduction over leading dims turns a pure elementwise group into a
    // column reduction; a row group keeps its rows.
    if (G.kind == Kind::Row || llvm::any_of(others, [&](int o) {
          return groups_[o].kind == Kind::Row;
        }))
      return "reduces-rows: the producer's kernel is a row reduction; a reduction over "
             "its rows starts a new kernel";
    // A column kernel writes values of the reduction's input shape or of
    // its reduced shape (the CUDA form, compiler/cuda/Columns.cpp, has a
    // thread or block per kept column, nothing else to index by). A member
    // of another shape that other kernels read would be such an output.
    ArrayRef<int64_t> inShape = tensorType(op->getOperand(0)).getShape();
    for (int x : all)
      for (Operation *m : groups_[x].members)
        for (Value r : m->getResults()) {
          if (isCloneable(r) || tensorType(r).getShape() == inShape)
            continue;
          bool readOutside = llvm::any_of(r.getUsers(), [&](Operation *u) {
            if (u == op)
              return false;
            int ug = groupOf(u);
            return ug < 0 || !inAll(ug);
          });
          if (readOutside)
            return "column-outputs: " + m->getName().getStringRef().str() + "'s " +
                   shapeString(tensorType(r).getShape()) +
                   " result is read by other kernels, and a column reduction's kernel "
                   "writes only values of its input shape " + shapeString(inShape) +
                   " or reduced shape";
        }
    newRows = 0;
    return "";
  }
  bool scalars = outShape.empty() && G.rowShape.empty();
  if (G.kind == Kind::Elementwise && G.members.front()->getNumResults() == 1 &&
      tensorType(G.members.front()->getResult(0)).getRank() == 0 && !outShape.empty())
    return "rows: a kernel of scalars feeds larger kernels as an input (" +
           shapeString(outShape) + " is not a scalar)";
  if (p == 0 && !scalars &&
      (dependsOnRows || out.getNumElements() > options_.maxDuplicatedElements))
    return "rows: the ops share no leading row dimension (" + shapeString(outShape) +
           " vs rows " + shapeString(G.rowShape) + ")";
  if (!dependsOnRows && commonPrefix(outShape, G.rowShape) < p &&
      out.getNumElements() > options_.maxDuplicatedElements)
    return "rows: a value used by every row is too large to recompute per row (" +
           shapeString(outShape) + ")";
  if (dependsOnRows && commonPrefix(outShape, G.rowShape) < p)
    return "rows: " + shapeString(outShape) + " does not have the rows " +
           shapeString(ArrayRef<int64_t>(G.rowShape).take_front(p));
  if (G.kind == Kind::Row && p == 0)
    return "rows: the row reduction's rows would be lost";
  newRows = p;
  return "";
}

std::string Grouper::canMerge(int a, int b) {
  Group &A = groups_[a], &B = groups_[b];
  if (stageOf(A.members.front()) != stageOf(B.members.front()))
    return "stage: the kernels run on different pipeline stages";
  if (contains(A.extDeps, b) || contains(B.extDeps, a))
    return "cycle: one kernel needs the other's results (directly or through other kernels), "
           "so they cannot be one pass";
  if (A.kind == Kind::Column || B.kind == Kind::Column)
    if (A.kind != B.kind || A.reducedShape != B.reducedShape || A.reducedAxes != B.reducedAxes)
      return "column-sibling: sibling reductions share a kernel only with the same shape "
             "and axes";
  if (A.kind == Kind::Gemm || B.kind == Kind::Gemm)
    return "producer-is-gemm: two GEMMs never share a kernel";
  if (A.kind == Kind::Library || B.kind == Kind::Library)
    return "producer-kind: a library step shares its kernel with nothing";
  return "";
}

void Grouper::addTo(int g, Operation *op, int64_t rows) {
  Group &G = groups_[g];
  G.members.push_back(op);
  groupId_[op] = g;
  if (G.kind != Kind::Column && G.kind != Kind::Gemm) {
    G.rows = rows;
    G.rowShape.resize(std::min<int64_t>(rows, G.rowShape.size()));
  }
  Role role = roles_[op];
  if (role == Role::Reduction) {
    if (G.kind == Kind::Elementwise && rows == 0) {
      G.kind = Kind::Column;
      G.reducedShape.assign(tensorType(op->getOperand(0)).getShape().begin(),
                            tensorType(op->getOperand(0)).getShape().end());
      if (auto a = op->getAttrOfType<DenseI64ArrayAttr>("axes"))
        G.reducedAxes.assign(a.asArrayRef().begin(), a.asArrayRef().end());
      else
        G.reducedAxes.push_back(-1);
      G.rows = 0;
      G.rowShape.clear();
    } else if (G.kind == Kind::Elementwise) {
      G.kind = Kind::Row;
    }
  }
  if (G.kind == Kind::Column && role == Role::Elementwise)
    columnEpilogue_.insert(op->getResult(0));
}

void Grouper::merge(int into, int from) {
  Group &A = groups_[into], &B = groups_[from];
  for (Operation *m : B.members)
    groupId_[m] = into;
  A.members.append(B.members.begin(), B.members.end());
  llvm::sort(A.members, [](Operation *x, Operation *y) { return x->isBeforeInBlock(y); });
  if (A.extDeps.size() < B.extDeps.size())
    A.extDeps.resize(B.extDeps.size());
  A.extDeps |= B.extDeps;
  if (B.kind == Kind::Row)
    A.kind = Kind::Row;
  if (A.kind != Kind::Column) {
    A.rows = std::min(A.rows, B.rows);
    A.rowShape.resize(std::min<int64_t>(A.rows, A.rowShape.size()));
  }
  B.members.clear();
  parent_[from] = into;
}

LogicalResult Grouper::run() {
  findFoldedTransposes(block_, foldedIn_, foldedOut_);
  if (!options_.enabled) {
    foldedIn_.clear();
    foldedOut_.clear();
  }
  for (Operation &op : block_)
    roles_[&op] = isa<func::ReturnOp>(op) ? Role::Single : roleOf(&op);

  for (Operation &op : block_) {
    if (isa<func::ReturnOp>(op)) {
      for (Value v : op.getOperands())
        if (Operation *d = v.getDefiningOp(); d && groupOf(d) >= 0)
          refuse(d, &op, "result: the value leaves the function");
      break;
    }
    Role role = roles_[&op];
    // The groups this op depends on, transitively.
    llvm::BitVector deps(groups_.size() + 1);
    for (Value operand : op.getOperands()) {
      Operation *def = operand.getDefiningOp();
      if (!def)
        continue;
      if (auto it = deps_.find(def); it != deps_.end()) {
        if (deps.size() < it->second.size())
          deps.resize(it->second.size());
        deps |= it->second;
      }
      if (auto it = groupId_.find(def); it != groupId_.end()) {
        if (deps.size() <= size_t(it->second))
          deps.resize(it->second + 1);
        deps.set(it->second);
      }
    }
    if (role == Role::Skip || role == Role::Folded || role == Role::Alias ||
        role == Role::Collective) {
      // A barrier, folded transpose or collective reading a kernel's value
      // runs after it.
      if (role == Role::Collective && options_.enabled)
        for (Value operand : op.getOperands())
          if (Operation *def = operand.getDefiningOp(); def && groupOf(def) >= 0)
            refuse(def, &op, "collective: communication between devices is a plan step of "
                             "its own, never part of a kernel");
      if (role != Role::Skip)
        for (Value operand : op.getOperands())
          if (Operation *def = operand.getDefiningOp(); def && groupOf(def) >= 0 &&
                                                        groups_[groupOf(def)].closedBy.empty())
            groups_[groupOf(def)].closedBy =
                "schedule: " + op.getName().getStringRef().str() + " reads the producer's "
                "kernel first, so the kernel runs before it; ops after it start a new kernel";
      deps_[&op] = std::move(deps);
      continue;
    }

    // Candidate groups: those of the operands' producers.
    SmallVector<int> candidates;
    SmallVector<std::pair<Operation *, int>> edges; // producer, group
    for (Value operand : op.getOperands()) {
      Operation *def = operand.getDefiningOp();
      if (!def || isCloneable(operand) || duplicable(operand))
        continue;
      int g = groupOf(def);
      if (g < 0) {
        if (roles_[def] == Role::Folded && options_.enabled)
          refuse(def, &op, "transpose-folded: a GEMM reads or writes this head transpose in "
                           "place (strided layout), so it is no kernel of its own");
        else if (roles_[def] == Role::Alias && options_.enabled)
          refuse(def, &op, "alias: an optimization barrier shares its operand's buffer");
        else if (roles_[def] == Role::Collective && options_.enabled)
          refuse(def, &op, "collective: communication between devices is a plan step of "
                           "its own, never part of a kernel");
        continue;
      }
      edges.push_back({def, g});
      if (!llvm::is_contained(candidates, g))
        candidates.push_back(g);
    }

    int joined = -1;
    int64_t rows = 0;
    if (role == Role::Elementwise || role == Role::Reduction) {
      // All candidates at once (siblings merge through their common
      // consumer), else the latest candidate that takes the op.
      llvm::sort(candidates, [&](int a, int b) {
        return groups_[a].members.back()->isBeforeInBlock(groups_[b].members.back());
      });
      if (!candidates.empty()) {
        int last = candidates.back();
        SmallVector<int> others(candidates.begin(), candidates.end() - 1);
        if (canJoin(last, &op, others, rows).empty()) {
          for (int o : others)
            merge(last, o);
          joined = last;
        } else {
          for (int c = int(candidates.size()) - 1; c >= 0 && joined < 0; --c)
            if (canJoin(candidates[c], &op, {}, rows).empty())
              joined = candidates[c];
        }
      }
    }
    if (joined >= 0 && !options_.enabled)
      joined = -1;
    for (auto [def, g] : edges) {
      int root = find(g);
      if (root == joined)
        continue;
      int64_t ignored;
      std::string why = canJoin(root, &op, {}, ignored);
      if (why.empty()) {
        // It could have joined this kernel alone; it joined another one, and
        // the two do not merge.
        Operation *other = groups_[joined].members.front();
        std::string merge = canMerge(joined, root);
        if (merge.empty())
          merge = "kinds " + std::string(kindName(groups_[joined].kind)) + " and " +
                  kindName(groups_[root].kind) + " do not share a kernel";
        why = "merge: the op joined the kernel of " + other->getName().getStringRef().str() +
              (locString(other->getLoc()).empty() ? "" : " at " + locString(other->getLoc())) +
              ", which cannot merge with this one (" + merge.substr(0, merge.find(':')) + ")";
      }
      refuse(def, &op, why);
    }
    if (joined >= 0) {
      addTo(joined, &op, rows);
    } else {
      Kind kind = role == Role::Gemm          ? Kind::Gemm
                  : role == Role::Library     ? Kind::Library
                  : role == Role::Elementwise ? Kind::Elementwise
                  : role == Role::Reduction   ? Kind::Row
                                              : Kind::Single;
      joined = newGroup(&op, kind);
    }
    // Groups whose values this op reads without joining them are complete.
    for (Value operand : op.getOperands()) {
      Operation *def = operand.getDefiningOp();
      int g = def ? groupOf(def) : -1;
      if (g < 0 || g == joined || !groups_[g].closedBy.empty() || isCloneable(operand) ||
          duplicable(operand))
        continue;
      groups_[g].closedBy =
          "schedule: " + op.getName().getStringRef().str() +
          (locString(op.getLoc()).empty() ? "" : " at " + locString(op.getLoc())) +
          " reads the producer's kernel first, so the kernel runs before it; ops after it "
          "start a new kernel";
    }
    // Row independence of the op's value inside its group.
    Group &G = groups_[joined];
    if (op.getNumResults() == 1 && G.kind != Kind::Gemm) {
      RowLocality ri = rowInfo(&op);
      bool dep = false;
      for (auto [i, operand] : llvm::enumerate(op.getOperands())) {
        if (!ri.rowShaped[i] || isCloneable(operand) || duplicable(operand))
          continue;
        Operation *def = operand.getDefiningOp();
        bool member = def && groupOf(def) == joined;
        dep |= !member || rowDependent(operand);
      }
      if (!dep && G.rows > 0)
        rowIndependent_.insert(op.getResult(0));
    }
    // The group's external dependencies grow by this op's outside operands.
    for (Value operand : op.getOperands()) {
      Operation *def = operand.getDefiningOp();
      if (!def || groupOf(def) == joined)
        continue;
      llvm::BitVector d(groups_.size() + 1);
      if (auto it = deps_.find(def); it != deps_.end()) {
        d.resize(std::max(d.size(), it->second.size()));
        d |= it->second;
      }
      if (auto it = groupId_.find(def); it != groupId_.end())
        d.set(it->second);
      if (G.extDeps.size() < d.size())
        G.extDeps.resize(d.size());
      G.extDeps |= d;
    }
    deps_[&op] = std::move(deps);
  }
  siblingMerges();
  return materialize();
}

/// Column reductions of the same shape and axes that read a common input
/// and do not depend on each other share a kernel (layer_norm's scale and
/// bias gradients); elementwise groups whose values all leave the function
/// (optimizer updates) and that read a common input merge when their
/// shapes agree.
void Grouper::siblingMerges() {
  if (!options_.enabled)
    return;
  // The values a group reads, through the cones it recomputes.
  auto inputsOf = [&](int g) {
    llvm::SetVector<Value> ins;
    std::function<void(Value)> add = [&](Value v) {
      Operation *d = v.getDefiningOp();
      if (isCloneable(v) || (d && groupOf(d) == g))
        return;
      if (duplicable(v)) {
        for (Value o : d->getOperands())
          add(o);
        return;
      }
      ins.insert(v);
    };
    for (Operation *m : groups_[g].members)
      for (Value v : m->getOperands())
        add(v);
    return ins;
  };
  auto onlyResults = [&](int g) {
    for (Operation *m : groups_[g].members)
      for (Value r : m->getResults())
        for (Operation *u : r.getUsers())
          if (!isa<func::ReturnOp>(u) && groupOf(u) != g)
            return false;
    return true;
  };
  for (size_t a = 0; a < groups_.size(); ++a) {
    if (find(int(a)) != int(a) || groups_[a].members.empty())
      continue;
    for (size_t b = a + 1; b < groups_.size(); ++b) {
      if (find(int(b)) != int(b) || groups_[b].members.empty())
        continue;
      Group &A = groups_[a], &B = groups_[b];
      bool column = A.kind == Kind::Column && B.kind == Kind::Column &&
                    A.reducedShape == B.reducedShape && A.reducedAxes == B.reducedAxes;
      // Optimizer updates merge up to a size where one thread's share of
      // the kernel still fits in registers on a GPU (about four AdamW
      // updates: 12 outputs, 16 inputs).
      bool update = A.kind == Kind::Elementwise && B.kind == Kind::Elementwise &&
                    A.rowShape == B.rowShape && A.rows == B.rows &&
                    A.members.size() + B.members.size() <= options_.maxSiblingOps &&
                    onlyResults(int(a)) && onlyResults(int(b));
      if (!column && !update)
        continue;
      if (std::string why = canMerge(int(a), int(b)); !why.empty()) {
        // Report siblings that read a common input but cannot share a
        // kernel (a cycle through other kernels, say).
        llvm::SetVector<Value> ia = inputsOf(int(a)), ib = inputsOf(int(b));
        if (llvm::any_of(ia, [&](Value v) { return ib.contains(v); }))
          refuse(A.members.front(), B.members.back(), why);
        continue;
      }
      // Merging runs the earlier group at the later one's place, keeping its
      // inputs alive until then: only siblings with no GEMM between them
      // (the same layer's backward; the optimizer after the global norm).
      auto [first, second] = A.members.back()->isBeforeInBlock(B.members.front())
                                 ? std::make_pair(&A, &B)
                                 : std::make_pair(&B, &A);
      bool gemmBetween = false;
      for (Operation *o = first->members.back()->getNextNode();
           o && o != second->members.front(); o = o->getNextNode())
        if (isa<MatmulOp>(o)) {
          gemmBetween = true;
          break;
        }
      if (gemmBetween)
        continue;
      llvm::SetVector<Value> ia = inputsOf(int(a)), ib = inputsOf(int(b));
      if (!llvm::any_of(ia, [&](Value v) { return ib.contains(v); }))
        continue;
      merge(int(a), int(b));
    }
  }
}

} // namespace kiln::fusion
