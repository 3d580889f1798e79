//===- Scatter.cpp - The scatter_add kernel form ----------------------------===//
//
// scatter_add, deterministic and without atomics: a thread per output
// element reading every index when the rows are few (emitScatterByRow),
// else a thread per (outer, inner) column adding the index positions in
// order.
//
//===----------------------------------------------------------------------===//
#include "compiler/cuda/KernelEmitter.h"

#include "dialects/kiln/KilnOps.h"

#include <fmt/format.h>

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

} // namespace kiln::cudagen
