//===- Checkpoint.h - safetensors checkpoints, written atomically -*- C++ -*-===//
//
// A checkpoint is a safetensors file: an 8-byte little-endian header length,
// a JSON header naming each tensor's dtype, shape and byte range, and the raw
// data. Kiln adds `__metadata__` entries (step, RNG seed, data position, ...)
// and, last, `kiln.file_crc32`: the CRC-32 of the whole file computed with
// its own eight digits as '0's, so a flipped bit anywhere (a tensor's name,
// shape or offsets, the step, the data) is caught on load. Checkpoints
// written before it have `kiln.crc32`, a CRC-32 of the data section only,
// and load with that check. Files other tools wrote (without either) load
// too, unverified.
//
// Writes go to `<path>.tmp.<pid>`, are fsync'ed, renamed over `path` and the
// directory is fsync'ed: a crash leaves either the old or the new checkpoint.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CORE_CHECKPOINT_H
#define KILN_RUNTIME_CORE_CHECKPOINT_H

#include "runtime/core/Status.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kiln::ckpt {

struct Tensor {
  std::string name;
  std::string dtype; ///< safetensors dtype: F64 F32 F16 BF16 I64 I32 U8 ...
  std::vector<int64_t> shape;
  std::string bytes; ///< little-endian element data
};

struct Checkpoint {
  std::vector<Tensor> tensors;
  std::map<std::string, std::string> metadata;
  /// What read() or parse() checked: the whole file, the data only (an
  /// older Kiln's checkpoint), or nothing (a file without a CRC entry).
  enum class Verified { None, Data, File } verified = Verified::None;
  const Tensor *find(const std::string &name) const;
};

/// Bytes per element of a safetensors dtype, 0 if unknown.
int dtypeWidth(const std::string &dtype);
uint32_t crc32(const void *data, size_t size, uint32_t crc = 0);

/// The file image write() stores (also used for artifact sections).
Expected<std::string> serialize(const Checkpoint &checkpoint);
Status write(const std::string &path, const Checkpoint &checkpoint);
/// Whether write() can put a checkpoint at `path`: not a directory, and its
/// folder takes a new file (created and removed here). A training run asks
/// before its first step, so a bad path costs no training.
Status checkWritable(const std::string &path);
/// Removes the temporary files (`PATH.tmp.PID`) that write() left next to
/// `path` when its process was killed mid-write (SIGKILL, a node that went
/// down): only those whose process no longer runs on this machine. Returns
/// the removed files' names.
std::vector<std::string> removeStaleTemporaries(const std::string &path);
/// Verifies an in-memory image; `origin` names it in messages.
Expected<Checkpoint> parse(const std::string &image, const std::string &origin);
/// Verifies everything before returning: header size and JSON, dtypes,
/// shapes against byte ranges, ranges inside the file and not overlapping,
/// and the CRC when present.
Expected<Checkpoint> read(const std::string &path);

} // namespace kiln::ckpt

#endif // KILN_RUNTIME_CORE_CHECKPOINT_H
