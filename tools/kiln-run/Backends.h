//===- Backends.h - Choosing and creating kiln-run's backend ------*- C++ -*-===//
#ifndef KILN_TOOLS_KILN_RUN_BACKENDS_H
#define KILN_TOOLS_KILN_RUN_BACKENDS_H

#include "runtime/core/Backend.h"
#include "runtime/core/Package.h"

#include <memory>
#include <string>

namespace kiln::run {

struct BackendOptions {
  /// cpu, cuda (= cuda:0), cuda:N, or cuda-emu (the CUDA emulator).
  std::string device = "cpu";
  std::string artifact;
  int threads = 1; ///< CPU threads
  std::string cacheDir;
  bool noCache = false, quiet = false;
};

/// Creates the backend `o.device` names for `pkg`: compiles or loads its
/// kernels and allocates its arena. Errors say what this build or machine
/// lacks and what to use instead.
Expected<std::unique_ptr<Backend>> makeBackend(const Package &pkg, const BackendOptions &o);

/// The devices this kiln-run was built with ("cpu, cuda, cuda-emu").
std::string availableDevices();

} // namespace kiln::run

#endif // KILN_TOOLS_KILN_RUN_BACKENDS_H
