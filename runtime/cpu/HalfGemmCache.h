//===- HalfGemmCache.h - Which bf16/f16 GEMM, per shape ----------*- C++
//-*-===//
//
// A bf16/f16 GEMM on the CPU runs one of three ways (runtime/cpu/Gemm.h,
// HalfGemm): widened to float32 for sgemm, the BLAS library's own
// half-precision GEMM, or (bf16 on CPUs with AVX512-BF16) Kiln's own on the
// CPU's dot-product instruction. None wins everywhere (docs/runtime.md,
// "Half-precision GEMMs"), so the executor times those that exist at a
// shape's first use and keeps the fastest; this cache remembers the choice
// on disk, next to the compiled kernels (KILN_CACHE_DIR), so later runs
// neither re-measure nor change their bits from run to run.
//
// The file (half-gemm-v2.txt) holds one line per choice:
//   <machine> <shape> <widen|library|dpbf16> <widen us> <library us>
//   <dpbf16 us> <check>
// where <machine> names the CPU and the BLAS library, <shape> is
// halfGemmKey(), and <check> an FNV-1a hash of the rest of the line. A line
// that does not parse or check is skipped with a warning (and rewritten by
// the next measurement), never an error.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CPU_HALFGEMMCACHE_H
#define KILN_RUNTIME_CPU_HALFGEMMCACHE_H

#include "runtime/cpu/Gemm.h"

#include <map>
#include <mutex>
#include <optional>
#include <string>

namespace kiln::cpu {

/// The shape, every field of the GEMM that can change its speed:
/// "bf16:1x768x512x128:NN:10:0:0.0.0/0.0.0/0.0.0". Not the thread count:
/// one choice per shape and machine, so the bits do not depend on --threads
/// (the choice is measured with the threads of the run that made it).
std::string halfGemmKey(const MatmulShape &s);

/// The CPU model (/proc/cpuinfo) and the BLAS library, without spaces.
std::string halfGemmMachine();

struct HalfGemmChoice {
  HalfGemm method = HalfGemm::Widen;
  double widenSeconds = 0, librarySeconds = 0,
         dotSeconds = 0; ///< as measured (0: not measured)
};

class HalfGemmCache {
public:
  /// Reads `path` ("" = memory only) for `machine`'s lines.
  HalfGemmCache(std::string path, std::string machine);
  std::optional<HalfGemmChoice> lookup(const std::string &key) const;
  /// Records a choice and rewrites the file (atomically: temp + rename;
  /// lines of other machines are kept).
  void remember(const std::string &key, const HalfGemmChoice &c);
  /// Lines skipped as damaged when the file was read.
  int skipped() const { return skipped_; }
  const std::string &path() const { return path_; }

private:
  std::string path_, machine_;
  mutable std::mutex mu_;
  std::map<std::string, HalfGemmChoice> mine_; ///< this machine's choices
  std::map<std::string, std::string>
      others_; ///< other machines' lines, kept as they are
  int skipped_ = 0;
};

} // namespace kiln::cpu

#endif // KILN_RUNTIME_CPU_HALFGEMMCACHE_H
