//===- KilnDialect.cpp - The kiln graph dialect ---------------------------===//
#include "dialects/kiln/KilnDialect.h"
#include "dialects/kiln/KilnOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"

using namespace mlir;
using namespace kiln;

#include "dialects/kiln/KilnDialect.cpp.inc"

void KilnDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "dialects/kiln/KilnOps.cpp.inc"
      >();
}

Operation *KilnDialect::materializeConstant(OpBuilder &builder,
                                            Attribute value, Type type,
                                            Location loc) {
  auto elements = dyn_cast<ElementsAttr>(value);
  if (!elements || elements.getType() != type)
    return nullptr;
  return builder.create<ConstantOp>(loc, elements);
}

namespace {
LogicalResult verifyNonEmptyString(Operation *op, NamedAttribute attr) {
  auto s = dyn_cast<StringAttr>(attr.getValue());
  if (!s || s.getValue().empty())
    return op->emitError() << "'" << attr.getName().getValue()
                           << "' must be a non-empty string";
  return success();
}

/// kiln.init = {kind = "normal", mean = 0.0, std = 0.02}
///           | {kind = "uniform", low = -0.1, high = 0.1}
///           | {kind = "zeros"} | {kind = "ones"}
LogicalResult verifyInit(Operation *op, Attribute value) {
  auto dict = dyn_cast<DictionaryAttr>(value);
  if (!dict)
    return op->emitError() << "'kiln.init' must be a dictionary like "
                              "{kind = \"normal\", std = 0.02 : f64}";
  auto kind = dict.getAs<StringAttr>("kind");
  if (!kind)
    return op->emitError() << "'kiln.init' needs a string 'kind'";
  llvm::SmallVector<llvm::StringRef> fields;
  llvm::StringRef k = kind.getValue();
  if (k == "normal")
    fields = {"mean", "std"};
  else if (k == "uniform")
    fields = {"low", "high"};
  else if (k != "zeros" && k != "ones")
    return op->emitError() << "'kiln.init' kind '" << k
                           << "' is unknown (expected normal, uniform, "
                              "zeros or ones)";
  for (NamedAttribute entry : dict) {
    llvm::StringRef name = entry.getName().getValue();
    if (name == "kind")
      continue;
    if (!llvm::is_contained(fields, name))
      return op->emitError() << "'kiln.init' of kind '" << k
                             << "' has unexpected field '" << name << "'";
    if (!isa<FloatAttr>(entry.getValue()))
      return op->emitError() << "'kiln.init' field '" << name
                             << "' must be a float";
  }
  for (llvm::StringRef f : fields)
    if (!dict.get(f))
      return op->emitError() << "'kiln.init' of kind '" << k
                             << "' needs field '" << f << "'";
  return success();
}
} // namespace

LogicalResult KilnDialect::verifyRegionArgAttribute(Operation *op,
                                                    unsigned regionIndex,
                                                    unsigned argIndex,
                                                    NamedAttribute attr) {
  llvm::StringRef name = attr.getName().getValue();
  if (name == kParamAttr || name == kInputAttr || name == kLayerAttr ||
      name == kStateAttr)
    return verifyNonEmptyString(op, attr);
  if (name == kInitAttr)
    return verifyInit(op, attr.getValue());
  return op->emitError() << "unknown kiln argument attribute '" << name
                         << "' (expected kiln.param, kiln.layer, kiln.init, "
                            "kiln.input or kiln.state)";
}

LogicalResult KilnDialect::verifyRegionResultAttribute(Operation *op,
                                                       unsigned regionIndex,
                                                       unsigned resultIndex,
                                                       NamedAttribute attr) {
  if (attr.getName().getValue() == kOutputAttr)
    return verifyNonEmptyString(op, attr);
  return op->emitError() << "unknown kiln result attribute '"
                         << attr.getName().getValue()
                         << "' (expected kiln.output)";
}

LogicalResult KilnDialect::verifyOperationAttribute(Operation *op,
                                                    NamedAttribute attr) {
  llvm::StringRef name = attr.getName().getValue();
  if (name == kModelAttr || name == kSourceAttr || name == kBlockAttr)
    return verifyNonEmptyString(op, attr);
  if (name == kTrainAttr || name == kDimsAttr) {
    if (!isa<DictionaryAttr>(attr.getValue()))
      return op->emitError() << "'" << name << "' must be a dictionary";
    return success();
  }
  return op->emitError() << "unknown kiln attribute '" << name << "'";
}
