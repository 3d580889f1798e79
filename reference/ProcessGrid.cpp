//===- ProcessGrid.cpp - Processes of the reference interpreter -----------===//
#include "reference/ProcessGrid.h"

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
  // The interpreter only reads the IR, so the processes share `fn`.
  std::vector<std::vector<Tensor>> out(n);
  std::vector<std::string> errors(n);
  std::vector<char> ok(n, 0);
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int64_t r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      ok[r] = interp::run(fn, args[r], out[r], errors[r], options);
    });
  for (std::thread &t : threads)
    t.join();
  for (int64_t r = 0; r < n; ++r)
    if (!ok[r]) {
      error = "process " + std::to_string(r) + ": " + errors[r];
      return false;
    }
  results = std::move(out);
  return true;
}

bool Rendezvous::exchange(int64_t member, Tensor value,
                          std::vector<Tensor> &all) {
  std::unique_lock<std::mutex> lock(mu_);
  if (aborted_)
    return false;
  uint64_t generation = generation_;
  slots_[member] = std::move(value);
  if (++count_ == static_cast<int64_t>(slots_.size())) {
    // The last to arrive hands the round over. No member can complete the
    // next round before every member has left this one, so `done_` stays
    // valid until all have copied it.
    done_ = std::move(slots_);
    slots_.assign(done_.size(), Tensor());
    count_ = 0;
    ++generation_;
    cv_.notify_all();
  } else {
    cv_.wait(lock, [&] { return generation_ != generation || aborted_; });
    if (generation_ == generation)
      return false; // aborted before this round completed
  }
  all = done_;
  return true;
}

void Rendezvous::abort() {
  std::lock_guard<std::mutex> lock(mu_);
  aborted_ = true;
  cv_.notify_all();
}

} // namespace kiln::interp
