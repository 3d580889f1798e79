//===- Attention.cpp - Fused attention on the CPU -------------------------===//
#include "runtime/cpu/Attention.h"

#include "runtime/core/Half.h"
#include "runtime/core/Random.h"
#include "runtime/cpu/Blas.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace kiln::cpu {

namespace {

using program::AttentionParams;
using program::DType;

constexpr int64_t kKeyBlock = 128;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

/// One of the step's [B, heads, len, width] tensors, stored head-major
/// ([B, H, N, D]) or sequence-major ([B, N, H, D]: a folded transpose).
struct View {
  void *base;
  DType type;
  int64_t heads, len, width;
  bool seqMajor;

  int64_t offset(int64_t b, int64_t h, int64_t n) const {
    return seqMajor ? ((b * len + n) * heads + h) * width : ((b * heads + h) * len + n) * width;
  }
  int64_t rowStride() const { return seqMajor ? heads * width : width; }
};

/// Rows of float32 with leading dimension ld.
struct Rows {
  const float *p;
  int64_t ld;
};

/// Rows [n0, n0 + count) of (b, h) as float32: the buffer itself for f32,
/// else widened into `tmp` (packed).
Rows widen(const View &v, int64_t b, int64_t h, int64_t n0, int64_t count,
           std::vector<float> &tmp) {
  int64_t off = v.offset(b, h, n0), stride = v.rowStride();
  if (v.type == DType::F32)
    return {static_cast<const float *>(v.base) + off, stride};
  tmp.resize(size_t(count * v.width));
  const uint16_t *src = static_cast<const uint16_t *>(v.base) + off;
  for (int64_t r = 0; r < count; ++r)
    for (int64_t c = 0; c < v.width; ++c)
      tmp[size_t(r * v.width + c)] = halfToFloat(v.type, src[r * stride + c]);
  return {tmp.data(), v.width};
}

/// Stores `count` packed rows of `from` as rows [n0, n0 + count) of (b, h).
void narrow(const float *from, const View &v, int64_t b, int64_t h, int64_t n0, int64_t count) {
  int64_t off = v.offset(b, h, n0), stride = v.rowStride();
  for (int64_t r = 0; r < count; ++r) {
    const float *row = from + r * v.width;
    if (v.type == DType::F32) {
      std::memcpy(static_cast<float *>(v.base) + off + r * stride, row,
                  size_t(v.width) * sizeof(float));
      continue;
    }
    uint16_t *dst = static_cast<uint16_t *>(v.base) + off + r * stride;
    for (int64_t c = 0; c < v.width; ++c)
      dst[c] = floatToHalf(v.type, row[c]);
  }
}

/// Widens `n` elements of a dense float buffer (the additive mask).
const float *widenDense(const void *base, DType t, int64_t offset, int64_t n,
                        std::vector<float> &tmp) {
  if (t == DType::F32)
    return static_cast<const float *>(base) + offset;
  tmp.resize(size_t(n));
  const uint16_t *h = static_cast<const uint16_t *>(base) + offset;
  for (int64_t i = 0; i < n; ++i)
    tmp[size_t(i)] = halfToFloat(t, h[i]);
  return tmp.data();
}

void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
          int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  static const Blas::Sgemm f = sgemm();
  f(kCblasRowMajor, ta ? kCblasTrans : kCblasNoTrans, tb ? kCblasTrans : kCblasNoTrans, int(m),
    int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

/// e^x in float32, written for the vectorizer: x = n ln2 + r with |r| <=
/// ln2 / 2 (ln2 in two parts, Cody and Waite), e^r by its degree-6 Taylor
/// polynomial (relative error below 2e-7, about 1.5 ulp), 2^n through the
/// exponent bits. Below -87.3 (e^x under FLT_MIN; -inf, a dropped key) it
/// is 0; NaN stays NaN. Scores minus their row maximum are never above 0.
inline float fastExp(float x) {
  const float log2e = 1.44269504f, ln2hi = 0.693359375f, ln2lo = -2.12194440e-4f;
  float xc = std::min(std::max(x, -87.3f), 88.3f);
  float n = std::floor(xc * log2e + 0.5f);
  float r = xc - n * ln2hi - n * ln2lo;
  float p = 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  int32_t bits = (int32_t(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  float y = p * scale;
  return x != x ? x : x < -87.3f ? 0.0f : y;
}

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define KILN_ATTENTION_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define KILN_ATTENTION_CLONES
#endif

/// r[j] = e^(r[j] - m) for a row of n scores; returns their sum (in order).
KILN_ATTENTION_CLONES float expRow(float *r, int64_t n, float m) {
  for (int64_t j = 0; j < n; ++j)
    r[j] = fastExp(r[j] - m);
  float l = 0;
  for (int64_t j = 0; j < n; ++j)
    l += r[j];
  return l;
}

/// The backward's row: p = e^(s - lse), ds = p (dp - delta), p kept in s
/// (dropout: the keep factors, 0 or 1 / (1 - rate), in `keep`, or null).
KILN_ATTENTION_CLONES void gradRow(float *s, float *dp, int64_t n, float lse, float delta,
                                   const float *keep) {
  for (int64_t j = 0; j < n; ++j) {
    float p = fastExp(s[j] - lse);
    float k = keep ? keep[j] : 1.0f;
    dp[j] = p * (dp[j] * k - delta);
    s[j] = p * k;
  }
}

/// The scores' rules shared by both passes: causal, the mask, for rows
/// [q0, q0 + bq) x keys [j0, j0 + bk) of (b, h), in place on `s` (row
/// stride bk).
void maskScores(const AttentionParams &a, const void *mask, int64_t b, int64_t h, int64_t q0,
                int64_t bq, int64_t j0, int64_t bk, float *s) {
  int64_t T = a.queries, S = a.keys;
  if (a.causal && j0 + bk - 1 > q0) // the block reaches above the diagonal
    for (int64_t i = 0; i < bq; ++i)
      for (int64_t j = std::max<int64_t>(0, q0 + i + 1 - j0); j < bk; ++j)
        s[i * bk + j] = kNegInf;
  if (a.mask == AttentionParams::Mask::None)
    return;
  int64_t mb = a.maskBatch == 1 ? 0 : b, mh = a.maskHeads == 1 ? 0 : h;
  int64_t base = ((mb * a.maskHeads + mh) * T + q0) * S + j0;
  if (a.mask == AttentionParams::Mask::Keep) {
    const uint8_t *m = static_cast<const uint8_t *>(mask) + base;
    for (int64_t i = 0; i < bq; ++i)
      for (int64_t j = 0; j < bk; ++j)
        if (!m[i * S + j])
          s[i * bk + j] = kNegInf;
    return;
  }
  std::vector<float> tmp;
  for (int64_t i = 0; i < bq; ++i) {
    const float *m = widenDense(mask, a.dtype, base + i * S, bk, tmp);
    for (int64_t j = 0; j < bk; ++j)
      s[i * bk + j] += m[j];
  }
}

/// Dropout's factor of probability (b, h, i, j): 0 or 1 / (1 - rate), as
/// kiln.dropout of a [B, H, T, S] tensor with the step's salt.
inline float keepFactor(const AttentionParams &a, uint64_t seed, int64_t b, int64_t h, int64_t i,
                        int64_t j, float scale) {
  uint64_t idx = uint64_t(((b * a.heads + h) * a.queries + i) * a.keys + j);
  return random::uniform(seed, a.salt, idx) >= a.dropout ? scale : 0.0f;
}

Status checkTypes(const AttentionParams &a) {
  if (a.dtype != DType::F32 && a.dtype != DType::BF16 && a.dtype != DType::F16)
    return Status::error(fmt::format("the CPU has no {} attention kernel (f32, bf16, f16)",
                                     program::dtypeName(a.dtype)));
  if (a.lseType != DType::F32)
    return Status::error("the CPU's attention kernel keeps the log-sum-exp in f32");
  return Status::ok();
}

View view(const AttentionParams &a, void *base, uint32_t bit, bool kv, bool value) {
  return {base, a.dtype, kv ? a.kvHeads : a.heads, kv ? a.keys : a.queries,
          value ? a.valueSize : a.headSize, (a.seqMajor & bit) != 0};
}

} // namespace

Status attentionForward(const AttentionParams &a, const std::vector<void *> &args,
                        uint64_t seed, const RunParts &run) {
  if (Status s = checkTypes(a); !s)
    return s;
  using P = AttentionParams;
  const int64_t B = a.batch, H = a.heads, T = a.queries, S = a.keys;
  const int64_t D = a.headSize, Dv = a.valueSize, group = H / a.kvHeads;
  const int64_t Bq = attentionQueryBlock(a);
  const int64_t qBlocks = (T + Bq - 1) / Bq;
  const View q = view(a, args[0], P::kQuery, false, false);
  const View k = view(a, args[1], P::kKey, true, false);
  const View v = view(a, args[2], P::kValue, true, true);
  const void *mask = a.maskArg() >= 0 ? args[size_t(a.maskArg())] : nullptr;
  const View out = view(a, args[size_t(a.firstOutput())], P::kOut, false, true);
  float *lse = static_cast<float *>(args[size_t(a.firstOutput()) + 1]);
  const float dropScale = a.dropout > 0 ? float(1.0 / (1.0 - a.dropout)) : 1.0f;
  run(B * H * qBlocks, [&](int64_t job) {
    int64_t qb = job % qBlocks, bh = job / qBlocks, b = bh / H, h = bh % H;
    int64_t kvh = h / group;
    int64_t q0 = qb * Bq, bq = std::min(Bq, T - q0);
    int64_t kEnd = a.causal ? std::min(S, q0 + bq) : S;
    thread_local std::vector<float> tq, tk, tv, sc, acc, mx, sum;
    Rows Q = widen(q, b, h, q0, bq, tq);
    Rows K = widen(k, b, kvh, 0, kEnd, tk);
    Rows V = widen(v, b, kvh, 0, kEnd, tv);
    sc.resize(size_t(bq * kKeyBlock));
    acc.assign(size_t(bq * Dv), 0.0f);
    mx.assign(size_t(bq), kNegInf);
    sum.assign(size_t(bq), 0.0f);
    for (int64_t j0 = 0; j0 < kEnd; j0 += kKeyBlock) {
      int64_t bk = std::min(kKeyBlock, kEnd - j0);
      float *s = sc.data();
      gemm(false, true, bq, bk, D, float(a.scale), Q.p, Q.ld, K.p + j0 * K.ld, K.ld, 0.0f, s, bk);
      maskScores(a, mask, b, h, q0, bq, j0, bk, s);
      for (int64_t i = 0; i < bq; ++i) {
        float *r = s + i * bk;
        float m = mx[size_t(i)];
        for (int64_t j = 0; j < bk; ++j)
          m = std::max(m, r[j]);
        if (m == kNegInf) { // every key so far dropped
          std::fill(r, r + bk, 0.0f);
          continue;
        }
        float alpha = std::exp(mx[size_t(i)] - m), l = expRow(r, bk, m);
        sum[size_t(i)] = sum[size_t(i)] * alpha + l;
        mx[size_t(i)] = m;
        if (alpha != 1.0f)
          for (int64_t d = 0; d < Dv; ++d)
            acc[size_t(i * Dv + d)] *= alpha;
        if (a.dropout > 0)
          for (int64_t j = 0; j < bk; ++j)
            r[j] *= keepFactor(a, seed, b, h, q0 + i, j0 + j, dropScale);
      }
      gemm(false, false, bq, Dv, bk, 1.0f, s, bk, V.p + j0 * V.ld, V.ld, 1.0f, acc.data(), Dv);
    }
    for (int64_t i = 0; i < bq; ++i) {
      float l = sum[size_t(i)];
      float inv = l > 0 ? 1.0f / l : 0.0f;
      for (int64_t d = 0; d < Dv; ++d)
        acc[size_t(i * Dv + d)] *= inv;
      lse[bh * T + q0 + i] = l > 0 ? mx[size_t(i)] + std::log(l) : kNegInf;
    }
    narrow(acc.data(), out, b, h, q0, bq);
  });
  return Status::ok();
}

Status attentionBackward(const AttentionParams &a, const std::vector<void *> &args,
                         uint64_t seed, const RunParts &run) {
  if (Status s = checkTypes(a); !s)
    return s;
  using P = AttentionParams;
  const int64_t B = a.batch, H = a.heads, Hk = a.kvHeads, T = a.queries, S = a.keys;
  const int64_t D = a.headSize, Dv = a.valueSize, group = H / Hk;
  const int64_t Bq = attentionQueryBlock(a);
  const View q = view(a, args[0], P::kQuery, false, false);
  const View k = view(a, args[1], P::kKey, true, false);
  const View v = view(a, args[2], P::kValue, true, true);
  const View o = view(a, args[3], P::kOut, false, true);
  const View g = view(a, args[5], P::kGrad, false, true);
  const float *lse = static_cast<const float *>(args[4]);
  const void *mask = a.maskArg() >= 0 ? args[size_t(a.maskArg())] : nullptr;
  size_t first = size_t(a.firstOutput());
  const View dq = view(a, args[first], P::kQueryGrad, false, false);
  const View dk = view(a, args[first + 1], P::kKeyGrad, true, false);
  const View dv = view(a, args[first + 2], P::kValueGrad, true, true);
  const float dropScale = a.dropout > 0 ? float(1.0 / (1.0 - a.dropout)) : 1.0f;
  run(B * Hk, [&](int64_t job) {
    int64_t b = job / Hk, kvh = job % Hk;
    thread_local std::vector<float> tk, tv, tq, tg, to, sc, dp, dqAcc, dkAcc, dvAcc, delta,
        keeps;
    Rows K = widen(k, b, kvh, 0, S, tk);
    Rows V = widen(v, b, kvh, 0, S, tv);
    dkAcc.assign(size_t(S * D), 0.0f);
    dvAcc.assign(size_t(S * Dv), 0.0f);
    sc.resize(size_t(Bq * kKeyBlock));
    dp.resize(size_t(Bq * kKeyBlock));
    for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
      int64_t bh = b * H + h;
      for (int64_t q0 = 0; q0 < T; q0 += Bq) {
        int64_t bq = std::min(Bq, T - q0);
        int64_t kEnd = a.causal ? std::min(S, q0 + bq) : S;
        Rows Q = widen(q, b, h, q0, bq, tq);
        Rows G = widen(g, b, h, q0, bq, tg);
        Rows O = widen(o, b, h, q0, bq, to);
        const float *L = lse + bh * T + q0;
        delta.assign(size_t(bq), 0.0f);
        for (int64_t i = 0; i < bq; ++i) {
          float d = 0;
          for (int64_t c = 0; c < Dv; ++c)
            d += G.p[i * G.ld + c] * O.p[i * O.ld + c];
          delta[size_t(i)] = d;
        }
        dqAcc.assign(size_t(bq * D), 0.0f);
        for (int64_t j0 = 0; j0 < kEnd; j0 += kKeyBlock) {
          int64_t bk = std::min(kKeyBlock, kEnd - j0);
          float *s = sc.data(), *ds = dp.data();
          gemm(false, true, bq, bk, D, float(a.scale), Q.p, Q.ld, K.p + j0 * K.ld, K.ld, 0.0f, s,
               bk);
          maskScores(a, mask, b, h, q0, bq, j0, bk, s);
          gemm(false, true, bq, bk, Dv, 1.0f, G.p, G.ld, V.p + j0 * V.ld, V.ld, 0.0f, ds, bk);
          for (int64_t i = 0; i < bq; ++i) {
            float *pr = s + i * bk, *dr = ds + i * bk;
            if (L[i] == kNegInf) { // every key dropped: no probability, no gradient
              std::fill(pr, pr + bk, 0.0f);
              std::fill(dr, dr + bk, 0.0f);
              continue;
            }
            const float *keep = nullptr;
            if (a.dropout > 0) {
              keeps.resize(size_t(bk));
              for (int64_t j = 0; j < bk; ++j)
                keeps[size_t(j)] = keepFactor(a, seed, b, h, q0 + i, j0 + j, dropScale);
              keep = keeps.data();
            }
            gradRow(pr, dr, bk, L[i], delta[size_t(i)], keep);
          }
          gemm(true, false, bk, Dv, bq, 1.0f, s, bk, G.p, G.ld, 1.0f, dvAcc.data() + j0 * Dv, Dv);
          gemm(true, false, bk, D, bq, float(a.scale), ds, bk, Q.p, Q.ld, 1.0f,
               dkAcc.data() + j0 * D, D);
          gemm(false, false, bq, D, bk, float(a.scale), ds, bk, K.p + j0 * K.ld, K.ld, 1.0f,
               dqAcc.data(), D);
        }
        narrow(dqAcc.data(), dq, b, h, q0, bq);
      }
    }
    narrow(dkAcc.data(), dk, b, kvh, 0, S);
    narrow(dvAcc.data(), dv, b, kvh, 0, S);
  });
  return Status::ok();
}

} // namespace kiln::cpu
