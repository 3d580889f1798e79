//===- Nccl.h - GPUs through NCCL -------------------------------*- C++ -*-===//
//
// Built where the CUDA toolkit's NCCL is found (KILN_HAVE_NCCL is then
// defined for users of this library). Buffers are device memory. Two ways to
// make the communicators:
//   - one process driving several GPUs (`--device cuda:0,1,2,3`):
//     createLocal() (ncclCommInitAll), rank i on devices[i]; drive each rank
//     from its own thread, as with InProcess;
//   - one process per GPU (`mpirun -np N kiln-run ... --device cuda`):
//     createWithBootstrap(), where rank 0's NCCL unique id reaches the others
//     through a broadcast on a host communicator (MPI), as llm.c does.
// NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), so a
// one-GPU machine runs a world of one.
//
// Streams: every collective runs on the communication stream, after the work
// enqueued so far on the compute stream (an event), so the executor overlaps
// communication with compute; computeWaits() orders later compute work after
// the collectives. A blocking communicator (the default) returns from each
// call once the collective finished; a non-blocking one returns once it is
// enqueued and the caller calls computeWaits() or synchronize().
//
// Nothing hangs: synchronize() (and every blocking call) polls the stream
// and ncclCommGetAsyncError against the deadline; a missed deadline or an
// asynchronous error calls ncclCommAbort on every communicator of the world
// and fails with a message naming the rank, the op and the context.
//
// Determinism: NCCL combines in its own order (ring or tree), which is
// reproducible run to run for a fixed topology and NCCL_ALGO=Ring, but not
// the CPU communicators' member order: NCCL results are not bit-equal to
// InProcess/Mpi results.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_COMM_NCCL_H
#define KILN_RUNTIME_COMM_NCCL_H

#include "runtime/comm/Communicator.h"

#include <memory>

namespace kiln::comm {

struct NcclState;
struct NcclWorld;

class NcclCommunicator final : public Communicator {
public:
  /// One communicator per entry of `devices` (CUDA ordinals, distinct),
  /// rank i on devices[i], in one process.
  static Expected<std::vector<std::unique_ptr<NcclCommunicator>>>
  createLocal(const std::vector<int> &devices);
  /// This process's rank of a world with one process per GPU: `bootstrap`
  /// (an MPI communicator: rank and size are taken from it) carries rank 0's
  /// NCCL unique id to every rank; this rank drives GPU `device`.
  static Expected<std::unique_ptr<NcclCommunicator>>
  createWithBootstrap(Communicator &bootstrap, int device);
  ~NcclCommunicator() override;

  int rank() const override;
  int size() const override;
  const char *kind() const override { return "nccl"; }
  /// The CUDA ordinal this rank drives.
  int device() const;

  Status allReduce(const void *send, void *recv, int64_t count,
                   ElementType type, Reduction r,
                   const Group &group = {}) override;
  Status reduceScatter(const void *send, void *recv, int64_t recvCount,
                       ElementType type, Reduction r,
                       const Group &group = {}) override;
  Status allGather(const void *send, void *recv, int64_t sendCount,
                   ElementType type, const Group &group = {}) override;
  Status broadcast(void *buffer, int64_t count, ElementType type, int root,
                   const Group &group = {}) override;
  Status send(const void *buffer, int64_t count, ElementType type,
              int peer) override;
  Status recv(void *buffer, int64_t count, ElementType type, int peer) override;
  /// ncclCommAbort on every communicator of this process's world; every
  /// pending and later call fails with `why`.
  void abort(const std::string &why) override;

  /// The streams (CUstream / cudaStream_t): collectives run on `comm` after
  /// the work enqueued on `compute` so far. nullptr `compute`: no ordering;
  /// nullptr `comm`: a stream the communicator creates.
  Status setStreams(void *compute, void *comm);
  void setBlocking(bool blocking);
  /// Makes the compute stream wait (on the device, not the host) for every
  /// collective enqueued so far.
  Status computeWaits();
  /// Waits on the host for every collective enqueued so far, polling against
  /// the deadline (see above).
  Status synchronize();
  /// ncclCommSplit for each group (lists of world ranks, in group order);
  /// every rank of the world calls it with the same list, once, before
  /// using any of the groups (a split needs every rank).
  Status prepareGroups(const std::vector<Group> &groups);

private:
  NcclCommunicator();
  std::unique_ptr<NcclState> state_;
};

} // namespace kiln::comm

#endif // KILN_RUNTIME_COMM_NCCL_H
