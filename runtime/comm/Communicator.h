//===- Communicator.h - Collectives between the devices of a run -*- C++ -*-===//
//
// One interface, three implementations (docs/parallel.md):
//   - InProcess: N devices in one process (`kiln-run --device cpu:N`), one
//     thread each, exchanging through shared memory;
//   - Mpi: one process per rank (`mpirun -np N kiln-run ...`);
//   - Nccl: GPUs, one process driving several or one process per GPU.
//
// Contract, the same for all three:
//   - every member of a group makes the same calls in the same order (the
//     compiled step guarantees it; ranks check it at start-up);
//   - `group` lists world ranks in group order and contains rank(); empty
//     means every rank, in rank order;
//   - buffers are this rank's memory (host memory for InProcess and Mpi,
//     device memory for Nccl); send == recv (in place) is allowed for
//     all_reduce, and for reduce_scatter/all_gather when recv is this
//     member's block of send (offset member * blockBytes);
//   - sums (and means) are combined in a fixed order, member 0 first, so a
//     run is bitwise reproducible and the CPU communicators agree bit for
//     bit: result[e] = ((x0[e] + x1[e]) + x2[e]) + ...; a mean divides that
//     sum by the group size;
//   - nothing hangs: every call fails after timeout() seconds with a
//     message naming this rank, the op, the context (say "step 12, bucket
//     3") and, where the implementation can tell, the ranks that did not
//     arrive; abort() makes every pending and later call of every member
//     fail at once.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_COMM_COMMUNICATOR_H
#define KILN_RUNTIME_COMM_COMMUNICATOR_H

#include "runtime/core/ElementType.h"
#include "runtime/core/Status.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kiln::comm {

/// What a call says when it fails because another member aborted the run
/// ("... failed: the run was aborted (<why>)"); abortedByOther() tells
/// such a knock-on from the failure that caused it.
inline constexpr char kRunAborted[] = "the run was aborted";
inline bool abortedByOther(const Status &s) {
  return s.message().find(std::string(kRunAborted) + " (") != std::string::npos;
}

enum class Reduction { Sum, Mean, Max, Min };
const char *reductionName(Reduction r); ///< "sum", "mean", ...

/// How the CPU communicators add the members' values (sum and mean):
///   - Members (the default): ((x0 + x1) + x2) + ..., member 0 first;
///   - Tree: a fixed pairwise tree, ((x0 + x1) + (x2 + x3)) + ..., level by
///     level, an odd last member carried up. When each of N = 2^k devices
///     holds the pairwise-tree sum of its own contiguous 2^j chunks of a
///     fixed chunking, the result is the pairwise tree over all chunks: the
///     same bits for any power-of-two device count (docs/parallel.md).
/// Max and min do not depend on the order. Nccl refuses Tree.
enum class SumOrder { Members, Tree };

/// World ranks in group order; empty = all ranks.
using Group = std::vector<int>;

class Communicator {
public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// "in-process", "mpi" or "nccl".
  virtual const char *kind() const = 0;

  /// Every member gets the group's `count` elements combined by `r`.
  virtual Status allReduce(const void *send, void *recv, int64_t count, ElementType type,
                           Reduction r, const Group &group = {}) = 0;
  /// `send` holds groupSize * recvCount elements; member i receives block i
  /// of the combination.
  virtual Status reduceScatter(const void *send, void *recv, int64_t recvCount,
                               ElementType type, Reduction r, const Group &group = {}) = 0;
  /// Every member receives the group's `sendCount`-element blocks in member
  /// order (groupSize * sendCount elements).
  virtual Status allGather(const void *send, void *recv, int64_t sendCount, ElementType type,
                           const Group &group = {}) = 0;
  /// Member `root` (an index into the group) sends `count` elements of
  /// `buffer` to every other member's `buffer`.
  virtual Status broadcast(void *buffer, int64_t count, ElementType type, int root,
                           const Group &group = {}) = 0;
  /// Point to point with world rank `peer`; a send meets the peer's recv.
  virtual Status send(const void *buffer, int64_t count, ElementType type, int peer) = 0;
  virtual Status recv(void *buffer, int64_t count, ElementType type, int peer) = 0;

  /// Makes every pending and later call of every member fail with `why`
  /// (InProcess and Nccl: at once; Mpi: MPI_Abort ends the job).
  virtual void abort(const std::string &why) = 0;

  /// Seconds a call may wait for the other members (default 300).
  void setTimeout(double seconds) { timeout_ = seconds; }
  double timeout() const { return timeout_; }
  /// Where the caller is, for error messages ("step 12, all_reduce 3 of 5").
  void setContext(std::string context) { context_ = std::move(context); }
  const std::string &context() const { return context_; }
  /// The order of sums (every member sets the same).
  void setSumOrder(SumOrder order) { sumOrder_ = order; }
  SumOrder sumOrder() const { return sumOrder_; }
  /// Whether someone is blocked until the call in progress returns (the
  /// default). A communication thread's owner clears it while the call
  /// overlaps its compute: a polling communicator (Mpi) then polls
  /// sparingly (sleeps backing off to 0.5 ms) instead of eagerly, leaving
  /// the cores to compute. May be set from another thread than the caller's.
  void setWaitedFor(bool waited) { waitedFor_.store(waited, std::memory_order_relaxed); }
  bool waitedFor() const { return waitedFor_.load(std::memory_order_relaxed); }

protected:
  double timeout_ = 300;
  std::atomic<bool> waitedFor_{true};
  std::string context_;
  SumOrder sumOrder_ = SumOrder::Members;
};

} // namespace kiln::comm

#endif // KILN_RUNTIME_COMM_COMMUNICATOR_H
