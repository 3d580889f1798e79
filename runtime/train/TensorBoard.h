//===- TensorBoard.h - Scalars in TensorBoard's event files ------*- C++ -*-===//
//
// `kiln-run train --tensorboard DIR` writes the run's scalars (loss, lr,
// grad norm, validation loss, throughput, step time) to an event file that
// TensorBoard reads (`tensorboard --logdir DIR`), docs/profiling.md
// "TensorBoard".
//
// The format, from its published facts (no protobuf library):
//   - the file: DIR/events.out.tfevents.<unix seconds>.<hostname>.<pid>.kiln,
//     a sequence of TFRecords: uint64 length (little-endian), uint32 masked
//     CRC-32C of those 8 bytes, the data, uint32 masked CRC-32C of the data;
//     masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8;
//   - each record is a serialized tensorboard.Event (event.proto): wall_time
//     = 1 (double), step = 2 (int64), file_version = 3 (string), summary = 5
//     (Summary); the first has file_version "brain.Event:2";
//   - Summary (summary.proto): value = 1 (repeated Value); Value: tag = 1
//     (string), simple_value = 2 (float). One Event per scalar point.
//
// Errors are sticky: after the first failed write (a full disk) nothing more
// is written and status() keeps the error; training goes on and saves its
// checkpoint, and kiln-run reports the error at the end.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_TRAIN_TENSORBOARD_H
#define KILN_RUNTIME_TRAIN_TENSORBOARD_H

#include "runtime/core/Status.h"
#include "runtime/train/Output.h"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::train {

struct TrainOptions;

/// The encodings, exposed for the unit tests.
namespace tfrecord {
/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of `n` bytes.
uint32_t crc32c(const void *data, size_t n);
/// The TFRecord mask of a CRC.
uint32_t masked(uint32_t crc);
/// Protobuf wire encodings appended to `out`.
void putVarint(std::string &out, uint64_t v);
void putFixed32(std::string &out, uint32_t v);
void putFixed64(std::string &out, uint64_t v);
/// One framed record holding `data`.
std::string record(std::string_view data);
/// A serialized Event: the file's first (file_version "brain.Event:2").
std::string versionEvent(double wallTime);
/// A serialized Event holding one scalar.
std::string scalarEvent(double wallTime, int64_t step, std::string_view tag, float value);
} // namespace tfrecord

/// One scalar point.
struct Scalar {
  std::string tag;
  float value = 0;
};

/// An open event file.
class TensorBoardWriter {
public:
  /// Creates `dir` (and its parents) and a new event file in it, and writes
  /// the version record. Errors name `dir`.
  static Expected<std::unique_ptr<TensorBoardWriter>> open(const std::string &dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter &) = delete;
  TensorBoardWriter &operator=(const TensorBoardWriter &) = delete;

  /// Writes one Event per value at `step` (wall time now) and flushes them
  /// to the file. After an error, writes nothing and returns it again.
  Status write(int64_t step, const std::vector<Scalar> &values);
  /// Closes the file (also done by the destructor); the first error so far.
  Status close();
  /// The first error so far (ok when none).
  const Status &status() const { return status_; }
  const std::string &path() const { return path_; }

private:
  TensorBoardWriter() = default;
  Status append(const std::string &bytes);

  int fd_ = -1;
  std::string dir_, path_;
  Status status_ = Status::ok();
};

/// Makes `o` write the trainer's log points and evaluations to `w` (rank 0
/// calls them), after any callbacks `o` already has. Tags: train/loss,
/// train/lr, train/grad_norm, perf/tokens_per_second (samples_per_second
/// for non-token data), perf/step_time_ms, val/loss, val/accuracy, and
/// with loss scaling train/loss_scale and train/skipped_steps. The
/// first write error is reported once to `out` as a warning.
void attachTensorBoard(TrainOptions &o, std::shared_ptr<TensorBoardWriter> w, Sink out);

} // namespace kiln::train

#endif // KILN_RUNTIME_TRAIN_TENSORBOARD_H
