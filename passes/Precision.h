//===- Precision.h - The mixed-precision contract ----------------*- C++ -*-===//
//
// What kiln-mixed-precision leaves in the IR, for the passes and reports that
// read it (kilnc --precision-report, the plan, the train-step builder). The
// policy table itself lives in dialects/kiln/ (one entry per op); this header
// is only the contract between the pass and its readers.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_PASSES_PRECISION_H
#define KILN_PASSES_PRECISION_H

#include "llvm/ADT/StringRef.h"

namespace kiln {

/// On every kiln.cast the pass inserts, and on every op it keeps in (or
/// widens to) fp32: the name of the policy rule that decided it (a
/// StringAttr such as "gemm-low", "softmax-fp32-stats", "loss-fp32",
/// "user-fp32-override"). A kiln.cast without it was written by the user and
/// is never changed.
inline constexpr llvm::StringLiteral kPrecisionRuleAttr = "kiln.precision.rule";

/// On the module: the policy applied ("bf16" or "fp16"); absent for fp32.
inline constexpr llvm::StringLiteral kPrecisionAttr = "kiln.precision";

/// On a splat kiln.constant the pass rounded to the low type (a scalar of
/// the model read by a low-precision op) whose value changed: the value it
/// had before and where the model wrote it, a DictionaryAttr {value: F64
/// (`1 - 1e-7` is 0.99999988 in f32, 1.0 in f16), loc: "file:line:col"}.
/// The precision report lists them.
inline constexpr llvm::StringLiteral kPrecisionRoundedFromAttr = "kiln.precision.rounded_from";

/// On the module: "kiln" (default: low-precision storage, fp32 statistics
/// inside kernels) or "autocast" (rounding points where PyTorch autocast puts
/// them, for op-by-op comparison).
inline constexpr llvm::StringLiteral kPrecisionModeAttr = "kiln.precision.mode";

} // namespace kiln

#endif // KILN_PASSES_PRECISION_H
