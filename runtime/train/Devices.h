//===- Devices.h - Device names to backends ----------------------*- C++ -*-===//
//
// The one place that knows every backend: parses a device name (cpu, cuda,
// cuda:N, cuda-emu) and creates the backend for it, with the backends this
// build has (the CPU JIT needs LLVM and a BLAS, cuda the CUDA toolkit, the
// emulator a BLAS). The rest of runtime/train sees only Backend.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_TRAIN_DEVICES_H
#define KILN_RUNTIME_TRAIN_DEVICES_H

#include "runtime/core/Backend.h"
#include "runtime/core/Package.h"
#include "runtime/train/Output.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kiln::train {

struct DeviceOptions {
  /// cpu, cuda (= cuda:0), cuda:N, or cuda-emu (the CUDA emulator).
  std::string device = "cpu";
  std::string artifact; ///< the artifact's path, for messages
  int threads = 1; ///< CPU threads
  std::string cacheDir;
  bool noCache = false, quiet = false;
  /// GPU GEMM epilogues: "library" (the default: in the cuBLASLt call where
  /// it can), "kernels" (always Kiln's own kernels; for comparison and
  /// debugging); unset: the default. kiln-run takes it from
  /// KILN_CUDA_EPILOGUES.
  std::optional<std::string> cudaEpilogues;
};

/// Creates the backend `o.device` names for `pkg`: compiles or loads its
/// kernels and allocates its arena. Errors say what this build or machine
/// lacks and what to use instead. Unless `o.quiet`, says what it prepared
/// (a Note: kernels, where they came from, the device).
Expected<std::unique_ptr<Backend>> makeBackend(const Package &pkg, const DeviceOptions &o,
                                               const Sink &out = {});

/// The devices this build has ("cpu, cuda[:N], cuda-emu", or "none").
std::string availableDevices();

/// The GPUs of this machine, one line each after a line naming the driver;
/// or one line "no GPU: <why>".
std::vector<std::string> describeGpus();

} // namespace kiln::train

#endif // KILN_RUNTIME_TRAIN_DEVICES_H
