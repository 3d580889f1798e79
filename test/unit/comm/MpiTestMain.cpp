//===- MpiTestMain.cpp - kiln-comm-mpi-test: the MPI communicator, end to end
//===//
//
//   mpirun -np N kiln-comm-mpi-test sequence     every op and type, checked;
//                                                prints "rank R hash H"
//   kiln-comm-mpi-test in-process N              the same on N threads
//   mpirun -np N kiln-comm-mpi-test stall S      rank 1 sleeps S s before an
//                                                all_reduce with a 1 s deadline
//   mpirun -np N kiln-comm-mpi-test stall-group S   the same on the group
//                                                [1, 0], whose communicator
//                                                rank 0 creates first
//   mpirun -np N kiln-comm-mpi-test exit         rank 1 exits before it
//   mpirun -np N kiln-comm-mpi-test kill         rank 1 is killed (SIGKILL)
//   kiln-comm-mpi-test launcher                  prints detectLauncher()
//
// mpi-test.sh runs these and compares the hashes (in-process == MPI).
//
//===----------------------------------------------------------------------===//

#include "runtime/comm/InProcess.h"
#include "runtime/comm/Launcher.h"
#include "runtime/comm/Mpi.h"
#include "test/unit/comm/CommSequence.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

using namespace kiln;
using namespace kiln::comm;

static int fail(const Status &s) {
  std::fprintf(stderr, "error: %s\n", s.message().c_str());
  return s.exitCode();
}

int main(int argc, char **argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "launcher") {
    Expected<LaunchEnv> env = detectLauncher();
    if (!env)
      return fail(env.status());
    std::printf("launcher '%s' rank %d size %d local %d\n",
                env->launcher.c_str(), env->rank, env->size, env->localRank);
    return 0;
  }
  if (mode == "in-process") {
    int n = argc > 2 ? std::atoi(argv[2]) : 2;
    auto comms = makeInProcessCommunicators(n);
    std::vector<Status> st(n);
    std::vector<uint64_t> hash(n, 0);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        comms[r]->setTimeout(60);
        st[r] = test::runSequence(*comms[r], hash[r]);
      });
    for (auto &t : threads)
      t.join();
    for (int r = 0; r < n; ++r) {
      if (!st[r])
        return fail(st[r]);
      std::printf("rank %d hash %016llx\n", r, (unsigned long long)hash[r]);
    }
    return 0;
  }
  Expected<std::unique_ptr<MpiCommunicator>> comm = MpiCommunicator::create();
  if (!comm)
    return fail(comm.status());
  Communicator &c = **comm;
  c.setTimeout(60);
  if (mode == "sequence") {
    uint64_t hash = 0;
    if (Status s = test::runSequence(c, hash); !s)
      return fail(s);
    std::printf("rank %d hash %016llx\n", c.rank(), (unsigned long long)hash);
    std::fflush(stdout);
    return 0;
  }
  if (mode == "stall-group") {
    // A tensor- or pipeline-parallel subgroup: its communicator is created
    // at its first collective, which rank 1 never reaches in time.
    // The other ranks go on working meanwhile (they sleep as long as rank
    // 1), so the abort ends them mid-run as it would in training. Had they
    // returned, MPI_Finalize racing MPI_Abort crashes or hangs OpenMPI
    // 4.1's mpirun itself (seen about one run in three under load).
    std::vector<float> x(16, 0.5f);
    if (c.rank() >= 1)
      std::this_thread::sleep_for(
          std::chrono::duration<double>(argc > 2 ? std::atof(argv[2]) : 30));
    if (c.rank() > 1)
      return 0; // not a member
    c.setTimeout(1.0);
    c.setContext("step 1");
    Status s = c.allReduce(x.data(), x.data(), 16, ElementType::F32, Reduction::Sum, {1, 0});
    std::printf("rank %d: the all_reduce returned (%s)\n", c.rank(),
                s ? "ok" : s.message().c_str());
    return 0;
  }
  if (mode == "stall" || mode == "exit" || mode == "kill") {
    std::vector<float> x(4096, 0.5f);
    if (c.rank() == 1) {
      if (mode == "exit")
        std::_Exit(0); // gone without a word, no MPI_Finalize
      if (mode == "kill")
        std::raise(SIGKILL); // killed mid-run
      std::this_thread::sleep_for(
          std::chrono::duration<double>(argc > 2 ? std::atof(argv[2]) : 30));
    }
    c.setTimeout(1.0);
    c.setContext("step 3, bucket 1");
    Status s =
        c.allReduce(x.data(), x.data(), 4096, ElementType::F32, Reduction::Sum);
    // Not reached by a rank that timed out: MPI_Abort ended the job.
    std::printf("rank %d: the all_reduce returned (%s)\n", c.rank(),
                s ? "ok" : s.message().c_str());
    return 0;
  }
  std::fprintf(stderr, "usage: kiln-comm-mpi-test sequence|in-process N|stall "
                       "S|exit|launcher\n");
  return 1;
}
