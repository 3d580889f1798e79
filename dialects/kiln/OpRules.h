//===- OpRules.h - What the op interfaces answer -----------------*- C++ -*-===//
//
// The value types of the kiln op interfaces (KilnInterfaces.td): a tensor's
// sharding, an op's mixed-precision policy, its row locality and how it uses
// integer index operands. Every kiln op except the kernel-level kiln.fusion
// and kiln.yield answers every one of these interfaces; the answers for an
// op are written in its family file (dialects/kiln/ops/<Family>.cpp), beside
// its verifier, folder, gradient and cost. The generic passes read only the
// interfaces: kiln-data-parallel and kiln-tensor-parallel propagate
// shardings, kiln-mixed-precision reads the policy, kiln-fuse the row
// locality, compiler/IndexRanges the index uses.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_DIALECTS_KILN_OPRULES_H
#define KILN_DIALECTS_KILN_OPRULES_H

#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringRef.h"

#include <cstdint>
#include <optional>
#include <string>

namespace kiln {

//===----------------------------------------------------------------------===//
// Sharding (ShardingOpInterface)
//===----------------------------------------------------------------------===//

/// How a tensor of the per-device program relates to the logical tensor
/// (dialects/kiln/Sharding.h says the model and the attribute form).
struct TensorSharding {
  /// Per dimension, the mesh axes it is split over, major to minor.
  llvm::SmallVector<llvm::SmallVector<std::string, 1>, 4> split;
  /// The axes over which the value is a partial sum, sorted.
  llvm::SmallVector<std::string, 1> partial;

  static TensorSharding replicated(int64_t rank);
  /// Split dimension `dim` over `axis`; replicated elsewhere.
  static TensorSharding splitOn(int64_t rank, int64_t dim, llvm::StringRef axis);
  bool isReplicated() const;
  bool isPartial(llvm::StringRef axis) const;
  /// Whether any dimension is split over `axis`.
  bool isSplitOver(llvm::StringRef axis) const;
  bool operator==(const TensorSharding &o) const {
    return split == o.split && partial == o.partial;
  }
  bool operator!=(const TensorSharding &o) const { return !(*this == o); }
};

/// An operand's sharding, or none (unknown: a value that differs per device
/// without being a split, such as the "replica" input).
using OperandSharding = std::optional<TensorSharding>;
/// The shardings of an op's results, or none: the op cannot take its
/// operands' shardings without resharding (a nonlinear op of a partial sum).
using ShardingResult = std::optional<llvm::SmallVector<TensorSharding, 1>>;

/// Which operands a partial sum may pass through an elementwise op in: the
/// op is linear in them (kiln-data-parallel and kiln-tensor-parallel keep
/// the result partial instead of reducing first).
enum class Linearity {
  None,      ///< nonlinear: a partial operand needs a reduction first
  Unary,     ///< -a, cast(a): linear in its only operand
  Sum,       ///< a + b, a - b, concat: every operand partial over the same axes
  OneFactor, ///< a * r, r * a: one partial operand, the other replicated
  Numerator, ///< a / r: the numerator partial, the denominator replicated
};

//===----------------------------------------------------------------------===//
// Mixed precision (PrecisionOpInterface)
//===----------------------------------------------------------------------===//

/// How an op's floating-point operands and results are typed when a train
/// step runs in bf16 or fp16 (kiln-mixed-precision, docs/training.md).
enum class PrecisionClass {
  /// Operands cast to the low type (bf16/f16), result in the low type.
  Low,
  /// Operands cast to f32, result f32.
  Fp32,
  /// Low type in and out; the kernel keeps its statistics (max, sums,
  /// mean, variance) in fp32 registers.
  Fp32Stats,
  /// Data movement: the result has its input's type (several inputs of
  /// different types are promoted to the widest).
  Follow,
  /// Mixed inputs: every operand is cast to the widest input type, which
  /// the result takes. Splat constants (the frontend's scalars) do not
  /// widen, like PyTorch's Python scalars.
  Promote,
  /// The op keeps the types it was written with (kiln.cast).
  Keep,
};

/// The rule name kiln-mixed-precision records in `kiln.precision.rule`.
enum class PrecisionRule {
  None,
  Gemm,            ///< "gemm-low"
  Elementwise,     ///< "elementwise-low"
  Activation,      ///< "activation-low"
  ExpLogPow,       ///< "exp-log-pow-fp32"
  Reduction,       ///< "reduction-fp32"
  Accumulate,      ///< "accumulate-fp32"
  Softmax,         ///< "softmax-fp32-stats"
  LayerNorm,       ///< "layer-norm-fp32-stats"
  Attention,       ///< "attention-fp32-stats"
  LogSoftmax,      ///< "log-softmax-fp32"
  Loss,            ///< "loss-fp32"
  UserCast,        ///< "user-cast"
  AutocastLow,     ///< "autocast-lower-precision"
  AutocastFp32,    ///< "autocast-fp32"
};

/// "gemm-low", ..., "" for None.
llvm::StringRef precisionRuleName(PrecisionRule r);

/// An op's policy in the two modes: Kiln's own ("kiln": low-precision
/// storage, fp32 statistics inside kernels) and PyTorch's ("autocast").
struct PrecisionPolicy {
  PrecisionClass kiln;
  PrecisionRule kilnRule;
  PrecisionClass autocast;
  PrecisionRule autocastRule;
};

/// The common policies.
namespace precision {
/// Elementwise arithmetic: low in Kiln's mode, the widest input under autocast.
inline constexpr PrecisionPolicy kElementwise{PrecisionClass::Low, PrecisionRule::Elementwise,
                                              PrecisionClass::Promote, PrecisionRule::None};
/// Activations: the same classes, their own rule name.
inline constexpr PrecisionPolicy kActivation{PrecisionClass::Low, PrecisionRule::Activation,
                                             PrecisionClass::Promote, PrecisionRule::None};
/// exp, log, pow: fp32 in both modes.
inline constexpr PrecisionPolicy kExpLogPow{PrecisionClass::Fp32, PrecisionRule::ExpLogPow,
                                            PrecisionClass::Fp32, PrecisionRule::AutocastFp32};
/// Data movement: the input's type in both modes.
inline constexpr PrecisionPolicy kFollow{PrecisionClass::Follow, PrecisionRule::None,
                                         PrecisionClass::Follow, PrecisionRule::None};
} // namespace precision

//===----------------------------------------------------------------------===//
// Row locality (RowLocalityOpInterface)
//===----------------------------------------------------------------------===//

/// How an op's rows relate to its operands, for kiln-fuse: the op is
/// row-local over the first `maxRows` dimensions of its result (each
/// element of those dimensions is computed from the same row of its
/// operands), and operand i is read either by rows (`rowShaped[i]`: its
/// first dimensions are the result's) or whole (no dimension of it is a row
/// dimension). Both hold for every smaller row count too. maxRows = 0: the
/// op needs all of its input at once.
struct RowLocality {
  int64_t maxRows = 0;
  llvm::SmallVector<bool, 4> rowShaped;
};

//===----------------------------------------------------------------------===//
// Index operands (IndexUseOpInterface)
//===----------------------------------------------------------------------===//

/// How an op uses one of its operands as an integer index, for the range
/// the artifact's manifest states (compiler/IndexRanges.h).
struct IndexUse {
  enum Kind {
    None,    ///< not an index (or one no rule bounds)
    Bounded, ///< an index into a dimension of size `hi`: [0, hi)
    Follow,  ///< moved unchanged into the result: its uses bound it
  };
  Kind kind = None;
  int64_t hi = 0;
  /// What bounds it, for messages ("kiln.gather indices (a table of 50 rows)").
  std::string from;

  static IndexUse none() { return {}; }
  static IndexUse follow() { return {Follow, 0, ""}; }
  static IndexUse bounded(int64_t hi, std::string from) { return {Bounded, hi, std::move(from)}; }
};

} // namespace kiln

#endif // KILN_DIALECTS_KILN_OPRULES_H
