//===- Grouper.h - kiln-fuse's grouping, shared by its parts ----*- C++ -*-===//
//
// Private to passes/fusion/ and passes/Fusion.cpp: the roles and kernel
// kinds of kiln-fuse, a group of ops, and the Grouper that forms groups
// (Grouping.cpp: the join rules, the walk, sibling merges) and turns them
// into kiln.fusion ops (Materialize.cpp). passes/Fusion.h documents the
// rules; passes/Fusion.cpp runs it (fuseFunction, the pass).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_PASSES_FUSION_GROUPER_H
#define KILN_PASSES_FUSION_GROUPER_H

#include "passes/Fusion.h"

#include "dialects/kiln/KilnOps.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/BitVector.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"

#include <string>
#include <vector>

namespace kiln::fusion {

using namespace mlir;


inline RankedTensorType tensorType(Value v) { return cast<RankedTensorType>(v.getType()); }

inline std::string shapeString(ArrayRef<int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? "x" : "") + std::to_string(shape[i]);
  return s + "]";
}

/// What role an op can play in a group.
enum class Role {
  Skip,        ///< constants (and cheap duplicated values): cloned into users
  Elementwise, ///< elementwise ops, broadcasts and data movement (index maps)
  Reduction,   ///< reductions and the composite row ops
  Gemm,        ///< a library GEMM (float32 kiln.matmul)
  Single,      ///< has no fused form: a kernel of its own
  Library,     ///< a library-style step of its own (kiln.attention, attention_grad)
  Alias,       ///< produces no code (optimization_barrier): shares its operand
  Folded,      ///< folded into a GEMM (head transposes)
  Collective,  ///< a collective (all_reduce, ...): a plan step between kernels
};

/// The first dimensions of `a` and `b` that agree.
inline int64_t commonPrefix(ArrayRef<int64_t> a, ArrayRef<int64_t> b) {
  int64_t n = 0;
  while (n < int64_t(a.size()) && n < int64_t(b.size()) && a[n] == b[n])
    ++n;
  return n;
}

/// How an op's rows relate to its operands (RowLocalityOpInterface, answered
/// in each op's family file): none for an op without the interface.
inline RowLocality rowInfo(Operation *op) {
  if (auto rows = dyn_cast<RowLocalityOpInterface>(op))
    return rows.getRowLocality();
  RowLocality info;
  info.rowShaped.assign(op->getNumOperands(), true);
  return info;
}

/// The transcendental functions (expensive to recompute).
inline bool isExpensive(Operation *op) { return op->hasTrait<trait::Transcendental>(); }

enum class Kind { Elementwise, Row, Column, Gemm, Single, Library };

inline const char *kindName(Kind k) {
  switch (k) {
  case Kind::Elementwise: return "elementwise";
  case Kind::Row: return "row_reduction";
  case Kind::Column: return "column_reduction";
  case Kind::Gemm: return "gemm_epilogue";
  case Kind::Single: return "single";
  case Kind::Library: return "attention";
  }
  return "single";
}

struct Group {
  Kind kind = Kind::Single;
  int64_t rows = 0;             ///< number of leading row dimensions
  SmallVector<int64_t> rowShape; ///< their sizes (the first `rows` dims)
  SmallVector<Operation *> members;
  llvm::BitVector extDeps; ///< groups that the members' outside operands depend on
  /// Column groups: the shape and axes every reduction of the group has.
  SmallVector<int64_t> reducedShape, reducedAxes;
  Operation *gemm = nullptr; ///< the GEMM of a gemm_epilogue group
  /// Set once an op outside the group reads one of its values: the kernel
  /// then runs before that op, and ops after it cannot join (that would
  /// move the kernel, and its outputs' lifetimes, later or earlier).
  std::string closedBy;
};

class Grouper {
public:
  Grouper(func::FuncOp fn, const FusionOptions &options, std::vector<FusionRefusal> *refusals)
      : fn_(fn), block_(fn.getBody().front()), options_(options), refusals_(refusals) {}

  LogicalResult run();

private:
  // --- union-find over group ids -------------------------------------------
  int find(int g) {
    while (parent_[g] != g)
      g = parent_[g] = parent_[parent_[g]];
    return g;
  }
  int groupOf(Operation *op) {
    auto it = groupId_.find(op);
    return it == groupId_.end() ? -1 : find(it->second);
  }
  /// Whether any group id in `set` belongs to group `g`.
  bool contains(const llvm::BitVector &set, int g) {
    for (int b : set.set_bits())
      if (find(b) == g)
        return true;
    return false;
  }
  void refuse(Operation *producer, Operation *consumer, std::string rule);

  Role roleOf(Operation *op);
  bool duplicable(Value v, int depth = 0);
  /// Whether the member value `v` of its group depends on rows.
  bool rowDependent(Value v) { return !rowIndependent_.count(v); }
  /// Tries to add `op` to group `g` (possibly merging `others` in too);
  /// returns "" on success or the refusal rule.
  std::string canJoin(int g, Operation *op, ArrayRef<int> others, int64_t &newRows);
  std::string canMerge(int a, int b);
  void addTo(int g, Operation *op, int64_t rows);
  void merge(int into, int from);
  int newGroup(Operation *op, Kind kind);
  void siblingMerges();
  LogicalResult materialize();
  void placeShrinkingKernels();

  func::FuncOp fn_;
  Block &block_;
  FusionOptions options_;
  std::vector<FusionRefusal> *refusals_;
  std::vector<Group> groups_;
  std::vector<int> parent_;
  llvm::DenseMap<Operation *, int> groupId_;
  llvm::DenseMap<Operation *, llvm::BitVector> deps_;
  llvm::DenseMap<Operation *, Role> roles_;
  llvm::DenseMap<Value, bool> duplicable_;
  llvm::DenseSet<Value> rowIndependent_;
  llvm::DenseSet<Value> columnEpilogue_; ///< epilogue values of column groups
  llvm::DenseSet<std::pair<Operation *, Operation *>> refused_; ///< edges reported
  llvm::DenseSet<Operation *> foldedIn_, foldedOut_;
};

} // namespace kiln::fusion

#endif // KILN_PASSES_FUSION_GROUPER_H
