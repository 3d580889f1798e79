//===- GemmPlan.h - The library calls of one GEMM step ----------*- C++ -*-===//
//
// How a GEMM step (program::GemmParams, kiln.matmul's row-major semantics)
// becomes column-major, strided-batched BLAS calls: cuBLASLt on the GPU
// (runtime/cuda/Blas.cpp), the CUDA emulator's host model of it
// (runtime/cuda/EmulatedDevice.cpp), and `kilnc --emit=counters`, which
// counts the calls (runtime/core/Counters.cpp). Pure arithmetic on the
// shape, no CUDA: one plan for all three, tested on the CPU.
//
// Row-major through column-major: a row-major [r, c] matrix with row stride
// ld is a column-major [c, r] matrix with leading dimension ld, so
// C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T: the library's "A" is
// Kiln's rhs, its "B" is Kiln's lhs, the transposes carry over unchanged.
//
// Dense batches are one strided-batched call (stride 0 for a shared
// operand); a shared weight with a batched, untransposed lhs is one GEMM of
// batch*m rows (foldsBatch, as on the CPU).
//
// Head layouts (heads = H != 0, batch = B * H): matrix b = o * H + h sits at
// o * outer + h * inner (program::MatrixLayout). Attention's folded
// [0, 2, 1, 3] transposes make a [B, T, H, D] tensor a head-layout operand
// with outer = T*H*D, inner = D, ld = H*D; a dense [B, H, R, C] operand has
// outer = H*R*C, inner = R*C, ld = C. A library call has one batch stride
// per operand, so:
//   * one call of B*H matrices when every batched operand's matrices are one
//     stride apart: outer == H * inner (dense layouts), H == 1 (stride
//     outer) or B == 1 (stride inner);
//   * otherwise (a [B, T, H, D] operand: its heads are D apart, its batch
//     entries T*H*D) one call per head, H calls of B matrices: call h
//     starts at h * inner and steps by `outer`;
//   * or, where there are fewer batch entries than heads, one call per
//     batch entry, B calls of H matrices: call o starts at o * outer and
//     steps by `inner`.
// So a head GEMM never takes more than min(B, H) calls. GemmPlanForm::Legacy
// keeps the plan before that (B calls of H matrices whenever a layout is not
// uniform; 64 calls for the GPU config's fp32 attention GEMMs instead of 6)
// for timing the two against each other (KILN_GEMM_PLAN=legacy).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CORE_GEMMPLAN_H
#define KILN_RUNTIME_CORE_GEMMPLAN_H

#include "runtime/core/Program.h"
#include "runtime/core/Status.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::gpu {

/// Which plan head layouts get (see the file comment).
enum class GemmPlanForm {
  Heads,  ///< the default: one call, else min(heads, batch entries) calls
  Legacy, ///< batch/heads calls of `heads` matrices unless uniform
};
/// "heads" or "legacy": the values of KILN_GEMM_PLAN.
const char *gemmPlanFormName(GemmPlanForm f);
/// Parses a KILN_GEMM_PLAN value; null or empty is the default (Heads).
Expected<GemmPlanForm> parseGemmPlanForm(const char *value);
/// parseGemmPlanForm(getenv("KILN_GEMM_PLAN")): what the CUDA devices and
/// `kilnc --emit=counters` use.
Expected<GemmPlanForm> gemmPlanFormFromEnv();
/// KILN_CUDA_TF32=1: every f32 GEMM on TF32 tensor cores, whatever the
/// artifact's precision (PyTorch's allow_tf32 as a run-time switch, so a
/// GPU run can time one fp32 artifact both ways); 0 or unset: as the plan
/// says (GemmParams::tf32). Any other value is an error naming the variable.
Expected<bool> allTf32FromEnv();

/// One shape of library call, in column-major terms, repeated `calls()`
/// times at the given element offsets: D (m x n) = op(A) (m x k) *
/// op(B) (k x n) for `batch` matrices per call, matrix i of call c at
/// offset[c] + i * stride. A is Kiln's rhs, B Kiln's lhs, D Kiln's output.
struct LtGemm {
  bool transA = false, transB = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t batch = 1;                             ///< matrices per call
  int64_t strideA = 0, strideB = 0, strideC = 0; ///< elements; 0: shared
  /// Per call: where matrix 0 of the call starts, in elements.
  std::vector<int64_t> offsetA, offsetB, offsetC;
  int64_t calls() const { return int64_t(offsetC.size()); }
  /// Stored shape of A, B, C as column-major rows x cols.
  int64_t rowsA() const { return transA ? k : m; }
  int64_t colsA() const { return transA ? m : k; }
  int64_t rowsB() const { return transB ? n : k; }
  int64_t colsB() const { return transB ? k : n; }
};

/// The calls that compute `shape` (see the file comment); an internal error
/// for shapes the compiler should never produce (non-positive sizes, a batch
/// not divisible by heads, leading dimensions smaller than the rows).
Expected<LtGemm> planGemm(const program::GemmParams &shape,
                          GemmPlanForm form = GemmPlanForm::Heads);

/// Whether the batch runs as one GEMM of batch*m rows: a weight shared by a
/// batched, untransposed lhs (the same rule as cpu::foldsBatch).
bool foldsBatch(const program::GemmParams &shape);

/// "64 x [256x64] x 64 x [256x64]^T (heads 6)": a shape for messages.
std::string gemmShapeText(const program::GemmParams &shape);

} // namespace kiln::gpu

#endif // KILN_RUNTIME_CORE_GEMMPLAN_H
