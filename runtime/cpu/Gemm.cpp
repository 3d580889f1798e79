//===- Gemm.cpp - kiln.matmul on the CPU through BLAS ---------------------===//
#include "runtime/cpu/Gemm.h"

#include <cblas.h>

namespace kiln::cpu {

void matmul(const MatmulShape &s, const float *lhs, const float *rhs, float *out) {
  // A weight shared by the whole batch with an untransposed, batched lhs is
  // one large GEMM: [batch*m, k] x [k, n].
  if (s.lhsBatched && !s.rhsBatched && !s.transposeLhs) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans,
                s.transposeRhs ? CblasTrans : CblasNoTrans, int(s.batch * s.m),
                int(s.n), int(s.k), 1.0f, lhs, int(s.k), rhs,
                s.transposeRhs ? int(s.k) : int(s.n), 0.0f, out, int(s.n));
    return;
  }
  for (int64_t b = 0; b < s.batch; ++b) {
    const float *a = lhs + (s.lhsBatched ? b * s.m * s.k : 0);
    const float *c = rhs + (s.rhsBatched ? b * s.k * s.n : 0);
    cblas_sgemm(CblasRowMajor, s.transposeLhs ? CblasTrans : CblasNoTrans,
                s.transposeRhs ? CblasTrans : CblasNoTrans, int(s.m), int(s.n),
                int(s.k), 1.0f, a, s.transposeLhs ? int(s.m) : int(s.k), c,
                s.transposeRhs ? int(s.k) : int(s.n), 0.0f, out + b * s.m * s.n,
                int(s.n));
  }
}

} // namespace kiln::cpu
