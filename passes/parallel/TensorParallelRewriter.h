//===- TensorParallelRewriter.h - kiln-tensor-parallel's rewriter -*- C++ -*-===//
//
// Private to passes/parallel/TensorParallel*.cpp: a value's tensor-parallel
// layout (Tp) and the Rewriter that gives every op of @train_step its
// per-device form. TensorParallel.cpp holds the walk and the generic rule
// (the ops' ShardingOpInterface answers, resharding where none fits);
// TensorParallelVocab.cpp the vocabulary-parallel rewrites (an embedding
// table split on its rows, cross_entropy and softmax over a split last axis).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_PASSES_PARALLEL_TENSORPARALLELREWRITER_H
#define KILN_PASSES_PARALLEL_TENSORPARALLELREWRITER_H

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

namespace kiln::tp {

using namespace mlir;


inline constexpr StringLiteral kAxis = "tp";
inline constexpr StringLiteral kHintAttr = "kiln.tp";

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

inline RankedTensorType tensorTypeOf(Value v) { return cast<RankedTensorType>(v.getType()); }

inline TensorSharding toSharding(const Tp &t, int64_t rank) {
  TensorSharding s = TensorSharding::replicated(rank);
  if (t.split())
    s.split[size_t(t.dim)].push_back(kAxis.str());
  if (t.partial)
    s.partial.push_back(kAxis.str());
  return s;
}

/// The tp part of a table sharding (outer factors are the pass's own).
inline Tp fromSharding(const TensorSharding &s) {
  Tp t;
  for (auto [d, axes] : llvm::enumerate(s.split))
    if (llvm::is_contained(axes, kAxis.str()))
      t.dim = int64_t(d);
  t.partial = s.isPartial(kAxis);
  return t;
}

inline std::string describe(const Tp &t) {
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
inline bool sameShapeOperands(Operation *op) {
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

} // namespace kiln::tp

#endif // KILN_PASSES_PARALLEL_TENSORPARALLELREWRITER_H
