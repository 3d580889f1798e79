//===- CpusTest.cpp - The CPUs a process may use --------------------------===//
//
// cgroupQuota on fake cgroup trees (v1, v2, hybrid, nested quotas), the
// budget's rounding and words, and how threads are shared between the
// replicas of a host.

#include "runtime/core/Cpus.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sched.h>
#include <unistd.h>

namespace fs = std::filesystem;
using namespace kiln;

namespace {

struct Tree {
  fs::path root;
  Tree() {
    root = fs::temp_directory_path() / ("kiln-cgroup-" + std::to_string(getpid()) + "-" +
                                        std::to_string(counter()++));
    fs::create_directories(root);
  }
  ~Tree() { fs::remove_all(root); }
  static int &counter() {
    static int n = 0;
    return n;
  }
  void write(const std::string &rel, const std::string &text) {
    fs::create_directories((root / rel).parent_path());
    std::ofstream(root / rel) << text;
  }
};

} // namespace

TEST(Cpus, V2QuotaAtTheProcessCgroup) {
  Tree t;
  t.write("job/step/cpu.max", "150000 100000\n");
  t.write("job/cpu.max", "max 100000\n");
  std::string from;
  EXPECT_DOUBLE_EQ(cgroupQuota("0::/job/step\n", t.root.string(), from), 1.5);
  EXPECT_EQ(from, (t.root / "job/step/cpu.max").string());
}

TEST(Cpus, TheSmallestQuotaOnThePathUpWins) {
  // Slurm caps the job; its steps inherit the cap without a cpu.max of their own.
  Tree t;
  t.write("cpu.max", "max 100000\n");
  t.write("job/cpu.max", "200000 100000\n");
  t.write("job/step/cpu.max", "400000 100000\n");
  std::string from;
  EXPECT_DOUBLE_EQ(cgroupQuota("0::/job/step\n", t.root.string(), from), 2.0);
  EXPECT_EQ(from, (t.root / "job/cpu.max").string());
}

TEST(Cpus, V1CfsQuotaUnderTheJoinedControllerName) {
  Tree t;
  t.write("cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "300000\n");
  t.write("cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n");
  std::string from;
  EXPECT_DOUBLE_EQ(cgroupQuota("4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n",
                               t.root.string(), from),
                   3.0);
}

TEST(Cpus, HybridUnifiedAndUnlimited) {
  Tree t;
  t.write("unified/a/cpu.max", "50000 100000\n");
  t.write("cpu/cpu.cfs_quota_us", "-1\n");
  t.write("cpu/cpu.cfs_period_us", "100000\n");
  std::string from;
  EXPECT_DOUBLE_EQ(cgroupQuota("1:cpu:/\n0::/a\n", t.root.string(), from), 0.5);
  // Nothing limited, or a cgroup path the mount does not have (a container
  // that sees the host's path): no quota.
  Tree none;
  none.write("cpu.max", "max 100000\n");
  EXPECT_DOUBLE_EQ(cgroupQuota("0::/elsewhere/x\n", none.root.string(), from), 0.0);
  EXPECT_DOUBLE_EQ(cgroupQuota("garbage\n\n1:cpu\n", none.root.string(), from), 0.0);
}

TEST(Cpus, BudgetRoundsTheQuotaDownAndSaysWhy) {
  CpuBudget b;
  b.machine = 16;
  b.affinity = 16;
  EXPECT_EQ(b.usable(), 16);
  EXPECT_FALSE(b.narrowed());
  EXPECT_EQ(b.describe(), "16 CPUs");
  b.quota = 3.5;
  b.quotaFrom = "/sys/fs/cgroup/cpu.max";
  EXPECT_EQ(b.usable(), 3);
  EXPECT_EQ(b.describe(), "3 of 16 CPUs (cgroup quota 3.5 CPUs in /sys/fs/cgroup/cpu.max)");
  b.quota = 0.5; // less than one CPU still runs one thread
  EXPECT_EQ(b.usable(), 1);
  b.quota = 0;
  b.affinity = 4;
  EXPECT_EQ(b.describe(), "4 of 16 CPUs (affinity mask)");
}

TEST(Cpus, ThreadsPerReplica) {
  CpuBudget b;
  b.machine = 16;
  b.affinity = 16;
  EXPECT_EQ(threadsPerReplica(b, 1, 1), 16);
  EXPECT_EQ(threadsPerReplica(b, 4, 1), 4);  // 4 unbound ranks share the host
  EXPECT_EQ(threadsPerReplica(b, 1, 2), 8);  // --device cpu:2
  b.affinity = 4; // a rank bound by the launcher to 4 CPUs of its own
  EXPECT_EQ(threadsPerReplica(b, 4, 1), 4);
  EXPECT_EQ(threadsPerReplica(b, 1, 2), 2); // taskset on one process: its devices share
  b.affinity = 16;
  b.quota = 8; // a cgroup every rank of the host shares
  EXPECT_EQ(threadsPerReplica(b, 4, 1), 2);
  EXPECT_EQ(threadsPerReplica(b, 16, 1), 1);
}

TEST(Cpus, TheRunningProcessSeesItsMask) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  CpuBudget b = cpuBudget();
  EXPECT_EQ(b.affinity, CPU_COUNT(&set));
  EXPECT_GE(b.machine, b.affinity);
  EXPECT_GE(b.usable(), 1);
  EXPECT_LE(b.usable(), b.affinity);
}
