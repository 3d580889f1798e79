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

bool isHeadTranspose(Operation *op) {
  auto t = dyn_cast_or_null<TransposeOp>(op);
  if (!t)
    return false;
  auto type = cast<RankedTensorType>(t.getType());
  ArrayRef<int64_t> perm = t.getPermutation();
  return type.getRank() == 4 && type.getElementType().isF32() &&
         perm == ArrayRef<int64_t>{0, 2, 1, 3};
}

bool isHeadMatmul(Operation *op) {
  auto mm = dyn_cast_or_null<MatmulOp>(op);
  return mm && cast<RankedTensorType>(mm.getType()).getElementType().isF32() &&
         cast<RankedTensorType>(mm.getLhs().getType()).getRank() == 4 &&
         cast<RankedTensorType>(mm.getRhs().getType()).getRank() == 4 &&
         cast<RankedTensorType>(mm.getType()).getRank() == 4;
}

void findFoldedTransposes(Block &block, llvm::DenseSet<Operation *> &in,
                          llvm::DenseSet<Operation *> &out) {
  in.clear();
  out.clear();
  for (Operation &op : block) {
    if (!isHeadTranspose(&op) || isCloneable(op.getOperand(0)))
      continue;
    if (!op.getResult(0).use_empty() &&
        llvm::all_of(op.getResult(0).getUsers(), [](Operation *u) { return isHeadMatmul(u); }))
      in.insert(&op);
  }
  for (Operation &op : block) {
    if (!isHeadMatmul(&op) || !op.getResult(0).hasOneUse())
      continue;
    Operation *user = *op.getResult(0).getUsers().begin();
    if (isHeadTranspose(user) && !in.count(user))
      out.insert(user);
  }
}

namespace {

RankedTensorType tensorType(Value v) { return cast<RankedTensorType>(v.getType()); }

std::string shapeString(ArrayRef<int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? "x" : "") + std::to_string(shape[i]);
  return s + "]";
}

/// What role an op can play in a group.
enum class Role {
  Skip,        ///< constants (and cheap duplicated values): cloned into users
  Elementwise, ///< elementwise ops, broadcasts and data movement (index maps)
  Reduction,   ///< reductions and the composite row ops
  Gemm,        ///< a library GEMM (float32 kiln.matmul)
  Single,      ///< has no fused form: a kernel of its own
  Alias,       ///< produces no code (optimization_barrier): shares its operand
  Folded,      ///< folded into a GEMM (head transposes)
  Collective,  ///< a collective (all_reduce, ...): a plan step between kernels
};

/// The first dimensions of `a` and `b` that agree.
int64_t commonPrefix(ArrayRef<int64_t> a, ArrayRef<int64_t> b) {
  int64_t n = 0;
  while (n < int64_t(a.size()) && n < int64_t(b.size()) && a[n] == b[n])
    ++n;
  return n;
}

/// How an op's rows relate to its operands (RowLocalityOpInterface, answered
/// in each op's family file): none for an op without the interface.
RowLocality rowInfo(Operation *op) {
  if (auto rows = dyn_cast<RowLocalityOpInterface>(op))
    return rows.getRowLocality();
  RowLocality info;
  info.rowShaped.assign(op->getNumOperands(), true);
  return info;
}

/// The transcendental functions (expensive to recompute).
bool isExpensive(Operation *op) { return op->hasTrait<trait::Transcendental>(); }

enum class Kind { Elementwise, Row, Column, Gemm, Single };

const char *kindName(Kind k) {
  switch (k) {
  case Kind::Elementwise: return "elementwise";
  case Kind::Row: return "row_reduction";
  case Kind::Column: return "column_reduction";
  case Kind::Gemm: return "gemm_epilogue";
  case Kind::Single: return "single";
  }
  return "single";
}

struct Group {
  Kind kind = Kind::Single;
  int64_t rows = 0;             ///< number of leading row dimensions
  SmallVector<int64_t> rowShape; ///< their sizes (the first `rows` dims)
  SmallVector<Operation *> members;
  llvm::BitVector extDeps; ///< groups that the members' outside operands depend on
  /// Column groups: the shape and axes every reduction of the group has.
  SmallVector<int64_t> reducedShape, reducedAxes;
  Operation *gemm = nullptr; ///< the GEMM of a gemm_epilogue group
  /// Set once an op outside the group reads one of its values: the kernel
  /// then runs before that op, and ops after it cannot join (that would
  /// move the kernel, and its outputs' lifetimes, later or earlier).
  std::string closedBy;
};

class Grouper {
public:
  Grouper(func::FuncOp fn, const FusionOptions &options, std::vector<FusionRefusal> *refusals)
      : fn_(fn), block_(fn.getBody().front()), options_(options), refusals_(refusals) {}

  LogicalResult run();

private:
  // --- union-find over group ids -------------------------------------------
  int find(int g) {
    while (parent_[g] != g)
      g = parent_[g] = parent_[parent_[g]];
    return g;
  }
  int groupOf(Operation *op) {
    auto it = groupId_.find(op);
    return it == groupId_.end() ? -1 : find(it->second);
  }
  /// Whether any group id in `set` belongs to group `g`.
  bool contains(const llvm::BitVector &set, int g) {
    for (int b : set.set_bits())
      if (find(b) == g)
        return true;
    return false;
  }
  void refuse(Operation *producer, Operation *consumer, std::string rule);

  Role roleOf(Operation *op);
  bool duplicable(Value v, int depth = 0);
  /// Whether the member value `v` of its group depends on rows.
  bool rowDependent(Value v) { return !rowIndependent_.count(v); }
  /// Tries to add `op` to group `g` (possibly merging `others` in too);
  /// returns "" on success or the refusal rule.
  std::string canJoin(int g, Operation *op, ArrayRef<int> others, int64_t &newRows);
  std::string canMerge(int a, int b);
  void addTo(int g, Operation *op, int64_t rows);
  void merge(int into, int from);
  int newGroup(Operation *op, Kind kind);
  void siblingMerges();
  LogicalResult materialize();
  void placeShrinkingKernels();

  func::FuncOp fn_;
  Block &block_;
  FusionOptions options_;
  std::vector<FusionRefusal> *refusals_;
  std::vector<Group> groups_;
  std::vector<int> parent_;
  llvm::DenseMap<Operation *, int> groupId_;
  llvm::DenseMap<Operation *, llvm::BitVector> deps_;
  llvm::DenseMap<Operation *, Role> roles_;
  llvm::DenseMap<Value, bool> duplicable_;
  llvm::DenseSet<Value> rowIndependent_;
  llvm::DenseSet<Value> columnEpilogue_; ///< epilogue values of column groups
  llvm::DenseSet<std::pair<Operation *, Operation *>> refused_; ///< edges reported
  llvm::DenseSet<Operation *> foldedIn_, foldedOut_;
};

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
  if (G.kind == Kind::Single)
    return "producer-kind: " + G.members.front()->getName().getStringRef().str() +
           " has no fused kernel form";
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
    if (groups_[o].kind == Kind::Gemm || groups_[o].kind == Kind::Single)
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
           r == Role::Collective || (r == Role::Gemm) || (isa<ReshapeOp>(user) && groupOf(user) < 0);
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
      if (isa<MatmulOp>(m)) { // a library call reads buffers
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

} // namespace

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
