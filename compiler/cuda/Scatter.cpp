//===- Scatter.cpp - The scatter_add kernel form ----------------------------===//
//
// scatter_add, deterministic and without float atomics: the indices split
// into chunks, each chunk's per-row sums in shared memory, then the chunks
// summed in order (emitScatterChunks; kilnc --cuda-scatter=chunks, the
// default); otherwise, and with --cuda-scatter=walk, a thread per output
// element reading every index when the rows are few (emitScatterByRow),
// else a thread per (outer, inner) column adding the index positions in
// order.
//
//===----------------------------------------------------------------------===//
#include "compiler/cuda/KernelEmitter.h"

#include "dialects/kiln/KilnOps.h"

#include <fmt/format.h>

#include <algorithm>

using namespace mlir;

namespace kiln::cudagen {

// Inside the loop over index positions j (with o and in declared): `r`,
// index j clamped to the rows; indices in row-major order of their own shape.
void KernelEmitter::scatterRow(ScatterAddOp op, int64_t rowsN) {
  SmallVector<std::string> ji = delinear("j", op.getIndices().getType().getShape());
  std::string raw = emit(op.getIndices(), ji);
  line(fmt::format("const int r = (int)min(max((long long){}, 0ll), {}ll);", raw, rowsN - 1));
}

// The update at (o, j, in): updates are [outer, m, inner].
std::string KernelEmitter::scatterUpdate(ScatterAddOp op, int64_t m, int64_t inner) {
  std::string lin = fresh("u");
  line(fmt::format("const int {} = (o * {} + j) * {} + in;", lin, m, inner));
  SmallVector<std::string> ui = delinear(lin, op.getUpdates().getType().getShape());
  return emit(op.getUpdates(), ui);
}

LogicalResult KernelEmitter::emitScatter(ScatterAddOp op, std::vector<gpu::Launch> &launches) {
  RankedTensorType res = op.getType(), idxT = op.getIndices().getType();
  int64_t axis = op.getAxis(), outer = 1, inner = 1, rowsN = res.getDimSize(axis);
  for (int64_t d = 0; d < axis; ++d)
    outer *= res.getDimSize(d);
  for (int64_t d = axis + 1; d < res.getRank(); ++d)
    inner *= res.getDimSize(d);
  int64_t m = idxT.getNumElements();
  Value y = fusion_.getBlock().getTerminator()->getOperand(0);
  if (y != op.getResult())
    return fail(op, "a scatter_add kernel must output the scatter");
  TypeInfo ti;
  typeInfo(res.getElementType(), ti);
  std::string fname = fmt::format("{}_{}", name_, kernelCount_++);
  indent_ = 1;
  memo_.clear();
  memo_.emplace_back();
  if (scatterChunks_) {
    ScatterChunking ch = scatterChunking(outer, inner, rowsN, m, ti.compute == "double" ? 8 : 4);
    if (ch.chunks > 1)
      return emitScatterChunks(op, fname, outer, inner, rowsN, m, ch, ti, launches);
  }
  if (rowsN <= kMaxScatterRows && rowsN * m <= kMaxScatterWork)
    return emitScatterByRow(op, fname, outer, inner, rowsN, m, ti, launches);
  // Each thread owns one (outer, inner) column of the result: zero it, then
  // add the updates in index order (deterministic, no atomics).
  line("const int c = blockIdx.x * blockDim.x + threadIdx.x;");
  line(fmt::format("if (c >= {}) return;", outer * inner));
  line(fmt::format("const int o = c / {}, in = c % {};", inner, inner));
  line(fmt::format("for (int r = 0; r < {}; ++r) a{}[(o * {} + r) * {} + in] = {};", rowsN,
                   outArg_[0], rowsN, inner,
                   ti.isLow ? "kiln_from_float<" + ti.storage + ">(0.0f)" : "0"));
  line(fmt::format("for (int j = 0; j < {}; ++j) {{", m));
  push();
  scatterRow(op, rowsN);
  std::string u = scatterUpdate(op, m, inner);
  std::string slot = fmt::format("a{}[(o * {} + r) * {} + in]", outArg_[0], rowsN, inner);
  if (ti.isLow)
    line(fmt::format("{0} = kiln_from_float<{1}>(kiln_to_float({0}) + {2});", slot, ti.storage, u));
  else
    line(fmt::format("{} += {};", slot, u));
  pop();
  line("}");
  if (!error_.empty())
    return failure();
  finish(fname, "scatter", (outer * inner + 255) / 256, 256, launches);
  return success();
}


// Few rows (an embedding's vocabulary): a thread per output element (outer,
// row, inner), inner fastest. It reads every index in order (the same one
// across the warp: a broadcast) and adds the updates that land on its row
// into a register (fp32 for bf16/f16), stored once: the CPU's order and rounding, with
// rows x inner x outer threads instead of inner x outer (the H200's GPU
// config: 24960 threads instead of 384, each reading 16384 indices).
LogicalResult KernelEmitter::emitScatterByRow(ScatterAddOp op, const std::string &fname,
                                              int64_t outer, int64_t inner, int64_t rowsN,
                                              int64_t m, const TypeInfo &ti,
                                              std::vector<gpu::Launch> &launches) {
  int64_t total = outer * rowsN * inner;
  line("const int c = blockIdx.x * blockDim.x + threadIdx.x;");
  line(fmt::format("if (c >= {}) return;", total));
  line(fmt::format("const int in = c % {}, row = (c / {}) % {}, o = c / {};", inner, inner, rowsN,
                   rowsN * inner));
  std::string acc = fresh("acc");
  line(fmt::format("{} {} = 0;", ti.compute, acc));
  line(fmt::format("for (int j = 0; j < {}; ++j) {{", m));
  push();
  scatterRow(op, rowsN);
  line("if (r != row) continue;");
  std::string u = scatterUpdate(op, m, inner);
  line(fmt::format("{} += {};", acc, u));
  pop();
  line("}");
  std::string slot = fmt::format("a{}[(o * {} + row) * {} + in]", outArg_[0], rowsN, inner);
  line(ti.isLow ? fmt::format("{} = kiln_from_float<{}>({});", slot, ti.storage, acc)
                : fmt::format("{} = {};", slot, acc));
  if (!error_.empty())
    return failure();
  finish(fname, "scatter(by row)", (total + 255) / 256, 256, launches);
  return success();
}

ScatterChunking scatterChunking(int64_t outer, int64_t inner, int64_t rowsN, int64_t m,
                                 int64_t computeBytes) {
  ScatterChunking ch;
  // The widest block (one thread per column) whose rows x columns partials
  // fit the shared-memory budget; none when even a warp's do not.
  for (int64_t cols : {int64_t(128), int64_t(64), int64_t(32)})
    if (rowsN * cols * computeBytes <= kScatterSharedBytes) {
      ch.cols = std::min(cols, (inner + 31) / 32 * 32);
      break;
    }
  if (ch.cols == 0)
    return ch;
  ch.tiles = (inner + ch.cols - 1) / ch.cols;
  // A chunk of at least 2 x rows indices: its partials (rows x inner,
  // written once and read once) move no more than its updates do.
  int64_t chunk = std::max<int64_t>(
      {2 * rowsN, kScatterMinChunk, (m + kScatterMaxChunks - 1) / kScatterMaxChunks});
  ch.chunks = (m + chunk - 1) / chunk;
  ch.chunk = (m + ch.chunks - 1) / ch.chunks;
  ch.chunks = (m + ch.chunk - 1) / ch.chunk; // every chunk non-empty
  if (outer * ch.chunks * rowsN * inner > kScatterMaxPartials)
    ch.chunks = 1;
  return ch;
}

// Many indices over few rows (an embedding's gradient: 16384 token
// positions, 65 rows on the GPU config): two launches, no float atomics.
// 1. `scatter(chunks)`: a block per (outer, column tile, chunk of indices),
//    a thread per column. Each thread zeroes its column of a rows x cols
//    partial in shared memory (only it touches that column: no barrier),
//    walks its chunk's indices in order (the index load a broadcast, the
//    update load coalesced) adding each update to the partial of its row,
//    then writes its column of every row to the module-global scratch
//    [outer, chunks, rows, inner] in the compute type (fp32 for bf16/f16).
// 2. `scatter(chunk sums)`: a thread per output element adds its chunks'
//    partials in chunk order and stores once, rounded to the output type.
// Every sum has a fixed order (index order within a chunk, chunk order
// across), so the bits never depend on block scheduling; they differ from
// the CPU's single index-order sum by the regrouping only.
LogicalResult KernelEmitter::emitScatterChunks(ScatterAddOp op, const std::string &fname,
                                               int64_t outer, int64_t inner, int64_t rowsN,
                                               int64_t m, const ScatterChunking &ch,
                                               const TypeInfo &ti,
                                               std::vector<gpu::Launch> &launches) {
  std::string part = fmt::format("kiln_part_{}", fname);
  code_ += fmt::format("__device__ {} {}[{}];\n", ti.compute, part,
                       outer * ch.chunks * rowsN * inner);
  std::string rows = fresh("kiln_rows");
  line(fmt::format("__shared__ {} {}[{}][{}];", ti.compute, rows, rowsN, ch.cols));
  line(fmt::format("const int kiln_tile = blockIdx.x % {}, kiln_chunk = (blockIdx.x / {}) % {}, "
                   "o = blockIdx.x / {};",
                   ch.tiles, ch.tiles, ch.chunks, ch.tiles * ch.chunks));
  line(fmt::format("const int in = kiln_tile * {} + threadIdx.x;", ch.cols));
  line(fmt::format("if (in >= {}) return;", inner));
  line(fmt::format("for (int r = 0; r < {}; ++r) {}[r][threadIdx.x] = 0;", rowsN, rows));
  line(fmt::format("const int kiln_end = kiln_chunk < {} ? (kiln_chunk + 1) * {} : {};",
                   ch.chunks - 1, ch.chunk, m));
  line(fmt::format("for (int j = kiln_chunk * {}; j < kiln_end; ++j) {{", ch.chunk));
  push();
  scatterRow(op, rowsN);
  std::string u = scatterUpdate(op, m, inner);
  line(fmt::format("{}[r][threadIdx.x] += {};", rows, u));
  pop();
  line("}");
  line(fmt::format("{} *kiln_out = {} + ((o * {} + kiln_chunk) * {}) * {} + in;", ti.compute,
                   part, ch.chunks, rowsN, inner));
  line(fmt::format("for (int r = 0; r < {}; ++r) kiln_out[r * {}] = {}[r][threadIdx.x];", rowsN,
                   inner, rows));
  if (!error_.empty())
    return failure();
  finish(fname, "scatter(chunks)", outer * ch.tiles * ch.chunks, ch.cols, launches);
  // The chunk sums: a second function of the same kernel (same arguments).
  int64_t total = outer * rowsN * inner;
  std::string sname = fmt::format("{}_{}", name_, kernelCount_++);
  memo_.clear();
  memo_.emplace_back();
  line("const int c = blockIdx.x * blockDim.x + threadIdx.x;");
  line(fmt::format("if (c >= {}) return;", total));
  line(fmt::format("const int in = c % {}, row = (c / {}) % {}, o = c / {};", inner, inner, rowsN,
                   rowsN * inner));
  line(fmt::format("const {} *kiln_in = {} + (o * {} * {} + row) * {} + in;", ti.compute, part,
                   ch.chunks, rowsN, inner));
  std::string acc = fresh("acc");
  line(fmt::format("{} {} = 0;", ti.compute, acc));
  line(fmt::format("for (int kiln_c = 0; kiln_c < {}; ++kiln_c)", ch.chunks));
  line(fmt::format("  {} += kiln_in[kiln_c * {}];", acc, rowsN * inner));
  std::string slot = fmt::format("a{}[(o * {} + row) * {} + in]", outArg_[0], rowsN, inner);
  line(ti.isLow ? fmt::format("{} = kiln_from_float<{}>({});", slot, ti.storage, acc)
                : fmt::format("{} = {};", slot, acc));
  finish(sname, "scatter(chunk sums)", (total + 255) / 256, 256, launches);
  return success();
}

} // namespace kiln::cudagen
