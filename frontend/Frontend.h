//===- Frontend.h - .kiln files to the kiln dialect -------------*- C++ -*-===//
//
// parse() (Parser.h) builds a syntax tree; elaborate() checks it (names,
// arity, dtypes, named-dimension shapes) and builds a verified-by-construction
// module:
//
//   module attributes {kiln.model = "gpt", kiln.train = {...}, kiln.dims = {...}} {
//     func.func @forward(%p0: tensor<65x128xf32> {kiln.param = "embedding.weight",
//                                                  kiln.layer = "embedding",
//                                                  kiln.init = {...}}, ...,
//                        %tokens: tensor<12x64xi32> {kiln.input = "tokens"}, ...)
//         -> (tensor<f32> {kiln.output = "loss"}, tensor<12x64x65xf32> {kiln.output = "logits"})
//   }
//
// Parameters come first, then inputs, in order of first appearance.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_FRONTEND_FRONTEND_H
#define KILN_FRONTEND_FRONTEND_H

#include "frontend/AST.h"
#include "frontend/Source.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

#include <map>
#include <optional>
#include <string>

namespace kiln::frontend {

/// Limits that keep any input from exhausting time or memory.
constexpr int64_t kMaxOps = 250'000;
constexpr int64_t kMaxRepeat = 100'000;
/// Pipeline stages a model may name with `stage N { ... }`.
constexpr int64_t kMaxStages = 64;
constexpr int kMaxCallDepth = 64;
constexpr int64_t kMaxSteps = 10'000'000;      ///< statements evaluated
constexpr int64_t kMaxListElements = 1'000'000;
constexpr int64_t kMaxDimSize = (int64_t(1) << 31) - 1;
constexpr int64_t kMaxTensorElements = int64_t(1) << 48;

struct FrontendOptions {
  /// Sizes for free dimensions, e.g. {"B": 12} from `--dim B=12`.
  std::map<std::string, int64_t> dims;
  /// Overrides the train section's batch for the batch dimension.
  std::optional<int64_t> batch;
  /// Overrides model parameters, e.g. {"layers": "2"} from `--param layers=2`.
  std::map<std::string, std::string> params;
  /// The op and statement limits (kMaxOps, kMaxSteps unless lowered: the
  /// fuzz target lowers them so a huge unrolled model costs milliseconds,
  /// not half a minute under ASan).
  int64_t maxOps = kMaxOps;
  int64_t maxSteps = kMaxSteps;
};

/// Checks `ast` and builds the kiln module. Returns null after reporting
/// the first error through `diags`.
mlir::OwningOpRef<mlir::ModuleOp> elaborate(mlir::MLIRContext &ctx,
                                            const SourceFile &file,
                                            const FileAST &ast,
                                            const FrontendOptions &options,
                                            DiagEngine &diags);

/// parse() then elaborate().
mlir::OwningOpRef<mlir::ModuleOp> buildModule(mlir::MLIRContext &ctx,
                                              const SourceFile &file,
                                              const FrontendOptions &options,
                                              DiagEngine &diags);

} // namespace kiln::frontend

#endif // KILN_FRONTEND_FRONTEND_H
