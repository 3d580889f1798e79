//===- ExecutorMpiMain.cpp - CPU executors on MPI ranks
//---------------------===//
//
// Run by executor-mpi-test.sh: the mesh program of MeshProgram.h (all_reduce
// on queue 1 overlapping a copy, reduce_scatter, all_gather) executed by one
// CPU executor per MPI rank, after the start-up handshake, must give the
// same bits as the same executors on in-process ranks (threads of one
// process): the communication thread drives the MPI communicator as it
// drives the in-process one, and so do the executors' own threads with no
// communication thread (ExecutorOptions::commThread Off). Modes:
//   mpi                 every rank prints "rank R <hex digest of its results>"
//                       (collectives on the executor's thread)
//   mpi-thread          the same, through a communication thread
//   in-process N        the same lines from N threads
//   mismatch            rank 1 claims another artifact hash: every rank
//                       prints the handshake's refusal and exits 1
//   pipeline            the two-stage plan of PipelineProgram.h (mesh
//                       ["pp", 2], or ["pp", 2, "dp", 2] on 4 ranks): each
//                       rank checks that the stage-0 rank of its dp
//                       coordinate's x arrived (send/recv over "pp" to the
//                       right world rank, then a broadcast from stage 1)
//                       and prints "rank R pipeline ok", or the difference
//
//===----------------------------------------------------------------------===//
#include "runtime/comm/InProcess.h"
#include "runtime/comm/Mpi.h"
#include "runtime/core/Handshake.h"
#include "runtime/cpu/Executor.h"
#include "test/unit/runtime/MeshProgram.h"
#include "test/unit/runtime/PipelineProgram.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

using namespace kiln;

namespace {

/// Runs rank `r`'s executor twice on inputs seeded by the rank; the FNV-1a
/// digest of every result buffer, or the error.
Expected<std::string> runRank(comm::Communicator &c, const std::string &hash,
                              bool commThread = false) {
  program::Program p = test::meshProgram(c.size());
  if (Status s = checkSameProgram(c, p, hash); !s)
    return s;
  cpu::ExecutorOptions o;
  o.communicator = &c;
  o.commThread = commThread ? cpu::ExecutorOptions::CommThread::On
                            : cpu::ExecutorOptions::CommThread::Off;
  auto e = cpu::Executor::create(p, nullptr, o);
  if (!e)
    return e.status();
  std::mt19937 rng(uint32_t(1000 + c.rank()));
  std::normal_distribution<float> dist;
  std::vector<float> g(test::kN), x(test::kN);
  for (int64_t i = 0; i < test::kN; ++i) {
    g[size_t(i)] = dist(rng);
    x[size_t(i)] = dist(rng);
  }
  std::string all;
  for (int run = 0; run < 2; ++run) {
    if (Status s = (*e)->write(0, g.data(), g.size() * 4); !s)
      return s;
    if (Status s = (*e)->write(4, x.data(), x.size() * 4); !s)
      return s;
    (*e)->setContext("run " + std::to_string(run));
    if (Status s = (*e)->run("train_step"); !s)
      return s;
    for (int id : {0, 1, 2, 3, 5}) {
      auto v = (*e)->readAll<float>(id);
      if (!v)
        return v.status();
      all.append(reinterpret_cast<const char *>(v->data()), v->size() * 4);
    }
  }
  return contentHash(all.data(), all.size());
}

/// The pipeline mode: rank r sends x = 100 r + i from stage 0; every rank
/// must end with the x of the stage-0 rank of its dp coordinate in "out",
/// and a stage-1 rank with w1 in d1. "" or what differs.
Expected<std::string> runPipelineRank(comm::Communicator &c) {
  namespace pl = test::pipeline;
  int dp = c.size() / 2;
  program::Program p = pl::pipelineProgram(dp);
  cpu::ExecutorOptions o;
  o.communicator = &c;
  o.commThread = cpu::ExecutorOptions::CommThread::On;
  auto e = cpu::Executor::create(p, nullptr, o);
  if (!e)
    return e.status();
  int r = c.rank(), stage = p.stageOf(r);
  std::vector<float> x(pl::kN), w1(pl::kN);
  for (int64_t i = 0; i < pl::kN; ++i) {
    x[size_t(i)] = float(100 * r + i);
    w1[size_t(i)] = float(50 + i);
  }
  if (stage == 1)
    if (Status s = (*e)->write(pl::W1, w1.data(), w1.size() * 4); !s)
      return s;
  if (Status s = (*e)->write(pl::X, x.data(), x.size() * 4); !s)
    return s;
  if (Status s = (*e)->run("train_step"); !s)
    return s;
  auto out = (*e)->readAll<float>(pl::Out);
  if (!out)
    return out.status();
  std::string why;
  for (int64_t i = 0; i < pl::kN; ++i)
    if ((*out)[size_t(i)] != float(100 * (r % dp) + i))
      why += " out[" + std::to_string(i) +
             "] = " + std::to_string((*out)[size_t(i)]);
  if (stage == 1) {
    auto d1 = (*e)->readAll<float>(pl::D1);
    if (!d1)
      return d1.status();
    if (*d1 != w1)
      why += " d1 is not w1";
  }
  return why;
}

int fail(const Status &s) {
  std::fprintf(stderr, "%s\n", s.message().c_str());
  return 1;
}

} // namespace

int main(int argc, char **argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "in-process") {
    int n = argc > 2 ? std::atoi(argv[2]) : 2;
    auto comms = comm::makeInProcessCommunicators(n);
    std::vector<std::string> out(static_cast<size_t>(n));
    std::vector<std::thread> ts;
    for (int r = 0; r < n; ++r)
      ts.emplace_back([&, r] {
        comms[size_t(r)]->setTimeout(30);
        auto h = runRank(*comms[size_t(r)], "artifact-a");
        out[size_t(r)] = h ? *h : "error: " + h.status().message();
      });
    for (std::thread &t : ts)
      t.join();
    for (int r = 0; r < n; ++r)
      std::printf("rank %d %s\n", r, out[size_t(r)].c_str());
    return 0;
  }
  if (mode != "mpi" && mode != "mpi-thread" && mode != "mismatch" &&
      mode != "pipeline") {
    std::fprintf(
        stderr,
        "usage: %s mpi | mpi-thread | mismatch | pipeline | in-process N\n",
        argv[0]);
    return 2;
  }
  auto c = comm::MpiCommunicator::create();
  if (!c)
    return fail(c.status());
  (*c)->setTimeout(30);
  if (mode == "pipeline") {
    auto why = runPipelineRank(**c);
    if (!why)
      return fail(why.status());
    std::printf("rank %d pipeline %s\n", (*c)->rank(),
                why->empty() ? "ok" : why->c_str());
    return why->empty() ? 0 : 1;
  }
  std::string hash =
      mode == "mismatch" && (*c)->rank() == 1 ? "artifact-b" : "artifact-a";
  auto h = runRank(**c, hash, mode == "mpi-thread");
  if (!h)
    return fail(h.status());
  std::printf("rank %d %s\n", (*c)->rank(), h->c_str());
  return 0;
}
