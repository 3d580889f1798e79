//===- Sampler.h - Text from a character-level language model ----*- C++ -*-===//
#ifndef KILN_RUNTIME_TRAIN_SAMPLER_H
#define KILN_RUNTIME_TRAIN_SAMPLER_H

#include "runtime/train/Model.h"

#include <optional>
#include <string>

namespace kiln::train {

struct SampleOptions {
  std::string checkpoint; ///< "" for the initial parameters
  std::string vocab;      ///< default: vocab.json beside the training data
  std::string prompt = "\n";
  /// Whether the user gave the prompt (--prompt): messages say so.
  bool promptGiven = false;
  int64_t tokens = 200;
  double temperature = 0.8; ///< 0: always the most likely character
  int64_t topK = 0;         ///< 0: every character
  std::optional<uint64_t> seed; ///< default 1
  bool profile = false;
};

/// Feeds @predict the last `context` characters and draws the next one,
/// `o.tokens` times; returns the prompt and what followed. Reads the
/// checkpoint and vocabulary before creating the backend with `make`.
Expected<std::string> sample(Model &m, const SampleOptions &o, const BackendFactory &make,
                             const Sink &out);

} // namespace kiln::train

#endif // KILN_RUNTIME_TRAIN_SAMPLER_H
