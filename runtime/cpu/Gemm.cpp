//===- Gemm.cpp - kiln.matmul on the CPU through BLAS ---------------------===//
#include "runtime/cpu/Gemm.h"

#include "runtime/core/Half.h"
#include "runtime/cpu/Blas.h"
#include "runtime/cpu/GemmBf16.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace kiln::cpu {

namespace {
/// Rows [r0, r1) and columns [c0, c1) of op(A) times op(B) into the same
/// block of C, for one product; lda/ldb/ldc are the stored row strides.
/// `call` is a row-major CBLAS GEMM on T operands with a float32 C.
template <typename T, typename Call>
void block(const MatmulShape &s, Call call, const T *a, int64_t lda, const T *b, int64_t ldb,
           float *c, int64_t ldc, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  if (r1 <= r0 || c1 <= c0)
    return;
  // Row r of op(A): row r of A, or column r of a transposed A ([k, m]).
  const T *ar = s.transposeLhs ? a + r0 : a + r0 * lda;
  // Column j of op(B): column j of B ([k, n]), or row j of a transposed B.
  const T *bc = s.transposeRhs ? b + c0 * ldb : b + c0;
  call(kCblasRowMajor, s.transposeLhs ? kCblasTrans : kCblasNoTrans,
       s.transposeRhs ? kCblasTrans : kCblasNoTrans, int(r1 - r0), int(c1 - c0), int(s.k), 1.0f,
       ar, int(lda), bc, int(ldb), 0.0f, c + r0 * ldc + c0, int(ldc));
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

template <typename T, typename Call>
void part(const MatmulShape &s, Call call, const T *lhs, const T *rhs, float *out, int64_t part,
          int64_t parts) {
  auto share = [&](int64_t n, int64_t p) { return n * p / parts; };
  int64_t lda = s.heads ? s.lhsLayout.ld : (s.transposeLhs ? s.m : s.k);
  int64_t ldb = s.heads ? s.rhsLayout.ld : (s.transposeRhs ? s.k : s.n);
  int64_t ldc = s.heads ? s.outLayout.ld : s.n;
  // A weight shared by the whole batch with an untransposed, batched lhs is
  // one large GEMM: [batch*m, k] x [k, n].
  if (foldsBatch(s)) {
    int64_t total = s.batch * s.m;
    if (parts > 1 && splitsColumns(s))
      block(s, call, lhs, lda, rhs, ldb, out, ldc, 0, total, share(s.n, part), share(s.n, part + 1));
    else
      block(s, call, lhs, lda, rhs, ldb, out, ldc, share(total, part), share(total, part + 1), 0, s.n);
    return;
  }
  auto one = [&](int64_t b, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    block(s, call, lhs + (s.lhsBatched ? start(s, s.lhsLayout, b, s.m * s.k) : 0), lda,
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
} // namespace

void matmulPart(const MatmulShape &s, const float *lhs, const float *rhs, float *out,
                int64_t p, int64_t parts) {
  part(s, sgemm(), lhs, rhs, out, p, parts);
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
  thread_local HalfGemmScratch scratch;
  matmulHalf(s, lhs, rhs, out, HalfGemm::Widen, scratch, serialParts);
}

void serialParts(int64_t parts, const std::function<void(int64_t)> &job) {
  for (int64_t p = 0; p < parts; ++p)
    job(p);
}

const char *halfGemmName(HalfGemm m) {
  return m == HalfGemm::Library ? "library" : m == HalfGemm::DotProducts ? "dpbf16" : "widen";
}

bool hasDotProductHalfGemm(program::DType t) {
  return t == program::DType::BF16 && hasDpBf16();
}

bool hasLibraryHalfGemm(program::DType t) {
  auto b = blas();
  if (!b)
    return false;
  return t == program::DType::BF16 ? (*b)->gemmBf16 != nullptr
                                   : t == program::DType::F16 && (*b)->gemmF16 != nullptr;
}

namespace {
/// Conversions run as this many fixed pieces (of whole elements: the bits
/// never depend on how many threads run them).
constexpr int64_t kConvertPieces = 8;
constexpr int64_t kMinConvert = 1 << 15; ///< elements; fewer: one piece
int64_t convertPieces(int64_t n) { return n < kMinConvert ? 1 : kConvertPieces; }
template <typename F> void pieces(int64_t n, const RunParts &run, F f) {
  int64_t p = convertPieces(n);
  run(p, [&](int64_t i) { f(n * i / p, n * (i + 1) / p); });
}

/// Widens [b, e) of `h` into `f` (bf16: a shift, in a loop the compiler
/// vectorizes; f16 through halfToFloat).
void widen(program::DType t, const uint16_t *h, float *f, int64_t b, int64_t e) {
  if (t == program::DType::BF16) {
    for (int64_t i = b; i < e; ++i) {
      uint32_t u = uint32_t(h[i]) << 16;
      std::memcpy(&f[i], &u, 4);
    }
    return;
  }
  for (int64_t i = b; i < e; ++i)
    f[i] = halfToFloat(t, h[i]);
}

/// Rounds [b, e) of `f` into `h` (nearest even; the same bits as
/// floatToHalf).
void narrow(program::DType t, const float *f, uint16_t *h, int64_t b, int64_t e) {
  if (t == program::DType::BF16) {
    for (int64_t i = b; i < e; ++i) {
      uint32_t u;
      std::memcpy(&u, &f[i], 4);
      uint16_t r = uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
      h[i] = (u & 0x7fffffffu) > 0x7f800000u ? uint16_t((u >> 16) | 0x40u) : r;
    }
    return;
  }
  for (int64_t i = b; i < e; ++i)
    h[i] = floatToHalf(t, f[i]);
}
} // namespace

void matmulHalf(const MatmulShape &s, const void *lhs, const void *rhs, void *out,
                HalfGemm method, HalfGemmScratch &scratch, const RunParts &run) {
  program::DType t = s.dtype;
  int64_t nl, nr, no;
  gemmExtents(s, nl, nr, no);
  const uint16_t *hl = static_cast<const uint16_t *>(lhs), *hr = static_cast<const uint16_t *>(rhs);
  uint16_t *ho = static_cast<uint16_t *>(out);
  std::vector<float> &c = scratch.out;
  c.resize(size_t(no));
  // Strided outputs keep the elements between matrices: start from them
  // (widened exactly, rounded back to the same bits).
  if (s.heads)
    pieces(no, run, [&](int64_t b, int64_t e) { widen(t, ho, c.data(), b, e); });
  int64_t parts = gemmParts(s);
  Blas::GemmHalf lib = nullptr;
  if (method == HalfGemm::Library) {
    auto b = blas();
    if (b)
      lib = t == program::DType::BF16 ? (*b)->gemmBf16 : (*b)->gemmF16;
  } else if (method == HalfGemm::DotProducts && hasDotProductHalfGemm(t)) {
    lib = gemmBf16DotProducts;
  }
  if (lib == gemmBf16DotProducts && s.heads == 0) {
    // Dense output: each part rounds its block to bf16 as it stores it (the
    // same bits as rounding the float32 block afterwards), so the float32
    // scratch only names positions: the block at c + x is ho + x.
    // One op(B) for every part (a single product, or a weight shared by a
    // folded batch) is packed once, in pieces on the pool, for the parts
    // whose call covers all of it (row splits); column splits and batched
    // operands pack their own.
    int kk = int(s.k), nn = int(s.n), ldb = int(s.transposeRhs ? s.k : s.n);
    const uint32_t *shared = nullptr;
    if (!s.rhsBatched) {
      int panels = bf16Panels(nn);
      std::vector<uint32_t> &packed = scratch.packed;
      packed.resize(size_t(panels) * bf16PanelWords(kk));
      int pieces = std::min(panels, 8);
      run(pieces, [&](int64_t i) {
        packBf16Panels(s.transposeRhs, hr, ldb, kk, nn, int(panels * i / pieces),
                       int(panels * (i + 1) / pieces), packed.data());
      });
      shared = packed.data();
    }
    const float *base = c.data();
    auto call = [&](int, int ta, int tb, int m, int n, int k, float, const uint16_t *a, int lda,
                    const uint16_t *b, int ldbCall, float, float *cc, int ldc) {
      bool whole = shared && b == hr && n == nn && k == kk && ldbCall == ldb;
      gemmBf16ToBf16(ta == kCblasTrans, tb == kCblasTrans, m, n, k, a, lda, b, ldbCall,
                     whole ? shared : nullptr, ho + (cc - base), ldc);
    };
    run(parts, [&](int64_t p) { part(s, call, hl, hr, c.data(), p, parts); });
    return;
  }
  if (lib) {
    run(parts, [&](int64_t p) { part(s, lib, hl, hr, c.data(), p, parts); });
  } else {
    std::vector<float> &a = scratch.lhs, &b = scratch.rhs;
    a.resize(size_t(nl));
    b.resize(size_t(nr));
    pieces(nl, run, [&](int64_t x, int64_t e) { widen(t, hl, a.data(), x, e); });
    pieces(nr, run, [&](int64_t x, int64_t e) { widen(t, hr, b.data(), x, e); });
    Blas::Sgemm f = sgemm();
    run(parts, [&](int64_t p) { part(s, f, a.data(), b.data(), c.data(), p, parts); });
  }
  pieces(no, run, [&](int64_t x, int64_t e) { narrow(t, c.data(), ho, x, e); });
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
