//===- PrecisionReport.h - Where a mixed-precision program rounds -*- C++
//-*-===//
//
// `kilnc --precision-report`: read off @forward after kiln-mixed-precision
// (passes/Precision.h is the contract): every rounding point (a kiln.cast
// carrying kiln.precision.rule) with its model line, from and to type,
// producer, consumers and rule; every constant whose value the low type
// changes; every op the policy kept in fp32 (or whose
// statistics it keeps in fp32) with its rule; the user's own casts
// (respected); the counts; and the activation memory of the mixed train
// step against the same model's fp32 step, as --emit=plan counts it
// (compiler/Codegen.h, activationMemory).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_COMPILER_PRECISIONREPORT_H
#define KILN_COMPILER_PRECISIONREPORT_H

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kiln {

struct PrecisionReport {
  /// "fp32" where the module has no kiln.precision (nothing was rounded).
  std::string precision = "fp32", mode;
  struct Cast {
    std::string loc;       ///< model file:line:col (the cast's location)
    std::string from, to;  ///< "f32[64x256]", "bf16"
    std::string producer;  ///< "param w", "input x", "matmul", ...
    std::string consumers; ///< the ops that read it: "matmul, add"
    std::string rule;      ///< empty for the user's own casts
  };
  struct Kept {
    std::string loc, op, type, rule;
    bool statistics = false; ///< low in and out, fp32 statistics inside
  };
  std::vector<Cast> casts, userCasts;
  /// Constants of the model whose value the low type changed (the pass's
  /// kiln.precision.rounded_from): `1 - 1e-7` becomes 1 in fp16.
  struct Rounded {
    std::string loc;  ///< model file:line:col
    double from = 0;  ///< the value before (f32)
    double to = 0;    ///< the value in `type`
    std::string type; ///< "f16", "bf16"
    std::string consumers;
  };
  std::vector<Rounded> rounded;
  std::vector<Kept> kept;
  /// Compute ops of @forward (no casts or constants) by result type.
  int64_t lowOps = 0, fp32Ops = 0;
  std::map<std::string, int64_t> castsByRule;
  /// The activation memory of @train_step (bytes; -1: not computed) for the
  /// mixed program and the same model compiled in fp32; `fp32Note` says why
  /// the fp32 number is missing.
  int64_t activationBytes = -1, fp32ActivationBytes = -1;
  std::map<std::string, int64_t> activationBytesByType;
  std::string fp32Note;
};

/// Reads the report off `module`'s @forward (after the training pipeline,
/// which runs kiln-mixed-precision).
PrecisionReport collectPrecisionReport(mlir::ModuleOp module);

/// Strips what selects mixed precision (kiln.train's precision and
/// precision_mode, the module's kiln.precision attributes) from a module
/// the pipeline has not run on yet, so that it compiles in fp32; false with
/// `why` set when @forward already carries the pass's casts (an input
/// module that is mixed already).
bool makeFp32Variant(mlir::ModuleOp module, std::string &why);

/// Compiles `module` (training program built) without LLVM code and
/// returns the activation memory of its @train_step (-1 with `error` set).
int64_t trainStepActivationBytes(mlir::ModuleOp module, bool fusion,
                                 std::map<std::string, int64_t> *byType,
                                 std::string &error);

void printPrecisionReport(const PrecisionReport &report, llvm::raw_ostream &os);
void printPrecisionReportJson(const PrecisionReport &report,
                              llvm::raw_ostream &os);

} // namespace kiln

#endif // KILN_COMPILER_PRECISIONREPORT_H
