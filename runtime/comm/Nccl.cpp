//===- Nccl.cpp - GPUs through NCCL ---------------------------------------===//

#include "runtime/comm/Nccl.h"

#include "runtime/comm/Reduce.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <map>
#include <mutex>
#include <thread>

namespace kiln::comm {

namespace {

using Clock = std::chrono::steady_clock;

Status ncclStatus(ncclResult_t r, const char *call, const char *file,
                  int line) {
  if (r == ncclSuccess || r == ncclInProgress)
    return Status::ok();
  const char *last = ncclGetLastError(nullptr);
  return Status::error(fmt::format(
      "{} failed at {}:{}: {}{}{}", call, sourcePath(file), line,
      ncclGetErrorString(r), last && *last ? ": " : "", last ? last : ""));
}

Status cudaStatus(cudaError_t r, const char *call, const char *file, int line) {
  if (r == cudaSuccess)
    return Status::ok();
  return Status::error(fmt::format("{} failed at {}:{}: {} ({})", call,
                                   sourcePath(file), line, cudaGetErrorName(r),
                                   cudaGetErrorString(r)));
}

#define NCCL_CHECK(call) ncclStatus((call), #call, __FILE__, __LINE__)
#define CUDART_CHECK(call) cudaStatus((call), #call, __FILE__, __LINE__)
#define KILN_TRY(expr)                                                         \
  do {                                                                         \
    if (Status s_ = (expr); !s_)                                               \
      return s_;                                                               \
  } while (0)

Expected<ncclDataType_t> ncclType(ElementType t) {
  switch (t) {
  case ElementType::F32:
    return ncclFloat32;
  case ElementType::F64:
    return ncclFloat64;
  case ElementType::F16:
    return ncclFloat16;
  case ElementType::BF16:
    return ncclBfloat16;
  case ElementType::I32:
    return ncclInt32;
  case ElementType::I64:
    return ncclInt64;
  case ElementType::I1:
    break;
  }
  return Status::error(
      "NCCL: i1 (boolean) buffers are not communicated; use i32");
}

ncclRedOp_t ncclOp(Reduction r) {
  switch (r) {
  case Reduction::Sum:
    return ncclSum;
  case Reduction::Mean:
    return ncclAvg;
  case Reduction::Max:
    return ncclMax;
  case Reduction::Min:
    return ncclMin;
  }
  return ncclSum;
}

} // namespace

/// The communicators of one process's world: abort() reaches all of them.
struct NcclWorld {
  std::mutex mu;
  bool aborted = false;
  std::string reason;
  std::vector<ncclComm_t> comms; ///< every world and group communicator
};

struct NcclState {
  std::shared_ptr<NcclWorld> world;
  ncclComm_t comm = nullptr;
  int rank = 0, size = 1, device = 0;
  cudaStream_t compute = nullptr, stream = nullptr;
  bool ownStream = false, blocking = true;
  cudaEvent_t ready = nullptr, done = nullptr;
  std::map<std::vector<int>, ncclComm_t> groups;
  std::string lastOp = "no collective yet";
};

NcclCommunicator::NcclCommunicator() : state_(std::make_unique<NcclState>()) {}

NcclCommunicator::~NcclCommunicator() {
  NcclState &s = *state_;
  if (!s.world)
    return;
  (void)cudaSetDevice(s.device);
  bool finished = !s.done || cudaEventQuery(s.done) == cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(s.world->mu);
    if (!s.world->aborted) {
      // Destroy can wait forever on a collective that will never finish.
      auto end = finished ? ncclCommDestroy : ncclCommAbort;
      for (auto &[g, c] : s.groups)
        (void)end(c);
      if (s.comm)
        (void)end(s.comm);
      auto &all = s.world->comms;
      all.erase(std::remove_if(all.begin(), all.end(),
                               [&](ncclComm_t c) {
                                 if (c == s.comm)
                                   return true;
                                 for (auto &[g, gc] : s.groups)
                                   if (gc == c)
                                     return true;
                                 return false;
                               }),
                all.end());
    }
  }
  if (s.ready)
    (void)cudaEventDestroy(s.ready);
  if (s.done)
    (void)cudaEventDestroy(s.done);
  if (s.ownStream && s.stream)
    (void)cudaStreamDestroy(s.stream);
}

namespace {

/// Waits until `comm` leaves ncclInProgress (non-blocking communicators),
/// against a deadline.
Status settle(ncclComm_t comm, double timeout, const std::string &what) {
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(timeout));
  for (;;) {
    ncclResult_t state = ncclSuccess;
    KILN_TRY(NCCL_CHECK(ncclCommGetAsyncError(comm, &state)));
    if (state == ncclSuccess)
      return Status::ok();
    if (state != ncclInProgress)
      return ncclStatus(state, what.c_str(), __FILE__, __LINE__);
    if (Clock::now() > deadline)
      return Status::error(
          fmt::format("{} did not finish within {} s", what, timeout));
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

Status makeEvents(NcclState &s) {
  KILN_TRY(CUDART_CHECK(cudaSetDevice(s.device)));
  KILN_TRY(
      CUDART_CHECK(cudaEventCreateWithFlags(&s.ready, cudaEventDisableTiming)));
  KILN_TRY(
      CUDART_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming)));
  return Status::ok();
}

Status noDevice(const char *what) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess)
    return Status::error(fmt::format("{}: no CUDA device: {} ({})", what,
                                     cudaGetErrorName(e),
                                     cudaGetErrorString(e)));
  return Status::ok();
}

} // namespace

Expected<std::vector<std::unique_ptr<NcclCommunicator>>>
NcclCommunicator::createLocal(const std::vector<int> &devices) {
  if (devices.empty())
    return Status::error("NCCL: no devices given");
  std::vector<int> sorted = devices;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    return Status::error(
        fmt::format("NCCL: devices [{}] list a GPU twice; NCCL refuses two "
                    "ranks on one GPU (\"Duplicate GPU detected\")",
                    fmt::join(devices, ", ")));
  KILN_TRY(noDevice("NCCL"));
  std::vector<ncclComm_t> comms(devices.size());
  KILN_TRY(NCCL_CHECK(
      ncclCommInitAll(comms.data(), int(devices.size()), devices.data())));
  auto world = std::make_shared<NcclWorld>();
  world->comms = comms;
  std::vector<std::unique_ptr<NcclCommunicator>> out;
  for (size_t i = 0; i < devices.size(); ++i) {
    std::unique_ptr<NcclCommunicator> c(new NcclCommunicator());
    NcclState &s = *c->state_;
    s.world = world;
    s.comm = comms[i];
    s.rank = int(i);
    s.size = int(devices.size());
    s.device = devices[i];
    KILN_TRY(makeEvents(s));
    out.push_back(std::move(c));
  }
  return out;
}

Expected<std::unique_ptr<NcclCommunicator>>
NcclCommunicator::createWithBootstrap(Communicator &bootstrap, int device) {
  KILN_TRY(noDevice("NCCL"));
  ncclUniqueId id{};
  if (bootstrap.rank() == 0)
    KILN_TRY(NCCL_CHECK(ncclGetUniqueId(&id)));
  static_assert(sizeof(id) % 4 == 0, "the unique id travels as i32 words");
  bootstrap.setContext("NCCL start-up: the unique id");
  KILN_TRY(bootstrap.broadcast(&id, sizeof(id) / 4, ElementType::I32, 0));
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator());
  NcclState &s = *c->state_;
  s.world = std::make_shared<NcclWorld>();
  s.rank = bootstrap.rank();
  s.size = bootstrap.size();
  s.device = device;
  c->setTimeout(bootstrap.timeout());
  KILN_TRY(CUDART_CHECK(cudaSetDevice(device)));
  // Non-blocking, so that start-up is polled against the deadline too.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  KILN_TRY(
      NCCL_CHECK(ncclCommInitRankConfig(&s.comm, s.size, id, s.rank, &config)));
  if (Status st = settle(s.comm, c->timeout(), "ncclCommInitRankConfig"); !st) {
    (void)ncclCommAbort(s.comm);
    s.comm = nullptr;
    return Status::error(
        fmt::format("rank {} (GPU {}): NCCL start-up failed: {}; is every "
                    "rank on its own GPU?",
                    s.rank, device, st.message()));
  }
  s.world->comms.push_back(s.comm);
  KILN_TRY(makeEvents(s));
  return c;
}

int NcclCommunicator::rank() const { return state_->rank; }
int NcclCommunicator::size() const { return state_->size; }
int NcclCommunicator::device() const { return state_->device; }
void NcclCommunicator::setBlocking(bool blocking) {
  state_->blocking = blocking;
}

Status NcclCommunicator::setStreams(void *compute, void *comm) {
  NcclState &s = *state_;
  KILN_TRY(CUDART_CHECK(cudaSetDevice(s.device)));
  if (s.ownStream && s.stream && s.stream != comm)
    KILN_TRY(CUDART_CHECK(cudaStreamDestroy(s.stream)));
  s.compute = static_cast<cudaStream_t>(compute);
  s.stream = static_cast<cudaStream_t>(comm);
  s.ownStream = false;
  return Status::ok();
}

Status NcclCommunicator::prepareGroups(const std::vector<Group> &groups) {
  NcclState &s = *state_;
  KILN_TRY(CUDART_CHECK(cudaSetDevice(s.device)));
  for (size_t i = 0; i < groups.size(); ++i) {
    const Group &g = groups[i];
    auto it = std::find(g.begin(), g.end(), s.rank);
    int color = it == g.end() ? NCCL_SPLIT_NOCOLOR : int(i);
    int key = it == g.end() ? 0 : int(it - g.begin());
    ncclComm_t sub = nullptr;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    KILN_TRY(NCCL_CHECK(ncclCommSplit(s.comm, color, key, &sub, &config)));
    KILN_TRY(settle(s.comm, timeout_, "ncclCommSplit"));
    if (sub) {
      s.groups[g] = sub;
      std::lock_guard<std::mutex> lock(s.world->mu);
      s.world->comms.push_back(sub);
    }
  }
  return Status::ok();
}

void NcclCommunicator::abort(const std::string &why) {
  NcclWorld &w = *state_->world;
  std::lock_guard<std::mutex> lock(w.mu);
  if (w.aborted)
    return;
  w.aborted = true;
  w.reason = fmt::format("rank {} aborted: {}", state_->rank, why);
  for (ncclComm_t c : w.comms)
    (void)ncclCommAbort(c);
  w.comms.clear();
}

// The steps every collective shares; a class so the header stays free of
// CUDA and NCCL types.
class NcclCall {
public:
  NcclCall(NcclCommunicator &c, NcclState &s, std::string what)
      : c(c), s(s), what(std::move(what)) {}

  Status fail(const std::string &why) const {
    return Status::error(
        fmt::format("rank {} (GPU {}): {}{}: {}", s.rank, s.device, what,
                    c.context().empty() ? "" : " at " + c.context(), why));
  }

  /// The group's NCCL communicator and this rank's index in it.
  Expected<ncclComm_t> begin(const Group &group) {
    {
      std::lock_guard<std::mutex> lock(s.world->mu);
      if (s.world->aborted)
        return fail(fmt::format("{} ({})", kRunAborted, s.world->reason));
    }
    ncclComm_t comm = s.comm;
    bool isWorld = group.empty() || int(group.size()) == s.size;
    for (size_t k = 0; isWorld && k < group.size(); ++k)
      isWorld = group[k] == int(k);
    if (!isWorld) {
      auto it = s.groups.find(group);
      if (it == s.groups.end())
        return fail(fmt::format(
            "group [{}] was not prepared: call prepareGroups() with every "
            "group on every rank at start-up",
            fmt::join(group, ", ")));
      comm = it->second;
    }
    if (Status st = CUDART_CHECK(cudaSetDevice(s.device)); !st)
      return fail(st.message());
    if (!s.stream) {
      if (Status st = CUDART_CHECK(
              cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
          !st)
        return fail(st.message());
      s.ownStream = true;
    }
    if (s.compute) {
      if (Status st = CUDART_CHECK(cudaEventRecord(s.ready, s.compute)); !st)
        return fail(st.message());
      if (Status st = CUDART_CHECK(cudaStreamWaitEvent(s.stream, s.ready, 0));
          !st)
        return fail(st.message());
    }
    return comm;
  }

  /// After the NCCL call: settle, record the completion, and wait for it if
  /// the communicator blocks.
  Status end(ncclComm_t comm, Status enqueued) {
    if (!enqueued)
      return fail(enqueued.message());
    if (Status st = settle(comm, c.timeout(), what); !st)
      return fail(st.message());
    if (Status st = CUDART_CHECK(cudaEventRecord(s.done, s.stream)); !st)
      return fail(st.message());
    s.lastOp = what + (c.context().empty() ? "" : " at " + c.context());
    return s.blocking ? c.synchronize() : Status::ok();
  }

  NcclCommunicator &c;
  NcclState &s;
  std::string what;
};

Status NcclCommunicator::synchronize() {
  NcclState &s = *state_;
  KILN_TRY(CUDART_CHECK(cudaSetDevice(s.device)));
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(timeout_));
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(s.world->mu);
      if (s.world->aborted)
        return Status::error(
            fmt::format("rank {} (GPU {}): {} failed: {} ({})",
                        s.rank, s.device, s.lastOp, kRunAborted, s.world->reason));
    }
    cudaError_t q = cudaEventQuery(s.done);
    if (q == cudaSuccess)
      return Status::ok();
    if (q != cudaErrorNotReady)
      return cudaStatus(q, "cudaEventQuery (the last collective)", __FILE__,
                        __LINE__);
    ncclResult_t async = ncclSuccess;
    (void)ncclCommGetAsyncError(s.comm, &async);
    std::string why;
    if (async != ncclSuccess && async != ncclInProgress)
      why = fmt::format("NCCL reported an asynchronous error: {}",
                        ncclGetErrorString(async));
    else if (Clock::now() > deadline)
      why = fmt::format(
          "timed out after {} s: another rank did not take part (dead, stalled "
          "or making other calls); raise --collective-timeout if it is only "
          "slow",
          timeout_);
    if (!why.empty()) {
      std::string msg = fmt::format("rank {} (GPU {}): {} {}", s.rank, s.device,
                                    s.lastOp, why);
      abort(msg);
      return Status::error(msg);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

Status NcclCommunicator::computeWaits() {
  NcclState &s = *state_;
  if (!s.compute || !s.stream)
    return Status::ok();
  KILN_TRY(CUDART_CHECK(cudaSetDevice(s.device)));
  return CUDART_CHECK(cudaStreamWaitEvent(s.compute, s.done, 0));
}

Status NcclCommunicator::allReduce(const void *send, void *recv, int64_t count,
                                   ElementType type, Reduction r,
                                   const Group &group) {
  NcclCall call(*this, *state_, describeOp("all_reduce", count, type, &r));
  Expected<ncclDataType_t> t = ncclType(type);
  if (!t)
    return call.fail(t.status().message());
  if (sumOrder_ == SumOrder::Tree &&
      (r == Reduction::Sum || r == Reduction::Mean))
    return call.fail(
        "NCCL adds in its own order; SumOrder::Tree needs a CPU communicator");
  Expected<ncclComm_t> comm = call.begin(group);
  if (!comm)
    return comm.status();
  return call.end(*comm,
                  NCCL_CHECK(ncclAllReduce(send, recv, size_t(count), *t,
                                           ncclOp(r), *comm, state_->stream)));
}

Status NcclCommunicator::reduceScatter(const void *send, void *recv,
                                       int64_t recvCount, ElementType type,
                                       Reduction r, const Group &group) {
  NcclCall call(*this, *state_,
                describeOp("reduce_scatter", recvCount, type, &r));
  Expected<ncclDataType_t> t = ncclType(type);
  if (!t)
    return call.fail(t.status().message());
  if (sumOrder_ == SumOrder::Tree &&
      (r == Reduction::Sum || r == Reduction::Mean))
    return call.fail(
        "NCCL adds in its own order; SumOrder::Tree needs a CPU communicator");
  Expected<ncclComm_t> comm = call.begin(group);
  if (!comm)
    return comm.status();
  return call.end(
      *comm, NCCL_CHECK(ncclReduceScatter(send, recv, size_t(recvCount), *t,
                                          ncclOp(r), *comm, state_->stream)));
}

Status NcclCommunicator::allGather(const void *send, void *recv,
                                   int64_t sendCount, ElementType type,
                                   const Group &group) {
  NcclCall call(*this, *state_, describeOp("all_gather", sendCount, type));
  Expected<ncclDataType_t> t = ncclType(type);
  if (!t)
    return call.fail(t.status().message());
  Expected<ncclComm_t> comm = call.begin(group);
  if (!comm)
    return comm.status();
  return call.end(*comm, NCCL_CHECK(ncclAllGather(send, recv, size_t(sendCount),
                                                  *t, *comm, state_->stream)));
}

Status NcclCommunicator::broadcast(void *buffer, int64_t count,
                                   ElementType type, int root,
                                   const Group &group) {
  NcclCall call(*this, *state_,
                fmt::format("broadcast ({} x {}, root {})", count,
                            dtypeName(type), root));
  Expected<ncclDataType_t> t = ncclType(type);
  if (!t)
    return call.fail(t.status().message());
  int n = group.empty() ? state_->size : int(group.size());
  if (root < 0 || root >= n)
    return call.fail(
        fmt::format("root {} is not a member index of the group", root));
  Expected<ncclComm_t> comm = call.begin(group);
  if (!comm)
    return comm.status();
  return call.end(*comm,
                  NCCL_CHECK(ncclBroadcast(buffer, buffer, size_t(count), *t,
                                           root, *comm, state_->stream)));
}

Status NcclCommunicator::send(const void *buffer, int64_t count,
                              ElementType type, int peer) {
  NcclCall call(
      *this, *state_,
      fmt::format("send ({} x {} to rank {})", count, dtypeName(type), peer));
  Expected<ncclDataType_t> t = ncclType(type);
  if (!t)
    return call.fail(t.status().message());
  if (peer < 0 || peer >= state_->size || peer == state_->rank)
    return call.fail(fmt::format(
        "peer {} is not another rank of this world of {}", peer, state_->size));
  Expected<ncclComm_t> comm = call.begin({});
  if (!comm)
    return comm.status();
  return call.end(*comm, NCCL_CHECK(ncclSend(buffer, size_t(count), *t, peer,
                                             *comm, state_->stream)));
}

Status NcclCommunicator::recv(void *buffer, int64_t count, ElementType type,
                              int peer) {
  NcclCall call(
      *this, *state_,
      fmt::format("recv ({} x {} from rank {})", count, dtypeName(type), peer));
  Expected<ncclDataType_t> t = ncclType(type);
  if (!t)
    return call.fail(t.status().message());
  if (peer < 0 || peer >= state_->size || peer == state_->rank)
    return call.fail(fmt::format(
        "peer {} is not another rank of this world of {}", peer, state_->size));
  Expected<ncclComm_t> comm = call.begin({});
  if (!comm)
    return comm.status();
  return call.end(*comm, NCCL_CHECK(ncclRecv(buffer, size_t(count), *t, peer,
                                             *comm, state_->stream)));
}

} // namespace kiln::comm
