//===- KilnTraits.h - Op traits of the kiln dialect --------------*- C++ -*-===//
//
// The C++ side of the traits KilnInterfaces.td declares (Kiln_FlopsPerElement,
// Kiln_Transcendental).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_DIALECTS_KILN_KILNTRAITS_H
#define KILN_DIALECTS_KILN_KILNTRAITS_H

#include "mlir/IR/OpDefinition.h"

#include <cstdint>

namespace kiln::trait {

/// Floating-point operations per counted element, which CostOpInterface's
/// getFlopsPerElement() returns.
template <int64_t N>
struct FlopsPerElement {
  template <typename ConcreteType>
  class Impl : public mlir::OpTrait::TraitBase<ConcreteType, Impl> {
  public:
    static constexpr int64_t kFlopsPerElement = N;
  };
};

/// The op evaluates a transcendental function per element: expensive to
/// recompute and compute-bound (KilnInterfaces.td).
template <typename ConcreteType>
class Transcendental : public mlir::OpTrait::TraitBase<ConcreteType, Transcendental> {};

} // namespace kiln::trait

#endif // KILN_DIALECTS_KILN_KILNTRAITS_H
