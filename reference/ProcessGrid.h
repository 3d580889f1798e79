//===- ProcessGrid.h - Processes of the reference interpreter ----*- C++ -*-===//
//
// A grid of N processes with named axes (say dp=2 x tp=2), each running the
// reference interpreter on its own inputs, one thread per process, in lock
// step. This is where collectives get reference semantics: a process that
// evaluates a collective meets the other members of its group at a
// `Rendezvous` and leaves with every member's contribution, in group order,
// from which it computes its result (sum, gather, ...).
//
// Today no kiln op is a collective, so a grid run is N independent runs of
// the interpreter; the issues that add collectives add their evaluation here
// (docs/reference.md).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_REFERENCE_PROCESSGRID_H
#define KILN_REFERENCE_PROCESSGRID_H

#include "reference/Interpreter.h"

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace kiln::interp {

/// One named axis of a process grid.
struct GridAxis {
  std::string name;
  int64_t size = 1;
};

/// A grid of processes. Ranks are row-major over the axes: the last axis
/// varies fastest, so in dp=2 x tp=3 ranks 0,1,2 share dp coordinate 0.
class ProcessGrid {
public:
  /// One process, no axes.
  ProcessGrid() = default;

  /// A grid over `axes` (outermost first). Fails with a message on an empty
  /// or repeated axis name or a size below 1.
  static bool create(std::vector<GridAxis> axes, ProcessGrid &out,
                     std::string &error);

  const std::vector<GridAxis> &axes() const { return axes_; }
  /// The number of processes: the product of the axis sizes.
  int64_t size() const;
  /// The coordinates of process `rank`, one per axis.
  std::vector<int64_t> coords(int64_t rank) const;
  /// The rank at `coords` (one per axis, each within its axis).
  int64_t rank(const std::vector<int64_t> &coords) const;
  /// The process groups of a collective over axis `axis`: the sets of ranks
  /// that differ only in that coordinate, each in rank order, ordered by
  /// their first rank. Empty if the grid has no such axis.
  std::vector<std::vector<int64_t>> groups(const std::string &axis) const;

  /// Runs `fn` on every process, process r on `args[r]`, one thread each,
  /// and fills `results[r]`. Fails if `args` does not hold one argument list
  /// per process or if any process fails; `error` then names the first
  /// failing rank and its error.
  bool run(mlir::func::FuncOp fn, const std::vector<std::vector<Tensor>> &args,
           std::vector<std::vector<Tensor>> &results, std::string &error,
           const Options &options = {}) const;

private:
  std::vector<GridAxis> axes_;
};

/// Where the `n` members of a process group meet. Member i calls
/// `exchange(i, value, all)`, which blocks until every member has called it
/// and gives each the n contributions in member order. It is reusable: the
/// k-th call of each member meets the k-th calls of the others. `abort()`
/// (a member failed) wakes every waiting member and fails every later
/// exchange, so one failure cannot hang the others.
class Rendezvous {
public:
  explicit Rendezvous(int64_t n) : slots_(n) {}

  /// False if the rendezvous was aborted (then `all` is left empty).
  bool exchange(int64_t member, Tensor value, std::vector<Tensor> &all);
  void abort();

private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Tensor> slots_;
  std::vector<Tensor> done_;
  int64_t count_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
};

} // namespace kiln::interp

#endif // KILN_REFERENCE_PROCESSGRID_H
