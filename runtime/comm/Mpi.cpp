//===- Mpi.cpp - One process per rank, through MPI ------------------------===//

#include "runtime/comm/Mpi.h"

#include "runtime/comm/Launcher.h"
#include "runtime/comm/Reduce.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <map>
#include <mutex>
#include <thread>
#include <unistd.h>

namespace kiln::comm {

namespace {

using Clock = std::chrono::steady_clock;

/// The tag of point-to-point messages (collectives use none).
constexpr int kTag = 0x4b4c; // "KL"
/// Tags of the collectives built from point-to-point messages.
constexpr int kCollTag = kTag + 16;
/// An all_reduce whose members together send at most this many bytes to
/// each member ((n - 1) x the buffer) is one exchange of whole buffers,
/// each member reducing all of it, instead of a reduce-scatter then an
/// all-gather: half the round trips between ranks, which is what a small
/// collective costs (the loss, the gradient norm, a first bucket; the more
/// so when ranks share cores with other work), for the same bits (every
/// element is the same fold in member order).
constexpr int64_t kOnePhaseBytes = 1 << 20;

std::mutex initMutex;
bool initialisedHere = false;

void finalizeAtExit() { mpiFinalize(); }

std::string mpiError(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS)
    return fmt::format("MPI error {}", code);
  return std::string(text, len);
}

/// `bytes` as an MPI count, or an error for blocks over 2 GiB.
Expected<int> byteCount(int64_t bytes, const std::string &what) {
  if (bytes < 0 || bytes > INT_MAX)
    return Status::error(
        fmt::format("{}: a block of {} bytes is over MPI's 2 GiB count; split "
                    "the buffer into smaller collectives",
                    what, bytes));
  return int(bytes);
}

/// How long a rank that waits for a collective polls MPI before it starts
/// sleeping between polls: KILN_MPI_WAIT=spin (always), sleep (100 us) or
/// auto (the default: 2 ms when the ranks on this node are no more than its
/// online cores, else 100 us). Collective over `world`: every rank asks MPI
/// which ranks share its node.
Expected<std::chrono::microseconds> waitSpin(MPI_Comm world, int rank) {
  using us = std::chrono::microseconds;
  const char *env = std::getenv("KILN_MPI_WAIT");
  std::string mode = env ? env : "auto";
  // The split first (every rank takes part, whatever its setting), then
  // the setting's check.
  MPI_Comm node;
  int rc = MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank,
                               MPI_INFO_NULL, &node);
  if (rc != MPI_SUCCESS)
    return Status::error(fmt::format(
        "MPI_Comm_split_type (the ranks on this node) failed: {}",
        mpiError(rc)));
  int local = 1;
  MPI_Comm_size(node, &local);
  MPI_Comm_free(&node);
  if (mode != "spin" && mode != "sleep" && mode != "auto")
    return Status::error(fmt::format(
        "KILN_MPI_WAIT={} is not a waiting mode; use spin, sleep or auto",
        mode));
  if (mode == "spin")
    return us(int64_t(1) << 40); // ~12 days: past any --collective-timeout
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  return mode == "auto" && cores > 0 && local <= cores ? us(2000) : us(100);
}

} // namespace

struct MpiState {
  MPI_Comm world = MPI_COMM_WORLD;
  int rank = 0, size = 1;
  int exitCode = 3;
  std::function<void(const std::string &)> beforeAbort;
  std::map<std::vector<int>, MPI_Comm> groups;
  std::vector<char> scratch;
  /// How long a waited-for collective polls before sleeping (waitSpin()).
  std::chrono::microseconds spin{100};
};

void mpiFinalize() {
  std::lock_guard<std::mutex> lock(initMutex);
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  if (initialised && !finalised && initialisedHere)
    MPI_Finalize();
}

MpiCommunicator::MpiCommunicator() : state_(std::make_unique<MpiState>()) {}
MpiCommunicator::~MpiCommunicator() = default;

Expected<std::unique_ptr<MpiCommunicator>> MpiCommunicator::create() {
  Expected<LaunchEnv> env = detectLauncher();
  if (!env)
    return env.status();
  {
    std::lock_guard<std::mutex> lock(initMutex);
    int initialised = 0, finalised = 0;
    MPI_Initialized(&initialised);
    MPI_Finalized(&finalised);
    if (finalised)
      return Status::internal("MPI was already finalised in this process");
    if (!initialised) {
      int provided = 0;
      int rc =
          MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
      if (rc != MPI_SUCCESS)
        return Status::error(
            fmt::format("MPI_Init_thread failed: {}", mpiError(rc)));
      initialisedHere = true;
      std::atexit(finalizeAtExit);
      if (provided < MPI_THREAD_SERIALIZED)
        return Status::error(
            fmt::format("the MPI library offers thread level {}, Kiln needs "
                        "MPI_THREAD_SERIALIZED (calls "
                        "from one thread at a time, not always the main one)",
                        provided));
    }
  }
  std::unique_ptr<MpiCommunicator> comm(new MpiCommunicator());
  MpiState &s = *comm->state_;
  // Errors come back as codes so that a message can name the rank and op.
  MPI_Comm_set_errhandler(s.world, MPI_ERRORS_RETURN);
  MPI_Comm_rank(s.world, &s.rank);
  MPI_Comm_size(s.world, &s.size);
  if (Status st = checkLaunch(*env, s.rank, s.size, "MPI"); !st)
    return st;
  Expected<std::chrono::microseconds> spin = waitSpin(s.world, s.rank);
  if (!spin)
    return spin.status();
  s.spin = *spin;
  return comm;
}

int MpiCommunicator::rank() const { return state_->rank; }
int MpiCommunicator::size() const { return state_->size; }
void MpiCommunicator::setAbortExitCode(int code) { state_->exitCode = code; }
void MpiCommunicator::setBeforeAbort(
    std::function<void(const std::string &)> hook) {
  state_->beforeAbort = std::move(hook);
}

void MpiCommunicator::abort(const std::string &why) {
  std::string msg =
      fmt::format("rank {}: {}; aborting the job (MPI_Abort, exit code {})",
                  state_->rank, why, state_->exitCode);
  std::fprintf(stderr, "error: %s\n", msg.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  if (state_->beforeAbort)
    state_->beforeAbort(msg);
  MPI_Abort(state_->world, state_->exitCode);
  std::_Exit(state_->exitCode);
}

namespace {

/// Where a call runs: the group's communicator and this rank's index in it.
struct Where {
  MPI_Comm comm;
  int member;
  int n;
  std::vector<int> ranks;
};

} // namespace

// Helpers with access to the state; in a class so the header stays free of
// mpi.h.
class MpiOps {
public:
  MpiOps(MpiCommunicator &c, MpiState &s) : c(c), s(s) {}

  std::string where() const {
    return c.context().empty() ? "" : fmt::format(" at {}", c.context());
  }

  Status fail(const std::string &what, const std::string &why) const {
    return Status::error(
        fmt::format("rank {}: {}{}: {}", s.rank, what, where(), why));
  }

  Expected<Where> resolve(const Group &group, const std::string &what) {
    Where w;
    w.ranks = group;
    if (w.ranks.empty())
      for (int r = 0; r < s.size; ++r)
        w.ranks.push_back(r);
    std::vector<int> sorted = w.ranks;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() ||
        sorted.front() < 0 || sorted.back() >= s.size)
      return fail(what,
                  fmt::format("group [{}] must list distinct ranks of 0..{}",
                              fmt::join(w.ranks, ", "), s.size - 1));
    auto it = std::find(w.ranks.begin(), w.ranks.end(), s.rank);
    if (it == w.ranks.end())
      return fail(what, fmt::format("group [{}] does not contain this rank",
                                    fmt::join(w.ranks, ", ")));
    w.member = int(it - w.ranks.begin());
    w.n = int(w.ranks.size());
    bool isWorld = w.n == s.size;
    for (int k = 0; isWorld && k < w.n; ++k)
      isWorld = w.ranks[k] == k;
    if (isWorld) {
      w.comm = s.world;
      return w;
    }
    auto found = s.groups.find(w.ranks);
    if (found != s.groups.end()) {
      w.comm = found->second;
      return w;
    }
    if (Status met = meetBeforeCreating(w, what); !met)
      return met;
    MPI_Group worldGroup, sub;
    MPI_Comm_group(s.world, &worldGroup);
    MPI_Group_incl(worldGroup, w.n, w.ranks.data(), &sub);
    MPI_Comm comm = MPI_COMM_NULL;
    int rc = MPI_Comm_create_group(s.world, sub, /*tag=*/kTag + 1, &comm);
    MPI_Group_free(&sub);
    MPI_Group_free(&worldGroup);
    if (rc != MPI_SUCCESS)
      return fail(what, fmt::format("MPI_Comm_create_group for [{}] failed: {}",
                                    fmt::join(w.ranks, ", "), mpiError(rc)));
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    s.groups[w.ranks] = comm;
    w.comm = comm;
    return w;
  }

  /// MPI_Comm_create_group blocks until every member calls it and has no
  /// deadline of its own: the members first exchange a token naming the
  /// group (nonblocking, point to point, polled against the deadline like
  /// every other wait), so a member that never comes is named by the
  /// timeout instead of hanging the job. A member creating another group at
  /// this point (the ranks disagree on the order of the program's groups)
  /// is refused. After the meeting every member is at the call.
  Status meetBeforeCreating(const Where &w, const std::string &what) {
    uint64_t mine = 1469598103934665603ull; // FNV-1a of the ranks
    for (int r : w.ranks)
      for (int b = 0; b < 4; ++b)
        mine = (mine ^ uint64_t((unsigned(r) >> (8 * b)) & 0xff)) * 1099511628211ull;
    std::vector<uint64_t> theirs(size_t(w.n), 0);
    std::vector<MPI_Request> reqs;
    std::vector<int> peers;
    for (int k = 0; k < w.n; ++k) {
      if (k == w.member)
        continue;
      MPI_Request rq, sq;
      MPI_Irecv(&theirs[size_t(k)], 1, MPI_UINT64_T, w.ranks[size_t(k)], kTag + 2, s.world,
                &rq);
      MPI_Isend(&mine, 1, MPI_UINT64_T, w.ranks[size_t(k)], kTag + 2, s.world, &sq);
      reqs.insert(reqs.end(), {rq, sq});
      peers.insert(peers.end(), {w.ranks[size_t(k)], w.ranks[size_t(k)]});
    }
    waitAll(reqs, peers,
            fmt::format("{} (creating the communicator of ranks [{}]: MPI_Comm_create_group)",
                        what, fmt::join(w.ranks, ", ")),
            &w);
    for (int k = 0; k < w.n; ++k)
      if (k != w.member && theirs[size_t(k)] != mine)
        return fail(what, fmt::format("rank {} is creating the communicator of another group "
                                      "than [{}] at this point: the ranks run different "
                                      "programs",
                                      w.ranks[size_t(k)], fmt::join(w.ranks, ", ")));
    return Status::ok();
  }

  /// Polls `req` until it completes; a missed deadline or an MPI error
  /// ends the job with a message naming the rank, the op and the context.
  void wait(MPI_Request &req, const std::string &what, const Where *w,
            int peer = -1, MPI_Status *status = nullptr) {
    std::vector<MPI_Request> reqs{req};
    std::vector<int> peers{peer};
    std::vector<MPI_Status> statuses(1);
    waitAll(reqs, peers, what, w, &statuses);
    req = reqs[0];
    if (status)
      *status = statuses[0];
  }

  /// Polls every request until all complete (see wait()); `peers[i]` is
  /// the world rank request i exchanges with (-1: the whole group), so a
  /// timeout names the ranks that did not take part.
  void waitAll(std::vector<MPI_Request> &reqs, const std::vector<int> &peers,
               const std::string &what, const Where *w,
               std::vector<MPI_Status> *statuses = nullptr) {
    auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(c.timeout()));
    std::vector<MPI_Status> local(reqs.size());
    std::vector<MPI_Status> &st = statuses ? *statuses : local;
    st.resize(reqs.size());
    int lazy = 0;
    Clock::time_point spinUntil;
    bool wasWaited = false;
    for (long polls = 0;; ++polls) {
      int done = 0;
      int rc = MPI_Testall(int(reqs.size()), reqs.data(), &done, st.data());
      if (rc != MPI_SUCCESS)
        c.abort(fmt::format("{}{} failed: {}", what, where(), mpiError(rc)));
      if (done)
        return;
      if (Clock::now() > deadline) {
        std::vector<int> missing;
        bool group = false;
        // MPI_Testall leaves completed requests alone while others are
        // pending: test each to see which peers did not answer.
        bool all = true;
        for (size_t i = 0; i < reqs.size(); ++i) {
          int one = 0;
          if (reqs[i] != MPI_REQUEST_NULL)
            MPI_Test(&reqs[i], &one, &st[i]);
          all = all && reqs[i] == MPI_REQUEST_NULL;
        }
        // The last requests completed in these tests, at the deadline:
        // the call did not time out (and there is no rank to name).
        if (all)
          return;
        for (size_t i = 0; i < reqs.size(); ++i)
          if (reqs[i] != MPI_REQUEST_NULL) {
            if (peers[i] < 0)
              group = true;
            else if (std::find(missing.begin(), missing.end(), peers[i]) ==
                     missing.end())
              missing.push_back(peers[i]);
          }
        std::string who;
        if (group) {
          std::vector<int> others;
          if (w)
            for (int r : w->ranks)
              if (r != s.rank)
                others.push_back(r);
          // (A group of two: the other member is the one missing.)
          who = others.empty()
                    ? std::string("another rank of the group did not take part")
                : others.size() == 1
                    ? fmt::format("rank(s) {} did not take part", others[0])
                    : fmt::format("one of ranks {} did not take part",
                                  fmt::join(others, ", "));
        } else {
          std::sort(missing.begin(), missing.end());
          who = fmt::format("rank(s) {} did not take part",
                            fmt::join(missing, ", "));
        }
        c.abort(fmt::format("{}{} timed out after {} s: {} (dead, stalled or "
                            "making other calls); "
                            "raise --collective-timeout if it is only slow",
                            what, where(), c.timeout(), who));
      }
      // Waited for: poll for a while (MPI progresses inside MPI_Test; the
      // peer is usually there already, and each sleep delays the next step
      // of a rendezvous, which needs both sides in MPI_Test, by the sleep
      // and its timer slack: a 2.4 MiB all_reduce took 0.79 ms with 50 us
      // sleeps against 0.43 ms polling, bench/dp.sh's machine), then sleep
      // 50 us between polls, so a waiting rank leaves the core to others
      // on a small machine and,
      // having slept rather than yielded, gets it back as soon as it wakes
      // (a thread that spins on sched_yield while another process wants
      // the core runs once per time slice of that process). The polling
      // lasts 2 ms when every rank on the node has a core of its own, 100
      // us when they share cores (waitSpin(), KILN_MPI_WAIT). Overlapping
      // compute (a gradient bucket on a communication thread): a few quick
      // polls, then sleeps growing to 0.4 ms, so the thread takes almost
      // no time from compute on the same cores; it polls again once
      // compute waits for it.
      bool waited = c.waitedFor();
      if (waited && !wasWaited) // from the start, or since compute waits
        spinUntil = Clock::now() + s.spin;
      wasWaited = waited;
      if (waited) {
        lazy = 0;
        if (Clock::now() > spinUntil)
          std::this_thread::sleep_for(std::chrono::microseconds(50));
      } else if (polls >= 16) {
        std::this_thread::sleep_for(std::chrono::microseconds(50 << std::min(lazy++, 3)));
      }
    }
  }

  /// Point-to-point exchange with the other members: `recvAt(k)`/`sendAt(k)`
  /// give member k's buffer and byte count; waits for all.
  template <typename RecvAt, typename SendAt>
  void exchange(const Where &w, int tag, RecvAt recvAt, SendAt sendAt,
                const std::string &what) {
    std::vector<MPI_Request> reqs;
    std::vector<int> peers;
    for (int k = 0; k < w.n; ++k) {
      if (k == w.member)
        continue;
      auto [buf, bytes] = recvAt(k);
      MPI_Request r;
      int rc = MPI_Irecv(buf, int(bytes), MPI_BYTE, k, tag, w.comm, &r);
      if (rc != MPI_SUCCESS)
        c.abort(fmt::format("{}{}: MPI_Irecv failed: {}", what, where(),
                            mpiError(rc)));
      reqs.push_back(r);
      peers.push_back(w.ranks[k]);
    }
    for (int j = 1; j < w.n; ++j) {
      int k = (w.member + j) % w.n; // everyone starts with a different peer
      auto [buf, bytes] = sendAt(k);
      MPI_Request r;
      int rc = MPI_Isend(buf, int(bytes), MPI_BYTE, k, tag, w.comm, &r);
      if (rc != MPI_SUCCESS)
        c.abort(fmt::format("{}{}: MPI_Isend failed: {}", what, where(),
                            mpiError(rc)));
      reqs.push_back(r);
      peers.push_back(w.ranks[k]);
    }
    waitAll(reqs, peers, what, &w);
  }

  MpiCommunicator &c;
  MpiState &s;
};

Status MpiCommunicator::allReduce(const void *send, void *recv, int64_t count,
                                  ElementType type, Reduction r,
                                  const Group &group) {
  MpiOps ops(*this, *state_);
  std::string what = describeOp("all_reduce", count, type, &r);
  if (Status st = checkReducible(type, "all_reduce"); !st)
    return ops.fail(what, st.message());
  Expected<Where> w = ops.resolve(group, what);
  if (!w)
    return w.status();
  int n = w->n, m = w->member;
  int64_t es = dtypeBytes(type), block = (count + n - 1) / std::max(n, 1);
  auto len = [&](int k) {
    return std::clamp<int64_t>(count - k * block, 0, block);
  };
  // Displacements are bytes from the buffer's start: MPI's int counts
  // bound the whole buffer, not just a block.
  if (Expected<int> ok = byteCount(count * es, what); !ok)
    return ok.status();
  int64_t mine = len(m);
  std::vector<char> &scratch = state_->scratch;
  char *out = static_cast<char *>(recv);
  const char *in0 = static_cast<const char *>(send);
  using Span = std::pair<void *, int64_t>;
  if (int64_t(n - 1) * count * es <= kOnePhaseBytes) {
    // One exchange: every member's whole buffer into scratch slot k (ours
    // stays in place), then the whole fold here.
    scratch.resize(std::max<size_t>(scratch.size(), size_t(n * count * es)));
    ops.exchange(
        *w, kCollTag + 4,
        [&](int k) {
          return Span{scratch.data() + k * count * es, count * es};
        },
        [&](int) {
          return Span{const_cast<char *>(in0), count * es};
        },
        what);
    std::vector<const void *> in(n);
    for (int k = 0; k < n; ++k)
      in[k] = k == m ? in0 : scratch.data() + k * count * es;
    if (Status st = reduceBlocks(out, in.data(), n, count, type, r, n, sumOrder_); !st)
      return ops.fail(what, st.message());
    return Status::ok();
  }
  scratch.resize(std::max<size_t>(scratch.size(), size_t(n * mine * es)));
  // Member k's block m of `send` into scratch slot k; ours stays in place.
  ops.exchange(
      *w, kCollTag,
      [&](int k) {
        return Span{scratch.data() + k * mine * es, mine * es};
      },
      [&](int k) {
        return Span{const_cast<char *>(in0) + k * block * es, len(k) * es};
      },
      what);
  std::vector<const void *> in(n);
  for (int k = 0; k < n; ++k)
    in[k] = k == m ? in0 + m * block * es : scratch.data() + k * mine * es;
  if (Status st = reduceBlocks(out + m * block * es, in.data(), n, mine, type,
                               r, n, sumOrder_);
      !st)
    return ops.fail(what, st.message());
  // Our reduced block to everyone; theirs into place.
  ops.exchange(
      *w, kCollTag + 1,
      [&](int k) {
        return Span{out + k * block * es, len(k) * es};
      },
      [&](int k) {
        return Span{out + m * block * es, mine * es};
      },
      what);
  return Status::ok();
}

Status MpiCommunicator::reduceScatter(const void *send, void *recv,
                                      int64_t recvCount, ElementType type,
                                      Reduction r, const Group &group) {
  MpiOps ops(*this, *state_);
  std::string what = describeOp("reduce_scatter", recvCount, type, &r);
  if (Status st = checkReducible(type, "reduce_scatter"); !st)
    return ops.fail(what, st.message());
  Expected<Where> w = ops.resolve(group, what);
  if (!w)
    return w.status();
  int n = w->n;
  int64_t bytes = recvCount * dtypeBytes(type);
  Expected<int> count = byteCount(bytes * n, what);
  if (!count)
    return count.status();
  std::vector<char> &scratch = state_->scratch;
  scratch.resize(std::max<size_t>(scratch.size(), size_t(n * bytes)));
  int m = w->member;
  const char *in0 = static_cast<const char *>(send);
  using Span = std::pair<void *, int64_t>;
  ops.exchange(
      *w, kCollTag + 2,
      [&](int k) {
        return Span{scratch.data() + k * bytes, bytes};
      },
      [&](int k) {
        return Span{const_cast<char *>(in0) + k * bytes, bytes};
      },
      what);
  std::vector<const void *> in(n);
  for (int k = 0; k < n; ++k)
    in[k] = k == m ? in0 + m * bytes : scratch.data() + k * bytes;
  if (Status st =
          reduceBlocks(recv, in.data(), n, recvCount, type, r, n, sumOrder_);
      !st)
    return ops.fail(what, st.message());
  return Status::ok();
}

Status MpiCommunicator::allGather(const void *send, void *recv,
                                  int64_t sendCount, ElementType type,
                                  const Group &group) {
  MpiOps ops(*this, *state_);
  std::string what = describeOp("all_gather", sendCount, type);
  Expected<Where> w = ops.resolve(group, what);
  if (!w)
    return w.status();
  int64_t bytes = sendCount * dtypeBytes(type);
  Expected<int> count = byteCount(bytes * w->n, what);
  if (!count)
    return count.status();
  char *out = static_cast<char *>(recv);
  int m = w->member;
  using Span = std::pair<void *, int64_t>;
  ops.exchange(
      *w, kCollTag + 3,
      [&](int k) {
        return Span{out + k * bytes, bytes};
      },
      [&](int) {
        return Span{const_cast<void *>(send), bytes};
      },
      what);
  if (send != out + m * bytes) // not in place: our own block too
    std::memcpy(out + m * bytes, send, bytes);
  return Status::ok();
}

Status MpiCommunicator::broadcast(void *buffer, int64_t count, ElementType type,
                                  int root, const Group &group) {
  MpiOps ops(*this, *state_);
  std::string what =
      fmt::format("broadcast ({} x {}, root {})", count, dtypeName(type), root);
  Expected<Where> w = ops.resolve(group, what);
  if (!w)
    return w.status();
  if (root < 0 || root >= w->n)
    return ops.fail(
        what, fmt::format("root {} is not a member index of the group", root));
  Expected<int> bytes = byteCount(count * dtypeBytes(type), what);
  if (!bytes)
    return bytes.status();
  MPI_Request req;
  int rc = MPI_Ibcast(buffer, *bytes, MPI_BYTE, root, w->comm, &req);
  if (rc != MPI_SUCCESS)
    return ops.fail(what, "MPI_Ibcast: " + mpiError(rc));
  ops.wait(req, what, &*w);
  return Status::ok();
}

Status MpiCommunicator::send(const void *buffer, int64_t count,
                             ElementType type, int peer) {
  MpiOps ops(*this, *state_);
  std::string what =
      fmt::format("send ({} x {} to rank {})", count, dtypeName(type), peer);
  if (peer < 0 || peer >= state_->size || peer == state_->rank)
    return ops.fail(
        what, fmt::format("peer {} is not another rank of this world of {}",
                          peer, state_->size));
  Expected<int> bytes = byteCount(count * dtypeBytes(type), what);
  if (!bytes)
    return bytes.status();
  MPI_Request req;
  int rc = MPI_Isend(buffer, *bytes, MPI_BYTE, peer, kTag, state_->world, &req);
  if (rc != MPI_SUCCESS)
    return ops.fail(what, "MPI_Isend: " + mpiError(rc));
  ops.wait(req, what, nullptr, peer);
  return Status::ok();
}

Status MpiCommunicator::recv(void *buffer, int64_t count, ElementType type,
                             int peer) {
  MpiOps ops(*this, *state_);
  std::string what =
      fmt::format("recv ({} x {} from rank {})", count, dtypeName(type), peer);
  if (peer < 0 || peer >= state_->size || peer == state_->rank)
    return ops.fail(
        what, fmt::format("peer {} is not another rank of this world of {}",
                          peer, state_->size));
  Expected<int> bytes = byteCount(count * dtypeBytes(type), what);
  if (!bytes)
    return bytes.status();
  MPI_Request req;
  int rc = MPI_Irecv(buffer, *bytes, MPI_BYTE, peer, kTag, state_->world, &req);
  if (rc != MPI_SUCCESS)
    return ops.fail(what, "MPI_Irecv: " + mpiError(rc));
  MPI_Status status;
  ops.wait(req, what, nullptr, peer, &status);
  int got = 0;
  MPI_Get_count(&status, MPI_BYTE, &got);
  if (got != *bytes)
    return ops.fail(
        what, fmt::format("rank {} sent {} bytes, this receive expects {}; the "
                          "ranks disagree on the message",
                          peer, got, *bytes));
  return Status::ok();
}

} // namespace kiln::comm
