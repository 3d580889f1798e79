//===- Precision.h - The mixed-precision policy, one entry per op -*- C++ -*-===//
//
// What kiln-mixed-precision (passes/MixedPrecision.cpp) does with each kiln
// op when a train step runs in bf16 or fp16: the op's class in the "kiln"
// mode (Kiln's own policy: low-precision storage, fp32 statistics inside
// kernels) and in the "autocast" mode (rounding points where PyTorch's
// autocast puts them), and the rule name the pass records in
// `kiln.precision.rule` (passes/Precision.h). Each op answers it through
// PrecisionOpInterface, in its family file (dialects/kiln/ops/), beside its
// gradient and sharding rules; docs/training.md renders the table. Every
// kiln op must answer (the build fails otherwise), so a new op cannot
// escape the policy silently.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_DIALECTS_KILN_PRECISION_H
#define KILN_DIALECTS_KILN_PRECISION_H

#include "dialects/kiln/OpRules.h"

#include "llvm/ADT/StringRef.h"

#include <optional>
#include <string>
#include <vector>

namespace mlir {
class MLIRContext;
class Operation;
} // namespace mlir

namespace kiln {

/// An op's policy (its PrecisionOpInterface answer, written in its family
/// file), or none for an op without one (kiln.fusion, kiln.yield, other
/// dialects' ops).
std::optional<PrecisionPolicy> lookupPrecisionPolicy(mlir::Operation *op);

/// One row of the policy table docs/training.md renders.
struct NamedPrecisionPolicy {
  std::string op; ///< "kiln.matmul"
  PrecisionPolicy policy;
};
/// Every kiln op's policy, by op name (the dialect must be loaded).
std::vector<NamedPrecisionPolicy> precisionPolicies(mlir::MLIRContext *ctx);

/// "low", "fp32", "fp32-stats", "follow", "promote", "keep".
llvm::StringRef precisionClassName(PrecisionClass c);

/// Op attribute the frontend puts on every op built under a user's fp32
/// override (`precision = fp32` on a call, `fp32_layers` in the train
/// section): the pass keeps such ops in fp32 (rule "user-fp32-override").
/// Its value is the override's name for reports (the layer or block).
inline constexpr llvm::StringLiteral kPrecisionOverrideAttr = "kiln.precision.fp32";

/// Rule names the pass uses outside the table.
inline constexpr llvm::StringLiteral kRuleMasterWeightCopy = "master-weight-copy";
inline constexpr llvm::StringLiteral kRuleUserOverride = "user-fp32-override";
inline constexpr llvm::StringLiteral kRuleOutputFp32 = "output-fp32";
inline constexpr llvm::StringLiteral kRuleUserTyped = "user-typed";

/// The largest initial loss scale (`loss_scale = dynamic(init = S)`, a
/// static scale) for a step in `precision` (docs/training.md "The largest
/// initial scale"). The scale multiplies the loss in fp32; the gradients it
/// scales are stored in the low type. Under fp16 a gradient as small as
/// float16's smallest normal number (2^-14, about 6.1e-5) must still be
/// finite once scaled: S * 2^-14 <= 65504, so S <= 65504 * 2^14 (about
/// 1.07e9, just under 2^30). PyTorch's GradScaler default and Kiln's, 2^16,
/// is far inside. bf16 (and fp32) have float32's exponent range: any finite
/// float32 scale.
inline double maxInitialLossScale(llvm::StringRef precision) {
  return precision == "fp16" ? 65504.0 * 16384.0 : 3.4e38;
}

/// Why `init` is refused under fp16 and what to do ("" when it is not).
std::string lossScaleInitError(llvm::StringRef precision, double init);

} // namespace kiln

#endif // KILN_DIALECTS_KILN_PRECISION_H
