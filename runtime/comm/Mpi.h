//===- Mpi.h - One process per rank, through MPI ----------------*- C++ -*-===//
//
// `mpirun -np N kiln-run train ...`: one rank per process (built only where
// MPI is found; KILN_HAVE_MPI is then defined for users of this library).
//
// Determinism: sums are combined exactly as InProcess combines them
// (runtime/comm/Reduce.h), never by MPI's own reduction, so the two give the
// same bits: an all_reduce is an all-to-all of blocks, each member sums its
// block over the members in member order, then an all-gather; a
// reduce_scatter is the first two steps. Both phases are nonblocking
// point-to-point exchanges (MPI_Irecv/MPI_Isend with every other member),
// so a timeout can name the members that did not answer.
//
// Nothing hangs: every call is nonblocking (MPI_Isend/MPI_Irecv,
// MPI_Ibcast), polled with MPI_Test against the deadline. A missed
// deadline, an MPI error, or abort() prints the message (rank, op,
// context) to stderr and calls MPI_Abort, which ends every rank of the job
// (a pending MPI call cannot be cancelled, so there is no recovering).
//
// Threads: calls may come from any one thread at a time (MPI is initialised
// with MPI_THREAD_MULTIPLE where the library offers it, at least
// MPI_THREAD_SERIALIZED). A group's communicator is made with
// MPI_Comm_create_group the first time the group is used; that call blocks
// until every member makes it (make each group once at start-up).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_COMM_MPI_H
#define KILN_RUNTIME_COMM_MPI_H

#include "runtime/comm/Communicator.h"

#include <functional>
#include <memory>

namespace kiln::comm {

struct MpiState;

class MpiCommunicator final : public Communicator {
public:
  /// Initialises MPI once per process (MPI_Init_thread; MPI_Finalize runs at
  /// exit) and returns MPI_COMM_WORLD's communicator. Checks the launcher's
  /// environment against MPI's world (runtime/comm/Launcher.h).
  static Expected<std::unique_ptr<MpiCommunicator>> create();
  ~MpiCommunicator() override;

  int rank() const override;
  int size() const override;
  const char *kind() const override { return "mpi"; }

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

  /// Prints `why` (with this rank) to stderr and ends the job: MPI_Abort.
  [[noreturn]] void abort(const std::string &why) override;

  /// The exit code MPI_Abort gives mpirun on a timeout or abort() (default 3).
  void setAbortExitCode(int code);
  /// Called with the message just before MPI_Abort (e.g. to flush logs).
  void setBeforeAbort(std::function<void(const std::string &)> hook);

private:
  MpiCommunicator();
  std::unique_ptr<MpiState> state_;
};

/// Finalises MPI now if it was initialised (it also runs at exit); later
/// calls to MpiCommunicator::create() fail.
void mpiFinalize();

} // namespace kiln::comm

#endif // KILN_RUNTIME_COMM_MPI_H
