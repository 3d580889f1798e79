//===- Replicas.h - Training on several devices -----------------*- C++ -*-===//
//
// A multi-device program (a mesh of N devices, docs/parallel.md) trains as
// N replicas, one per device, each a Trainer with its own Model, backend
// (arena, threads) and data shard, their collectives going through one
// communicator per replica:
//   - in one process (`kiln-run train --device cpu:N`): N in-process
//     communicators, the replicas on N threads;
//   - one per process (`mpirun -np N kiln-run train ...`): this process's
//     MPI communicator, the replica on this thread.
// trainReplicas() runs the replicas of this process. Rank 0 prints, writes
// the loss log and checkpoints; every rank gathers ZeRO-sharded state for
// them. Nothing hangs: when a replica fails, the others are cancelled and
// its communicator aborted, and the first failure is the one reported
// (a collective's timeout names the rank that did not arrive, the op and
// the step).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_TRAIN_REPLICAS_H
#define KILN_RUNTIME_TRAIN_REPLICAS_H

#include "runtime/comm/Communicator.h"
#include "runtime/train/Trainer.h"

#include <functional>
#include <memory>
#include <vector>

namespace kiln::train {

/// Whether every rank of a world of processes could start, agreed on by
/// all of them (agreeOnStart()).
struct StartAgreement {
  /// Ok when every rank started; else what failed, on which ranks.
  Status status;
  /// This rank (the lowest) reports `status` for the world; the others
  /// exit with its exit code without printing it again.
  bool report = true;
  /// Where the ranks run, rank 0's view: "ranks 0, 1 on node-a; rank 2 on
  /// node-b" (host names as gethostname gives them, up to 63 characters).
  std::string hosts;
};

/// Every rank of `c`'s world says whether it could start (`mine`), so that
/// an error found on several ranks is reported once, and one found on some
/// ranks only stops the others at once, naming the ranks. A collective
/// under `c`'s deadline: every rank calls it once at the same point (a rank
/// that never gets there is named by the timeout). The failure's message is
/// the ranks' own when all failed with the same one (as one process would
/// print it), else "rank R: message" per distinct message, ranks with the
/// same one together ("ranks 1, 3: ..."), a line each; its kind is the
/// lowest failed rank's. The same exchange carries each rank's host name.
StartAgreement agreeOnStart(comm::Communicator &c, const Status &mine);

struct ReplicaOptions {
  /// As for one replica; rank, worldSize, cancel are set per replica.
  TrainOptions train;
  /// This process's communicators, one per replica; each one's rank() is
  /// its replica's device in the mesh. All of one world (same size()).
  std::vector<comm::Communicator *> comms;
  /// The backend of `device` whose collectives use `c` (called in device
  /// order, one at a time: kernels compiled for the first come from the
  /// cache for the others).
  std::function<BackendFactory(int device, comm::Communicator *c)> backend;
  /// Host-memory communicators of the same ranks, one per replica, for the
  /// trainer's own collectives (the handshake, agreeing on stopping,
  /// gathering sharded state for checkpoints); empty: `comms`. Needed where
  /// `comms` take device memory only (NCCL's).
  std::vector<comm::Communicator *> hostComms;
  /// Checks, once every replica's backend exists, that all ranks run the
  /// same program (the start-up handshake); may be empty.
  std::function<Status(comm::Communicator &, const Model &)> handshake;
  /// How the devices were asked for, for messages ("--device cpu:4").
  std::string how;
  /// --trace: one tracer per replica (TrainOptions::tracer of each), or
  /// empty: train.tracer for all (null: none).
  std::vector<Tracer *> tracers;
  /// A process of a world of several (one replica here): where set, the
  /// ranks agree (agreeOnStart()) once each has opened its trainer (its
  /// data, --resume, --init), and the outcome is stored here; a failure
  /// then returns its status, which every rank knows, so no rank needs to
  /// abort the others.
  StartAgreement *started = nullptr;
};

struct ReplicaRun {
  /// This process's replicas' models, in device order (profiles, tests).
  std::vector<std::unique_ptr<Model>> models;
  /// The lowest-ranked replica's result (rank 0's where it is here).
  TrainResult result;
};

/// Trains one replica of `pkg` (an opened artifact; each replica gets a
/// copy) per communicator; the first failure in time wins (the others then
/// fail as cancelled).
Expected<ReplicaRun> trainReplicas(const Package &pkg, const ReplicaOptions &o,
                                   Sink out);

} // namespace kiln::train

#endif // KILN_RUNTIME_TRAIN_REPLICAS_H
