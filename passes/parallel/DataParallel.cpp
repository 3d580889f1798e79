//===- DataParallel.cpp - The per-device train step of data parallelism ---===//
//
// From the tagged @train_step kiln-train-step builds under a mesh with dp > 1
// (docs/parallel.md, "The data-parallel pass"):
//   gradients   -> flat buckets, one all_reduce (mean) or reduce_scatter
//                  each, right after the bucket's last gradient (kiln.overlap)
//   loss        -> all_reduce (mean)
//   grad norm   -> sqrt(all_reduce_sum(sum over this device's blocks of g^2))
//   ZeRO-1/2    -> optimizer state sharded (kiln.shard), the update on the
//                  local block, all_gather of the parameter blocks
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"

#include "dialects/kiln/KilnDialect.h"
#include "dialects/kiln/KilnOps.h"
#include "dialects/kiln/Sharding.h"
#include "dialects/kiln/TrainSettings.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/IRMapping.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringSet.h"

#include <map>

using namespace mlir;

namespace kiln {
#define GEN_PASS_DEF_KILNDATAPARALLELPASS
#include "passes/Passes.h.inc"

namespace {

constexpr StringLiteral kAxis = "dp";

/// The shardings of @train_step's arguments: batch inputs split on dim 0
/// over dp, parameters, step and (unsharded) state replicated, ZeRO state
/// split; "replica" differs per device without being a split (unknown).
llvm::DenseMap<Value, TensorSharding> argumentShardings(func::FuncOp f, StringRef axis) {
  llvm::DenseMap<Value, TensorSharding> known;
  for (BlockArgument a : f.getArguments()) {
    int64_t rank = cast<RankedTensorType>(a.getType()).getRank();
    unsigned i = a.getArgNumber();
    if (auto in = f.getArgAttrOfType<StringAttr>(i, KilnDialect::kInputAttr)) {
      if (in.getValue() == "replica")
        continue;
      known[a] = in.getValue() == "step" || rank == 0
                     ? TensorSharding::replicated(rank)
                     : TensorSharding::splitOn(rank, 0, axis);
    } else if (auto sh = f.getArgAttrOfType<DictionaryAttr>(i, kShardAttr);
               sh && ((sh.getAs<StringAttr>("axis") &&
                       sh.getAs<StringAttr>("axis").getValue() == axis) ||
                      (sh.getAs<StringAttr>("zero") &&
                       sh.getAs<StringAttr>("zero").getValue() == axis))) {
      known[a] = TensorSharding::splitOn(rank, 0, axis); // ZeRO
    } else {
      // Replicated over dp (a tensor-parallel block is the same on every
      // dp replica).
      known[a] = TensorSharding::replicated(rank);
    }
  }
  return known;
}

/// Before the rewrite: the batch split propagates through the step and no
/// gradient or loss comes out split over dp (which would mean a batch
/// dimension reached a parameter's gradient unreduced). Values the rule
/// table cannot follow are not judged.
LogicalResult checkDataParallelSharding(func::FuncOp f, StringRef axis) {
  llvm::DenseMap<Value, TensorSharding> known = argumentShardings(f, axis);
  propagateShardings(f.getBody().front(), known);
  for (Operation &op : f.getBody().front()) {
    bool grad = op.hasAttr(kDpGradAttr), loss = op.hasAttr(kDpLossAttr);
    if (!grad && !loss)
      continue;
    auto it = known.find(op.getResult(0));
    if (it == known.end())
      continue;
    if (it->second.isSplitOver(axis))
      return op.emitError() << "kiln-data-parallel: the "
                            << (grad ? "gradient of '" +
                                           op.getAttrOfType<StringAttr>(kDpGradAttr).getValue().str() +
                                           "'"
                                     : std::string("loss"))
                            << " is split over " << axis << " ("
                            << shardingToString(it->second)
                            << "), not a partial sum: the model must reduce over its batch";
  }
  return success();
}

/// Attaches kiln.sharding to every op of f whose results the table follows.
void annotateShardings(func::FuncOp f, StringRef axis) {
  llvm::DenseMap<Value, TensorSharding> known = argumentShardings(f, axis);
  propagateShardings(f.getBody().front(), known);
  MLIRContext *ctx = f.getContext();
  for (Operation &op : f.getBody().front()) {
    if (op.getNumResults() == 0)
      continue;
    SmallVector<Attribute> attrs;
    for (Value r : op.getResults()) {
      auto it = known.find(r);
      if (it == known.end())
        break;
      attrs.push_back(shardingToAttr(ctx, it->second));
    }
    if (attrs.size() == op.getNumResults())
      op.setAttr(kShardingAttr, ArrayAttr::get(ctx, attrs));
  }
}

/// One parameter's gradient, as kiln-train-step tagged it.
struct Grad {
  unsigned param = 0;     ///< the parameter's argument number
  std::string name;       ///< the parameter's name
  Operation *tag = nullptr;
  RankedTensorType type;  ///< the parameter's (logical) type
  int64_t numel = 0;
  int64_t block = 0;      ///< ceil(numel / N): the ZeRO block size
  int64_t bucket = -1;
  int64_t stage = -1;     ///< the owner's pipeline stage (-1: none)
  Value reduced;          ///< the reduced full gradient (DP, ZeRO-1)
  Value shard;            ///< this device's block of the reduced gradient
};

class Rewriter {
public:
  Rewriter(func::FuncOp f, int64_t n, int zero, Type reduceType,
           llvm::StringMap<int64_t> owners = {}, bool deterministic = false,
           bool combineScalars = false)
      : f_(f), n_(n), zero_(zero), reduceType_(reduceType), owners_(std::move(owners)),
        deterministic_(deterministic), combineScalars_(combineScalars), b_(f.getContext()) {
    if (deterministic_)
      average_ = CollectiveReduction::sum;
  }

  LogicalResult run(double firstMb, double restMb, int64_t &buckets,
                    int64_t &collectives, int64_t &bytes);

private:
  func::FuncOp f_;
  int64_t n_;
  int zero_;
  /// The element type buckets travel in (grad_reduce): null to keep the
  /// gradients' own, bf16 to halve the bytes of f32 gradients.
  Type reduceType_;
  llvm::StringMap<int64_t> owners_; ///< pipeline stages: each parameter's owner
  /// deterministic = "devices": kiln-train-step already scaled the tagged
  /// gradients and loss by 1 / chunks, so they are summed (in the
  /// communicator's tree order, which kiln-run sets), not averaged.
  bool deterministic_ = false;
  CollectiveReduction average_ = CollectiveReduction::mean;
  /// One all_reduce for the step's scalars (loss, the norm's sum of
  /// squares, the stop flag) instead of one each: on a mesh of dp alone.
  bool combineScalars_ = false;
  OpBuilder b_;
  Value replica_;
  std::vector<Grad> grads_; ///< in backward order
  std::vector<std::vector<size_t>> buckets_;
  int64_t collectives_ = 0;
  /// Ops that unpack a bucket's result (slices, reshapes), in creation order:
  /// moved to just before their first use at the end, so that queue 0 does
  /// not wait for the collective before the rest of backward.
  std::vector<Operation *> unpack_;
  void sinkUnpacking();

  Location loc(Operation *op) { return op->getLoc(); }
  /// Provenance: the new ops say what they are (locString still finds the
  /// model file's line inside).
  Location named(const std::string &what, Location l) {
    return NameLoc::get(b_.getStringAttr(what), l);
  }
  RankedTensorType vec(int64_t n, Type e) { return RankedTensorType::get({n}, e); }

  Value reshape(Location l, Value v, RankedTensorType t) {
    if (v.getType() == t)
      return v;
    return b_.create<ReshapeOp>(l, t, v);
  }
  Value flatten(Location l, Value v) {
    auto t = cast<RankedTensorType>(v.getType());
    return reshape(l, v, vec(t.getNumElements(), t.getElementType()));
  }
  Value slice1(Location l, Value v, int64_t start, int64_t limit) {
    auto t = cast<RankedTensorType>(v.getType());
    if (start == 0 && limit == t.getDimSize(0) && t.getRank() == 1)
      return v;
    return b_.create<SliceOp>(l, v, ArrayRef<int64_t>{start}, ArrayRef<int64_t>{limit},
                              ArrayRef<int64_t>{1});
  }
  /// v (any shape, numel elements) as [N, block], zero-padded: row d is
  /// block d of the row-major flattening.
  Value blocks(Location l, Value v, const Grad &g) {
    Value flat = flatten(l, v);
    int64_t pad = g.block * n_ - g.numel;
    if (pad > 0)
      flat = b_.create<PadOp>(l, vec(g.block * n_, g.type.getElementType()), flat,
                              b_.getDenseI64ArrayAttr({0}), b_.getDenseI64ArrayAttr({pad}),
                              b_.getDenseI64ArrayAttr({0}), b_.getF64FloatAttr(0.0));
    return reshape(l, flat, RankedTensorType::get({n_, g.block}, g.type.getElementType()));
  }
  /// This device's block of v: row `replica` of blocks(v).
  Value localBlock(Location l, Value v, const Grad &g) {
    Value rows = blocks(l, v, g);
    Value idx = reshape(l, replica_, vec(1, replica_.getType().cast<ShapedType>().getElementType()));
    Value row = b_.create<GatherOp>(l, RankedTensorType::get({1, g.block}, g.type.getElementType()),
                                    rows, idx, b_.getI64IntegerAttr(0));
    return reshape(l, row, vec(g.block, g.type.getElementType()));
  }

  /// grad_reduce = bf16: the flat bucket `v` rounded to the reduce type
  /// before its collective (v unchanged where the types agree).
  Value narrow(Location l, Value v) {
    auto t = cast<RankedTensorType>(v.getType());
    if (!reduceType_ || t.getElementType() == reduceType_ || !t.getElementType().isF32())
      return v;
    return b_.create<CastOp>(l, RankedTensorType::get(t.getShape(), reduceType_), v);
  }
  /// ... and the collective's result `r` widened back to `elem` after it
  /// (an unpacking op: sunk to the first use with the slices).
  Value widen(Location l, Value r, Type elem) {
    auto t = cast<RankedTensorType>(r.getType());
    if (t.getElementType() == elem)
      return r;
    auto c = b_.create<CastOp>(l, RankedTensorType::get(t.getShape(), elem), r);
    unpack_.push_back(c);
    return c;
  }

  LogicalResult collect();
  void makeBuckets(double firstMb, double restMb);
  void reduceBucket(size_t k);
  LogicalResult reduceLossAndNorm();
  Value normSquares(Location l, Value &sqSplit);
  LogicalResult reduceScalarsTogether(Operation *lossOp, Operation *normOp);
  LogicalResult shardOptimizer();
};

LogicalResult Rewriter::collect() {
  Block &body = f_.getBody().front();
  for (unsigned i = 0; i < f_.getNumArguments(); ++i)
    if (auto in = f_.getArgAttrOfType<StringAttr>(i, KilnDialect::kInputAttr))
      if (in.getValue() == "replica")
        replica_ = body.getArgument(i);
  if (!replica_)
    return f_.emitError() << "kiln-data-parallel: @train_step has no "
                             "kiln.input = \"replica\" argument (run kiln-train-step "
                             "on a module with a kiln.mesh dp axis first)";
  llvm::StringMap<unsigned> paramArg;
  for (unsigned i = 0; i < f_.getNumArguments(); ++i) {
    if (auto p = f_.getArgAttrOfType<StringAttr>(i, KilnDialect::kParamAttr))
      paramArg[p.getValue()] = i;
    // Batch inputs are split on dp: each needs a leading (batch) dimension.
    if (auto in = f_.getArgAttrOfType<StringAttr>(i, KilnDialect::kInputAttr)) {
      StringRef n = in.getValue();
      if (n != "step" && n != "replica" && n != "tp_rank" &&
          cast<RankedTensorType>(body.getArgument(i).getType()).getRank() == 0)
        return f_.emitError() << "kiln-data-parallel: input '" << n
                              << "' has no batch dimension to split over dp";
    }
  }
  for (Operation &op : body) {
    auto tag = op.getAttrOfType<StringAttr>(kDpGradAttr);
    if (!tag)
      continue;
    auto it = paramArg.find(tag.getValue());
    if (it == paramArg.end())
      return op.emitError() << "kiln-data-parallel: gradient of unknown parameter '"
                            << tag.getValue() << "'";
    Grad g;
    g.param = it->second;
    g.name = tag.getValue().str();
    g.tag = &op;
    g.type = cast<RankedTensorType>(op.getResult(0).getType());
    g.numel = g.type.getNumElements();
    g.block = (g.numel + n_ - 1) / n_;
    if (auto it = owners_.find(g.name); it != owners_.end())
      g.stage = it->second;
    grads_.push_back(g);
  }
  return success();
}

/// Buckets in backward order (the order of the tagged gradients in the
/// block); a bucket closes when the next gradient would pass its size, and
/// a gradient larger than the size has a bucket of its own (as DDP).
void Rewriter::makeBuckets(double firstMb, double restMb) {
  int64_t used = 0;
  for (size_t i = 0; i < grads_.size(); ++i) {
    Grad &g = grads_[i];
    int64_t bytes = g.numel * int64_t(g.type.getElementTypeBitWidth() / 8);
    double cap = (buckets_.size() <= 1 ? firstMb : restMb) * 1048576.0;
    // Pipeline stages: a bucket holds one stage's gradients (each stage's
    // devices reduce their own parameters).
    bool newStage = i > 0 && g.stage != grads_[i - 1].stage;
    if (buckets_.empty() || newStage || (used > 0 && double(used + bytes) > cap)) {
      buckets_.emplace_back();
      used = 0;
      cap = (buckets_.size() == 1 ? firstMb : restMb) * 1048576.0;
    }
    buckets_.back().push_back(i);
    used += bytes;
    g.bucket = int64_t(buckets_.size()) - 1;
  }
}

/// One bucket's collective, inserted right after its last gradient.
///   DP, ZeRO-1: concat(flat g_i) -> all_reduce mean -> slices -> reshapes
///   ZeRO-2:     concat_dim1(blocks(g_i)) -> flatten -> reduce_scatter mean
///               -> this device's [sum block_i] -> slices
void Rewriter::reduceBucket(size_t k) {
  std::vector<size_t> &members = buckets_[k];
  Operation *last = grads_[members.front()].tag;
  for (size_t i : members)
    if (last->isBeforeInBlock(grads_[i].tag))
      last = grads_[i].tag;
  b_.setInsertionPointAfter(last);
  Location l = named("dp.bucket" + std::to_string(k), loc(last));
  Type elem = grads_[members.front()].type.getElementType();
  auto mark = [&](Operation *op) {
    op->setAttr(KilnDialect::kOverlapAttr, b_.getUnitAttr());
    op->setAttr("kiln.bucket", b_.getI64IntegerAttr(int64_t(k)));
    ++collectives_;
  };
  if (zero_ == 2) {
    SmallVector<Value> parts;
    int64_t width = 0;
    for (size_t i : members) {
      parts.push_back(blocks(l, grads_[i].tag->getResult(0), grads_[i]));
      width += grads_[i].block;
    }
    Value rows = parts.size() == 1
                     ? parts[0]
                     : b_.create<ConcatOp>(l, RankedTensorType::get({n_, width}, elem),
                                           parts, b_.getI64IntegerAttr(1));
    Value flat = narrow(l, reshape(l, rows, vec(n_ * width, elem)));
    Type wire = cast<RankedTensorType>(flat.getType()).getElementType();
    auto rs = b_.create<ReduceScatterOp>(l, vec(width, wire), flat, kAxis, average_,
                                         int64_t(0));
    mark(rs);
    Value got = widen(l, rs, elem);
    int64_t off = 0;
    for (size_t i : members) {
      grads_[i].shard = slice1(l, got, off, off + grads_[i].block);
      if (Operation *d = grads_[i].shard.getDefiningOp(); d && d != got.getDefiningOp())
        unpack_.push_back(d);
      off += grads_[i].block;
    }
    return;
  }
  SmallVector<Value> parts;
  int64_t total = 0;
  for (size_t i : members) {
    parts.push_back(flatten(l, grads_[i].tag->getResult(0)));
    total += grads_[i].numel;
  }
  Value flat = parts.size() == 1 ? parts[0]
                                 : b_.create<ConcatOp>(l, vec(total, elem), parts,
                                                       b_.getI64IntegerAttr(0));
  auto ar = b_.create<AllReduceOp>(l, narrow(l, flat), kAxis, average_);
  mark(ar);
  Value got = widen(l, ar, elem);
  int64_t off = 0;
  for (size_t i : members) {
    Grad &g = grads_[i];
    Value part = slice1(l, got, off, off + g.numel);
    if (part != got)
      unpack_.push_back(part.getDefiningOp());
    g.reduced = reshape(l, part, g.type);
    if (g.reduced != part)
      unpack_.push_back(g.reduced.getDefiningOp());
    off += g.numel;
    Value local = g.tag->getResult(0);
    local.replaceUsesWithIf(g.reduced, [&](OpOperand &use) {
      Operation *user = use.getOwner();
      return user->getBlock() == ar->getBlock() && ar->isBeforeInBlock(user);
    });
  }
}

/// This device's sum of squares of its block of each reduced gradient
/// (parameter order), at the insertion point; the blocks of parameters
/// split over tp are summed apart into `sqSplit` (a partial sum over tp).
Value Rewriter::normSquares(Location l, Value &sqSplit) {
  auto f32 = RankedTensorType::get({}, b_.getF32Type());
  std::vector<size_t> order(grads_.size());
  for (size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t c) { return grads_[a].param < grads_[c].param; });
  // Under tensor parallelism (kiln-tensor-parallel ran first) a parameter
  // split over tp holds only its block: the sum of squares of those blocks
  // is summed over tp first, then the replicated parameters' are added.
  llvm::StringSet<> tpSplit;
  for (unsigned i = 0; i < f_.getNumArguments(); ++i)
    if (auto p = f_.getArgAttrOfType<StringAttr>(i, KilnDialect::kParamAttr))
      if (auto sh = f_.getArgAttrOfType<DictionaryAttr>(i, kShardAttr))
        if (sh.getAs<StringAttr>("axis") && sh.getAs<StringAttr>("axis").getValue() == "tp")
          tpSplit.insert(p.getValue());
  Value sq;
  for (size_t i : order) {
    Grad &g = grads_[i];
    if (!g.shard)
      g.shard = localBlock(l, g.reduced, g);
    Value x = g.shard;
    if (!x.getType().cast<ShapedType>().getElementType().isF32())
      x = b_.create<CastOp>(l, vec(g.block, b_.getF32Type()), x);
    Value s = b_.create<ReduceSumOp>(l, f32, b_.create<MulOp>(l, x, x),
                                     b_.getDenseI64ArrayAttr({0}), UnitAttr());
    Value &acc = tpSplit.contains(g.name) ? sqSplit : sq;
    acc = acc ? b_.create<AddOp>(l, acc, s) : s;
  }
  return sq;
}

/// The loss: all_reduce mean. The norm: every device sums the squares of
/// its block of each reduced gradient (parameter order), then one
/// all_reduce(sum) of that scalar; the same with or without ZeRO.
LogicalResult Rewriter::reduceLossAndNorm() {
  Block &body = f_.getBody().front();
  Operation *lossOp = nullptr, *normOp = nullptr;
  for (Operation &op : body) {
    if (op.hasAttr(kDpLossAttr))
      lossOp = &op;
    if (op.hasAttr(kDpGradNormAttr))
      normOp = &op;
  }
  if (!lossOp)
    return f_.emitError() << "kiln-data-parallel: @train_step has no kiln.dp.loss";
  if (combineScalars_) {
    // Every use of the loss after the norm's place (or the end): the one
    // all_reduce can go there.
    Operation *at = normOp ? normOp : body.getTerminator();
    bool late = llvm::all_of(lossOp->getResult(0).getUsers(), [&](Operation *u) {
      return u->getBlock() == &body && !u->isBeforeInBlock(at);
    });
    if (late)
      return reduceScalarsTogether(lossOp, normOp);
  }
  b_.setInsertionPointAfter(lossOp);
  Value loss = lossOp->getResult(0);
  auto ar = b_.create<AllReduceOp>(named("dp.loss", loss.getLoc()), loss, kAxis, average_);
  ++collectives_;
  loss.replaceAllUsesExcept(ar, ar);
  lossOp->removeAttr(kDpLossAttr);
  if (!normOp) {
    // No parameters, or deterministic = "devices" (kiln-train-step computed
    // the norm from the whole reduced gradients, as one device does): ZeRO
    // still updates this device's block of each.
    if (zero_ > 0) {
      b_.setInsertionPoint(body.getTerminator());
      for (Grad &g : grads_)
        if (!g.shard)
          g.shard = localBlock(named("dp.zero", loc(g.tag)), g.reduced, g);
    }
    return success();
  }
  // Every reduced gradient and shard is defined in backward, before the
  // old norm at the tail: the new one goes where the old one was.
  b_.setInsertionPoint(normOp);
  Location l = named("dp.grad_norm", normOp->getLoc());
  Value sqSplit;
  Value sq = normSquares(l, sqSplit);
  if (sqSplit) {
    Value whole = b_.create<AllReduceOp>(l, sqSplit, "tp", CollectiveReduction::sum);
    ++collectives_;
    sq = sq ? b_.create<AddOp>(l, whole, sq) : whole;
  }
  Value total = b_.create<AllReduceOp>(l, sq, kAxis, CollectiveReduction::sum);
  ++collectives_;
  Value norm = b_.create<SqrtOp>(l, total);
  normOp->getResult(0).replaceAllUsesWith(norm);
  normOp->removeAttr(kDpGradNormAttr);
  return success();
}

/// The step's scalars in one all_reduce(sum) over dp where the norm was
/// (after every reduced gradient; at the end without a norm): this
/// device's loss (widened to f32; divided by the device count after the
/// sum, as the communicator's mean would), its sum of squares of its
/// gradient blocks (none when kiln-train-step computes the norm from whole
/// gradients: deterministic = "devices") and a stop flag, a new input
/// "stop" (f32: 1 where this device's process was asked to stop) whose sum
/// over devices is a new output "stop". One exchange instead of three
/// (loss, norm, and the trainer's own agreement on stopping), each paying
/// the network's latency (docs/parallel.md "Scalars in one exchange").
LogicalResult Rewriter::reduceScalarsTogether(Operation *lossOp, Operation *normOp) {
  Block &body = f_.getBody().front();
  MLIRContext *ctx = f_.getContext();
  auto f32 = RankedTensorType::get({}, b_.getF32Type());
  auto one = vec(1, b_.getF32Type());
  auto named1 = [&](StringRef key, StringRef value) {
    return DictionaryAttr::get(
        ctx, {NamedAttribute(StringAttr::get(ctx, key), StringAttr::get(ctx, value))});
  };
  unsigned stopArg = f_.getNumArguments();
  f_.insertArgument(stopArg, f32, named1(KilnDialect::kInputAttr, "stop"), f_.getLoc());
  Value stopIn = body.getArgument(stopArg);
  Operation *at = normOp ? normOp : body.getTerminator();
  b_.setInsertionPoint(at);
  Location l = named("dp.scalars", lossOp->getLoc());
  Value loss = lossOp->getResult(0);
  auto lossType = cast<RankedTensorType>(loss.getType());
  SmallVector<OpOperand *> lossUses;
  for (OpOperand &u : loss.getUses())
    lossUses.push_back(&u);
  Value lossF = lossType == f32 ? loss : Value(b_.create<CastOp>(l, f32, loss));
  SmallVector<Value> parts{reshape(l, lossF, one)};
  if (normOp) {
    Value sqSplit;
    Value sq = normSquares(named("dp.grad_norm", normOp->getLoc()), sqSplit);
    if (sqSplit)
      return f_.emitError() << "kiln-data-parallel: the scalars are combined on a mesh of dp "
                               "alone, but a parameter is split over tp";
    parts.push_back(reshape(l, sq, one));
  } else if (zero_ > 0) {
    // ZeRO still updates this device's block of each whole gradient.
    for (Grad &g : grads_)
      if (!g.shard)
        g.shard = localBlock(named("dp.zero", loc(g.tag)), g.reduced, g);
  }
  parts.push_back(reshape(l, stopIn, one));
  int64_t k = int64_t(parts.size());
  Value all = b_.create<ConcatOp>(l, vec(k, b_.getF32Type()), parts, b_.getI64IntegerAttr(0));
  auto ar = b_.create<AllReduceOp>(l, all, kAxis, CollectiveReduction::sum);
  ++collectives_;
  auto part = [&](int64_t i) { return reshape(l, slice1(l, ar, i, i + 1), f32); };
  Value newLoss = part(0);
  if (average_ == CollectiveReduction::mean) {
    Value n = b_.create<ConstantOp>(
        l, DenseElementsAttr::get(f32, FloatAttr::get(b_.getF32Type(), double(n_))));
    newLoss = b_.create<DivOp>(l, newLoss, n);
  }
  if (lossType != f32)
    newLoss = b_.create<CastOp>(l, lossType, newLoss);
  for (OpOperand *u : lossUses)
    u->set(newLoss);
  lossOp->removeAttr(kDpLossAttr);
  if (normOp) {
    Value norm = b_.create<SqrtOp>(named("dp.grad_norm", normOp->getLoc()), part(1));
    normOp->getResult(0).replaceAllUsesWith(norm);
    normOp->removeAttr(kDpGradNormAttr);
  }
  Value stopOut = part(k - 1);
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  f_.insertResult(f_.getNumResults(), f32, named1(KilnDialect::kOutputAttr, "stop"));
  ret->insertOperands(ret->getNumOperands(), stopOut);
  return success();
}

/// ZeRO's kiln.shard for a state buffer whose own is `prior`: `plain`
/// ({axis = dp, shape}) for a whole tensor; a tensor-parallel block (kiln-
/// tensor-parallel split it over tp first) keeps its split and gains zero =
/// dp: ZeRO blocks the device's tp block, not the logical tensor.
DictionaryAttr zeroShard(DictionaryAttr prior, DictionaryAttr plain) {
  if (!prior || !prior.get("dim"))
    return plain;
  NamedAttrList attrs(prior);
  attrs.set("zero", plain.get("axis"));
  return attrs.getDictionary(prior.getContext());
}

/// ZeRO: the optimizer update of each parameter (an elementwise computation
/// from the parameter, its gradient, its state and scalars) cloned onto this
/// device's block; state arguments and results become blocks; the updated
/// blocks are all-gathered per bucket into the full parameters.
LogicalResult Rewriter::shardOptimizer() {
  Block &body = f_.getBody().front();
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  MLIRContext *ctx = f_.getContext();
  llvm::StringMap<unsigned> resultIdx, stateArgs;
  for (unsigned i = 0; i < f_.getNumResults(); ++i)
    if (auto o = f_.getResultAttrOfType<StringAttr>(i, KilnDialect::kOutputAttr))
      resultIdx[o.getValue()] = i;
  for (unsigned i = 0; i < f_.getNumArguments(); ++i)
    if (auto st = f_.getArgAttrOfType<StringAttr>(i, KilnDialect::kStateAttr))
      stateArgs[st.getValue()] = i;
  b_.setInsertionPoint(ret);
  std::vector<Value> updated(grads_.size());
  for (auto [gi, g] : llvm::enumerate(grads_)) {
    Location l = named("dp.zero", g.tag->getLoc());
    Type elem = g.type.getElementType();
    RankedTensorType st = vec(g.block, elem);
    auto shardAttr = DictionaryAttr::get(
        ctx, {NamedAttribute(StringAttr::get(ctx, "axis"), StringAttr::get(ctx, kAxis)),
              NamedAttribute(StringAttr::get(ctx, "shape"),
                             DenseI64ArrayAttr::get(ctx, g.type.getShape()))});
    IRMapping map;
    BlockArgument w = body.getArgument(g.param);
    map.map(g.tag->getResult(0), g.shard);
    if (g.reduced)
      map.map(g.reduced, g.shard);
    // Outputs: the new parameter and each state slot of this parameter.
    SmallVector<std::pair<unsigned, Value>> outs; // result index, value
    llvm::DenseSet<Value> ownState;
    for (auto &e : stateArgs) {
      StringRef key = e.getKey();
      if (!key.ends_with(":" + g.name) || key.size() != key.find(':') + 1 + g.name.size())
        continue;
      BlockArgument a = body.getArgument(e.getValue());
      a.setType(st);
      f_.setArgAttr(e.getValue(), kShardAttr,
                    zeroShard(f_.getArgAttrOfType<DictionaryAttr>(e.getValue(), kShardAttr),
                              shardAttr));
      ownState.insert(a);
      auto r = resultIdx.find(key);
      if (r == resultIdx.end())
        return f_.emitError() << "kiln-data-parallel: no result for state '" << key << "'";
      outs.push_back({r->second, ret.getOperand(r->second)});
      f_.setResultAttr(r->second, kShardAttr,
                       zeroShard(f_.getResultAttrOfType<DictionaryAttr>(r->second, kShardAttr),
                                 shardAttr));
    }
    auto pr = resultIdx.find(g.name);
    if (pr == resultIdx.end())
      return f_.emitError() << "kiln-data-parallel: no result for parameter '" << g.name << "'";
    Value newParam = ret.getOperand(pr->second);
    // The cone: ops between those outputs and the mapped values, scalars
    // and this parameter's state.
    llvm::SetVector<Operation *> cone;
    SmallVector<Value> work{newParam};
    for (auto &o : outs)
      work.push_back(o.second);
    bool needW = false;
    while (!work.empty()) {
      Value v = work.pop_back_val();
      if (map.contains(v) || cast<RankedTensorType>(v.getType()).getRank() == 0 ||
          ownState.contains(v))
        continue;
      if (v == w) {
        needW = true;
        continue;
      }
      Operation *d = v.getDefiningOp();
      if (!d || d->getBlock() != &body || v.getType().cast<ShapedType>().getShape() != g.type.getShape())
        return f_.emitError() << "kiln-data-parallel: cannot shard the optimizer update of '"
                              << g.name << "' (it reads a value of type " << v.getType()
                              << "); use zero = 0";
      if (cone.contains(d))
        continue;
      bool ok = d->hasTrait<OpTrait::Elementwise>() || isa<CompareOp, SelectOp, CastOp>(d) ||
                (isa<ConstantOp>(d) &&
                 isa<SplatElementsAttr>(cast<ConstantOp>(d).getValue())) ||
                (isa<BroadcastInDimOp>(d) &&
                 cast<RankedTensorType>(d->getOperand(0).getType()).getRank() == 0);
      if (!ok)
        return d->emitError() << "kiln-data-parallel: ZeRO cannot shard the optimizer "
                                 "update of '" << g.name << "' through this op; use zero = 0";
      cone.insert(d);
      for (Value o : d->getOperands())
        work.push_back(o);
    }
    if (needW)
      map.map(w, localBlock(l, w, g));
    SmallVector<Operation *> ordered(cone.begin(), cone.end());
    std::sort(ordered.begin(), ordered.end(),
              [](Operation *a, Operation *c) { return a->isBeforeInBlock(c); });
    for (Operation *op : ordered) {
      if (auto c = dyn_cast<ConstantOp>(op)) {
        auto splat = cast<SplatElementsAttr>(c.getValue());
        auto t = RankedTensorType::get({g.block}, splat.getElementType());
        Value nc = b_.create<ConstantOp>(
            c.getLoc(), DenseElementsAttr::get(t, splat.getSplatValue<Attribute>()));
        map.map(c.getResult(), nc);
        continue;
      }
      Operation *cl = b_.clone(*op, map);
      for (Value r : cl->getResults())
        r.setType(RankedTensorType::get({g.block},
                                        cast<RankedTensorType>(r.getType()).getElementType()));
    }
    updated[gi] = map.lookupOrDefault(newParam);
    for (auto &o : outs)
      ret.setOperand(o.first, map.lookupOrDefault(o.second));
    if (map.lookupOrDefault(newParam) == newParam)
      return f_.emitError() << "kiln-data-parallel: the update of '" << g.name
                            << "' does not depend on its gradient";
  }
  // All-gather the updated blocks, bucket by bucket.
  for (auto [k, members] : llvm::enumerate(buckets_)) {
    Location l = named("dp.zero.bucket" + std::to_string(k), grads_[members.front()].tag->getLoc());
    Type elem = grads_[members.front()].type.getElementType();
    SmallVector<Value> parts;
    int64_t width = 0;
    for (size_t i : members) {
      parts.push_back(updated[i]);
      width += grads_[i].block;
    }
    Value flat = parts.size() == 1 ? parts[0]
                                   : b_.create<ConcatOp>(l, vec(width, elem), parts,
                                                         b_.getI64IntegerAttr(0));
    auto ag = b_.create<AllGatherOp>(l, vec(n_ * width, elem), flat, kAxis, int64_t(0));
    ag->setAttr("kiln.bucket", b_.getI64IntegerAttr(int64_t(k)));
    ++collectives_;
    Value rows = reshape(l, ag, RankedTensorType::get({n_, width}, elem));
    int64_t off = 0;
    for (size_t i : members) {
      Grad &g = grads_[i];
      Value cols = rows;
      if (members.size() > 1)
        cols = b_.create<SliceOp>(l, rows, ArrayRef<int64_t>{0, off},
                                  ArrayRef<int64_t>{n_, off + g.block}, ArrayRef<int64_t>{1, 1});
      off += g.block;
      Value full = slice1(l, reshape(l, cols, vec(n_ * g.block, elem)), 0, g.numel);
      ret.setOperand(resultIdx[g.name], reshape(l, full, g.type));
    }
  }
  f_.setType(FunctionType::get(ctx, body.getArgumentTypes(), ret.getOperandTypes()));
  return success();
}

void Rewriter::sinkUnpacking() {
  // After dead-code elimination (the old norm's ops read the gradients);
  // the unpacking ops are found again by a temporary mark.
  constexpr StringLiteral kMark = "kiln.dp.unpack";
  for (Operation *op : unpack_)
    op->setAttr(kMark, b_.getUnitAttr());
  unpack_.clear();
  eraseDeadOps(f_.getBody().front());
  SmallVector<Operation *> marked;
  f_.getBody().front().walk([&](Operation *op) {
    if (op->hasAttr(kMark))
      marked.push_back(op);
  });
  for (auto it = marked.rbegin(); it != marked.rend(); ++it) {
    Operation *op = *it;
    op->removeAttr(kMark);
    Operation *first = nullptr;
    for (Operation *u : op->getUsers())
      if (u->getBlock() == op->getBlock() && (!first || u->isBeforeInBlock(first)))
        first = u;
    if (first && op->isBeforeInBlock(first))
      op->moveBefore(first);
  }
}

LogicalResult Rewriter::run(double firstMb, double restMb, int64_t &buckets,
                            int64_t &collectives, int64_t &bytes) {
  if (failed(collect()))
    return failure();
  makeBuckets(firstMb, restMb);
  for (size_t k = 0; k < buckets_.size(); ++k)
    reduceBucket(k);
  if (failed(reduceLossAndNorm()))
    return failure();
  if (zero_ > 0 && failed(shardOptimizer()))
    return failure();
  for (Grad &g : grads_)
    g.tag->removeAttr(kDpGradAttr);
  sinkUnpacking();
  bytes = 0;
  for (Grad &g : grads_) {
    Type e = g.type.getElementType();
    unsigned bits = reduceType_ && e.isF32() ? reduceType_.getIntOrFloatBitWidth()
                                             : g.type.getElementTypeBitWidth();
    bytes += g.numel * int64_t(bits / 8);
  }
  buckets = int64_t(buckets_.size());
  collectives = collectives_;
  return success();
}

struct KilnDataParallelPass : impl::KilnDataParallelPassBase<KilnDataParallelPass> {
  using KilnDataParallelPassBase::KilnDataParallelPassBase;
  void runOnOperation() override {
    ModuleOp m = getOperation();
    int64_t n = getMesh(m).axisSize(kAxis);
    TrainSettings train(m);
    int z = zero >= 0 ? int(zero) : int(train.number("zero", 0));
    if (n <= 1) {
      if (z > 0) {
        m.emitError() << "kiln-data-parallel: zero = " << z
                      << " needs a kiln.mesh with a dp axis of size > 1 (train setting "
                         "devices = N or kilnc --devices N)";
        return signalPassFailure();
      }
      return; // one device: nothing to do
    }
    if (z < 0 || z > 2) {
      m.emitError() << "kiln-data-parallel: zero must be 0, 1 or 2, got " << z;
      return signalPassFailure();
    }
    double rest = bucketMb > 0 ? double(bucketMb) : train.number("bucket_mb", 25.0);
    double first = firstBucketMb > 0 ? double(firstBucketMb) : train.number("first_bucket_mb", 1.0);
    if (!(rest > 0) || !(first > 0)) {
      m.emitError() << "kiln-data-parallel: bucket sizes must be > 0 MiB";
      return signalPassFailure();
    }
    auto f = m.lookupSymbol<func::FuncOp>("train_step");
    if (!f)
      return; // @grad only (gradient checks)
    if (failed(checkDataParallelSharding(f, kAxis)))
      return signalPassFailure();
    std::string reduce = gradReduce.empty() ? train.string("grad_reduce", "fp32")
                                            : std::string(gradReduce);
    Type reduceType;
    if (reduce == "bf16")
      reduceType = BFloat16Type::get(m.getContext());
    else if (reduce != "fp32") {
      m.emitError() << "kiln-data-parallel: grad_reduce must be fp32 or bf16, got '" << reduce
                    << "'";
      return signalPassFailure();
    }
    bool deterministic = train.deterministicDevices();
    if (deterministic && (z > 1 || reduceType)) {
      m.emitError() << "kiln-data-parallel: deterministic = \"devices\" needs zero <= 1 and "
                       "grad_reduce = fp32 (each device must hold the whole float32 sum)";
      return signalPassFailure();
    }
    // The scalars in one exchange on a mesh of dp alone (with tp or pp the
    // loss lives on one stage, or the norm sums over tp first), unless the
    // train section says otherwise (kilnc --separate-scalar-reductions, to
    // measure the difference).
    MeshShape mesh = getMesh(m);
    bool combine = mesh.axisSize("tp") <= 1 && mesh.axisSize("pp") <= 1 &&
                   train.string("scalar_reduce", "combined") == "combined";
    Rewriter r(f, n, z, reduceType, pipelineOwners(m), deterministic, combine);
    int64_t buckets = 0, collectives = 0, bytes = 0;
    if (failed(r.run(first, rest, buckets, collectives, bytes)))
      return signalPassFailure();
    numBuckets = buckets;
    numCollectives = collectives;
    bytesReduced = bytes;
    if (annotateSharding)
      annotateShardings(f, kAxis);
  }
};

} // namespace
} // namespace kiln
