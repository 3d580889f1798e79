//===- Shards.h - ZeRO-sharded buffers, the logical layout ------*- C++ -*-===//
//
// With ZeRO (docs/parallel.md), optimizer state (and for ZeRO-2 gradients)
// is sharded over a mesh axis: such a buffer holds block d (d = the
// device's coordinate on the axis) of the row-major flattening of the
// logical tensor, zero-padded to a multiple of the axis size N; a block is
// ceil(numel / N) elements (conventions 6: program::Buffer::shardAxis and
// logicalShape). Checkpoints always hold the logical tensor, so a run
// resumes on any device count: on save the blocks are all-gathered and the
// padding dropped; on load each device takes its block.
//
// Tensor parallelism shards a parameter (and its optimizer state) along one
// logical dimension instead (Buffer::shardDim, shardOuter): dimension D
// (size S) is viewed as [K, S/K], and device c holds block c of N of each of
// the K parts, concatenated in k order, so its buffer is the logical shape
// with S replaced by S/N; no padding (S is a multiple of K * N). Checkpoints
// hold the logical tensor here too. Both at once (ZeRO over dp of a
// tensor-parallel optimizer state, Buffer::zeroAxis): the per-dimension
// block is cut first, then ZeRO's block of its flattening.
//
// These helpers know nothing about communicators or backends: they cut a
// logical tensor into a block and join gathered blocks back, and say which
// devices share a buffer's blocks.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_TRAIN_SHARDS_H
#define KILN_RUNTIME_TRAIN_SHARDS_H

#include "runtime/core/Program.h"
#include "runtime/core/Status.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::train {

/// How a persistent buffer is sharded; `axis` empty: it is not (the buffer
/// holds the whole tensor, its shape the logical one).
struct ShardSpec {
  std::string axis;
  std::vector<int64_t> logicalShape;
  /// Tensor parallelism: the logical dimension split over `axis` and its
  /// outer parts (Buffer::shardDim, shardOuter); dim -1: ZeRO's flattening.
  int64_t dim = -1;
  int64_t outer = 1;
  /// ZeRO inside the per-dimension split (Buffer::zeroAxis): the device's
  /// block of dimension `dim` is itself cut into blocks over this axis.
  std::string zeroAxis;
  bool sharded() const { return !axis.empty(); }
  /// Sharded along a dimension (tensor parallelism) rather than ZeRO.
  bool perDim() const { return sharded() && dim >= 0; }
  int64_t logicalElements() const;
};

/// The buffer's sharding, from Buffer::shardAxis and Buffer::logicalShape
/// where this build's Program has them (unsharded otherwise).
ShardSpec shardOf(const program::Buffer &b);
/// shardOf() for every buffer of `p`, by id.
std::vector<ShardSpec> shardSpecs(const program::Program &p);

/// Elements per block: ceil(numel / parts).
int64_t blockElements(int64_t numel, int parts);
/// Block `index` of `parts` of a logical tensor's bytes (`numel` elements
/// of `elemBytes`), zero-padded to blockElements() elements.
std::string cutBlock(const std::string &logical, int64_t numel, int elemBytes,
                     int parts, int index);
/// The logical tensor's bytes from its blocks in order, concatenated
/// (`parts` blocks of blockElements() elements): the padding dropped.
std::string joinBlocks(const std::string &gathered, int64_t numel,
                       int elemBytes);

/// Device `index`'s block of `parts` of a logical tensor (`logical`, of
/// `shape` with elements of `elemBytes`) split along dimension `dim` as
/// `outer` parts (the per-dimension form above): for every index of the
/// dimensions before `dim` and every part k, rows [c*r, (c+1)*r) of part k,
/// r = shape[dim] / (outer * parts). Refuses a dimension out of range or a
/// size that outer * parts does not divide, naming `what`.
Expected<std::string> cutDimBlock(const std::string &logical,
                                  const std::vector<int64_t> &shape,
                                  int64_t dim, int64_t outer, int elemBytes,
                                  int parts, int index,
                                  const std::string &what);
/// The inverse: the logical tensor from the `parts` local blocks
/// concatenated in coordinate order (as an all_gather over the axis group
/// delivers them).
Expected<std::string> joinDimBlocks(const std::string &gathered,
                                    const std::vector<int64_t> &shape,
                                    int64_t dim, int64_t outer, int elemBytes,
                                    int parts, const std::string &what);

/// The devices that differ from `device` only along mesh axis `axis`, in
/// order of their coordinate on it (a communicator group), and `device`'s
/// coordinate on the axis. An unknown axis gives {device} and 0.
std::vector<int> axisGroup(const program::Mesh &mesh, int device,
                           const std::string &axis, int *coordinate = nullptr);

} // namespace kiln::train

#endif // KILN_RUNTIME_TRAIN_SHARDS_H
