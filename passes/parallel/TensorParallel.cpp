//===- TensorParallel.cpp - Megatron tensor parallelism by propagation ----===//
//
// Under a kiln.mesh with a `tp` axis of size T > 1 (train setting tp = T,
// kilnc --tp T), rewrites @train_step, @eval_step, @predict (and @grad) into
// the program one device of a tp group runs (docs/parallel.md, "Tensor
// parallelism"):
//
//   1. Parameters with a `kiln.tp = {dim, outer}` hint on @forward (linear
//      layers built with parallel = "column"/"row", mlp() and attention())
//      are split over tp on that dimension; their optimizer state alike.
//      Everything else starts replicated.
//   2. The shardings propagate through the step in program order with the
//      rule table of dialects/kiln/Sharding.cpp (one entry per op, beside
//      the gradient rules). Where an op cannot take its operands' shardings,
//      a partial sum is made whole with an all_reduce(sum) over tp (Megatron's
//      one all-reduce after each row-parallel matmul, forward and backward);
//      a split the op cannot take is an error naming the op and its line.
//   3. Every value gets its per-device type (a split dimension divided by T),
//      slices and pads their per-device bounds, splat constants and
//      broadcasts feeding split values their per-device shapes.
//
// A fused q/k/v projection's weight [3C, C] splits with outer = 3: device c
// holds the c-th block of each of q, k and v (its heads), so slicing q, k
// and v out of the projection stays local. The pass tracks that factor
// itself (`Tp::outer`); the table sees a plain split.
//
// The program before the pass is the single-device program; the one after
// computes, on every device of a tp group, the same loss, gradient norm and
// (for each device's blocks) the same parameters, up to the order of float
// sums inside a split contraction.
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"
#include "passes/Fusion.h"

#include "dialects/kiln/KilnDialect.h"
#include "dialects/kiln/KilnOps.h"
#include "dialects/kiln/Sharding.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringMap.h"

#include <optional>
#include <string>

using namespace mlir;

#include "passes/parallel/TensorParallelRewriter.h"

namespace kiln {
#define GEN_PASS_DEF_KILNTENSORPARALLELPASS
#include "passes/Passes.h.inc"

namespace tp {



/// Slice, pad and concat along the split dimension itself, which the table
/// (written for data parallelism's batch splits) does not cover: the whole
/// dimension, or one of its `outer` parts (slice), or a part placed into a
/// dimension of `outer` equal parts (pad with zeros, concat).
std::optional<LogicalResult> Rewriter::splitDimShapeOp(Operation *op) {
  if (auto s = dyn_cast<SliceOp>(op)) {
    Tp t = of(s.getOperand());
    if (!t.split())
      return std::nullopt;
    int64_t d = t.dim, size = tensorTypeOf(s.getOperand()).getDimSize(d);
    int64_t start = s.getStart()[d], limit = s.getLimit()[d], stride = s.getStride()[d];
    int64_t part = size / t.outer;
    Tp out = t;
    if (start == 0 && limit == size && stride == 1) {
    } else if (t.outer > 1 && stride == 1 && start % part == 0 && limit - start == part) {
      out.outer = 1;
    } else {
      return LogicalResult(op->emitError()
                           << "kiln-tensor-parallel: slice at " << locString(op->getLoc())
                           << " cuts dimension " << d
                           << ", which is split over tp, other than into its parts");
    }
    return setResult(op, out);
  }
  if (auto p = dyn_cast<PadOp>(op)) {
    Tp t = of(p.getOperand());
    if (!t.split())
      return std::nullopt;
    int64_t d = t.dim, size = tensorTypeOf(p.getOperand()).getDimSize(d);
    int64_t lo = p.getLow()[d], hi = p.getHigh()[d];
    if (t.partial && p.getValue().convertToDouble() != 0.0)
      return std::nullopt;
    if (lo == 0 && hi == 0 && p.getInterior()[d] == 0)
      return std::nullopt; // the table's rule: other dimensions padded
    if (t.outer != 1 || p.getInterior()[d] != 0 || lo % size || hi % size ||
        p.getValue().convertToDouble() != 0.0)
      return LogicalResult(op->emitError()
                           << "kiln-tensor-parallel: pad at " << locString(op->getLoc())
                           << " of dimension " << d << ", which is split over tp, other than "
                           << "by whole parts with zeros");
    for (auto [i, l] : llvm::enumerate(p.getLow()))
      if (int64_t(i) != d && (l || p.getHigh()[i] || p.getInterior()[i]))
        return LogicalResult(op->emitError()
                             << "kiln-tensor-parallel: pad at " << locString(op->getLoc())
                             << " pads several dimensions of a value split over tp");
    return setResult(op, Tp{d, (lo + hi) / size + 1, t.partial});
  }
  if (auto c = dyn_cast<ConcatOp>(op)) {
    int64_t d = int64_t(c.getDim());
    bool any = llvm::any_of(op->getOperands(), [&](Value v) { return of(v).dim == d; });
    if (!any)
      return std::nullopt;
    Tp first = of(op->getOperand(0));
    int64_t size = tensorTypeOf(op->getOperand(0)).getDimSize(d);
    for (Value v : op->getOperands())
      if (of(v) != first || first.outer != 1 || tensorTypeOf(v).getDimSize(d) != size)
        return LogicalResult(op->emitError()
                             << "kiln-tensor-parallel: concat at " << locString(op->getLoc())
                             << " along dimension " << d << ", which is split over tp, of "
                             << "parts that are not equal and equally split");
    return setResult(op, Tp{d, int64_t(op->getNumOperands()), first.partial});
  }
  return std::nullopt;
}

LogicalResult Rewriter::rewriteOp(Operation *op) {
  b_.setInsertionPoint(op);
  // Vocabulary parallelism: lookups in, gradients of and the loss over a
  // table split on its rows, and softmax over a split last axis.
  if (auto g = dyn_cast<GatherOp>(op)) {
    Tp t = of(g.getOperand());
    if (t.split() && t.dim == int64_t(g.getAxis()))
      return vocabGather(g);
  }
  if (auto sa = dyn_cast<ScatterAddOp>(op))
    if (auto r = vocabScatter(sa))
      return *r;
  if (auto ce = dyn_cast<CrossEntropyOp>(op)) {
    Tp t = of(ce.getLogits());
    if (t.split() && t.dim == tensorTypeOf(ce.getLogits()).getRank() - 1)
      return vocabCrossEntropy(ce);
  }
  if (auto sm = dyn_cast<SoftmaxOp>(op)) {
    Tp t = of(sm.getOperand());
    if (t.split() && t.dim == int64_t(sm.getAxis()))
      return splitSoftmax(sm);
  }
  auto gather = [&]() {
    SmallVector<std::optional<TensorSharding>, 4> in;
    for (Value v : op->getOperands())
      in.push_back(toSharding(of(v), tensorTypeOf(v).getRank()));
    return in;
  };
  // Every operand is replicated and whole: nothing to do but record it.
  auto untouched = [&] {
    return llvm::all_of(op->getOperands(), [&](Value v) {
      Tp t = of(v);
      return !t.split() && !t.partial;
    });
  };
  if (untouched()) {
    for (Value r : op->getResults())
      tp_[r] = Tp();
    return success();
  }
  // Slices, pads and concatenations of a split dimension: the q/k/v parts.
  if (auto handled = splitDimShapeOp(op))
    return *handled;
  auto in = gather();
  auto res = inferResultShardings(op, in);
  // Reshards the operands `pick` selects with `make`, then asks the table
  // again; true when the op then has only whole operands (nothing to do).
  auto reshardAndRetry = [&](auto pick, auto make) {
    bool changed = false;
    for (OpOperand &o : op->getOpOperands())
      if (pick(of(o.get()))) {
        o.set(make(o.get()));
        changed = true;
      }
    if (!changed)
      return false;
    if (untouched()) {
      for (Value r : op->getResults())
        tp_[r] = Tp();
      return true;
    }
    in = gather();
    res = inferResultShardings(op, in);
    return false;
  };
  // A partial sum the op cannot take: all_reduce it (Megatron's g).
  if (!res && reshardAndRetry([](const Tp &t) { return t.partial; },
                              [&](Value v) { return allReduce(v, op->getLoc(), op); }))
    return success();
  // A split the op cannot take (a column-parallel layer not followed by a
  // row-parallel one, e.g. a layer_norm over its features): the value is
  // all-gathered whole (Megatron's gather_output).
  if (!res && llvm::all_of(op->getOperands(), [&](Value v) { return of(v).outer == 1; }) &&
      reshardAndRetry([](const Tp &t) { return t.split(); }, [&](Value v) {
        return wholeOf(v, op->getLoc(),
                       "'" + op->getName().getStringRef().str() +
                           "' needs the whole of a split value");
      }))
    return success();
  if (!res) {
    std::string operands;
    for (auto [i, v] : llvm::enumerate(op->getOperands()))
      operands += (i ? ", " : "") + describe(of(v));
    return op->emitError() << "kiln-tensor-parallel: cannot shard '" << op->getName() << "' at "
                           << locString(op->getLoc()) << " with operands " << operands
                           << " over tp; no rule covers it (docs/parallel.md lists what tensor "
                              "parallelism splits)";
  }
  SmallVector<Tp, 1> out;
  for (const TensorSharding &s : *res)
    out.push_back(fromSharding(s));

  // Outer factors (the q/k/v split) and per-device attributes.
  auto operandOuter = [&](int64_t dim) -> FailureOr<int64_t> {
    int64_t k = 0;
    for (Value v : op->getOperands()) {
      Tp t = of(v);
      if (t.split() && t.dim == dim) {
        if (k && k != t.outer)
          return op->emitError() << "kiln-tensor-parallel: '" << op->getName() << "' at "
                                 << locString(op->getLoc())
                                 << " combines values split over tp in different layouts";
        k = t.outer;
      }
    }
    return k ? k : 1;
  };
  if (auto mm = dyn_cast<MatmulOp>(op)) {
    Tp l = of(mm.getLhs()), r = of(mm.getRhs());
    int64_t lr = tensorTypeOf(mm.getLhs()).getRank(), rr = tensorTypeOf(mm.getRhs()).getRank();
    int64_t rank = tensorTypeOf(mm.getResult()).getRank();
    int64_t lm = mm.getTransposeLhs() ? lr - 1 : lr - 2, lk = mm.getTransposeLhs() ? lr - 2 : lr - 1;
    int64_t rk = mm.getTransposeRhs() ? rr - 1 : rr - 2, rn = mm.getTransposeRhs() ? rr - 2 : rr - 1;
    if (l.dim == lk && r.dim == rk && l.outer != r.outer)
      return op->emitError() << "kiln-tensor-parallel: matmul at " << locString(op->getLoc())
                             << " contracts values split over tp in different layouts";
    if (out[0].split()) {
      if (out[0].dim == rank - 2)
        out[0].outer = l.dim == lm ? l.outer : 1;
      else if (out[0].dim == rank - 1)
        out[0].outer = r.dim == rn ? r.outer : 1;
      else
        out[0].outer = l.split() && l.dim < lr - 2 ? l.outer : r.outer;
    }
  } else if (auto t = dyn_cast<TransposeOp>(op)) {
    if (out[0].split())
      out[0].outer = of(t.getOperand()).outer;
  } else if (auto bc = dyn_cast<BroadcastInDimOp>(op)) {
    if (out[0].split())
      out[0].outer = of(bc.getOperand()).outer;
  } else if (auto r = dyn_cast<ReshapeOp>(op)) {
    // Parts survive a reshape that keeps the split dimension whole.
    Tp t = of(r.getOperand());
    if (t.split() && out[0].split()) {
      int64_t before = tensorTypeOf(r.getOperand()).getDimSize(t.dim);
      int64_t after = tensorTypeOf(r.getResult()).getDimSize(out[0].dim);
      if (t.outer != 1 && before != after)
        return op->emitError() << "kiln-tensor-parallel: reshape at " << locString(op->getLoc())
                               << " changes a dimension split over tp in parts";
      out[0].outer = t.outer;
    }
  } else if (isa<ReduceSumOp, ReduceMeanOp, ReduceMaxOp>(op)) {
    Tp t = of(op->getOperand(0));
    if (out[0].split())
      out[0].outer = t.outer;
  } else if (auto c = dyn_cast<ConcatOp>(op)) {
    auto k = operandOuter(int64_t(c.getDim()));
    if (failed(k))
      return failure();
    if (out[0].split())
      out[0].outer = *k;
  } else if (out.size() == 1 && out[0].split()) {
    auto k = operandOuter(out[0].dim);
    if (failed(k))
      return failure();
    out[0].outer = *k;
  }

  // Replicated operands of a split elementwise result: their local part
  // (rebuilt at the local shape where they are constants, iotas or
  // broadcasts; otherwise a device-dependent slice).
  if (sameShapeOperands(op) && out[0].split()) {
    for (OpOperand &o : op->getOpOperands()) {
      Tp t = of(o.get());
      if (t.split())
        continue;
      Tp want = out[0];
      want.partial = false;
      auto part = localize(o.get(), want, op);
      if (failed(part))
        return failure();
      o.set(*part);
    }
  }

  // reduce_mean over a split dimension: the local mean over a block is 1/T
  // of the partial sum the table's rule promises.
  if (auto rm = dyn_cast<ReduceMeanOp>(op)) {
    Tp t = of(rm.getOperand());
    if (t.split() && llvm::is_contained(rm.getAxes(), t.dim) && !t.partial) {
      RankedTensorType gt = tensorTypeOf(rm.getResult());
      auto lt = &gt;
      b_.setInsertionPointAfter(op);
      Value scale = b_.create<ConstantOp>(
          op->getLoc(), DenseElementsAttr::get(*lt, b_.getFloatAttr(lt->getElementType(),
                                                                     1.0 / double(n_))));
      auto mul = b_.create<MulOp>(op->getLoc(), rm.getResult(), scale);
      rm.getResult().replaceAllUsesExcept(mul.getResult(), mul.getOperation());
      tp_[rm.getResult()] = out[0];
      tp_[mul.getResult()] = out[0];
      return success();
    }
  }

  if (isa<IotaOp>(op) && out[0].split())
    return op->emitError() << "kiln-tensor-parallel: iota at " << locString(op->getLoc())
                           << " would be split over tp";

  for (auto [r, s] : llvm::zip(op->getResults(), out)) {
    if (failed(localType(tensorTypeOf(r), s, op->getLoc(),
                         "'" + op->getName().getStringRef().str() + "' ")))
      return failure();
    tp_[r] = s;
  }
  // A matmul contracting a split dimension (a row-parallel layer forward, a
  // column-parallel layer's input gradient) is reduced at once, as Megatron
  // does: every later op then reads a whole value, and no partial sum is
  // carried into (and reduced separately by) several consumers. Partial
  // sums of reductions (sums of squares for the gradient norm) stay lazy and
  // are reduced once, where an op first needs them whole.
  if (auto mm = dyn_cast<MatmulOp>(op); mm && out[0].partial) {
    b_.setInsertionPointAfter(op);
    Value whole = allReduce(mm.getResult(), op->getLoc());
    mm.getResult().replaceAllUsesExcept(whole, whole.getDefiningOp());
  }
  return success();
}

LogicalResult Rewriter::retype() {
  Block &body = f_.getBody().front();
  llvm::DenseMap<Value, RankedTensorType> global;
  for (BlockArgument a : body.getArguments())
    global[a] = tensorTypeOf(a);
  for (Operation &op : body)
    for (Value r : op.getResults())
      global[r] = tensorTypeOf(r);
  auto localOf = [&](Value v) { return localType(global[v], of(v), v.getLoc()); };
  for (BlockArgument a : body.getArguments()) {
    auto lt = localOf(a);
    if (failed(lt))
      return failure();
    a.setType(*lt);
  }
  for (Operation &op : body) {
    if (auto s = dyn_cast<SliceOp>(op)) {
      Tp t = of(s.getOperand());
      if (t.split()) {
        int64_t d = t.dim, size = global[s.getOperand()].getDimSize(d), local = size / n_;
        SmallVector<int64_t> st(s.getStart()), li(s.getLimit());
        if (st[d] == 0 && li[d] == size) {
          li[d] = local;
        } else {
          int64_t part = size / t.outer, k = st[d] / part, lp = local / t.outer;
          st[d] = k * lp;
          li[d] = (k + 1) * lp;
        }
        s.setStartAttr(b_.getDenseI64ArrayAttr(st));
        s.setLimitAttr(b_.getDenseI64ArrayAttr(li));
      }
    } else if (auto p = dyn_cast<PadOp>(op)) {
      Tp t = of(p.getOperand());
      if (t.split() && (p.getLow()[t.dim] || p.getHigh()[t.dim])) {
        int64_t d = t.dim, size = global[p.getOperand()].getDimSize(d), local = size / n_;
        SmallVector<int64_t> low(p.getLow()), high(p.getHigh());
        low[d] = low[d] / size * local;
        high[d] = high[d] / size * local;
        p.setLowAttr(b_.getDenseI64ArrayAttr(low));
        p.setHighAttr(b_.getDenseI64ArrayAttr(high));
      }
    } else if (auto c = dyn_cast<ConstantOp>(op)) {
      if (of(c.getResult()).split()) {
        auto lt = localOf(c.getResult());
        if (failed(lt))
          return failure();
        auto splat = cast<SplatElementsAttr>(c.getValue());
        c.setValueAttr(DenseElementsAttr::get(*lt, splat.getSplatValue<Attribute>()));
      }
    }
    for (Value r : op.getResults()) {
      if (!isa<RankedTensorType>(r.getType()))
        continue;
      auto lt = localOf(r);
      if (failed(lt))
        return failure();
      r.setType(*lt);
    }
  }
  return success();
}

LogicalResult Rewriter::rewriteReturn(func::ReturnOp ret) {
  b_.setInsertionPoint(ret);
  for (OpOperand &o : ret->getOpOperands()) {
    unsigned i = o.getOperandNumber();
    Tp want;
    if (auto name = f_.getResultAttrOfType<StringAttr>(i, KilnDialect::kOutputAttr))
      if (auto h = hintFor(name.getValue()))
        want = *h;
    Tp have = of(o.get());
    if (have.partial) {
      o.set(allReduce(o.get(), ret.getLoc()));
      have.partial = false;
    }
    if (have.split() && !want.split() && have.outer == 1) {
      // A split result wanted whole (@predict's vocabulary-split logits):
      // all-gathered along its dimension.
      o.set(wholeOf(o.get(), ret.getLoc()));
      have = Tp();
    }
    if (have != want) {
      auto name = f_.getResultAttrOfType<StringAttr>(i, KilnDialect::kOutputAttr);
      return ret.emitError() << "kiln-tensor-parallel: @" << f_.getSymName() << " result "
                             << (name ? name.getValue().str() : std::to_string(i)) << " is "
                             << describe(have) << " over tp but must be " << describe(want);
    }
  }
  return success();
}

LogicalResult Rewriter::run(int64_t &collectives) {
  Block &body = f_.getBody().front();
  // Arguments: hinted parameters and their state split, the rest replicated.
  for (BlockArgument a : body.getArguments()) {
    unsigned i = a.getArgNumber();
    StringAttr name = f_.getArgAttrOfType<StringAttr>(i, KilnDialect::kParamAttr);
    if (!name)
      name = f_.getArgAttrOfType<StringAttr>(i, KilnDialect::kStateAttr);
    std::optional<Tp> h = name ? hintFor(name.getValue()) : std::nullopt;
    if (h) {
      RankedTensorType global = tensorTypeOf(a);
      if (failed(localType(global, *h, a.getLoc(), "parameter '" + name.getValue().str() + "' ")))
        return failure();
      f_.setArgAttr(i, kShardAttr,
                    b_.getDictionaryAttr(
                        {b_.getNamedAttr("axis", b_.getStringAttr(kAxis)),
                         b_.getNamedAttr("dim", b_.getI64IntegerAttr(h->dim)),
                         b_.getNamedAttr("outer", b_.getI64IntegerAttr(h->outer)),
                         b_.getNamedAttr("shape", b_.getDenseI64ArrayAttr(global.getShape()))}));
      tp_[a] = *h;
    }
  }
  SmallVector<Operation *> ops;
  for (Operation &op : body)
    ops.push_back(&op);
  for (Operation *op : ops) {
    if (auto ret = dyn_cast<func::ReturnOp>(op)) {
      if (failed(rewriteReturn(ret)))
        return failure();
      continue;
    }
    if (failed(rewriteOp(op)))
      return failure();
  }
  // Dropout of a split value (attention's probabilities, split by heads):
  // every device would draw the same mask for its own heads from the same
  // seed, so the seed mixes in the device's tp coordinate, a "tp_rank"
  // input the trainer fills (seed * T + coordinate: distinct per device and
  // step). Forward and backward share the mixed seed, so backward still
  // regenerates the forward's mask.
  // Fused attention with dropout draws its mask the same way: its seed
  // operand is mixed alike (forward and gradient: the same mixed seed).
  SmallVector<OpOperand *> splitDropouts;
  body.walk([&](Operation *op) {
    if (auto d = dyn_cast<DropoutOp>(op)) {
      if (of(d.getOperand()).split())
        splitDropouts.push_back(&d.getSeedMutable());
    } else if (auto a = dyn_cast<AttentionOp>(op)) {
      if (a.getSeed() && of(a.getQuery()).split())
        splitDropouts.push_back(&a.getSeedMutable()[0]);
    } else if (auto g = dyn_cast<AttentionGradOp>(op)) {
      if (g.getSeed() && of(g.getQuery()).split())
        splitDropouts.push_back(&g.getSeedMutable()[0]);
    }
  });
  if (!splitDropouts.empty()) {
    auto i64 = RankedTensorType::get({}, b_.getI64Type());
    Value coord = tpRank();
    llvm::DenseMap<Value, Value> mixed;
    for (OpOperand *use : splitDropouts) {
      Value seed = use->get();
      Value &m = mixed[seed];
      if (!m) {
        if (auto def = seed.getDefiningOp())
          b_.setInsertionPointAfter(def);
        else
          b_.setInsertionPointToStart(&body);
        Location l = NameLoc::get(b_.getStringAttr("tp.dropout_seed"), use->getOwner()->getLoc());
        Value t = b_.create<ConstantOp>(l, DenseElementsAttr::get(i64, b_.getI64IntegerAttr(n_)));
        m = b_.create<AddOp>(l, b_.create<MulOp>(l, seed, t), coord);
      }
      use->set(m);
    }
  }

  // Results: kiln.shard where split; then every value its per-device type.
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
    Tp t = of(v);
    if (!t.split())
      continue;
    SmallVector<int64_t> shape(tensorTypeOf(v).getShape());
    f_.setResultAttr(unsigned(i), kShardAttr,
                     b_.getDictionaryAttr(
                         {b_.getNamedAttr("axis", b_.getStringAttr(kAxis)),
                          b_.getNamedAttr("dim", b_.getI64IntegerAttr(t.dim)),
                          b_.getNamedAttr("outer", b_.getI64IntegerAttr(t.outer)),
                          b_.getNamedAttr("shape", b_.getDenseI64ArrayAttr(shape))}));
  }
  if (failed(retype()))
    return failure();
  SmallVector<Type> argTypes(body.getArgumentTypes()), resultTypes(ret.getOperandTypes());
  f_.setType(FunctionType::get(f_.getContext(), argTypes, resultTypes));
  collectives += collectives_;
  return success();
}
} // namespace tp

namespace {
using tp::Rewriter;
using tp::kAxis;
using tp::kHintAttr;
using tp::Tp;


struct KilnTensorParallelPass : impl::KilnTensorParallelPassBase<KilnTensorParallelPass> {
  using KilnTensorParallelPassBase::KilnTensorParallelPassBase;
  void runOnOperation() override {
    ModuleOp m = getOperation();
    int64_t n = getMesh(m).axisSize(kAxis);
    if (n <= 1)
      return;
    auto fwd = m.lookupSymbol<func::FuncOp>("forward");
    if (!fwd)
      return;
    // The hints, by parameter name, from @forward's arguments.
    llvm::StringMap<Tp> hints;
    for (unsigned i = 0; i < fwd.getNumArguments(); ++i) {
      auto name = fwd.getArgAttrOfType<StringAttr>(i, KilnDialect::kParamAttr);
      auto h = fwd.getArgAttrOfType<DictionaryAttr>(i, kHintAttr);
      if (!name || !h)
        continue;
      Tp t;
      t.dim = h.getAs<IntegerAttr>("dim").getInt();
      t.outer = h.getAs<IntegerAttr>("outer").getInt();
      // An embedding whose rows tp does not divide stays whole (Megatron
      // pads the vocabulary instead; kilnc's summary says so).
      if (!tpSplits(fwd.getArgAttrDict(i), fwd.getArgument(i).getType(), n))
        continue;
      hints[name.getValue()] = t;
    }
    if (hints.empty()) {
      m.emitError() << "kiln-tensor-parallel: tp = " << n
                    << " but no parameter is marked for tensor parallelism; use mlp() and "
                       "attention(), or linear(..., parallel = \"column\") followed by "
                       "linear(..., parallel = \"row\")";
      return signalPassFailure();
    }
    int64_t collectives = 0;
    for (StringRef name : {"train_step", "grad", "eval_step", "predict"}) {
      auto f = m.lookupSymbol<func::FuncOp>(name);
      if (!f)
        continue;
      Rewriter r(f, n, hints);
      int64_t c = 0;
      if (failed(r.run(c)))
        return signalPassFailure();
      if (name == "train_step")
        collectives = c;
    }
    numCollectives = collectives;
  }
};

} // namespace
} // namespace kiln

