//===- Interpreter.h - Reference interpreter for the kiln dialect -*- C++ -*-===//
//
// The oracle every later transformation is checked against: plain loops over
// every element, float64 accumulation for sums, matmuls (BLAS dgemm, double),
// softmax, layer_norm and cross_entropy, and results rounded to the declared
// element type after each op (f32, bf16 round-to-nearest-even, f16). With
// `exactF64` it never rounds: the program is evaluated in float64, which is
// what gradient checking needs.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_REFERENCE_INTERPRETER_H
#define KILN_REFERENCE_INTERPRETER_H

#include "runtime/core/ElementType.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::interp {

/// A tensor's element type: the one enum the compiler and runtime share.
using Elem = ElementType;
using kiln::isFloat;
inline const char *name(Elem e) { return dtypeName(e); }
/// Rounds `x` to what element type `e` can hold.
double roundTo(Elem e, double x);

/// A host tensor. Floats live in `f`, integers and booleans in `i`.
struct Tensor {
  Elem elem = Elem::F32;
  std::vector<int64_t> shape;
  std::vector<double> f;
  std::vector<int64_t> i;
  /// A value this process does not hold: a function result defined by an op
  /// of another pipeline stage (ProcessGrid.h, "Pipeline stages"). An absent
  /// tensor has no shape and no elements.
  bool absent = false;

  static Tensor zeros(Elem elem, std::vector<int64_t> shape);
  /// The value a process does not hold (`absent` set).
  static Tensor none();
  int64_t numel() const;
  /// Element k as a double (ints converted).
  double at(int64_t k) const { return isFloat(elem) ? f[k] : double(i[k]); }
};

/// The tensor type of an MLIR value (fails on non-tensors).
bool elemOf(mlir::Type t, Elem &out);
Tensor fromType(mlir::Type t);

/// The mesh axis whose coordinate is a process's pipeline stage: an op with
/// `kiln.stage = s` runs only on the processes at coordinate s on it.
inline constexpr const char *kPipelineAxis = "pp";

struct Options {
  bool exactF64 = false;
  /// How long a collective waits for the other members of its group in a
  /// ProcessGrid run before it fails, naming those that did not arrive.
  double collectiveTimeoutSeconds = 60.0;
};

/// How one process of a grid meets its groups (ProcessGrid.h implements
/// it; a plain run has none). The interpreter computes a collective's
/// result from what `exchange` returns.
class GroupExchange {
public:
  virtual ~GroupExchange() = default;
  /// Hands `value` to this process's group along mesh axis `axis` and
  /// returns every member's contribution in member order in `all`, and this
  /// process's position in the group in `member`. False with `error` set on
  /// a timeout, an abort or an unknown axis.
  virtual bool exchange(const std::string &axis, Tensor value, std::vector<Tensor> &all,
                        int64_t &member, std::string &error) = 0;
  /// This process's coordinate on mesh axis `axis`; false if the grid has
  /// no such axis (a process of a grid without "pp" is stage 0).
  virtual bool coordinate(const std::string & /*axis*/, int64_t & /*coord*/) { return false; }
  /// kiln.transfer between the processes at coordinates `from` and `to` on
  /// `axis` whose other coordinates are this one's: the sender (at `from`)
  /// passes its value and gets `received` absent, the receiver passes
  /// Tensor::none() and gets the sender's value. The k-th transfer between
  /// two processes meets the k-th. False with `error` set on a timeout, an
  /// abort, or a peer that does not make the matching call.
  virtual bool transfer(const std::string & /*axis*/, int64_t /*from*/, int64_t /*to*/,
                        Tensor /*value*/, Tensor & /*received*/, std::string &error) {
    error = "this process group does not support kiln.transfer";
    return false;
  }
};

/// Runs `fn` (kiln and func ops, kiln.fusion groups included) on `args`.
/// Returns false and sets `error` on an unsupported op or mismatched
/// arguments. Collectives (kiln.all_reduce, reduce_scatter, all_gather,
/// collective_broadcast) and kiln.transfer meet their group through `group`;
/// without one (a single process), a collective over a mesh axis of size 1
/// is the identity and any other is an error naming the op.
///
/// Pipeline stages: the process's stage is its coordinate on kPipelineAxis
/// (`group->coordinate`; 0 without a group or without the axis). An op whose
/// `kiln.stage` differs is skipped and its results do not exist here; a
/// function result defined by such an op is Tensor::none() (`absent`) in
/// `results`. Reading a value this process does not hold fails naming the
/// op, its location and both stages. A single-process run of a module whose
/// "pp" axis has more than one coordinate fails at the first op with a
/// `kiln.stage`.
bool run(mlir::func::FuncOp fn, const std::vector<Tensor> &args,
         std::vector<Tensor> &results, std::string &error,
         const Options &options = {}, GroupExchange *group = nullptr);

} // namespace kiln::interp

#endif // KILN_REFERENCE_INTERPRETER_H
