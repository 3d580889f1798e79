//===- Columns.cpp - The column kernel forms --------------------------------===//
//
// Reductions over leading dimensions (siblings share the pass): tiles of 32
// adjacent columns per block, long columns split over several blocks and
// finished by the last (emitColumnTiles); otherwise a block per reduced
// element (shuffle + shared-memory tree), or a thread per element looping
// over the column when there are many.
//
//===----------------------------------------------------------------------===//
#include "compiler/cuda/KernelEmitter.h"

#include "dialects/kiln/KilnOps.h"

#include <fmt/format.h>

#include <algorithm>

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
  // Long columns whose kept dims are the trailing ones (so kept indices are
  // contiguous in memory), with only reduced-shape outputs: the tiled form.
  bool keptTrailing = true;
  for (auto [i, d] : llvm::enumerate(redDims))
    keptTrailing &= d == int64_t(i);
  if (columnTiles_ && fullOuts.empty() && keptTrailing && n >= 512 && k <= 65536 && (k == 1 || k >= 32))
    return emitColumnTiles(reds, k, n, keptSizes, redSizes, reducedOuts, fullIndex,
                           reducedIndex, launches);
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


// The tiled column form. A block of 256 threads reads 32 adjacent columns
// (one per lane, so each warp load is one 128-byte line) of a chunk of the
// rows, 8 rows at a time; the 8 partial sums meet in shared memory. A whole
// reduction (k = 1) reads 256 adjacent elements at a time and sums them
// with a block tree. Long
// columns are split over `chunks` blocks to fill the GPU: each writes its
// partial to a module-global array and the last block of a tile to finish
// (an atomic counter, after a __threadfence) adds the partials in chunk
// order. Every sum has a fixed order, so results do not depend on which
// block runs first.
LogicalResult KernelEmitter::emitColumnTiles(
    ArrayRef<Operation *> reds, int64_t k, int64_t n, ArrayRef<int64_t> keptSizes,
    ArrayRef<int64_t> redSizes, ArrayRef<unsigned> reducedOuts,
    llvm::function_ref<SmallVector<std::string>(ArrayRef<std::string>, ArrayRef<std::string>)>
        fullIndex,
    llvm::function_ref<SmallVector<std::string>(Value, ArrayRef<std::string>)> reducedIndex,
    std::vector<gpu::Launch> &launches) {
  Block &b = fusion_.getBlock();
  auto yields = b.getTerminator()->getOperands();
  constexpr int64_t kThreads = 256, kTargetBlocks = 512, kMinChunk = 256;
  // A whole reduction (one kept element) uses every thread on rows.
  const int64_t kLanes = k == 1 ? 1 : 32, kRowLanes = kThreads / kLanes;
  int64_t tiles = (k + kLanes - 1) / kLanes;
  int64_t chunks = std::clamp<int64_t>(kTargetBlocks / tiles, 1, std::max<int64_t>(n / kMinChunk, 1));
  int64_t chunk = (n + chunks - 1) / chunks;
  chunks = (n + chunk - 1) / chunk; // every chunk non-empty
  std::string fname = fmt::format("{}_{}", name_, kernelCount_++);
  indent_ = 1;
  memo_.clear();
  memo_.emplace_back();
  line(fmt::format("const int kiln_tile = blockIdx.x % {}, kiln_chunk = blockIdx.x / {};", tiles,
                   tiles));
  line(kLanes == 1 ? "const int kiln_tx = 0, kiln_ty = threadIdx.x;"
                   : "const int kiln_tx = threadIdx.x & 31, kiln_ty = threadIdx.x >> 5;");
  line(fmt::format("const int kiln_col = kiln_tile * {} + kiln_tx;", kLanes));
  line(fmt::format("const bool kiln_live = kiln_col < {};", k));
  line(fmt::format("const int k = kiln_live ? kiln_col : {};", k - 1));
  SmallVector<std::string> kc = delinear("k", keptSizes);
  line(fmt::format("const int kiln_end = kiln_chunk < {} ? (kiln_chunk + 1) * {} : {};",
                   chunks - 1, chunk, n));
  struct Red {
    Operation *op;
    TypeInfo ti;
    std::string acc, cols, part;
  };
  SmallVector<Red> rs;
  std::string globals;
  for (Operation *red : reds) {
    Red r{red, {}, fresh("acc"), fresh("kiln_cols"), ""};
    typeInfo(tensorOf(red->getResult(0)).getElementType(), r.ti);
    if (!r.ti.isFloat)
      return fail(red, "integer reductions");
    if (chunks > 1) {
      r.part = fmt::format("kiln_part_{}_{}", fname, rs.size());
      globals += fmt::format("__device__ {} {}[{}];\n", r.ti.compute, r.part, chunks * k);
    }
    if (kLanes == 1)
      line(fmt::format("__shared__ {} {}[32];", r.ti.compute, r.cols));
    else
      line(fmt::format("__shared__ {} {}[{}][{}];", r.ti.compute, r.cols, kRowLanes, kLanes));
    line(fmt::format("{} {} = {};", r.ti.compute, r.acc, accInit(red)));
    line(fmt::format("for (int n = kiln_chunk * {} + kiln_ty; n < kiln_end; n += {}) {{", chunk,
                     kRowLanes));
    push();
    SmallVector<std::string> nc = delinear("n", redSizes);
    line(accumulate(red, r.acc, emit(red->getOperand(0), fullIndex(kc, nc))));
    pop();
    line("}");
    if (kLanes == 1) // a tree over the block (every thread takes part)
      line(fmt::format("{} = {}({}, {});", r.acc,
                       isa<ReduceMaxOp>(red) ? "kiln_block_max" : "kiln_block_sum", r.acc,
                       r.cols));
    else
      line(fmt::format("{}[kiln_ty][kiln_tx] = {};", r.cols, r.acc));
    rs.push_back(r);
  }
  if (kLanes > 1)
    line("__syncthreads();");
  // The 8 row lanes of each column, in order.
  line("if (kiln_ty == 0) {");
  push();
  for (Red &r : rs) {
    if (kLanes > 1) {
      line(fmt::format("{} = {}[0][kiln_tx];", r.acc, r.cols));
      line(fmt::format("for (int y = 1; y < {}; ++y)", kRowLanes));
      line("  " + accumulate(r.op, r.acc, fmt::format("{}[y][kiln_tx]", r.cols)));
    }
    if (chunks > 1)
      line(fmt::format("if (kiln_live) {}[kiln_chunk * {} + kiln_col] = {};", r.part, k, r.acc));
  }
  pop();
  line("}");
  std::string counter;
  if (chunks > 1) {
    counter = fmt::format("kiln_count_{}", fname);
    // Zero at load (.nv.global.init); each launch's last block re-zeroes its own.
    globals += fmt::format("__device__ unsigned {}[{}] = {{}};\n", counter, tiles);
    line("__threadfence(); // the partials are visible before the count says so");
    line("__syncthreads();");
    line("__shared__ int kiln_last;");
    line(fmt::format("if (threadIdx.x == 0) kiln_last = atomicAdd(&{}[kiln_tile], 1u) == {};",
                     counter, chunks - 1));
    line("__syncthreads();");
    line("if (!kiln_last) return;");
  }
  line("if (kiln_ty == 0 && kiln_live) {");
  push();
  for (Red &r : rs) {
    if (chunks > 1) {
      line(fmt::format("{} = {};", r.acc, accInit(r.op)));
      line(fmt::format("for (int c = 0; c < {}; ++c)", chunks));
      line("  " + accumulate(r.op, r.acc,
                             fmt::format("((volatile {} *){})[c * {} + kiln_col]", r.ti.compute,
                                         r.part, k)));
    }
    double scale = isa<ReduceMeanOp>(r.op) ? 1.0 / double(n) : 1.0;
    std::string fin = scale == 1.0 ? r.acc
                                   : fmt::format("{} * {}", r.acc,
                                                 floatLiteral(scale, r.ti.compute == "double"));
    Reduction &rr = reductions_[r.op];
    rr.op = r.op;
    rr.indexed = false;
    rr.storage = fresh("red");
    line(fmt::format("const {} {} = {};", r.ti.compute, rr.storage, rounded(r.op, r.ti, fin)));
  }
  for (unsigned o : reducedOuts)
    store(o, reducedIndex(yields[o], kc));
  pop();
  line("}");
  if (chunks > 1)
    line(fmt::format("if (threadIdx.x == 0) {}[kiln_tile] = 0; // ready for the next launch",
                     counter));
  if (!error_.empty())
    return failure();
  code_ += globals;
  finish(fname, chunks > 1 ? "columns(tiles, split)" : "columns(tiles)", tiles * chunks,
         kLanes * kRowLanes, launches);
  return success();
}

} // namespace kiln::cudagen
