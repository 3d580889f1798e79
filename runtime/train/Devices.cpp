//===- Devices.cpp - Device names to backends -----------------------------===//
#include "runtime/train/Devices.h"

#ifdef KILN_HAVE_CPU_JIT
#include "runtime/cpu/Executor.h"
#include "runtime/cpu/Jit.h"
#endif
#include "runtime/comm/InProcess.h"
#ifdef KILN_HAVE_MPI
#include "runtime/comm/Mpi.h"
#endif
#ifdef KILN_HAVE_NCCL
#include "runtime/comm/Nccl.h"
#endif
#include "runtime/cuda/Device.h"
#include "runtime/cuda/Executor.h"
#ifdef KILN_HAVE_CUDA_DEVICE
#include "runtime/cuda/Driver.h"
#endif

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
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
  // Before the kernels load (or compile): a multi-device artifact needs a
  // communicator.
  if (pkg.program.numDevices() > 1 && !o.comm) {
    std::string mesh;
    for (const auto &a : pkg.program.mesh.axes)
      mesh += fmt::format("{}{}={}", mesh.empty() ? "" : " x ", a.name, a.size);
    return Status::error(fmt::format(
        "{} was compiled for {} devices ({}); kiln-run train runs it with --device cpu:{} or "
        "under mpirun -np {}; eval, check and sample run on one device: compile the model "
        "for one device (kilnc MODEL.kiln{} -o one.kpack) and give them the checkpoint, which "
        "holds whole tensors",
        o.artifact, pkg.program.numDevices(), mesh, pkg.program.numDevices(),
        pkg.program.numDevices(),
        pkg.program.mesh.axis("pp") >= 0 ? " --pp 1, which also sets `stage` blocks aside," : ""));
  }
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
  cpu::ExecutorOptions eo;
  eo.threads = o.threads;
  eo.interOpThreads = o.interOpThreads;
  eo.cacheDir = jo.cacheDir; // bf16/f16 GEMM choices, next to the kernels
  eo.communicator = o.comm;
  eo.device = o.comm ? o.deviceIndex : -1;
  if (o.commThread) {
    const std::string &want = *o.commThread;
    if (want == "on")
      eo.commThread = cpu::ExecutorOptions::CommThread::On;
    else if (want == "off")
      eo.commThread = cpu::ExecutorOptions::CommThread::Off;
    else if (want != "auto")
      return Status::error("KILN_COMM_THREAD=" + want +
                           ": use auto (the default: a communication thread per device), on "
                           "(the same) or off (collectives on each device's own thread)");
  }
  auto e = cpu::Executor::create(pkg.program, std::move(*lib), eo);
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
  // A multi-device program: this device of the mesh, its collectives
  // through o.comm (blocking: each returns once the data is in place).
  cuda::ExecutorOptions eo;
  eo.communicator = o.comm;
  eo.device = o.comm ? o.deviceIndex : -1;
  auto e = cuda::Executor::create(pkg, std::move(device), eo);
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

void deviceOptionsFromEnvironment(DeviceOptions &o) {
  if (const char *v = std::getenv("KILN_CUDA_EPILOGUES"))
    o.cudaEpilogues = v;
  if (const char *v = std::getenv("KILN_COMM_THREAD"))
    o.commThread = v;
}

Expected<DeviceSpec> parseDeviceSpec(const std::string &device) {
  DeviceSpec spec;
  size_t colon = device.find(':');
  spec.kind = device.substr(0, colon);
  std::string rest = colon == std::string::npos ? "" : device.substr(colon + 1);
  auto number = [](const std::string &v, int &out) {
    char *end = nullptr;
    long x = std::strtol(v.c_str(), &end, 10);
    if (v.empty() || *end || x < 0 || x > 1 << 20)
      return false;
    out = int(x);
    return true;
  };
  if (spec.kind == "cpu") {
    if (colon != std::string::npos && (!number(rest, spec.count) || spec.count < 1))
      return Status::error("--device " + device +
                           ": expected cpu or cpu:N with N >= 1 devices in this process");
    return spec;
  }
  if (spec.kind == "cuda-emu" && colon == std::string::npos)
    return spec;
  if (spec.kind == "cuda") {
    size_t at = 0;
    while (colon != std::string::npos && at <= rest.size()) {
      size_t comma = rest.find(',', at);
      int ordinal = 0;
      if (!number(rest.substr(at, comma - at), ordinal))
        return Status::error("--device " + device +
                             ": expected cuda:N with N a GPU number, or cuda:0,1,... for "
                             "several GPUs");
      spec.ordinals.push_back(ordinal);
      if (comma == std::string::npos)
        break;
      at = comma + 1;
    }
    spec.count = std::max<int>(1, int(spec.ordinals.size()));
    return spec;
  }
  return Status::error("unknown --device '" + device + "' (this kiln-run has: " +
                       availableDevices() + ")");
}

Status checkDeviceCount(const program::Program &p, int devices, const std::string &how,
                        const std::string &artifact) {
  int want = p.numDevices();
  if (want == devices)
    return Status::ok();
  if (want == 1)
    return Status::error(fmt::format(
        "{} was compiled for 1 device, but {} asks for {}; recompile with kilnc --devices {} "
        "(or run it on one device)", artifact, how, devices, devices));
  // A model-parallel layout (pp x tp devices per replica) recompiles only
  // for a multiple of it, unless the layout changes too.
  int64_t modelParallel = 1;
  for (const char *axis : {"pp", "tp"})
    if (int a = p.mesh.axis(axis); a >= 0)
      modelParallel *= p.mesh.axes[size_t(a)].size;
  std::string recompile =
      modelParallel > 1 && devices == 1
          ? std::string("recompile with kilnc --devices 1 --pp 1 --tp 1")
      : modelParallel > 1 && devices % modelParallel != 0
          ? fmt::format("recompile with kilnc --devices {} and --pp/--tp whose product divides "
                        "{} (this artifact has pp x tp = {})",
                        devices, devices, modelParallel)
          : fmt::format("recompile with kilnc --devices {}", devices);
  return Status::error(fmt::format(
      "{} was compiled for {} devices, but {} gives {}; run it with --device cpu:{} or "
      "mpirun -np {} kiln-run ..., or {}", artifact, want, how, devices, want, want,
      recompile));
}

Expected<std::vector<std::unique_ptr<comm::Communicator>>>
makeInProcessCommunicators(int n, double timeoutSeconds) {
  auto comms = comm::makeInProcessCommunicators(n);
  for (auto &c : comms)
    c->setTimeout(timeoutSeconds);
  return comms;
}

Expected<std::unique_ptr<comm::Communicator>> makeMpiCommunicator(double timeoutSeconds) {
#ifdef KILN_HAVE_MPI
  auto c = comm::MpiCommunicator::create();
  if (!c)
    return c.status();
  (*c)->setTimeout(timeoutSeconds);
  return std::unique_ptr<comm::Communicator>(std::move(*c));
#else
  (void)timeoutSeconds;
  return Status::error("this kiln-run was built without MPI (install libopenmpi-dev and "
                       "rebuild); it cannot run as one of several processes");
#endif
}

#ifndef KILN_HAVE_NCCL
static constexpr const char *kNoNccl =
    "this kiln-run was built without NCCL (it comes with the CUDA toolkit); it cannot train "
    "on several GPUs: rebuild where nccl.h and libnccl are found, or use --device cpu:N, or "
    "mpirun with --device cpu";
#endif

Expected<std::vector<std::unique_ptr<comm::Communicator>>>
makeNcclCommunicators(const std::vector<int> &ordinals, double timeoutSeconds) {
#ifdef KILN_HAVE_NCCL
  auto cs = comm::NcclCommunicator::createLocal(ordinals);
  if (!cs)
    return cs.status();
  std::vector<std::unique_ptr<comm::Communicator>> out;
  for (auto &c : *cs) {
    c->setTimeout(timeoutSeconds);
    out.push_back(std::move(c));
  }
  return out;
#else
  (void)ordinals;
  (void)timeoutSeconds;
  return Status::error(kNoNccl);
#endif
}

Expected<std::unique_ptr<comm::Communicator>>
makeNcclCommunicator(comm::Communicator &bootstrap, int ordinal, double timeoutSeconds) {
#ifdef KILN_HAVE_NCCL
  auto c = comm::NcclCommunicator::createWithBootstrap(bootstrap, ordinal);
  if (!c)
    return c.status();
  (*c)->setTimeout(timeoutSeconds);
  return std::unique_ptr<comm::Communicator>(std::move(*c));
#else
  (void)bootstrap;
  (void)ordinal;
  (void)timeoutSeconds;
  return Status::error(kNoNccl);
#endif
}

Status checkGpus(const std::vector<int> &ordinals, const std::string &how) {
  std::vector<std::string> names;
  for (int o : ordinals)
    names.push_back(fmt::format("cuda:{}", o));
  std::string asked = fmt::format("{} asks for {} GPU{} ({})", how, ordinals.size(),
                                  ordinals.size() == 1 ? "" : "s", fmt::join(names, ", "));
  for (size_t i = 0; i < ordinals.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (ordinals[i] == ordinals[j])
        return Status::error(fmt::format("{}, listing cuda:{} twice; NCCL runs one rank per GPU",
                                         asked, ordinals[i]));
#ifdef KILN_HAVE_CUDA_DEVICE
  auto driver = cuda::Driver::load();
  if (!driver)
    return Status::error(asked + ", but this machine has no GPU: " + driver.status().message());
  auto devices = cuda::listDevices(**driver);
  if (!devices)
    return Status::error(asked + ", but this machine has no GPU: " + devices.status().message());
  int have = int(devices->size());
  if (have == 0)
    return Status::error(asked + ", but this machine has no GPU");
  for (int o : ordinals)
    if (o >= have)
      return Status::error(fmt::format("{}, but this machine has {} GPU{}: cuda:0{}", asked, have,
                                       have == 1 ? "" : "s",
                                       have == 1 ? "" : fmt::format("..cuda:{}", have - 1)));
  return Status::ok();
#else
  return Status::error(asked + ", but this kiln-run was built without the CUDA backend");
#endif
}

Expected<std::unique_ptr<Backend>> makeBackend(const Package &pkg, const DeviceOptions &o,
                                               const Sink &out) {
  const std::string &d = o.device;
  if (d == "cpu" || d.rfind("cpu:", 0) == 0)
    return cpuBackend(pkg, o, out);
  if (o.interOpThreads > 1)
    return Status::error(fmt::format(
        "--inter-op-threads {} runs independent plan steps on CPU threads; --device {} runs "
        "them in order on its own stream: leave --inter-op-threads out (or use --device cpu)",
        o.interOpThreads, d));
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
