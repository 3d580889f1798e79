//===- ElementTypes.h - kiln::ElementType from and to MLIR ------*- C++ -*-===//
//
// The compiler's side of runtime/core/ElementType.h: which MLIR type each
// element type is, and back. The runtime never sees MLIR, so the mapping
// lives here rather than next to the enum.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_DIALECTS_KILN_ELEMENTTYPES_H
#define KILN_DIALECTS_KILN_ELEMENTTYPES_H

#include "runtime/core/ElementType.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"

#include <optional>

namespace kiln {

/// The element type `t` is (f32, f64, f16, bf16, or an integer of width 32,
/// 64 or 1); nullopt for any other type, including tensors.
inline std::optional<ElementType> toElementType(mlir::Type t) {
  if (t.isF32()) return ElementType::F32;
  if (t.isF64()) return ElementType::F64;
  if (t.isF16()) return ElementType::F16;
  if (t.isBF16()) return ElementType::BF16;
  if (t.isInteger(32)) return ElementType::I32;
  if (t.isInteger(64)) return ElementType::I64;
  if (t.isInteger(1)) return ElementType::I1;
  return std::nullopt;
}

/// The MLIR type of element type `t` (signless integers).
inline mlir::Type toMlirType(ElementType t, mlir::Builder &b) {
  switch (t) {
  case ElementType::F32: return b.getF32Type();
  case ElementType::F64: return b.getF64Type();
  case ElementType::F16: return b.getF16Type();
  case ElementType::BF16: return b.getBF16Type();
  case ElementType::I32: return b.getI32Type();
  case ElementType::I64: return b.getI64Type();
  case ElementType::I1: return b.getI1Type();
  }
  return b.getF32Type();
}

} // namespace kiln

#endif // KILN_DIALECTS_KILN_ELEMENTTYPES_H
