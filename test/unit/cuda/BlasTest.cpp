//===- BlasTest.cpp - kiln.matmul through cuBLASLt ------------------------===//
//
// Two halves:
//  - host: planGemm's column-major calls, executed by a host model of
//    cuBLASLt's semantics, must equal kiln.matmul's row-major reference
//    exactly (same products, same order, in double) for every transpose,
//    batch mode and head layout; checkMatmul's refusals; handle creation
//    failing cleanly without a GPU. These run everywhere.
//  - GPU: the same semantics on a device, for every dtype pair and epilogue,
//    against the reference with stated tolerances. They skip with "no CUDA
//    device: <why>" where Driver::load() or device 0 is unavailable.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/Blas.h"
#include "runtime/core/Half.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

using namespace kiln;
using namespace kiln::cuda;
using program::DType;
using program::GemmParams;
using program::MatrixLayout;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

// --- kiln.matmul's row-major semantics (runtime/cpu/Gemm.cpp) ---------------

int64_t startOf(const GemmParams &s, const MatrixLayout &l, int64_t b,
                int64_t dense) {
  return s.heads ? (b / s.heads) * l.outer + (b % s.heads) * l.inner
                 : b * dense;
}
/// Element (i, kk) of op(lhs) for matrix b.
int64_t lhsIndex(const GemmParams &s, int64_t b, int64_t i, int64_t kk) {
  int64_t base = s.lhsBatched ? startOf(s, s.lhsLayout, b, s.m * s.k) : 0;
  int64_t ld = s.heads ? s.lhsLayout.ld : (s.transposeLhs ? s.m : s.k);
  return base + (s.transposeLhs ? kk * ld + i : i * ld + kk);
}
/// Element (kk, j) of op(rhs) for matrix b.
int64_t rhsIndex(const GemmParams &s, int64_t b, int64_t kk, int64_t j) {
  int64_t base = s.rhsBatched ? startOf(s, s.rhsLayout, b, s.k * s.n) : 0;
  int64_t ld = s.heads ? s.rhsLayout.ld : (s.transposeRhs ? s.k : s.n);
  return base + (s.transposeRhs ? j * ld + kk : kk * ld + j);
}
int64_t outIndex(const GemmParams &s, int64_t b, int64_t i, int64_t j) {
  int64_t ld = s.heads ? s.outLayout.ld : s.n;
  return startOf(s, s.outLayout, b, s.m * s.n) + i * ld + j;
}

struct Extents {
  int64_t lhs = 0, rhs = 0, out = 0;
};
Extents extents(const GemmParams &s) {
  Extents e;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t j = 0; j < s.n; ++j)
        e.out = std::max(e.out, outIndex(s, b, i, j) + 1);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t kk = 0; kk < s.k; ++kk) {
      for (int64_t i = 0; i < s.m; ++i)
        e.lhs = std::max(e.lhs, lhsIndex(s, b, i, kk) + 1);
      for (int64_t j = 0; j < s.n; ++j)
        e.rhs = std::max(e.rhs, rhsIndex(s, b, kk, j) + 1);
    }
  return e;
}

void referenceMatmul(const GemmParams &s, const std::vector<double> &lhs,
                     const std::vector<double> &rhs, std::vector<double> &out) {
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t j = 0; j < s.n; ++j) {
        double acc = 0;
        for (int64_t kk = 0; kk < s.k; ++kk)
          acc += lhs[size_t(lhsIndex(s, b, i, kk))] *
                 rhs[size_t(rhsIndex(s, b, kk, j))];
        out[size_t(outIndex(s, b, i, j))] = acc;
      }
}

/// cuBLASLt's column-major semantics for the calls planGemm returns:
/// D(r, c) = sum_kk op(A)(r, kk) op(B)(kk, c), element (r, c) at r + c * ld.
void modelLt(const LtGemm &g, const std::vector<double> &A,
             const std::vector<double> &B, std::vector<double> &D) {
  for (int64_t call = 0; call < g.calls(); ++call)
    for (int64_t bi = 0; bi < g.batch; ++bi) {
      int64_t a0 = g.offsetA[size_t(call)] + bi * g.strideA;
      int64_t b0 = g.offsetB[size_t(call)] + bi * g.strideB;
      int64_t c0 = g.offsetC[size_t(call)] + bi * g.strideC;
      for (int64_t c = 0; c < g.n; ++c)
        for (int64_t r = 0; r < g.m; ++r) {
          double acc = 0;
          for (int64_t kk = 0; kk < g.k; ++kk) {
            // at(): a plan that leaves the buffers throws (a test failure).
            double a =
                A.at(size_t(a0 + (g.transA ? kk + r * g.lda : r + kk * g.lda)));
            double b =
                B.at(size_t(b0 + (g.transB ? c + kk * g.ldb : kk + c * g.ldb)));
            acc += a * b;
          }
          D.at(size_t(c0 + r + c * g.ldc)) = acc;
        }
    }
}

GemmParams dense(int64_t batch, int64_t m, int64_t n, int64_t k, bool ta,
                 bool tb, bool lb, bool rb) {
  GemmParams s;
  s.batch = batch;
  s.m = m;
  s.n = n;
  s.k = k;
  s.transposeLhs = ta;
  s.transposeRhs = tb;
  s.lhsBatched = lb;
  s.rhsBatched = rb;
  return s;
}

/// Attention-style head layouts over B batches, H heads, T tokens, D dims:
/// [B, T, H, D] tensors read in place as B*H matrices of [T, D] (row stride
/// H*D), and dense [B, H, T, T] score matrices.
MatrixLayout tokensLayout(int64_t T, int64_t H, int64_t D) {
  return {T * H * D, D, H * D};
}
MatrixLayout scoresLayout(int64_t T, int64_t H) {
  return {H * T * T, T * T, T};
}

struct HeadCase {
  const char *name;
  GemmParams s;
};
std::vector<HeadCase> headCases(int64_t B, int64_t H, int64_t T, int64_t D) {
  std::vector<HeadCase> cases;
  GemmParams s;
  s.batch = B * H;
  s.heads = H;
  s.lhsBatched = s.rhsBatched = true;
  // scores = Q K^T: [T, D] x [T, D]^T -> [T, T]
  GemmParams qk = s;
  qk.m = T, qk.n = T, qk.k = D;
  qk.transposeRhs = true;
  qk.lhsLayout = qk.rhsLayout = tokensLayout(T, H, D);
  qk.outLayout = scoresLayout(T, H);
  cases.push_back({"scores=QK^T", qk});
  // out = P V: [T, T] x [T, D] -> [T, D] written into [B, T, H, D]
  GemmParams pv = s;
  pv.m = T, pv.n = D, pv.k = T;
  pv.lhsLayout = scoresLayout(T, H);
  pv.rhsLayout = pv.outLayout = tokensLayout(T, H, D);
  cases.push_back({"out=PV", pv});
  // dV = P^T dO
  GemmParams dv = s;
  dv.m = T, dv.n = D, dv.k = T;
  dv.transposeLhs = true;
  dv.lhsLayout = scoresLayout(T, H);
  dv.rhsLayout = dv.outLayout = tokensLayout(T, H, D);
  cases.push_back({"dV=P^T dO", dv});
  // dQ = dS K with dS transposed in storage and a shared lhs
  GemmParams shared = s;
  shared.m = T, shared.n = D, shared.k = T;
  shared.lhsBatched = false;
  shared.transposeLhs = true;
  shared.lhsLayout = {0, 0, T};
  shared.rhsLayout = shared.outLayout = tokensLayout(T, H, D);
  cases.push_back({"shared lhs", shared});
  // Head layouts that happen to be uniform (outer == heads * inner).
  GemmParams flat = s;
  flat.m = T, flat.n = T, flat.k = D;
  flat.lhsLayout = flat.rhsLayout = {H * T * D, T * D, D};
  flat.transposeRhs = true;
  flat.outLayout = scoresLayout(T, H);
  cases.push_back({"uniform", flat});
  return cases;
}

std::vector<GemmParams> denseCases(int64_t batch, int64_t m, int64_t n,
                                   int64_t k) {
  std::vector<GemmParams> cases;
  for (int t = 0; t < 4; ++t)
    for (int mode = 0; mode < 4; ++mode) {
      bool lb = mode == 0 || mode == 1, rb = mode == 0 || mode == 2;
      cases.push_back(
          dense(mode == 3 ? 1 : batch, m, n, k, t & 1, t & 2, lb, rb));
    }
  return cases;
}

std::string describe(const GemmParams &s) {
  return "batch " + std::to_string(s.batch) + " m " + std::to_string(s.m) +
         " n " + std::to_string(s.n) + " k " + std::to_string(s.k) +
         (s.transposeLhs ? " lhs^T" : "") + (s.transposeRhs ? " rhs^T" : "") +
         (s.lhsBatched ? " lhs-batched" : "") +
         (s.rhsBatched ? " rhs-batched" : "") +
         (s.heads ? " heads " + std::to_string(s.heads) : "");
}

/// planGemm + the cuBLASLt model == the reference, bit for bit, and no
/// element outside the output's matrices is written.
void expectPlanMatches(const GemmParams &s,
                       GemmPlanForm form = GemmPlanForm::Heads) {
  SCOPED_TRACE(describe(s) + " plan " + gpu::gemmPlanFormName(form));
  auto g = planGemm(s, form);
  ASSERT_TRUE(g.isOk()) << g.status().message();
  Extents e = extents(s);
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> lhs(size_t(e.lhs)), rhs(size_t(e.rhs));
  for (double &v : lhs)
    v = u(rng);
  for (double &v : rhs)
    v = u(rng);
  std::vector<double> want(size_t(e.out), kNaN), got(size_t(e.out), kNaN);
  referenceMatmul(s, lhs, rhs, want);
  modelLt(*g, rhs, lhs, got); // cuBLASLt's A is Kiln's rhs
  int64_t written = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i]))
          << "element " << i << " outside the output was written";
      continue;
    }
    ++written;
    ASSERT_EQ(got[i], want[i]) << "element " << i;
  }
  EXPECT_EQ(written, s.batch * s.m * s.n);
}

} // namespace

TEST(CudaBlasPlan, DenseTransposesAndBatchModesMatchTheReference) {
  for (const GemmParams &s : denseCases(3, 5, 7, 4))
    expectPlanMatches(s);
  for (const GemmParams &s : denseCases(2, 1, 9, 3))
    expectPlanMatches(s);
}

TEST(CudaBlasPlan, HeadLayoutsMatchTheReference) {
  // Batch entries x heads: fewer entries than heads (a call per entry),
  // more (a call per head), as many, one head, one entry.
  const std::pair<int64_t, int64_t> sizes[] = {
      {2, 3}, {4, 3}, {3, 3}, {3, 1}, {1, 2}};
  for (auto [b, h] : sizes)
    for (GemmPlanForm form : {GemmPlanForm::Heads, GemmPlanForm::Legacy})
      for (const HeadCase &c : headCases(b, h, 5, 4)) {
        SCOPED_TRACE(c.name);
        expectPlanMatches(c.s, form);
      }
  for (const HeadCase &c : headCases(1, 2, 3, 8)) {
    SCOPED_TRACE(c.name);
    expectPlanMatches(c.s);
  }
}

TEST(CudaBlasPlan, CallStructure) {
  // A weight shared by a batched, untransposed lhs: one GEMM of batch*m rows.
  auto fold = planGemm(dense(4, 8, 16, 32, false, true, true, false));
  ASSERT_TRUE(fold.isOk());
  EXPECT_TRUE(foldsBatch(dense(4, 8, 16, 32, false, true, true, false)));
  EXPECT_EQ(fold->calls(), 1);
  EXPECT_EQ(fold->batch, 1);
  EXPECT_EQ(fold->m, 16); // column-major rows = Kiln's n
  EXPECT_EQ(fold->n, 32); // batch * m
  EXPECT_TRUE(fold->transA);
  EXPECT_FALSE(fold->transB);
  // A transposed lhs cannot fold: strided batch with a shared rhs (stride 0).
  auto shared = planGemm(dense(4, 8, 16, 32, true, false, true, false));
  ASSERT_TRUE(shared.isOk());
  EXPECT_EQ(shared->calls(), 1);
  EXPECT_EQ(shared->batch, 4);
  EXPECT_EQ(shared->strideA, 0);
  EXPECT_EQ(shared->strideB, 8 * 32);
  EXPECT_EQ(shared->strideC, 8 * 16);
  // Head layouts with fewer batch entries (2) than heads (3): a call per
  // entry, its heads D elements apart.
  std::vector<HeadCase> heads = headCases(2, 3, 5, 4);
  auto qk = planGemm(heads[0].s);
  ASSERT_TRUE(qk.isOk());
  EXPECT_EQ(qk->calls(), 2);
  EXPECT_EQ(qk->batch, 3);
  EXPECT_EQ(qk->strideB, 4); // next head: D elements further
  EXPECT_EQ(qk->offsetB[1], 5 * 3 * 4);
  // More entries (4) than heads (3): a call per head, stepping through the
  // entries by `outer` (T*H*D tokens, H*T*T scores), call h at h*inner.
  auto perHead = planGemm(headCases(4, 3, 5, 4)[0].s);
  ASSERT_TRUE(perHead.isOk());
  EXPECT_EQ(perHead->calls(), 3);
  EXPECT_EQ(perHead->batch, 4);
  EXPECT_EQ(perHead->strideA, 5 * 3 * 4);
  EXPECT_EQ(perHead->strideB, 5 * 3 * 4);
  EXPECT_EQ(perHead->strideC, 3 * 5 * 5);
  EXPECT_EQ(perHead->offsetB, (std::vector<int64_t>{0, 4, 8}));
  EXPECT_EQ(perHead->offsetC, (std::vector<int64_t>{0, 25, 50}));
  auto legacy = planGemm(headCases(4, 3, 5, 4)[0].s, GemmPlanForm::Legacy);
  ASSERT_TRUE(legacy.isOk());
  EXPECT_EQ(legacy->calls(), 4);
  EXPECT_EQ(legacy->batch, 3);
  // Uniform layouts (outer == heads * inner): one call.
  auto flat = planGemm(heads[4].s);
  ASSERT_TRUE(flat.isOk());
  EXPECT_EQ(flat->calls(), 1);
  EXPECT_EQ(flat->batch, 6);
  // One head: one call stepping by `outer`.
  auto one = planGemm(headCases(3, 1, 5, 4)[0].s);
  ASSERT_TRUE(one.isOk());
  EXPECT_EQ(one->calls(), 1);
  EXPECT_EQ(one->batch, 3);
  EXPECT_EQ(one->strideB, 5 * 4);
}

// The GPU config (examples/shakespeare_char.kiln: batch 64, 256 tokens, 6
// heads of 64) as kilnc --target=cuda plans its attention GEMMs, descriptors
// copied from the artifact's plan. fp32 folds the head transposes, so q, k,
// v and the attention output are [64, 256, 6, 64] in place (outer 256*384,
// inner 64, ld 384) beside dense [64, 6, 256, 256] scores; bf16 keeps the
// transposes as kernels and its GEMMs are dense batches of 384.
TEST(CudaBlasPlan, GpuConfigAttentionCallCounts) {
  const int64_t B = 64, H = 6, T = 256, D = 64;
  std::vector<HeadCase> fp32 = headCases(B, H, T, D);
  ASSERT_EQ(fp32[0].s.lhsLayout.outer, 98304);
  ASSERT_EQ(fp32[0].s.lhsLayout.ld, 384);
  ASSERT_EQ(fp32[0].s.outLayout.outer, 393216);
  for (int i = 0; i < 3; ++i) { // scores=QK^T, out=PV, dV=P^T dO
    SCOPED_TRACE(fp32[size_t(i)].name);
    const GemmParams &s = fp32[size_t(i)].s;
    EXPECT_EQ(s.batch, B * H);
    auto g = planGemm(s);
    ASSERT_TRUE(g.isOk()) << g.status().message();
    EXPECT_EQ(g->calls(), H); // one per head, was B
    EXPECT_EQ(g->batch, B);
    EXPECT_EQ(g->strideA, s.rhsLayout.outer);
    EXPECT_EQ(g->strideB, s.lhsLayout.outer);
    EXPECT_EQ(g->strideC, s.outLayout.outer);
    for (int64_t h = 0; h < H; ++h) {
      EXPECT_EQ(g->offsetA[size_t(h)], h * s.rhsLayout.inner);
      EXPECT_EQ(g->offsetB[size_t(h)], h * s.lhsLayout.inner);
      EXPECT_EQ(g->offsetC[size_t(h)], h * s.outLayout.inner);
    }
    auto old = planGemm(s, GemmPlanForm::Legacy);
    ASSERT_TRUE(old.isOk());
    EXPECT_EQ(old->calls(), B);
    EXPECT_EQ(old->batch, H);
  }
  const GemmParams bf16[] = {dense(B * H, T, T, D, false, true, true, true),
                             dense(B * H, T, D, T, false, false, true, true),
                             dense(B * H, T, D, T, true, false, true, true)};
  for (GemmParams s : bf16) {
    s.dtype = DType::BF16;
    SCOPED_TRACE(describe(s));
    for (GemmPlanForm form : {GemmPlanForm::Heads, GemmPlanForm::Legacy}) {
      auto g = planGemm(s, form);
      ASSERT_TRUE(g.isOk());
      EXPECT_EQ(g->calls(), 1);
      EXPECT_EQ(g->batch, B * H);
    }
  }
}

TEST(CudaBlasPlan, PlanFormFromItsName) {
  EXPECT_EQ(*gpu::parseGemmPlanForm(nullptr), GemmPlanForm::Heads);
  EXPECT_EQ(*gpu::parseGemmPlanForm(""), GemmPlanForm::Heads);
  EXPECT_EQ(*gpu::parseGemmPlanForm("heads"), GemmPlanForm::Heads);
  EXPECT_EQ(*gpu::parseGemmPlanForm("legacy"), GemmPlanForm::Legacy);
  auto bad = gpu::parseGemmPlanForm("fast");
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("KILN_GEMM_PLAN=fast: use heads"),
            std::string::npos)
      << bad.status().message();
}

TEST(CudaBlasPlan, RejectsShapesTheCompilerNeverEmits) {
  auto empty = planGemm(dense(1, 0, 4, 4, false, false, false, false));
  ASSERT_FALSE(empty.isOk());
  EXPECT_NE(empty.status().message().find("empty dimension"),
            std::string::npos);
  GemmParams s = headCases(2, 3, 5, 4)[0].s;
  s.batch = 7;
  auto odd = planGemm(s);
  ASSERT_FALSE(odd.isOk());
  EXPECT_NE(odd.status().message().find("not a multiple of heads 3"),
            std::string::npos);
  GemmParams shortLd = headCases(2, 3, 5, 4)[1].s;
  shortLd.outLayout.ld = 2; // rows of 4 elements
  auto bad = planGemm(shortLd);
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("row stride is shorter than its row"),
            std::string::npos)
      << bad.status().message();
}

TEST(CudaBlasPlan, CheckMatmulExplainsWhatCuBlasLtCannotDo) {
  MatmulOp op;
  op.shape = dense(1, 8, 8, 8, false, false, false, false);
  const std::tuple<DType, DType, bool> pairs[] = {
      {DType::F32, DType::F32, true},   {DType::F16, DType::F16, true},
      {DType::F16, DType::F32, true},   {DType::BF16, DType::BF16, true},
      {DType::BF16, DType::F32, true},  {DType::F32, DType::F16, false},
      {DType::F16, DType::BF16, false}, {DType::I32, DType::I32, false},
      {DType::F64, DType::F64, false}};
  for (auto [in, out, ok] : pairs) {
    op.inputType = in;
    op.outputType = out;
    Status s = checkMatmul(op);
    EXPECT_EQ(s.isOk(), ok)
        << program::dtypeName(in) << " -> " << program::dtypeName(out);
    if (!ok) {
      EXPECT_NE(s.message().find("cast the result in a separate kernel"),
                std::string::npos);
    }
  }
  op.inputType = op.outputType = DType::F32;
  op.activation = Activation::GeluAux;
  op.auxLd = 12;
  EXPECT_NE(checkMatmul(op).message().find("multiple of 8"), std::string::npos);
  op.auxLd = 0; // n rounded up to 8
  EXPECT_TRUE(checkMatmul(op).isOk());
  MatmulOp heads;
  heads.shape = headCases(2, 3, 5, 4)[0].s;
  heads.bias = true;
  EXPECT_NE(
      checkMatmul(heads).message().find("not supported with head layouts"),
      std::string::npos);
}

// --- GPU execution -----------------------------------------------------------

namespace {

uint16_t floatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint16_t sign = uint16_t((x >> 16) & 0x8000);
  double a = std::fabs(double(f));
  if (std::isnan(f))
    return 0x7e00;
  if (a >= 65520.0)
    return sign | 0x7c00;
  if (a < std::ldexp(1.0, -14)) // subnormal: multiples of 2^-24
    return sign | uint16_t(std::nearbyint(a * std::ldexp(1.0, 24)));
  int e;
  double f2 = std::frexp(a, &e); // a = f2 * 2^e, f2 in [0.5, 1)
  double q =
      std::nearbyint(f2 * 2048.0); // 11 significant bits, to nearest even
  if (q == 2048.0) {
    q = 1024.0;
    ++e;
  }
  int biased = e - 1 + 15;
  if (biased >= 31)
    return sign | 0x7c00;
  return sign | uint16_t(biased << 10) | uint16_t(int(q) - 1024);
}

float halfToFloat(uint16_t h) {
  int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v;
  if (e == 0)
    v = std::ldexp(double(m), -24);
  else if (e == 31)
    v = m ? std::numeric_limits<double>::quiet_NaN()
          : std::numeric_limits<double>::infinity();
  else
    v = std::ldexp(1.0 + m / 1024.0, e - 15);
  return float(sign ? -v : v);
}

uint16_t floatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if (std::isnan(f))
    return 0x7fc0;
  x += 0x7fff + ((x >> 16) & 1);
  return uint16_t(x >> 16);
}

float bf16ToFloat(uint16_t b) {
  uint32_t x = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

} // namespace

// The GPU tests' host conversions: every f16 value round-trips, ties round
// to even; bf16 rounds to nearest even.
TEST(CudaBlasHost, HalfAndBf16ConversionsRoundToNearestEven) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    uint16_t bits = uint16_t(h);
    if ((bits & 0x7c00) == 0x7c00 && (bits & 0x3ff))
      continue; // NaN
    float f = halfToFloat(bits);
    ASSERT_EQ(floatToHalf(f), bits) << std::hex << h;
    if ((bits & 0x7fff) >= 0x7bff)
      continue; // the next value up is infinity
    float next = halfToFloat(uint16_t(bits + 1));
    float mid = float((double(f) + double(next)) / 2); // exact in f32
    uint16_t even = (bits & 1) ? uint16_t(bits + 1) : bits;
    ASSERT_EQ(floatToHalf(mid), even) << std::hex << h;
  }
  EXPECT_EQ(floatToHalf(70000.0f), 0x7c00);
  EXPECT_EQ(floatToHalf(-1.0f), 0xbc00);
  EXPECT_EQ(floatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(floatToBf16(bf16ToFloat(0x3f81)), 0x3f81);
  // 1 + 2^-8 is halfway between bf16 1.0 (0x3f80, even) and 0x3f81.
  EXPECT_EQ(floatToBf16(1.0f + 1.0f / 256), 0x3f80);
  EXPECT_EQ(floatToBf16(1.0f + 3.0f / 256), 0x3f82);
}

namespace {

/// Host values of one dtype, and their bytes for the device.
struct HostTensor {
  DType type;
  std::vector<double> values; // exactly representable in `type`
  std::vector<unsigned char> bytes() const {
    std::vector<unsigned char> out(values.size() *
                                   size_t(program::dtypeBytes(type)));
    for (size_t i = 0; i < values.size(); ++i) {
      float f = float(values[i]);
      if (type == DType::F32) {
        std::memcpy(&out[i * 4], &f, 4);
      } else {
        uint16_t h = type == DType::F16 ? floatToHalf(f) : floatToBf16(f);
        std::memcpy(&out[i * 2], &h, 2);
      }
    }
    return out;
  }
  void fromBytes(const std::vector<unsigned char> &in) {
    for (size_t i = 0; i < values.size(); ++i) {
      if (type == DType::F32) {
        float f;
        std::memcpy(&f, &in[i * 4], 4);
        values[i] = f;
      } else {
        uint16_t h;
        std::memcpy(&h, &in[i * 2], 2);
        values[i] = type == DType::F16 ? halfToFloat(h) : bf16ToFloat(h);
      }
    }
  }
};

double roundTo(DType t, double v) {
  float f = float(v);
  if (t == DType::F16)
    return halfToFloat(floatToHalf(f));
  if (t == DType::BF16)
    return bf16ToFloat(floatToBf16(f));
  return f;
}

/// Unit roundoff of the output type: the relative error of storing a value.
double outputEps(DType t) {
  return t == DType::F16    ? std::ldexp(1.0, -11)
         : t == DType::BF16 ? std::ldexp(1.0, -8)
                            : 0.0;
}

double geluTanh(double x) {
  return 0.5 * x *
         (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
double geluErf(double x) {
  return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
}

/// The process's GPU for these tests: the driver, device 0's primary
/// context, a stream and a Blas; or why there is none. Leaked on purpose:
/// nothing CUDA runs from static destructors.
struct Gpu {
  const Driver *driver = nullptr;
  std::optional<PrimaryContext> context;
  DeviceInfo device;
  CUstream stream = nullptr;
  std::unique_ptr<Blas> blas;
  std::string unavailable; ///< non-empty: skip with this reason
  std::string broken;      ///< non-empty: a device exists but setup failed
};

Gpu &theGpu() {
  static Gpu *g = [] {
    auto *g = new Gpu();
    auto driver = Driver::load();
    if (!driver) {
      g->unavailable = driver.status().message();
      return g;
    }
    g->driver = *driver;
    auto devices = listDevices(**driver);
    if (!devices) {
      g->unavailable = devices.status().message();
      return g;
    }
    if (devices->empty()) {
      g->unavailable = "the NVIDIA driver reports no device";
      return g;
    }
    g->device = (*devices)[0];
    auto ctx = PrimaryContext::retain(**driver, 0);
    if (!ctx) {
      g->unavailable = "device 0: " + ctx.status().message();
      return g;
    }
    g->context.emplace(std::move(*ctx));
    if (Status s = KILN_CU_CHECK(
            **driver, cuStreamCreate(&g->stream, CU_STREAM_NON_BLOCKING));
        !s) {
      g->broken = s.message();
      return g;
    }
    auto blas = Blas::create(**driver);
    if (!blas) {
      g->broken = blas.status().message();
      return g;
    }
    g->blas = std::move(*blas);
    return g;
  }();
  return *g;
}

#define KILN_REQUIRE_GPU()                                                     \
  do {                                                                         \
    if (!theGpu().unavailable.empty())                                         \
      GTEST_SKIP() << "no CUDA device: " << theGpu().unavailable;              \
    ASSERT_TRUE(theGpu().broken.empty()) << theGpu().broken;                   \
  } while (0)

#define KILN_ASSERT_OK(expr)                                                   \
  do {                                                                         \
    ::kiln::Status kiln_s_ = (expr);                                           \
    ASSERT_TRUE(kiln_s_.isOk()) << kiln_s_.message();                          \
  } while (0)

/// Device memory for one test, freed at scope exit.
struct DeviceBuffer {
  CUdeviceptr ptr = 0;
  size_t bytes = 0;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer &) = delete;
  ~DeviceBuffer() {
    if (ptr)
      (void)theGpu().driver->cuMemFree(ptr);
  }
  Status allocate(size_t n) {
    bytes = std::max<size_t>(n, 1);
    return KILN_CU_CHECK(*theGpu().driver, cuMemAlloc(&ptr, bytes));
  }
  Status upload(const std::vector<unsigned char> &host) {
    if (Status s = allocate(host.size()); !s)
      return s;
    return KILN_CU_CHECK(*theGpu().driver,
                         cuMemcpyHtoD(ptr, host.data(), host.size()));
  }
};

struct GpuCase {
  GemmParams shape;
  DType in = DType::F32, out = DType::F32;
  bool accumulate = false, tf32 = false, bias = false;
  Activation activation = Activation::None;
  GemmPlanForm plan = GemmPlanForm::Heads;
};

std::string describe(const GpuCase &c) {
  return describe(c.shape) + " " + program::dtypeName(c.in) + "->" +
         program::dtypeName(c.out) + (c.accumulate ? " beta=1" : "") +
         (c.tf32 ? " tf32" : "") + (c.bias ? " +bias" : "") +
         (c.plan == GemmPlanForm::Legacy ? " legacy plan" : "") +
         (c.activation == Activation::Gelu      ? " gelu"
          : c.activation == Activation::GeluAux ? " gelu+aux"
          : c.activation == Activation::Relu    ? " relu"
                                                : "");
}

struct GeluStats {
  double sqTanh = 0, sqErf = 0;
  int64_t count = 0;
};

/// Runs one matmul on the GPU and checks every output element against the
/// double-precision reference computed from the same (rounded) inputs.
///
/// Tolerance per element, with S = sum |lhs * rhs| + |C| + |bias|:
///   1e-6 + eps_out * |want| + eps_acc * S (+ GELU terms)
///   (+ eps_out * |lhs * rhs| when accumulating into f16/bf16: see below)
/// eps_out: storing the result (0 for f32, 2^-11 f16, 2^-8 bf16). eps_acc:
/// f32 accumulation over k <= 256 terms in any order cuBLASLt picks
/// (2^-18 ~ 3.8e-6, above the typical sqrt(k) * 2^-24 and below anything an
/// indexing or layout mistake gives: those are O(S)); 2^-8 with TF32
/// (operands rounded or truncated to 10-bit mantissas: 2^-9 per product,
/// doubled for margin). GELU: the pre-activation's error
/// times |gelu'| <= 1.13, plus 2^-9 |x| for cuBLASLt's tanh (which may be a
/// hardware approximation). Elements outside the output matrices (head
/// layouts' gaps) must still hold the NaN poison.
void runCase(const GpuCase &c, GeluStats *gelu = nullptr) {
  Gpu &g = theGpu();
  const Driver &d = *g.driver;
  uint64_t seed = std::random_device{}();
  SCOPED_TRACE(describe(c) + " seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  const GemmParams &s = c.shape;
  Extents e = extents(s);

  HostTensor lhs{c.in, std::vector<double>(size_t(e.lhs))};
  HostTensor rhs{c.in, std::vector<double>(size_t(e.rhs))};
  for (double &v : lhs.values)
    v = roundTo(c.in, u(rng));
  for (double &v : rhs.values)
    v = roundTo(c.in, u(rng));
  HostTensor out{c.out, std::vector<double>(size_t(e.out), kNaN)};
  std::vector<char> inside(size_t(e.out), 0);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t j = 0; j < s.n; ++j)
        inside[size_t(outIndex(s, b, i, j))] = 1;
  if (c.accumulate)
    for (size_t i = 0; i < out.values.size(); ++i)
      if (inside[i])
        out.values[i] = roundTo(c.out, u(rng));
  std::vector<double> initial = out.values;
  HostTensor bias{c.out, std::vector<double>(size_t(s.n))};
  for (double &v : bias.values)
    v = roundTo(c.out, u(rng));
  int64_t auxLd = (s.n + 7) / 8 * 8;
  HostTensor aux{c.out,
                 std::vector<double>(size_t(s.batch * s.m * auxLd), kNaN)};

  DeviceBuffer dl, dr, dout, dbias, daux;
  KILN_ASSERT_OK(dl.upload(lhs.bytes()));
  KILN_ASSERT_OK(dr.upload(rhs.bytes()));
  KILN_ASSERT_OK(
      dout.upload(out.bytes())); // NaN outside (and inside unless beta=1)
  KILN_ASSERT_OK(dbias.upload(bias.bytes()));
  KILN_ASSERT_OK(daux.upload(aux.bytes()));
  if (!c.accumulate) // poison: every byte 0xFF is a NaN in f32, f16 and bf16
    KILN_ASSERT_OK(KILN_CU_CHECK(
        d, cuMemsetD8Async(dout.ptr, 0xFF, dout.bytes, g.stream)));

  MatmulOp op;
  op.shape = s;
  op.inputType = c.in;
  op.outputType = c.out;
  op.accumulate = c.accumulate;
  op.tf32 = c.tf32;
  op.bias = c.bias;
  op.activation = c.activation;
  op.plan = c.plan;
  MatmulArgs args;
  args.lhs = dl.ptr;
  args.rhs = dr.ptr;
  args.out = dout.ptr;
  args.bias = c.bias ? dbias.ptr : 0;
  args.aux = c.activation == Activation::GeluAux ? daux.ptr : 0;
  KILN_ASSERT_OK(g.blas->matmul(op, args, g.stream));
  KILN_ASSERT_OK(KILN_CU_CHECK(d, cuStreamSynchronize(g.stream)));

  std::vector<unsigned char> bytes(dout.bytes);
  KILN_ASSERT_OK(KILN_CU_CHECK(
      d, cuMemcpyDtoH(bytes.data(), dout.ptr,
                      out.values.size() * size_t(program::dtypeBytes(c.out)))));
  out.fromBytes(bytes);
  std::vector<unsigned char> auxBytes(daux.bytes);
  KILN_ASSERT_OK(
      KILN_CU_CHECK(d, cuMemcpyDtoH(auxBytes.data(), daux.ptr, daux.bytes)));
  aux.fromBytes(auxBytes);

  double epsOut = outputEps(c.out);
  double epsAcc =
      c.tf32 && c.in == DType::F32 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -18);
  bool act = c.activation != Activation::None;
  int64_t checked = 0, bad = 0;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t j = 0; j < s.n; ++j) {
        double acc = 0, mag = 0;
        for (int64_t kk = 0; kk < s.k; ++kk) {
          double p = lhs.values[size_t(lhsIndex(s, b, i, kk))] *
                     rhs.values[size_t(rhsIndex(s, b, kk, j))];
          acc += p;
          mag += std::fabs(p);
        }
        // Accumulating into an f16/bf16 output, cuBLASLt (13.0, H200) rounds
        // the product to the output type before adding C: errors of up to
        // 8 bf16 ulps of the sum where A*B and C cancel, with split-K
        // reductions in the output type excluded (Blas.cpp). So the product
        // carries its own output rounding: eps_out * |A*B|.
        double productRounding =
            c.accumulate && c.out != DType::F32 ? epsOut * std::fabs(acc) : 0.0;
        size_t o = size_t(outIndex(s, b, i, j));
        if (c.accumulate) {
          acc += initial[o];
          mag += std::fabs(initial[o]);
        }
        if (c.bias) {
          acc += bias.values[size_t(j)];
          mag += std::fabs(bias.values[size_t(j)]);
        }
        bool relu = c.activation == Activation::Relu;
        double want = relu ? std::max(acc, 0.0) : act ? geluTanh(acc) : acc;
        double tol = 1e-6 + epsOut * std::fabs(want) + productRounding +
                     epsAcc * mag * (act ? 1.13 : 1.0) +
                     (act ? std::ldexp(1.0, -9) * std::fabs(acc) : 0.0);
        double got = out.values[o];
        ++checked;
        if (!(std::fabs(got - want) <= tol) && ++bad <= 5)
          ADD_FAILURE() << "out[b=" << b << ", i=" << i << ", j=" << j
                        << "] = " << got << ", want " << want << " (tolerance "
                        << tol << ")";
        if (act && !relu && gelu) {
          gelu->sqTanh += (got - geluTanh(acc)) * (got - geluTanh(acc));
          gelu->sqErf += (got - geluErf(acc)) * (got - geluErf(acc));
          ++gelu->count;
        }
        if (c.activation == Activation::GeluAux) {
          double pre = aux.values[size_t((b * s.m + i) * auxLd + j)];
          double tolPre = 1e-6 + epsOut * std::fabs(acc) + epsAcc * mag;
          if (!(std::fabs(pre - acc) <= tolPre) && ++bad <= 5)
            ADD_FAILURE() << "aux[b=" << b << ", i=" << i << ", j=" << j
                          << "] = " << pre << ", want the pre-activation "
                          << acc << " (tolerance " << tolPre << ")";
        }
      }
  for (size_t i = 0; i < inside.size(); ++i)
    if (!inside[i] && !std::isnan(out.values[i]) && ++bad <= 5)
      ADD_FAILURE() << "element " << i
                    << " outside the output matrices was written ("
                    << out.values[i] << ")";
  EXPECT_EQ(bad, 0) << bad << " wrong elements";
  EXPECT_EQ(checked, s.batch * s.m * s.n); // never passes without checking
}

const std::pair<DType, DType> kDtypes[] = {{DType::F32, DType::F32},
                                           {DType::F16, DType::F16},
                                           {DType::F16, DType::F32},
                                           {DType::BF16, DType::BF16},
                                           {DType::BF16, DType::F32}};

} // namespace

// (e) Without a driver, handle creation is a Status, not a crash. With a
// device, it succeeds once a context is current (the shared one below, which
// stays alive: releasing the last retain of the primary context would pull
// it from under cuBLASLt's runtime in later tests of this process).
TEST(CudaBlasHost, Tf32RoundsToNearestTiesAway) {
  // TF32 keeps 10 mantissa bits: around 1 its unit is 2^-10.
  const float u = std::ldexp(1.0f, -10);
  EXPECT_EQ(kiln::roundToTf32(1.0f), 1.0f);
  EXPECT_EQ(kiln::roundToTf32(1.0f + u), 1.0f + u);               // representable
  EXPECT_EQ(kiln::roundToTf32(1.0f + u / 4), 1.0f);               // below half
  EXPECT_EQ(kiln::roundToTf32(1.0f + u / 2), 1.0f + u);           // a tie: away from zero
  EXPECT_EQ(kiln::roundToTf32(-(1.0f + u / 2)), -(1.0f + u));     // on both sides
  EXPECT_EQ(kiln::roundToTf32(1.0f + 3 * u / 4), 1.0f + u);       // above half
  EXPECT_EQ(kiln::roundToTf32(1.0f + u + u / 2), 1.0f + 2 * u);   // odd tie: still away
  // Subnormals keep 10 bits too: 2^-130 is exact, 2^-140 (under half of
  // TF32's smallest subnormal, 2^-136) becomes 0.
  EXPECT_EQ(kiln::roundToTf32(std::ldexp(1.0f, -130)), std::ldexp(1.0f, -130));
  EXPECT_EQ(kiln::roundToTf32(std::ldexp(1.0f, -140)), 0.0f);
  EXPECT_TRUE(std::isinf(kiln::roundToTf32(INFINITY)));
  EXPECT_TRUE(std::isnan(kiln::roundToTf32(NAN)));
  EXPECT_TRUE(std::isinf(kiln::roundToTf32(3.4028235e38f))); // rounds past the largest TF32
  // Every result has its 13 low mantissa bits clear.
  for (float x : {0.1f, 3.14159f, -2.71828f, 1e-20f, 6.02e23f}) {
    float r = kiln::roundToTf32(x);
    uint32_t bits;
    std::memcpy(&bits, &r, sizeof bits);
    EXPECT_EQ(bits & 0x1fffu, 0u) << x;
    EXPECT_LE(std::fabs(r - x), std::fabs(x) * std::ldexp(1.0, -11)) << x;
  }
}

TEST(CudaBlas, HandleCreationFailsCleanlyWithoutAGpu) {
  auto driver = Driver::load();
  if (!driver) {
    auto blas = Blas::create();
    ASSERT_FALSE(blas.isOk()) << "cuBLASLt started without a driver";
    const std::string &m = blas.status().message();
    EXPECT_NE(m.find("could not start (cublasLtCreate: CUBLAS_STATUS_"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("--device cpu"), std::string::npos) << m;
    EXPECT_EQ(blas.status().exitCode(), 1);
    std::printf("Blas::create() here: %s\n", m.c_str());
    return;
  }
  KILN_REQUIRE_GPU();
  auto blas = Blas::create(*theGpu().driver, 1 << 20);
  ASSERT_TRUE(blas.isOk()) << blas.status().message();
  EXPECT_EQ((*blas)->cachedPlans(), 0u);
}

TEST(CudaBlasGpu, TransposesBatchModesAndDtypes) {
  KILN_REQUIRE_GPU();
  for (auto [in, out] : kDtypes)
    for (const GemmParams &s : denseCases(3, 24, 40, 64)) {
      GpuCase c;
      c.shape = s;
      c.in = in;
      c.out = out;
      runCase(c);
    }
}

TEST(CudaBlasGpu, OddSizesAndAlignments) {
  KILN_REQUIRE_GPU();
  for (auto [in, out] :
       {std::pair{DType::F32, DType::F32}, std::pair{DType::F16, DType::F16},
        std::pair{DType::BF16, DType::F32}})
    for (const GemmParams &s : denseCases(3, 7, 13, 9)) {
      GpuCase c;
      c.shape = s;
      c.in = in;
      c.out = out;
      runCase(c);
    }
}

TEST(CudaBlasGpu, Epilogues) {
  KILN_REQUIRE_GPU();
  GeluStats stats;
  const std::pair<DType, DType> dtypes[] = {{DType::F32, DType::F32},
                                            {DType::BF16, DType::BF16},
                                            {DType::F16, DType::F32}};
  for (auto [in, out] : dtypes)
    for (const GemmParams &s :
         {dense(4, 16, 48, 64, false, false, true, false),  // folded
          dense(4, 16, 48, 64, false, true, true, false),   // folded, W^T
          dense(3, 16, 48, 64, false, false, true, true),   // batched
          dense(1, 32, 40, 64, true, false, false, false)}) // lhs^T
      for (bool bias : {false, true})
        for (Activation a :
             {Activation::None, Activation::Relu, Activation::Gelu, Activation::GeluAux}) {
          if (!bias && a == Activation::None)
            continue;
          GpuCase c;
          c.shape = s;
          c.in = in;
          c.out = out;
          c.bias = bias;
          c.activation = a;
          runCase(c, out == DType::F32 ? &stats : nullptr);
        }
  // Which GELU cuBLASLt computes (tanh approximation expected), for the
  // record: the tolerance above accepts both.
  ASSERT_GT(stats.count, 0);
  std::printf("cuBLASLt GELU vs tanh form: rms %.3g; vs erf form: rms %.3g "
              "(%lld values)\n",
              std::sqrt(stats.sqTanh / double(stats.count)),
              std::sqrt(stats.sqErf / double(stats.count)),
              (long long)stats.count);
}

TEST(CudaBlasGpu, AccumulateIntoOutput) {
  KILN_REQUIRE_GPU();
  for (auto [in, out] :
       {std::pair{DType::F32, DType::F32}, std::pair{DType::BF16, DType::BF16},
        std::pair{DType::F16, DType::F32}})
    for (const GemmParams &s : {dense(3, 24, 40, 64, false, false, true, false),
                                dense(3, 24, 40, 64, true, false, true, true),
                                dense(3, 24, 40, 64, true, true, false, true)})
      for (bool bias : {false, true}) {
        GpuCase c;
        c.shape = s;
        c.in = in;
        c.out = out;
        c.accumulate = true;
        c.bias = bias;
        runCase(c);
      }
}

TEST(CudaBlasGpu, HeadLayouts) {
  KILN_REQUIRE_GPU();
  for (auto [in, out] :
       {std::pair{DType::F32, DType::F32}, std::pair{DType::BF16, DType::BF16},
        std::pair{DType::F16, DType::F16}})
    for (auto [b, h] : {std::pair{3, 4}, std::pair{5, 2}})
      for (const HeadCase &hc : headCases(b, h, 24, 16))
        for (GemmPlanForm form : {GemmPlanForm::Heads, GemmPlanForm::Legacy}) {
          SCOPED_TRACE(hc.name);
          GpuCase c;
          c.shape = hc.s;
          c.in = in;
          c.out = out;
          c.plan = form;
          runCase(c);
          c.accumulate = true;
          runCase(c);
        }
}

TEST(CudaBlasGpu, Tf32IsOptIn) {
  KILN_REQUIRE_GPU();
  for (const GemmParams &s : denseCases(2, 64, 64, 128)) {
    GpuCase c;
    c.shape = s;
    c.tf32 = true;
    runCase(c);
  }
}

TEST(CudaBlasGpu, LargerShapeOnTensorCores) {
  KILN_REQUIRE_GPU();
  GpuCase c;
  c.shape = dense(2, 256, 384, 256, false, true, true, false); // x W^T, folded
  c.in = DType::BF16;
  c.out = DType::BF16;
  c.bias = true;
  c.activation = Activation::GeluAux;
  runCase(c);
  c.shape = dense(4, 128, 256, 192, true, false, true, true);
  c.in = DType::F16;
  c.out = DType::F32;
  c.bias = false;
  c.activation = Activation::None;
  runCase(c);
}

TEST(CudaBlasGpu, PlansAreCachedPerShape) {
  KILN_REQUIRE_GPU();
  GpuCase c;
  c.shape = dense(2, 32, 32, 32, false, false, true, true);
  runCase(c);
  size_t plans = theGpu().blas->cachedPlans();
  runCase(c);
  EXPECT_EQ(theGpu().blas->cachedPlans(), plans)
      << "the same shape built a second plan";
  c.shape.k = 48;
  runCase(c);
  EXPECT_EQ(theGpu().blas->cachedPlans(), plans + 1);
}
