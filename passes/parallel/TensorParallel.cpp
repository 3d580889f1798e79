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

namespace kiln {
#define GEN_PASS_DEF_KILNTENSORPARALLELPASS
#include "passes/Passes.h.inc"

namespace {

constexpr StringLiteral kAxis = "tp";
constexpr StringLiteral kHintAttr = "kiln.tp";

/// A value's sharding over tp: the split dimension (-1: none), the number of
/// outer parts of that dimension each split alike, and whether the value is
/// a partial sum over tp.
struct Tp {
  int64_t dim = -1;
  int64_t outer = 1;
  bool partial = false;
  bool split() const { return dim >= 0; }
  bool operator==(const Tp &o) const {
    return dim == o.dim && partial == o.partial && (dim < 0 || outer == o.outer);
  }
  bool operator!=(const Tp &o) const { return !(*this == o); }
};

RankedTensorType tensorTypeOf(Value v) { return cast<RankedTensorType>(v.getType()); }

TensorSharding toSharding(const Tp &t, int64_t rank) {
  TensorSharding s = TensorSharding::replicated(rank);
  if (t.split())
    s.split[size_t(t.dim)].push_back(kAxis.str());
  if (t.partial)
    s.partial.push_back(kAxis.str());
  return s;
}

/// The tp part of a table sharding (outer factors are the pass's own).
Tp fromSharding(const TensorSharding &s) {
  Tp t;
  for (auto [d, axes] : llvm::enumerate(s.split))
    if (llvm::is_contained(axes, kAxis.str()))
      t.dim = int64_t(d);
  t.partial = s.isPartial(kAxis);
  return t;
}

std::string describe(const Tp &t) {
  if (!t.split() && !t.partial)
    return "replicated";
  std::string s;
  if (t.split())
    s = "split on dim " + std::to_string(t.dim) +
        (t.outer > 1 ? " (in " + std::to_string(t.outer) + " parts)" : "");
  if (t.partial)
    s += std::string(s.empty() ? "" : ", ") + "a partial sum";
  return s;
}

/// Ops whose operands must all have the result's shape (replicated operands
/// of a split result are cut to their local part).
bool sameShapeOperands(Operation *op) {
  return isa<AddOp, SubOp, MulOp, DivOp, PowOp, MaxOp, MinOp, CompareOp, SelectOp>(op);
}

class Rewriter {
public:
  Rewriter(func::FuncOp f, int64_t n, const llvm::StringMap<Tp> &hints)
      : f_(f), n_(n), hints_(hints), b_(f.getContext()) {}

  LogicalResult run(int64_t &collectives);

private:
  func::FuncOp f_;
  int64_t n_;
  const llvm::StringMap<Tp> &hints_;
  OpBuilder b_;
  llvm::DenseMap<Value, Tp> tp_;
  /// Each partial sum's all_reduce, made once, before its first reader.
  llvm::DenseMap<Value, Value> reduced_;
  /// The "tp_rank" input (the device's coordinate on tp), added on demand.
  Value tpRank_;
  /// Per index tensor of a vocabulary-parallel lookup: the indices relative
  /// to this device's rows (clamped to 0 outside) and whether in range.
  llvm::DenseMap<Value, std::pair<Value, Value>> localIndices_;

  Value tpRank() {
    if (tpRank_)
      return tpRank_;
    auto i64 = RankedTensorType::get({}, b_.getI64Type());
    unsigned idx = f_.getNumArguments();
    f_.insertArgument(idx, i64,
                      b_.getDictionaryAttr({b_.getNamedAttr(KilnDialect::kInputAttr,
                                                            b_.getStringAttr("tp_rank"))}),
                      f_.getLoc());
    tpRank_ = f_.getArgument(idx);
    return tpRank_;
  }

  /// A splat constant of `type`.
  Value splat(Location l, RankedTensorType type, double v) {
    Attribute a = isa<FloatType>(type.getElementType())
                      ? Attribute(b_.getFloatAttr(type.getElementType(), v))
                      : Attribute(b_.getIntegerAttr(type.getElementType(), int64_t(v)));
    return b_.create<ConstantOp>(l, DenseElementsAttr::get(type, a));
  }
  /// Scalar `s` broadcast to `type`.
  Value bcast(Location l, Value s, RankedTensorType type) {
    return b_.create<BroadcastInDimOp>(l, type, s, b_.getDenseI64ArrayAttr({}));
  }
  /// This device's first index along a dimension of `size` split over tp:
  /// tp_rank * size / T, as a scalar of element type `e`.
  Value offsetOf(Location l, int64_t size, Type e) {
    auto i64 = RankedTensorType::get({}, b_.getI64Type());
    Value off = b_.create<MulOp>(l, tpRank(), splat(l, i64, double(size / n_)));
    auto t = RankedTensorType::get({}, e);
    return t == i64 ? off : b_.create<CastOp>(l, t, off).getResult();
  }
  /// Reduces `v` (this device's part, not a sum) over tp with `r`.
  Value allReduceWith(Location l, Value v, CollectiveReduction r, const char *why) {
    ++collectives_;
    auto ar = b_.create<AllReduceOp>(NameLoc::get(b_.getStringAttr(std::string("tp: ") + why), l),
                                     v, kAxis, r);
    tp_[ar.getResult()] = Tp();
    return ar.getResult();
  }

  LogicalResult vocabGather(GatherOp g);
  std::optional<LogicalResult> vocabScatter(ScatterAddOp s);
  LogicalResult vocabCrossEntropy(CrossEntropyOp ce);
  LogicalResult splitSoftmax(SoftmaxOp sm);
  std::pair<Value, Value> localIndices(Value idx, int64_t size, Location l);
  Value wholeOf(Value v, Location l, const std::string &why = "a result wanted whole is split");
  int64_t collectives_ = 0;

  Tp of(Value v) const {
    auto it = tp_.find(v);
    return it == tp_.end() ? Tp() : it->second;
  }

  /// The hint of a parameter, state ("m:w") or output named `name`.
  std::optional<Tp> hintFor(StringRef name) const {
    auto it = hints_.find(name);
    if (it == hints_.end()) {
      size_t colon = name.find(':');
      if (colon == StringRef::npos)
        return std::nullopt;
      it = hints_.find(name.substr(colon + 1));
      if (it == hints_.end())
        return std::nullopt;
    }
    return it->second;
  }

  /// The per-device type of a value of global type `t` sharded as `s`.
  FailureOr<RankedTensorType> localType(RankedTensorType t, const Tp &s, Location l,
                                        const std::string &what = "a value ") {
    if (!s.split())
      return t;
    SmallVector<int64_t> shape(t.getShape());
    int64_t size = shape[size_t(s.dim)];
    if (size % (n_ * s.outer) != 0)
      return emitError(l) << "kiln-tensor-parallel: " << what << "at " << locString(l)
                          << " splits dimension " << s.dim << " of size " << size
                          << " over tp = " << n_
                          << (s.outer > 1 ? " in each of its " + std::to_string(s.outer) +
                                                " parts (q, k, v)"
                                          : std::string())
                          << ", so its size must be divisible by " << n_ * s.outer
                          << "; choose a tp that divides it (attention() splits its heads "
                             "over tp, mlp() its hidden width: tp must divide both)";
    shape[size_t(s.dim)] = size / n_;
    return RankedTensorType::get(shape, t.getElementType());
  }

  /// The parameter behind `v` through shape-only ops (reshape, transpose,
  /// cast, broadcast), if any: its name and hint.
  std::optional<std::pair<std::string, Tp>> paramBehind(Value v) {
    for (int depth = 0; depth < 4 && v; ++depth) {
      if (auto a = dyn_cast<BlockArgument>(v)) {
        if (auto name = f_.getArgAttrOfType<StringAttr>(a.getArgNumber(),
                                                        KilnDialect::kParamAttr))
          if (auto h = hintFor(name.getValue()))
            return std::make_pair(name.getValue().str(), *h);
        return std::nullopt;
      }
      Operation *def = v.getDefiningOp();
      if (!isa<ReshapeOp, TransposeOp, CastOp, BroadcastInDimOp>(def))
        return std::nullopt;
      v = def->getOperand(0);
    }
    return std::nullopt;
  }

  /// Why `user` needs the all-reduce of partial sum `v`, for the location
  /// name kilnc's summary prints ("tp: ...").
  std::string why(Value v, Operation *user) {
    if (auto mm = v.getDefiningOp<MatmulOp>()) {
      for (Value o : {mm.getLhs(), mm.getRhs()})
        if (auto p = paramBehind(o)) {
          std::string layer = StringRef(p->first).rsplit('.').first.str();
          if (p->second.dim == 1)
            return "the output of row-parallel " + layer +
                   " (weight split on its input features) is a partial sum";
          return "the input gradient of column-parallel " + layer +
                 " (weight split on its output features) is a partial sum";
        }
      return "a matmul contracting a dimension split over tp gives partial sums";
    }
    if (tensorTypeOf(v).getRank() == 0 && user && isa<AddOp>(user))
      return "the gradient norm: the split gradients' sums of squares are partial sums";
    return std::string("'") + (user ? user->getName().getStringRef().str() : "return") +
           "' needs the whole of a partial sum";
  }

  Value allReduce(Value v, Location l, Operation *user = nullptr) {
    if (Value done = reduced_.lookup(v))
      return done;
    ++collectives_;
    auto ar = b_.create<AllReduceOp>(NameLoc::get(b_.getStringAttr("tp: " + why(v, user)), l),
                                     v, kAxis, CollectiveReduction::sum);
    Tp t = of(v);
    t.partial = false;
    tp_[ar.getResult()] = t;
    reduced_[v] = ar.getResult();
    return ar.getResult();
  }

  /// A replicated value's per-device part for sharding `want` (split, not
  /// partial), without communication: splat constants and broadcasts are
  /// rebuilt at the local shape. Other values would need a device-dependent
  /// slice; none of the supported layers makes one.
  FailureOr<Value> localize(Value v, const Tp &want, Operation *user) {
    RankedTensorType t = tensorTypeOf(v);
    if (failed(localType(t, want, user->getLoc())))
      return failure();
    Operation *def = v.getDefiningOp();
    Location l = def ? def->getLoc() : user->getLoc();
    if (auto c = dyn_cast_or_null<ConstantOp>(def)) {
      if (isa<SplatElementsAttr>(c.getValue())) {
        // A copy the retyping gives the local shape.
        Value nc = b_.create<ConstantOp>(c.getLoc(), c.getValue());
        tp_[nc] = want;
        return nc;
      }
    }
    if (auto io = dyn_cast_or_null<IotaOp>(def)) {
      // Along the split dimension: the local iota plus this device's first
      // index; along another dimension: the same values.
      Value ni = b_.create<IotaOp>(l, t, io.getDimAttr());
      tp_[ni] = want;
      if (int64_t(io.getDim()) != want.dim)
        return ni;
      if (want.outer != 1)
        return failure();
      Value off = bcast(l, offsetOf(l, t.getDimSize(want.dim), t.getElementType()), t);
      tp_[off] = want;
      Value sum = b_.create<AddOp>(l, ni, off);
      tp_[sum] = want;
      return sum;
    }
    if (auto bc = dyn_cast_or_null<BroadcastInDimOp>(def)) {
      // Operand dimension i lands on result dimension dims[i]: a broadcast
      // along the split dimension keeps the operand whole; one that carries
      // it needs the operand's own part.
      Value operand = bc.getOperand();
      Tp inner;
      for (auto [i, d] : llvm::enumerate(bc.getDims()))
        if (d == want.dim && tensorTypeOf(operand).getDimSize(int64_t(i)) != 1)
          inner = Tp{int64_t(i), want.outer, false};
      if (inner.split()) {
        auto part = localize(operand, inner, user);
        if (failed(part))
          return failure();
        operand = *part;
      }
      auto nb = b_.create<BroadcastInDimOp>(bc.getLoc(), t, operand, bc.getDimsAttr());
      tp_[nb.getResult()] = want;
      return nb.getResult();
    }
    if (def && sameShapeOperands(def) && def->getNumResults() == 1) {
      // An elementwise op of localizable operands (a one-hot mask).
      IRMapping map;
      for (Value o : def->getOperands()) {
        auto part = localize(o, want, user);
        if (failed(part))
          return failure();
        map.map(o, *part);
      }
      Operation *cl = b_.clone(*def, map);
      tp_[cl->getResult(0)] = want;
      return cl->getResult(0);
    }
    // Any other whole value: this device's part by a device-dependent
    // slice (the adjoint of an all-gather), no communication: view the
    // dimension as [outer, T, S / (outer T)], take row tp_rank of the T
    // axis with a gather, and reshape to the per-device shape.
    if (want.split() && !want.partial) {
      int64_t d = want.dim, size = t.getDimSize(d), k = want.outer;
      SmallVector<int64_t> view(t.getShape().begin(), t.getShape().begin() + d);
      SmallVector<int64_t> picked = view;
      view.append({k, n_, size / (k * n_)});
      picked.append({k, 1, size / (k * n_)});
      for (int64_t i = d + 1; i < t.getRank(); ++i) {
        view.push_back(t.getDimSize(i));
        picked.push_back(t.getDimSize(i));
      }
      Location ll = NameLoc::get(b_.getStringAttr("tp.local_part"), l);
      Value viewed = b_.create<ReshapeOp>(ll, RankedTensorType::get(view, t.getElementType()), v);
      auto i1 = RankedTensorType::get({1}, b_.getI64Type());
      Value idx = b_.create<ReshapeOp>(ll, i1, tpRank());
      Value row = b_.create<GatherOp>(ll, RankedTensorType::get(picked, t.getElementType()),
                                      viewed, idx, b_.getI64IntegerAttr(d + 1));
      Value part = b_.create<ReshapeOp>(ll, t, row); // retyped to the local shape
      tp_[part] = want;
      return part;
    }
    return emitError(user->getLoc())
           << "kiln-tensor-parallel: '" << user->getName() << "' at "
           << locString(user->getLoc()) << " combines a value split over tp ("
           << describe(want) << ") with a replicated value that only a device-dependent "
           << "slice could cut; this layer cannot be split by tensor parallelism "
              "(leave it unsplit: no parallel = on its linear layers)";
  }

  LogicalResult rewriteOp(Operation *op);
  std::optional<LogicalResult> splitDimShapeOp(Operation *op);
  LogicalResult setResult(Operation *op, const Tp &t) {
    if (failed(localType(tensorTypeOf(op->getResult(0)), t, op->getLoc())))
      return failure();
    tp_[op->getResult(0)] = t;
    return success();
  }
  /// Phase 2: every value its per-device type, slices, pads and constants
  /// their per-device attributes.
  LogicalResult retype();
  LogicalResult rewriteReturn(func::ReturnOp ret);
};


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

std::pair<Value, Value> Rewriter::localIndices(Value idx, int64_t size, Location l) {
  auto it = localIndices_.find(idx);
  if (it != localIndices_.end())
    return it->second;
  RankedTensorType t = tensorTypeOf(idx);
  int64_t local = size / n_;
  Value rel = b_.create<SubOp>(l, idx, bcast(l, offsetOf(l, size, t.getElementType()), t));
  Value zero = splat(l, t, 0), limit = splat(l, t, double(local));
  Value ge = b_.create<CompareOp>(l, CompareDirection::ge, rel, zero);
  Value lt = b_.create<CompareOp>(l, CompareDirection::lt, rel, limit);
  auto b1 = RankedTensorType::get(t.getShape(), b_.getI1Type());
  Value in = b_.create<SelectOp>(l, ge, lt, splat(l, b1, 0));
  Value clamped = b_.create<SelectOp>(l, in, rel, zero);
  localIndices_[idx] = {clamped, in};
  return {clamped, in};
}

/// gather of rows of a table split on its rows: each device looks up the
/// indices in its own rows (others clamped to row 0 and zeroed), so the
/// result is a partial sum over tp (Megatron's vocabulary-parallel
/// embedding; the all-reduce comes where a whole value is first needed).
LogicalResult Rewriter::vocabGather(GatherOp g) {
  Location l = g.getLoc();
  if (g.getAxis() != 0 || of(g.getIndices()).split() || of(g.getIndices()).partial)
    return g.emitError() << "kiln-tensor-parallel: gather at " << locString(l)
                         << " of a table split over tp on another axis than its rows";
  int64_t rows = tensorTypeOf(g.getOperand()).getDimSize(0);
  auto [clamped, in] = localIndices(g.getIndices(), rows, l);
  g.getIndicesMutable().assign(clamped);
  RankedTensorType rt = tensorTypeOf(g.getResult());
  b_.setInsertionPointAfter(g);
  auto mt = RankedTensorType::get(rt.getShape(), b_.getI1Type());
  SmallVector<int64_t> dims;
  for (int64_t i = 0; i < tensorTypeOf(in).getRank(); ++i)
    dims.push_back(i);
  Value mask = b_.create<BroadcastInDimOp>(l, mt, in, b_.getDenseI64ArrayAttr(dims));
  auto sel = b_.create<SelectOp>(l, mask, g.getResult(), splat(l, rt, 0));
  g.getResult().replaceAllUsesExcept(sel.getResult(), sel.getOperation());
  tp_[g.getResult()] = Tp();
  tp_[sel.getResult()] = Tp{-1, 1, true};
  return success();
}

/// scatter_add into a table split on its rows (the embedding's gradient):
/// each device adds the updates of its own rows, locally.
std::optional<LogicalResult> Rewriter::vocabScatter(ScatterAddOp sa) {
  if (sa.getAxis() != 0 || of(sa.getUpdates()).split() || of(sa.getIndices()).split())
    return std::nullopt;
  // The gradient of a lookup in a vocabulary-split table: the same indices
  // gathered from a split table of this type.
  RankedTensorType rt = tensorTypeOf(sa.getResult());
  bool vocab = false;
  for (auto &[idx, loc] : localIndices_)
    (void)loc, vocab |= idx == sa.getIndices();
  if (!vocab)
    return std::nullopt;
  Tp table;
  for (BlockArgument a : f_.getArguments())
    if (of(a).split() && of(a).dim == 0 && tensorTypeOf(a).getShape() == rt.getShape())
      table = of(a);
  if (!table.split())
    return std::nullopt;
  Location l = sa.getLoc();
  if (of(sa.getUpdates()).partial)
    sa.getUpdatesMutable().assign(allReduce(sa.getUpdates(), l, sa));
  auto [clamped, in] = localIndices(sa.getIndices(), rt.getDimSize(0), l);
  RankedTensorType ut = tensorTypeOf(sa.getUpdates());
  auto mt = RankedTensorType::get(ut.getShape(), b_.getI1Type());
  SmallVector<int64_t> dims;
  for (int64_t i = 0; i < tensorTypeOf(in).getRank(); ++i)
    dims.push_back(i);
  Value mask = b_.create<BroadcastInDimOp>(l, mt, in, b_.getDenseI64ArrayAttr(dims));
  Value upd = b_.create<SelectOp>(l, mask, sa.getUpdates(), splat(l, ut, 0));
  sa.getUpdatesMutable().assign(upd);
  sa.getIndicesMutable().assign(clamped);
  tp_[sa.getResult()] = Tp{0, 1, false};
  if (failed(localType(rt, tp_[sa.getResult()], l)))
    return LogicalResult(failure());
  return LogicalResult(success());
}

/// softmax over a split last axis: the row maximum and the sum of
/// exponentials all-reduced over tp (max, then sum).
LogicalResult Rewriter::splitSoftmax(SoftmaxOp sm) {
  Location l = sm.getLoc();
  Value x = sm.getOperand();
  if (of(x).partial || of(x).outer != 1)
    return sm.emitError() << "kiln-tensor-parallel: softmax at " << locString(l)
                          << " of a partial or q/k/v-split value";
  RankedTensorType t = tensorTypeOf(x);
  int64_t a = int64_t(sm.getAxis());
  SmallVector<int64_t> rowShape(t.getShape()), dims;
  rowShape[size_t(a)] = 1;
  for (int64_t i = 0; i < t.getRank(); ++i)
    dims.push_back(i);
  auto rowT = RankedTensorType::get(rowShape, t.getElementType());
  auto axes = b_.getDenseI64ArrayAttr({a});
  Value mLocal = b_.create<ReduceMaxOp>(l, rowT, x, axes, b_.getUnitAttr());
  Value m = allReduceWith(l, mLocal, CollectiveReduction::max,
                          "softmax over the vocabulary split: the row maximum");
  Value e = b_.create<ExpOp>(l, b_.create<SubOp>(l, x, b_.create<BroadcastInDimOp>(
                                                         l, t, m, b_.getDenseI64ArrayAttr(dims))));
  Value sLocal = b_.create<ReduceSumOp>(l, rowT, e, axes, b_.getUnitAttr());
  Value s = allReduceWith(l, sLocal, CollectiveReduction::sum,
                          "softmax over the vocabulary split: the sum of exponentials");
  Value p = b_.create<DivOp>(l, e, b_.create<BroadcastInDimOp>(l, t, s,
                                                               b_.getDenseI64ArrayAttr(dims)));
  for (Value v : {e, p})
    tp_[v] = of(x);
  tp_[e.getDefiningOp()->getOperand(0)] = of(x);
  tp_[e.getDefiningOp()->getOperand(0).getDefiningOp()->getOperand(1)] = of(x);
  tp_[p.getDefiningOp()->getOperand(1)] = of(x);
  sm.getResult().replaceAllUsesWith(p);
  sm.erase();
  return success();
}

/// cross_entropy of logits split on the vocabulary (Megatron's
/// vocabulary-parallel cross-entropy): logsumexp from an all-reduced row
/// maximum and sum of exponentials, the target's logit from the device that
/// holds it (a partial sum), then the reduction.
LogicalResult Rewriter::vocabCrossEntropy(CrossEntropyOp ce) {
  Location l = ce.getLoc();
  Value x = ce.getLogits(), y = ce.getTargets();
  if (of(x).partial || of(x).outer != 1 || of(y).split() || of(y).partial)
    return ce.emitError() << "kiln-tensor-parallel: cross_entropy at " << locString(l)
                          << " of partial logits or split targets";
  RankedTensorType t = tensorTypeOf(x), yt = tensorTypeOf(y);
  int64_t a = t.getRank() - 1, classes = t.getDimSize(a);
  SmallVector<int64_t> rowShape(t.getShape()), dims, ydims;
  rowShape[size_t(a)] = 1;
  for (int64_t i = 0; i < t.getRank(); ++i)
    dims.push_back(i);
  for (int64_t i = 0; i < yt.getRank(); ++i)
    ydims.push_back(i);
  auto rowT = RankedTensorType::get(rowShape, t.getElementType());
  auto axes = b_.getDenseI64ArrayAttr({a});
  auto bc = [&](Value v, RankedTensorType to, ArrayRef<int64_t> d) {
    return b_.create<BroadcastInDimOp>(l, to, v, b_.getDenseI64ArrayAttr(d)).getResult();
  };
  Tp split = of(x);
  Value m = allReduceWith(l, b_.create<ReduceMaxOp>(l, rowT, x, axes, b_.getUnitAttr()),
                          CollectiveReduction::max,
                          "cross-entropy over the vocabulary split: the row maximum");
  Value shifted = b_.create<SubOp>(l, x, bc(m, t, dims));
  Value e = b_.create<ExpOp>(l, shifted);
  tp_[shifted] = split;
  tp_[shifted.getDefiningOp()->getOperand(1)] = split;
  tp_[e] = split;
  Value s = allReduceWith(l, b_.create<ReduceSumOp>(l, rowT, e, axes, b_.getUnitAttr()),
                          CollectiveReduction::sum,
                          "cross-entropy over the vocabulary split: the sum of exponentials");
  Value lse = b_.create<AddOp>(l, b_.create<LogOp>(l, s), m);
  // The target's logit: this device's classes are [rank * C/T, (rank+1) * C/T).
  auto it = RankedTensorType::get(t.getShape(), yt.getElementType());
  Value iota = b_.create<IotaOp>(l, it, b_.getI64IntegerAttr(a));
  Value cls = b_.create<AddOp>(l, iota, bcast(l, offsetOf(l, classes, yt.getElementType()), it));
  Value eq = b_.create<CompareOp>(l, CompareDirection::eq, cls, bc(y, it, ydims));
  Value picked = b_.create<SelectOp>(l, eq, x, splat(l, t, 0));
  for (Value v : {iota, cls, eq, picked})
    tp_[v] = split;
  tp_[cls.getDefiningOp()->getOperand(1)] = split;
  tp_[eq.getDefiningOp()->getOperand(1)] = split;
  tp_[picked.getDefiningOp()->getOperand(2)] = split;
  Value tgt = allReduceWith(l, b_.create<ReduceSumOp>(l, rowT, picked, axes, b_.getUnitAttr()),
                            CollectiveReduction::sum,
                            "cross-entropy over the vocabulary split: the target's logit");
  Value per = b_.create<SubOp>(l, lse, tgt); // [..., 1]
  auto perT = RankedTensorType::get(yt.getShape(), t.getElementType());
  Value perRow = b_.create<ReshapeOp>(l, perT, per);
  Value out;
  auto all = b_.getDenseI64ArrayAttr(ydims);
  auto scalar = RankedTensorType::get({}, t.getElementType());
  switch (ce.getReduction()) {
  case LossReduction::mean:
    out = b_.create<ReduceMeanOp>(l, scalar, perRow, all, UnitAttr());
    break;
  case LossReduction::sum:
    out = b_.create<ReduceSumOp>(l, scalar, perRow, all, UnitAttr());
    break;
  case LossReduction::none:
    out = perRow;
    break;
  }
  ce.getResult().replaceAllUsesWith(out);
  ce.erase();
  return success();
}

/// A value split over tp made whole: all-gathered along its split
/// dimension (moved first and back, the plan gathering dimension 0).
Value Rewriter::wholeOf(Value v, Location l, const std::string &why) {
  Tp t = of(v);
  RankedTensorType type = tensorTypeOf(v);
  SmallVector<int64_t> perm, inv(size_t(type.getRank())), shape;
  perm.push_back(t.dim);
  for (int64_t i = 0; i < type.getRank(); ++i)
    if (i != t.dim)
      perm.push_back(i);
  for (auto [i, p] : llvm::enumerate(perm)) {
    inv[size_t(p)] = int64_t(i);
    shape.push_back(type.getDimSize(p));
  }
  auto moved = RankedTensorType::get(shape, type.getElementType());
  Value front = b_.create<TransposeOp>(l, moved, v, b_.getDenseI64ArrayAttr(perm));
  tp_[front] = Tp{0, 1, false};
  ++collectives_;
  Value whole = b_.create<AllGatherOp>(
      NameLoc::get(b_.getStringAttr("tp: " + why), l), moved, front,
      b_.getStringAttr(kAxis), b_.getI64IntegerAttr(0));
  tp_[whole] = Tp();
  Value back = b_.create<TransposeOp>(l, type, whole, b_.getDenseI64ArrayAttr(inv));
  tp_[back] = Tp();
  return back;
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
  SmallVector<DropoutOp> splitDropouts;
  body.walk([&](DropoutOp d) {
    if (of(d.getOperand()).split())
      splitDropouts.push_back(d);
  });
  if (!splitDropouts.empty()) {
    auto i64 = RankedTensorType::get({}, b_.getI64Type());
    Value coord = tpRank();
    llvm::DenseMap<Value, Value> mixed;
    for (DropoutOp d : splitDropouts) {
      Value seed = d.getSeed();
      Value &m = mixed[seed];
      if (!m) {
        if (auto def = seed.getDefiningOp())
          b_.setInsertionPointAfter(def);
        else
          b_.setInsertionPointToStart(&body);
        Location l = NameLoc::get(b_.getStringAttr("tp.dropout_seed"), d.getLoc());
        Value t = b_.create<ConstantOp>(l, DenseElementsAttr::get(i64, b_.getI64IntegerAttr(n_)));
        m = b_.create<AddOp>(l, b_.create<MulOp>(l, seed, t), coord);
      }
      d.getSeedMutable().assign(m);
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
