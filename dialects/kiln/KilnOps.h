//===- KilnOps.h - Operations of the kiln dialect ---------------*- C++ -*-===//
#ifndef KILN_DIALECTS_KILN_KILNOPS_H
#define KILN_DIALECTS_KILN_KILNOPS_H

#include "dialects/kiln/KilnDialect.h"
#include "dialects/kiln/KilnTraits.h"
#include "dialects/kiln/OpRules.h"
#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "dialects/kiln/KilnEnums.h.inc"
#include "dialects/kiln/KilnInterfaces.h.inc"

#define GET_OP_CLASSES
#include "dialects/kiln/KilnOps.h.inc"

#endif // KILN_DIALECTS_KILN_KILNOPS_H
