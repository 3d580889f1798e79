//===- GemmBf16.cpp - A bf16 GEMM on AVX512-BF16 dot products -------------===//
#include "runtime/cpu/GemmBf16.h"

#include "runtime/cpu/Blas.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

// GCC 12's AVX-512 headers warn that the masked forms' undefined pass-
// through operand "may be used uninitialized" (GCC bug 105593): harmless.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace kiln::cpu {

namespace {

constexpr int kMR = 8;  ///< rows of C per kernel call
constexpr int kNR = 32; ///< columns of C per kernel call (two registers of 16)

/// The XCR0 bits of the SSE, AVX and AVX-512 register state.
constexpr uint64_t kAvx512State = 0xe6;

bool detect() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE))
    return false;
  uint32_t lo, hi;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if (((uint64_t(hi) << 32 | lo) & kAvx512State) != kAvx512State)
    return false;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(b & bit_AVX512F))
    return false;
  if (!__get_cpuid_count(7, 1, &a, &b, &c, &d))
    return false;
  return (a & (1u << 5)) != 0; // AVX512_BF16
}

/// Two bf16 values as the 32-bit lane VDPBF16PS reads: lo in the low half.
inline uint32_t pair(uint16_t lo, uint16_t hi) { return uint32_t(lo) | uint32_t(hi) << 16; }

/// op(B)'s columns [j0, j0 + 32) as kp pairs x 32 lanes (zero beyond n and
/// k): lane j of pair p holds (op(B)[2p][j], op(B)[2p+1][j]).
void packB(bool trans, const uint16_t *b, int ldb, int k, int n, int j0, uint32_t *out) {
  int kp = (k + 1) / 2, cols = std::min(kNR, n - j0);
  for (int p = 0; p < kp; ++p) {
    uint32_t *row = out + size_t(p) * kNR;
    bool odd = 2 * p + 1 >= k;
    if (!trans) { // op(B)[r][j] = b[r * ldb + j]: two rows interleave
      const uint16_t *r0 = b + size_t(2 * p) * size_t(ldb) + j0;
      const uint16_t *r1 = odd ? nullptr : r0 + ldb;
      for (int j = 0; j < cols; ++j)
        row[j] = pair(r0[j], odd ? uint16_t(0) : r1[j]);
    } else { // op(B)[r][j] = b[j * ldb + r]: a pair is adjacent
      for (int j = 0; j < cols; ++j) {
        const uint16_t *col = b + size_t(j0 + j) * size_t(ldb) + 2 * p;
        row[j] = pair(col[0], odd ? uint16_t(0) : col[1]);
      }
    }
    for (int j = cols; j < kNR; ++j)
      row[j] = 0;
  }
}

/// op(A)'s rows [i0, i0 + 8) as kp pairs x 8 lanes (zero beyond m and k).
void packA(bool trans, const uint16_t *a, int lda, int k, int m, int i0, uint32_t *out) {
  int kp = (k + 1) / 2, rows = std::min(kMR, m - i0);
  for (int p = 0; p < kp; ++p) {
    uint32_t *lane = out + size_t(p) * kMR;
    bool odd = 2 * p + 1 >= k;
    for (int r = 0; r < rows; ++r) {
      uint16_t lo, hi;
      if (!trans) { // op(A)[i][q] = a[i * lda + q]
        const uint16_t *x = a + size_t(i0 + r) * size_t(lda) + 2 * p;
        lo = x[0];
        hi = odd ? uint16_t(0) : x[1];
      } else { // op(A)[i][q] = a[q * lda + i]
        const uint16_t *x = a + size_t(2 * p) * size_t(lda) + i0 + r;
        lo = x[0];
        hi = odd ? uint16_t(0) : x[lda];
      }
      lane[r] = pair(lo, hi);
    }
    for (int r = rows; r < kMR; ++r)
      lane[r] = 0;
  }
}

#define KILN_DPBF16_TARGET __attribute__((target("avx512f,avx512bf16,avx512bw,avx512vl")))

/// The 16 bf16 values nearest (ties to even) to 16 floats: the bits of
/// runtime/core/Half.h's floatToHalf and Gemm.cpp's narrow(), NaN quieted.
KILN_DPBF16_TARGET inline __m256i roundToBf16(__m512 x) {
  __m512i u = _mm512_castps_si512(x);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                          _mm512_set1_epi32(0x7f800000));
  __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(r, nan, quiet));
}

KILN_DPBF16_TARGET inline void store(float *c, __mmask16 m, __m512 x) {
  _mm512_mask_storeu_ps(c, m, x);
}
KILN_DPBF16_TARGET inline void store(uint16_t *c, __mmask16 m, __m512 x) {
  _mm256_mask_storeu_epi16(c, m, roundToBf16(x));
}

/// C[0..rows) x [0..cols) = the packed 8-row panel of A times the packed
/// 32-column panel of B over kp pairs: float32, or rounded to bf16.
template <typename Out>
KILN_DPBF16_TARGET void kernel(int kp, const uint32_t *ap, const uint32_t *bp, Out *c, int ldc,
                               int rows, int cols) {
  __m512 acc[kMR][2];
  for (int r = 0; r < kMR; ++r)
    acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int p = 0; p < kp; ++p) {
    __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + size_t(p) * kNR);
    __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + size_t(p) * kNR + 16);
    const uint32_t *x = ap + size_t(p) * kMR;
#pragma GCC unroll 8
    for (int r = 0; r < kMR; ++r) {
      __m512bh av = (__m512bh)_mm512_set1_epi32(int(x[r]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
    }
  }
  __mmask16 m0 = cols >= 16 ? __mmask16(0xffff) : __mmask16((1u << cols) - 1);
  __mmask16 m1 = cols >= 32 ? __mmask16(0xffff)
                 : cols > 16 ? __mmask16((1u << (cols - 16)) - 1)
                             : __mmask16(0);
  for (int r = 0; r < rows; ++r) {
    store(c + size_t(r) * size_t(ldc), m0, acc[r][0]);
    store(c + size_t(r) * size_t(ldc) + 16, m1, acc[r][1]);
  }
}

/// C = op(A) op(B), op(B) packed here one panel at a time, or read from
/// `panels` (all of it, packed by packBf16Panels).
template <typename Out>
void drive(bool ta, bool tb, int m, int n, int k, const uint16_t *a, int lda, const uint16_t *b,
           int ldb, const uint32_t *panels, Out *c, int ldc) {
  if (m <= 0 || n <= 0)
    return;
  if (k <= 0) {
    for (int i = 0; i < m; ++i)
      std::fill_n(c + size_t(i) * size_t(ldc), n, Out(0));
    return;
  }
  int kp = (k + 1) / 2;
  int panelsA = (m + kMR - 1) / kMR, panelsB = (n + kNR - 1) / kNR;
  thread_local std::vector<uint32_t> pa, pb;
  pa.resize(size_t(panelsA) * size_t(kp) * kMR);
  if (!panels)
    pb.resize(size_t(kp) * kNR);
  for (int i = 0; i < panelsA; ++i)
    packA(ta, a, lda, k, m, i * kMR, pa.data() + size_t(i) * size_t(kp) * kMR);
  // One panel of B at a time, kept in cache while every panel of A passes.
  for (int j = 0; j < panelsB; ++j) {
    const uint32_t *bp = panels ? panels + size_t(j) * size_t(kp) * kNR : pb.data();
    if (!panels)
      packB(tb, b, ldb, k, n, j * kNR, pb.data());
    int cols = std::min(kNR, n - j * kNR);
    for (int i = 0; i < panelsA; ++i)
      kernel(kp, pa.data() + size_t(i) * size_t(kp) * kMR, bp,
             c + size_t(i) * kMR * size_t(ldc) + size_t(j) * kNR, ldc, std::min(kMR, m - i * kMR),
             cols);
  }
}

} // namespace

bool hasDpBf16() {
  static const bool yes = detect();
  return yes;
}

int bf16Panels(int n) { return (n + kNR - 1) / kNR; }
size_t bf16PanelWords(int k) { return size_t((k + 1) / 2) * kNR; }

void packBf16Panels(bool trans, const uint16_t *b, int ldb, int k, int n, int p0, int p1,
                    uint32_t *out) {
  for (int p = p0; p < p1; ++p)
    packB(trans, b, ldb, k, n, p * kNR, out + size_t(p) * bf16PanelWords(k));
}

void gemmBf16ToBf16(bool transA, bool transB, int m, int n, int k, const uint16_t *a, int lda,
                    const uint16_t *b, int ldb, const uint32_t *panels, uint16_t *c, int ldc) {
  drive(transA, transB, m, n, k, a, lda, b, ldb, panels, c, ldc);
}

void gemmBf16DotProducts(int layout, int transA, int transB, int m, int n, int k, float alpha,
                         const uint16_t *a, int lda, const uint16_t *b, int ldb, float beta,
                         float *c, int ldc) {
  (void)layout; // row-major (the only layout Kiln's parts use)
  (void)alpha;  // 1
  (void)beta;   // 0
  drive(transA == kCblasTrans, transB == kCblasTrans, m, n, k, a, lda, b, ldb, nullptr, c, ldc);
}

} // namespace kiln::cpu
