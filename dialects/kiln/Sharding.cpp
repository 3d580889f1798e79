//===- Sharding.cpp - Sharding attributes and the per-op rule table -------===//
#include "dialects/kiln/Sharding.h"

#include "dialects/kiln/KilnOps.h"

#include "mlir/IR/BuiltinAttributes.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"

#include <algorithm>
#include <functional>

using namespace mlir;

namespace kiln {

TensorSharding TensorSharding::replicated(int64_t rank) {
  TensorSharding s;
  s.split.resize(rank);
  return s;
}

TensorSharding TensorSharding::splitOn(int64_t rank, int64_t dim, StringRef axis) {
  TensorSharding s = replicated(rank);
  s.split[dim].push_back(axis.str());
  return s;
}

bool TensorSharding::isReplicated() const {
  return partial.empty() && llvm::all_of(split, [](const auto &d) { return d.empty(); });
}

bool TensorSharding::isPartial(StringRef axis) const {
  return llvm::is_contained(partial, axis.str());
}

bool TensorSharding::isSplitOver(StringRef axis) const {
  return llvm::any_of(split, [&](const auto &d) { return llvm::is_contained(d, axis.str()); });
}

DictionaryAttr shardingToAttr(MLIRContext *ctx, const TensorSharding &s) {
  auto strs = [&](ArrayRef<std::string> v) {
    SmallVector<Attribute> a;
    for (const std::string &x : v)
      a.push_back(StringAttr::get(ctx, x));
    return ArrayAttr::get(ctx, a);
  };
  SmallVector<Attribute> dims;
  for (const auto &d : s.split)
    dims.push_back(strs(d));
  return DictionaryAttr::get(
      ctx, {NamedAttribute(StringAttr::get(ctx, "partial"), strs(s.partial)),
            NamedAttribute(StringAttr::get(ctx, "split"), ArrayAttr::get(ctx, dims))});
}

std::optional<TensorSharding>
shardingFromAttr(Attribute attr, function_ref<InFlightDiagnostic()> emitError) {
  auto dict = dyn_cast_or_null<DictionaryAttr>(attr);
  auto bad = [&](const Twine &why) -> std::optional<TensorSharding> {
    emitError() << "kiln.sharding: " << why
                << " (expected {split = [[\"dp\"], []], partial = []})";
    return std::nullopt;
  };
  if (!dict)
    return bad("not a dictionary");
  for (NamedAttribute e : dict)
    if (e.getName() != "split" && e.getName() != "partial")
      return bad("unknown key '" + e.getName().getValue() + "'");
  auto strings = [&](Attribute a, SmallVectorImpl<std::string> &out) {
    auto arr = dyn_cast_or_null<ArrayAttr>(a);
    if (!arr)
      return false;
    for (Attribute x : arr) {
      auto s = dyn_cast<StringAttr>(x);
      if (!s)
        return false;
      out.push_back(s.getValue().str());
    }
    return true;
  };
  TensorSharding s;
  auto split = dyn_cast_or_null<ArrayAttr>(dict.get("split"));
  if (!split)
    return bad("'split' must be an array of arrays of axis names");
  for (Attribute d : split) {
    s.split.emplace_back();
    if (!strings(d, s.split.back()))
      return bad("'split' must be an array of arrays of axis names");
  }
  if (Attribute p = dict.get("partial"))
    if (!strings(p, s.partial))
      return bad("'partial' must be an array of axis names");
  llvm::sort(s.partial);
  return s;
}

LogicalResult verifySharding(const TensorSharding &s, RankedTensorType type,
                             const MeshShape &mesh, bool logical,
                             function_ref<InFlightDiagnostic()> emitError) {
  if (int64_t(s.split.size()) != type.getRank())
    return emitError() << "kiln.sharding has " << s.split.size()
                       << " dimension entries for a tensor of rank " << type.getRank();
  llvm::StringSet<llvm::MallocAllocator> used;
  auto use = [&](const std::string &a) -> LogicalResult {
    if (mesh.axisSize(a) < 0)
      return emitError() << "kiln.sharding names '" << a << "', which is not a mesh axis";
    if (!used.insert(a).second)
      return emitError() << "kiln.sharding uses mesh axis '" << a << "' twice";
    return success();
  };
  for (auto [d, axes] : llvm::enumerate(s.split)) {
    int64_t ways = 1;
    for (const std::string &a : axes) {
      if (failed(use(a)))
        return failure();
      ways *= mesh.axisSize(a);
    }
    if (logical && type.getDimSize(d) % ways != 0)
      return emitError() << "kiln.sharding splits dimension " << d << " of size "
                         << type.getDimSize(d) << " into " << ways << " parts";
  }
  for (const std::string &a : s.partial)
    if (failed(use(a)))
      return failure();
  return success();
}

std::string shardingToString(const TensorSharding &s) {
  std::string out = "[";
  for (auto [i, d] : llvm::enumerate(s.split)) {
    out += i ? ", [" : "[";
    for (auto [j, a] : llvm::enumerate(d))
      out += (j ? ", " : "") + a;
    out += "]";
  }
  out += "]";
  if (!s.partial.empty()) {
    out += " partial [";
    for (auto [j, a] : llvm::enumerate(s.partial))
      out += (j ? ", " : "") + a;
    out += "]";
  }
  return out;
}

//===----------------------------------------------------------------------===//
// The rule table
//===----------------------------------------------------------------------===//

namespace {

using Opt = std::optional<TensorSharding>;
using Result = std::optional<SmallVector<TensorSharding, 1>>;
using Rule = std::function<Result(Operation *, ArrayRef<Opt>)>;

int64_t rankOf(Value v) { return cast<RankedTensorType>(v.getType()).getRank(); }

Result one(TensorSharding s) { return SmallVector<TensorSharding, 1>{std::move(s)}; }

/// Elementwise: split operands agree (replicated ones are taken as the local
/// slice); partial sums pass through linear ops only.
Result elementwise(Operation *op, ArrayRef<Opt> in) {
  int64_t rank = rankOf(op->getResult(0));
  TensorSharding out = TensorSharding::replicated(rank);
  bool haveSplit = false;
  SmallVector<int> partialAt;
  for (auto [i, s] : llvm::enumerate(in)) {
    if (!s)
      return std::nullopt;
    if (!s->partial.empty())
      partialAt.push_back(int(i));
    TensorSharding noPartial = *s;
    noPartial.partial.clear();
    if (noPartial.isReplicated())
      continue;
    if (int64_t(s->split.size()) != rank)
      return std::nullopt;
    if (haveSplit && noPartial.split != out.split)
      return std::nullopt;
    out.split = noPartial.split;
    haveSplit = true;
  }
  if (partialAt.empty())
    return one(out);
  // Linear in the partial operands: a+b, a-b with both partial over the same
  // axes; -a; a*r, r*a, a/r with r replicated; a cast.
  const TensorSharding &p = *in[partialAt[0]];
  bool linear = false;
  if (isa<AddOp, SubOp, ConcatOp>(op))
    linear = partialAt.size() == in.size() &&
             llvm::all_of(in, [&](const Opt &o) { return o->partial == p.partial; });
  else if (isa<NegOp, CastOp>(op))
    linear = true;
  else if (isa<MulOp>(op))
    linear = partialAt.size() == 1;
  else if (isa<DivOp>(op))
    linear = partialAt.size() == 1 && partialAt[0] == 0;
  if (!linear || haveSplit)
    return std::nullopt;
  out.partial = p.partial;
  return one(out);
}

Result broadcastRule(Operation *op, ArrayRef<Opt> in) {
  auto b = cast<BroadcastInDimOp>(op);
  if (!in[0])
    return std::nullopt;
  TensorSharding out = TensorSharding::replicated(rankOf(b.getResult()));
  auto opType = cast<RankedTensorType>(b.getOperand().getType());
  auto resType = cast<RankedTensorType>(b.getType());
  for (auto [i, d] : llvm::enumerate(b.getDims())) {
    if (!in[0]->split[i].empty() && opType.getDimSize(i) != resType.getDimSize(d))
      return std::nullopt; // a split size-1 dimension being repeated
    out.split[d] = in[0]->split[i];
  }
  out.partial = in[0]->partial;
  return one(out);
}

/// Reductions: a split reduced dimension becomes a partial sum (reduce_sum,
/// reduce_mean: the mean of equal-sized blocks' means); max has no partial
/// form here.
Result reduceRule(Operation *op, ArrayRef<Opt> in) {
  if (!in[0])
    return std::nullopt;
  ArrayRef<int64_t> axes = op->getAttrOfType<DenseI64ArrayAttr>("axes").asArrayRef();
  bool keep = op->hasAttr("keepdims");
  TensorSharding out;
  out.partial = in[0]->partial;
  bool max = isa<ReduceMaxOp>(op);
  if (max && !out.partial.empty())
    return std::nullopt;
  for (auto [d, axesOfDim] : llvm::enumerate(in[0]->split)) {
    bool reduced = llvm::is_contained(axes, int64_t(d));
    if (!reduced) {
      out.split.push_back(axesOfDim);
      continue;
    }
    if (!axesOfDim.empty()) {
      if (max)
        return std::nullopt;
      out.partial.append(axesOfDim.begin(), axesOfDim.end());
    }
    if (keep)
      out.split.emplace_back();
  }
  llvm::sort(out.partial);
  return one(out);
}

/// lhs [b..., M, K] x rhs [b..., K, N]: a contraction dimension split over
/// the same axes on both sides gives a partial sum; batch, M and N splits
/// carry over. One partial operand (the other replicated) stays partial.
Result matmulRule(Operation *op, ArrayRef<Opt> in) {
  auto mm = cast<MatmulOp>(op);
  if (!in[0] || !in[1])
    return std::nullopt;
  int64_t lr = rankOf(mm.getLhs()), rr = rankOf(mm.getRhs()), r = rankOf(mm.getResult());
  auto L = in[0]->split, R = in[1]->split;
  // Row/column/contraction dimensions of each side.
  int64_t lm = mm.getTransposeLhs() ? lr - 1 : lr - 2, lk = mm.getTransposeLhs() ? lr - 2 : lr - 1;
  int64_t rk = mm.getTransposeRhs() ? rr - 1 : rr - 2, rn = mm.getTransposeRhs() ? rr - 2 : rr - 1;
  TensorSharding out = TensorSharding::replicated(r);
  if (L[lk] != R[rk])
    return std::nullopt;
  if (!in[0]->partial.empty() && !in[1]->partial.empty())
    return std::nullopt;
  out.partial = !in[0]->partial.empty() ? in[0]->partial : in[1]->partial;
  out.partial.append(L[lk].begin(), L[lk].end());
  llvm::sort(out.partial);
  // Batch dimensions, aligned on the right of the batch block.
  int64_t lb = lr - 2, rb = rr - 2, ob = r - 2;
  for (int64_t i = 0; i < ob; ++i) {
    int64_t li = i - (ob - lb), ri = i - (ob - rb);
    SmallVector<std::string, 1> s;
    if (li >= 0)
      s = L[li];
    if (ri >= 0 && !R[ri].empty()) {
      if (!s.empty() && s != R[ri])
        return std::nullopt;
      s = R[ri];
    }
    out.split[i] = s;
  }
  out.split[r - 2] = L[lm];
  out.split[r - 1] = R[rn];
  return one(out);
}

/// Reshape keeps a split of dimension 0 (a block split of the outermost
/// dimension is a contiguous chunk of the row-major order, whatever the
/// shapes), and a split of dimension d > 0 when the result has a dimension e
/// with the same product of the dimensions before it: block c of d is then
/// the same stretch of each row-major run as block c of e (tensor
/// parallelism's [B, T, C] <-> [B, T, heads, D] and [B, T, F] <-> [B*T, F];
/// the pass checks that e divides).
Result reshapeRule(Operation *op, ArrayRef<Opt> in) {
  if (!in[0])
    return std::nullopt;
  auto from = cast<RankedTensorType>(op->getOperand(0).getType());
  auto to = cast<RankedTensorType>(op->getResult(0).getType());
  TensorSharding out = TensorSharding::replicated(to.getRank());
  out.partial = in[0]->partial;
  int splits = 0;
  for (auto [d, axes] : llvm::enumerate(in[0]->split)) {
    if (axes.empty())
      continue;
    if (out.split.empty() || ++splits > 1)
      return std::nullopt;
    if (d == 0) {
      out.split[0] = axes;
      continue;
    }
    int64_t prefix = 1;
    for (int64_t i = 0; i < int64_t(d); ++i)
      prefix *= from.getDimSize(i);
    int64_t p = 1, e = 0;
    while (e < to.getRank() && (p < prefix || to.getDimSize(e) == 1))
      p *= to.getDimSize(e++);
    if (p != prefix || e >= to.getRank())
      return std::nullopt;
    out.split[size_t(e)] = axes;
  }
  return one(out);
}

Result transposeRule(Operation *op, ArrayRef<Opt> in) {
  if (!in[0])
    return std::nullopt;
  auto t = cast<TransposeOp>(op);
  TensorSharding out = TensorSharding::replicated(rankOf(t.getResult()));
  for (auto [i, p] : llvm::enumerate(t.getPermutation()))
    out.split[i] = in[0]->split[p];
  out.partial = in[0]->partial;
  return one(out);
}

/// Slices and pads keep the splits of the dimensions they leave whole; a
/// slice of split dimension 0 (a micro-batch of each device's rows) stays
/// split.
Result sliceRule(Operation *op, ArrayRef<Opt> in) {
  if (!in[0])
    return std::nullopt;
  auto s = cast<SliceOp>(op);
  auto t = cast<RankedTensorType>(s.getOperand().getType());
  for (auto [d, axes] : llvm::enumerate(in[0]->split)) {
    bool whole = s.getStart()[d] == 0 && s.getLimit()[d] == t.getDimSize(d) &&
                 s.getStride()[d] == 1;
    if (!axes.empty() && !whole && d != 0)
      return std::nullopt;
  }
  return one(*in[0]);
}

Result padRule(Operation *op, ArrayRef<Opt> in) {
  if (!in[0])
    return std::nullopt;
  auto p = cast<PadOp>(op);
  for (auto [d, axes] : llvm::enumerate(in[0]->split))
    if (!axes.empty() && (p.getLow()[d] || p.getHigh()[d] || p.getInterior()[d]))
      return std::nullopt;
  if (!in[0]->partial.empty() && p.getValue().convertToDouble() != 0.0)
    return std::nullopt;
  return one(*in[0]);
}

Result concatRule(Operation *op, ArrayRef<Opt> in) {
  int64_t dim = cast<ConcatOp>(op).getDim();
  Result r = elementwise(op, in); // splits agree, partials as for add
  if (!r)
    return std::nullopt;
  if (!(*r)[0].split[dim].empty())
    return std::nullopt;
  return r;
}

/// gather: a replicated table read at split indices gives rows split like
/// the indices (an embedding lookup of a split batch).
Result gatherRule(Operation *op, ArrayRef<Opt> in) {
  auto g = cast<GatherOp>(op);
  if (!in[0] || !in[1] || !in[0]->isReplicated() || !in[1]->partial.empty())
    return std::nullopt;
  TensorSharding out = TensorSharding::replicated(rankOf(g.getResult()));
  for (auto [i, s] : llvm::enumerate(in[1]->split))
    out.split[g.getAxis() + i] = s;
  return one(out);
}

/// scatter_add (the gradient of gather): updates and indices split over an
/// axis sum into a partial over it.
Result scatterAddRule(Operation *op, ArrayRef<Opt> in) {
  auto s = cast<ScatterAddOp>(op);
  if (!in[0] || !in[1] || !in[0]->partial.empty())
    return std::nullopt;
  TensorSharding out = TensorSharding::replicated(rankOf(s.getResult()));
  int64_t n = rankOf(s.getIndices()), ax = int64_t(s.getAxis());
  for (auto [i, axes] : llvm::enumerate(in[0]->split)) {
    bool indexDim = int64_t(i) >= ax && int64_t(i) < ax + n;
    if (!indexDim) {
      int64_t o = int64_t(i) < ax ? int64_t(i) : int64_t(i) - n + 1;
      out.split[o] = axes;
    } else {
      out.partial.append(axes.begin(), axes.end());
    }
  }
  llvm::sort(out.partial);
  return one(out);
}

/// Row-wise ops over the last axis: splits of other dimensions carry over.
Result lastAxisRule(Operation *op, ArrayRef<Opt> in) {
  if (!in[0] || !in[0]->partial.empty() || !in[0]->split.back().empty())
    return std::nullopt;
  for (size_t i = 1; i < in.size(); ++i)
    if (!in[i] || !in[i]->isReplicated())
      return std::nullopt;
  return one(*in[0]);
}

Result crossEntropyRule(Operation *op, ArrayRef<Opt> in) {
  auto ce = cast<CrossEntropyOp>(op);
  if (!in[0] || !in[1] || !in[0]->partial.empty() || !in[0]->split.back().empty())
    return std::nullopt;
  if (ce.getReduction() == LossReduction::none)
    return one(*in[1]);
  TensorSharding out;
  for (const auto &axes : in[1]->split)
    out.partial.append(axes.begin(), axes.end());
  llvm::sort(out.partial);
  return one(out);
}

Result allReduceRule(Operation *op, ArrayRef<Opt> in) {
  if (!in[0])
    return std::nullopt;
  TensorSharding out = *in[0];
  StringRef axis = cast<AllReduceOp>(op).getAxis();
  llvm::erase(out.partial, axis.str());
  return one(out);
}

Result reduceScatterRule(Operation *op, ArrayRef<Opt> in) {
  auto rs = cast<ReduceScatterOp>(op);
  if (!in[0] || !in[0]->isPartial(rs.getAxis()))
    return std::nullopt;
  TensorSharding out = *in[0];
  llvm::erase(out.partial, rs.getAxis().str());
  out.split[rs.getDim()].push_back(rs.getAxis().str());
  return one(out);
}

Result allGatherRule(Operation *op, ArrayRef<Opt> in) {
  auto ag = cast<AllGatherOp>(op);
  if (!in[0])
    return std::nullopt;
  TensorSharding out = *in[0];
  auto &d = out.split[ag.getDim()];
  if (!d.empty() && d.back() == ag.getAxis())
    d.pop_back();
  return one(out);
}

Result replicatedRule(Operation *op, ArrayRef<Opt>) {
  SmallVector<TensorSharding, 1> out;
  for (Value r : op->getResults())
    out.push_back(TensorSharding::replicated(rankOf(r)));
  return out;
}

Result firstOperandRule(Operation *, ArrayRef<Opt> in) {
  if (!in[0])
    return std::nullopt;
  return one(*in[0]);
}

/// Dropout: the mask is drawn per device (its seed mixes in the replica), so
/// the result is split like the operand; a replicated operand gives an
/// unknown (per-device) result.
Result dropoutRule(Operation *, ArrayRef<Opt> in) {
  if (!in[0] || in[0]->isReplicated() || !in[0]->partial.empty())
    return std::nullopt;
  return one(*in[0]);
}

const llvm::StringMap<Rule> &table() {
  static const llvm::StringMap<Rule> t = [] {
    llvm::StringMap<Rule> m;
    for (const char *n : {"kiln.constant", "kiln.iota"})
      m[n] = replicatedRule;
    for (const char *n : {"kiln.neg", "kiln.abs", "kiln.exp", "kiln.log", "kiln.sqrt",
                          "kiln.rsqrt", "kiln.tanh", "kiln.sigmoid", "kiln.silu", "kiln.relu",
                          "kiln.erf", "kiln.cos", "kiln.sin", "kiln.gelu", "kiln.cast",
                          "kiln.add", "kiln.sub", "kiln.mul", "kiln.div", "kiln.pow",
                          "kiln.max", "kiln.min", "kiln.compare", "kiln.select"})
      m[n] = elementwise;
    m["kiln.broadcast_in_dim"] = broadcastRule;
    for (const char *n : {"kiln.reduce_sum", "kiln.reduce_mean", "kiln.reduce_max"})
      m[n] = reduceRule;
    m["kiln.matmul"] = matmulRule;
    m["kiln.reshape"] = reshapeRule;
    m["kiln.transpose"] = transposeRule;
    m["kiln.slice"] = sliceRule;
    m["kiln.pad"] = padRule;
    m["kiln.concat"] = concatRule;
    m["kiln.gather"] = gatherRule;
    m["kiln.scatter_add"] = scatterAddRule;
    for (const char *n : {"kiln.softmax", "kiln.log_softmax", "kiln.layer_norm"})
      m[n] = lastAxisRule;
    m["kiln.cross_entropy"] = crossEntropyRule;
    m["kiln.dropout"] = dropoutRule;
    m["kiln.optimization_barrier"] = firstOperandRule;
    m["kiln.all_reduce"] = allReduceRule;
    m["kiln.reduce_scatter"] = reduceScatterRule;
    m["kiln.all_gather"] = allGatherRule;
    return m;
  }();
  return t;
}

} // namespace

std::optional<SmallVector<TensorSharding, 1>>
inferResultShardings(Operation *op, ArrayRef<std::optional<TensorSharding>> operands) {
  auto it = table().find(op->getName().getStringRef());
  if (it == table().end())
    return std::nullopt;
  return it->second(op, operands);
}

void propagateShardings(Block &block, llvm::DenseMap<Value, TensorSharding> &known) {
  for (Operation &op : block) {
    if (op.getNumResults() == 0)
      continue;
    SmallVector<Opt, 4> in;
    for (Value v : op.getOperands()) {
      auto it = known.find(v);
      in.push_back(it == known.end() ? Opt() : Opt(it->second));
    }
    if (auto r = inferResultShardings(&op, in))
      for (auto [v, s] : llvm::zip(op.getResults(), *r))
        known[v] = s;
  }
}

} // namespace kiln
