//===- AttentionKernelTest.cpp - The CPU attention kernels vs the reference ===//
//
// runtime/cpu/Attention.h against reference/Attention.h (float64 loops) on
// the same inputs: causal and not, boolean and additive masks ([T, S] and
// [B|1, H|1, T, S]), dropout (mask-exact: the same keep decisions), grouped
// key/value heads, sequence lengths that are no multiple of the 64-query or
// 128-key blocks, head sizes 32, 64, 80 and 128, f32 and bf16; and the bits
// the same on 1 and 3 threads.
//
// Tolerances (relative to the tensor's largest magnitude): f32 1e-5 for the
// output and 5e-5 for the gradients (float32 sums of up to 130 products,
// each ~6e-8 relative; the gradients add the backward's three products);
// bf16 2e-2 (the result is rounded to 8 significant bits, 4e-3, and the
// gradients come from bf16-rounded outputs).
//
//===----------------------------------------------------------------------===//
#include "reference/Attention.h"
#include "runtime/core/Half.h"
#include "runtime/cpu/Attention.h"
#include "runtime/cpu/ThreadPool.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

using namespace kiln;
using program::AttentionParams;
using program::DType;

namespace {

struct Case {
  int64_t B, H, Hk, T, S, D, Dv;
  bool causal;
  AttentionParams::Mask mask;
  bool mask4d;
  double dropout;
  DType dtype;
  /// AttentionParams::seqMajor: these tensors are passed as [B, N, H, W].
  uint32_t seqMajor = 0;
};

/// [B, H, N, W] <-> [B, N, H, W] of elements of `es` bytes (toSeq: from the
/// first to the second).
std::vector<uint8_t> permute(const std::vector<uint8_t> &in, size_t es, int64_t B, int64_t H,
                             int64_t N, int64_t W, bool toSeq) {
  std::vector<uint8_t> out(in.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t n = 0; n < N; ++n) {
        int64_t hm = ((b * H + h) * N + n) * W, sm = ((b * N + n) * H + h) * W;
        int64_t from = toSeq ? hm : sm, to = toSeq ? sm : hm;
        std::memcpy(out.data() + size_t(to) * es, in.data() + size_t(from) * es, size_t(W) * es);
      }
  return out;
}

/// A buffer of `n` elements of `t` with values from `values` (rounded to t),
/// and the rounded values as doubles.
struct Buf {
  std::vector<uint8_t> bytes;
  interp::Tensor ref;
};

Buf make(DType t, std::vector<int64_t> shape, std::mt19937 &rng, double scale) {
  Buf b;
  b.ref = interp::Tensor::zeros(interp::Elem::F64, shape);
  int64_t n = b.ref.numel();
  b.bytes.resize(size_t(n) * (t == DType::F32 ? 4 : 2));
  std::normal_distribution<float> dist(0.0f, float(scale));
  for (int64_t i = 0; i < n; ++i) {
    float x = dist(rng);
    if (t == DType::F32) {
      std::memcpy(b.bytes.data() + 4 * i, &x, 4);
      b.ref.f[size_t(i)] = x;
    } else {
      uint16_t h = floatToHalf(t, x);
      std::memcpy(b.bytes.data() + 2 * i, &h, 2);
      b.ref.f[size_t(i)] = halfToFloat(t, h);
    }
  }
  return b;
}

std::vector<double> read(const std::vector<uint8_t> &bytes, DType t, int64_t n) {
  std::vector<double> out(static_cast<size_t>(n), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    if (t == DType::F32) {
      float x;
      std::memcpy(&x, bytes.data() + 4 * i, 4);
      out[size_t(i)] = x;
    } else {
      uint16_t h;
      std::memcpy(&h, bytes.data() + 2 * i, 2);
      out[size_t(i)] = halfToFloat(t, h);
    }
  }
  return out;
}

/// max |a - b| / max |b| (b the reference).
double relErr(const std::vector<double> &a, const std::vector<double> &b) {
  double err = 0, big = 1e-30;
  for (size_t i = 0; i < b.size(); ++i) {
    if (std::isfinite(b[i]))
      big = std::max(big, std::fabs(b[i]));
    err = std::max(err, std::fabs(a[i] - b[i]));
  }
  return err / big;
}

struct Outputs {
  std::vector<uint8_t> out, lse, dq, dk, dv;
};

Outputs runKernel(const AttentionParams &fwd, std::vector<Buf> &in, Buf *mask, uint64_t seed,
                  int threads) {
  cpu::ThreadPool pool(threads);
  cpu::RunParts run = [&](int64_t n, const std::function<void(int64_t)> &job) {
    pool.forEach(n, threads, job);
  };
  size_t es = fwd.dtype == DType::F32 ? 4 : 2;
  int64_t B = fwd.batch, H = fwd.heads, Hk = fwd.kvHeads, T = fwd.queries, S = fwd.keys;
  Outputs o;
  o.out.resize(size_t(B * H * T * fwd.valueSize) * es);
  o.lse.resize(size_t(B * H * T) * 4);
  int64_t seedValue = int64_t(seed);
  std::vector<void *> args = {in[0].bytes.data(), in[1].bytes.data(), in[2].bytes.data()};
  if (mask)
    args.push_back(mask->bytes.data());
  if (fwd.hasSeed())
    args.push_back(&seedValue);
  args.push_back(o.out.data());
  args.push_back(o.lse.data());
  EXPECT_TRUE(cpu::attentionForward(fwd, args, seed, run).isOk());
  AttentionParams bwd = fwd;
  bwd.backward = true;
  o.dq.resize(size_t(B * H * T * fwd.headSize) * es);
  o.dk.resize(size_t(B * Hk * S * fwd.headSize) * es);
  o.dv.resize(size_t(B * Hk * S * fwd.valueSize) * es);
  std::vector<void *> bargs = {in[0].bytes.data(), in[1].bytes.data(), in[2].bytes.data(),
                               o.out.data(),       o.lse.data(),       in[3].bytes.data()};
  if (mask)
    bargs.push_back(mask->bytes.data());
  if (fwd.hasSeed())
    bargs.push_back(&seedValue);
  bargs.push_back(o.dq.data());
  bargs.push_back(o.dk.data());
  bargs.push_back(o.dv.data());
  EXPECT_TRUE(cpu::attentionBackward(bwd, bargs, seed, run).isOk());
  return o;
}

class AttentionKernel : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionKernel, MatchesReference) {
  const Case &c = GetParam();
  std::mt19937 rng(1234);
  AttentionParams a;
  a.batch = c.B, a.heads = c.H, a.kvHeads = c.Hk, a.queries = c.T, a.keys = c.S;
  a.headSize = c.D, a.valueSize = c.Dv, a.dtype = c.dtype, a.causal = c.causal;
  a.scale = 1.0 / std::sqrt(double(c.D)), a.dropout = c.dropout, a.salt = 9;
  a.mask = c.mask;
  std::vector<Buf> in;
  in.push_back(make(c.dtype, {c.B, c.H, c.T, c.D}, rng, 1.0));
  in.push_back(make(c.dtype, {c.B, c.Hk, c.S, c.D}, rng, 1.0));
  in.push_back(make(c.dtype, {c.B, c.Hk, c.S, c.Dv}, rng, 1.0));
  in.push_back(make(c.dtype, {c.B, c.H, c.T, c.Dv}, rng, 1.0)); // the result's gradient
  Buf mask;
  if (c.mask != AttentionParams::Mask::None) {
    a.maskBatch = c.mask4d ? c.B : 1;
    a.maskHeads = c.mask4d ? c.H : 1;
    std::vector<int64_t> shape = c.mask4d ? std::vector<int64_t>{c.B, c.H, c.T, c.S}
                                          : std::vector<int64_t>{c.T, c.S};
    if (c.mask == AttentionParams::Mask::Keep) {
      mask.ref = interp::Tensor::zeros(interp::Elem::I1, shape);
      mask.bytes.resize(size_t(mask.ref.numel()));
      std::bernoulli_distribution keep(0.7);
      for (int64_t i = 0; i < mask.ref.numel(); ++i) {
        bool k = (i % c.S) == 0 || keep(rng); // every row keeps a key
        mask.ref.i[size_t(i)] = k;
        mask.bytes[size_t(i)] = k;
      }
    } else {
      mask = make(c.dtype, shape, rng, 2.0);
    }
  }
  uint64_t seed = 424242;
  // Sequence-major tensors: the kernel gets (and writes) them permuted; the
  // checks below see them head-major again.
  a.seqMajor = c.seqMajor;
  size_t es = c.dtype == DType::F32 ? 4 : 2;
  std::vector<Buf> kin = in;
  using P = AttentionParams;
  if (c.seqMajor & P::kQuery)
    kin[0].bytes = permute(in[0].bytes, es, c.B, c.H, c.T, c.D, true);
  if (c.seqMajor & P::kKey)
    kin[1].bytes = permute(in[1].bytes, es, c.B, c.Hk, c.S, c.D, true);
  if (c.seqMajor & P::kValue)
    kin[2].bytes = permute(in[2].bytes, es, c.B, c.Hk, c.S, c.Dv, true);
  if (c.seqMajor & P::kGrad)
    kin[3].bytes = permute(in[3].bytes, es, c.B, c.H, c.T, c.Dv, true);
  // The kernel's outputs head-major again.
  auto headMajor = [&](Outputs o) {
    if (c.seqMajor & P::kOut)
      o.out = permute(o.out, es, c.B, c.H, c.T, c.Dv, false);
    if (c.seqMajor & P::kQueryGrad)
      o.dq = permute(o.dq, es, c.B, c.H, c.T, c.D, false);
    if (c.seqMajor & P::kKeyGrad)
      o.dk = permute(o.dk, es, c.B, c.Hk, c.S, c.D, false);
    if (c.seqMajor & P::kValueGrad)
      o.dv = permute(o.dv, es, c.B, c.Hk, c.S, c.Dv, false);
    return o;
  };
  Buf *maskBuf = c.mask != AttentionParams::Mask::None ? &mask : nullptr;
  Outputs o = headMajor(runKernel(a, kin, maskBuf, seed, 1));

  interp::AttentionAttrs ra;
  ra.scale = a.scale, ra.causal = a.causal, ra.dropout = a.dropout, ra.seed = seed, ra.salt = 9;
  const interp::Tensor *rm = c.mask != AttentionParams::Mask::None ? &mask.ref : nullptr;
  auto out = interp::Tensor::zeros(interp::Elem::F64, {c.B, c.H, c.T, c.Dv});
  auto lse = interp::Tensor::zeros(interp::Elem::F64, {c.B, c.H, c.T});
  interp::attentionForward(in[0].ref, in[1].ref, in[2].ref, rm, ra, out, lse);
  // The backward from the kernel's own (rounded) output and lse, as the
  // compiled step feeds it.
  auto kOut = interp::Tensor::zeros(interp::Elem::F64, {c.B, c.H, c.T, c.Dv});
  kOut.f = read(o.out, c.dtype, kOut.numel());
  auto kLse = interp::Tensor::zeros(interp::Elem::F64, {c.B, c.H, c.T});
  kLse.f = read(o.lse, DType::F32, kLse.numel());
  auto dq = interp::Tensor::zeros(interp::Elem::F64, {c.B, c.H, c.T, c.D});
  auto dk = interp::Tensor::zeros(interp::Elem::F64, {c.B, c.Hk, c.S, c.D});
  auto dv = interp::Tensor::zeros(interp::Elem::F64, {c.B, c.Hk, c.S, c.Dv});
  interp::attentionBackward(in[0].ref, in[1].ref, in[2].ref, kOut, kLse, in[3].ref, rm, ra, dq,
                            dk, dv);

  double outTol = c.dtype == DType::F32 ? 1e-5 : 2e-2;
  double gradTol = c.dtype == DType::F32 ? 5e-5 : 2e-2;
  EXPECT_LT(relErr(kOut.f, out.f), outTol) << "output";
  EXPECT_LT(relErr(kLse.f, lse.f), 1e-5) << "log-sum-exp";
  EXPECT_LT(relErr(read(o.dq, c.dtype, dq.numel()), dq.f), gradTol) << "query gradient";
  EXPECT_LT(relErr(read(o.dk, c.dtype, dk.numel()), dk.f), gradTol) << "key gradient";
  EXPECT_LT(relErr(read(o.dv, c.dtype, dv.numel()), dv.f), gradTol) << "value gradient";

  // The same bits on 3 threads.
  Outputs o3 = headMajor(runKernel(a, kin, maskBuf, seed, 3));
  EXPECT_EQ(o.out, o3.out);
  EXPECT_EQ(o.lse, o3.lse);
  EXPECT_EQ(o.dq, o3.dq);
  EXPECT_EQ(o.dk, o3.dk);
  EXPECT_EQ(o.dv, o3.dv);
}

using M = AttentionParams::Mask;
INSTANTIATE_TEST_SUITE_P(
    Cases, AttentionKernel,
    ::testing::Values(Case{2, 3, 3, 70, 70, 32, 32, true, M::None, false, 0.0, DType::F32},
                      Case{1, 2, 2, 65, 65, 64, 64, false, M::Keep, false, 0.0, DType::F32},
                      Case{1, 4, 2, 33, 130, 80, 80, false, M::Add, true, 0.2, DType::F32},
                      Case{2, 2, 2, 129, 129, 128, 128, true, M::None, false, 0.1, DType::F32},
                      Case{1, 2, 2, 40, 40, 32, 48, false, M::Keep, true, 0.0, DType::F32},
                      Case{1, 2, 1, 70, 70, 64, 64, true, M::None, false, 0.0, DType::BF16},
                      Case{1, 2, 2, 50, 50, 32, 32, true, M::None, false, 0.3, DType::F16},
                      // Every tensor sequence-major (the GPT's folded transposes),
                      // and a mix.
                      Case{2, 4, 4, 70, 70, 32, 32, true, M::None, false, 0.1, DType::F32, 255},
                      Case{1, 4, 2, 20, 30, 16, 24, false, M::Keep, false, 0.0, DType::BF16,
                           AttentionParams::kKey | AttentionParams::kOut |
                               AttentionParams::kQueryGrad}));

} // namespace
