//===- Blas.h - The BLAS library behind the CPU backend's GEMMs -*- C++ -*-===//
//
// The CPU backend's float32 GEMMs are library calls (runtime/cpu/Gemm.h),
// always single-threaded: Kiln's thread pool runs the parts of each GEMM.
// Two libraries can serve them, chosen once per process:
//
//   - Intel oneMKL (libmkl_rt, sequential threading layer), loaded at run
//     time when it is installed (scripts/setup.sh installs PyPI's `mkl`);
//     on the development machine it runs the GPT's GEMMs ~1.5x faster than
//     OpenBLAS (docs/runtime.md, "BLAS");
//   - OpenBLAS, linked: always there.
//
// KILN_BLAS picks: "auto" (default: MKL when it loads, else OpenBLAS),
// "mkl" (an error when MKL cannot be loaded), "openblas", or the path of a
// libmkl_rt shared library.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CPU_BLAS_H
#define KILN_RUNTIME_CPU_BLAS_H

#include "runtime/core/Status.h"

#include <cstdint>
#include <string>

namespace kiln::cpu {

struct Blas {
  /// Row-major cblas_sgemm (CBLAS's enum values, the same in both libraries).
  using Sgemm = void (*)(int layout, int transA, int transB, int m, int n, int k, float alpha,
                         const float *a, int lda, const float *b, int ldb, float beta, float *c,
                         int ldc);
  Sgemm sgemm = nullptr;
  /// Row-major bf16 x bf16 -> f32 and f16 x f16 -> f32 GEMMs with float32
  /// accumulation (oneMKL's cblas_gemm_bf16bf16f32, cblas_gemm_f16f16f32;
  /// the operands are the 16-bit patterns); null where the library has none.
  using GemmHalf = void (*)(int layout, int transA, int transB, int m, int n, int k, float alpha,
                            const uint16_t *a, int lda, const uint16_t *b, int ldb, float beta,
                            float *c, int ldc);
  GemmHalf gemmBf16 = nullptr, gemmF16 = nullptr;
  bool mkl = false;
  std::string name; ///< "Intel oneMKL 2026.0.2 (sequential)", "OpenBLAS (SkylakeX)"
  std::string path; ///< the shared library MKL was loaded from ("" for OpenBLAS)
  /// Why MKL is not in use when KILN_BLAS=auto ("" when it is, or when
  /// OpenBLAS was asked for).
  std::string mklMissing;
};

/// Loads the library `choice` names (KILN_BLAS's values; "" is "auto").
Expected<Blas> loadBlas(const std::string &choice);

/// The library chosen by KILN_BLAS, loaded on first use (thread-safe). An
/// error only when KILN_BLAS names MKL (or a path) and it cannot be loaded,
/// or names no known library.
Expected<const Blas *> blas();

/// blas()'s sgemm, or OpenBLAS's where blas() fails (Executor::create
/// reports that failure; other callers, such as the CUDA emulator, carry on).
Blas::Sgemm sgemm();
/// OpenBLAS's cblas_sgemm.
void openblasSgemm(int layout, int transA, int transB, int m, int n, int k, float alpha,
                   const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);

enum { kCblasRowMajor = 101, kCblasNoTrans = 111, kCblasTrans = 112 };

} // namespace kiln::cpu

#endif // KILN_RUNTIME_CPU_BLAS_H
