//===- GemmBf16.h - A bf16 GEMM on AVX512-BF16 dot products ------*- C++ -*-===//
//
// bf16 x bf16 -> float32 GEMMs with the CPU's AVX512-BF16 instruction
// VDPBF16PS, which multiplies pairs of bf16 values exactly and adds both
// products to a float32 accumulator (one rounding per pair). The BLAS
// libraries available here do not use it on every CPU that has it (oneMKL's
// cblas_gemm_bf16bf16f32 ran at half of sgemm's speed on this project's AMD
// Zen 4 machines; docs/runtime.md "Half-precision GEMMs"), so Kiln packs and
// multiplies itself: panels of 2 x 32 values of op(B) and 8 x 2 of op(A),
// and a kernel keeping an 8 x 32 block of C in 16 registers.
//
// The result depends only on the shape (k is walked in pairs, in order, for
// every element), not on how a GEMM is split into parts or on the thread
// count. It is float32 accumulation like the other two methods
// (runtime/cpu/Gemm.h, HalfGemm), with a different order of additions.
// VDPBF16PS treats bf16 subnormal inputs as zero and flushes subnormal
// float32 results (below 2^-126 ≈ 1.2e-38) to zero.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CPU_GEMMBF16_H
#define KILN_RUNTIME_CPU_GEMMBF16_H

#include <cstddef>
#include <cstdint>

namespace kiln::cpu {

/// Whether this CPU (and the OS: AVX-512 state enabled) runs VDPBF16PS.
bool hasDpBf16();

/// C = op(A) op(B) for row-major bf16 operands (16-bit patterns) into
/// float32 C, the signature of Blas::GemmHalf (layout must be row-major,
/// alpha 1 and beta 0: what Kiln's parts call). op(A) is m x k: A[i*lda+p],
/// or A[p*lda+i] when transA is CblasTrans; op(B) is k x n likewise. Only
/// call it where hasDpBf16().
void gemmBf16DotProducts(int layout, int transA, int transB, int m, int n, int k, float alpha,
                         const uint16_t *a, int lda, const uint16_t *b, int ldb, float beta,
                         float *c, int ldc);

/// op(B) packed once for several calls (the parts of one GEMM share a
/// weight): panels of 32 columns, bf16PanelWords(k) words each.
int bf16Panels(int n);
size_t bf16PanelWords(int k);
/// Packs panels [p0, p1) of op(B) (k x n; B[r*ldb+j], or B[j*ldb+r] when
/// trans) into `out`, panel p at out + p * bf16PanelWords(k).
void packBf16Panels(bool trans, const uint16_t *b, int ldb, int k, int n, int p0, int p1,
                    uint32_t *out);
/// gemmBf16DotProducts()' product rounded to bf16 as it is stored (nearest
/// even, NaN quieted: the bits of rounding its float32 result), op(B) read
/// from `panels` when not null (all n columns, packed by packBf16Panels).
void gemmBf16ToBf16(bool transA, bool transB, int m, int n, int k, const uint16_t *a, int lda,
                    const uint16_t *b, int ldb, const uint32_t *panels, uint16_t *c, int ldc);

} // namespace kiln::cpu

#endif // KILN_RUNTIME_CPU_GEMMBF16_H
