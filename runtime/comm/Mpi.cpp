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

namespace kiln::comm {

namespace {

using Clock = std::chrono::steady_clock;

/// The tag of point-to-point messages (collectives use none).
constexpr int kTag = 0x4b4c; // "KL"

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

} // namespace

struct MpiState {
  MPI_Comm world = MPI_COMM_WORLD;
  int rank = 0, size = 1;
  int exitCode = 3;
  std::function<void(const std::string &)> beforeAbort;
  std::map<std::vector<int>, MPI_Comm> groups;
  std::vector<char> scratch;
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

  /// Polls `req` until it completes; a missed deadline or an MPI error
  /// ends the job with a message naming the rank, the op and the context.
  void wait(MPI_Request &req, const std::string &what, const Where *w,
            int peer = -1, MPI_Status *status = nullptr) {
    auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(c.timeout()));
    MPI_Status local;
    for (long polls = 0;; ++polls) {
      int done = 0;
      int rc = MPI_Test(&req, &done, status ? status : &local);
      if (rc != MPI_SUCCESS)
        c.abort(fmt::format("{}{} failed: {}", what, where(), mpiError(rc)));
      if (done)
        return;
      if (Clock::now() > deadline) {
        std::vector<int> others;
        if (w)
          for (int r : w->ranks)
            if (r != s.rank)
              others.push_back(r);
        std::string who =
            peer >= 0 ? fmt::format("rank {}", peer)
                      : fmt::format("one of ranks {}", fmt::join(others, ", "));
        c.abort(fmt::format(
            "{}{} timed out after {} s: {} did not take part (dead, stalled "
            "or making other calls); raise --collective-timeout if it is only "
            "slow",
            what, where(), c.timeout(), who));
      }
      // Spin briefly (MPI progresses inside MPI_Test), then back off so a
      // waiting rank leaves the core to the others on a small machine.
      if (polls < 2000)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
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
  if (Expected<int> ok = byteCount(block * es, what); !ok)
    return ok.status();
  std::vector<int> sendCounts(n), sendDispls(n), recvCounts(n), recvDispls(n);
  int64_t mine = len(m);
  for (int k = 0; k < n; ++k) {
    sendCounts[k] = int(len(k) * es);
    sendDispls[k] = int(std::min<int64_t>(k * block * es, INT_MAX));
    recvCounts[k] = int(mine * es);
    recvDispls[k] = int(k * mine * es);
  }
  if (Expected<int> ok = byteCount(n * mine * es, what); !ok)
    return ok.status();
  std::vector<char> &scratch = state_->scratch;
  scratch.resize(std::max<size_t>(scratch.size(), size_t(n * mine * es)));
  MPI_Request req;
  int rc = MPI_Ialltoallv(send, sendCounts.data(), sendDispls.data(), MPI_BYTE,
                          scratch.data(), recvCounts.data(), recvDispls.data(),
                          MPI_BYTE, w->comm, &req);
  if (rc != MPI_SUCCESS)
    return ops.fail(what, "MPI_Ialltoallv: " + mpiError(rc));
  ops.wait(req, what, &*w);
  std::vector<const void *> in(n);
  for (int k = 0; k < n; ++k)
    in[k] = scratch.data() + k * mine * es;
  if (Status st = reduceBlocks(static_cast<char *>(recv) + m * block * es,
                               in.data(), n, mine, type, r, n);
      !st)
    return ops.fail(what, st.message());
  for (int k = 0; k < n; ++k) {
    recvCounts[k] = sendCounts[k];
    recvDispls[k] = sendDispls[k];
  }
  rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv,
                       recvCounts.data(), recvDispls.data(), MPI_BYTE, w->comm,
                       &req);
  if (rc != MPI_SUCCESS)
    return ops.fail(what, "MPI_Iallgatherv: " + mpiError(rc));
  ops.wait(req, what, &*w);
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
  MPI_Request req;
  int rc = MPI_Ialltoall(send, int(bytes), MPI_BYTE, scratch.data(), int(bytes),
                         MPI_BYTE, w->comm, &req);
  if (rc != MPI_SUCCESS)
    return ops.fail(what, "MPI_Ialltoall: " + mpiError(rc));
  ops.wait(req, what, &*w);
  std::vector<const void *> in(n);
  for (int k = 0; k < n; ++k)
    in[k] = scratch.data() + k * bytes;
  if (Status st = reduceBlocks(recv, in.data(), n, recvCount, type, r, n); !st)
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
  bool inPlace = send == static_cast<char *>(recv) + w->member * bytes;
  MPI_Request req;
  int rc = MPI_Iallgather(inPlace ? MPI_IN_PLACE : send, int(bytes), MPI_BYTE,
                          recv, int(bytes), MPI_BYTE, w->comm, &req);
  if (rc != MPI_SUCCESS)
    return ops.fail(what, "MPI_Iallgather: " + mpiError(rc));
  ops.wait(req, what, &*w);
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
