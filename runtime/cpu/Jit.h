//===- Jit.h - CPU kernels: LLVM bitcode -> host code through ORC -*- C++ -*-===//
//
// The CPU backend's only LLVM dependency (the runtime never links MLIR).
// load() takes the artifact's kernel bitcode, targets the host (triple, data
// layout, CPU name and features on every function, so the loop vectorizer
// sees AVX2/AVX-512 where the machine has them), runs LLVM's O3 pipeline,
// emits an object file and links it into an ORC LLJIT. Objects are cached on
// disk by a content hash (bitcode, host CPU and features, LLVM version), so
// the second run of the same artifact skips code generation; a damaged cache
// entry (CRC mismatch) is recompiled, never loaded.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CPU_JIT_H
#define KILN_RUNTIME_CPU_JIT_H

#include "runtime/core/Status.h"

#include <cstdint>
#include <memory>
#include <string>

namespace kiln::cpu {

/// A kernel entry point: buffer pointers, and the piece to compute.
using KernelFn = void (*)(void **buffers, int64_t piece);

struct JitOptions {
  std::string cacheDir; ///< "" disables the disk cache
};

struct JitStats {
  bool cacheHit = false;
  double compileSeconds = 0; ///< optimisation + codegen (0 on a cache hit)
  std::string cpu;           ///< host CPU name LLVM detected
  std::string cachePath;
};

class KernelLibrary {
public:
  static Expected<std::unique_ptr<KernelLibrary>>
  load(const std::string &bitcode, const std::string &origin,
       const JitOptions &options, JitStats *stats = nullptr);
  ~KernelLibrary();
  /// The packed entry point `symbol`, or nullptr with `error` set (an
  /// undefined symbol, or a kernel calling a function the process lacks).
  KernelFn lookup(const std::string &symbol, std::string *error = nullptr);

private:
  KernelLibrary();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else ~/.cache/kiln.
std::string defaultCacheDir();

} // namespace kiln::cpu

#endif // KILN_RUNTIME_CPU_JIT_H
