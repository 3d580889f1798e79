//===- Devices.cpp - Device names to backends -----------------------------===//
#include "runtime/train/Devices.h"

#ifdef KILN_HAVE_CPU_JIT
#include "runtime/cpu/Executor.h"
#include "runtime/cpu/Jit.h"
#endif
#include "runtime/cuda/Device.h"
#include "runtime/cuda/Executor.h"

#include <fmt/format.h>

#include <chrono>
#include <cstdlib>

#ifdef KILN_HAVE_BLAS
#include "runtime/cpu/Blas.h"
#endif

namespace kiln::train {

std::string availableDevices() {
  std::string s;
#ifdef KILN_HAVE_CPU_JIT
  s += "cpu";
#endif
#ifdef KILN_HAVE_CUDA_DEVICE
  s += std::string(s.empty() ? "" : ", ") + "cuda[:N]";
#endif
#ifdef KILN_HAVE_CUDA_EMU
  s += std::string(s.empty() ? "" : ", ") + "cuda-emu";
#endif
  return s.empty() ? "none" : s;
}

namespace {

Expected<std::unique_ptr<Backend>> cpuBackend(const Package &pkg, const DeviceOptions &o,
                                              const Sink &out) {
#ifdef KILN_HAVE_CPU_JIT
  if (pkg.cpuBitcode.empty())
    return Status::error(o.artifact + ": the artifact has no CPU kernels; compile it with "
                                      "kilnc --target=cpu");
  cpu::JitOptions jo;
  jo.cacheDir = o.noCache ? "" : (o.cacheDir.empty() ? cpu::defaultCacheDir() : o.cacheDir);
  cpu::JitStats stats;
  auto lib = cpu::KernelLibrary::load(pkg.cpuBitcode, o.artifact, jo, &stats);
  if (!lib)
    return lib.status();
  auto blas = cpu::blas();
  if (!blas)
    return blas.status();
  if (!o.quiet)
    emit(out, Channel::Note,
         fmt::format("{} kernels for {} ({}), BLAS {}{}", pkg.program.kernels.size(), stats.cpu,
                     stats.cacheHit ? "cached"
                                    : fmt::format("compiled in {:.1f} s", stats.compileSeconds),
                     (*blas)->name, stats.cachePath.empty() ? "" : ", cache " + stats.cachePath));
  auto e = cpu::Executor::create(pkg.program, std::move(*lib), o.threads);
  if (!e)
    return e.status();
  return std::unique_ptr<Backend>(std::move(*e));
#else
  (void)pkg;
  (void)o;
  (void)out;
  return Status::error("this kiln-run was built without the CPU backend (no LLVM or OpenBLAS at "
                       "build time); install llvm-19-dev and libopenblas-dev and rebuild, or use "
                       "--device " + availableDevices());
#endif
}

Expected<std::unique_ptr<Backend>> gpuBackend(const Package &pkg, const DeviceOptions &o,
                                              std::unique_ptr<cuda::Device> device,
                                              const Sink &out) {
  auto t0 = std::chrono::steady_clock::now();
  std::string what = device->describe();
  auto e = cuda::Executor::create(pkg, std::move(device));
  if (!e)
    return e.status();
  // kernels: GEMM epilogues as Kiln's own kernels even where the library
  // could apply them (for comparison and debugging).
  if (o.cudaEpilogues) {
    const std::string &want = *o.cudaEpilogues;
    if (want != "kernels" && want != "library")
      return Status::error("KILN_CUDA_EPILOGUES=" + want + ": use library (the default) or kernels");
    (*e)->setLibraryEpilogues(want == "library");
  }
  if (!o.quiet) {
    size_t functions = 0;
    for (const auto &k : pkg.cudaPlan.kernels)
      functions += k.size();
    emit(out, Channel::Note,
         fmt::format("{} kernels ({} CUDA functions) on {}, ready in {:.1f} s",
                     pkg.program.kernels.size(), functions, what,
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                         .count()));
  }
  return std::unique_ptr<Backend>(std::move(*e));
}

} // namespace

Expected<std::unique_ptr<Backend>> makeBackend(const Package &pkg, const DeviceOptions &o,
                                               const Sink &out) {
  const std::string &d = o.device;
  if (d == "cpu")
    return cpuBackend(pkg, o, out);
  if (d == "cuda-emu") {
#ifdef KILN_HAVE_CUDA_EMU
    auto dev = cuda::openEmulatedDevice();
    if (!dev)
      return dev.status();
    return gpuBackend(pkg, o, std::move(*dev), out);
#else
    return Status::error("this kiln-run was built without the CUDA emulator; use --device " +
                         availableDevices());
#endif
  }
  if (d == "cuda" || d.rfind("cuda:", 0) == 0) {
    int ordinal = 0;
    if (d.size() > 5) {
      char *end = nullptr;
      ordinal = int(std::strtol(d.c_str() + 5, &end, 10));
      if (*end || ordinal < 0)
        return Status::error("--device " + d + ": expected cuda:N with N a GPU number");
    }
#ifdef KILN_HAVE_CUDA_DEVICE
    auto dev = cuda::openCudaDevice(ordinal);
    if (!dev)
      return Status::error(dev.status().message() + (pkg.cpuBitcode.empty() ? "" :
                           " (this artifact also runs on the CPU: --device cpu)"),
                           dev.status().kind());
    return gpuBackend(pkg, o, std::move(*dev), out);
#else
    (void)ordinal;
    return Status::error("this kiln-run was built without the CUDA backend (no CUDA toolkit at "
                         "build time); use --device " + availableDevices());
#endif
  }
  return Status::error("unknown --device '" + d + "' (this kiln-run has: " + availableDevices() +
                       ")");
}

} // namespace kiln::train

#ifdef KILN_HAVE_CUDA_DEVICE
#include "runtime/cuda/Driver.h"
#endif

namespace kiln::train {

std::vector<std::string> describeGpus() {
  std::vector<std::string> lines;
#ifdef KILN_HAVE_CUDA_DEVICE
  auto driver = cuda::Driver::load();
  if (!driver)
    return {"no GPU: " + driver.status().message()};
  auto devices = cuda::listDevices(**driver);
  if (!devices)
    return {"no GPU: " + devices.status().message()};
  lines.push_back(fmt::format("NVIDIA driver {} ({}), {} GPU(s):", (*driver)->versionString(),
                              (*driver)->library, devices->size()));
  for (const cuda::DeviceInfo &d : *devices)
    lines.push_back(fmt::format("  cuda:{}  {}  {}  {} SMs  {:.1f} GiB", d.ordinal, d.name,
                                cuda::archName(d), d.smCount,
                                double(d.totalMemory) / (1 << 30)));
#else
  lines.push_back("no GPU: this kiln-run was built without the CUDA backend");
#endif
  return lines;
}

} // namespace kiln::train
