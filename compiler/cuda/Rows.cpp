//===- Rows.cpp - The row kernel forms --------------------------------------===//
//
// A warp per row (rows of at most kMaxWarpRow elements, kRowsPerBlock rows
// per block, no block barrier) or a block per row; each reduction is a stage
// whose results later stages and the outputs read.
//
//===----------------------------------------------------------------------===//
#include "compiler/cuda/KernelEmitter.h"

#include "dialects/kiln/KilnOps.h"

#include <fmt/format.h>

#include <functional>

using namespace mlir;

namespace kiln::cudagen {

LogicalResult KernelEmitter::rowStage(Reduction &r, int64_t rows,
                                      ArrayRef<std::string> rowCoords) {
  Operation *red = r.op;
  RankedTensorType in = tensorOf(red->getOperand(0));
  ArrayRef<int64_t> axes = red->getAttrOfType<DenseI64ArrayAttr>("axes").asArrayRef();
  for (int64_t a : axes)
    if (a < rows)
      return fail(red, "a reduction over a row dimension in a row kernel");
  SmallVector<int64_t> within, reduced, withinSizes, reducedSizes;
  for (int64_t d = rows; d < in.getRank(); ++d) {
    if (llvm::is_contained(axes, d)) {
      reduced.push_back(d);
      reducedSizes.push_back(in.getDimSize(d));
    } else {
      within.push_back(d);
      withinSizes.push_back(in.getDimSize(d));
    }
  }
  int64_t k = product(withinSizes), n = product(reducedSizes);
  Type et = tensorOf(red->getResult(0)).getElementType();
  TypeInfo ti;
  typeInfo(et, ti);
  if (!ti.isFloat)
    return fail(red, "integer reductions");
  std::string acc = fresh("acc"), store = fresh("red");
  r.storage = store;
  r.keptWithin = within;
  r.indexed = true;
  double scale = isa<ReduceMeanOp>(red) ? 1.0 / double(n) : 1.0;
  auto finalize = [&](const std::string &a) {
    std::string e = scale == 1.0 ? a : fmt::format("{} * {}", a, floatLiteral(scale, ti.compute == "double"));
    return rounded(red, ti, e); // a decomposed op's statistic stays fp32
  };
  auto inputIndex = [&](ArrayRef<std::string> kc, ArrayRef<std::string> nc) {
    SmallVector<std::string> idx(in.getRank());
    for (int64_t d = 0; d < rows; ++d)
      idx[d] = rowCoords[d];
    for (auto [i, d] : llvm::enumerate(within))
      idx[d] = kc[i];
    for (auto [i, d] : llvm::enumerate(reduced))
      idx[d] = nc[i];
    return idx;
  };
  bool isMax = isa<ReduceMaxOp>(red);
  // One warp reduces each kept-within element `k` of the loop `kLoop`
  // opens: lanes stride over the reduced elements, the butterfly leaves the
  // total in every lane, `result(acc)` stores it.
  auto warpReduce = [&](const std::string &kLoop,
                        const std::function<std::string(const std::string &)> &result) {
    line(kLoop);
    push();
    SmallVector<std::string> kc = delinear("k", withinSizes);
    line(fmt::format("{} {} = {};", ti.compute, acc, accInit(red)));
    line(fmt::format("for (int n = kiln_lane(); n < {}; n += 32) {{", n));
    push();
    SmallVector<std::string> nc = delinear("n", reducedSizes);
    std::string v = emit(red->getOperand(0), inputIndex(kc, nc));
    line(accumulate(red, acc, v));
    pop();
    line("}");
    line(fmt::format("{} = {}({});", acc, isMax ? "kiln_warp_max" : "kiln_warp_sum", acc));
    line(result(finalize(acc)));
    pop();
    line("}");
  };
  if (warpRows_) {
    // The row's warp does every k in turn. One value (k == 1) stays in a
    // register of every lane; several go to the warp's slice of shared
    // memory.
    if (k == 1) {
      r.indexed = false;
      line(fmt::format("{} {};", ti.compute, store));
    } else {
      line(fmt::format("__shared__ {} {}[{}];", ti.compute, store, kRowsPerBlock * k));
    }
    line("{");
    push();
    warpReduce(fmt::format("for (int k = 0; k < {}; ++k) {{", k), [&](const std::string &v) {
      return k == 1 ? fmt::format("{} = {};", store, v)
                    : fmt::format("if (kiln_lane() == 0) {}[kiln_warp() * {} + k] = {};", store,
                                  k, v);
    });
    pop();
    line("}");
    if (k > 1)
      line("__syncwarp();");
    return error_.empty() ? success() : failure();
  }
  line(fmt::format("__shared__ {} {}[{}];", ti.compute, store, k));
  line("{");
  push();
  if (k == 1) {
    line(fmt::format("{} {} = {};", ti.compute, acc, accInit(red)));
    line(fmt::format("for (int n = threadIdx.x; n < {}; n += blockDim.x) {{", n));
    push();
    SmallVector<std::string> nc = delinear("n", reducedSizes);
    std::string v = emit(red->getOperand(0), inputIndex({}, nc));
    line(accumulate(red, acc, v));
    pop();
    line("}");
    line(fmt::format("{} = {}({}, {});", acc, isMax ? "kiln_block_max" : "kiln_block_sum", acc,
                     ti.compute == "double" ? "kiln_scratch_d" : "kiln_scratch"));
    line(fmt::format("if (threadIdx.x == 0) {}[0] = {};", store, finalize(acc)));
  } else { // a warp per kept-within element
    warpReduce(fmt::format("for (int k = kiln_warp(); k < {}; k += blockDim.x / 32) {{", k),
               [&](const std::string &v) {
                 return fmt::format("if (kiln_lane() == 0) {}[k] = {};", store, v);
               });
  }
  pop();
  line("}");
  line("__syncthreads();");
  return error_.empty() ? success() : failure();
}

LogicalResult KernelEmitter::emitRows(int64_t rows, std::vector<gpu::Launch> &launches) {
  Block &b = fusion_.getBlock();
  auto yields = b.getTerminator()->getOperands();
  // The rows: the leading dims of the row-shaped outputs.
  SmallVector<int64_t> rowShape;
  for (Value y : yields)
    if (tensorOf(y).getRank() >= rows) {
      rowShape.assign(tensorOf(y).getShape().begin(), tensorOf(y).getShape().begin() + rows);
      break;
    }
  if (int64_t(rowShape.size()) != rows)
    return fail(nullptr, "no output has the row dimensions");
  int64_t numRows = product(rowShape);
  // The largest row: threads per block.
  int64_t widest = 1;
  auto widen = [&](Value v) {
    auto t = tensorOf(v);
    if (t.getRank() >= rows && t.getShape().take_front(rows) == ArrayRef<int64_t>(rowShape))
      widest = std::max(widest, product(t.getShape().drop_front(rows)));
  };
  for (Operation &op : b.without_terminator()) {
    for (Value v : op.getOperands())
      widen(v);
    for (Value v : op.getResults())
      widen(v);
  }
  // Rows of up to kMaxWarpRow elements: a warp per row, kRowsPerBlock rows
  // per block, no block-wide barrier (softmax over 64-256 keys, layer_norm
  // over 128-768 features). Wider rows: a block per row.
  warpRows_ = widest <= kMaxWarpRow;
  int64_t block = warpRows_ ? 32 * kRowsPerBlock : widest >= 256 ? 256 : widest > 64 ? 128 : 64;
  int64_t grid = warpRows_ ? (numRows + kRowsPerBlock - 1) / kRowsPerBlock : numRows;
  std::string fname = fmt::format("{}_{}", name_, kernelCount_++);
  indent_ = 1;
  memo_.clear();
  memo_.emplace_back();
  std::string rowVar = "blockIdx.x", lane = "threadIdx.x", step = "blockDim.x";
  if (warpRows_) {
    line(fmt::format("const int row = blockIdx.x * {} + kiln_warp();", kRowsPerBlock));
    line(fmt::format("if (row >= {}) return; // the whole warp: no barriers follow", numRows));
    rowVar = "row";
    lane = "kiln_lane()";
    step = "32";
  } else {
    line("__shared__ float kiln_scratch[32];");
    line("__shared__ double kiln_scratch_d[32]; // f64 reductions");
  }
  SmallVector<std::string> rowCoords = delinear(rowVar, rowShape);
  for (Operation &op : b.without_terminator()) {
    if (!isReduction(&op))
      continue;
    Reduction &r = reductions_[&op];
    r.op = &op;
    if (failed(rowStage(r, rows, rowCoords)))
      return failure();
  }
  for (auto [i, y] : llvm::enumerate(yields)) {
    RankedTensorType t = tensorOf(y);
    bool rowShaped = t.getRank() >= rows && t.getShape().take_front(rows) == ArrayRef<int64_t>(rowShape);
    SmallVector<int64_t> inner = rowShaped ? SmallVector<int64_t>(t.getShape().drop_front(rows))
                                           : SmallVector<int64_t>(t.getShape());
    if (!rowShaped)
      line(fmt::format("if ({} == 0)", rowVar));
    line(fmt::format("for (int e = {}; e < {}; e += {}) {{", lane, product(inner), step));
    push();
    SmallVector<std::string> idx;
    if (rowShaped)
      idx.append(rowCoords.begin(), rowCoords.end());
    SmallVector<std::string> ic = delinear("e", inner);
    idx.append(ic.begin(), ic.end());
    store(unsigned(i), idx);
    pop();
    line("}");
  }
  if (!error_.empty())
    return failure();
  finish(fname, warpRows_ ? "rows(warp per row)" : "rows(block per row)", grid, block, launches);
  warpRows_ = false;
  return success();
}

} // namespace kiln::cudagen
