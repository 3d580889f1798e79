//===- ShapeRules.cpp - Shape rules of kiln ops ---------------------------===//
#include "dialects/kiln/ShapeRules.h"

#include "mlir/IR/Diagnostics.h"
#include "llvm/Support/raw_ostream.h"

using namespace mlir;

namespace kiln::shape {

std::string str(llvm::ArrayRef<int64_t> shape) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << "[";
  llvm::interleaveComma(shape, os);
  os << "]";
  return s;
}

bool numElements(llvm::ArrayRef<int64_t> shape, int64_t &count) {
  count = 1;
  for (int64_t d : shape) {
    if (d < 0)
      return false;
    if (d != 0 && count > INT64_MAX / d)
      return false;
    count *= d;
  }
  return true;
}

LogicalResult axis(Loc loc, int64_t rank, int64_t ax, llvm::StringRef what) {
  if (ax < 0 || ax >= rank)
    return emitOptionalError(loc, what, " ", ax,
                             " is out of range for a tensor of rank ", rank,
                             " (expected 0 <= ", what, " < ", rank, ")");
  return success();
}

LogicalResult broadcastInDim(Loc loc, llvm::ArrayRef<int64_t> operand,
                             llvm::ArrayRef<int64_t> dims,
                             llvm::ArrayRef<int64_t> result) {
  if (dims.size() != operand.size())
    return emitOptionalError(loc, "dims has ", dims.size(),
                             " entries but the operand has rank ",
                             operand.size(), " (one result dim per operand dim)");
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0 || dims[i] >= static_cast<int64_t>(result.size()))
      return emitOptionalError(loc, "dims[", i, "] = ", dims[i],
                               " is out of range for a result of rank ",
                               result.size());
    if (i > 0 && dims[i] <= dims[i - 1])
      return emitOptionalError(loc, "dims must be strictly increasing, got ",
                               str(dims));
    if (operand[i] != 1 && operand[i] != result[dims[i]])
      return emitOptionalError(
          loc, "operand dim ", i, " has size ", operand[i],
          " but result dim ", dims[i], " has size ", result[dims[i]],
          " (a broadcast dim must have size 1 or match)");
  }
  return success();
}

LogicalResult reduce(Loc loc, llvm::ArrayRef<int64_t> operand,
                     llvm::ArrayRef<int64_t> axes, bool keepdims,
                     Shape &result) {
  int64_t rank = operand.size();
  for (size_t i = 0; i < axes.size(); ++i) {
    if (failed(axis(loc, rank, axes[i], "axis")))
      return failure();
    if (i > 0 && axes[i] <= axes[i - 1])
      return emitOptionalError(loc, "axes must be sorted and unique, got ",
                               str(axes));
  }
  result.clear();
  for (int64_t d = 0; d < rank; ++d) {
    bool reduced = llvm::is_contained(axes, d);
    if (!reduced)
      result.push_back(operand[d]);
    else if (keepdims)
      result.push_back(1);
  }
  return success();
}

LogicalResult matmul(Loc loc, llvm::ArrayRef<int64_t> lhs,
                     llvm::ArrayRef<int64_t> rhs, bool transposeLhs,
                     bool transposeRhs, Shape &result) {
  if (lhs.size() < 2 || rhs.size() < 2)
    return emitOptionalError(loc, "operands must have rank >= 2, got lhs ",
                             str(lhs), " and rhs ", str(rhs));
  size_t lr = lhs.size(), rr = rhs.size();
  int64_t m = transposeLhs ? lhs[lr - 1] : lhs[lr - 2];
  int64_t kl = transposeLhs ? lhs[lr - 2] : lhs[lr - 1];
  int64_t kr = transposeRhs ? rhs[rr - 1] : rhs[rr - 2];
  int64_t n = transposeRhs ? rhs[rr - 2] : rhs[rr - 1];
  if (kl != kr)
    return emitOptionalError(loc, "contracting dimensions differ: lhs ",
                             str(lhs), (transposeLhs ? " (transposed)" : ""),
                             " has K = ", kl, " but rhs ", str(rhs),
                             (transposeRhs ? " (transposed)" : ""),
                             " has K = ", kr);
  llvm::ArrayRef<int64_t> lb = lhs.drop_back(2), rb = rhs.drop_back(2);
  if (!lb.empty() && !rb.empty() && lb != rb)
    return emitOptionalError(loc, "batch dimensions differ: lhs ", str(lb),
                             " vs rhs ", str(rb),
                             " (they must be equal, or one side has none)");
  result.assign(lb.empty() ? rb.begin() : lb.begin(),
                lb.empty() ? rb.end() : lb.end());
  result.push_back(m);
  result.push_back(n);
  return success();
}

LogicalResult transpose(Loc loc, llvm::ArrayRef<int64_t> operand,
                        llvm::ArrayRef<int64_t> perm, Shape &result) {
  if (perm.size() != operand.size())
    return emitOptionalError(loc, "permutation ", str(perm), " has ",
                             perm.size(), " entries but the operand has rank ",
                             operand.size());
  llvm::SmallVector<bool> seen(perm.size(), false);
  result.clear();
  for (int64_t p : perm) {
    if (p < 0 || p >= static_cast<int64_t>(perm.size()) || seen[p])
      return emitOptionalError(loc, "permutation ", str(perm),
                               " is not a permutation of 0..",
                               perm.size() - 1);
    seen[p] = true;
    result.push_back(operand[p]);
  }
  return success();
}

LogicalResult slice(Loc loc, llvm::ArrayRef<int64_t> operand,
                    llvm::ArrayRef<int64_t> start,
                    llvm::ArrayRef<int64_t> limit,
                    llvm::ArrayRef<int64_t> stride, Shape &result) {
  size_t rank = operand.size();
  if (start.size() != rank || limit.size() != rank || stride.size() != rank)
    return emitOptionalError(loc, "start, limit and stride need ", rank,
                             " entries each (the operand's rank), got ",
                             start.size(), ", ", limit.size(), " and ",
                             stride.size());
  result.clear();
  for (size_t d = 0; d < rank; ++d) {
    if (stride[d] < 1)
      return emitOptionalError(loc, "stride in dim ", d, " is ", stride[d],
                               " (expected >= 1)");
    if (start[d] < 0 || start[d] > limit[d] || limit[d] > operand[d])
      return emitOptionalError(loc, "dim ", d, ": need 0 <= start (",
                               start[d], ") <= limit (", limit[d],
                               ") <= size (", operand[d], ")");
    result.push_back(limit[d] == start[d] ? 0
                                          : (limit[d] - start[d] - 1) / stride[d] + 1);
  }
  return success();
}

LogicalResult concat(Loc loc, llvm::ArrayRef<llvm::SmallVector<int64_t>> inputs,
                     int64_t dim, Shape &result) {
  if (inputs.empty())
    return emitOptionalError(loc, "needs at least one input");
  llvm::ArrayRef<int64_t> first = inputs.front();
  if (failed(axis(loc, first.size(), dim, "dim")))
    return failure();
  result.assign(first.begin(), first.end());
  for (size_t i = 1; i < inputs.size(); ++i) {
    llvm::ArrayRef<int64_t> in = inputs[i];
    if (in.size() != first.size())
      return emitOptionalError(loc, "input ", i, " has rank ", in.size(),
                               " but input 0 has rank ", first.size());
    for (size_t d = 0; d < in.size(); ++d) {
      if (static_cast<int64_t>(d) == dim)
        continue;
      if (in[d] != first[d])
        return emitOptionalError(loc, "input ", i, " has shape ", str(in),
                                 " but input 0 has ", str(first),
                                 "; only dim ", dim, " may differ");
    }
    if (result[dim] > INT64_MAX - in[dim])
      return emitOptionalError(loc, "concatenated size overflows");
    result[dim] += in[dim];
  }
  return success();
}

LogicalResult gather(Loc loc, llvm::ArrayRef<int64_t> operand,
                     llvm::ArrayRef<int64_t> indices, int64_t ax,
                     Shape &result) {
  if (failed(axis(loc, operand.size(), ax, "axis")))
    return failure();
  result.assign(operand.begin(), operand.begin() + ax);
  result.append(indices.begin(), indices.end());
  result.append(operand.begin() + ax + 1, operand.end());
  return success();
}

LogicalResult crossEntropy(Loc loc, llvm::ArrayRef<int64_t> logits,
                           llvm::ArrayRef<int64_t> targets, bool reduced,
                           Shape &result) {
  if (logits.empty())
    return emitOptionalError(loc, "logits must have rank >= 1 (classes last)");
  if (targets != logits.drop_back())
    return emitOptionalError(loc, "targets have shape ", str(targets),
                             " but logits ", str(logits), " need targets of "
                             "shape ", str(logits.drop_back()),
                             " (logits without the class dim)");
  result.clear();
  if (!reduced)
    result.assign(targets.begin(), targets.end());
  return success();
}

LogicalResult layerNorm(Loc loc, llvm::ArrayRef<int64_t> operand,
                        const llvm::ArrayRef<int64_t> *scale,
                        const llvm::ArrayRef<int64_t> *bias) {
  if (operand.empty())
    return emitOptionalError(loc, "operand must have rank >= 1");
  int64_t last = operand.back();
  for (auto [name, s] : {std::make_pair("scale", scale),
                         std::make_pair("bias", bias)}) {
    if (s && (s->size() != 1 || (*s)[0] != last))
      return emitOptionalError(loc, name, " has shape ", str(*s),
                               " but must be [", last,
                               "] (the normalised last dim)");
  }
  return success();
}

} // namespace kiln::shape
