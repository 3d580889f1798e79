//===- Gemm.cpp - kiln.matmul on the CPU through BLAS ---------------------===//
#include "runtime/cpu/Gemm.h"

#include "runtime/core/Half.h"
#include "runtime/cpu/Blas.h"

#include <algorithm>
#include <vector>

namespace kiln::cpu {

namespace {
/// Rows [r0, r1) and columns [c0, c1) of op(A) times op(B) into the same
/// block of C, for one product; lda/ldb/ldc are the stored row strides.
void block(const MatmulShape &s, const float *a, int64_t lda, const float *b, int64_t ldb,
           float *c, int64_t ldc, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  if (r1 <= r0 || c1 <= c0)
    return;
  // Row r of op(A): row r of A, or column r of a transposed A ([k, m]).
  const float *ar = s.transposeLhs ? a + r0 : a + r0 * lda;
  // Column j of op(B): column j of B ([k, n]), or row j of a transposed B.
  const float *bc = s.transposeRhs ? b + c0 * ldb : b + c0;
  sgemm()(kCblasRowMajor, s.transposeLhs ? kCblasTrans : kCblasNoTrans,
          s.transposeRhs ? kCblasTrans : kCblasNoTrans, int(r1 - r0), int(c1 - c0), int(s.k),
          1.0f, ar, int(lda), bc, int(ldb), 0.0f, c + r0 * ldc + c0, int(ldc));
}

/// Start of matrix `b` of an operand: dense, or per its strided layout.
int64_t start(const MatmulShape &s, const program::MatrixLayout &l, int64_t b,
              int64_t denseSize) {
  return s.heads ? (b / s.heads) * l.outer + (b % s.heads) * l.inner : b * denseSize;
}

constexpr int64_t kMinBlock = 64; ///< rows or columns per part, at least
constexpr int64_t kMaxParts = 4;

/// Rows of the one (folded) product a row split divides.
int64_t splitRows(const MatmulShape &s) { return foldsBatch(s) ? s.batch * s.m : s.m; }
/// Whether a split of a single product divides its columns: when it has
/// too few rows for two blocks (weight gradients, [128, k] x [k, 512]).
bool splitsColumns(const MatmulShape &s) { return splitRows(s) < 2 * kMinBlock; }
} // namespace

void matmulPart(const MatmulShape &s, const float *lhs, const float *rhs, float *out,
                int64_t part, int64_t parts) {
  auto share = [&](int64_t n, int64_t p) { return n * p / parts; };
  int64_t lda = s.heads ? s.lhsLayout.ld : (s.transposeLhs ? s.m : s.k);
  int64_t ldb = s.heads ? s.rhsLayout.ld : (s.transposeRhs ? s.k : s.n);
  int64_t ldc = s.heads ? s.outLayout.ld : s.n;
  // A weight shared by the whole batch with an untransposed, batched lhs is
  // one large GEMM: [batch*m, k] x [k, n].
  if (foldsBatch(s)) {
    int64_t total = s.batch * s.m;
    if (parts > 1 && splitsColumns(s))
      block(s, lhs, lda, rhs, ldb, out, ldc, 0, total, share(s.n, part), share(s.n, part + 1));
    else
      block(s, lhs, lda, rhs, ldb, out, ldc, share(total, part), share(total, part + 1), 0, s.n);
    return;
  }
  auto one = [&](int64_t b, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    block(s, lhs + (s.lhsBatched ? start(s, s.lhsLayout, b, s.m * s.k) : 0), lda,
          rhs + (s.rhsBatched ? start(s, s.rhsLayout, b, s.k * s.n) : 0), ldb,
          out + start(s, s.outLayout, b, s.m * s.n), ldc, r0, r1, c0, c1);
  };
  if (s.batch >= parts) { // parts take whole batches
    for (int64_t b = share(s.batch, part); b < share(s.batch, part + 1); ++b)
      one(b, 0, s.m, 0, s.n);
    return;
  }
  for (int64_t b = 0; b < s.batch; ++b) { // parts take blocks of rows or columns
    if (splitsColumns(s))
      one(b, 0, s.m, share(s.n, part), share(s.n, part + 1));
    else
      one(b, share(s.m, part), share(s.m, part + 1), 0, s.n);
  }
}

void matmul(const MatmulShape &s, const float *lhs, const float *rhs, float *out) {
  matmulPart(s, lhs, rhs, out, 0, 1);
}

void gemmExtents(const MatmulShape &s, int64_t &lhs, int64_t &rhs, int64_t &out) {
  auto extent = [&](const program::MatrixLayout &l, int64_t rows, int64_t cols, int64_t dense) {
    if (!s.heads)
      return dense;
    return (s.batch / s.heads - 1) * l.outer + (s.heads - 1) * l.inner + (rows - 1) * l.ld + cols;
  };
  lhs = extent(s.lhsLayout, s.transposeLhs ? s.k : s.m, s.transposeLhs ? s.m : s.k,
               (s.lhsBatched ? s.batch : 1) * s.m * s.k);
  rhs = extent(s.rhsLayout, s.transposeRhs ? s.n : s.k, s.transposeRhs ? s.k : s.n,
               (s.rhsBatched ? s.batch : 1) * s.k * s.n);
  out = extent(s.outLayout, s.m, s.n, s.batch * s.m * s.n);
}

void matmulTyped(const MatmulShape &s, const void *lhs, const void *rhs, void *out) {
  if (s.dtype == program::DType::F32) {
    matmul(s, static_cast<const float *>(lhs), static_cast<const float *>(rhs),
           static_cast<float *>(out));
    return;
  }
  int64_t nl, nr, no;
  gemmExtents(s, nl, nr, no);
  thread_local std::vector<float> a, b, c;
  a.resize(size_t(nl));
  b.resize(size_t(nr));
  c.assign(size_t(no), 0.0f);
  auto in = [&](const void *src, std::vector<float> &dst) {
    const uint16_t *h = static_cast<const uint16_t *>(src);
    for (size_t i = 0; i < dst.size(); ++i)
      dst[i] = halfToFloat(s.dtype, h[i]);
  };
  in(lhs, a);
  in(rhs, b);
  // Strided outputs keep the elements between matrices: start from them.
  if (s.heads)
    in(out, c);
  matmul(s, a.data(), b.data(), c.data());
  uint16_t *o = static_cast<uint16_t *>(out);
  for (size_t i = 0; i < c.size(); ++i)
    o[i] = floatToHalf(s.dtype, c[i]);
}

bool foldsBatch(const MatmulShape &s) {
  return s.lhsBatched && !s.rhsBatched && !s.transposeLhs && s.heads == 0;
}

int64_t gemmParts(const MatmulShape &s) {
  if (s.batch * s.m * s.n * s.k < (int64_t(1) << 18))
    return 1;
  if (!foldsBatch(s) && s.batch >= 2)
    return std::min<int64_t>(s.batch, 64); // whole batches: any count
  // A power of two (balanced on 2 or 4 threads), at most kMaxParts, with at
  // least kMinBlock rows (or columns, for products of few rows) per part.
  int64_t extent = splitsColumns(s) ? s.n : splitRows(s), parts = 1;
  while (parts < kMaxParts && extent / (parts * 2) >= kMinBlock)
    parts *= 2;
  return parts;
}

} // namespace kiln::cpu
