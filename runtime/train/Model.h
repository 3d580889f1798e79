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

#include "runtime/comm/Communicator.h"
#include "runtime/core/Backend.h"
#include "runtime/core/Checkpoint.h"
#include "runtime/core/Package.h"
#include "runtime/train/Output.h"
#include "runtime/train/Shards.h"

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kiln::train {

/// Creates the backend for a package: Devices.h's makeBackend for a named
/// device, or anything else that implements Backend (a test's fake).
using BackendFactory = std::function<Expected<std::unique_ptr<Backend>>(const Package &)>;

struct Model {
  Package pkg;
  std::unique_ptr<Backend> exec;
  /// Multi-device programs: this replica's device (its index in the mesh,
  /// and its rank in `comm`) and the host-memory communicator the trainer's
  /// own collectives and the checkpoint's gathers go through (the backend's
  /// may be another: NCCL's); null for one device.
  comm::Communicator *comm = nullptr;
  int device = 0;
  /// Each buffer's ZeRO sharding (conventions 6), by id; filled from the
  /// plan by attach() when empty (a test may set it first).
  std::vector<ShardSpec> shards;

  /// Reads and verifies the artifact; no code is generated yet, so data
  /// files can be checked before the (possibly long) kernel compile.
  static Expected<std::unique_ptr<Model>> open(const std::string &artifact);

  /// Creates the backend with `make` (it compiles or loads the kernels and
  /// allocates the arena) and writes the initial parameters and state.
  Status compile(const BackendFactory &make, bool profile = false);
  /// Takes a backend created elsewhere and writes the initial values.
  Status attach(std::unique_ptr<Backend> backend, bool profile = false);

  const program::Program &prog() const { return pkg.program; }

  /// Writes every parameter and state tensor of `c` (the logical layout)
  /// into the arena; a sharded buffer gets this device's block. With
  /// pipeline stages, only the tensors of this device's stage (and the
  /// stage -1 ones): the others are not in its arena.
  Status setPersistent(const ckpt::Checkpoint &c);
  /// Reads every parameter and state tensor back in the logical layout.
  /// Sharded buffers are all-gathered over their axis through `comm`: every
  /// device of the group must call it (a collective). With pipeline
  /// stages, a tensor of stage s is read (and gathered) by the devices of
  /// stage s and broadcast from them to every device of the "pp" group, in
  /// buffer id order: every device of the mesh must call it, and each gets
  /// every tensor.
  Expected<ckpt::Checkpoint> getPersistent();
  /// Whether getPersistent() communicates (some buffer is sharded, or
  /// lives on one pipeline stage of several).
  bool hasShardedState() const;
  /// Whether this device holds buffer `id` (its pipeline stage's, or every
  /// device's).
  bool holds(int id) const { return prog().holds(device, id); }
  /// A float32 scalar result that may live on one pipeline stage only (a
  /// loss scaler's state): read there and broadcast over "pp", so every
  /// device of the group must call it; a stage -1 buffer is just read.
  /// NaN when it cannot be read.
  float stageScalar(int id);

  /// Data inputs of `fn` (its Input buffers other than "step" and
  /// "replica"; none when the program has no `fn`).
  std::vector<int> dataInputs(const std::string &fn) const;
  /// The "step" input of `fn`, or -1.
  int stepInput(const std::string &fn) const;
  /// The "replica" input of `fn` (a data-parallel step: the device's
  /// coordinate on the dp axis, mixed into dropout seeds), or -1.
  int replicaInput(const std::string &fn) const;
  /// This device's coordinate on the data-parallel axis ("dp"; 0 without).
  int replica() const;
  /// The "tp_rank" input of `fn` (tensor parallelism with dropout of split
  /// values: the device's coordinate on tp mixes into dropout seeds), or -1.
  int tpRankInput(const std::string &fn) const;
  /// The input of `fn` named `name` (step, replica, tp_rank), or -1.
  int inputNamed(const std::string &fn, const std::string &name) const;
  /// This device's coordinate on the "tp" mesh axis (0 without one).
  int tpRank() const;
  /// The result of `fn` called `name`, or -1.
  int result(const std::string &fn, const std::string &name) const;
  /// Vocabulary size, from @predict's logits (last dimension), or 0.
  int64_t vocabSize() const;
  /// A float32 scalar result (NaN when it cannot be read).
  float scalar(int id);

private:
  /// Broadcasts tensor `t` of stage-owned buffer `b` (whole, logical) from
  /// its stage's device of this device's "pp" group to the others; `t`
  /// holds it on the root and receives it elsewhere.
  Status receiveStageTensor(const program::Buffer &b, const ShardSpec &spec,
                            ckpt::Tensor &t);
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
/// Writes every persistent tensor and where training continues (atomic),
/// in the logical layout. With sharded state every device of the mesh must
/// call it (the blocks are gathered); only those with `write` set write
/// the file (rank 0). Without sharded state a device with `write` unset
/// does nothing.
Status saveCheckpoint(Model &m, const std::string &path, int64_t nextStep, uint64_t seed,
                      bool write = true);
/// What a checkpoint is read for: to continue training (`--resume`), or
/// for its parameters (eval, sample). Only the advice in errors differs.
enum class CheckpointUse { Resume, Parameters };
/// Reads a checkpoint and checks it against the model's logical shapes
/// (before any code is generated; any device count); Model::setPersistent
/// applies it once the arena exists. A checkpoint of another model (its
/// `model` metadata names a different one), one that lacks a tensor the
/// model has, or holds one the model has not (an Adam model's moments
/// resumed into an SGD build), derived low copies and the loss scaler's
/// state aside, is refused, naming both models and pointing to `--init`
/// (fresh optimizer state). Only when the tensors match is a checkpoint of
/// a different model-file version a warning (unless quiet).
Expected<ckpt::Checkpoint> readCheckpoint(const Model &m, const std::string &path, bool quiet,
                                          const Sink &out,
                                          CheckpointUse use = CheckpointUse::Resume);

/// `kiln-run train --init FILE` (docs/runtime.md "Starting from existing
/// weights"): every parameter from a safetensors file, by name, with fresh
/// optimizer state.
struct InitWeights {
  std::string path; ///< the safetensors file
  /// --init-rename FROM=TO: a file tensor whose name starts with FROM is
  /// matched as TO followed by the rest of its name (the longest FROM that
  /// fits wins; a name no rule fits is matched as it is).
  std::vector<std::pair<std::string, std::string>> renames;
  /// --init-ignore NAME: file tensors (their names in the file) left out;
  /// NAME ending in '*' is a prefix.
  std::vector<std::string> ignore;
};
/// The error for --init and --resume given together (ok when not).
Status initWithResume(const std::string &init, const std::string &resume);
/// Parses `FROM=TO` (--init-rename's value).
Expected<std::pair<std::string, std::string>> parseInitRename(const std::string &value);
/// The model's initial values with every parameter (Role::Param) replaced
/// by the tensor of `w.path` that matches its name, converted to float32
/// from F64, F16 or BF16 (a note says so unless quiet); the optimizer
/// state, loss scaler and step stay the artifact's initial ones, and the
/// mixed-precision low copies are left out so that Model::setPersistent
/// derives them from the loaded parameters. A Kiln checkpoint's optimizer
/// state tensors (m:, v:, momentum:, lowp:, the scaler's) are skipped. A
/// parameter without a tensor, a tensor that is no parameter, and one of
/// the wrong shape or dtype are one error listing each, with what to do.
/// Checked against the logical shapes before any code is generated; apply
/// it with Model::setPersistent (any device count, sharded or not).
Expected<ckpt::Checkpoint> readInitWeights(const Model &m, const InitWeights &w, bool quiet,
                                           const Sink &out);
/// The step a checkpoint continues from (0 when it does not say).
int64_t checkpointStep(const ckpt::Checkpoint &c);
/// Rows of data one training step consumes over all data-parallel
/// replicas: the first @train_step data input's leading dimension (the
/// per-device batch times grad_accum) times the devices on the "dp" axis.
/// 0 when @train_step takes no data input on this device.
int64_t globalBatchRows(const Model &m);
/// Data-parallel replicas (devices on the "dp" axis; 1 without one).
int64_t dataParallelDevices(const Model &m);
/// The global batch a checkpoint was trained with and the devices it ran
/// on (its "global_batch" and "dp_devices" metadata); 0 for a checkpoint
/// written before they were recorded.
struct CheckpointBatch {
  int64_t globalBatch = 0;
  int64_t devices = 0;
};
CheckpointBatch checkpointBatch(const ckpt::Checkpoint &c);

} // namespace kiln::train

#endif // KILN_RUNTIME_TRAIN_MODEL_H
