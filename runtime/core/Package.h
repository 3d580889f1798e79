//===- Package.h - A loaded, verified .kpack ---------------------*- C++ -*-===//
//
// Package::open() reads an artifact and checks it hangs together before
// anything runs: the container (Artifact.h), the manifest's format, the
// buffer plan (Program::parse), initial values for every parameter and state
// buffer with matching dtype and shape (stored, or listed in the manifest's
// "zero_initializers" and re-created as zeros), and kernels for the requested
// target. Every failure names the file and says what to do.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CORE_PACKAGE_H
#define KILN_RUNTIME_CORE_PACKAGE_H

#include "runtime/core/Checkpoint.h"
#include "runtime/core/GpuPlan.h"
#include "runtime/core/Program.h"

#include <map>
#include <string>

namespace kiln {

/// The train section as the manifest records it (kiln.train).
struct TrainConfig {
  int64_t batch = 0, steps = 0, evalInterval = 0, evalSteps = 0, seed = 0;
  /// log_interval and checkpoint_interval; -1 where the section has none.
  int64_t logInterval = -1, checkpointInterval = -1;
  /// epochs (0: none; the section then has steps or neither) and
  /// last_batch ("drop", "wrap"; "" where the section has none).
  int64_t epochs = 0;
  std::string lastBatch;
  std::string data, valData;
};

/// The values an integer input may take because it indexes (the targets of
/// a cross-entropy, the indices of a gather): [lo, hi), and what bounds it.
/// kilnc derives it from the graph; artifacts older than it have none.
struct InputRange {
  int64_t lo = 0, hi = 0;
  std::string from; ///< e.g. "kiln.cross_entropy targets (10 classes)"
};

struct Package {
  std::string path;
  std::string model;       ///< model name
  std::string sourcePath;  ///< the model file it was compiled from
  std::string sourceHash;  ///< sha256 of that file
  std::string sourceAbsPath; ///< its absolute path (empty in artifacts older than it)
  std::string manifestJson;
  TrainConfig train;
  /// Valid ranges of integer inputs, by input name (the manifest's
  /// "range" in the functions' argument signatures).
  std::map<std::string, InputRange> inputRanges;
  program::Program program;
  ckpt::Checkpoint initial; ///< initial parameters and state
  std::string cpuBitcode;
  /// CUDA kernels (kilnc --target=cuda): the source, the launch plan, and
  /// ahead-of-time PTX/CUBIN per architecture ("sm_90" -> bytes).
  bool hasCuda = false;
  std::string cudaSource;
  gpu::Plan cudaPlan;
  std::map<std::string, std::string> cudaPtx, cudaCubin;

  static Expected<Package> open(const std::string &path);
};

/// Checks that `c` holds every persistent buffer of `p` with the right
/// dtype and shape (`origin` names the file).
Status checkPersistent(const program::Program &p, const ckpt::Checkpoint &c,
                       const std::string &origin);

/// safetensors dtype for a buffer dtype ("F32", ...).
const char *safetensorsDType(program::DType t);

} // namespace kiln

#endif // KILN_RUNTIME_CORE_PACKAGE_H
