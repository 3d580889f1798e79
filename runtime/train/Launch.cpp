//===- Launch.cpp - Launcher environments ---------------------------------===//
#include "runtime/train/Launch.h"

#include <cstdlib>

namespace kiln::train {

Launch detectLaunch(const std::function<const char *(const char *)> &get) {
  auto env = [&](const char *name) -> const char * {
    const char *v = get ? get(name) : std::getenv(name);
    return v && *v ? v : nullptr;
  };
  auto num = [&](const char *name, int fallback) {
    const char *v = env(name);
    if (!v)
      return fallback;
    char *end = nullptr;
    long x = std::strtol(v, &end, 10);
    return *end || x < 0 ? fallback : int(x);
  };
  struct Vars {
    const char *launcher, *rank, *size, *localRank, *localSize;
  };
  static const Vars kinds[] = {
      {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
       "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
      {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
      {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
  };
  Launch l;
  for (const Vars &k : kinds) {
    if (!env(k.rank) || !env(k.size))
      continue;
    l.launcher = k.launcher;
    l.size = num(k.size, 1) > 0 ? num(k.size, 1) : 1;
    l.rank = num(k.rank, 0);
    if (l.rank >= l.size)
      l.rank = 0;
    l.localRank = num(k.localRank, l.rank);
    // Without a local size, assume every process shares this node.
    l.localSize = num(k.localSize, l.size);
    if (l.localSize < 1)
      l.localSize = 1;
    return l;
  }
  return l;
}

} // namespace kiln::train
