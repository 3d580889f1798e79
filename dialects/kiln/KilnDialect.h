//===- KilnDialect.h - The kiln graph dialect -------------------*- C++ -*-===//
#ifndef KILN_DIALECTS_KILN_KILNDIALECT_H
#define KILN_DIALECTS_KILN_KILNDIALECT_H

#include "mlir/IR/Dialect.h"

#include "dialects/kiln/KilnDialect.h.inc"

#include <cstdint>
#include <string>
#include <vector>

namespace mlir {
class ModuleOp;
}

namespace kiln {

/// One named axis of a device mesh.
struct MeshAxis {
  std::string name;
  int64_t size = 1;
};

/// The module's device mesh (`kiln.mesh`): named axes, outermost first;
/// devices are numbered row-major over them (the last axis varies fastest).
/// No axes: one device.
struct MeshShape {
  std::vector<MeshAxis> axes;
  /// The number of devices: the product of the axis sizes.
  int64_t devices() const;
  /// The size of axis `name`, or -1 if the mesh has no such axis.
  int64_t axisSize(llvm::StringRef name) const;
};

/// The mesh of `module` (empty when it has no `kiln.mesh`). The attribute
/// is checked by the dialect's verifier.
MeshShape getMesh(mlir::ModuleOp module);
/// Sets (or, for an empty mesh, removes) `kiln.mesh` on `module`.
void setMesh(mlir::ModuleOp module, const MeshShape &mesh);
/// The size of mesh axis `axis` of the module around `op`, or -1 if there
/// is no such axis (or no module).
int64_t meshAxisSize(mlir::Operation *op, llvm::StringRef axis);

} // namespace kiln

#endif // KILN_DIALECTS_KILN_KILNDIALECT_H
