//===- Training.h - Train-program pipeline and numeric checks ---*- C++ -*-===//
//
// buildTrainProgram() runs kiln-train-step (+ canonicalize, cse) on a module
// from the frontend. gradCheck() compares @grad against float64 finite
// differences of @forward on the reference interpreter. exportReference()
// writes initial parameters, a batch, the loss, every gradient and the
// parameters after N train steps as .npy files for cross-checks against
// another framework (test/jax/).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_COMPILER_TRAINING_H
#define KILN_COMPILER_TRAINING_H

#include "reference/Interpreter.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/raw_ostream.h"

#include <string>
#include <vector>

namespace kiln {

/// Adds @init, @grad, @train_step, @eval_step, @predict; simplifies.
/// `printAfterAll`: print the module after every pass, to stderr (kilnc
/// --print-ir-after-all).
mlir::LogicalResult buildTrainProgram(mlir::ModuleOp module, bool gradOnly = false,
                                      bool printAfterAll = false);

/// Rewrites every f32 tensor in `fn` (arguments, results, constants) to f64,
/// so that the whole program, gradients included, is evaluated in float64:
/// constants the gradient rules create (epsilons, 1/n) then are exact too.
void convertToF64(mlir::func::FuncOp fn);

struct GradCheckOptions {
  /// Coordinates sampled per large tensor (the largest-gradient one plus
  /// random ones); tensors of <= 16 elements are checked everywhere.
  int samples = 3;
  double tolerance = 1e-5;
  uint64_t seed = 1;
  /// Testing aid: scale the first parameter's analytic gradient by
  /// (1 + injectError) to show that the check catches a wrong rule.
  double injectError = 0.0;
};

/// Returns the worst relative error (or a negative number with `error` set).
double gradCheck(mlir::ModuleOp module, const GradCheckOptions &options,
                 llvm::raw_ostream &report, std::string &error);

/// Random inputs for @forward's data arguments: floats ~ N(0, 1), integer
/// inputs uniform over the range their users accept (table rows for gather,
/// classes for cross_entropy and nll_loss), dropout seeds fixed.
std::vector<interp::Tensor> randomInputs(mlir::func::FuncOp fn,
                                         uint64_t seed, bool skipParams);

/// Sets aside a multi-device layout (the train settings devices, tp, pp,
/// zero, the pipeline schedule, the mesh and `stage N { ... }` placement)
/// so the module compiles for one device, with the same model, batch and
/// grad_accum (a pipeline's micro_batches); returns what was set aside, as
/// "devices = 2, pp = 2" ("" for a one-device module). Call it before
/// buildTrainProgram().
std::string setOneDeviceLayout(mlir::ModuleOp module);

/// Writes the reference into `dir` (created, or its files replaced) as a
/// whole: the files are written into a sibling folder first and moved in at
/// the end, so a failure leaves no partial reference. `seed` seeds the
/// initial parameters (as the artifact's train seed does) and the batch; the
/// manifest records it.
bool exportReference(mlir::ModuleOp module, const std::string &dir, int steps,
                     uint64_t seed, llvm::raw_ostream &log,
                     std::string &error);

} // namespace kiln

#endif // KILN_COMPILER_TRAINING_H
