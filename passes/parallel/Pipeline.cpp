//===- Pipeline.cpp - Pipeline stages, transfers and micro-batch order ----===//
//
// Pipeline parallelism (docs/parallel.md "Pipeline parallelism"). Two
// passes, for a module whose kiln.mesh has a "pp" axis of size P > 1:
//
// kiln-pipeline-stages (before kiln-train-step) gives every op of @forward
// a stage: the ones `stage N { ... }` blocks placed by hand keep theirs;
// otherwise @forward is cut into P contiguous ranges at layer boundaries
// (kiln.block changes) so that the stages' work is as even as it can be
// (the cost model: the ops' CostOpInterface FLOPs plus the bytes they move).
//
// kiln-pipeline (after kiln-data-parallel) makes every function one
// stage-predicated program: each op gets the stage that runs it (the
// clones of @forward's ops and their gradients keep theirs: kiln-autodiff
// tags gradient ops with their forward op's stage; everything else goes
// where its largest operand lives, a broadcast goes where its users are),
// parameters and their optimizer state belong to the stage of their first
// use, a value used on another stage crosses with kiln.transfer, results
// that are not parameter updates are broadcast to every stage, and
// @train_step's ops are reordered into the micro-batch schedule (GPipe or
// 1F1B) that each device then runs in order.
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"

#include "dialects/kiln/KilnDialect.h"
#include "dialects/kiln/KilnOps.h"
#include "dialects/kiln/Sharding.h"
#include "dialects/kiln/TrainSettings.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringMap.h"

#include <algorithm>
#include <limits>
#include <functional>
#include <map>
#include <queue>
#include <string>
#include <vector>

using namespace mlir;

namespace kiln {

#define GEN_PASS_DEF_KILNPIPELINESTAGESPASS
#define GEN_PASS_DEF_KILNPIPELINEPASS
#include "passes/Passes.h.inc"

namespace {

constexpr StringLiteral kAxis = "pp";

int64_t bytesOf(Type t) {
  auto r = dyn_cast<RankedTensorType>(t);
  if (!r)
    return 0;
  int64_t bits = r.getElementType().getIntOrFloatBitWidth();
  return r.getNumElements() * std::max<int64_t>(1, bits / 8);
}

int64_t flopsOf(Operation *op) {
  if (op->getNumResults() == 0)
    return 0;
  if (auto c = dyn_cast<CostOpInterface>(op))
    return c.estimateFlops();
  return 0;
}

IntegerAttr i64(MLIRContext *ctx, int64_t v) {
  return IntegerAttr::get(IntegerType::get(ctx, 64), v);
}

//===----------------------------------------------------------------------===//
// kiln-pipeline-stages
//===----------------------------------------------------------------------===//

/// Gives each op of `ops` (in program order) without a stage the earliest
/// stage among its users' (walking backwards, so chains of such ops follow
/// their last user), or stage 0 when no user has one.
void withFirstUser(ArrayRef<Operation *> ops, int64_t P) {
  for (Operation *op : llvm::reverse(ops)) {
    if (op->hasAttr(kStageAttr))
      continue;
    int64_t s = P;
    for (Value r : op->getResults())
      for (Operation *u : r.getUsers())
        if (int64_t us = stageOf(u); us >= 0)
          s = std::min(s, us);
    op->setAttr(kStageAttr, i64(op->getContext(), s < P ? s : 0));
  }
}

struct KilnPipelineStagesPass
    : impl::KilnPipelineStagesPassBase<KilnPipelineStagesPass> {
  using KilnPipelineStagesPassBase::KilnPipelineStagesPassBase;

  void runOnOperation() override {
    ModuleOp m = getOperation();
    int64_t P = getMesh(m).axisSize(kAxis);
    auto fwd = m.lookupSymbol<func::FuncOp>("forward");
    if (P <= 1 || !fwd)
      return;
    // Interleaved 1F1B: pp x V chunks, chunk c on device c mod pp; the
    // chunks are numbered as stages until kiln-pipeline maps them.
    const int64_t V = virtualStages(m), devices = P;
    if (V > 1) {
      int64_t M = TrainSettings(m).gradAccum();
      if (M % devices != 0) {
        m.emitError() << "the interleaved schedule runs micro-batches in groups of pp = "
                      << devices << ", but there are " << M
                      << " (micro_batches / --micro-batches); use a multiple of " << devices;
        return signalPassFailure();
      }
      // Placed by hand: the stage blocks number the chunks (the frontend
      // counted pp x V of them when the train section asked for the
      // interleaved schedule); a placement made for plain stages is not a
      // chunking.
      if (auto placed = m->getAttrOfType<IntegerAttr>("kiln.stages_placed");
          placed && placed.getInt() != devices * V) {
        int64_t n = placed.getInt();
        auto diag = m.emitError();
        diag << "the model's `stage N { ... }` blocks name " << n
             << " stages or chunks, but the interleaved schedule with pp = " << devices
             << " and virtual_stages = " << V << " needs " << devices * V
             << " model chunks; ";
        if (n % devices == 0 && n / devices > 1)
          diag << "use virtual_stages = " << n / devices << " (--virtual-stages "
               << n / devices << "), ";
        diag << "name " << devices * V
             << " chunks (under pipeline = \"interleaved\" in the train section the stage "
                "blocks number chunks), or use pipeline = \"1f1b\"";
        return signalPassFailure();
      }
      P = devices * V;
    }
    Block &body = fwd.getBody().front();
    std::vector<Operation *> ops;
    for (Operation &op : body.without_terminator())
      ops.push_back(&op);
    if (auto placed = m->getAttrOfType<IntegerAttr>("kiln.stages_placed")) {
      // Placed by hand: every stage must hold some work.
      std::vector<int64_t> count(size_t(P), 0);
      for (Operation *op : ops)
        if (int64_t s = stageOf(op); s >= 0 && s < P)
          ++count[size_t(s)];
      // The highest stage the blocks name (the stage count may be larger:
      // pp, or pp x virtual_stages, from the train section).
      int64_t named = -1;
      for (Operation *op : ops)
        if (op->hasAttr(kStageAttr))
          named = std::max(named, stageOf(op));
      for (int64_t s = 0; s < P; ++s)
        if (!count[size_t(s)]) {
          auto diag = m.emitError();
          diag << (V > 1 ? "model chunk " : "pipeline stage ") << s << " of " << P
               << " has no ops: the model's `stage N { ... }` blocks name "
               << (V > 1 ? "chunks" : "stages") << " up to " << named;
          if (named + 1 < P)
            diag << ", but the layout has " << P << (V > 1 ? " chunks (pp x virtual_stages)"
                                                           : " stages (pp)");
          diag << "; place layers on every " << (V > 1 ? "chunk" : "stage")
               << " or use fewer (--pp" << (V > 1 ? ", --virtual-stages" : "") << ")";
          return signalPassFailure();
        }
      // Ops outside every stage block follow their data: after the last
      // staged operand, else with their first staged user, else stage 0.
      MLIRContext *ctx = m.getContext();
      for (Operation *op : ops) {
        if (op->hasAttr(kStageAttr))
          continue;
        int64_t s = -1;
        for (Value v : op->getOperands())
          if (Operation *d = v.getDefiningOp())
            s = std::max(s, stageOf(d));
        if (s >= 0)
          op->setAttr(kStageAttr, i64(ctx, s));
      }
      withFirstUser(ops, P);
      return;
    }
    // Ops that read only parameters (a parameter's cast to bf16, a
    // broadcast of a bias) go with their first user, not where they stand.
    auto free = [&](Operation *op) {
      return llvm::all_of(op->getOperands(), [&](Value v) {
        auto a = dyn_cast<BlockArgument>(v);
        return a && fwd.getArgAttr(a.getArgNumber(), KilnDialect::kParamAttr);
      });
    };
    std::vector<Operation *> all = ops;
    llvm::erase_if(ops, free);
    // The cost model: each op's FLOPs; cuts only where the layer (kiln.block
    // tag) changes, unless there are too few such places.
    const int64_t n = int64_t(ops.size());
    // An op's cost: its FLOPs plus the bytes it reads and writes at
    // kFlopsPerByte (a CPU's ridge point, ~50 GFLOP/s over ~12 GB/s), so
    // memory-bound ops (layer norms, softmax, GELU) weigh too.
    constexpr int64_t kFlopsPerByte = 4;
    std::vector<int64_t> prefix(size_t(n) + 1, 0);
    for (int64_t i = 0; i < n; ++i) {
      Operation *op = ops[size_t(i)];
      int64_t bytes = 0;
      for (Value v : op->getOperands())
        bytes += bytesOf(v.getType());
      for (Value v : op->getResults())
        bytes += bytesOf(v.getType());
      prefix[size_t(i) + 1] = prefix[size_t(i)] + flopsOf(op) + kFlopsPerByte * bytes;
    }
    auto tag = [&](int64_t i) {
      auto a = ops[size_t(i)]->getAttrOfType<StringAttr>(KilnDialect::kBlockAttr);
      return a ? a.getValue() : StringRef();
    };
    std::vector<int64_t> cand{0};
    for (int64_t i = 1; i < n; ++i)
      if (tag(i) != tag(i - 1))
        cand.push_back(i);
    if (int64_t(cand.size()) < P) {
      cand.clear();
      for (int64_t i = 0; i < n; ++i)
        cand.push_back(i);
    }
    cand.push_back(n);
    if (int64_t(cand.size()) < P + 1) {
      m.emitError() << "pp = " << devices << " pipeline stages"
                    << (V > 1 ? " of " + std::to_string(V) + " chunks each" : std::string())
                    << " but @forward has only " << n << " ops to cut; use fewer stages"
                    << (V > 1 ? " or fewer virtual_stages (--virtual-stages)" : "");
      return signalPassFailure();
    }
    // best[j][c]: the smallest largest-stage cost covering ops [0, cand[c])
    // with j + 1 stages; from[j][c]: where the last of them starts.
    const size_t C = cand.size();
    const int64_t inf = std::numeric_limits<int64_t>::max();
    std::vector<std::vector<int64_t>> best(size_t(P), std::vector<int64_t>(C, inf));
    std::vector<std::vector<size_t>> from(size_t(P), std::vector<size_t>(C, 0));
    for (size_t c = 1; c < C; ++c)
      best[0][c] = prefix[size_t(cand[c])];
    for (size_t j = 1; j < size_t(P); ++j)
      for (size_t c = j + 1; c < C; ++c)
        for (size_t b = j; b < c; ++b) {
          if (best[j - 1][b] == inf)
            continue;
          int64_t v = std::max(best[j - 1][b],
                               prefix[size_t(cand[c])] - prefix[size_t(cand[b])]);
          if (v < best[j][c])
            best[j][c] = v, from[j][c] = b;
        }
    if (best[size_t(P) - 1][C - 1] == inf) {
      m.emitError() << "cannot cut @forward into " << P << " pipeline stages";
      return signalPassFailure();
    }
    std::vector<int64_t> starts(size_t(P), 0);
    for (size_t j = size_t(P) - 1, c = C - 1; j > 0; --j) {
      c = from[j][c];
      starts[j] = cand[c];
    }
    MLIRContext *ctx = m.getContext();
    for (int64_t i = 0, s = 0; i < n; ++i) {
      while (s + 1 < P && i >= starts[size_t(s) + 1])
        ++s;
      ops[size_t(i)]->setAttr(kStageAttr, i64(ctx, s));
    }
    withFirstUser(all, P);
  }
};

//===----------------------------------------------------------------------===//
// kiln-pipeline
//===----------------------------------------------------------------------===//

using Unit = PipelineUnit;

/// The schedules: GPipe, 1F1B, and interleaved 1F1B (Narayanan et al.,
/// "Efficient Large-Scale Language Model Training on GPU Clusters Using
/// Megatron-LM", 2021: device d runs chunks d, d + D, ..., d + (V-1) D of
/// C = D x V; micro-batches go in groups of D through each chunk).
enum class Schedule { GPipe, OneF1B, Interleaved };

/// Device d's units in the order it runs them.
std::vector<Unit> deviceOrder(int64_t d, int64_t D, int64_t V, int64_t M, Schedule sched) {
  std::vector<Unit> q;
  if (sched == Schedule::GPipe) {
    for (int64_t k = 0; k < M; ++k)
      q.push_back({d, 0, k});
    for (int64_t k = 0; k < M; ++k)
      q.push_back({d, 1, k});
    return q;
  }
  if (sched == Schedule::OneF1B) {
    int64_t warm = std::min(D - d - 1, M);
    for (int64_t k = 0; k < warm; ++k)
      q.push_back({d, 0, k});
    for (int64_t i = 0; i < M - warm; ++i) {
      q.push_back({d, 0, warm + i});
      q.push_back({d, 1, i});
    }
    for (int64_t k = M - warm; k < M; ++k)
      q.push_back({d, 1, k});
    return q;
  }
  // Interleaved: the i-th forward of the device is micro-batch
  // (i / (D V)) D + i mod D of its local chunk (i / D) mod V; backwards
  // walk the local chunks from the last. Warm-up: 2 (D - d - 1) + (V - 1) D
  // forwards, then one forward and one backward in turn, then the rest.
  const int64_t total = M * V;
  auto unit = [&](int64_t i, int64_t phase) {
    int64_t local = (i / D) % V;
    if (phase == 1)
      local = V - 1 - local;
    return Unit{local * D + d, phase, (i / (D * V)) * D + i % D};
  };
  int64_t warm = std::min(2 * (D - d - 1) + (V - 1) * D, total);
  for (int64_t i = 0; i < warm; ++i)
    q.push_back(unit(i, 0));
  for (int64_t i = 0; i < total - warm; ++i) {
    q.push_back(unit(warm + i, 0));
    q.push_back(unit(i, 1));
  }
  for (int64_t i = total - warm; i < total; ++i)
    q.push_back(unit(i, 1));
  return q;
}

/// Each unit's start time in an ideal timeline of D devices running the
/// C = D x V chunks (forward 1, backward 2 time units per chunk), keyed by
/// (chunk, phase, micro-batch); empty if the devices' orders deadlock.
std::map<std::tuple<int64_t, int64_t, int64_t>, double>
scheduleTimes(int64_t D, int64_t V, int64_t M, Schedule sched) {
  const int64_t C = D * V;
  std::vector<std::vector<Unit>> seq;
  for (int64_t d = 0; d < D; ++d)
    seq.push_back(deviceOrder(d, D, V, M, sched));
  std::map<std::tuple<int64_t, int64_t, int64_t>, double> start, end;
  std::vector<size_t> next(size_t(D), 0);
  std::vector<double> free(size_t(D), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int64_t d = 0; d < D; ++d) {
      while (next[size_t(d)] < seq[size_t(d)].size()) {
        Unit u = seq[size_t(d)][next[size_t(d)]];
        std::tuple<int64_t, int64_t, int64_t> dep;
        bool hasDep = true;
        if (u.phase == 0) {
          hasDep = u.chunk > 0;
          dep = {u.chunk - 1, 0, u.mb};
        } else {
          dep = u.chunk + 1 < C ? std::make_tuple(u.chunk + 1, int64_t(1), u.mb)
                                : std::make_tuple(u.chunk, int64_t(0), u.mb);
        }
        double t = free[size_t(d)];
        if (hasDep) {
          auto it = end.find(dep);
          if (it == end.end())
            break;
          t = std::max(t, it->second);
        }
        start[{u.chunk, u.phase, u.mb}] = t;
        end[{u.chunk, u.phase, u.mb}] = free[size_t(d)] = t + (u.phase ? 2.0 : 1.0);
        ++next[size_t(d)];
        progress = true;
      }
    }
  }
  for (int64_t d = 0; d < D; ++d)
    if (next[size_t(d)] != seq[size_t(d)].size())
      return {};
  return start;
}

class Stager {
public:
  Stager(func::FuncOp f, int64_t P, const llvm::StringMap<int64_t> &owners)
      : f_(f), P_(P), owners_(owners), ctx_(f.getContext()) {}

  /// The schedule's model chunks per device (interleaved: V > 1).
  void setVirtualStages(int64_t V) { V_ = V; }

  LogicalResult run(bool schedule, int64_t M, Schedule sched, int64_t &transfers) {
    Block &body = f_.getBody().front();
    // Arguments: parameters and their state belong to their owner stage.
    for (BlockArgument a : body.getArguments()) {
      int64_t s = -1;
      auto name = f_.getArgAttrOfType<StringAttr>(a.getArgNumber(), KilnDialect::kParamAttr);
      if (!name)
        name = f_.getArgAttrOfType<StringAttr>(a.getArgNumber(), KilnDialect::kStateAttr);
      if (name) {
        StringRef n = name.getValue();
        if (auto it = owners_.find(n); it != owners_.end())
          s = it->second;
        else if (auto colon = n.find(':'); colon != StringRef::npos)
          if (auto it2 = owners_.find(n.drop_front(colon + 1)); it2 != owners_.end())
            s = it2->second;
        argNames_[n] = s;
      }
      argStage_[a] = s;
      if (s >= 0)
        f_.setArgAttr(a.getArgNumber(), kStageAttr, i64(ctx_, s));
    }
    assign(body);
    if (V_ > 1)
      toDevices(body);
    regroupSums(body);
    if (failed(insertTransfers(body, transfers)))
      return failure();
    if (schedule && failed(reorder(body, M, sched)))
      return failure();
    for (Operation &op : body) {
      op.removeAttr("kiln.pp.mb");
      op.removeAttr("kiln.pp.phase");
    }
    return success();
  }

private:
  int64_t stageOfValue(Value v) {
    if (auto a = dyn_cast<BlockArgument>(v)) {
      auto it = argStage_.find(a);
      return it == argStage_.end() ? -1 : it->second;
    }
    Operation *d = v.getDefiningOp();
    if (auto t = dyn_cast<TransferOp>(d))
      return t.getTo();
    if (isa<CollectiveBroadcastOp>(d))
      return -1;
    return stageOfOp(d);
  }
  int64_t stageOfOp(Operation *op) {
    auto it = stage_.find(op);
    return it == stage_.end() ? stageOf(op) : it->second;
  }

  /// Phase A (program order): where each op's largest operand lives;
  /// an op whose result is larger than its operands (a broadcast, a
  /// constant) is deferred to phase B. Phase B (reverse): deferred ops go
  /// to their users' stage, cloned per stage when several use them.
  /// Phase C (reverse): an op every device would run whose users all sit
  /// on one stage moves there.
  void assign(Block &body) {
    llvm::DenseMap<Operation *, int64_t> home;
    llvm::DenseSet<Operation *> deferred;
    for (Operation &op : body.without_terminator()) {
      // Constants and iotas (no operands) go where they are used: the
      // canonicalizer shares one constant among every stage's users.
      if (op.getNumOperands() == 0 && op.getNumResults() == 1 && op.getNumRegions() == 0) {
        deferred.insert(&op);
        home[&op] = stageOf(&op);
        stage_[&op] = stageOf(&op);
        continue;
      }
      if (op.hasAttr(kStageAttr)) {
        stage_[&op] = stageOf(&op);
        continue;
      }
      int64_t best = -1, bestBytes = -1, weak = -1, in = 0;
      for (Value v : op.getOperands()) {
        int64_t b = bytesOf(v.getType());
        in += b;
        Operation *d = v.getDefiningOp();
        if (d && deferred.count(d)) {
          weak = std::max(weak, home.lookup(d));
          continue;
        }
        int64_t s = stageOfValue(v);
        if (s < 0)
          continue;
        if (b > bestBytes || (b == bestBytes && s > best))
          best = s, bestBytes = b;
      }
      int64_t s = best >= 0 ? best : weak;
      int64_t out = 0;
      for (Value r : op.getResults())
        out += bytesOf(r.getType());
      // Also an op computed from such values only (a compare of a
      // broadcast scalar with a constant): recomputed where it is used.
      // (elementwise: as many elements as its operands, never a reduction).
      auto numel = [](Value v) {
        auto t = dyn_cast<RankedTensorType>(v.getType());
        return t ? t.getNumElements() : int64_t(0);
      };
      bool allDeferred = op.getNumOperands() > 0 && op.getNumResults() == 1 &&
                         llvm::all_of(op.getOperands(), [&](Value v) {
                           Operation *d = v.getDefiningOp();
                           return d && deferred.count(d) && numel(v) <= numel(op.getResult(0));
                         });
      if (op.getNumResults() == 1 && (out > in || allDeferred) && op.getNumRegions() == 0) {
        deferred.insert(&op);
        home[&op] = s;
      }
      stage_[&op] = s;
    }
    // Phase B.
    SmallVector<Operation *> order;
    for (Operation &op : body.without_terminator())
      order.push_back(&op);
    for (Operation *op : llvm::reverse(order)) {
      if (!deferred.count(op))
        continue;
      std::map<int64_t, SmallVector<OpOperand *>> byStage;
      for (OpOperand &use : op->getResult(0).getUses()) {
        Operation *u = use.getOwner();
        int64_t s = u == body.getTerminator() ? home.lookup(op) : stageOfOp(u);
        byStage[s].push_back(&use);
      }
      if (byStage.empty() || byStage.count(-1)) {
        stage_[op] = home.lookup(op);
        continue;
      }
      bool first = true;
      for (auto &[s, uses] : byStage) {
        if (first) {
          stage_[op] = s;
          first = false;
          continue;
        }
        OpBuilder b(op);
        Operation *c = b.clone(*op);
        stage_[c] = s;
        for (OpOperand *u : uses)
          u->set(c->getResult(0));
      }
    }
    // Phase C.
    order.clear();
    for (Operation &op : body.without_terminator())
      order.push_back(&op);
    for (Operation *op : llvm::reverse(order)) {
      if (stageOfOp(op) >= 0 || op->getNumResults() == 0)
        continue;
      int64_t s = -2;
      for (Value r : op->getResults())
        for (Operation *u : r.getUsers()) {
          int64_t us = u == body.getTerminator() ? -1 : stageOfOp(u);
          s = s == -2 ? us : (s == us ? s : -1);
        }
      if (s >= 0)
        stage_[op] = s;
    }
    for (Operation &op : body.without_terminator()) {
      int64_t s = stageOfOp(&op);
      if (s >= 0)
        op.setAttr(kStageAttr, i64(ctx_, s));
      else
        op.removeAttr(kStageAttr);
    }
  }

  /// A sum of same-typed terms made on several stages (a tied embedding's
  /// gradient: the embedding's on the first stage, the head's on the last,
  /// accumulated over micro-batches) is added up per stage first, in the
  /// terms' order, and the stages' partial sums meet on the sum's own
  /// stage: one transfer per stage instead of one per term. Reassociates
  /// the additions across stages only.
  void regroupSums(Block &body) {
    auto inTree = [](Operation *op, Type t) {
      return isa_and_nonnull<AddOp>(op) && op->getResult(0).getType() == t &&
             op->getOperand(0).getType() == t && op->getOperand(1).getType() == t;
    };
    SmallVector<Operation *> roots;
    for (Operation &op : body.without_terminator()) {
      Type t = op.getNumResults() == 1 ? op.getResult(0).getType() : Type();
      if (!t || !inTree(&op, t))
        continue;
      bool internal = op.getResult(0).hasOneUse() &&
                      inTree(*op.getResult(0).getUsers().begin(), t);
      if (!internal)
        roots.push_back(&op);
    }
    for (Operation *root : roots) {
      Type t = root->getResult(0).getType();
      SmallVector<Value> leaves;
      SmallVector<Operation *> nodes;
      std::function<void(Operation *)> collect = [&](Operation *op) {
        nodes.push_back(op);
        for (Value v : op->getOperands()) {
          Operation *d = v.getDefiningOp();
          if (d && inTree(d, t) && v.hasOneUse())
            collect(d);
          else
            leaves.push_back(v);
        }
      };
      collect(root);
      int64_t home = stageOfOp(root);
      std::map<int64_t, SmallVector<Value>> byStage;
      SmallVector<int64_t> stageOrder;
      bool worth = false, known = home >= 0;
      for (Value v : leaves) {
        int64_t st = stageOfValue(v);
        known &= st >= 0;
        if (!byStage.count(st))
          stageOrder.push_back(st);
        byStage[st].push_back(v);
        worth |= st != home && byStage[st].size() > 1;
      }
      if (!known || !worth || byStage.size() < 2)
        continue;
      OpBuilder b(root);
      Location loc = root->getLoc();
      auto add = [&](Value x, Value y, int64_t st) {
        Value r = b.create<AddOp>(loc, x, y);
        stage_[r.getDefiningOp()] = st;
        r.getDefiningOp()->setAttr(kStageAttr, i64(ctx_, st));
        return r;
      };
      // The home stage's partial first, then the others' in order of their
      // first term.
      std::stable_partition(stageOrder.begin(), stageOrder.end(),
                            [&](int64_t st) { return st == home; });
      Value total;
      for (int64_t st : stageOrder) {
        Value part = byStage[st][0];
        for (size_t i = 1; i < byStage[st].size(); ++i)
          part = add(part, byStage[st][i], st);
        total = total ? add(total, part, home) : part;
      }
      root->getResult(0).replaceAllUsesWith(total);
      for (Operation *n : nodes) { // users first: the root, then inward
        stage_.erase(n);
        n->erase();
      }
    }
  }

  /// A value used on another stage crosses with kiln.transfer (once per
  /// value and stage); results go where the function's caller expects
  /// them: a parameter or state update on its owner, anything else on
  /// every device (kiln.collective_broadcast from its stage).
  LogicalResult insertTransfers(Block &body, int64_t &transfers) {
    std::map<std::pair<void *, int64_t>, Value> moved;
    auto move = [&](Value v, int64_t from, int64_t to, Operation *before) -> Value {
      auto key = std::make_pair(v.getAsOpaquePointer(), to);
      if (auto it = moved.find(key); it != moved.end())
        return it->second;
      OpBuilder b(before);
      Value r;
      if (to < 0)
        r = b.create<CollectiveBroadcastOp>(v.getLoc(), v, kAxis, from);
      else
        r = b.create<TransferOp>(v.getLoc(), v, kAxis, from, to);
      ++transfers;
      moved[key] = r;
      return r;
    };
    SmallVector<Operation *> ops;
    for (Operation &op : body.without_terminator())
      ops.push_back(&op);
    for (Operation *op : ops) {
      int64_t s = stageOf(op);
      for (OpOperand &use : op->getOpOperands()) {
        int64_t t = stageOfValue(use.get());
        if (t < 0 || t == s)
          continue;
        use.set(move(use.get(), t, s, op));
      }
    }
    Operation *ret = body.getTerminator();
    for (OpOperand &use : ret->getOpOperands()) {
      int64_t t = stageOfValue(use.get());
      if (t < 0)
        continue;
      int64_t want = -1;
      if (auto name = f_.getResultAttrOfType<StringAttr>(use.getOperandNumber(),
                                                         KilnDialect::kOutputAttr))
        if (auto it = argNames_.find(name.getValue()); it != argNames_.end())
          want = it->second;
      if (want != t)
        use.set(move(use.get(), t, want, ret));
    }
    return success();
  }

  /// Reorders @train_step into the schedule: a topological order of the
  /// ops in which each one comes as early as its schedule unit's start
  /// time (kiln.pp.mb / kiln.pp.phase from kiln-train-step) allows; ops
  /// outside the units follow their operands.
  LogicalResult reorder(Block &body, int64_t M, Schedule sched) {
    auto times = scheduleTimes(P_, V_, M, sched);
    if (times.empty())
      return f_.emitError() << "kiln-pipeline: the schedule of " << P_ << " devices, " << V_
                            << " chunks each and " << M << " micro-batches does not complete";
    SmallVector<Operation *> ops;
    for (Operation &op : body.without_terminator())
      ops.push_back(&op);
    llvm::DenseMap<Operation *, size_t> index;
    for (auto [i, op] : llvm::enumerate(ops))
      index[op] = i;
    std::vector<double> key(ops.size(), 0);
    std::vector<int> pending(ops.size(), 0);
    std::vector<SmallVector<size_t, 4>> users(ops.size());
    for (auto [i, op] : llvm::enumerate(ops)) {
      double k = 0;
      llvm::SmallDenseSet<size_t, 8> deps;
      for (Value v : op->getOperands())
        if (Operation *d = v.getDefiningOp(); d && index.count(d))
          deps.insert(index[d]);
      for (size_t d : deps) {
        k = std::max(k, key[d]);
        users[d].push_back(i);
      }
      pending[i] = int(deps.size());
      auto mb = op->getAttrOfType<IntegerAttr>("kiln.pp.mb");
      auto phase = op->getAttrOfType<IntegerAttr>("kiln.pp.phase");
      int64_t s = stageOf(op);
      if (V_ > 1) { // units are chunks; ops made after toDevices are none
        auto c = chunk_.find(op);
        s = c == chunk_.end() ? -1 : c->second;
      }
      if (mb && phase && s >= 0 && phase.getInt() >= 0) {
        auto it = times.find({s, phase.getInt(), mb.getInt()});
        if (it != times.end())
          k = std::max(k, it->second);
      }
      key[i] = k;
    }
    using Item = std::pair<double, size_t>;
    std::priority_queue<Item, std::vector<Item>, std::greater<Item>> ready;
    for (size_t i = 0; i < ops.size(); ++i)
      if (!pending[i])
        ready.push({key[i], i});
    Operation *ret = body.getTerminator();
    size_t emitted = 0;
    while (!ready.empty()) {
      size_t i = ready.top().second;
      ready.pop();
      ops[i]->moveBefore(ret);
      ++emitted;
      for (size_t u : users[i])
        if (--pending[u] == 0)
          ready.push({key[u], u});
    }
    if (emitted != ops.size())
      return f_.emitError() << "kiln-pipeline: the ops of @" << f_.getSymName()
                            << " do not form a DAG";
    return success();
  }

  /// Interleaved: chunk c (kiln.stage until now) runs on device c mod P.
  /// Once every op has its chunk, stages become devices (each op's chunk is
  /// kept for the schedule), so that sums regroup per device and values
  /// cross only between devices.
  void toDevices(Block &body) {
    auto dev = [&](int64_t c) { return c < 0 ? c : c % P_; };
    for (BlockArgument a : body.getArguments()) {
      if (auto st = f_.getArgAttrOfType<IntegerAttr>(a.getArgNumber(), kStageAttr))
        f_.setArgAttr(a.getArgNumber(), kStageAttr, i64(ctx_, dev(st.getInt())));
      argStage_[a] = dev(argStage_.lookup(a));
    }
    for (auto &e : argNames_)
      e.second = dev(e.second);
    for (Operation &op : body.without_terminator()) {
      int64_t c = stageOfOp(&op);
      chunk_[&op] = c;
      stage_[&op] = dev(c);
      if (c >= 0)
        op.setAttr(kStageAttr, i64(ctx_, dev(c)));
    }
  }

  func::FuncOp f_;
  int64_t P_;
  int64_t V_ = 1;
  /// Interleaved: each op's model chunk (toDevices), for the schedule.
  llvm::DenseMap<Operation *, int64_t> chunk_;
  const llvm::StringMap<int64_t> &owners_;
  MLIRContext *ctx_;
  llvm::DenseMap<BlockArgument, int64_t> argStage_;
  llvm::StringMap<int64_t> argNames_;
  llvm::DenseMap<Operation *, int64_t> stage_;
};

struct KilnPipelinePass : impl::KilnPipelinePassBase<KilnPipelinePass> {
  using KilnPipelinePassBase::KilnPipelinePassBase;

  void runOnOperation() override {
    ModuleOp m = getOperation();
    int64_t P = getMesh(m).axisSize(kAxis);
    auto fwd = m.lookupSymbol<func::FuncOp>("forward");
    if (P <= 1 || !fwd)
      return;
    llvm::StringMap<int64_t> owners = pipelineOwners(m);
    TrainSettings train(m);
    int64_t M = train.gradAccum();
    std::string pipeline = train.pipeline();
    Schedule sched = pipeline == "gpipe"         ? Schedule::GPipe
                     : pipeline == "interleaved" ? Schedule::Interleaved
                                                 : Schedule::OneF1B;
    const int64_t V = virtualStages(m);
    if (V == 1 && sched == Schedule::Interleaved)
      sched = Schedule::OneF1B; // one chunk per device: plain 1F1B
    // @grad (the gradient check's function) stays a one-device program.
    if (auto g = m.lookupSymbol<func::FuncOp>("grad"))
      g.walk([](Operation *op) { op->removeAttr(kStageAttr); });
    int64_t transfers = 0;
    for (StringRef name : {"train_step", "eval_step", "predict"}) {
      auto f = m.lookupSymbol<func::FuncOp>(name);
      if (!f)
        continue;
      Stager st(f, P, owners);
      int64_t t = 0;
      st.setVirtualStages(V);
      if (failed(st.run(name == "train_step", M, sched, t)))
        return signalPassFailure();
      if (name == "train_step")
        transfers = t;
    }
    numTransfers = transfers;
  }
};

} // namespace

std::vector<PipelineUnit> pipelineOrder(int64_t device, int64_t devices, int64_t virtualStages,
                                        int64_t microBatches, StringRef schedule) {
  Schedule s = schedule == "gpipe" ? Schedule::GPipe
               : schedule == "interleaved" && virtualStages > 1 ? Schedule::Interleaved
                                                                : Schedule::OneF1B;
  return deviceOrder(device, devices, s == Schedule::Interleaved ? virtualStages : 1,
                     microBatches, s);
}

llvm::StringMap<int64_t> pipelineOwners(ModuleOp m) {
  llvm::StringMap<int64_t> owners;
  auto fwd = m.lookupSymbol<func::FuncOp>("forward");
  if (!fwd || getMesh(m).axisSize(kAxis) <= 1)
    return owners;
  for (Operation &op : fwd.getBody().front())
    for (Value v : op.getOperands())
      if (auto a = dyn_cast<BlockArgument>(v))
        if (auto name = fwd.getArgAttrOfType<StringAttr>(a.getArgNumber(), KilnDialect::kParamAttr))
          if (!owners.count(name.getValue()) && stageOf(&op) >= 0)
            owners[name.getValue()] = stageOf(&op);
  return owners;
}

} // namespace kiln
