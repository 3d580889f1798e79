//===- Launch.cpp - Launcher environments ---------------------------------===//
#include "runtime/train/Launch.h"

#include "runtime/comm/Launcher.h"

#include <cstdlib>

namespace kiln::train {

Expected<Launch>
detectLaunch(const std::function<const char *(const char *)> &get) {
  auto env = comm::detectLauncher(get);
  if (!env)
    return env.status();
  Launch l;
  l.launcher = env->launcher;
  l.rank = env->rank;
  l.size = env->size;
  l.localRank = env->localRank;
  l.localSize = l.size;
  if (!env->underLauncher())
    return l;
  static const char *const localSizes[] = {
      "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE",
      "LOCAL_WORLD_SIZE"};
  for (const char *name : localSizes) {
    const char *v = get ? get(name) : std::getenv(name);
    if (!v || !*v)
      continue;
    char *end = nullptr;
    long x = std::strtol(v, &end, 10);
    if (*end == '\0' && x >= 1) // Slurm may say "2(x3)": then all ranks
      l.localSize = int(x);
    break;
  }
  return l;
}

} // namespace kiln::train
