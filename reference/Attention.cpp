//===- Attention.cpp - Reference semantics of fused attention -------------===//
#include "reference/Attention.h"

#include "runtime/core/Random.h"

#include <cmath>
#include <limits>

namespace kiln::interp {

namespace {

/// The index arithmetic and the score of one (batch, head, query, key).
struct Geometry {
  int64_t B, H, Hk, T, S, D, Dv;
  const Tensor *mask;
  int64_t mB = 1, mH = 1; ///< the mask's batch and head sizes (1: broadcast)

  Geometry(const Tensor &q, const Tensor &k, const Tensor &v, const Tensor *m)
      : B(q.shape[0]), H(q.shape[1]), Hk(k.shape[1]), T(q.shape[2]), S(k.shape[2]),
        D(q.shape[3]), Dv(v.shape[3]), mask(m) {
    if (m && m->shape.size() == 4) {
      mB = m->shape[0];
      mH = m->shape[1];
    }
  }
  int64_t kvHead(int64_t h) const { return h / (H / Hk); }
  int64_t qRow(int64_t b, int64_t h, int64_t i) const { return (b * H + h) * T + i; }
  int64_t kvRow(int64_t b, int64_t h, int64_t j) const { return (b * Hk + kvHead(h)) * S + j; }

  /// scale q.k with the causal rule and the mask; -inf where dropped.
  double score(const Tensor &q, const Tensor &k, const AttentionAttrs &a, int64_t b,
               int64_t h, int64_t i, int64_t j) const {
    constexpr double kNegInf = -std::numeric_limits<double>::infinity();
    if (a.causal && j > i)
      return kNegInf;
    const double *qi = q.f.data() + qRow(b, h, i) * D;
    const double *kj = k.f.data() + kvRow(b, h, j) * D;
    double s = 0;
    for (int64_t d = 0; d < D; ++d)
      s += qi[d] * kj[d];
    s *= a.scale;
    if (mask) {
      int64_t mk = ((mB == 1 ? 0 : b) * mH + (mH == 1 ? 0 : h)) * T * S + i * S + j;
      if (isFloat(mask->elem))
        s += mask->f[mk];
      else if (mask->i[mk] == 0)
        return kNegInf;
    }
    return s;
  }

  /// Dropout's factor for the probability at (b, h, i, j): 0 or 1 / (1 - p).
  double keep(const AttentionAttrs &a, int64_t b, int64_t h, int64_t i, int64_t j) const {
    if (a.dropout <= 0)
      return 1.0;
    uint64_t idx = uint64_t(qRow(b, h, i) * S + j);
    return random::uniform(a.seed, a.salt, idx) >= a.dropout ? 1.0 / (1.0 - a.dropout) : 0.0;
  }
};

} // namespace

void attentionForward(const Tensor &q, const Tensor &k, const Tensor &v, const Tensor *mask,
                      const AttentionAttrs &a, Tensor &out, Tensor &lse) {
  Geometry g(q, k, v, mask);
  std::vector<double> s(g.S);
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t h = 0; h < g.H; ++h)
      for (int64_t i = 0; i < g.T; ++i) {
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < g.S; ++j) {
          s[j] = g.score(q, k, a, b, h, i, j);
          m = std::max(m, s[j]);
        }
        int64_t row = g.qRow(b, h, i);
        double *o = out.f.data() + row * g.Dv;
        std::fill(o, o + g.Dv, 0.0);
        if (std::isinf(m) && m < 0) { // every key dropped
          lse.f[row] = m;
          continue;
        }
        double l = 0;
        for (int64_t j = 0; j < g.S; ++j)
          l += std::exp(s[j] - m);
        double logsum = m + std::log(l);
        lse.f[row] = logsum;
        for (int64_t j = 0; j < g.S; ++j) {
          double p = std::exp(s[j] - logsum) * g.keep(a, b, h, i, j);
          if (p == 0)
            continue;
          const double *vj = v.f.data() + g.kvRow(b, h, j) * g.Dv;
          for (int64_t d = 0; d < g.Dv; ++d)
            o[d] += p * vj[d];
        }
      }
}

void attentionBackward(const Tensor &q, const Tensor &k, const Tensor &v, const Tensor &o,
                       const Tensor &lse, const Tensor &gr, const Tensor *mask,
                       const AttentionAttrs &a, Tensor &dq, Tensor &dk, Tensor &dv) {
  Geometry g(q, k, v, mask);
  std::fill(dq.f.begin(), dq.f.end(), 0.0);
  std::fill(dk.f.begin(), dk.f.end(), 0.0);
  std::fill(dv.f.begin(), dv.f.end(), 0.0);
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t h = 0; h < g.H; ++h)
      for (int64_t i = 0; i < g.T; ++i) {
        int64_t row = g.qRow(b, h, i);
        double L = lse.f[row];
        if (std::isinf(L) && L < 0)
          continue;
        const double *gi = gr.f.data() + row * g.Dv;
        const double *oi = o.f.data() + row * g.Dv;
        const double *qi = q.f.data() + row * g.D;
        double delta = 0; // rowsum(grad * out)
        for (int64_t d = 0; d < g.Dv; ++d)
          delta += gi[d] * oi[d];
        double *dqi = dq.f.data() + row * g.D;
        for (int64_t j = 0; j < g.S; ++j) {
          double s = g.score(q, k, a, b, h, i, j);
          if (std::isinf(s) && s < 0)
            continue;
          double p = std::exp(s - L), keep = g.keep(a, b, h, i, j);
          int64_t kv = g.kvRow(b, h, j);
          const double *vj = v.f.data() + kv * g.Dv;
          const double *kj = k.f.data() + kv * g.D;
          double dpd = 0;
          for (int64_t d = 0; d < g.Dv; ++d)
            dpd += gi[d] * vj[d];
          double ds = p * (dpd * keep - delta) * a.scale;
          double *dkj = dk.f.data() + kv * g.D;
          double *dvj = dv.f.data() + kv * g.Dv;
          for (int64_t d = 0; d < g.D; ++d) {
            dqi[d] += ds * kj[d];
            dkj[d] += ds * qi[d];
          }
          double pd = p * keep;
          for (int64_t d = 0; d < g.Dv; ++d)
            dvj[d] += pd * gi[d];
        }
      }
}

} // namespace kiln::interp
