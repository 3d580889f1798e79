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
      if (auto f = dyn_cast<FusionOp>(op)) {
        follow(f.getBlock().getArgument(use.getOperandNumber()));
        continue;
      }
      auto indexing = dyn_cast<IndexUseOpInterface>(op);
      if (!indexing)
        continue;
      IndexUse how = indexing.getIndexUse(use.getOperandNumber());
      if (how.kind == IndexUse::Follow) {
        follow(op->getResult(0));
        continue;
      }
      if (how.kind != IndexUse::Bounded)
        continue;
      int64_t hi = how.hi;
      std::string from = std::move(how.from);
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
