//===- Sharding.cpp - Sharding attributes and their propagation ----------===//
#include "dialects/kiln/Sharding.h"

#include "dialects/kiln/KilnOps.h"

#include "mlir/IR/BuiltinAttributes.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringSet.h"

#include <algorithm>

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

std::optional<SmallVector<TensorSharding, 1>>
inferResultShardings(Operation *op, ArrayRef<std::optional<TensorSharding>> operands) {
  if (auto rules = dyn_cast<ShardingOpInterface>(op))
    return rules.inferResultShardings(operands);
  return std::nullopt;
}

void propagateShardings(Block &block, llvm::DenseMap<Value, TensorSharding> &known) {
  for (Operation &op : block) {
    if (op.getNumResults() == 0)
      continue;
    SmallVector<OperandSharding, 4> in;
    for (Value v : op.getOperands()) {
      auto it = known.find(v);
      in.push_back(it == known.end() ? OperandSharding() : OperandSharding(it->second));
    }
    if (auto r = inferResultShardings(&op, in))
      for (auto [v, s] : llvm::zip(op.getResults(), *r))
        known[v] = s;
  }
}

} // namespace kiln
