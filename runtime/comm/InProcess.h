//===- InProcess.h - N devices of one process, through shared memory -*- C++
//-*-===//
//
// `kiln-run --device cpu:N`: N ranks, one thread each, share an
// InProcessWorld. A collective is a rendezvous of the group's members: each
// posts its buffers and waits for the others (a deadline on every wait); then
// member m combines block m of every member's send buffer, in member order
// (runtime/comm/Reduce.h), and writes it into every member's receive buffer,
// so the work is spread over the members; a second rendezvous ends the call
// once every member is done with the others' buffers.
//
// A call that misses its deadline aborts the world (the barrier cannot be
// rejoined): its message names the rank, the op, the context and the ranks
// that did not arrive, and every other pending or later call fails with it.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_COMM_INPROCESS_H
#define KILN_RUNTIME_COMM_INPROCESS_H

#include "runtime/comm/Communicator.h"

#include <memory>

namespace kiln::comm {

struct InProcessState;

/// The shared state of N in-process ranks. Create it once, then one
/// communicator per rank (each used by one thread at a time).
class InProcessWorld {
public:
  explicit InProcessWorld(int size);
  ~InProcessWorld();
  InProcessWorld(const InProcessWorld &) = delete;
  InProcessWorld &operator=(const InProcessWorld &) = delete;

  int size() const;
  /// Rank `rank`'s communicator (0 <= rank < size()); it keeps the world
  /// alive.
  static std::unique_ptr<Communicator>
  communicator(std::shared_ptr<InProcessWorld> world, int rank);
  /// Makes every pending and later call of every rank fail with `why`.
  void abort(const std::string &why);
  /// Whether abort() was called (or a call timed out), and why.
  bool aborted() const;
  std::string abortReason() const;

  InProcessState &state() { return *state_; }

private:
  std::unique_ptr<InProcessState> state_;
};

/// A world of `size` ranks and their communicators, rank i at index i.
std::vector<std::unique_ptr<Communicator>> makeInProcessCommunicators(int size);

} // namespace kiln::comm

#endif // KILN_RUNTIME_COMM_INPROCESS_H
