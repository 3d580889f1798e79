//===- Cpus.cpp - The CPUs this process may use ---------------------------===//

#include "runtime/core/Cpus.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sched.h>
#include <sstream>
#include <thread>
#include <vector>

#include <fmt/format.h>

namespace kiln {
namespace {

bool readFile(const std::string &path, std::string &text) {
  std::ifstream in(path);
  if (!in)
    return false;
  std::ostringstream s;
  s << in.rdbuf();
  text = s.str();
  return true;
}

/// The quota in `dir` (a cgroup directory), in CPUs; 0 when unlimited or
/// not there. v2: cpu.max is "max 100000" or "QUOTA PERIOD"; v1:
/// cpu.cfs_quota_us is -1 or the quota, cpu.cfs_period_us the period.
double quotaIn(const std::string &dir, bool v2, std::string &file) {
  std::string text;
  long long quota = -1, period = 0;
  if (v2) {
    file = dir + "/cpu.max";
    if (!readFile(file, text))
      return 0;
    std::istringstream s(text);
    std::string q;
    if (!(s >> q >> period) || q == "max")
      return 0;
    quota = std::atoll(q.c_str());
  } else {
    file = dir + "/cpu.cfs_quota_us";
    std::string p;
    if (!readFile(file, text) || !readFile(dir + "/cpu.cfs_period_us", p))
      return 0;
    quota = std::atoll(text.c_str());
    period = std::atoll(p.c_str());
  }
  if (quota <= 0 || period <= 0)
    return 0;
  return double(quota) / double(period);
}

/// The smallest quota from `path` (a cgroup, "/a/b") up to the root of the
/// hierarchy mounted at `mount`.
double smallestUp(const std::string &mount, std::string path, bool v2, double best,
                  std::string &from) {
  while (true) {
    std::string file;
    double q = quotaIn(mount + (path == "/" ? "" : path), v2, file);
    if (q > 0 && (best == 0 || q < best)) {
      best = q;
      from = file;
    }
    if (path.empty() || path == "/")
      return best;
    size_t slash = path.rfind('/');
    path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
  }
}

} // namespace

double cgroupQuota(const std::string &procCgroup, const std::string &root, std::string &from) {
  double best = 0;
  from.clear();
  std::istringstream lines(procCgroup);
  std::string line;
  while (std::getline(lines, line)) {
    // "ID:CONTROLLERS:PATH"; v2's line is "0::PATH".
    size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos)
      continue;
    std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (path.empty() || path[0] != '/')
      continue;
    if (controllers.empty()) {
      // Pure v2 mounts the hierarchy at the root; hybrid at unified/.
      best = smallestUp(root, path, true, best, from);
      best = smallestUp(root + "/unified", path, true, best, from);
      continue;
    }
    std::vector<std::string> names;
    std::istringstream c(controllers);
    for (std::string n; std::getline(c, n, ',');)
      names.push_back(n);
    if (std::find(names.begin(), names.end(), "cpu") == names.end())
      continue;
    // v1 mounts the cpu controller at cpu/ or at the joined name
    // (cpu,cpuacct/), often with the other as a link to it.
    best = smallestUp(root + "/" + controllers, path, false, best, from);
    if (controllers != "cpu")
      best = smallestUp(root + "/cpu", path, false, best, from);
  }
  return best;
}

int CpuBudget::usable() const {
  int n = std::max(1, affinity);
  if (quota > 0)
    n = std::min(n, std::max(1, int(std::floor(quota + 1e-9))));
  return n;
}

std::string CpuBudget::describe() const {
  int n = usable();
  if (!narrowed())
    return fmt::format("{} CPU{}", n, n == 1 ? "" : "s");
  std::string why;
  if (affinity < machine)
    why = "affinity mask";
  if (quota > 0 && std::floor(quota + 1e-9) < affinity)
    why += fmt::format("{}cgroup quota {:g} CPU{} in {}", why.empty() ? "" : ", ", quota,
                       quota == 1 ? "" : "s", quotaFrom);
  return fmt::format("{} of {} CPUs ({})", n, machine, why);
}

CpuBudget cpuBudget() {
  CpuBudget b;
  b.machine = int(std::max(1u, std::thread::hardware_concurrency()));
  b.affinity = b.machine;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0)
    b.affinity = std::max(1, CPU_COUNT(&set));
  std::string cg;
  if (readFile("/proc/self/cgroup", cg))
    b.quota = cgroupQuota(cg, "/sys/fs/cgroup", b.quotaFrom);
  return b;
}

int threadsPerReplica(const CpuBudget &b, int processes, int devicesInProcess) {
  processes = std::max(1, processes);
  devicesInProcess = std::max(1, devicesInProcess);
  bool bound = processes > 1 && b.affinity < b.machine;
  int n = std::max(1, b.affinity / (bound ? devicesInProcess : processes * devicesInProcess));
  if (b.quota > 0)
    n = std::min(n, std::max(1, int(std::floor(b.quota + 1e-9)) /
                                    (processes * devicesInProcess)));
  return n;
}

} // namespace kiln
