//===- Check.h - One backend against another, step by step -------*- C++ -*-===//
//
// `kiln-run check`: every step of @train_step, @eval_step and @predict runs
// on both backends from the same state (the step's inputs copied from the
// reference, its outputs poisoned with NaN first), and every output is
// compared: relative error to the tensor's largest value at most the
// tolerance (looser for float16/bfloat16 and long sums), integers exact.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_TRAIN_CHECK_H
#define KILN_RUNTIME_TRAIN_CHECK_H

#include "runtime/train/Model.h"

#include <optional>

namespace kiln::train {

struct CheckOptions {
  double tolerance = 1e-4;
  /// The random inputs' seed; unset: a fresh one (printed, so --seed repeats it).
  std::optional<uint64_t> seed;
};

struct CheckResult {
  int failures = 0; ///< outputs outside the tolerance
};

/// `m` and `ref` hold the same program, each with its backend. Reports
/// (the header, each mismatch, a table of the worst error per kernel form,
/// PASS or FAIL) go to `out` as lines.
Expected<CheckResult> check(Model &m, Model &ref, const CheckOptions &o, const Sink &out);

} // namespace kiln::train

#endif // KILN_RUNTIME_TRAIN_CHECK_H
