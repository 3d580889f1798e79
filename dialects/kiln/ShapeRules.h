//===- ShapeRules.h - Shape rules of kiln ops -------------------*- C++ -*-===//
//
// One free function per shape rule, shared by the op verifiers and result-type
// inference. Each reports through mlir::emitOptionalError, so it is silent when
// called without a location (e.g. from a builder that only wants to know).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_DIALECTS_KILN_SHAPERULES_H
#define KILN_DIALECTS_KILN_SHAPERULES_H

#include "mlir/IR/Location.h"
#include "mlir/Support/LogicalResult.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/SmallVector.h"

#include <optional>

namespace kiln::shape {

using Loc = std::optional<mlir::Location>;
using Shape = llvm::SmallVector<int64_t>;

/// Formats a shape as "[2, 3]" for messages.
std::string str(llvm::ArrayRef<int64_t> shape);

mlir::LogicalResult broadcastInDim(Loc loc, llvm::ArrayRef<int64_t> operand,
                                   llvm::ArrayRef<int64_t> dims,
                                   llvm::ArrayRef<int64_t> result);
mlir::LogicalResult reduce(Loc loc, llvm::ArrayRef<int64_t> operand,
                           llvm::ArrayRef<int64_t> axes, bool keepdims,
                           Shape &result);
mlir::LogicalResult matmul(Loc loc, llvm::ArrayRef<int64_t> lhs,
                           llvm::ArrayRef<int64_t> rhs, bool transposeLhs,
                           bool transposeRhs, Shape &result);
mlir::LogicalResult transpose(Loc loc, llvm::ArrayRef<int64_t> operand,
                              llvm::ArrayRef<int64_t> permutation,
                              Shape &result);
mlir::LogicalResult slice(Loc loc, llvm::ArrayRef<int64_t> operand,
                          llvm::ArrayRef<int64_t> start,
                          llvm::ArrayRef<int64_t> limit,
                          llvm::ArrayRef<int64_t> stride, Shape &result);
mlir::LogicalResult concat(Loc loc,
                           llvm::ArrayRef<llvm::SmallVector<int64_t>> inputs,
                           int64_t dim, Shape &result);
mlir::LogicalResult gather(Loc loc, llvm::ArrayRef<int64_t> operand,
                           llvm::ArrayRef<int64_t> indices, int64_t axis,
                           Shape &result);
mlir::LogicalResult crossEntropy(Loc loc, llvm::ArrayRef<int64_t> logits,
                                 llvm::ArrayRef<int64_t> targets,
                                 bool reduced, Shape &result);
mlir::LogicalResult layerNorm(Loc loc, llvm::ArrayRef<int64_t> operand,
                              const llvm::ArrayRef<int64_t> *scale,
                              const llvm::ArrayRef<int64_t> *bias);
/// `axis` must be in [0, rank).
mlir::LogicalResult axis(Loc loc, int64_t rank, int64_t axis,
                         llvm::StringRef what);
/// Number of elements; false if it overflows int64.
bool numElements(llvm::ArrayRef<int64_t> shape, int64_t &count);

} // namespace kiln::shape

#endif // KILN_DIALECTS_KILN_SHAPERULES_H
