//===- ElementType.h - The one element-type enum ----------------*- C++ -*-===//
//
// The element types a tensor or buffer can hold, shared by the frontend, the
// reference interpreter, the compiler and the runtime (program::DType is this
// type). Header-only and free of MLIR, so the runtime can include it; the
// compiler converts from and to MLIR types with dialects/kiln/ElementTypes.h.
//
// The artifact stores element types by name ("f32", "bf16", ...), never by
// number; the enumerator order is not part of any format.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CORE_ELEMENTTYPE_H
#define KILN_RUNTIME_CORE_ELEMENTTYPE_H

#include <cstdint>
#include <optional>
#include <string_view>

namespace kiln {

/// Element types of the dialect's tensors and of the artifact's buffers.
enum class ElementType : uint8_t { F32, F64, F16, BF16, I32, I64, I1 };

/// Every element type, in enumerator order.
inline constexpr ElementType kElementTypes[] = {
    ElementType::F32, ElementType::F64, ElementType::F16, ElementType::BF16,
    ElementType::I32, ElementType::I64, ElementType::I1};

/// The name used in .kiln files, MLIR and the artifact: "f32", "bf16", "i1", ...
constexpr const char *dtypeName(ElementType t) {
  switch (t) {
  case ElementType::F32: return "f32";
  case ElementType::F64: return "f64";
  case ElementType::F16: return "f16";
  case ElementType::BF16: return "bf16";
  case ElementType::I32: return "i32";
  case ElementType::I64: return "i64";
  case ElementType::I1: return "i1";
  }
  return "?";
}

/// Bytes one element takes in memory (i1 is stored as one byte).
constexpr int dtypeBytes(ElementType t) {
  switch (t) {
  case ElementType::F64:
  case ElementType::I64: return 8;
  case ElementType::F32:
  case ElementType::I32: return 4;
  case ElementType::F16:
  case ElementType::BF16: return 2;
  case ElementType::I1: return 1;
  }
  return 0;
}

/// The element type named `s` (exactly as dtypeName() writes it), if any.
constexpr std::optional<ElementType> parseElementType(std::string_view s) {
  for (ElementType t : kElementTypes)
    if (s == dtypeName(t))
      return t;
  return std::nullopt;
}

/// parseElementType() for callers that keep the result in a variable.
inline bool parseDType(std::string_view s, ElementType &out) {
  std::optional<ElementType> t = parseElementType(s);
  if (t)
    out = *t;
  return t.has_value();
}

/// f64, f32, f16 or bf16.
constexpr bool isFloat(ElementType t) {
  return t == ElementType::F64 || t == ElementType::F32 ||
         t == ElementType::F16 || t == ElementType::BF16;
}

/// i64 or i32 (not i1, which is a boolean).
constexpr bool isInteger(ElementType t) {
  return t == ElementType::I64 || t == ElementType::I32;
}

} // namespace kiln

#endif // KILN_RUNTIME_CORE_ELEMENTTYPE_H
