//===- Steps.cpp - The schedule: one step per kernel, GEMM or copy -------===//
//
// compileFunction: the steps of one function in program order (a kernel, a
// library GEMM with its epilogue, a collective, a pipeline transfer), and
// the first micro-batch's forward ops (kiln-mark-forward's marks) for the
// activation report.
//
//===----------------------------------------------------------------------===//
#include "compiler/Generator.h"

#include "dialects/kiln/KilnDialect.h"
#include "dialects/kiln/KilnOps.h"
#include "dialects/kiln/Sharding.h"
#include "dialects/kiln/TrainSettings.h"
#include "passes/Fusion.h"
#include "passes/Passes.h"

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

LogicalResult Generator::attentionStep(FusionOp fusion, Operation *op, VStep &s) {
  using A = program::AttentionParams;
  A &a = s.attention;
  // Both ops: q, k, v first and the same attributes.
  Value q = op->getOperand(0), k = op->getOperand(1), v = op->getOperand(2), mask, lse;
  auto attrs = [&](auto x) { // the typed getters (they know the defaults)
    mask = x.getMask(), lse = x.getLse();
    a.causal = x.getCausal();
    a.scale = x.getScale().convertToDouble();
    a.dropout = x.getDropout().convertToDouble();
    a.salt = uint64_t(x.getSalt());
  };
  if (auto f = dyn_cast<AttentionOp>(op)) {
    attrs(f);
  } else if (auto g = dyn_cast<AttentionGradOp>(op)) {
    attrs(g);
    a.backward = true;
  } else {
    return failure();
  }
  auto shape = [](Value x) { return cast<RankedTensorType>(x.getType()).getShape(); };
  ArrayRef<int64_t> qs = shape(q), ks = shape(k), vs = shape(v);
  a.batch = qs[0], a.heads = qs[1], a.queries = qs[2], a.headSize = qs[3];
  a.kvHeads = ks[1], a.keys = ks[2], a.valueSize = vs[3];
  if (!toDType(cast<RankedTensorType>(q.getType()).getElementType(), a.dtype) ||
      !toDType(cast<RankedTensorType>(lse.getType()).getElementType(), a.lseType))
    return op->emitOpError("has no attention step for its element types");
  if (mask) {
    a.mask = cast<RankedTensorType>(mask.getType()).getElementType().isInteger(1) ? A::Mask::Keep
                                                                                 : A::Mask::Add;
    if (shape(mask).size() == 4)
      a.maskBatch = shape(mask)[0], a.maskHeads = shape(mask)[1];
  }
  s.kind = Step::Attention;
  s.loc = locString(op->getLoc());
  // Head transposes kiln-fuse folded (findFoldedTransposes): the step reads
  // and writes those tensors sequence-major, [B, N, H, D].
  auto foldedOutOf = [&](Value v) -> Operation * {
    for (Operation *u : v.getUsers())
      if (foldedOut_.count(u))
        return u;
    return nullptr;
  };
  const uint32_t inBits[] = {A::kQuery, A::kKey, A::kValue, A::kOut, 0, A::kGrad};
  for (auto [i, x] : llvm::enumerate(op->getOperands())) {
    auto arg = dyn_cast<BlockArgument>(x);
    Value outer = arg ? fusion.getOperand(arg.getArgNumber()) : x;
    Operation *def = outer.getDefiningOp();
    uint32_t bit = i < 6 ? inBits[i] : 0;
    if (bit && def && foldedIn_.count(def)) {
      a.seqMajor |= bit;
      outer = def->getOperand(0);
    } else if (bit == A::kOut && a.backward) {
      if (Operation *t = foldedOutOf(outer)) {
        a.seqMajor |= bit;
        outer = t->getResult(0);
      }
    }
    s.ins.push_back(root(outer));
  }
  const uint32_t outBits[] = {a.backward ? A::kQueryGrad : A::kOut,
                              a.backward ? A::kKeyGrad : 0u, a.backward ? A::kValueGrad : 0u};
  auto yield = cast<YieldOp>(fusion.getBlock().getTerminator());
  for (auto [ri, r] : llvm::enumerate(op->getResults()))
    for (auto [i, y] : llvm::enumerate(yield.getValues()))
      if (y == r) {
        Value outer = fusion.getResult(i);
        if (Operation *t = outBits[ri] ? foldedOutOf(outer) : nullptr) {
          a.seqMajor |= outBits[ri];
          outer = t->getResult(0);
        }
        s.outs.push_back(outer);
        break;
      }
  if (s.outs.size() != op->getNumResults())
    return op->emitOpError("has a result its kernel does not return");
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
  // Kernel formation (kiln-split-losses, kiln-mark-forward, kiln-fuse) ran
  // in Generator::run: the GEMM prologue/epilogue decisions made before it
  // (head transposes folded into GEMMs, which kiln-fuse leaves outside every
  // kernel) and the refused fusions are kept per function.
  const FormedFunction &formed = formed_[fn.getSymName().str()];
  foldedIn_ = formed.foldedIn;
  foldedOut_ = formed.foldedOut;
  for (const FusionRefusal &r : formed.refusals) {
    Refusal out;
    out.function = fn.getSymName().str();
    out.producer = r.producer;
    out.producerLoc = r.producerLoc;
    out.consumer = r.consumer;
    out.consumerLoc = r.consumerLoc;
    out.rule = r.rule;
    refusals_.push_back(std::move(out));
  }
  // The first micro-batch's forward pass (kiln-mark-forward's marks, which
  // kiln-fuse keeps on the ops it moves into kernels).
  forwardValues_.clear();
  otherSteps_.clear();
  llvm::DenseSet<Operation *> forwardOps;
  fn.walk([&](Operation *op) {
    if (op->hasAttr(kForwardMarkAttr)) {
      op->removeAttr(kForwardMarkAttr);
      forwardOps.insert(op);
    }
  });
  hasForward_ = !forwardOps.empty();
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
    if (fusion.getKind() == "attention") {
      if (members.size() != 1 || failed(attentionStep(fusion, members.front(), s)))
        return fail(&op, "an attention kernel must hold one kiln.attention or attention_grad");
      s.stage = int(stageOf(&op));
      steps.push_back(std::move(s));
      continue;
    }
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


} // namespace codegen
} // namespace kiln
