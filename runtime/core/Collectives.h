//===- Collectives.h - Collective steps through a Communicator ---*- C++
//-*-===//
//
// What every executor with a communicator shares (docs/parallel.md
// "Executors"):
//   - checkCommunicator(): the communicator fits the program's mesh;
//   - collectiveGroup(): a collective step's group as world ranks (its
//     mesh axis seen from this device, or its explicit group);
//   - callCommunicator(): one collective step as a communicator call, on
//     the step's buffers at this device's addresses;
//   - CollectiveQueue: the communication thread. Every collective of an
//     executor goes through it in schedule order, so each member's calls
//     reach the communicator in the same order whatever overlaps on the
//     compute side; a queue-1 step is pushed and waited for later, a
//     queue-0 one waited for at once. Each call's communicator context
//     names the step; after a failure every later call fails at once
//     (the members' sequences no longer match); every wait has a deadline.
//     While a call runs and nobody waits for it, the communicator is told
//     (Communicator::setWaitedFor(false)), so a polling one polls sparingly.
//     Or, inline (ExecutorOptions::commThread Off; docs/parallel.md "One
//     core per rank"), no thread: the calls are kept in schedule order and
//     made on the caller's thread when it first waits for one of them (or
//     runs a synchronous one), all earlier ones first, so the members
//     still make the same calls in the same order.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CORE_COLLECTIVES_H
#define KILN_RUNTIME_CORE_COLLECTIVES_H

#include "runtime/comm/Communicator.h"
#include "runtime/core/Program.h"
#include "runtime/core/Status.h"

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kiln {

/// Null `comm`: the program must run on one device (checkSingleDevice()).
/// Otherwise its size must be the mesh's device count and `device` (-1:
/// its rank) its rank; `device` is set to the device this executor runs.
/// A deterministic program (Program::deterministic) sets the
/// communicator's SumOrder::Tree, and refuses NCCL (its own order).
Status checkCommunicator(const program::Program &p, comm::Communicator *comm,
                         int &device);

/// The world ranks of collective `c`'s group as device `device` sees it:
/// c.group, or the devices differing from it only along c.axis (row-major
/// mesh numbering); empty when that is every device in rank order (the
/// communicator's default group).
comm::Group collectiveGroup(const program::Mesh &mesh,
                            const program::Collective &c, int device);

/// Every distinct group other than the default (all devices in rank
/// order) that the program's collectives use, over every device's view, in
/// ascending order: what a communicator that must prepare its subgroups up
/// front (NCCL's prepareGroups) is given at start-up, on every rank.
std::vector<comm::Group> collectiveGroups(const program::Program &p);

/// Runs collective step `s` of device `device` through `comm`: `send` and
/// `recv` are the step's args[0] and args.back() at this device's
/// addresses (host or device memory, as the communicator expects), before
/// the step's offsets. `copy` moves bytes within that memory (a broadcast
/// whose root sends from another buffer than it receives into).
Status callCommunicator(
    comm::Communicator &comm, const program::Mesh &mesh, const program::Step &s,
    int device, void *send, void *recv,
    const std::function<Status(void *, const void *, size_t)> &copy);

/// "training step 3, @train_step step 7 (all_reduce of 4096 bytes on queue
/// 1 at m.kiln:9:3)": a collective's context for the communicator.
std::string collectiveContext(const std::string &prefix,
                              const program::Function &f, size_t index);

/// One communication thread over `comm`, or none (inline; see above).
class CollectiveQueue {
public:
  /// `inlineCalls`: no thread; calls run on the thread that waits.
  explicit CollectiveQueue(comm::Communicator &comm, int device,
                           bool inlineCalls = false);
  ~CollectiveQueue(); ///< waits for the thread (every push must be waited for
                      ///< first)
  CollectiveQueue(const CollectiveQueue &) = delete;
  CollectiveQueue &operator=(const CollectiveQueue &) = delete;

  /// Queues `call` (a communicator call) with communicator context
  /// `context`; returns its ticket.
  uint64_t push(std::function<Status()> call, std::string context);
  /// Waits for ticket `t`: its status, and its run time in `seconds`. The
  /// deadline is twice the communicator's timeout plus 10 s, a guard behind
  /// the communicator's own; past it the communicator is aborted. Inline:
  /// makes the calls queued up to `t` here, each with the communicator's
  /// own deadline.
  Status wait(uint64_t t, double &seconds);
  /// push() then wait().
  Status run(std::function<Status()> call, std::string context);
  /// Whether calls run on the waiting thread (no communication thread).
  bool isInline() const { return inline_; }

private:
  void loop();

  comm::Communicator &comm_;
  int device_;
  struct Task {
    uint64_t ticket = 0;
    std::function<Status()> call;
    std::string context;
  };
  struct Done {
    Status status;
    double seconds = 0;
  };
  /// Makes call `t` (or fails it at once after an earlier failure).
  Done call(Task &t, const std::string &failed);
  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::deque<Task> tasks_;
  std::map<uint64_t, Done> results_;
  uint64_t next_ = 0;
  bool stop_ = false;
  bool failed_ = false;
  std::string error_;
  bool inline_ = false;
  bool waiting_ = false; ///< a wait() is blocked
  bool busy_ = false;    ///< the thread is in a call
  std::thread thread_;
};

} // namespace kiln

#endif // KILN_RUNTIME_CORE_COLLECTIVES_H
