//===- Evaluate.h - Validation loss and accuracy -----------------*- C++ -*-===//
#ifndef KILN_RUNTIME_TRAIN_EVALUATE_H
#define KILN_RUNTIME_TRAIN_EVALUATE_H

#include "runtime/train/DataSource.h"
#include "runtime/train/Model.h"

#include <optional>
#include <string>

namespace kiln::train {

struct EvalResult {
  double loss = 0;
  double accuracy = -1; ///< classifiers only
  int64_t batches = 0;
};

/// Mean @eval_step loss over `batches` batches of `src` (and accuracy when
/// @predict gives [batch, classes] logits and an input holds [batch] labels).
/// On several devices (m.comm) every rank calls it with its dp replica's
/// part of each batch (openData's DataShard): the loss is averaged over the
/// ranks and the accuracy counts summed, through the communicator (the
/// devices of one replica hold the same values, so this is the mean over
/// replicas). `step` (the training step, -1 for none) names a failed
/// collective.
Expected<EvalResult> evaluate(Model &m, const DataSource &src, int64_t batches,
                              int64_t step = -1);

/// What `kiln-run eval` does: the parameters of a checkpoint (or the initial
/// ones) on validation data. Empty strings and unset numbers take the
/// model's train section.
struct EvalOptions {
  std::string checkpoint; ///< "" for the initial parameters
  std::string data, valData;
  int64_t evalSteps = -1; ///< -1: one pass over .npy data, else the train section's (20)
  std::optional<uint64_t> seed;
  bool quiet = false;
  bool profile = false; ///< time kernels (Backend::setProfiling)
};

struct EvalReport {
  EvalResult result;
  std::string data; ///< the source's description
};

/// Reads the checkpoint and opens the data (both before the backend exists),
/// creates the backend with `make`, and evaluates.
Expected<EvalReport> evaluateModel(Model &m, const EvalOptions &o, const BackendFactory &make,
                                   const Sink &out);

} // namespace kiln::train

#endif // KILN_RUNTIME_TRAIN_EVALUATE_H
