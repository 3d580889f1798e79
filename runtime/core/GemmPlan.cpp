//===- GemmPlan.cpp - The library calls that compute one GEMM step --------===//
#include "runtime/core/GemmPlan.h"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>

namespace kiln::gpu {

using program::GemmParams;
using program::MatrixLayout;

const char *gemmPlanFormName(GemmPlanForm f) {
  return f == GemmPlanForm::Legacy ? "legacy" : "heads";
}

Expected<GemmPlanForm> parseGemmPlanForm(const char *value) {
  if (!value || !*value || std::strcmp(value, "heads") == 0)
    return GemmPlanForm::Heads;
  if (std::strcmp(value, "legacy") == 0)
    return GemmPlanForm::Legacy;
  return Status::error(fmt::format(
      "KILN_GEMM_PLAN={}: use heads (the default: a head GEMM in at most "
      "min(heads, batch) library calls) or legacy (batch calls of `heads` "
      "matrices, for timing against the default)",
      value));
}

Expected<GemmPlanForm> gemmPlanFormFromEnv() {
  return parseGemmPlanForm(std::getenv("KILN_GEMM_PLAN"));
}

Expected<bool> allTf32FromEnv() {
  const char *v = std::getenv("KILN_CUDA_TF32");
  if (!v || !*v || std::string(v) == "0")
    return false;
  if (std::string(v) == "1")
    return true;
  return Status::error(fmt::format(
      "KILN_CUDA_TF32={}: use 1 (every f32 GEMM in TF32) or 0 (as the artifact says)", v));
}

std::string gemmShapeText(const GemmParams &s) {
  std::string text =
      fmt::format("{}[{}x{}]{} x {}[{}x{}]{}",
                  s.lhsBatched ? fmt::format("{} x ", s.batch) : "",
                  s.transposeLhs ? s.k : s.m, s.transposeLhs ? s.m : s.k,
                  s.transposeLhs ? "^T" : "",
                  s.rhsBatched ? fmt::format("{} x ", s.batch) : "",
                  s.transposeRhs ? s.n : s.k, s.transposeRhs ? s.k : s.n,
                  s.transposeRhs ? "^T" : "");
  if (s.heads)
    text += fmt::format(" (heads {})", s.heads);
  return text;
}

bool foldsBatch(const GemmParams &s) {
  return s.lhsBatched && !s.rhsBatched && !s.transposeLhs && s.heads == 0;
}

namespace {

/// Head layouts, GemmPlanForm::Legacy: batch/heads calls of `heads`
/// matrices `inner` apart, call o at o * outer; one call when every
/// batched layout has outer == heads * inner (or there is one group).
void planLegacyHeads(const GemmParams &s, LtGemm &g) {
  auto uniform = [&](bool batched, const MatrixLayout &l) {
    return !batched || l.outer == s.heads * l.inner;
  };
  bool one = s.batch == s.heads ||
             (uniform(s.lhsBatched, s.lhsLayout) &&
              uniform(s.rhsBatched, s.rhsLayout) && uniform(true, s.outLayout));
  g.batch = one ? s.batch : s.heads;
  g.strideA = s.rhsBatched ? s.rhsLayout.inner : 0;
  g.strideB = s.lhsBatched ? s.lhsLayout.inner : 0;
  g.strideC = s.outLayout.inner;
  int64_t groups = one ? 1 : s.batch / s.heads;
  for (int64_t o = 0; o < groups; ++o) {
    g.offsetA.push_back(s.rhsBatched ? o * s.rhsLayout.outer : 0);
    g.offsetB.push_back(s.lhsBatched ? o * s.lhsLayout.outer : 0);
    g.offsetC.push_back(o * s.outLayout.outer);
  }
}

/// Head layouts, GemmPlanForm::Heads (the file comment of GemmPlan.h).
void planHeads(const GemmParams &s, LtGemm &g) {
  const int64_t heads = s.heads, entries = s.batch / s.heads;
  // The one stride that walks all B*H matrices of a layout in batch order,
  // or -1: matrix o*H + h at (o*H + h) * stride == o*outer + h*inner for
  // every o < B, h < H.
  auto single = [&](const MatrixLayout &l) -> int64_t {
    if (heads == 1)
      return l.outer;
    if (entries == 1 || l.outer == heads * l.inner)
      return l.inner;
    return -1;
  };
  int64_t sa = s.rhsBatched ? single(s.rhsLayout) : 0;
  int64_t sb = s.lhsBatched ? single(s.lhsLayout) : 0;
  int64_t sc = single(s.outLayout);
  if (sa >= 0 && sb >= 0 && sc >= 0) { // one strided-batched call
    g.batch = s.batch;
    g.strideA = sa;
    g.strideB = sb;
    g.strideC = sc;
    g.offsetA = g.offsetB = g.offsetC = {0};
    return;
  }
  // A loop over the smaller of the two batch dimensions; each call walks
  // the larger one with a single stride.
  bool perHead = heads <= entries;
  auto step = [&](bool batched, const MatrixLayout &l) -> int64_t {
    return !batched ? 0 : perHead ? l.outer : l.inner;
  };
  auto start = [&](bool batched, const MatrixLayout &l, int64_t c) -> int64_t {
    return !batched ? 0 : perHead ? c * l.inner : c * l.outer;
  };
  g.batch = perHead ? entries : heads;
  g.strideA = step(s.rhsBatched, s.rhsLayout);
  g.strideB = step(s.lhsBatched, s.lhsLayout);
  g.strideC = step(true, s.outLayout);
  for (int64_t c = 0, n = perHead ? heads : entries; c < n; ++c) {
    g.offsetA.push_back(start(s.rhsBatched, s.rhsLayout, c));
    g.offsetB.push_back(start(s.lhsBatched, s.lhsLayout, c));
    g.offsetC.push_back(start(true, s.outLayout, c));
  }
}

} // namespace

Expected<LtGemm> planGemm(const GemmParams &s, GemmPlanForm form) {
  if (s.batch <= 0 || s.m <= 0 || s.n <= 0 || s.k <= 0)
    return Status::internal(fmt::format(
        "matmul {} has an empty dimension (batch {}, m {}, n {}, k {}); the "
        "compiler must not emit empty GEMMs",
        gemmShapeText(s), s.batch, s.m, s.n, s.k));
  if (s.heads < 0 || (s.heads && s.batch % s.heads))
    return Status::internal(
        fmt::format("matmul {}: batch {} is not a multiple of heads {}",
                    gemmShapeText(s), s.batch, s.heads));
  // Kiln's row strides, as on the CPU (runtime/cpu/Gemm.cpp).
  int64_t ldLhs = s.heads ? s.lhsLayout.ld : (s.transposeLhs ? s.m : s.k);
  int64_t ldRhs = s.heads ? s.rhsLayout.ld : (s.transposeRhs ? s.k : s.n);
  int64_t ldOut = s.heads ? s.outLayout.ld : s.n;

  LtGemm g;
  g.transA = s.transposeRhs;
  g.transB = s.transposeLhs;
  g.m = s.n;
  g.k = s.k;
  g.lda = ldRhs;
  g.ldb = ldLhs;
  g.ldc = ldOut;
  if (foldsBatch(s)) {
    g.n = s.batch * s.m;
    g.offsetA = g.offsetB = g.offsetC = {0};
  } else if (s.heads == 0) {
    g.n = s.m;
    g.batch = s.batch;
    g.strideA = s.rhsBatched ? s.k * s.n : 0;
    g.strideB = s.lhsBatched ? s.m * s.k : 0;
    g.strideC = s.m * s.n;
    g.offsetA = g.offsetB = g.offsetC = {0};
  } else {
    g.n = s.m;
    if (form == GemmPlanForm::Legacy)
      planLegacyHeads(s, g);
    else
      planHeads(s, g);
  }
  if (g.lda < g.rowsA() || g.ldb < g.rowsB() || g.ldc < g.m)
    return Status::internal(fmt::format(
        "matmul {}: a row stride is shorter than its row (lhs ld {} for {} "
        "columns, rhs ld {} for {}, out ld {} for {})",
        gemmShapeText(s), g.ldb, g.rowsB(), g.lda, g.rowsA(), g.ldc, g.m));
  if (g.batch > 1 && g.strideC <= 0)
    return Status::internal(fmt::format(
        "matmul {}: the output matrices of the batch overlap (stride {})",
        gemmShapeText(s), g.strideC));
  return g;
}

} // namespace kiln::gpu
