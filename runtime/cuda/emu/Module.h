//===- Module.h - Generated CUDA C++ compiled for the emulator --*- C++ -*-===//
//
// Module::compile turns a CUDA C++ source written against kiln_cuda.h into a
// shared object for the CPU emulator: it pastes the prelude (unless the
// source already starts with it — the include guard makes a second copy
// empty), adds `#line 1 "<name>.cu"` so that diagnostics and the emulator's
// messages use the kernel source's line numbers, writes the file to the
// cache directory, runs the host C++ compiler and dlopens the result.
// Objects are cached by a hash of the full source, the compiler's identity
// (its --version text) and the flags; a hit is checked against the stored
// source before it is used.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CUDA_EMU_MODULE_H
#define KILN_RUNTIME_CUDA_EMU_MODULE_H

#include "runtime/core/Status.h"
#include "runtime/cuda/emu/Emulator.h"

#include <memory>
#include <string>
#include <vector>

namespace kiln::cuda::emu {

struct CompileOptions {
  /// The host compiler command; "": $CXX, else "c++". Words split at spaces
  /// (so "ccache g++" works).
  std::string compiler;
  /// Optimisation flag.
  std::string optimization = "-O1";
  /// Further flags, e.g. {"-g", "-fsanitize=address"}.
  std::vector<std::string> flags;
  /// Where sources and objects go; "": $KILN_CACHE_DIR/emu, else
  /// $XDG_CACHE_HOME/kiln/emu, else ~/.cache/kiln/emu. If it cannot be
  /// created, a temporary directory is used.
  std::string cacheDir;
  /// Reuse a cached object for the same source, compiler and flags.
  bool useCache = true;
  /// Put kiln_cuda.h's text in front of the source.
  bool pastePrelude = true;
};

/// A compiled, loaded emulator module.
class Module {
public:
  /// Compiles `source` (kernels ending with KILN_EMU_SHIM(name);) for
  /// emulation. `name` names the module in messages and files. A compile
  /// error comes back with the compiler's output and the source's path.
  static Expected<Module> compile(const std::string &source,
                                  const std::string &name,
                                  const CompileOptions &options = {});

  /// The emulator entry point of `kernel` (the symbol `kernel__emu`).
  Expected<Shim> shim(const std::string &kernel) const;

  /// Looks `kernel` up and launches it (LaunchOptions::kernel is set to it).
  Status launch(const std::string &kernel, Dim3 grid, Dim3 block,
                size_t dynamicSharedBytes, void **params,
                LaunchOptions options = {}, LaunchStats *stats = nullptr) const;

  const std::string &name() const;
  /// The source as compiled (prelude included) and the shared object.
  const std::string &sourcePath() const;
  const std::string &libraryPath() const;
  /// Whether the object came from the cache.
  bool cacheHit() const;
  /// Host compiler time (0 on a cache hit).
  double compileSeconds() const;

  Module(Module &&) noexcept;
  Module &operator=(Module &&) noexcept;
  ~Module();

private:
  struct Impl;
  explicit Module(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// The directory CompileOptions::cacheDir = "" stands for.
std::string defaultEmulatorCacheDir();

} // namespace kiln::cuda::emu

#endif // KILN_RUNTIME_CUDA_EMU_MODULE_H
