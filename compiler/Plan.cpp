//===- Plan.cpp - Steps, the buffer plan and the plan reports ------------===//
//
// The schedule of each function (one step per kernel, library GEMM with its
// epilogue, or copy, in program order), the buffer plan (persistent region,
// in-place updates, first-fit scratch over live ranges), and the reports
// that print them (kilnc --emit=plan, --fusion-report).
//
//===----------------------------------------------------------------------===//
#include "compiler/Generator.h"

#include "dialects/kiln/KilnDialect.h"
#include "dialects/kiln/KilnOps.h"
#include "dialects/kiln/Sharding.h"
#include "dialects/kiln/TrainSettings.h"
#include "passes/Fusion.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/ScopeExit.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SmallPtrSet.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

using namespace mlir;

namespace kiln {

using program::Buffer;
using program::DType;
using program::Role;
using program::Step;

namespace codegen {

Generator::Generator(ModuleOp module, bool fusion, std::string &error)
    : module_(module), ctx_(module.getContext()), error_(error), fusion_(fusion) {
  kernels_ = ModuleOp::create(UnknownLoc::get(ctx_));
  neutral_ = ModuleOp::create(UnknownLoc::get(ctx_));
}

LogicalResult Generator::run() {
  for (const char *name : {"train_step", "eval_step", "predict"}) {
    auto fn = module_.lookupSymbol<func::FuncOp>(name);
    if (!fn)
      continue;
    if (failed(compileFunction(fn)))
      return failure();
  }
  MeshShape mesh = getMesh(module_);
  int64_t pp = std::max<int64_t>(1, mesh.axisSize("pp"));
  // The arena: the persistent region (parameters, optimizer state), then
  // the scratch region each function reuses. With pipeline stages every
  // device holds the regions of what all devices hold (-1), then its own
  // stage's persistent and scratch regions, at the same addresses on every
  // stage.
  int64_t shared = persistentEnd_[-1] + scratchPeak_[-1];
  for (int id : scratchIds_) {
    Buffer &b = prog_.buffers[size_t(id)];
    b.offset += b.stage < 0 ? persistentEnd_[-1] : shared + persistentEnd_[b.stage];
  }
  if (pp > 1)
    for (size_t id = 0; id < prog_.buffers.size(); ++id) {
      Buffer &b = prog_.buffers[id];
      if ((b.role == Role::Param || b.role == Role::State) && b.stage >= 0)
        b.offset += shared;
    }
  prog_.arenaBytes = prog_.persistentBytes;
  for (const program::Function &f : prog_.functions)
    prog_.arenaBytes = std::max(prog_.arenaBytes, prog_.persistentBytes + f.scratchBytes);
  // The device mesh: every device runs the same steps on the same layout
  // (data parallelism), so devices 1.. get copies of device 0's plan.
  for (const MeshAxis &a : mesh.axes)
    prog_.mesh.axes.push_back({a.name, a.size});
  prog_.deterministic = TrainSettings(module_).deterministicDevices();
  if (mesh.devices() > 1) {
    program::BufferPlan same{prog_.buffers, prog_.persistentBytes, prog_.arenaBytes};
    prog_.otherDevices.assign(size_t(mesh.devices() - 1), same);
  }
  // Pipeline stages: one layout, but each device's arena ends after its own
  // stage's buffers (and every device's): persistent ones, then scratch
  // from the common scratch base.
  if (pp > 1) {
    int64_t perStage = mesh.devices() / pp;
    for (int d = 0; d < mesh.devices(); ++d) {
      int s = int(d / perStage);
      program::BufferPlan &p = d == 0 ? prog_ : prog_.otherDevices[size_t(d - 1)];
      // The persistent buffers of the device end here (the runtime checks
      // they lie below it; every device's scratch region sits inside).
      p.persistentBytes = shared + persistentEnd_[s];
      p.arenaBytes = shared + persistentEnd_[s] + scratchPeak_[s];
    }
  }
  // Plan v2: each step waits for the steps whose memory it touches (offsets
  // are final now); gradient-bucket collectives (kiln.overlap) and pipeline
  // sends and receives run on queue 1, everything else in order on queue 0.
  for (auto [f, queues] : llvm::zip(prog_.functions, queues_)) {
    program::computeDependencies(prog_, f);
    for (auto [st, q] : llvm::zip(f.steps, queues)) {
      st.queue = q;
      prog_.queues = std::max(prog_.queues, q + 1);
    }
    if (llvm::is_contained(queues, 1))
      exactDependencies(prog_, f);
  }
  return success();
}

/// computeDependencies() tracks memory through every buffer overlapping
/// the one written, so a step can wait for another whose bytes it never
/// touches (two buffers that both overlap a third, dead one). On one queue
/// that costs nothing; a communication queue would lose its overlap, so
/// such a function gets exact dependencies (program::exactDependencies):
/// a step that reuses memory a collective still reads or writes waits for
/// the collective: the scratch first fit cannot hand out a buffer while a
/// collective has it in flight.
void Generator::exactDependencies(const program::Program &p, program::Function &f) {
  program::exactDependencies(p, f);
}

LogicalResult Generator::fail(Operation *op, const std::string &why) {
  error_ = fmt::format("{}: cannot generate code for '{}': {}",
                       locString(op->getLoc()), op->getName().getStringRef().str(), why);
  return failure();
}

/// A buffer record for a value of type `t` (offset still unset).
Buffer Generator::makeBuffer(RankedTensorType t, Role role, const std::string &name) {
  Buffer b;
  b.name = name;
  b.role = role;
  toDType(t.getElementType(), b.dtype);
  b.shape.assign(t.getShape().begin(), t.getShape().end());
  b.bytes = b.numElements() * program::dtypeBytes(b.dtype);
  return b;
}

/// The persistent buffer named `name`, created on first use.
/// Pipeline stages: each stage's buffers have a region of their own, laid
/// out in run(); buffers of two stages share addresses (no device holds
/// both).
int Generator::persistentBuffer(const std::string &name, Role role, int stage,
                                RankedTensorType t) {
  int id = prog_.persistent(name);
  if (id >= 0)
    return id;
  Buffer b = makeBuffer(t, role, name);
  b.stage = stage;
  b.offset = persistentEnd_[stage]; // relative to its stage's region until run() ends
  persistentEnd_[stage] = align(b.offset + b.bytes);
  if (stage < 0)
    prog_.persistentBytes = persistentEnd_[stage];
  prog_.buffers.push_back(b);
  return int(prog_.buffers.size()) - 1;
}

Value Generator::root(Value v) {
  auto it = alias_.find(v);
  return it == alias_.end() ? v : root(it->second);
}

/// A GEMM step for the kiln.matmul `mm` (inside `fusion`, whose operands
/// are `outer`), with attention's head transposes read or written in place.
/// Sets s.lt* when the epilogue members `epi` of `mm` (in `fusion`, with
/// outputs `outs`, values inside the fusion) are what a GEMM library's
/// epilogue computes: [broadcast of a [n] bias + add], then [relu |
/// gelu(tanh)]; outputs the activation's result and, for GELU only, the
/// pre-activation. The GEMM's raw value may be read elsewhere only as that
/// pre-activation (no bias), whose buffer is then the GEMM's own.
void Generator::matchLtEpilogue(FusionOp fusion, MatmulOp mm, ArrayRef<Operation *> epi,
                                ArrayRef<Value> outs, VStep &s) {
  using Act = program::LtEpilogue::Activation;
  auto ot = cast<RankedTensorType>(mm.getType());
  if (!ot.getElementType().isF32())
    return;
  Value g = mm.getResult(), bias, pre = g, y;
  Act act = Act::None;
  for (Operation *m : epi) {
    if (auto b = dyn_cast<BroadcastInDimOp>(m)) {
      auto a = dyn_cast<BlockArgument>(b.getOperand());
      auto bt = cast<RankedTensorType>(b.getOperand().getType());
      if (bias || !a || bt.getRank() != 1 || b.getDims().size() != 1 ||
          b.getDims()[0] != ot.getRank() - 1 || b.getType() != ot)
        return;
      bias = b.getResult();
    } else if (auto add = dyn_cast<AddOp>(m)) {
      if (pre != g || !bias || !((add.getLhs() == g && add.getRhs() == bias) ||
                                 (add.getRhs() == g && add.getLhs() == bias)))
        return;
      pre = add.getResult();
    } else if (auto r = dyn_cast<ReluOp>(m)) {
      if (y || r.getOperand() != pre)
        return;
      y = r.getResult();
      act = Act::Relu;
    } else if (auto ge = dyn_cast<GeluOp>(m)) {
      if (y || ge.getOperand() != pre || ge.getApproximation() != GeluApproximation::tanh)
        return;
      y = ge.getResult();
      act = Act::GeluTanh;
    } else {
      return; // anything else: the epilogue stays a kernel
    }
  }
  if (bias && pre == g)
    return; // a broadcast bias that nothing adds
  Value out = y ? y : pre;
  if (out == g || !llvm::is_contained(outs, out))
    return;
  bool preOut = y && pre != g && llvm::is_contained(outs, pre);
  auto yield = cast<YieldOp>(fusion.getBlock().getTerminator());
  bool gemmOut = llvm::is_contained(yield.getValues(), g);
  // The outputs: `out`, and the pre-activation only as GELU's aux.
  if (outs.size() != 1 + (preOut ? 1 : 0) || (preOut && act != Act::GeluTanh))
    return;
  // The raw GEMM value read outside: only as GELU's pre-activation.
  if (gemmOut && (pre != g || act != Act::GeluTanh))
    return;
  if ((preOut || gemmOut) && ot.getDimSize(ot.getRank() - 1) % 8 != 0)
    return; // cuBLASLt's aux rows are padded to 8 elements
  auto resultOf = [&](Value inner) {
    for (auto [i, v] : llvm::enumerate(yield.getValues()))
      if (v == inner)
        return fusion.getResult(i);
    return Value();
  };
  s.lt = true;
  s.ltAct = act;
  if (bias) {
    auto a = cast<BlockArgument>(cast<BroadcastInDimOp>(bias.getDefiningOp()).getOperand());
    s.ltBias = root(fusion.getOperand(a.getArgNumber()));
  }
  s.ltOut = resultOf(out);
  s.ltAux = preOut ? resultOf(pre) : gemmOut ? g : Value();
}

LogicalResult Generator::gemmStep(FusionOp fusion, MatmulOp mm, VStep &s) {
  auto outerOf = [&](Value inner) -> Value {
    if (auto a = dyn_cast<BlockArgument>(inner))
      return fusion.getOperand(a.getArgNumber());
    return inner;
  };
  Value lhs = outerOf(mm.getLhs()), rhs = outerOf(mm.getRhs());
  auto lt = cast<RankedTensorType>(mm.getLhs().getType());
  auto rt = cast<RankedTensorType>(mm.getRhs().getType());
  auto ot = cast<RankedTensorType>(mm.getType());
  s.kind = Step::Gemm;
  s.ins = {root(lhs), root(rhs)};
  s.outs = {mm.getResult()};
  program::GemmParams &g = s.gemm;
  // The fusion result that is the raw GEMM value, if any.
  Value outerResult;
  auto yield = cast<YieldOp>(fusion.getBlock().getTerminator());
  for (auto [i, v] : llvm::enumerate(yield.getValues()))
    if (v == mm.getResult())
      outerResult = fusion.getResult(i);
  Operation *outT = outerResult && outerResult.hasOneUse() ? *outerResult.getUsers().begin()
                                                           : nullptr;
  bool strided = isHeadMatmul(mm) &&
                 (foldedIn_.count(lhs.getDefiningOp()) || foldedIn_.count(rhs.getDefiningOp()) ||
                  (outT && foldedOut_.count(outT)));
  if (strided) {
    auto layoutOf = [&](Value v, program::MatrixLayout &l) -> Value {
      auto t = cast<RankedTensorType>(v.getType()); // [B, H, R, C]
      int64_t h = t.getDimSize(1), r = t.getDimSize(2), c = t.getDimSize(3);
      if (foldedIn_.count(v.getDefiningOp())) { // stored as [B, R, H, C]
        l = {r * h * c, c, h * c};
        return root(v.getDefiningOp()->getOperand(0));
      }
      l = {h * r * c, r * c, c};
      return root(v);
    };
    s.ins = {layoutOf(lhs, g.lhsLayout), layoutOf(rhs, g.rhsLayout)};
    int64_t h = ot.getDimSize(1), rr = ot.getDimSize(2), cc = ot.getDimSize(3);
    if (outT && foldedOut_.count(outT)) { // write [B, M, H, N]
      g.outLayout = {rr * h * cc, cc, h * cc};
      s.outs = {outT->getResult(0)};
    } else {
      g.outLayout = {h * rr * cc, rr * cc, cc};
    }
    g.heads = h;
  }
  int64_t r = ot.getRank();
  g.m = ot.getDimSize(r - 2);
  g.n = ot.getDimSize(r - 1);
  g.k = mm.getTransposeLhs() ? lt.getDimSize(lt.getRank() - 2) : lt.getDimSize(lt.getRank() - 1);
  g.batch = 1;
  for (int64_t d = 0; d < r - 2; ++d)
    g.batch *= ot.getDimSize(d);
  g.transposeLhs = mm.getTransposeLhs();
  g.transposeRhs = mm.getTransposeRhs();
  if (!toDType(ot.getElementType(), g.dtype))
    return mm.emitOpError("has no library GEMM for its element type");
  // precision = tf32: f32 GEMMs on TF32 tensor cores where the backend has them.
  if (g.dtype == program::DType::F32)
    g.tf32 = TrainSettings(mm->getParentOfType<ModuleOp>()).precision() == "tf32";
  g.lhsBatched = lt.getRank() > 2;
  g.rhsBatched = rt.getRank() > 2;
  if (outerResult && s.outs.front() == mm.getResult())
    alias_[outerResult] = mm.getResult();
  return success();
}

/// A collective step: the op's operand and result, what moves and on which
/// queue. `bytes` is what each device contributes (Program.h): the whole
/// operand for every op here (an all_gather's operand is its own part).
LogicalResult Generator::collectiveStep(Operation *op, VStep &s) {
  using C = program::Collective;
  s.kind = Step::Collective;
  s.loc = locString(op->getLoc());
  s.ins = {root(op->getOperand(0))};
  s.outs = {op->getResult(0)};
  auto t = cast<RankedTensorType>(op->getOperand(0).getType());
  if (!t.hasStaticShape() || !toDType(t.getElementType(), s.coll.dtype))
    return fail(op, "a collective's operand must be a statically shaped tensor of a "
                    "supported type");
  auto reduction = [](CollectiveReduction r) {
    switch (r) {
    case CollectiveReduction::sum: return C::Reduction::Sum;
    case CollectiveReduction::mean: return C::Reduction::Mean;
    case CollectiveReduction::max: return C::Reduction::Max;
    case CollectiveReduction::min: return C::Reduction::Min;
    }
    return C::Reduction::None;
  };
  if (auto o = dyn_cast<AllReduceOp>(op)) {
    s.coll.op = C::Op::AllReduce;
    s.coll.axis = o.getAxis().str();
    s.coll.reduction = reduction(o.getReduction());
  } else if (auto o = dyn_cast<ReduceScatterOp>(op)) {
    s.coll.op = C::Op::ReduceScatter;
    s.coll.axis = o.getAxis().str();
    s.coll.reduction = reduction(o.getReduction());
    if (o.getDim() != 0)
      return fail(op, "a reduce_scatter in the plan splits dim 0 only (each device's block "
                      "is contiguous); transpose its operand first");
  } else {
    auto g = cast<AllGatherOp>(op);
    s.coll.op = C::Op::AllGather;
    s.coll.axis = g.getAxis().str();
    if (g.getDim() != 0)
      return fail(op, "an all_gather in the plan concatenates along dim 0 only (each "
                      "device's block is contiguous); transpose its result afterwards");
  }
  s.coll.bytes = t.getNumElements() * program::dtypeBytes(s.coll.dtype);
  s.overlap = op->hasAttr(KilnDialect::kOverlapAttr);
  return success();
}

/// The steps of a pipeline transfer (send on `from`, recv on `to`) or of a
/// result broadcast (every device, from the root stage).
LogicalResult Generator::pipelineSteps(Operation *op, std::vector<VStep> &steps) {
  using C = program::Collective;
  auto t = cast<RankedTensorType>(op->getOperand(0).getType());
  VStep s;
  s.kind = Step::Collective;
  s.loc = locString(op->getLoc());
  if (!t.hasStaticShape() || !toDType(t.getElementType(), s.coll.dtype))
    return fail(op, "a transfer's operand must be a statically shaped tensor of a "
                    "supported type");
  s.coll.bytes = t.getNumElements() * program::dtypeBytes(s.coll.dtype);
  if (auto b = dyn_cast<CollectiveBroadcastOp>(op)) {
    s.coll.op = C::Op::Broadcast;
    s.coll.axis = b.getAxis().str();
    s.coll.peer = int(b.getRoot());
    s.ins = {root(op->getOperand(0))};
    s.outs = {op->getResult(0)};
    steps.push_back(std::move(s));
    return success();
  }
  auto x = cast<TransferOp>(op);
  VStep send = s, recv = s;
  send.coll.op = C::Op::Send;
  send.coll.axis = x.getAxis().str();
  send.coll.peer = int(x.getTo());
  send.stage = int(x.getFrom());
  send.ins = {root(x.getOperand())};
  recv.coll.op = C::Op::Recv;
  recv.coll.axis = x.getAxis().str();
  recv.coll.peer = int(x.getFrom());
  recv.stage = int(x.getTo());
  recv.outs = {x.getResult()};
  steps.push_back(std::move(send));
  steps.push_back(std::move(recv));
  return success();
}

LogicalResult Generator::compileFunction(func::FuncOp fn) {
  alias_.clear();
  Block &block = fn.getBody().front();
  // The GEMM prologue/epilogue decisions: head transposes folded into GEMMs
  // (kiln-fuse leaves them outside every kernel).
  if (fusion_)
    findFoldedTransposes(block, foldedIn_, foldedOut_);
  else
    foldedIn_.clear(), foldedOut_.clear();
  // cross_entropy(mean|sum) is a row reduction (per position) followed by
  // one over every row: two kernel forms, so two ops.
  SmallVector<CrossEntropyOp> losses;
  fn.walk([&](CrossEntropyOp ce) {
    if (ce.getReduction() != LossReduction::none)
      losses.push_back(ce);
  });
  for (CrossEntropyOp ce : losses) {
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
      total = b.create<ReduceMeanOp>(ce.getLoc(), ce.getType(), per,
                                     b.getDenseI64ArrayAttr(all), UnitAttr());
    else
      total = b.create<ReduceSumOp>(ce.getLoc(), ce.getType(), per,
                                    b.getDenseI64ArrayAttr(all), UnitAttr());
    if (Attribute st = ce->getAttr(kStageAttr))
      total.getDefiningOp()->setAttr(kStageAttr, st);
    ce.replaceAllUsesWith(total);
    ce.erase();
  }
  // The first micro-batch's forward pass: the ops its loss depends on,
  // found again after fusion by a mark that no kernel keeps.
  constexpr llvm::StringLiteral kForwardMark = "kiln.plan.forward";
  hasForward_ = false;
  forwardValues_.clear();
  otherSteps_.clear();
  if (Operation *loss = fn.getSymName() == "train_step" ? forwardLoss(fn) : nullptr) {
    hasForward_ = true;
    SmallVector<Operation *> work{loss};
    while (!work.empty()) {
      Operation *op = work.pop_back_val();
      if (op->hasAttr(kForwardMark))
        continue;
      op->setAttr(kForwardMark, UnitAttr::get(ctx_));
      for (Value v : op->getOperands())
        if (Operation *d = v.getDefiningOp(); d && d->getBlock() == &block)
          work.push_back(d);
    }
  }
  FusionOptions fo;
  fo.enabled = fusion_;
  std::vector<FusionRefusal> refusals;
  if (failed(fuseFunction(fn, fo, &refusals))) {
    error_ = "kiln-fuse failed on @" + fn.getSymName().str();
    return failure();
  }
  for (FusionRefusal &r : refusals) {
    Refusal out;
    out.function = fn.getSymName().str();
    out.producer = r.producer;
    out.producerLoc = r.producerLoc;
    out.consumer = r.consumer;
    out.consumerLoc = r.consumerLoc;
    out.rule = r.rule;
    refusals_.push_back(std::move(out));
  }

  llvm::DenseSet<Operation *> forwardOps;
  if (hasForward_)
    fn.walk([&](Operation *op) {
      if (op->hasAttr(kForwardMark)) {
        op->removeAttr(kForwardMark);
        forwardOps.insert(op);
      }
    });
  // After the steps are made: which results are forward values, which
  // steps compute something else.
  auto classify = [&](Operation &op) {
    if (!hasForward_)
      return;
    bool other = false;
    if (auto fusion = dyn_cast<FusionOp>(op)) {
      for (Operation &m : fusion.getMembers())
        other |= !isa<ConstantOp>(m) && !forwardOps.count(&m);
      auto yield = cast<YieldOp>(fusion.getBlock().getTerminator());
      for (auto [i, y] : llvm::enumerate(yield.getValues()))
        if (Operation *d = y.getDefiningOp(); d && forwardOps.count(d))
          forwardValues_.insert(fusion.getResult(unsigned(i)));
    } else {
      // A collective reads gradients or the loss: communication, not backward.
      other = !forwardOps.count(&op) && !isa<AllReduceOp, ReduceScatterOp, AllGatherOp>(op);
      if (forwardOps.count(&op))
        for (Value r : op.getResults())
          forwardValues_.insert(r);
    }
    otherSteps_.push_back(other);
  };
  std::vector<VStep> steps;
  auto ret = cast<func::ReturnOp>(block.getTerminator());
  // Parameter and state updates that their kernel may write over the old
  // value: the old value's last reader is that kernel.
  llvm::DenseMap<Value, BlockArgument> oldValueOf;
  for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
    auto name = fn.getResultAttrOfType<StringAttr>(i, KilnDialect::kOutputAttr);
    if (!name || !isa_and_nonnull<FusionOp>(v.getDefiningOp()))
      continue;
    for (BlockArgument a : block.getArguments()) {
      auto p = fn.getArgAttrOfType<StringAttr>(a.getArgNumber(), KilnDialect::kParamAttr);
      auto st = fn.getArgAttrOfType<StringAttr>(a.getArgNumber(), KilnDialect::kStateAttr);
      if (((p && p == name) || (st && st == name)) && a.getType() == v.getType())
        oldValueOf[v] = a;
    }
  }
  auto lastReader = [&](Value a, Operation *f) {
    SmallVector<Value> work{a};
    while (!work.empty()) {
      Value x = work.pop_back_val();
      for (Operation *u : x.getUsers()) {
        if (u == f)
          continue;
        if (isa<func::ReturnOp>(u) || f->isBeforeInBlock(u))
          return false;
        if (isa<ReshapeOp, OptimizationBarrierOp>(u))
          work.push_back(u->getResult(0));
      }
    }
    return true;
  };
  auto returnedValue = [&](Value a) { // returned, as it is or reshaped
    SmallVector<Value> work{a};
    while (!work.empty()) {
      Value x = work.pop_back_val();
      for (Operation *u : x.getUsers()) {
        if (isa<func::ReturnOp>(u))
          return true;
        if (isa<ReshapeOp, OptimizationBarrierOp>(u))
          work.push_back(u->getResult(0));
      }
    }
    return false;
  };
  auto tiesOf = [&](FusionOp f, ArrayRef<Value> ins, ArrayRef<Value> outs) {
    SmallVector<std::pair<unsigned, unsigned>> ties;
    auto yield = f.getBlock().getTerminator();
    for (auto [o, inner] : llvm::enumerate(outs)) {
      Value outer;
      for (auto [k, y] : llvm::enumerate(yield->getOperands()))
        if (y == inner)
          outer = f.getResult(k);
      auto it = outer ? oldValueOf.find(outer) : oldValueOf.end();
      if (it == oldValueOf.end() || !lastReader(it->second, f))
        continue;
      for (auto [i, in] : llvm::enumerate(ins)) {
        auto a = dyn_cast<BlockArgument>(in);
        if (a && f.getOperand(a.getArgNumber()) == it->second)
          ties.push_back({unsigned(o), unsigned(i)});
      }
    }
    // Temporaries: an output written over an input of its type that dies
    // here (a gradient accumulated over micro-batches, a chain of
    // elementwise kernels) needs no memory of its own. makeKernel keeps the
    // tie only for one-loop kernels, which read each element before they
    // write it; the input must be read element for element (no broadcast,
    // which could permute it), by this fusion alone from here on, and be no
    // function argument; the output must be no returned value.
    auto tiedIn = [&](unsigned i) {
      return llvm::any_of(ties, [&](auto t) { return t.second == i; });
    };
    for (auto [o, inner] : llvm::enumerate(outs)) {
      if (llvm::any_of(ties, [&](auto t) { return t.first == o; }))
        continue;
      Value outer;
      for (auto [k, y] : llvm::enumerate(yield->getOperands()))
        if (y == inner)
          outer = f.getResult(k);
      if (!outer || oldValueOf.count(outer) || returnedValue(outer))
        continue;
      for (auto [i, in] : llvm::enumerate(ins)) {
        auto a = dyn_cast<BlockArgument>(in);
        if (!a || a.getOwner() != &f.getBlock() || tiedIn(unsigned(i)) ||
            a.getType() != inner.getType())
          continue;
        Value v = f.getOperand(a.getArgNumber());
        Value src = v; // the value before reshapes, whose buffer v shares
        while (isa_and_nonnull<ReshapeOp, OptimizationBarrierOp>(src.getDefiningOp()))
          src = src.getDefiningOp()->getOperand(0);
        if (isa<BlockArgument>(src) || llvm::count(f.getOperands(), v) != 1 ||
            !lastReader(src, f))
          continue;
        if (!llvm::all_of(a.getUsers(), [](Operation *u) { return isElementwiseOp(u); }))
          continue;
        ties.push_back({unsigned(o), unsigned(i)});
        break;
      }
    }
    return ties;
  };
  for (Operation &op : block.without_terminator()) {
    size_t before = steps.size();
    auto made = llvm::make_scope_exit([&] {
      if (steps.size() > before)
        classify(op);
    });
    if (isa<ConstantOp>(op) || (isa<ReshapeOp, BroadcastInDimOp>(op) && isCloneable(op.getResult(0))))
      continue; // only read inside kernels, which clone it
    if (foldedIn_.count(&op) || foldedOut_.count(&op))
      continue; // done by the GEMM that reads or writes it
    if (isa<ReshapeOp, OptimizationBarrierOp>(op)) {
      alias_[op.getResult(0)] = root(op.getOperand(0));
      continue;
    }
    if (isa<AllReduceOp, ReduceScatterOp, AllGatherOp>(op)) {
      VStep s;
      if (failed(collectiveStep(&op, s)))
        return failure();
      s.stage = int(stageOf(&op));
      steps.push_back(std::move(s));
      continue;
    }
    if (isa<TransferOp, CollectiveBroadcastOp>(op)) {
      // Pipeline stages: a transfer is a send on its stage and the matching
      // recv on the other, adjacent; a broadcast runs everywhere.
      if (failed(pipelineSteps(&op, steps)))
        return failure();
      continue;
    }
    auto fusion = dyn_cast<FusionOp>(op);
    if (!fusion)
      return fail(&op, "the op is in no kernel (kiln-fuse left it outside)");
    for (Type t : op.getResultTypes()) {
      DType d;
      auto rt = dyn_cast<RankedTensorType>(t);
      if (!rt || !rt.hasStaticShape() || !toDType(rt.getElementType(), d))
        return fail(&op, "results must be statically shaped tensors of a supported type");
    }
    VStep s;
    SmallVector<Operation *> members;
    for (Operation &m : fusion.getMembers())
      members.push_back(&m);
    Operation *main = members.empty() ? &op : members.back();
    s.loc = locString(main->getLoc());
    auto yield = cast<YieldOp>(fusion.getBlock().getTerminator());
    MatmulOp mm;
    for (Operation *m : members)
      if (auto x = dyn_cast<MatmulOp>(m))
        mm = x;
    if (mm && (fusion.getKind() == "gemm_epilogue" || fusion.getKind() == "gemm")) {
      s.loc = locString(mm.getLoc());
      s.stage = int(stageOf(&op));
      if (failed(gemmStep(fusion, mm, s)))
        return failure();
      // The epilogue: every member after the GEMM, reading its result.
      SmallVector<Operation *> epi;
      for (Operation *m : members)
        if (m != mm.getOperation())
          epi.push_back(m);
      if (!epi.empty()) {
        llvm::SmallPtrSet<Operation *, 8> epiSet(epi.begin(), epi.end());
        SmallVector<Value> ins, outs;
        for (Operation *m : epi)
          for (Value v : m->getOperands()) {
            Operation *d = v.getDefiningOp();
            if ((d && (epiSet.count(d) || isa<ConstantOp>(d))) || llvm::is_contained(ins, v))
              continue;
            ins.push_back(v);
          }
        for (Value v : yield.getValues())
          if (v.getDefiningOp() && epiSet.count(v.getDefiningOp()) &&
              !llvm::is_contained(outs, v))
            outs.push_back(v);
        // The GEMM's own operands are never written over.
        auto ties = tiesOf(fusion, ins, outs);
        llvm::erase_if(ties, [&](auto t) {
          return ins[t.second] == mm.getLhs() || ins[t.second] == mm.getRhs();
        });
        FailureOr<int> k = makeKernel(epi, ins, outs, "elementwise",
                                      cast<RankedTensorType>(mm.getType()).getRank(), ties);
        if (failed(k))
          return failure();
        s.epilogue = *k;
        for (Value v : ins) {
          auto a = dyn_cast<BlockArgument>(v);
          s.epiIns.push_back(a ? root(fusion.getOperand(a.getArgNumber())) : v);
        }
        for (Value v : outs)
          for (auto [i, y] : llvm::enumerate(yield.getValues()))
            if (y == v) {
              s.epiOuts.push_back(fusion.getResult(i));
              break;
            }
        for (auto [o, i] : ties)
          s.tied.push_back({s.epiOuts[o], s.epiIns[i]});
        if (ties.empty() && s.gemm.heads == 0)
          matchLtEpilogue(fusion, mm, epi, outs, s);
      }
      steps.push_back(std::move(s));
      continue;
    }
    if (mm && members.size() != 1)
      return fail(mm, "a matmul that is no library GEMM (f64 or integer) must be a kernel of "
                      "its own");
    s.kind = Step::Kernel;
    SmallVector<Value> ins(fusion.getBlock().getArguments().begin(),
                           fusion.getBlock().getArguments().end());
    SmallVector<Value> outs(yield.getValues().begin(), yield.getValues().end());
    auto ties = tiesOf(fusion, ins, outs);
    FailureOr<int> k = makeKernel(members, ins, outs, fusion.getKind(), fusion.getRows(), ties);
    if (failed(k))
      return failure();
    s.kernel = *k;
    s.stage = int(stageOf(&op));
    for (Value v : fusion.getOperands())
      s.ins.push_back(root(v));
    for (Value v : fusion.getResults())
      s.outs.push_back(v);
    for (auto [o, i] : ties)
      s.tied.push_back({s.outs[o], s.ins[i]});
    steps.push_back(std::move(s));
  }
  for (Value v : ret.getOperands())
    if (!v.getDefiningOp() ||
        isa<FusionOp, AllReduceOp, ReduceScatterOp, AllGatherOp, TransferOp,
            CollectiveBroadcastOp>(v.getDefiningOp()) ||
        alias_.count(v) || isa<BlockArgument>(v))
      continue;
    else if (!foldedOut_.count(v.getDefiningOp()))
      return fail(v.getDefiningOp(), "a returned value has no buffer");
  return assignBuffers(fn, steps, ret);
}

/// kiln-train-step returns loss = [all_reduce(mean)] of [(1/K) *] the sum
/// l0 + l1 + ... (or a pairwise tree) of the micro-batches' losses
/// (docs/training.md): l0's op
/// (null where the chain is not that).
Operation *Generator::forwardLoss(func::FuncOp fn) {
  auto ret = cast<func::ReturnOp>(fn.getBody().front().getTerminator());
  Value v;
  for (unsigned i = 0; i < fn.getNumResults(); ++i)
    if (auto o = fn.getResultAttrOfType<StringAttr>(i, KilnDialect::kOutputAttr))
      if (o.getValue() == "loss")
        v = ret.getOperand(i);
  if (!v)
    return nullptr;
  TrainSettings train(module_);
  int64_t k = train.gradAccum();
  bool deterministic = train.deterministicDevices();
  bool mesh = getMesh(module_).axisSize("dp") > 1;
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

LogicalResult Generator::assignBuffers(func::FuncOp fn, std::vector<VStep> &steps,
                                       func::ReturnOp ret) {
  program::Function out;
  out.name = fn.getSymName().str();
  const int n = int(steps.size());
  const int kEnd = n + 1; // "live until the function returns"

  llvm::DenseMap<Value, int> buffer; // root value -> buffer id
  llvm::DenseMap<Value, int> def, last;
  Block &block = fn.getBody().front();

  // Pipeline stages: the stage holding each value (-1: every device).
  auto stageOfValue = [&](Value v) -> int {
    if (auto a = dyn_cast<BlockArgument>(v)) {
      auto s = fn.getArgAttrOfType<IntegerAttr>(a.getArgNumber(), kStageAttr);
      return s ? int(s.getInt()) : -1;
    }
    Operation *d = v.getDefiningOp();
    if (auto t = dyn_cast<TransferOp>(d))
      return int(t.getTo());
    if (isa<CollectiveBroadcastOp>(d))
      return -1;
    return int(stageOf(d));
  };
  // Arguments: parameters and state are persistent; inputs are scratch.
  for (BlockArgument a : block.getArguments()) {
    auto t = cast<RankedTensorType>(a.getType());
    DType d;
    if (!toDType(t.getElementType(), d))
      return fail(fn, "an argument has an unsupported element type");
    int stage = stageOfValue(a);
    if (auto p = fn.getArgAttrOfType<StringAttr>(a.getArgNumber(), KilnDialect::kParamAttr))
      buffer[a] = persistentBuffer(p.str(), Role::Param, stage, t);
    else if (auto st = fn.getArgAttrOfType<StringAttr>(a.getArgNumber(), KilnDialect::kStateAttr))
      buffer[a] = persistentBuffer(st.str(), Role::State, stage, t);
    // ZeRO: a sharded parameter or state tensor (kiln.shard = {axis,
    // shape}): the buffer holds this device's block of the logical tensor.
    if (auto shard = fn.getArgAttrOfType<DictionaryAttr>(a.getArgNumber(), "kiln.shard");
        shard && buffer.count(a)) {
      auto axis = shard.getAs<StringAttr>("axis");
      auto shape = shard.getAs<DenseI64ArrayAttr>("shape");
      if (!axis || !shape || getMesh(module_).axisSize(axis.getValue()) < 1)
        return fail(fn, "argument " + std::to_string(a.getArgNumber()) +
                            " has a kiln.shard without an axis of the module's mesh and a shape");
      Buffer &b = prog_.buffers[size_t(buffer[a])];
      b.shardAxis = axis.str();
      b.logicalShape.assign(shape.asArrayRef().begin(), shape.asArrayRef().end());
      // Tensor parallelism (kiln.shard's dim and outer): dimension `dim`
      // split over the axis, see program::Buffer::shardDim.
      if (shard.contains("dim") || shard.contains("outer")) {
        std::string what = "argument " + std::to_string(a.getArgNumber()) +
                           " ('" + b.name + "')";
        auto dim = shard.getAs<IntegerAttr>("dim");
        auto outer = shard.getAs<IntegerAttr>("outer");
        int64_t rank = int64_t(b.logicalShape.size());
        if (!dim || dim.getInt() < 0 || dim.getInt() >= rank)
          return fail(
              fn, what +
                      " has a kiln.shard whose dim is not a dimension of its " +
                      std::to_string(rank) + "-d logical shape");
        if (shard.contains("outer") && (!outer || outer.getInt() < 1))
          return fail(
              fn,
              what + " has a kiln.shard whose outer is not a positive integer");
        int64_t n = getMesh(module_).axisSize(axis.getValue());
        int64_t k = outer ? outer.getInt() : 1;
        int64_t size = b.logicalShape[size_t(dim.getInt())];
        if (size % (k * n) != 0)
          return fail(
              fn, fmt::format(
                      "{} splits dimension {} (size {}) as {} part(s) over the "
                      "{} devices of '{}', but {} is not a multiple of {}",
                      what, dim.getInt(), size, k, n, axis.getValue().str(),
                      size, k * n));
        std::vector<int64_t> local = b.logicalShape;
        local[size_t(dim.getInt())] = size / n;
        // ZeRO over another axis as well: the buffer is block d of that
        // tp block, flattened (program::Buffer::zeroAxis).
        if (auto zero = shard.getAs<StringAttr>("zero")) {
          int64_t z = getMesh(module_).axisSize(zero.getValue());
          if (z < 1)
            return fail(fn, what + " has a kiln.shard whose zero is not an axis of the module's mesh");
          int64_t numel = 1;
          for (int64_t d : local)
            numel *= d;
          local = {(numel + z - 1) / z};
          b.zeroAxis = zero.str();
        }
        if (b.shape != local)
          return fail(
              fn, fmt::format(
                      "{} has shape [{}], but its tensor-parallel block of "
                      "logical shape [{}] is [{}]",
                      what, fmt::join(b.shape, "x"),
                      fmt::join(b.logicalShape, "x"), fmt::join(local, "x")));
        b.shardDim = dim.getInt();
        b.shardOuter = k;
      }
    }
    def[a] = -1;
    last[a] = -1;
  }
  for (auto [i, s] : llvm::enumerate(steps)) {
    for (Value v : llvm::concat<Value>(s.ins, s.epiIns))
      last[root(v)] = std::max(last.lookup(root(v)), int(i));
    for (Value v : llvm::concat<Value>(s.outs, s.epiOuts)) {
      def[v] = int(i);
      last[v] = std::max(last.lookup(v), int(i));
    }
  }
  for (Value v : ret.getOperands())
    last[root(v)] = kEnd;

  // Outputs tied to an input live in the input's buffer: a parameter's or
  // state tensor's now, a temporary's once it has one (below).
  llvm::DenseSet<Value> tiedOut;
  llvm::DenseMap<Value, Value> tiedTemp; // output -> the temporary input
  for (VStep &s : steps)
    for (auto [o, i] : s.tied) {
      if (buffer.count(root(i)))
        buffer[o] = buffer.lookup(root(i));
      else
        tiedTemp[o] = root(i);
      tiedOut.insert(o);
    }
  // Results that are new values of a parameter or state tensor go
  // straight into its buffer when written over the old value (tied) or
  // when the old value is dead before the producing step; otherwise a copy
  // at the end.
  std::vector<std::pair<Value, int>> copies;
  llvm::DenseSet<int> claimed;
  for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
    auto name = fn.getResultAttrOfType<StringAttr>(i, KilnDialect::kOutputAttr);
    int target = name ? prog_.persistent(name.str()) : -1;
    if (target < 0)
      continue;
    Value r = root(v);
    if (buffer.count(r) && buffer[r] == target)
      continue; // returned unchanged, or written in place
    Value old;
    for (BlockArgument a : block.getArguments())
      if (buffer.count(a) && buffer[a] == target)
        old = a;
    bool inPlace = false;
    if (!buffer.count(r) && def.count(r) && def[r] >= 0 && !claimed.count(target)) {
      int oldLast = old ? last.lookup(old) : -1;
      inPlace = oldLast < def[r];
    }
    if (inPlace) {
      buffer[r] = target;
      claimed.insert(target);
    } else {
      copies.push_back({r, target});
    }
  }

  // Scratch buffers, first fit over live ranges.
  // Pipeline stages: a buffer only conflicts with live buffers its own
  // devices hold (its stage's and every device's).
  struct Live { int64_t offset, size; int end; int id; int stage; };
  std::vector<Live> live;
  int64_t peak = 0;
  std::map<int, int64_t> stagePeak;
  auto allocate = [&](Value v, Role role, const std::string &name) -> int {
    Buffer b = makeBuffer(cast<RankedTensorType>(v.getType()), role, name);
    b.stage = stageOfValue(v);
    int64_t size = align(std::max<int64_t>(b.bytes, 1));
    std::sort(live.begin(), live.end(),
              [](const Live &x, const Live &y) { return x.offset < y.offset; });
    int64_t at = 0;
    for (const Live &l : live) {
      if (l.stage != b.stage)
        continue; // pipeline stages: a region per stage (run())
      if (l.offset - at >= size)
        break;
      at = std::max(at, l.offset + l.size);
    }
    b.offset = at; // relative to the scratch base until run() ends
    prog_.buffers.push_back(b);
    scratchIds_.push_back(int(prog_.buffers.size()) - 1);
    live.push_back({at, size, last.lookup(v), scratchIds_.back(), b.stage});
    peak = std::max(peak, at + size);
    stagePeak[b.stage] = std::max(stagePeak[b.stage], at + size);
    return scratchIds_.back();
  };
  auto release = [&](int before) {
    live.erase(std::remove_if(live.begin(), live.end(),
                              [&](const Live &l) { return l.end < before; }),
               live.end());
  };

  for (BlockArgument a : block.getArguments()) {
    if (buffer.count(a))
      continue;
    auto name = fn.getArgAttrOfType<StringAttr>(a.getArgNumber(), KilnDialect::kInputAttr);
    buffer[a] = allocate(a, Role::Input, name ? name.str() : "");
  }
  llvm::DenseSet<Value> returned;
  for (Value v : ret.getOperands())
    returned.insert(root(v));
  for (int i = 0; i < n; ++i) {
    release(i);
    if (steps[i].kind == Step::Collective && steps[i].coll.op == program::Collective::Op::AllReduce) {
      // In place: an all_reduce whose operand (a scratch temporary) dies
      // here receives into the operand's buffer, which then lives as long
      // as the result.
      Value in = steps[i].ins[0], res = steps[i].outs[0];
      auto it = buffer.find(in);
      Live *l = nullptr;
      if (it != buffer.end() && last.lookup(in) == i && !returned.count(res))
        for (Live &x : live)
          if (x.id == it->second && prog_.buffers[x.id].role == Role::Temp)
            l = &x;
      if (l) {
        buffer[res] = l->id;
        l->end = std::max(l->end, last.lookup(res));
      }
    }
    for (Value v : llvm::concat<Value>(steps[i].outs, steps[i].epiOuts)) {
      auto t = tiedTemp.find(v);
      if (t != tiedTemp.end()) {
        // Written over a temporary that dies here: its buffer, which now
        // lives as long as the output.
        auto in = buffer.find(t->second);
        Live *l = nullptr;
        if (in != buffer.end())
          for (Live &x : live)
            if (x.id == in->second && prog_.buffers[size_t(x.id)].role == Role::Temp)
              l = &x;
        if (!l)
          return fail(v.getDefiningOp(), "an output tied to a temporary that has no live buffer");
        buffer[v] = l->id;
        l->end = std::max(l->end, last.lookup(v));
        continue;
      }
      if (!buffer.count(v))
        buffer[v] = allocate(v, returned.count(v) ? Role::Output : Role::Temp, "");
    }
  }

  for (BlockArgument a : block.getArguments())
    out.args.push_back(buffer[a]);
  for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
    out.results.push_back(buffer[root(v)]);
    Buffer &b = prog_.buffers[buffer[root(v)]];
    auto name = fn.getResultAttrOfType<StringAttr>(i, KilnDialect::kOutputAttr);
    if (b.role == Role::Output && b.name.empty() && name)
      b.name = name.str();
  }
  std::vector<int> queues;
  for (VStep &s : steps) {
    Step st;
    st.kind = s.kind;
    st.kernel = s.kernel;
    st.gemm = s.gemm;
    st.loc = s.loc;
    st.collective = s.coll;
    st.stage = s.stage;
    // Queue 1, the communication queue: gradient buckets (kiln.overlap) and
    // the pipeline's sends and receives, so that a stage computes its next
    // micro-batch while the last one's activations travel. Every device
    // runs each queue in the function's order, one order for all: no cycle.
    bool p2p = s.kind == Step::Collective && (s.coll.op == program::Collective::Op::Send ||
                                              s.coll.op == program::Collective::Op::Recv);
    queues.push_back(s.kind == Step::Collective && (s.overlap || p2p) ? 1 : 0);
    for (Value v : s.ins)
      st.args.push_back(buffer[root(v)]);
    for (Value v : s.outs)
      if (!(s.kind == Step::Kernel && tiedOut.count(v)))
        st.args.push_back(buffer[v]);
    st.epilogue = s.epilogue;
    for (Value v : s.epiIns)
      st.epilogueArgs.push_back(buffer[root(v)]);
    for (Value v : s.epiOuts)
      if (!tiedOut.count(v))
        st.epilogueArgs.push_back(buffer[v]);
    if (s.lt) {
      st.lt.activation = s.ltAct;
      st.lt.bias = s.ltBias ? buffer[root(s.ltBias)] : -1;
      st.lt.out = buffer[s.ltOut];
      st.lt.aux = !s.ltAux ? -1 : s.ltAux == s.outs.front() ? st.args[2] : buffer[s.ltAux];
    }
    out.steps.push_back(std::move(st));
  }
  for (auto [v, target] : copies) {
    Step st;
    st.kind = Step::Copy;
    st.args = {buffer[v], target};
    st.stage = prog_.buffers[size_t(target)].stage;
    st.loc = locString(v.getLoc());
    out.steps.push_back(std::move(st));
    queues.push_back(0);
  }
  out.scratchBytes = peak;
  for (auto &[s, v] : stagePeak)
    scratchPeak_[s] = std::max(scratchPeak_[s], v);
  // Activations: temporaries holding forward values that a step computing
  // something else (backward) reads.
  if (hasForward_ && otherSteps_.size() == steps.size()) {
    ActivationMemory a;
    std::set<int> ids;
    for (auto [i, s] : llvm::enumerate(steps)) {
      if (!otherSteps_[i])
        continue;
      for (Value v : llvm::concat<Value>(s.ins, s.epiIns)) {
        Value r = root(v);
        auto it = buffer.find(r);
        if (forwardValues_.count(r) && it != buffer.end() &&
            prog_.buffers[size_t(it->second)].role == Role::Temp)
          ids.insert(it->second);
      }
    }
    for (int id : ids) {
      const Buffer &b = prog_.buffers[size_t(id)];
      a.bytes += b.bytes;
      a.buffers++;
      a.bytesByType[program::dtypeName(b.dtype)] += b.bytes;
    }
    activations_[out.name] = std::move(a);
  }
  queues_.push_back(std::move(queues));
  prog_.functions.push_back(std::move(out));
  return success();
}

} // namespace codegen

ZeroMemory zeroMemory(const program::Program &p, int stage) {
  ZeroMemory m;
  // ZeRO shards over "dp"; on a mesh with other axes (tp) only its size
  // divides the state.
  int dp = p.mesh.axis("dp");
  m.devices = dp >= 0 ? std::max<int64_t>(1, p.mesh.axes[size_t(dp)].size)
                      : std::max(1, p.mesh.numDevices());
  int pp = p.mesh.axis("pp"), tp = p.mesh.axis("tp");
  if (dp < 0 && pp >= 0) // the replicas of a stage
    m.devices = std::max<int64_t>(
        1, p.mesh.numDevices() / (std::max<int64_t>(1, p.mesh.axes[size_t(pp)].size) *
                                  (tp >= 0 ? std::max<int64_t>(1, p.mesh.axes[size_t(tp)].size)
                                           : 1)));
  for (const Buffer &b : p.buffers) {
    if (b.role != Role::Param || (stage >= 0 && b.stage >= 0 && b.stage != stage))
      continue;
    int64_t n = b.numElements();
    // A ZeRO-sharded parameter counts whole (each device holds all of it
    // outside the update); a tensor-parallel one by its local block, which
    // is all a device ever holds of it, its gradient and optimizer state.
    if (!b.shardAxis.empty() && b.shardDim < 0)
      n = std::accumulate(b.logicalShape.begin(), b.logicalShape.end(), int64_t(1),
                          std::multiplies<int64_t>());
    m.psi += n;
    m.paramBytes += n * program::dtypeBytes(b.dtype);
    m.gradBytes += n * program::dtypeBytes(b.dtype);
    for (const Buffer &st : p.buffers) {
      llvm::StringRef name(st.name);
      if (st.role == Role::State && name.ends_with(":" + b.name) &&
          name.size() > b.name.size() + 1)
        m.optimizerBytes += n * program::dtypeBytes(st.dtype);
    }
  }
  return m;
}

namespace {
/// The three rows of `m`, each line starting with `indent`.
void printZeroRows(const ZeroMemory &m, llvm::raw_ostream &os, const std::string &indent) {
  double psi = double(std::max<int64_t>(m.psi, 1));
  auto per = [&](int64_t b) { return fmt::format("{:g}", double(b) / psi); };
  auto mib = [](int64_t b) { return fmt::format("{:.2f} MiB", double(b) / (1 << 20)); };
  os << fmt::format("{}  plain DP  {:>12} bytes ({}), {} Psi\n", indent, m.plainDP(),
                    mib(m.plainDP()), per(m.plainDP()));
  os << fmt::format("{}  ZeRO-1    {:>12} bytes ({}), {} Psi: optimizer state / N\n", indent,
                    m.zero1(), mib(m.zero1()), per(m.zero1()));
  os << fmt::format("{}  ZeRO-2    {:>12} bytes ({}), {} Psi: gradients and optimizer state / N\n",
                    indent, m.zero2(), mib(m.zero2()), per(m.zero2()));
}

/// "params 4 Psi + gradients 4 Psi + optimizer state 8 Psi" for `m`.
std::string zeroPerPsi(const ZeroMemory &m) {
  double psi = double(std::max<int64_t>(m.psi, 1));
  auto per = [&](int64_t b) { return fmt::format("{:g}", double(b) / psi); };
  return fmt::format("params {} Psi + gradients {} Psi + optimizer state {} Psi",
                     per(m.paramBytes), per(m.gradBytes), per(m.optimizerBytes));
}
} // namespace

void printZeroMemory(const ZeroMemory &m, llvm::raw_ostream &os, const std::string &indent) {
  os << fmt::format("{}memory per device, ZeRO paper accounting (Psi = {} parameters, N = {}; "
                    "{}):\n",
                    indent, m.psi, m.devices, zeroPerPsi(m));
  printZeroRows(m, os, indent);
}

void printStageZeroMemory(const std::vector<ZeroMemory> &stages, llvm::raw_ostream &os,
                          const std::string &indent) {
  int64_t n = stages.empty() ? 1 : stages[0].devices;
  os << fmt::format("{}memory per device of each pipeline stage, ZeRO paper accounting (Psi_stage "
                    "= the parameters the stage holds, N = {} data-parallel replica{} of each "
                    "stage):\n",
                    indent, n, n == 1 ? "" : "s");
  for (size_t s = 0; s < stages.size(); ++s) {
    os << fmt::format("{}  stage {} (Psi_stage = {} parameters; {}):\n", indent, s,
                      stages[s].psi, zeroPerPsi(stages[s]));
    printZeroRows(stages[s], os, indent + "  ");
  }
}

namespace {
/// The queue-0 steps a queue-1 step `i` of `f` overlaps: those after it up
/// to the first queue-0 step that waits for it, or for a later queue-1 step
/// (which runs after it on its queue).
std::vector<size_t> overlapped(const program::Function &f, size_t i) {
  std::vector<size_t> out;
  if (f.steps[i].queue == 0)
    return out;
  for (size_t j = i + 1; j < f.steps.size(); ++j) {
    const Step &s = f.steps[j];
    if (s.queue != 0)
      continue;
    bool waits = llvm::any_of(s.deps, [&](int d) {
      return size_t(d) >= i && f.steps[size_t(d)].queue == f.steps[i].queue;
    });
    if (waits)
      break;
    out.push_back(j);
  }
  return out;
}
} // namespace

void printPlan(const program::Program &p, llvm::raw_ostream &os,
               const std::map<std::string, ActivationMemory> &activations) {
  auto mib = [](int64_t b) { return fmt::format("{:.2f} MiB", double(b) / (1 << 20)); };
  os << fmt::format("arena: {} bytes ({}): persistent {} bytes (parameters and "
                    "optimizer state), scratch peak {} bytes\n",
                    p.arenaBytes, mib(p.arenaBytes), p.persistentBytes,
                    p.arenaBytes - p.persistentBytes);
  int64_t split = 0;
  for (const program::Kernel &k : p.kernels)
    split += k.chunks > 1;
  os << fmt::format("kernels: {} distinct, {} of them split into row pieces for threads\n",
                    p.kernels.size(), split);
  if (p.mesh.numDevices() > 1) {
    std::string axes;
    for (const program::MeshAxis &a : p.mesh.axes)
      axes += fmt::format("{}{}={}", axes.empty() ? "" : " x ", a.name, a.size);
    int pp = p.mesh.axis("pp") >= 0 ? int(p.mesh.axes[size_t(p.mesh.axis("pp"))].size) : 1;
    os << fmt::format("mesh: {} ({} devices{}); {} queue{}\n", axes, p.mesh.numDevices(),
                      pp > 1 ? "" : ", each with this arena", p.queues,
                      p.queues == 1 ? "" : "s");
    if (pp > 1) {
      // Pipeline stages: each stage's devices hold its own arena and run
      // its own steps of each function.
      int per = p.mesh.numDevices() / pp;
      for (int st = 0; st < pp; ++st) {
        const program::BufferPlan &bp = p.plan(st * per);
        std::string devs;
        for (int d = st * per; d < (st + 1) * per; ++d)
          devs += (devs.empty() ? "" : ",") + std::to_string(d);
        int64_t held = 0; // parameters and optimizer state this stage holds
        for (const Buffer &b : bp.buffers)
          if ((b.role == Role::Param || b.role == Role::State) && (b.stage < 0 || b.stage == st))
            held += (b.bytes + 63) / 64 * 64;
        os << fmt::format("  stage {} (device{} {}): arena {} bytes ({}): persistent {} bytes, "
                          "scratch peak {} bytes\n",
                          st, per > 1 ? "s" : "", devs, bp.arenaBytes, mib(bp.arenaBytes), held,
                          bp.arenaBytes - held);
        for (const program::Function &f : p.functions) {
          int kernels = 0, gemms = 0, copies = 0;
          std::map<std::string, int> coll;
          int64_t sent = 0, ncoll = 0;
          for (const program::Step &x : f.steps) {
            if (x.stage >= 0 && x.stage != st)
              continue;
            if (x.kind == Step::Kernel)
              ++kernels;
            else if (x.kind == Step::Gemm)
              ++gemms;
            else if (x.kind == Step::Copy)
              ++copies;
            else {
              ++coll[program::collectiveOpName(x.collective.op)], ++ncoll;
              if (x.collective.op == program::Collective::Op::Send)
                sent += x.collective.bytes;
            }
          }
          std::string list;
          for (auto &[name, n] : coll)
            list += fmt::format("{}{} {}", list.empty() ? "" : ", ", name, n);
          os << fmt::format("    @{}: {} kernels, {} gemms, {} copies, {} collectives ({}); "
                            "{} bytes sent\n",
                            f.name, kernels, gemms, copies, ncoll, list, sent);
        }
      }
    }
    if (pp > 1) {
      std::vector<ZeroMemory> stages;
      for (int s = 0; s < pp; ++s)
        stages.push_back(zeroMemory(p, s));
      printStageZeroMemory(stages, os, "");
    } else {
      printZeroMemory(zeroMemory(p), os, "");
    }
    if (pp <= 1)
      os << fmt::format("  this plan  {:>12} bytes ({}) per device: persistent {} bytes, "
                      "scratch peak {} bytes\n",
                      p.arenaBytes, mib(p.arenaBytes), p.persistentBytes,
                      p.arenaBytes - p.persistentBytes);
  }
  auto shapeStr = [](const Buffer &b) {
    std::string s = program::dtypeName(b.dtype);
    s += "[";
    for (size_t i = 0; i < b.shape.size(); ++i)
      s += (i ? "x" : "") + std::to_string(b.shape[i]);
    return s + "]";
  };
  // Tensor-parallel buffers (listed only where there are some, so ZeRO and
  // single-device listings are unchanged).
  std::string tp;
  for (const Buffer &b : p.buffers)
    if (!b.shardAxis.empty() && b.shardDim >= 0)
      tp += fmt::format(
          "  {}: {} of logical [{}], sharded over {} on dim {}{}{}\n", b.name,
          shapeStr(b), fmt::join(b.logicalShape, "x"), b.shardAxis, b.shardDim,
          b.shardOuter > 1 ? fmt::format(" in {} parts", b.shardOuter) : "",
          b.zeroAxis.empty() ? "" : fmt::format(", then ZeRO blocks over {}", b.zeroAxis));
  if (!tp.empty())
    os << "tensor-parallel buffers (each device holds its block):\n" << tp;
  for (const program::Function &f : p.functions) {
    int64_t temps = 0, kernels = 0, gemms = 0, copies = 0, collectives = 0;
    for (const Step &s : f.steps)
      (s.kind == Step::Kernel       ? kernels
       : s.kind == Step::Gemm       ? gemms
       : s.kind == Step::Collective ? collectives
                                    : copies)++;
    std::set<int> ids;
    for (const Step &s : f.steps)
      for (int id : llvm::concat<const int>(s.args, s.epilogueArgs))
        if (p.buffers[id].role == Role::Temp && ids.insert(id).second)
          temps += p.buffers[id].bytes;
    os << fmt::format("\n@{}: {} steps ({} kernels, {} gemms, {} copies{}); scratch "
                      "peak {} bytes ({}); {} bytes of temporaries without reuse\n",
                      f.name, f.steps.size(), kernels, gemms, copies,
                      collectives ? fmt::format(", {} collectives", collectives) : "",
                      f.scratchBytes, mib(f.scratchBytes), temps);
    if (collectives) {
      std::map<std::string, int64_t> byOp;
      int64_t reduced = 0, bucketed = 0, buckets = 0;
      for (const Step &s : f.steps) {
        if (s.kind != Step::Collective)
          continue;
        byOp[program::collectiveOpName(s.collective.op)]++;
        buckets += s.queue == 1;
        if (s.collective.op == program::Collective::Op::AllReduce) {
          reduced += s.collective.bytes;
          bucketed += s.queue == 1 ? s.collective.bytes : 0;
        }
      }
      std::string ops;
      for (auto &[op, k] : byOp)
        ops += fmt::format("{}{} {}", ops.empty() ? "" : ", ", op, k);
      os << fmt::format("  collectives per step: {} ({}); bytes all-reduced per step: {} ({} in "
                        "buckets); buckets: {} (collectives on queue 1)\n",
                        collectives, ops, reduced, bucketed, buckets);
    }
    // What --inter-op-threads runs: the DAG of exact dependencies.
    program::Function exact = f;
    program::exactDependencies(p, exact);
    if (program::ScheduleShape g = program::scheduleShape(exact); g.steps)
      os << fmt::format("  dependency DAG: {} levels, widest {} steps, {:.2f} steps per level "
                        "(what --inter-op-threads can run at once)\n",
                        g.depth, g.widest, g.meanWidth());
    if (auto it = activations.find(f.name); it != activations.end()) {
      const ActivationMemory &a = it->second;
      std::string types;
      for (auto &[t, b] : a.bytesByType)
        types += fmt::format("{}{} {} bytes", types.empty() ? "" : ", ", t, b);
      os << fmt::format("  activations saved for backward: {} bytes ({}) in {} buffers (values "
                        "the first micro-batch's loss depends on, read by backward){}{}\n",
                        a.bytes, mib(a.bytes), a.buffers, types.empty() ? "" : ": ", types);
    }
    for (size_t i = 0; i < f.steps.size(); ++i) {
      const Step &s = f.steps[i];
      std::string what = s.kind == Step::Kernel
                             ? p.kernels[s.kernel].symbol +
                                   (p.kernels[s.kernel].chunks > 1
                                        ? fmt::format(" x{}", p.kernels[s.kernel].chunks)
                                        : "")
                         : s.kind == Step::Gemm ? "gemm"
                         : s.kind == Step::Collective
                             ? fmt::format("{}{} over {}",
                                           program::collectiveOpName(s.collective.op),
                                           s.collective.reduction ==
                                                   program::Collective::Reduction::None
                                               ? ""
                                               : fmt::format("({})", program::reductionName(
                                                                        s.collective.reduction)),
                                           s.collective.axis)
                             : "copy";
      std::string args;
      for (int id : s.args) {
        const Buffer &b = p.buffers[id];
        args += fmt::format(" {}{}@{}", b.name.empty() ? "" : b.name + ":",
                            shapeStr(b), b.offset);
      }
      os << fmt::format("  {:4} {:<34}{}", i, what, args);
      if (std::string sched = program::scheduleNote(f, i); !sched.empty())
        os << "  " << sched;
      if (!s.loc.empty())
        os << "  ; " << s.loc;
      os << "\n";
      if (s.kind == Step::Collective) {
        std::vector<size_t> over = overlapped(f, i);
        std::string kernels;
        for (size_t j = 0; j < over.size() && j < 4; ++j) {
          const Step &o = f.steps[over[j]];
          kernels += (j ? " " : "") + (o.kind == Step::Kernel ? p.kernels[o.kernel].symbol
                                       : o.kind == Step::Gemm ? std::string("gemm")
                                                              : fmt::format("step{}", over[j]));
        }
        if (over.size() > 4)
          kernels += " ...";
        os << fmt::format("       {} bytes of {} per device, queue {}{}{}\n", s.collective.bytes,
                          program::dtypeName(s.collective.dtype), s.queue,
                          s.args.size() == 2 && s.args[0] == s.args[1] ? ", in place" : "",
                          s.queue == 0 ? ""
                          : over.empty()
                              ? ", overlaps nothing"
                          : over.size() == 1
                              ? fmt::format(", overlaps step {} ({})", over.front(), kernels)
                              : fmt::format(", overlaps {} steps, {}-{} ({})", over.size(),
                                            over.front(), over.back(), kernels));
      }
      if (s.kind == Step::Gemm && s.epilogue >= 0) {
        const program::Kernel &k = p.kernels[s.epilogue];
        std::string eargs;
        for (int id : s.epilogueArgs) {
          const Buffer &b = p.buffers[id];
          eargs += fmt::format(" {}{}@{}", b.name.empty() ? "" : b.name + ":", shapeStr(b),
                               b.offset);
        }
        os << fmt::format("       + epilogue {:<23}{}\n",
                          k.symbol + (k.chunks > 1 ? fmt::format(" x{}", k.chunks) : ""), eargs);
        if (s.lt.valid()) {
          auto at = [&](int id) { return fmt::format("@{}", p.buffers[id].offset); };
          std::string pre = "A B" + (s.lt.bias >= 0 ? " + bias " + at(s.lt.bias) : "");
          if (s.lt.activation != program::LtEpilogue::Activation::None)
            pre = fmt::format("{}({})", program::activationName(s.lt.activation), pre);
          os << fmt::format("         as a library epilogue (cuBLASLt): out = {} {}{}\n", pre,
                            at(s.lt.out),
                            s.lt.aux >= 0 ? ", pre-activation " + at(s.lt.aux) : "");
        }
      }
    }
  }
}

void printFusionReport(const program::Program &p, const std::vector<Refusal> &refusals,
                       llvm::raw_ostream &os) {
  const program::Function *f = p.function("train_step");
  if (!f)
    f = p.functions.empty() ? nullptr : &p.functions.front();
  if (!f)
    return;
  int64_t kernels = 0, gemms = 0, epilogues = 0, copies = 0, flops = 0, bytes = 0, fused = 0;
  std::map<std::string, int64_t> byKind;
  std::string lines;
  auto where = [&](const program::Kernel &k) {
    std::vector<std::string> fileLines; // "file:line", without directories
    for (const std::string &loc : k.locs) {
      llvm::StringRef l(loc);
      size_t c = l.rfind(':');
      l = c == llvm::StringRef::npos ? l : l.take_front(c);
      size_t slash = l.rfind('/');
      std::string fl = (slash == llvm::StringRef::npos ? l : l.drop_front(slash + 1)).str();
      if (!llvm::is_contained(fileLines, fl))
        fileLines.push_back(fl);
    }
    std::string w;
    for (size_t j = 0; j < fileLines.size() && j < 4; ++j)
      w += (j ? ", " : "") + fileLines[j];
    if (fileLines.size() > 4)
      w += ", ...";
    return w;
  };
  auto opsOf = [](const program::Kernel &k) {
    std::string ops;
    for (size_t j = 0; j < k.ops.size(); ++j)
      ops += (j ? " " : "") + llvm::StringRef(k.ops[j]).drop_front(5).str();
    return ops;
  };
  auto moved = [&](const std::vector<int> &ids) {
    int64_t m = 0;
    for (int id : ids)
      m += p.buffers[id].bytes;
    return m;
  };
  for (size_t i = 0; i < f->steps.size(); ++i) {
    const Step &s = f->steps[i];
    // Kernels: in-place (tied) outputs are read and written.
    int64_t m = s.kind == Step::Kernel
                    ? int64_t(program::kernelTrafficBytes(p, s.kernel, s.args))
                    : moved(s.args);
    if (s.kind == Step::Gemm) {
      ++gemms;
      int64_t fl = 2 * s.gemm.batch * s.gemm.m * s.gemm.n * s.gemm.k;
      std::string shape = fmt::format("[{}x{}x{}]x{}{}{}", s.gemm.m, s.gemm.n, s.gemm.k,
                                      s.gemm.batch, s.gemm.transposeLhs ? " tA" : "",
                                      s.gemm.transposeRhs ? " tB" : "");
      if (s.epilogue >= 0) {
        const program::Kernel &k = p.kernels[s.epilogue];
        ++epilogues;
        fl += k.flops;
        m += int64_t(program::kernelTrafficBytes(p, s.epilogue, s.epilogueArgs));
        lines += fmt::format("  {:4} {:<20} {:<40} {:>12} flops {:>10} bytes  ; {}\n", i,
                             "gemm+epilogue", shape + " + " + k.symbol, fl, m, s.loc);
        lines += fmt::format("       epilogue: {}\n", opsOf(k));
      } else {
        lines += fmt::format("  {:4} {:<20} {:<40} {:>12} flops {:>10} bytes  ; {}\n", i,
                             "gemm", shape, fl, m, s.loc);
      }
      flops += fl;
      bytes += m;
      continue;
    }
    bytes += m;
    if (s.kind == Step::Collective) {
      lines += fmt::format("  {:4} {:<20} {:<40} {:>12} flops {:>10} bytes  ; {}\n", i,
                           "collective", program::collectiveOpName(s.collective.op), 0,
                           s.collective.bytes, s.loc);
      continue;
    }
    if (s.kind == Step::Copy) {
      ++copies;
      lines += fmt::format("  {:4} copy                 {:<40} {:>12} flops {:>10} bytes  ; {}\n", i,
                           p.buffers[s.args[1]].name, 0, m,
                           "fused update is not in place");
      continue;
    }
    ++kernels;
    const program::Kernel &k = p.kernels[s.kernel];
    flops += k.flops;
    byKind[k.kind]++;
    fused += k.ops.size() > 1;
    lines += fmt::format("  {:4} {:<20} {:<40} {:>12} flops {:>10} bytes  ; {}\n", i, k.kind,
                         k.symbol, k.flops, m, where(k));
    if (k.ops.size() > 1)
      lines += fmt::format("       ops: {}\n", opsOf(k));
  }
  std::string fl = flops >= 100000000 ? fmt::format("{:.2f} GFLOP", double(flops) / 1e9)
                                      : fmt::format("{:.3f} MFLOP", double(flops) / 1e6);
  std::string by = bytes >= 1000000 ? fmt::format("{:.1f} MB", double(bytes) / 1e6)
                                    : fmt::format("{:.1f} kB", double(bytes) / 1e3);
  os << fmt::format("fusion report for @{}: {} kernels ({} fused from several ops), {} "
                    "GEMMs ({} with a fused epilogue), {} copies; {} and {} of buffer "
                    "traffic per call (estimates)\n",
                    f->name, kernels, fused, gemms, epilogues, copies, fl, by);
  os << "kernels by kind:";
  for (auto &[kind, n] : byKind)
    os << fmt::format(" {} {}", kind, n);
  os << "\n\n" << lines;
  std::map<std::string, int64_t> byRule;
  for (const Refusal &r : refusals)
    if (r.function == f->name)
      byRule[r.rule.substr(0, r.rule.find(':'))]++;
  os << fmt::format("\nfusions refused in @{}: {}\n", f->name,
                    std::accumulate(byRule.begin(), byRule.end(), int64_t(0),
                                    [](int64_t a, auto &kv) { return a + kv.second; }));
  for (auto &[rule, n] : byRule)
    os << fmt::format("  {:<20} {}\n", rule, n);
  os << "\n";
  for (const Refusal &r : refusals)
    if (r.function == f->name)
      os << fmt::format("  refused {} ({}) -> {} ({}): {}\n", r.producer, r.producerLoc,
                        r.consumer, r.consumerLoc, r.rule);
}

} // namespace kiln
