//===- MultiDevice.h - What a launcher does around trainReplicas -*- C++ -*-===//
//
// A training run over several devices (docs/parallel.md "The multi-rank
// trainer") is trainReplicas() (Replicas.h) plus what every front end
// (kiln-run, the Python package) must do around it, the same way:
//   - connectReplicas(): checks the devices asked for against the launch
//     and the program, then makes the communicators: N in-process ones for
//     --device cpu:N, this rank's MPI one under a launcher (after the ranks
//     agree that each could start), NCCL's on GPUs with host ones beside
//     them for the trainer's own exchanges;
//   - replicaBackends(): each replica's backend from one DeviceOptions;
//   - sameArtifactHandshake(): the start-up check that every rank runs the
//     same artifact and collective sequence;
//   - replicaTracers(), collectTraces(), collectStageRows(): --trace's and
//     --profile's per-device spans, gathered to rank 0 under a launcher;
//   - replicaThreads(), relaunchCommand(): the threads each replica gets,
//     and how to start the same world again (after an interrupt).
// Nothing here prints: errors are values, and the caller reports them
// before it stops the other ranks (an MPI abort ends this process too).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_TRAIN_MULTIDEVICE_H
#define KILN_RUNTIME_TRAIN_MULTIDEVICE_H

#include "runtime/train/Devices.h"
#include "runtime/train/Launch.h"
#include "runtime/train/Replicas.h"
#include "runtime/train/TraceFile.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kiln::train {

/// The devices of a multi-device run as this process sees them.
struct ReplicaLaunch {
  Launch launch;
  DeviceSpec spec;
  /// How the devices were asked for, for messages: "--device cpu:4",
  /// "openmpi with 2 processes".
  std::string how;
  /// The run's devices over all processes (the mesh's size).
  int devices = 1;
  /// GPUs: this process's, one per replica (one listed: every replica's);
  /// empty on CPU devices.
  std::vector<int> gpus;
};

/// Checks a run of `p` (the artifact at `artifact`) on `spec` (--device as
/// the user wrote it: `device`) under `launch`: the device kind trains on
/// several devices, the device count is the program's, and the GPUs exist.
/// Under a launcher each process must be one device (`spec.count` 1).
Expected<ReplicaLaunch> planReplicas(const Launch &launch, const DeviceSpec &spec,
                                     const std::string &device, const program::Program &p,
                                     const std::string &artifact);

/// This process's communicators for a run planReplicas() accepted.
struct ReplicaComms {
  /// The program's collectives, one per replica of this process: in
  /// process, MPI, or NCCL's on GPUs (ReplicaOptions::comms).
  std::vector<std::unique_ptr<comm::Communicator>> program;
  /// GPUs: host-memory communicators of the same ranks for the trainer's
  /// own exchanges (ReplicaOptions::hostComms); else empty.
  std::vector<std::unique_ptr<comm::Communicator>> host;
  /// Under a launcher: whether every rank could start, agreed once this
  /// rank's MPI communicator existed. Not ok: report it with leader()
  /// (every rank knows; none needs stopping).
  StartAgreement started;
  /// Not ok: this rank failed after the ranks met (NCCL's communicator
  /// could not be made): report it, then abortOthers().
  Status error;
  bool multiProcess = false;

  /// The communicator the ranks agree and report through (host memory).
  comm::Communicator &leader() { return host.empty() ? *program[0] : *host[0]; }
  /// Under a launcher: stops the other processes at once, after this one
  /// reported its error (an MPI abort also ends this process). In one
  /// process: nothing (trainReplicas cancels its replicas itself).
  void abortOthers(const std::string &why);
};

/// Makes the communicators of `run`, each call failing after
/// `timeoutSeconds`; ranks that failed to start before this point
/// (reportStartFailure()) are heard here.
Expected<ReplicaComms> connectReplicas(const ReplicaLaunch &run, double timeoutSeconds);

/// A start-up error `held` found before the communicator existed, under a
/// launcher of several processes: the ranks agree (the others at their
/// connectReplicas()) so the lowest failed rank reports for all. Without
/// MPI to agree through, `held` is returned as it is.
struct StartFailure {
  StartAgreement agreement;
  std::unique_ptr<comm::Communicator> comm; ///< null: no MPI
};
StartFailure reportStartFailure(const Status &held, double timeoutSeconds);

/// Ends a rank's run once the ranks agreed that some could not start: one
/// more collective, so that every rank leaves together (mpirun ends the
/// job as soon as one rank exits with an error, and could stop rank 0
/// before it printed). Call it after printing the agreement's status.
void leaveTogether(comm::Communicator &c);

/// Threads for each replica when none are asked for: the CPUs this process
/// may use (runtime/core/Cpus.h), shared by the host's replicas (the
/// launcher's ranks on this node, or the in-process devices).
int replicaThreads(const Launch &launch, int devicesInProcess);

/// Each replica's backend: `base` with the replica's device index and
/// communicator, on GPUs its own GPU of `gpus`, quiet but for device 0.
std::function<BackendFactory(int device, comm::Communicator *c)>
replicaBackends(const DeviceOptions &base, const std::vector<int> &gpus, Sink out);

/// The start-up handshake (ReplicaOptions::handshake): every rank runs the
/// artifact at `artifact` (its bytes' hash) and the same collectives.
Expected<std::function<Status(comm::Communicator &, const Model &)>>
sameArtifactHandshake(const std::string &artifact);

/// One tracer per communicator of this process (in their order), each
/// with its rank: `rank0` for rank 0 where set (TrainOptions::tracer),
/// the others made and kept in `own`.
std::vector<Tracer *> replicaTracers(const std::vector<comm::Communicator *> &comms,
                                     Tracer *rank0, std::vector<std::unique_ptr<Tracer>> &own);

/// The trace source of device `rank`: "rank R · <backend>".
TraceSource traceSource(const Tracer &t, const Model &m, int rank);

/// The replicas' rendered traces for the file rank 0 writes, in rank
/// order: the Chrome trace's events (`chrome`) and TensorBoard's XSpaces
/// (`xspace`) of this process's replicas, shifted to the earliest tracer's
/// origin, or under a launcher every rank's, gathered (a collective: every
/// rank calls it; the ranks other than 0 get empty lists).
struct ReplicaTraces {
  std::vector<std::string> chrome, xspaces;
};
Expected<ReplicaTraces> collectTraces(const std::vector<Tracer *> &tracers, const ReplicaRun &r,
                                      bool multiProcess, bool chrome, bool xspace);

/// --profile of a pipeline-parallel program: each device's stage row
/// (Overview.h formatStageRow) in rank order, every rank's to rank 0 under
/// a launcher (a collective).
Expected<std::vector<std::string>> collectStageRows(const std::vector<Tracer *> &tracers,
                                                    const ReplicaRun &r, bool multiProcess);

/// The command line prefix that starts the same world of `devices`
/// processes again: "mpirun -np 2 ", "srun -n 4 ", "" in one process.
std::string relaunchCommand(const Launch &launch, int devices);

} // namespace kiln::train

#endif // KILN_RUNTIME_TRAIN_MULTIDEVICE_H
