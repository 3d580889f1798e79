//===- Gemm.h - kiln.matmul on the CPU through BLAS -------------*- C++ -*-===//
//
// The CPU backend turns kiln.matmul into library calls rather than generated
// loops (runtime/cpu/Blas.h: MKL or OpenBLAS, single-threaded; Kiln's pool
// runs the parts of a GEMM). This wrapper implements the op's
// exact semantics (docs/dialect.md): optional transposes of either operand,
// batch dimensions on both sides or on one side only (a weight shared by the
// batch). Row-major, float32, accumulation as BLAS does it (float32 FMA).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CPU_GEMM_H
#define KILN_RUNTIME_CPU_GEMM_H

#include "runtime/core/Program.h"

#include <cstdint>
#include <functional>
#include <vector>

namespace kiln::cpu {

/// The shape of one kiln.matmul as the compiler's schedule records it.
using MatmulShape = program::GemmParams;

/// C[b] = op(A[b or 0]) * op(B[b or 0]) for every batch b; C is overwritten.
void matmul(const MatmulShape &s, const float *lhs, const float *rhs, float *out);

/// matmul() on f32, f16 or bf16 buffers (s.dtype): half-precision operands
/// are widened to float32 (exact), multiplied and accumulated in float32,
/// and the result is rounded to nearest even (the CUDA libraries' bf16 and
/// f16 GEMMs accumulate in float32 too). Whole buffers are converted, so
/// strided head layouts keep their offsets.
void matmulTyped(const MatmulShape &s, const void *lhs, const void *rhs, void *out);

/// How a bf16/f16 GEMM runs on the CPU. Both accumulate each dot product
/// in float32 and round the result once to the output type; they differ
/// only in the order of the float32 additions (the library's blocking), so
/// for the same inputs their results differ by at most
/// 2 * k * 2^-24 * sum_k |a||b| before the output rounding (one bf16 ulp,
/// 2^-8 relative, after it at worst).
enum class HalfGemm {
  Widen,       ///< operands widened to float32 (exact), then the f32 GEMM's sgemm
  Library,     ///< the BLAS library's own bf16/f16 GEMM (oneMKL's
               ///< cblas_gemm_bf16bf16f32 / cblas_gemm_f16f16f32) into float32
  DotProducts, ///< bf16 only: Kiln's own GEMM on the CPU's AVX512-BF16 dot
               ///< products (runtime/cpu/GemmBf16.h), into float32
};
const char *halfGemmName(HalfGemm m);
/// Whether the loaded BLAS library has a GEMM for `t` (BF16 or F16).
bool hasLibraryHalfGemm(program::DType t);
/// Whether HalfGemm::DotProducts runs for `t` here (BF16 on a CPU with
/// AVX512-BF16).
bool hasDotProductHalfGemm(program::DType t);

/// Runs `parts` jobs (job(0) .. job(parts - 1)), in any order, on any
/// threads: the executor's pool, or serialParts.
using RunParts = std::function<void(int64_t parts, const std::function<void(int64_t)> &job)>;
void serialParts(int64_t parts, const std::function<void(int64_t)> &job);

/// Float32 copies a half-precision GEMM works in (kept between calls).
struct HalfGemmScratch {
  std::vector<float> lhs, rhs, out;
  std::vector<uint32_t> packed; ///< DotProducts: op(B) packed once for every part
};

/// matmulTyped() for bf16/f16 (s.dtype) with `method` (Library and
/// DotProducts fall back to Widen where they do not exist), its conversions and GEMM
/// parts run through `run`: the same parts as the float32 GEMM
/// (gemmParts), conversions in fixed pieces, so the bits do not depend on
/// the number of threads behind `run`.
void matmulHalf(const MatmulShape &s, const void *lhs, const void *rhs, void *out,
                HalfGemm method, HalfGemmScratch &scratch, const RunParts &run);

/// Element counts of the buffers a GEMM reads and writes: lhs, rhs, out
/// (strided layouts: up to the last element any matrix touches).
void gemmExtents(const MatmulShape &s, int64_t &lhs, int64_t &rhs, int64_t &out);

/// Whether matmul() runs the batch as one GEMM of batch*m rows (a weight
/// shared by a batched, untransposed lhs).
bool foldsBatch(const MatmulShape &s);

/// Part `part` of `parts` of matmul(): whole batches when the batch is not
/// folded and has at least `parts` entries, otherwise blocks of output rows
/// (or of columns, for products of fewer than 128 rows such as weight
/// gradients [128, 768] x [768, 512]), each one BLAS call with the full K.
void matmulPart(const MatmulShape &s, const float *lhs, const float *rhs, float *out,
                int64_t part, int64_t parts);

/// How many parts the executor splits a GEMM into: a function of the shape
/// only, never of the thread count. Splitting by whole batches gives the
/// same bits as one call; splitting rows or columns may not (BLAS libraries
/// pick kernels by size), so the split is fixed per shape and results stay independent
/// of the number of threads that run the parts.
int64_t gemmParts(const MatmulShape &s);

} // namespace kiln::cpu

#endif // KILN_RUNTIME_CPU_GEMM_H
