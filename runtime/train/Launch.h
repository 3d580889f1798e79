//===- Launch.h - Ranks and ranks per node from launchers -------*- C++ -*-===//
//
// A multi-process run is started by a launcher that tells each process its
// rank through the environment (mpirun, PMI launchers, Slurm's srun,
// torchrun: runtime/comm/Launcher.h reads them). The trainer also needs how
// many of the ranks share this node, to give each its share of the cores:
// OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS, SLURM_NTASKS_PER_NODE or
// LOCAL_WORLD_SIZE (all ranks when none is set).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_TRAIN_LAUNCH_H
#define KILN_RUNTIME_TRAIN_LAUNCH_H

#include "runtime/core/Status.h"

#include <functional>
#include <string>

namespace kiln::train {

struct Launch {
  /// "openmpi", "pmi", "slurm", "torchrun"; empty: not started by a launcher.
  std::string launcher;
  int rank = 0, size = 1;
  /// This process's place among the processes of its node.
  int localRank = 0, localSize = 1;
  /// Started by a launcher with more than one process.
  bool multiProcess() const { return size > 1; }
};

/// Reads the environment through `getenv` (std::getenv by default); an
/// error names a variable that is not a valid rank or size.
Expected<Launch>
detectLaunch(const std::function<const char *(const char *)> &getenv = {});

} // namespace kiln::train

#endif // KILN_RUNTIME_TRAIN_LAUNCH_H
