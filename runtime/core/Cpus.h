//===- Cpus.h - The CPUs this process may use --------------------*- C++ -*-===//
//
// The machine's core count (std::thread::hardware_concurrency) is not what a
// process may use: taskset, numactl, Slurm and OpenMPI's binding narrow the
// affinity mask, and containers and Slurm's cgroups cap CPU time with a quota
// (cgroup v2 cpu.max, v1 cpu.cfs_quota_us / cpu.cfs_period_us). A rank bound
// to one CPU that runs two threads spends its step time switching between
// them. Kiln sizes its threads by the smaller of the two, as this file reads
// them, and says so at start-up when they are narrower than the machine.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CORE_CPUS_H
#define KILN_RUNTIME_CORE_CPUS_H

#include <string>

namespace kiln {

struct CpuBudget {
  int machine = 1;  ///< online CPUs (hardware_concurrency)
  int affinity = 1; ///< CPUs in this process's affinity mask
  double quota = 0; ///< cgroup CPU quota in CPUs; 0: none
  std::string quotaFrom; ///< the file the quota came from

  /// CPUs this process can keep busy: the affinity mask, capped by the
  /// quota rounded down (at least 1).
  int usable() const;
  /// True when the mask or the quota leaves fewer CPUs than the machine has.
  bool narrowed() const { return usable() < machine; }
  /// "1 of 2 CPUs (affinity mask)", "3 of 16 CPUs (cgroup quota 3.5 CPUs in
  /// /sys/fs/cgroup/cpu.max)", or "2 CPUs" when nothing narrows them.
  std::string describe() const;
};

/// This process's budget, read now (the mask can change at run time).
CpuBudget cpuBudget();

/// The cgroup quota of the process whose /proc/PID/cgroup text is
/// `procCgroup`, with the cgroup file systems mounted under `root` (normally
/// "/sys/fs/cgroup"); the smallest quota on the path from its cgroup up to
/// the root, as a job's cgroup caps its steps'. 0 when there is none; `from`
/// names the file. Split out so tests can hand it a fake tree.
double cgroupQuota(const std::string &procCgroup, const std::string &root, std::string &from);

/// Threads for each replica on this host. `processes` processes share the
/// host (mpirun's local size) and each runs `devicesInProcess` in-process
/// replicas. A process whose mask is narrower than the machine under a
/// multi-process launch was bound by the launcher to CPUs of its own (as
/// OpenMPI binds ranks by default), so only its in-process replicas share
/// them; otherwise every replica on the host shares the mask. The quota is
/// per cgroup, so every process on the host shares it.
int threadsPerReplica(const CpuBudget &b, int processes, int devicesInProcess);

} // namespace kiln

#endif
