//===- ProcessGrid.h - Processes of the reference interpreter ----*- C++ -*-===//
//
// A grid of N processes with named axes (say dp=2 x tp=2), each running the
// reference interpreter on its own inputs, one thread per process, in lock
// step. This is where collectives get reference semantics: a process that
// evaluates a collective meets the other members of its group at a
// `Rendezvous` and leaves with every member's contribution, in group order,
// from which it computes its result (sum, gather, ...).
//
// kiln.all_reduce, kiln.reduce_scatter, kiln.all_gather and
// kiln.collective_broadcast are evaluated this way (Interpreter.cpp), and
// kiln.transfer at a two-member rendezvous of the sender and the receiver;
// every other op is local, so a program without them runs as N independent
// runs of the interpreter. Nothing hangs: every rendezvous has a deadline
// (Options::collectiveTimeoutSeconds), and a process that fails aborts the
// others (docs/reference.md).
//
// Pipeline stages: a process's stage is its coordinate on the axis "pp"
// (0 if the grid has none). It skips every op whose `kiln.stage` is another
// stage, so those results do not exist on it, and a function result defined
// by such an op comes back as an absent tensor (Tensor::absent set, no shape
// or elements). kiln.transfer runs on its two ends only; the k-th transfer
// between two processes meets the k-th. Reading a value the process does not
// hold is a compiler bug and fails naming the op, its location and both
// stages.
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
  /// and fills `results[r]`. Collectives over an axis meet the processes
  /// that differ from this one only along it (groups()). With pipeline
  /// stages, `results[r][i].absent` is set where result i is defined by an
  /// op of a stage other than process r's (a loss broadcast with
  /// kiln.collective_broadcast is held by every process). Fails if `args`
  /// does not hold one argument list per process, if the module has a
  /// kiln.mesh whose axes (names and sizes, in order) are not the grid's,
  /// or if any process fails; a failing process aborts the others' pending
  /// collectives, and `error` names the process that failed first ("process
  /// 3: ...") rather than those it aborted.
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
/// exchange, so one failure cannot hang the others. A member that waits
/// longer than the timeout aborts the rendezvous with a message naming the
/// members that did not arrive.
class Rendezvous {
public:
  /// `names[i]` is how messages name member i (its rank in a grid: "process
  /// 3"); without names, "member i".
  explicit Rendezvous(int64_t n, double timeoutSeconds = 60.0,
                      std::vector<int64_t> names = {})
      : slots_(n), arrived_(n, 0), names_(std::move(names)), timeout_(timeoutSeconds) {}

  /// False if the rendezvous was aborted or timed out (then `all` is left
  /// empty).
  bool exchange(int64_t member, Tensor value, std::vector<Tensor> &all);
  /// The same; on failure `error` says why: "timed out after 1 s waiting
  /// for process 3 (the members that did not arrive)" for the member that
  /// timed out, or the reason given to abort() ("aborted: ...").
  bool exchange(int64_t member, Tensor value, std::vector<Tensor> &all, std::string &error);
  /// Fails every pending and later exchange with `why`.
  void abort(const std::string &why = "aborted");
  /// Whether the rendezvous was aborted (by abort() or a timeout).
  bool aborted();

private:
  std::string nameOf(int64_t member) const;

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Tensor> slots_;
  std::vector<char> arrived_;
  std::vector<Tensor> done_;
  std::vector<int64_t> names_;
  double timeout_;
  int64_t count_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  std::string why_;
};

} // namespace kiln::interp

#endif // KILN_REFERENCE_PROCESSGRID_H
