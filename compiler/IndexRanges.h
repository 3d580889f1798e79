//===- IndexRanges.h - The values an integer input may take ------*- C++ -*-===//
//
// An integer tensor that indexes (cross_entropy's targets, gather's and
// scatter_add's indices, class indices compared against an iota) may only
// take [0, the size it indexes). One rule, used where the artifact's
// manifest states each input's range (compiler/Package.cpp: kiln-run then
// checks the data against it) and where kilnc draws random inputs for
// --gradcheck and --reference (compiler/Training.cpp).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_COMPILER_INDEXRANGES_H
#define KILN_COMPILER_INDEXRANGES_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Value.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace kiln {

/// [lo, hi) and what bounds it ("kiln.cross_entropy targets (10 classes)").
struct IndexRange {
  int64_t lo = 0, hi = 0;
  std::string from;
};

/// The narrowest range the uses of `v` give it: as the targets of a
/// kiln.cross_entropy ([0, classes): the logits' last dimension), in an
/// equality kiln.compare against a kiln.iota (the one-hot of nll_loss: [0,
/// the iota's size along its dimension)), as the indices of a kiln.gather
/// or kiln.scatter_add ([0, the table's size along the axis)), directly or
/// through ops that move elements without changing them (reshape,
/// broadcast_in_dim, transpose, slice, concat, an integer cast) and into
/// fusion bodies. None where no use bounds it statically.
std::optional<IndexRange> indexRangeOf(mlir::Value v);

/// indexRangeOf() of every integer kiln.input of the module's functions, by
/// input name; an input of several functions takes the narrowest.
std::map<std::string, IndexRange> inputIndexRanges(mlir::ModuleOp module);

} // namespace kiln

#endif // KILN_COMPILER_INDEXRANGES_H
