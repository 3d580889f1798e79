//===- IndexRanges.cpp - The values an integer input may take -------------===//
#include "compiler/IndexRanges.h"

#include "dialects/kiln/KilnDialect.h"
#include "dialects/kiln/KilnOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SmallVector.h"

#include <fmt/format.h>

using namespace mlir;

namespace kiln {

namespace {
/// The size of `v` along `axis` (-1: the last); dynamic for a scalar.
int64_t extent(Value v, int64_t axis) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  if (!t || t.getRank() == 0)
    return ShapedType::kDynamic;
  return t.getDimSize(axis < 0 ? t.getRank() - 1 : axis);
}
} // namespace

std::optional<IndexRange> indexRangeOf(Value start) {
  std::optional<IndexRange> best;
  SmallVector<Value> work{start};
  llvm::DenseSet<Value> seen{start};
  auto follow = [&](Value v) {
    if (seen.insert(v).second)
      work.push_back(v);
  };
  while (!work.empty()) {
    Value v = work.pop_back_val();
    for (OpOperand &use : v.getUses()) {
      Operation *op = use.getOwner();
      int64_t hi = ShapedType::kDynamic;
      std::string from;
      if (auto ce = dyn_cast<CrossEntropyOp>(op); ce && use.getOperandNumber() == 1) {
        hi = extent(ce.getLogits(), -1);
        from = fmt::format("kiln.cross_entropy targets ({} classes)", hi);
      } else if (auto g = dyn_cast<GatherOp>(op); g && use.getOperandNumber() == 1) {
        hi = extent(g.getOperand(), g.getAxis());
        from = fmt::format("kiln.gather indices (a table of {} rows)", hi);
      } else if (auto sa = dyn_cast<ScatterAddOp>(op); sa && use.getOperandNumber() == 1) {
        hi = extent(sa.getResult(), sa.getAxis());
        from = fmt::format("kiln.scatter_add indices (a table of {} rows)", hi);
      } else if (auto cmp = dyn_cast<CompareOp>(op);
                 cmp && cmp.getDirection() == CompareDirection::eq) {
        // A one-hot against the class index (nll_loss, cross_entropy on
        // probabilities: docs/language.md): targets in [0, classes).
        Value other = cmp->getOperand(1 - use.getOperandNumber());
        auto iota = other.getDefiningOp<IotaOp>();
        if (!iota)
          continue;
        hi = extent(other, iota.getDim());
        from = fmt::format("class indices against kiln.iota ({} classes)", hi);
      } else if (auto f = dyn_cast<FusionOp>(op)) {
        follow(f.getBlock().getArgument(use.getOperandNumber()));
        continue;
      } else if (isa<ReshapeOp, BroadcastInDimOp, TransposeOp, SliceOp, ConcatOp>(op) ||
                 (isa<CastOp>(op) &&
                  isa<IntegerType>(getElementTypeOrSelf(op->getResult(0).getType())))) {
        follow(op->getResult(0));
        continue;
      } else {
        continue;
      }
      if (ShapedType::isDynamic(hi) || hi <= 0)
        continue;
      if (!best || hi < best->hi)
        best = IndexRange{0, hi, from};
    }
  }
  return best;
}

std::map<std::string, IndexRange> inputIndexRanges(ModuleOp module) {
  std::map<std::string, IndexRange> ranges;
  module.walk([&](func::FuncOp fn) {
    for (BlockArgument arg : fn.getArguments()) {
      auto name = fn.getArgAttrOfType<StringAttr>(arg.getArgNumber(), KilnDialect::kInputAttr);
      auto type = dyn_cast<RankedTensorType>(arg.getType());
      if (!name || !type || !isa<IntegerType>(type.getElementType()))
        continue;
      std::optional<IndexRange> r = indexRangeOf(arg);
      if (!r)
        continue;
      auto [it, fresh] = ranges.try_emplace(name.str(), *r);
      if (!fresh && r->hi < it->second.hi)
        it->second = *r;
    }
  });
  return ranges;
}

} // namespace kiln
