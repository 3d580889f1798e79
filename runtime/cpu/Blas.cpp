//===- Blas.cpp - Loading MKL, or using OpenBLAS --------------------------===//
#include "runtime/cpu/Blas.h"

#ifdef KILN_HAVE_OPENBLAS
#include <cblas.h>
#endif
#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>
#include <mutex>
#include <vector>

#ifdef KILN_HAVE_OPENBLAS
extern "C" char *openblas_get_corename(void);
extern "C" void openblas_set_num_threads(int);
#endif

namespace kiln::cpu {

namespace {

} // namespace

void openblasSgemm(int layout, int ta, int tb, int m, int n, int k, float alpha, const float *a,
                   int lda, const float *b, int ldb, float beta, float *c, int ldc) {
#ifdef KILN_HAVE_OPENBLAS
  cblas_sgemm(CBLAS_ORDER(layout), CBLAS_TRANSPOSE(ta), CBLAS_TRANSPOSE(tb), m, n, k, alpha, a,
              lda, b, ldb, beta, c, ldc);
#else
  // Row-major only (Kiln's calls): C = alpha op(A) op(B) + beta C, each
  // element a float32 sum in k order.
  (void)layout;
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      float acc = 0;
      for (int q = 0; q < k; ++q)
        acc += (ta == kCblasTrans ? a[q * lda + i] : a[i * lda + q]) *
               (tb == kCblasTrans ? b[j * ldb + q] : b[q * ldb + j]);
      c[i * ldc + j] = alpha * acc + (beta == 0 ? 0.0f : beta * c[i * ldc + j]);
    }
#endif
}

namespace {

Blas openblas() {
  Blas b;
  b.sgemm = openblasSgemm;
#ifdef KILN_HAVE_OPENBLAS
  b.name = fmt::format("OpenBLAS ({})", openblas_get_corename());
  openblas_set_num_threads(1);
#else
  b.name = "portable loops (no BLAS library at build time)";
#endif
  return b;
}

/// Loads libmkl_rt from `candidates` (the first that opens) with the
/// sequential threading layer; the error lists every place tried.
Expected<Blas> loadMkl(const std::vector<std::string> &candidates) {
  std::string tried;
  for (const std::string &c : candidates) {
    void *h = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char *why = dlerror();
      tried += fmt::format("\n  {}: {}", c, why ? why : "cannot be opened");
      continue;
    }
    auto sgemm = reinterpret_cast<Blas::Sgemm>(dlsym(h, "cblas_sgemm"));
    auto layer = reinterpret_cast<int (*)(int)>(dlsym(h, "MKL_Set_Threading_Layer"));
    auto version = reinterpret_cast<void (*)(char *, int)>(dlsym(h, "MKL_Get_Version_String"));
    if (!sgemm || !layer) {
      tried += fmt::format("\n  {}: has no cblas_sgemm or MKL_Set_Threading_Layer (not libmkl_rt)", c);
      dlclose(h);
      continue;
    }
    // MKL_THREADING_SEQUENTIAL: no OpenMP threads of MKL's own competing
    // with Kiln's pool (each GEMM part is one single-threaded call).
    if (layer(1) < 0) {
      tried += fmt::format("\n  {}: the sequential threading layer is not available", c);
      dlclose(h);
      continue;
    }
    Blas b;
    b.sgemm = sgemm;
    b.mkl = true;
    // Half-precision GEMMs (oneMKL 2020+; absent from older libraries).
    b.gemmBf16 = reinterpret_cast<Blas::GemmHalf>(dlsym(h, "cblas_gemm_bf16bf16f32"));
    b.gemmF16 = reinterpret_cast<Blas::GemmHalf>(dlsym(h, "cblas_gemm_f16f16f32"));
    char v[256] = {0};
    if (version)
      version(v, sizeof v - 1);
    std::string text = v[0] ? v : "Intel oneMKL";
    // "Intel(R) oneAPI Math Kernel Library Version 2026.2-Product Build ..."
    if (size_t p = text.find(" Version "); p != std::string::npos) {
      size_t e = text.find_first_of("- ", p + 9);
      text = "Intel oneMKL " + text.substr(p + 9, e == std::string::npos ? e : e - p - 9);
    }
    b.name = text + " (sequential)";
    Dl_info info;
    b.path = dladdr(reinterpret_cast<void *>(sgemm), &info) && info.dli_fname ? info.dli_fname : c;
    return b;
  }
  return Status::error("Intel MKL could not be loaded; tried:" + tried);
}

std::vector<std::string> mklCandidates() {
  std::vector<std::string> c = {"libmkl_rt.so.3", "libmkl_rt.so.2", "libmkl_rt.so"};
#ifdef KILN_MKL_HINT_DIR
  // Where PyPI's `mkl` put it for the Python that configured the build.
  for (const char *so : {"libmkl_rt.so.3", "libmkl_rt.so.2"})
    c.push_back(std::string(KILN_MKL_HINT_DIR) + "/" + so);
#endif
  return c;
}

} // namespace

Expected<Blas> loadBlas(const std::string &choice) {
  std::string want = choice.empty() ? "auto" : choice;
  if (want == "openblas")
    return openblas();
  if (want == "auto") {
    auto m = loadMkl(mklCandidates());
    if (m)
      return m;
    Blas b = openblas();
    b.mklMissing = m.status().message();
    return b;
  }
  if (want == "mkl") {
    auto m = loadMkl(mklCandidates());
    if (!m)
      return Status::error(m.status().message() +
                           "\nKILN_BLAS=mkl: install it (python3 -m pip install mkl), put its "
                           "lib folder on LD_LIBRARY_PATH, or set KILN_BLAS=openblas");
    return m;
  }
  if (want.find('/') != std::string::npos) {
    auto m = loadMkl({want});
    if (!m)
      return Status::error(m.status().message() + "\nKILN_BLAS names a file that is not a "
                                                  "loadable libmkl_rt; fix the path or unset it");
    return m;
  }
  return Status::error(fmt::format("KILN_BLAS={} is not a BLAS kiln-run knows: use auto, mkl, "
                                   "openblas or the path of libmkl_rt.so",
                                   want));
}

Blas::Sgemm sgemm() {
  static Blas::Sgemm f = [] {
    auto b = blas();
    return b ? (*b)->sgemm : openblasSgemm;
  }();
  return f;
}

Expected<const Blas *> blas() {
  static std::once_flag once;
  static Expected<Blas> *chosen = nullptr;
  std::call_once(once, [] {
    const char *env = std::getenv("KILN_BLAS");
    chosen = new Expected<Blas>(loadBlas(env ? env : ""));
  });
  if (!*chosen)
    return chosen->status();
  return &**chosen;
}

} // namespace kiln::cpu
