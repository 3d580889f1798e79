//===- Replicas.cpp - Training on several devices -------------------------===//
#include "runtime/train/Replicas.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>
#include <unistd.h>

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

/// Appends `text` to `words` as its length, then its bytes in whole words.
void packText(std::vector<int64_t> &words, const std::string &text) {
  words.push_back(int64_t(text.size()));
  size_t at = words.size();
  words.resize(at + (text.size() + 7) / 8, 0);
  std::memcpy(words.data() + at, text.data(), text.size());
}

constexpr int kHostWords = 8; ///< a host name's words in the start exchange

/// This machine's name, at most 63 characters ("?" when it has none).
std::string hostName() {
  char name[sizeof(int64_t) * kHostWords + 1] = {};
  if (gethostname(name, sizeof(name) - 2) != 0 || !name[0])
    return "?";
  return std::string(name, strnlen(name, sizeof(int64_t) * kHostWords - 1));
}

} // namespace

StartAgreement agreeOnStart(comm::Communicator &c, const Status &mine) {
  StartAgreement a;
  a.report = c.rank() == 0;
  int n = c.size();
  // Each rank's (failed, exit code, message words, host name in 8 words),
  // then the messages in words of the longest.
  constexpr int kHead = 3 + kHostWords;
  int64_t words = int64_t(mine.message().size() + 7) / 8;
  int64_t head[kHead] = {mine ? 0 : 1, mine.exitCode(), words};
  std::string host = hostName();
  std::memcpy(head + 3, host.data(), host.size());
  std::vector<int64_t> heads(size_t(kHead * n));
  if (Status s = c.allGather(head, heads.data(), kHead, ElementType::I64); !s) {
    a.status = s;
    a.report = true;
    return a;
  }
  bool any = false;
  int64_t longest = 1;
  std::vector<std::pair<std::string, std::vector<int>>> hosts;
  for (int r = 0; r < n; ++r) {
    const int64_t *h = heads.data() + size_t(kHead * r);
    any = any || h[0];
    longest = std::max(longest, h[2] + 1);
    const char *name = reinterpret_cast<const char *>(h + 3);
    std::string hr(name, strnlen(name, sizeof(int64_t) * kHostWords));
    auto same = std::find_if(hosts.begin(), hosts.end(),
                             [&](const auto &x) { return x.first == hr; });
    if (same == hosts.end())
      hosts.push_back({hr, {r}});
    else
      same->second.push_back(r);
  }
  std::vector<std::string> where;
  for (const auto &[name, ranks] : hosts)
    where.push_back(fmt::format("{} {} on {}", ranks.size() == 1 ? "rank" : "ranks",
                                fmt::join(ranks, ", "), name));
  a.hosts = fmt::format("{}", fmt::join(where, "; "));
  if (!any)
    return a;
  std::vector<int64_t> text;
  packText(text, mine ? std::string() : mine.message());
  text.resize(size_t(longest), 0);
  std::vector<int64_t> all(size_t(longest * n));
  if (Status s = c.allGather(text.data(), all.data(), longest, ElementType::I64); !s) {
    a.status = s;
    a.report = true;
    return a;
  }
  // The distinct messages, in rank order, each with its ranks.
  std::vector<std::pair<std::string, std::vector<int>>> failed;
  int failedRanks = 0, firstCode = 0;
  for (int r = 0; r < n; ++r) {
    if (!heads[size_t(kHead * r)])
      continue;
    if (!failedRanks++)
      firstCode = int(heads[size_t(kHead * r + 1)]);
    const int64_t *at = all.data() + size_t(r * longest);
    std::string m(reinterpret_cast<const char *>(at + 1), size_t(at[0]));
    auto same = std::find_if(failed.begin(), failed.end(),
                             [&](const auto &f) { return f.first == m; });
    if (same == failed.end())
      failed.push_back({m, {r}});
    else
      same->second.push_back(r);
  }
  ErrorKind kind = firstCode == 2 ? ErrorKind::Internal : ErrorKind::User;
  if (failed.size() == 1 && failedRanks == n) {
    a.status = Status::error(failed[0].first, kind);
    return a;
  }
  std::vector<std::string> lines;
  for (const auto &[m, ranks] : failed)
    lines.push_back(fmt::format("{} {}: {}", ranks.size() == 1 ? "rank" : "ranks",
                                fmt::join(ranks, ", "), m));
  a.status = Status::error(
      lines.size() == 1
          ? lines[0]
          : fmt::format("{} of {} ranks could not start:\n  {}", failedRanks, n,
                        fmt::join(lines, "\n  ")),
      kind);
  return a;
}

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
    if (o.started && world > 1 && o.comms.size() == 1) {
      // Every rank opened its trainer, or each knows which did not.
      *o.started = agreeOnStart(*m->comm, t ? Status::ok() : t.status());
      if (!o.started->status)
        return o.started->status;
      if (c->rank() == 0 && !o.train.quiet)
        emit(out, Channel::Line, "  hosts: " + o.started->hosts);
    }
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
