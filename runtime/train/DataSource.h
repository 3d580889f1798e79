//===- DataSource.h - Batches for a model's data inputs ----------*- C++ -*-===//
//
// A DataSource produces batch i of a run as the bytes of each data input;
// batches depend only on (seed, i), so a resumed run, or a replica given the
// same source, sees the same data. Token files give random (x, y) windows
// (nanoGPT style); a directory of .npy arrays gives rows, shuffled per epoch
// or in file order.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_TRAIN_DATASOURCE_H
#define KILN_RUNTIME_TRAIN_DATASOURCE_H

#include "runtime/core/Backend.h"
#include "runtime/core/Status.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kiln::train {

struct Model;

/// One batch: the bytes of each data input, ready to copy into its buffer.
struct Batch {
  std::vector<std::string> bytes;
};

/// batch() may be called from a prefetching thread while the caller runs
/// steps; implementations keep it safe to call concurrently.
class DataSource {
public:
  virtual ~DataSource() = default;
  virtual Batch batch(uint64_t index) const = 0;
  virtual std::string describe() const = 0;
  /// Batches in one pass over the data (0: unbounded, sampled windows).
  virtual int64_t epochBatches() const { return 0; }
  /// Whether a batch is token windows (progress counts tokens, not samples).
  virtual bool countsTokens() const { return false; }
};

/// This replica's part of each global batch (DistributedSampler
/// semantics, docs/parallel.md "The multi-rank trainer"): the global batch
/// of a step is `count` times the rows of the model's data inputs (R rows:
/// grad_accum x batch); replica `index` reads rows [index R, (index+1) R)
/// of it. So batch i of N replicas together is batch i of one device
/// compiled for N times the batch, and every replica's part depends only on
/// (seed, i, index, count): a resumed run continues where it stopped.
struct DataShard {
  int index = 0, count = 1;
};

/// Opens the data at `path` for the data inputs of entry point `fn`: a token
/// file (uint16; uint32 when named *.u32), several token files read as one
/// (a comma-separated list, a glob, or a directory of *.bin shards:
/// data::TokenShards), or a directory of .npy arrays named after the inputs.
/// `what` ("training", "validation") names it in messages. A shuffled .npy
/// source draws a uniform permutation per epoch, or with `shuffleBuffer` N >
/// 0 shuffles file order through a window of N rows (tf.data's shuffle).
Expected<std::unique_ptr<DataSource>> openData(const std::string &path, const Model &m,
                                               const std::string &fn, uint64_t seed,
                                               bool shuffle, const char *what,
                                               DataShard shard = {},
                                               int64_t shuffleBuffer = 0);

/// Copies a batch into the buffers `inputs` (in the order of Batch::bytes).
Status copyBatch(Backend &e, const std::vector<int> &inputs, const Batch &b);

} // namespace kiln::train

#endif // KILN_RUNTIME_TRAIN_DATASOURCE_H
