//===- ProcessGrid.cpp - Processes of the reference interpreter -----------===//
#include "reference/ProcessGrid.h"

#include "dialects/kiln/KilnDialect.h"

#include "mlir/IR/BuiltinOps.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <thread>

namespace kiln::interp {

bool ProcessGrid::create(std::vector<GridAxis> axes, ProcessGrid &out,
                         std::string &error) {
  for (size_t i = 0; i < axes.size(); ++i) {
    if (axes[i].name.empty()) {
      error = "process grid axis " + std::to_string(i) + " has no name";
      return false;
    }
    if (axes[i].size < 1) {
      error = "process grid axis '" + axes[i].name + "' has size " +
              std::to_string(axes[i].size) + "; sizes start at 1";
      return false;
    }
    for (size_t j = 0; j < i; ++j)
      if (axes[j].name == axes[i].name) {
        error = "process grid axis '" + axes[i].name + "' appears twice";
        return false;
      }
  }
  out.axes_ = std::move(axes);
  return true;
}

int64_t ProcessGrid::size() const {
  int64_t n = 1;
  for (const GridAxis &a : axes_)
    n *= a.size;
  return n;
}

std::vector<int64_t> ProcessGrid::coords(int64_t rank) const {
  std::vector<int64_t> c(axes_.size());
  for (size_t i = axes_.size(); i-- > 0;) {
    c[i] = rank % axes_[i].size;
    rank /= axes_[i].size;
  }
  return c;
}

int64_t ProcessGrid::rank(const std::vector<int64_t> &coords) const {
  int64_t r = 0;
  for (size_t i = 0; i < axes_.size(); ++i)
    r = r * axes_[i].size + coords[i];
  return r;
}

std::vector<std::vector<int64_t>>
ProcessGrid::groups(const std::string &axis) const {
  size_t a = 0;
  while (a < axes_.size() && axes_[a].name != axis)
    ++a;
  if (a == axes_.size())
    return {};
  std::vector<std::vector<int64_t>> out;
  for (int64_t r = 0, n = size(); r < n; ++r) {
    std::vector<int64_t> c = coords(r);
    if (c[a] != 0)
      continue; // every group is listed from its member with coordinate 0
    std::vector<int64_t> group;
    for (int64_t k = 0; k < axes_[a].size; ++k) {
      c[a] = k;
      group.push_back(rank(c));
    }
    out.push_back(std::move(group));
  }
  return out;
}

namespace {
std::string axesString(const std::vector<GridAxis> &axes) {
  std::string s;
  for (const GridAxis &a : axes)
    s += (s.empty() ? "" : " x ") + a.name + "=" + std::to_string(a.size);
  return s.empty() ? "(no axes)" : s;
}

/// The rendezvous of every group of every axis, shared by the processes of
/// one run; each process reaches its groups through a ProcessExchange.
struct GridMeetings {
  /// axis -> one rendezvous per group (ProcessGrid::groups order).
  std::map<std::string, std::vector<std::unique_ptr<Rendezvous>>> byAxis;
  /// axis -> for each rank, (group index, position in the group).
  std::map<std::string, std::vector<std::pair<size_t, int64_t>>> where;
  /// (lower rank, higher rank) -> the two-member rendezvous of the
  /// kiln.transfer ops between two processes that differ along one axis;
  /// the lower rank is member 0.
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<Rendezvous>> pairs;

  void abortAll(const std::string &why) {
    for (auto &[axis, groups] : byAxis)
      for (auto &r : groups)
        r->abort(why);
    for (auto &[ranks, r] : pairs)
      r->abort(why);
  }
};

class ProcessExchange : public GroupExchange {
public:
  ProcessExchange(const ProcessGrid &grid, GridMeetings &m, int64_t rank)
      : grid_(grid), m_(m), rank_(rank) {}

  bool coordinate(const std::string &axis, int64_t &coord) override {
    int64_t a = axisIndex(axis);
    if (a < 0)
      return false;
    coord = grid_.coords(rank_)[size_t(a)];
    return true;
  }

  bool transfer(const std::string &axis, int64_t from, int64_t to, Tensor value,
                Tensor &received, std::string &error) override {
    int64_t a = axisIndex(axis);
    if (a < 0) {
      error = "the process grid has no axis '" + axis + "'";
      return false;
    }
    std::vector<int64_t> c = grid_.coords(rank_);
    bool sender = c[size_t(a)] == from;
    c[size_t(a)] = sender ? to : from;
    int64_t peer = grid_.rank(c);
    auto key = std::minmax(rank_, peer);
    std::string what = "transfer over '" + axis + "' from " + std::to_string(from) + " to " +
                       std::to_string(to) + " (process " +
                       std::to_string(sender ? rank_ : peer) + " to process " +
                       std::to_string(sender ? peer : rank_) + "): ";
    auto it = m_.pairs.find({key.first, key.second});
    if (it == m_.pairs.end() || peer == rank_) {
      error = what + "the coordinates are not two processes of the grid";
      return false;
    }
    int64_t me = rank_ < peer ? 0 : 1;
    std::vector<Tensor> both;
    if (!it->second->exchange(me, std::move(value), both, error)) {
      secondary = error.rfind("aborted", 0) == 0;
      error = what + error;
      return false;
    }
    // The peer must be at the matching end of the same transfer.
    const Tensor &theirs = both[size_t(1 - me)];
    if (theirs.absent != sender) {
      error = what + "process " + std::to_string(peer) + " " +
              (sender ? "sends" : "waits to receive") +
              " at this point as well: the transfers between the two do not pair up in "
              "program order";
      return false;
    }
    received = sender ? Tensor::none() : theirs;
    return true;
  }

  bool exchange(const std::string &axis, Tensor value, std::vector<Tensor> &all,
                int64_t &member, std::string &error) override {
    auto it = m_.where.find(axis);
    if (it == m_.where.end()) {
      error = "the process grid has no axis '" + axis + "'";
      return false;
    }
    auto [g, pos] = it->second[size_t(rank_)];
    member = pos;
    Rendezvous &r = *m_.byAxis[axis][g];
    if (r.exchange(pos, std::move(value), all, error))
      return true;
    // A timeout is this process's own failure; an abort comes from another.
    secondary = error.rfind("aborted", 0) == 0;
    error = "collective over '" + axis + "': " + error;
    return false;
  }
  bool secondary = false;

private:
  int64_t axisIndex(const std::string &axis) const {
    const std::vector<GridAxis> &axes = grid_.axes();
    for (size_t a = 0; a < axes.size(); ++a)
      if (axes[a].name == axis)
        return int64_t(a);
    return -1;
  }

  const ProcessGrid &grid_;
  GridMeetings &m_;
  int64_t rank_;
};
} // namespace

bool ProcessGrid::run(mlir::func::FuncOp fn,
                      const std::vector<std::vector<Tensor>> &args,
                      std::vector<std::vector<Tensor>> &results,
                      std::string &error, const Options &options) const {
  int64_t n = size();
  if (static_cast<int64_t>(args.size()) != n) {
    error = "a grid of " + std::to_string(n) + " processes needs " +
            std::to_string(n) + " argument lists, got " +
            std::to_string(args.size());
    return false;
  }
  if (auto module = fn->getParentOfType<mlir::ModuleOp>()) {
    MeshShape mesh = getMesh(module);
    bool same = mesh.axes.size() == axes_.size();
    for (size_t i = 0; same && i < axes_.size(); ++i)
      same = mesh.axes[i].name == axes_[i].name && mesh.axes[i].size == axes_[i].size;
    if (!mesh.axes.empty() && !same) {
      std::vector<GridAxis> m;
      for (const MeshAxis &a : mesh.axes)
        m.push_back({a.name, a.size});
      error = "the process grid (" + axesString(axes_) + ") is not the module's kiln.mesh (" +
              axesString(m) + "): run it on a grid with the mesh's axes";
      return false;
    }
  }
  GridMeetings meetings;
  for (const GridAxis &a : axes_) {
    std::vector<std::vector<int64_t>> gs = groups(a.name);
    auto &where = meetings.where[a.name];
    where.resize(size_t(n));
    for (size_t g = 0; g < gs.size(); ++g) {
      meetings.byAxis[a.name].push_back(std::make_unique<Rendezvous>(
          int64_t(gs[g].size()), options.collectiveTimeoutSeconds, gs[g]));
      for (size_t k = 0; k < gs[g].size(); ++k) {
        where[size_t(gs[g][k])] = {g, int64_t(k)};
        for (size_t j = 0; j < k; ++j)
          meetings.pairs[{gs[g][j], gs[g][k]}] = std::make_unique<Rendezvous>(
              2, options.collectiveTimeoutSeconds, std::vector<int64_t>{gs[g][j], gs[g][k]});
      }
    }
  }
  // The interpreter only reads the IR, so the processes share `fn`.
  std::vector<std::vector<Tensor>> out(n);
  std::vector<std::string> errors(n);
  std::vector<char> ok(n, 0);
  std::mutex failMu;
  int64_t first = -1; // the first process that failed on its own
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int64_t r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      ProcessExchange ex(*this, meetings, r);
      ok[r] = interp::run(fn, args[r], out[r], errors[r], options, &ex);
      if (ok[r])
        return;
      std::lock_guard<std::mutex> lock(failMu);
      if (first < 0 && !ex.secondary)
        first = r;
      meetings.abortAll("aborted: process " + std::to_string(r) + " failed");
    });
  for (std::thread &t : threads)
    t.join();
  if (first < 0)
    for (int64_t r = 0; r < n && first < 0; ++r)
      if (!ok[r])
        first = r;
  if (first >= 0) {
    error = "process " + std::to_string(first) + ": " + errors[first];
    return false;
  }
  results = std::move(out);
  return true;
}

std::string Rendezvous::nameOf(int64_t member) const {
  return size_t(member) < names_.size() ? "process " + std::to_string(names_[size_t(member)])
                                        : "member " + std::to_string(member);
}

bool Rendezvous::exchange(int64_t member, Tensor value, std::vector<Tensor> &all) {
  std::string ignored;
  return exchange(member, std::move(value), all, ignored);
}

bool Rendezvous::exchange(int64_t member, Tensor value, std::vector<Tensor> &all,
                          std::string &error) {
  std::unique_lock<std::mutex> lock(mu_);
  if (aborted_) {
    error = why_;
    return false;
  }
  uint64_t generation = generation_;
  slots_[member] = std::move(value);
  arrived_[size_t(member)] = 1;
  if (++count_ == static_cast<int64_t>(slots_.size())) {
    // The last to arrive hands the round over. No member can complete the
    // next round before every member has left this one, so `done_` stays
    // valid until all have copied it.
    done_ = std::move(slots_);
    slots_.assign(done_.size(), Tensor());
    arrived_.assign(done_.size(), 0);
    count_ = 0;
    ++generation_;
    cv_.notify_all();
  } else {
    auto deadline = std::chrono::steady_clock::now() +
                    std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                        std::chrono::duration<double>(timeout_));
    bool woke = cv_.wait_until(lock, deadline,
                               [&] { return generation_ != generation || aborted_; });
    if (!woke) {
      std::string missing;
      for (size_t m = 0; m < arrived_.size(); ++m)
        if (!arrived_[m])
          missing += (missing.empty() ? "" : ", ") + nameOf(int64_t(m));
      char secs[32];
      std::snprintf(secs, sizeof secs, "%g", timeout_);
      error = "timed out after " + std::string(secs) + " s waiting for " + missing +
              " (the members that did not arrive)";
      aborted_ = true;
      why_ = "aborted: " + nameOf(member) + " " + error;
      cv_.notify_all();
      return false;
    }
    if (generation_ == generation) {
      error = why_; // aborted before this round completed
      return false;
    }
  }
  all = done_;
  return true;
}

void Rendezvous::abort(const std::string &why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!aborted_)
    why_ = why.rfind("aborted", 0) == 0 ? why : "aborted: " + why;
  aborted_ = true;
  cv_.notify_all();
}

bool Rendezvous::aborted() {
  std::lock_guard<std::mutex> lock(mu_);
  return aborted_;
}

} // namespace kiln::interp
