//===- Launcher.cpp - Which launcher started this process -----------------===//

#include "runtime/comm/Launcher.h"

#include <cerrno>
#include <cstdlib>
#include <fmt/format.h>

namespace kiln::comm {

namespace {

struct Family {
  const char *launcher, *rank, *size, *local;
};

constexpr Family kFamilies[] = {
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
};

/// `value` as a non-negative int, or an error naming `name`.
Expected<int> parseCount(const char *name, const char *value) {
  char *end = nullptr;
  errno = 0;
  long v = std::strtol(value, &end, 10);
  if (!*value || *end || errno || v < 0 || v > 1 << 24)
    return Status::error(
        fmt::format("environment variable {}={:?} is not a rank or a rank "
                    "count; unset it or fix the launcher's command",
                    name, value));
  return int(v);
}

} // namespace

Expected<LaunchEnv>
detectLauncher(const std::function<const char *(const char *)> &getenvFn) {
  auto get = [&](const char *name) -> const char * {
    return getenvFn ? getenvFn(name) : std::getenv(name);
  };
  for (const Family &f : kFamilies) {
    const char *rank = get(f.rank), *size = get(f.size);
    if (!rank && !size)
      continue;
    if (!rank || !size)
      return Status::error(fmt::format(
          "{} is set but {} is not; a {} launch sets both",
          rank ? f.rank : f.size, rank ? f.size : f.rank, f.launcher));
    LaunchEnv env;
    env.launcher = f.launcher;
    env.variables = fmt::format("{}/{}", f.rank, f.size);
    Expected<int> r = parseCount(f.rank, rank), n = parseCount(f.size, size);
    if (!r)
      return r.status();
    if (!n)
      return n.status();
    if (*n < 1 || *r >= *n)
      return Status::error(
          fmt::format("{}={} and {}={}: the rank must lie in 0..size-1", f.rank,
                      *r, f.size, *n));
    env.rank = *r;
    env.size = *n;
    if (const char *local = get(f.local)) {
      Expected<int> l = parseCount(f.local, local);
      if (!l)
        return l.status();
      env.localRank = *l;
    }
    return env;
  }
  return LaunchEnv{};
}

Status checkLaunch(const LaunchEnv &env, int rank, int size,
                   const char *library) {
  if (!env.underLauncher() || (env.rank == rank && env.size == size))
    return Status::ok();
  std::string hint = env.launcher == "torchrun"
                         ? "torchrun starts independent processes that MPI "
                           "cannot join; launch with "
                           "`mpirun -np N` (as root: add --allow-run-as-root "
                           "--oversubscribe) instead"
                         : "the process was not started by the launcher its "
                           "variables name (stale "
                           "variables in the environment?); unset them or "
                           "launch with that launcher";
  return Status::error(
      fmt::format("the {} launcher's {} say rank {} of {}, but {} reports "
                  "rank {} of {}: {}",
                  env.launcher, env.variables, env.rank, env.size, library,
                  rank, size, hint));
}

} // namespace kiln::comm
