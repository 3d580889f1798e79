//===- Matmul.cpp - Matmuls that are kernels, not library calls -------------===//
//
// Only f64 and integer matmuls reach a kernel (f32, f16 and bf16 are
// cuBLASLt steps): a plain thread-per-output dot product.
//
//===----------------------------------------------------------------------===//
#include "compiler/cuda/KernelEmitter.h"

#include "dialects/kiln/KilnOps.h"

#include <fmt/format.h>

using namespace mlir;

namespace kiln::cudagen {

LogicalResult KernelEmitter::emitMatmul(MatmulOp op, std::vector<gpu::Launch> &launches) {
  // Only f64 and integer matmuls reach a kernel (f32, f16 and bf16 are
  // cuBLASLt steps): a plain thread-per-output dot product.
  RankedTensorType lt = op.getLhs().getType(), rt = op.getRhs().getType(), ot = op.getType();
  int64_t r = ot.getRank(), m = ot.getDimSize(r - 2), n = ot.getDimSize(r - 1);
  int64_t kk = op.getTransposeLhs() ? lt.getDimSize(lt.getRank() - 2) : lt.getDimSize(lt.getRank() - 1);
  int64_t total = ot.getNumElements();
  std::string fname = fmt::format("{}_{}", name_, kernelCount_++);
  indent_ = 1;
  memo_.clear();
  memo_.emplace_back();
  line("const int e = blockIdx.x * blockDim.x + threadIdx.x;");
  line(fmt::format("if (e >= {}) return;", total));
  SmallVector<std::string> idx = delinear("e", ot.getShape());
  TypeInfo oti;
  typeInfo(ot.getElementType(), oti);
  line(fmt::format("{} acc = 0;", oti.compute == "double" ? "double" : oti.compute == "float" ? "float" : oti.compute));
  line(fmt::format("for (int t = 0; t < {}; ++t) {{", kk));
  push();
  auto operandIndex = [&](RankedTensorType tt, bool transpose, bool lhs) {
    SmallVector<std::string> oi;
    for (int64_t d = 0; d < tt.getRank() - 2; ++d)
      oi.push_back(idx[d]);
    std::string row = lhs ? idx[r - 2] : "t", col = lhs ? "t" : idx[r - 1];
    if (transpose)
      std::swap(row, col);
    oi.push_back(row);
    oi.push_back(col);
    return oi;
  };
  std::string a = emit(op.getLhs(), operandIndex(lt, op.getTransposeLhs(), true));
  std::string bb = emit(op.getRhs(), operandIndex(rt, op.getTransposeRhs(), false));
  line(fmt::format("acc += {} * {};", a, bb));
  pop();
  line("}");
  std::string target = fmt::format("a{}[e]", outArg_[0]);
  line(oti.isLow ? fmt::format("{} = kiln_from_float<{}>(acc);", target, oti.storage)
                 : fmt::format("{} = acc;", target));
  (void)m;
  (void)n;
  if (!error_.empty())
    return failure();
  finish(fname, "matmul", (total + 127) / 128, 128, launches);
  return success();
}

} // namespace kiln::cudagen
