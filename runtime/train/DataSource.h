//===- DataSource.h - Batches for a model's data inputs ----------*- C++ -*-===//
//
// A DataSource produces batch i of a run as the bytes of each data input;
// batches depend only on (seed, i), so a resumed run, or a replica given the
// same source, sees the same data. Token files give random (x, y) windows
// (nanoGPT style); a directory of .npy arrays gives rows, shuffled per epoch
// or in file order, in epochs whose last partial batch either runs on into
// the next epoch (LastBatch::Wrap) or is dropped (LastBatch::Drop).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_TRAIN_DATASOURCE_H
#define KILN_RUNTIME_TRAIN_DATASOURCE_H

#include "runtime/core/Backend.h"
#include "runtime/core/Status.h"

#include <cstdint>
#include <memory>
#include <optional>
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
  /// Whole global batches in one pass over the data (0: unbounded, sampled
  /// windows).
  virtual int64_t epochBatches() const { return 0; }
  /// Steps that train `epochs` epochs: epochs x epochBatches() when the
  /// last partial batch is dropped, ceil(epochs x rows / global batch) when
  /// batches wrap; 0 for sampled windows (no epochs).
  virtual int64_t epochSteps(int64_t epochs) const { (void)epochs; return 0; }
  /// Epochs completed by the first `steps` batches (0 for windows).
  virtual int64_t epochsDone(int64_t steps) const { (void)steps; return 0; }
  /// The epoch's steps in words for the data line ("6 steps per epoch at
  /// global batch 16, the last 4 rows ..."); "" for windows.
  virtual std::string epochNote() const { return ""; }
  /// Whether a batch is token windows (progress counts tokens, not samples).
  virtual bool countsTokens() const { return false; }
};

/// This replica's part of each global batch (docs/parallel.md "The
/// multi-rank trainer"): the global batch of a step is `count` times the
/// rows of the model's data inputs (R rows: grad_accum x batch); replica
/// `index` reads rows [index R, (index+1) R) of it, a contiguous block
/// (PyTorch's DistributedSampler instead deals the epoch's order out
/// round-robin: replica r takes positions r, r + N, r + 2N, ...). So batch
/// i of N replicas together is batch i of one device compiled for N times
/// the batch, and every replica's part depends only on (seed, i, index,
/// count): a resumed run continues where it stopped.
struct DataShard {
  int index = 0, count = 1;
};

/// What a .npy source does with the rows left over when the global batch
/// does not divide an epoch (the train section's last_batch, kiln-run's
/// --last-batch). Kiln's step has a static batch, so a smaller last batch
/// (PyTorch's default) is not offered.
enum class LastBatch {
  /// The rows form one stream across epochs (tf.data's shuffle().repeat()
  /// .batch()): position p of the stream is row order_e[p mod rows] with
  /// e = p / rows, so a batch may take the end of one epoch and the start
  /// of the next; every row is read equally often.
  Wrap,
  /// Each epoch is floor(rows / global batch) steps (PyTorch's
  /// drop_last=True): batch i reads epoch i / steps-per-epoch, the last
  /// rows of each epoch's order are not read, the next epoch starts with
  /// its own order.
  Drop,
};

/// "wrap" or "drop" (the settings' spelling).
const char *lastBatchName(LastBatch l);
/// Parses "wrap" or "drop".
std::optional<LastBatch> parseLastBatch(const std::string &s);

/// Opens the data at `path` for the data inputs of entry point `fn`: a token
/// file (uint16; uint32 when named *.u32), several token files read as one
/// (a comma-separated list, a glob, or a directory of *.bin shards:
/// data::TokenShards), or a directory of .npy arrays named after the inputs.
/// `what` ("training", "validation") names it in messages. A shuffled .npy
/// source draws a uniform permutation per epoch, or with `shuffleBuffer` N >
/// 0 shuffles file order through a window of N rows (tf.data's shuffle);
/// `last` says where an epoch's batches end (token windows ignore it).
Expected<std::unique_ptr<DataSource>> openData(const std::string &path, const Model &m,
                                               const std::string &fn, uint64_t seed,
                                               bool shuffle, const char *what,
                                               DataShard shard = {},
                                               int64_t shuffleBuffer = 0,
                                               LastBatch last = LastBatch::Wrap);

/// Copies a batch into the buffers `inputs` (in the order of Batch::bytes).
Status copyBatch(Backend &e, const std::vector<int> &inputs, const Batch &b);

} // namespace kiln::train

#endif // KILN_RUNTIME_TRAIN_DATASOURCE_H
