//===- Launch.h - How many ranks, which one: launcher environments -*- C++ -*-===//
//
// A multi-process run is started by a launcher that tells each process its
// rank through the environment: mpirun (OpenMPI: OMPI_COMM_WORLD_RANK,
// _SIZE, _LOCAL_RANK, _LOCAL_SIZE), other MPIs and Hydra (PMI_RANK,
// PMI_SIZE), Slurm's srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
// SLURM_NTASKS_PER_NODE) and torchrun (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE). kiln-run reads them before it starts MPI, to know
// whether it runs as one of several processes and how many to expect, and
// how many cores its node's processes share.
//
// (Part C's runtime/comm has the same reading as detectLauncher(); this
// one is the trainer's, kept free of the MPI library.)
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_TRAIN_LAUNCH_H
#define KILN_RUNTIME_TRAIN_LAUNCH_H

#include <functional>
#include <string>

namespace kiln::train {

struct Launch {
  /// "mpirun", "pmi", "slurm", "torchrun"; empty: not started by a launcher.
  std::string launcher;
  int rank = 0, size = 1;
  /// This process's place among the processes of its node.
  int localRank = 0, localSize = 1;
  /// Started by a launcher with more than one process.
  bool multiProcess() const { return size > 1; }
};

/// Reads the environment through `getenv` (std::getenv by default); the
/// first launcher whose variables are set wins, in the order above.
Launch detectLaunch(const std::function<const char *(const char *)> &getenv = {});

} // namespace kiln::train

#endif // KILN_RUNTIME_TRAIN_LAUNCH_H
