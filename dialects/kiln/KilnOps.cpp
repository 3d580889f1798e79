//===- KilnOps.cpp - Operations of the kiln dialect -----------------------===//
//
// The generated op classes and the kernel-level kiln.fusion. Every other
// op's rules (verifier, folder, gradient, sharding, precision, row
// locality, index uses, cost) are in its family file, dialects/kiln/ops/.
//
#include "dialects/kiln/KilnOps.h"
#include "dialects/kiln/ShapeRules.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/Matchers.h"
#include "mlir/IR/PatternMatch.h"

using namespace mlir;
using namespace kiln;

#include "dialects/kiln/KilnEnums.cpp.inc"
#include "dialects/kiln/KilnInterfaces.cpp.inc"

#define GET_OP_CLASSES
#include "dialects/kiln/KilnOps.cpp.inc"

//===----------------------------------------------------------------------===//
// kiln.fusion
//===----------------------------------------------------------------------===//

LogicalResult FusionOp::verify() {
  static const char *kinds[] = {"elementwise", "row_reduction", "column_reduction",
                                "gemm", "gemm_epilogue", "single", "attention"};
  if (!llvm::is_contained(kinds, getKind()))
    return emitOpError() << "has unknown kind '" << getKind()
                         << "' (elementwise, row_reduction, column_reduction, "
                            "gemm, gemm_epilogue, single or attention)";
  Block &block = getBlock();
  if (block.getNumArguments() != getInputs().size())
    return emitOpError() << "has " << getInputs().size() << " inputs but its body takes "
                         << block.getNumArguments() << " arguments";
  for (auto [i, pair] : llvm::enumerate(llvm::zip(getInputs(), block.getArguments())))
    if (std::get<0>(pair).getType() != std::get<1>(pair).getType())
      return emitOpError() << "input " << i << " has type " << std::get<0>(pair).getType()
                           << " but the body argument has type "
                           << std::get<1>(pair).getType();
  auto yield = cast<YieldOp>(block.getTerminator());
  if (yield.getValues().getTypes() != getResultTypes())
    return emitOpError() << "yields " << yield.getValues().size()
                         << " values whose types differ from its results";
  if (getRows() < 0)
    return emitOpError() << "rows must be >= 0";
  return success();
}
