//===- Backends.cpp - Choosing and creating kiln-run's backend ------------===//
#include "tools/kiln-run/Backends.h"

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

namespace kiln::run {

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

Expected<std::unique_ptr<Backend>> cpuBackend(const Package &pkg, const BackendOptions &o) {
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
    fmt::print("kiln-run: {} kernels for {} ({}), BLAS {}{}\n", pkg.program.kernels.size(),
               stats.cpu,
               stats.cacheHit ? "cached" : fmt::format("compiled in {:.1f} s", stats.compileSeconds),
               (*blas)->name, stats.cachePath.empty() ? "" : ", cache " + stats.cachePath);
  auto e = cpu::Executor::create(pkg.program, std::move(*lib), o.threads);
  if (!e)
    return e.status();
  return std::unique_ptr<Backend>(std::move(*e));
#else
  (void)pkg;
  (void)o;
  return Status::error("this kiln-run was built without the CPU backend (no LLVM or OpenBLAS at "
                       "build time); install llvm-19-dev and libopenblas-dev and rebuild, or use "
                       "--device " + availableDevices());
#endif
}

Expected<std::unique_ptr<Backend>> gpuBackend(const Package &pkg, const BackendOptions &o,
                                              std::unique_ptr<cuda::Device> device) {
  auto t0 = std::chrono::steady_clock::now();
  std::string what = device->describe();
  auto e = cuda::Executor::create(pkg, std::move(device));
  if (!e)
    return e.status();
  // KILN_CUDA_EPILOGUES=kernels: GEMM epilogues as Kiln's own kernels even
  // where the library could apply them (for comparison and debugging).
  if (const char *v = std::getenv("KILN_CUDA_EPILOGUES")) {
    std::string want = v;
    if (want != "kernels" && want != "library")
      return Status::error("KILN_CUDA_EPILOGUES=" + want + ": use library (the default) or kernels");
    (*e)->setLibraryEpilogues(want == "library");
  }
  if (!o.quiet)
    fmt::print("kiln-run: {} kernels ({} CUDA functions) on {}, ready in {:.1f} s\n",
               pkg.program.kernels.size(),
               [&] {
                 size_t n = 0;
                 for (const auto &k : pkg.cudaPlan.kernels)
                   n += k.size();
                 return n;
               }(),
               what,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return std::unique_ptr<Backend>(std::move(*e));
}

} // namespace

Expected<std::unique_ptr<Backend>> makeBackend(const Package &pkg, const BackendOptions &o) {
  const std::string &d = o.device;
  if (d == "cpu")
    return cpuBackend(pkg, o);
  if (d == "cuda-emu") {
#ifdef KILN_HAVE_CUDA_EMU
    auto dev = cuda::openEmulatedDevice();
    if (!dev)
      return dev.status();
    return gpuBackend(pkg, o, std::move(*dev));
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
    return gpuBackend(pkg, o, std::move(*dev));
#else
    (void)ordinal;
    return Status::error("this kiln-run was built without the CUDA backend (no CUDA toolkit at "
                         "build time); use --device " + availableDevices());
#endif
  }
  return Status::error("unknown --device '" + d + "' (this kiln-run has: " + availableDevices() +
                       ")");
}

} // namespace kiln::run

#ifdef KILN_HAVE_CUDA_DEVICE
#include "runtime/cuda/Driver.h"
#endif

namespace kiln::run {

int devicesCommand(const std::vector<std::string> &args) {
  if (!args.empty()) {
    fmt::print(stderr, "kiln-run: error: devices takes no arguments\n");
    return 1;
  }
  fmt::print("backends in this kiln-run: {}\n", availableDevices());
#ifdef KILN_HAVE_CUDA_DEVICE
  auto driver = cuda::Driver::load();
  if (!driver) {
    fmt::print("no GPU: {}\n", driver.status().message());
    return 0;
  }
  auto devices = cuda::listDevices(**driver);
  if (!devices) {
    fmt::print("no GPU: {}\n", devices.status().message());
    return 0;
  }
  fmt::print("NVIDIA driver {} ({}), {} GPU(s):\n", (*driver)->versionString(),
             (*driver)->library, devices->size());
  for (const cuda::DeviceInfo &d : *devices)
    fmt::print("  cuda:{}  {}  {}  {} SMs  {:.1f} GiB\n", d.ordinal, d.name, cuda::archName(d),
               d.smCount, double(d.totalMemory) / (1 << 30));
#else
  fmt::print("no GPU: this kiln-run was built without the CUDA backend\n");
#endif
  return 0;
}

} // namespace kiln::run
