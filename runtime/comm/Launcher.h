//===- Launcher.h - Which launcher started this process, and as which rank -*-
//C++ -*-===//
//
// kiln-run learns from the environment whether a launcher started it and how
// many ranks to expect, before (and without) initialising MPI:
//   - Open MPI's mpirun: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK;
//   - MPICH, Intel MPI and other PMI launchers: PMI_RANK, PMI_SIZE
//     (MPI_LOCALRANKID for the local rank);
//   - Slurm's srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID;
//   - torchrun and similar: RANK, WORLD_SIZE, LOCAL_RANK.
// The first family present wins, in that order (mpirun inside a Slurm
// allocation also sees SLURM_* variables that describe the allocation).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_COMM_LAUNCHER_H
#define KILN_RUNTIME_COMM_LAUNCHER_H

#include "runtime/core/Status.h"

#include <functional>
#include <string>

namespace kiln::comm {

/// What the environment says about this process's place in a launch.
struct LaunchEnv {
  /// "openmpi", "pmi", "slurm", "torchrun", or "" when no launcher variables
  /// are set (a single process: rank 0 of 1).
  std::string launcher;
  /// The variables the values came from, for messages
  /// ("OMPI_COMM_WORLD_RANK/SIZE").
  std::string variables;
  int rank = 0;
  int size = 1;
  int localRank = 0;
  bool underLauncher() const { return !launcher.empty(); }
};

/// Reads the launcher variables through `getenv` (std::getenv when empty);
/// an error names the variable whose value is not a valid rank or size.
Expected<LaunchEnv>
detectLauncher(const std::function<const char *(const char *)> &getenv = {});

/// An error when the launcher's ranks disagree with what the communication
/// library reports (`library` names it, e.g. "MPI"), e.g. torchrun-style
/// variables for 4 ranks in a process MPI sees as a world of 1.
Status checkLaunch(const LaunchEnv &env, int rank, int size,
                   const char *library);

} // namespace kiln::comm

#endif // KILN_RUNTIME_COMM_LAUNCHER_H
