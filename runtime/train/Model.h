//===- Model.h - A loaded artifact with its backend --------------*- C++ -*-===//
//
// A Model is one replica's view of a compiled program: the verified package
// and the backend that holds its arena. The trainer, evaluation, sampling
// and `check` work on Models; nothing here is global, so N replicas (threads
// of one process, or processes) each own one.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_TRAIN_MODEL_H
#define KILN_RUNTIME_TRAIN_MODEL_H

#include "runtime/core/Backend.h"
#include "runtime/core/Checkpoint.h"
#include "runtime/core/Package.h"
#include "runtime/train/Output.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kiln::train {

/// Creates the backend for a package: Devices.h's makeBackend for a named
/// device, or anything else that implements Backend (a test's fake).
using BackendFactory = std::function<Expected<std::unique_ptr<Backend>>(const Package &)>;

struct Model {
  Package pkg;
  std::unique_ptr<Backend> exec;

  /// Reads and verifies the artifact; no code is generated yet, so data
  /// files can be checked before the (possibly long) kernel compile.
  static Expected<std::unique_ptr<Model>> open(const std::string &artifact);

  /// Creates the backend with `make` (it compiles or loads the kernels and
  /// allocates the arena) and writes the initial parameters and state.
  Status compile(const BackendFactory &make, bool profile = false);
  /// Takes a backend created elsewhere and writes the initial values.
  Status attach(std::unique_ptr<Backend> backend, bool profile = false);

  const program::Program &prog() const { return pkg.program; }

  /// Writes every parameter and state tensor of `c` into the arena.
  Status setPersistent(const ckpt::Checkpoint &c);
  /// Reads every parameter and state tensor back.
  Expected<ckpt::Checkpoint> getPersistent();

  /// Data inputs of `fn` (its Input buffers other than "step"; none when
  /// the program has no `fn`).
  std::vector<int> dataInputs(const std::string &fn) const;
  /// The "step" input of `fn`, or -1.
  int stepInput(const std::string &fn) const;
  /// The result of `fn` called `name`, or -1.
  int result(const std::string &fn, const std::string &name) const;
  /// Vocabulary size, from @predict's logits (last dimension), or 0.
  int64_t vocabSize() const;
  /// A float32 scalar result (NaN when it cannot be read).
  float scalar(int id);
};

/// Writes `values` (int64) into an integer buffer of its dtype.
Status storeInts(Backend &e, int id, const int64_t *values, int64_t n);

bool pathExists(const std::string &p);
bool isDirectory(const std::string &p);
/// The folder part of a path ("." when there is none).
std::string dirOf(const std::string &p);
/// Finds a data path: as given, else next to the model file.
std::string resolvePath(const std::string &p, const Package &pkg);

/// MODEL.kpack -> MODEL.ckpt.safetensors.
std::string defaultCheckpoint(const std::string &artifact);
/// Writes every persistent tensor and where training continues (atomic).
Status saveCheckpoint(Model &m, const std::string &path, int64_t nextStep, uint64_t seed);
/// Reads a checkpoint and checks it against the model (before any code is
/// generated); Model::setPersistent applies it once the arena exists. A
/// checkpoint of a different model-file version is a warning (unless quiet).
Expected<ckpt::Checkpoint> readCheckpoint(const Model &m, const std::string &path, bool quiet,
                                          const Sink &out);
/// The step a checkpoint continues from (0 when it does not say).
int64_t checkpointStep(const ckpt::Checkpoint &c);

} // namespace kiln::train

#endif // KILN_RUNTIME_TRAIN_MODEL_H
