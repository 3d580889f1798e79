//===- Replicas.cpp - Training on several devices -------------------------===//
#include "runtime/train/Replicas.h"

#include <fmt/format.h>

#include <atomic>
#include <mutex>
#include <thread>

namespace kiln::train {

namespace {

/// `s` with "rank R: " in front unless its message starts so already: every
/// failure of a run on several devices names the rank it happened on (a
/// checkpoint that rank 0 alone writes, a data error in one replica's
/// shard), not only the collectives' own messages.
Status namingRank(const Status &s, int rank) {
  std::string prefix = fmt::format("rank {}: ", rank);
  if (s.message().compare(0, prefix.size(), prefix) == 0)
    return s;
  return Status::error(prefix + s.message(), s.kind());
}

} // namespace

Expected<ReplicaRun> trainReplicas(const Package &pkg, const ReplicaOptions &o,
                                   Sink out) {
  if (o.comms.empty() || !o.backend)
    return Status::internal(
        "trainReplicas: no communicators or no backend factory");
  int world = o.comms[0]->size();
  ReplicaRun run;
  if (pkg.program.numDevices() != world)
    return Status::error(
        fmt::format("{} was compiled for {} device(s), but {} gives {}; "
                    "recompile with kilnc --devices {}",
                    o.train.artifact, pkg.program.numDevices(),
                    o.how.empty() ? "this run" : o.how, world, world));

  // Models and backends one at a time, in device order: the first compiles
  // the kernels, the others load them from the cache.
  std::atomic<bool> cancel{false};
  std::vector<std::unique_ptr<Trainer>> trainers;
  for (size_t i = 0; i < o.comms.size(); ++i) {
    comm::Communicator *c = o.comms[i];
    auto m = std::make_unique<Model>();
    m->pkg = pkg;
    m->comm = o.hostComms.empty() ? c : o.hostComms[i];
    m->device = c->rank();
    TrainOptions to = o.train;
    to.rank = c->rank();
    to.worldSize = world;
    to.cancel = &cancel;
    // --trace: one tracer per replica; --profile alone: rank 0's (the
    // overview's).
    if (i < o.tracers.size())
      to.tracer = o.tracers[i];
    else if (c->rank() != 0)
      to.tracer = nullptr;
    auto t = Trainer::open(*m, to, o.backend(c->rank(), c), out);
    if (!t) {
      // The other processes of an MPI world find this rank missing at the
      // handshake and stop within their timeout.
      return world > 1 && o.comms.size() == 1
                 ? Status::error(fmt::format("rank {}: {}", c->rank(),
                                             t.status().message()),
                                 t.status().kind())
                 : t.status();
    }
    trainers.push_back(std::move(*t));
    run.models.push_back(std::move(m));
  }

  std::mutex mu;
  std::optional<Status> failure;
  int failedRank = 0;
  std::vector<std::optional<TrainResult>> results(trainers.size());
  bool inProcess = o.comms.size() > 1;
  // A replica whose call failed because another aborted the run reports
  // that ("... failed: the run was aborted (<why>)"), and may get here
  // before the replica that aborted it: the cause replaces such a report.
  auto knockOn = comm::abortedByOther;
  auto fail = [&](const Status &s, int rank) {
    std::lock_guard<std::mutex> lock(mu);
    if (!failure || (knockOn(*failure) && !knockOn(s))) {
      failure = s;
      failedRank = rank;
    }
    cancel = true;
    // In-process: wake the replicas waiting in a collective at once. (A
    // process of an MPI world leaves the abort to its caller, which says
    // why first: MPI_Abort ends the job.)
    if (inProcess) {
      for (comm::Communicator *c : o.comms)
        c->abort(s.message());
      for (comm::Communicator *c : o.hostComms)
        c->abort(s.message());
    }
  };
  auto body = [&](size_t i) {
    if (o.handshake)
      if (Status s = o.handshake(*run.models[i]->comm, *run.models[i]); !s) {
        fail(s, o.comms[i]->rank());
        return;
      }
    auto r = trainers[i]->run();
    if (!r) {
      fail(r.status(), o.comms[i]->rank());
      return;
    }
    results[i] = *r;
  };
  if (!inProcess) {
    body(0);
  } else {
    std::vector<std::thread> threads;
    for (size_t i = 0; i < trainers.size(); ++i)
      threads.emplace_back(body, i);
    for (std::thread &t : threads)
      t.join();
  }
  if (failure)
    return world > 1 ? namingRank(*failure, failedRank) : *failure;
  for (auto &r : results)
    if (r && !r->left) {
      run.result = *r;
      return run;
    }
  // Every replica here left the run (fault injection).
  return Status::error(fmt::format("rank {} left the run (KILN_FAULT_INJECT)",
                                   o.comms[0]->rank()));
}

} // namespace kiln::train
