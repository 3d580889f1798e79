//===- Columns.cpp - The column kernel forms --------------------------------===//
//
// Reductions over leading dimensions (siblings share the pass): a block per
// reduced element (shuffle + shared-memory tree), or a thread per element
// looping over the column when there are many.
//
//===----------------------------------------------------------------------===//
#include "compiler/cuda/KernelEmitter.h"

#include "dialects/kiln/KilnOps.h"

#include <fmt/format.h>

using namespace mlir;

namespace kiln::cudagen {

LogicalResult KernelEmitter::emitColumns(std::vector<gpu::Launch> &launches) {
  Block &b = fusion_.getBlock();
  auto yields = b.getTerminator()->getOperands();
  SmallVector<Operation *> reds;
  for (Operation &op : b.without_terminator())
    if (isReduction(&op))
      reds.push_back(&op);
  if (reds.empty())
    return emitElementwise(launches);
  RankedTensorType in = tensorOf(reds.front()->getOperand(0));
  ArrayRef<int64_t> axes = reds.front()->getAttrOfType<DenseI64ArrayAttr>("axes").asArrayRef();
  for (Operation *r : reds)
    if (tensorOf(r->getOperand(0)).getShape() != in.getShape() ||
        r->getAttrOfType<DenseI64ArrayAttr>("axes").asArrayRef() != axes)
      return fail(r, "column reductions of different shapes in one kernel");
  SmallVector<int64_t> kept = keptDims(reds.front());
  SmallVector<int64_t> keptSizes, redDims, redSizes;
  for (int64_t d : kept)
    keptSizes.push_back(in.getDimSize(d));
  for (int64_t d = 0; d < in.getRank(); ++d)
    if (!llvm::is_contained(kept, d)) {
      redDims.push_back(d);
      redSizes.push_back(in.getDimSize(d));
    }
  int64_t k = product(keptSizes), n = product(redSizes);
  // Outputs: reduced-shape values (one per kept index) and input-shape ones.
  SmallVector<unsigned> reducedOuts, fullOuts, otherOuts;
  auto reducedShaped = [&](Value y) {
    return llvm::any_of(reds, [&](Operation *r) {
      return tensorOf(r->getResult(0)).getShape() == tensorOf(y).getShape();
    });
  };
  for (auto [i, y] : llvm::enumerate(yields)) {
    if (reducedShaped(y))
      reducedOuts.push_back(unsigned(i));
    else if (tensorOf(y).getShape() == in.getShape())
      fullOuts.push_back(unsigned(i));
    else
      return fail(y.getDefiningOp(), "an output of neither the input nor the reduced shape");
  }
  // The output index of a reduced-shape value for kept coordinates kc.
  auto reducedIndex = [&](Value y, ArrayRef<std::string> kc) {
    RankedTensorType t = tensorOf(y);
    SmallVector<std::string> idx;
    if (t.getRank() == in.getRank()) { // keepdims
      for (int64_t d = 0; d < in.getRank(); ++d) {
        auto it = llvm::find(kept, d);
        idx.push_back(it == kept.end() ? std::string("0") : kc[it - kept.begin()]);
      }
    } else {
      idx.assign(kc.begin(), kc.end());
    }
    return idx;
  };
  auto fullIndex = [&](ArrayRef<std::string> kc, ArrayRef<std::string> nc) {
    SmallVector<std::string> idx(in.getRank());
    for (auto [i, d] : llvm::enumerate(kept))
      idx[d] = kc[i];
    for (auto [i, d] : llvm::enumerate(redDims))
      idx[d] = nc[i];
    return idx;
  };
  // A thread per kept index when there are many and each column is short;
  // otherwise a block per kept index.
  bool threadPerColumn = k >= 8192 || (k >= 1024 && n <= 256);
  std::string fname = fmt::format("{}_{}", name_, kernelCount_++);
  indent_ = 1;
  memo_.clear();
  memo_.emplace_back();
  if (threadPerColumn) {
    line("const int k = blockIdx.x * blockDim.x + threadIdx.x;");
    line(fmt::format("if (k >= {}) return;", k));
  } else {
    line("const int k = blockIdx.x;");
    line("__shared__ float kiln_scratch[32];");
    line("__shared__ double kiln_scratch_d[32]; // f64 reductions");
  }
  SmallVector<std::string> kc = delinear("k", keptSizes);
  for (Operation *red : reds) {
    TypeInfo ti;
    typeInfo(tensorOf(red->getResult(0)).getElementType(), ti);
    if (!ti.isFloat)
      return fail(red, "integer reductions");
    std::string acc = fresh("acc");
    bool isMax = isa<ReduceMaxOp>(red);
    double scale = isa<ReduceMeanOp>(red) ? 1.0 / double(n) : 1.0;
    std::string fin = scale == 1.0 ? acc : fmt::format("{} * {}", acc, floatLiteral(scale, ti.compute == "double"));
    // fp32 statistics: a low-precision result is rounded only where stored.
    line(fmt::format("{} {} = {};", ti.compute, acc, accInit(red)));
    line(threadPerColumn ? fmt::format("for (int n = 0; n < {}; ++n) {{", n)
                         : fmt::format("for (int n = threadIdx.x; n < {}; n += blockDim.x) {{", n));
    push();
    SmallVector<std::string> nc = delinear("n", redSizes);
    line(accumulate(red, acc, emit(red->getOperand(0), fullIndex(kc, nc))));
    pop();
    line("}");
    Reduction &r = reductions_[red];
    r.op = red;
    r.indexed = false;
    if (threadPerColumn) {
      r.storage = fresh("red");
      line(fmt::format("const {} {} = {};", ti.compute, r.storage, fin));
    } else {
      r.storage = fresh("red");
      line(fmt::format("{} = {}({}, {});", acc, isMax ? "kiln_block_max" : "kiln_block_sum", acc,
                       ti.compute == "double" ? "kiln_scratch_d" : "kiln_scratch"));
      line(fmt::format("__shared__ {} {};", ti.compute, r.storage));
      line(fmt::format("if (threadIdx.x == 0) {} = {};", r.storage, fin));
      line("__syncthreads();");
    }
  }
  if (!threadPerColumn && !reducedOuts.empty())
    line("if (threadIdx.x == 0) {");
  else if (!reducedOuts.empty())
    line("{");
  push();
  for (unsigned o : reducedOuts)
    store(o, reducedIndex(yields[o], kc));
  pop();
  if (!reducedOuts.empty())
    line("}");
  for (unsigned o : fullOuts) {
    line(threadPerColumn ? fmt::format("for (int n = 0; n < {}; ++n) {{", n)
                         : fmt::format("for (int n = threadIdx.x; n < {}; n += blockDim.x) {{", n));
    push();
    SmallVector<std::string> nc = delinear("n", redSizes);
    store(o, fullIndex(kc, nc));
    pop();
    line("}");
  }
  if (!error_.empty())
    return failure();
  int64_t block = threadPerColumn ? 256 : (n >= 256 ? 256 : n > 64 ? 128 : 64);
  finish(fname, threadPerColumn ? "columns(thread per column)" : "columns(block per column)",
         threadPerColumn ? (k + 255) / 256 : k, block, launches);
  return success();
}

} // namespace kiln::cudagen
