//===- InProcess.cpp - N devices of one process, through shared memory ----===//

#include "runtime/comm/InProcess.h"

#include "runtime/comm/Reduce.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <map>
#include <mutex>

namespace kiln::comm {

namespace {

using Clock = std::chrono::steady_clock;

/// What one member posted for the current call.
struct Post {
  const void *send = nullptr;
  void *recv = nullptr;
  std::string
      signature; ///< op, count, type, reduction, root: all members agree
};

/// One group's rendezvous: a generation barrier plus the members' posts.
struct GroupState {
  std::vector<int> members; ///< world ranks in group order
  std::vector<Post> posts;
  std::vector<char> arrivedMask;
  int arrived = 0;
  uint64_t phase = 0;
};

} // namespace

struct InProcessState {
  explicit InProcessState(int n) : size(n) {}
  int size;
  std::mutex mu;
  std::condition_variable cv;
  bool aborted = false;
  std::string reason;
  std::map<std::vector<int>, GroupState> groups;
  /// Buffered point-to-point messages, by (from, to).
  std::map<std::pair<int, int>, std::deque<std::vector<char>>> mail;
};

InProcessWorld::InProcessWorld(int size)
    : state_(std::make_unique<InProcessState>(size)) {}
InProcessWorld::~InProcessWorld() = default;
int InProcessWorld::size() const { return state_->size; }

void InProcessWorld::abort(const std::string &why) {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (!state_->aborted) {
      state_->aborted = true;
      state_->reason = why;
    }
  }
  state_->cv.notify_all();
}

bool InProcessWorld::aborted() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->aborted;
}

std::string InProcessWorld::abortReason() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->reason;
}

namespace {

class InProcessCommunicator final : public Communicator {
public:
  InProcessCommunicator(std::shared_ptr<InProcessWorld> world, int rank)
      : world_(std::move(world)), state_(world_->state()), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return state_.size; }
  const char *kind() const override { return "in-process"; }

  Status allReduce(const void *send, void *recv, int64_t count,
                   ElementType type, Reduction r, const Group &group) override {
    std::string what = describeOp("all_reduce", count, type, &r);
    if (Status s = checkReducible(type, "all_reduce"); !s)
      return fail(what, s.message());
    return collective(
        group, what, send, recv, count, [&](GroupState &g, int m) -> Status {
          int n = int(g.members.size());
          int64_t es = dtypeBytes(type), block = (count + n - 1) / n;
          int64_t lo = std::min(count, m * block),
                  hi = std::min(count, lo + block);
          if (hi <= lo)
            return Status::ok();
          std::vector<const void *> in(n);
          for (int k = 0; k < n; ++k)
            in[k] = static_cast<const char *>(g.posts[k].send) + lo * es;
          char *mine = static_cast<char *>(g.posts[m].recv) + lo * es;
          if (Status s = reduceBlocks(mine, in.data(), n, hi - lo, type, r, n,
                                      sumOrder_);
              !s)
            return s;
          for (int k = 0; k < n; ++k)
            if (k != m)
              std::memcpy(static_cast<char *>(g.posts[k].recv) + lo * es, mine,
                          (hi - lo) * es);
          return Status::ok();
        });
  }

  Status reduceScatter(const void *send, void *recv, int64_t recvCount,
                       ElementType type, Reduction r,
                       const Group &group) override {
    std::string what = describeOp("reduce_scatter", recvCount, type, &r);
    if (Status s = checkReducible(type, "reduce_scatter"); !s)
      return fail(what, s.message());
    return collective(group, what, send, recv, recvCount,
                      [&](GroupState &g, int m) -> Status {
                        int n = int(g.members.size());
                        int64_t bytes = recvCount * dtypeBytes(type);
                        std::vector<const void *> in(n);
                        for (int k = 0; k < n; ++k)
                          in[k] = static_cast<const char *>(g.posts[k].send) +
                                  m * bytes;
                        return reduceBlocks(g.posts[m].recv, in.data(), n,
                                            recvCount, type, r, n, sumOrder_);
                      });
  }

  Status allGather(const void *send, void *recv, int64_t sendCount,
                   ElementType type, const Group &group) override {
    std::string what = describeOp("all_gather", sendCount, type);
    return collective(group, what, send, recv, sendCount,
                      [&](GroupState &g, int m) -> Status {
                        int64_t bytes = sendCount * dtypeBytes(type);
                        for (size_t k = 0; k < g.members.size(); ++k) {
                          char *dst =
                              static_cast<char *>(g.posts[k].recv) + m * bytes;
                          if (dst != g.posts[m].send)
                            std::memcpy(dst, g.posts[m].send, bytes);
                        }
                        return Status::ok();
                      });
  }

  Status broadcast(void *buffer, int64_t count, ElementType type, int root,
                   const Group &group) override {
    std::string what = fmt::format("broadcast ({} x {}, root {})", count,
                                   dtypeName(type), root);
    return collective(
        group, what, buffer, buffer, count,
        [&](GroupState &g, int m) -> Status {
          if (root < 0 || root >= int(g.members.size()))
            return Status::error(fmt::format(
                "root {} is not a member index of the group", root));
          if (m != root)
            std::memcpy(g.posts[m].recv, g.posts[root].recv,
                        count * dtypeBytes(type));
          return Status::ok();
        });
  }

  Status send(const void *buffer, int64_t count, ElementType type,
              int peer) override {
    std::string what =
        fmt::format("send ({} x {} to rank {})", count, dtypeName(type), peer);
    if (peer < 0 || peer >= state_.size || peer == rank_)
      return fail(what,
                  fmt::format("peer {} is not another rank of this world of {}",
                              peer, state_.size));
    int64_t bytes = count * dtypeBytes(type);
    std::vector<char> message(static_cast<const char *>(buffer),
                              static_cast<const char *>(buffer) + bytes);
    {
      std::lock_guard<std::mutex> lock(state_.mu);
      if (state_.aborted)
        return abortedError(what);
      state_.mail[{rank_, peer}].push_back(std::move(message));
    }
    state_.cv.notify_all();
    return Status::ok();
  }

  Status recv(void *buffer, int64_t count, ElementType type,
              int peer) override {
    std::string what = fmt::format("recv ({} x {} from rank {})", count,
                                   dtypeName(type), peer);
    if (peer < 0 || peer >= state_.size || peer == rank_)
      return fail(what,
                  fmt::format("peer {} is not another rank of this world of {}",
                              peer, state_.size));
    std::vector<char> message;
    {
      std::unique_lock<std::mutex> lock(state_.mu);
      auto &box = state_.mail[{peer, rank_}];
      bool ready = state_.cv.wait_until(
          lock, deadline(), [&] { return state_.aborted || !box.empty(); });
      if (state_.aborted)
        return abortedError(what);
      if (!ready) {
        std::string msg = timeoutMessage(what, {peer});
        abortLocked(msg);
        lock.unlock();
        state_.cv.notify_all();
        return Status::error(msg);
      }
      message = std::move(box.front());
      box.pop_front();
    }
    int64_t bytes = count * dtypeBytes(type);
    if (int64_t(message.size()) != bytes)
      return fail(
          what,
          fmt::format("rank {} sent {} bytes, this receive expects {}; the "
                      "ranks disagree on the message",
                      peer, message.size(), bytes));
    std::memcpy(buffer, message.data(), bytes);
    return Status::ok();
  }

  void abort(const std::string &why) override {
    world_->abort(fmt::format("rank {} aborted: {}", rank_, why));
  }

private:
  template <typename Work>
  Status collective(const Group &group, const std::string &what,
                    const void *send, void *recv, int64_t count, Work work) {
    if (count < 0)
      return fail(what, "negative element count");
    if (count > 0 && (!send || !recv))
      return fail(what, "null buffer");
    GroupState *g = nullptr;
    int member = -1;
    {
      std::lock_guard<std::mutex> lock(state_.mu);
      if (state_.aborted)
        return abortedError(what);
      Expected<GroupState *> found = groupLocked(group, member);
      if (!found)
        return fail(what, found.status().message());
      g = *found;
      // The sum order is part of the call: members must agree on it.
      g->posts[member] =
          Post{send, recv,
               sumOrder_ == SumOrder::Tree ? what + " [tree order]" : what};
    }
    if (Status s = barrier(*g, member, what); !s)
      return s;
    // The posts are stable until the second barrier.
    std::string mismatch;
    for (size_t k = 0; k < g->members.size(); ++k)
      if (g->posts[k].signature != g->posts[0].signature) {
        mismatch = fmt::format(
            "the group's members disagree on the call: rank {} called {}, "
            "rank {} called {}; every member must make the same calls in "
            "the same order",
            g->members[0], g->posts[0].signature, g->members[k],
            g->posts[k].signature);
        break;
      }
    Status result =
        mismatch.empty() ? work(*g, member) : Status::error(mismatch);
    if (Status s = barrier(*g, member, what); !s)
      return s;
    return result.isOk() ? result : fail(what, result.message());
  }

  /// The group's state, created on first use; `member` = rank()'s index.
  Expected<GroupState *> groupLocked(const Group &group, int &member) {
    std::vector<int> members = group;
    if (members.empty())
      for (int r = 0; r < state_.size; ++r)
        members.push_back(r);
    std::vector<int> sorted = members;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() ||
        sorted.front() < 0 || sorted.back() >= state_.size)
      return Status::error(
          fmt::format("group [{}] must list distinct ranks of 0..{}",
                      fmt::join(members, ", "), state_.size - 1));
    auto it = std::find(members.begin(), members.end(), rank_);
    if (it == members.end())
      return Status::error(
          fmt::format("group [{}] does not contain this rank ({})",
                      fmt::join(members, ", "), rank_));
    member = int(it - members.begin());
    GroupState &g = state_.groups[members];
    if (g.members.empty()) {
      g.members = members;
      g.posts.resize(members.size());
      g.arrivedMask.assign(members.size(), 0);
    }
    return &g;
  }

  /// A generation barrier over `g` with this call's deadline.
  Status barrier(GroupState &g, int member, const std::string &what) {
    std::unique_lock<std::mutex> lock(state_.mu);
    if (state_.aborted)
      return abortedError(what);
    int n = int(g.members.size());
    g.arrivedMask[member] = 1;
    if (++g.arrived == n) {
      g.arrived = 0;
      std::fill(g.arrivedMask.begin(), g.arrivedMask.end(), 0);
      ++g.phase;
      lock.unlock();
      state_.cv.notify_all();
      return Status::ok();
    }
    uint64_t phase = g.phase;
    bool passed = state_.cv.wait_until(
        lock, deadline(), [&] { return g.phase != phase || state_.aborted; });
    if (g.phase != phase)
      return Status::ok();
    if (state_.aborted)
      return abortedError(what);
    (void)passed;
    std::vector<int> missing;
    for (int k = 0; k < n; ++k)
      if (!g.arrivedMask[k])
        missing.push_back(g.members[k]);
    std::string msg = timeoutMessage(what, missing);
    abortLocked(msg);
    lock.unlock();
    state_.cv.notify_all();
    return Status::error(msg);
  }

  Clock::time_point deadline() const {
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                              std::chrono::duration<double>(timeout_));
  }

  std::string where() const {
    return context_.empty() ? "" : fmt::format(" at {}", context_);
  }

  std::string timeoutMessage(const std::string &what,
                             const std::vector<int> &missing) const {
    return fmt::format(
        "rank {}: {}{} timed out after {} s: rank(s) {} did not arrive (dead, "
        "stalled or making other calls); raise --collective-timeout if they "
        "are "
        "only slow",
        rank_, what, where(), timeout_, fmt::join(missing, ", "));
  }

  void abortLocked(const std::string &why) {
    if (!state_.aborted) {
      state_.aborted = true;
      state_.reason = why;
    }
  }

  Status abortedError(const std::string &what) const {
    return Status::error(
        fmt::format("rank {}: {}{} failed: {} ({})", rank_,
                    what, where(), kRunAborted, state_.reason));
  }

  Status fail(const std::string &what, const std::string &why) const {
    return Status::error(
        fmt::format("rank {}: {}{}: {}", rank_, what, where(), why));
  }

  std::shared_ptr<InProcessWorld> world_;
  InProcessState &state_;
  int rank_;
};

} // namespace

std::unique_ptr<Communicator>
InProcessWorld::communicator(std::shared_ptr<InProcessWorld> world, int rank) {
  if (!world || rank < 0 || rank >= world->size())
    return nullptr;
  return std::make_unique<InProcessCommunicator>(std::move(world), rank);
}

std::vector<std::unique_ptr<Communicator>>
makeInProcessCommunicators(int size) {
  auto world = std::make_shared<InProcessWorld>(size);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < size; ++r)
    comms.push_back(InProcessWorld::communicator(world, r));
  return comms;
}

} // namespace kiln::comm
