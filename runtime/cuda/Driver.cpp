//===- Driver.cpp - The CUDA driver API, loaded at run time ---------------===//
#include "runtime/cuda/Driver.h"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <link.h>

namespace kiln::cuda {

namespace {

#define KILN_CUDA_STRINGIFY2(x) #x
/// The symbol a name resolves to after <cuda.h>'s renames ("cuMemAlloc_v2").
#define KILN_CUDA_SYMBOL(x) KILN_CUDA_STRINGIFY2(x)

constexpr const char *kDefaultLibrary = "libcuda.so.1";
constexpr const char *kUseCpu = "or use the CPU backend (--device cpu)";

/// Where a dlopen'ed library really lives, for messages.
std::string libraryPath(void *handle, const std::string &fallback) {
  struct link_map *map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name &&
      *map->l_name)
    return map->l_name;
  return fallback;
}

/// Names of the codes cuInit reports, for drivers (such as the toolkit's
/// stub) whose cuGetErrorName does not answer.
const char *knownName(CUresult code) {
  switch (code) {
  case CUDA_ERROR_NO_DEVICE:
    return "CUDA_ERROR_NO_DEVICE";
  case CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER:
    return "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER";
  case CUDA_ERROR_STUB_LIBRARY:
    return "CUDA_ERROR_STUB_LIBRARY";
  case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    return "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH";
  case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
    return "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE";
  case CUDA_ERROR_DEVICE_UNAVAILABLE:
    return "CUDA_ERROR_DEVICE_UNAVAILABLE";
  case CUDA_ERROR_OUT_OF_MEMORY:
    return "CUDA_ERROR_OUT_OF_MEMORY";
  case CUDA_ERROR_NOT_INITIALIZED:
    return "CUDA_ERROR_NOT_INITIALIZED";
  case CUDA_ERROR_OPERATING_SYSTEM:
    return "CUDA_ERROR_OPERATING_SYSTEM";
  default:
    return nullptr;
  }
}

std::string errorName(const Driver &d, CUresult code) {
  const char *name = nullptr;
  if (d.cuGetErrorName && d.cuGetErrorName(code, &name) == CUDA_SUCCESS && name)
    return name;
  if (const char *known = knownName(code))
    return known;
  return fmt::format("CUresult {}", int(code));
}

std::string errorText(const Driver &d, CUresult code) {
  const char *text = nullptr;
  if (d.cuGetErrorString && d.cuGetErrorString(code, &text) == CUDA_SUCCESS &&
      text)
    return text;
  if (code == CUDA_ERROR_STUB_LIBRARY)
    return "CUDA driver is a stub library";
  return "the driver gave no description";
}

Expected<const Driver *> open(const std::string &library) {
  void *handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char *why = dlerror();
    return Status::error(fmt::format(
        "no NVIDIA driver found (dlopen {}: {}): run on a machine with an "
        "NVIDIA GPU and driver, {}",
        library, why ? why : "unknown error", kUseCpu));
  }
  std::string path = libraryPath(handle, library);
  auto *d = new Driver(); // lives as long as the process, like the library
  d->library = path;

  std::vector<std::string> missing;
#define KILN_CUDA_RESOLVE(name)                                                \
  d->name = reinterpret_cast<decltype(d->name)>(                               \
      dlsym(handle, KILN_CUDA_SYMBOL(name)));                                  \
  if (!d->name)                                                                \
    missing.push_back(KILN_CUDA_SYMBOL(name));
  KILN_CUDA_DRIVER_FUNCTIONS(KILN_CUDA_RESOLVE)
#undef KILN_CUDA_RESOLVE

  int version = 0;
  if (d->cuDriverGetVersion)
    (void)d->cuDriverGetVersion(&version);
  if (!missing.empty()) {
    std::string names;
    for (size_t i = 0; i < missing.size() && i < 8; ++i)
      names += (i ? ", " : "") + missing[i];
    if (missing.size() > 8)
      names += fmt::format(" and {} more", missing.size() - 8);
    delete d;
    return Status::error(fmt::format(
        "the NVIDIA driver library {} (CUDA {}) lacks {}: it is older than "
        "CUDA {}, which Kiln was built for; update the NVIDIA driver, {}",
        path, version ? formatCudaVersion(version) : "version unknown", names,
        formatCudaVersion(kBuiltAgainstVersion), kUseCpu));
  }

  CUresult init = d->cuInit(0);
  if (init != CUDA_SUCCESS) {
    std::string message =
        initFailureMessage(init, errorName(*d, init), errorText(*d, init));
    if (init == CUDA_ERROR_STUB_LIBRARY)
      message += fmt::format(" [library: {}]", path);
    delete d;
    return Status::error(message);
  }
  d->version = version;
  // Kernels come from NVRTC of the toolkit Kiln was built with: their PTX
  // and CUBIN need a driver of at least that major version.
  if (version / 1000 < kBuiltAgainstVersion / 1000) {
    std::string found = formatCudaVersion(version);
    delete d;
    return Status::error(fmt::format(
        "the NVIDIA driver ({}) supports CUDA {}, but Kiln's CUDA backend was "
        "built with CUDA {} and needs a driver for CUDA {}.x or newer: update "
        "the NVIDIA driver, {}",
        path, found, formatCudaVersion(kBuiltAgainstVersion),
        kBuiltAgainstVersion / 1000, kUseCpu));
  }
  return static_cast<const Driver *>(d);
}

} // namespace

std::string formatCudaVersion(int version) {
  return fmt::format("{}.{}", version / 1000, (version % 1000) / 10);
}

std::string Driver::versionString() const { return formatCudaVersion(version); }

std::string Driver::describe(CUresult code) const {
  return fmt::format("{} ({})", errorName(*this, code), errorText(*this, code));
}

std::string initFailureMessage(CUresult code, const std::string &name,
                               const std::string &text) {
  std::string what = fmt::format("cuInit: {} ({})", name, text);
  switch (code) {
  case CUDA_ERROR_NO_DEVICE:
    return fmt::format(
        "the NVIDIA driver found no CUDA device ({}): check nvidia-smi and "
        "CUDA_VISIBLE_DEVICES, {}",
        what, kUseCpu);
  case CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER:
    return fmt::format(
        "the NVIDIA driver is too old for CUDA {} ({}): update the driver, {}",
        formatCudaVersion(kBuiltAgainstVersion), what, kUseCpu);
  case CUDA_ERROR_STUB_LIBRARY:
    return fmt::format(
        "the libcuda found is the CUDA toolkit's stub, not a driver ({}): "
        "remove the toolkit's lib64/stubs folder from LD_LIBRARY_PATH, install "
        "an NVIDIA driver, {}",
        what, kUseCpu);
  case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    return fmt::format(
        "the NVIDIA driver library and the loaded kernel module have different "
        "versions ({}): reboot or reinstall the driver so that they match, {}",
        what, kUseCpu);
  case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
    return fmt::format(
        "the CUDA forward-compatibility driver does not support this GPU ({}): "
        "use the system's own libcuda (unset KILN_CUDA_DRIVER, check "
        "LD_LIBRARY_PATH), {}",
        what, kUseCpu);
  case CUDA_ERROR_DEVICE_UNAVAILABLE:
    return fmt::format(
        "every CUDA device is busy or unavailable ({}): another process may "
        "hold a GPU in exclusive-process mode (see nvidia-smi), {}",
        what, kUseCpu);
  case CUDA_ERROR_OUT_OF_MEMORY:
    return fmt::format(
        "the NVIDIA driver ran out of memory while starting ({}): free memory, "
        "{}",
        what, kUseCpu);
  default:
    return fmt::format(
        "the NVIDIA driver failed to start ({}): check that nvidia-smi works, "
        "{}",
        what, kUseCpu);
  }
}

Expected<const Driver *> Driver::load() {
  static const Expected<const Driver *> loaded = [] {
    const char *override = std::getenv("KILN_CUDA_DRIVER");
    return open(override && *override ? override : kDefaultLibrary);
  }();
  return loaded;
}

Expected<const Driver *> Driver::loadFrom(const std::string &library) {
  return open(library);
}

Status checkResult(const Driver &driver, CUresult code, const char *call,
                   const char *file, int line) {
  if (code == CUDA_SUCCESS)
    return Status::ok();
  std::string message =
      fmt::format("{} failed at {}:{}: {}", call, sourcePath(file), line,
                  driver.describe(code));
  switch (code) {
  case CUDA_ERROR_OUT_OF_MEMORY:
    return Status::error(
        message + "; reduce the batch size or free GPU memory (nvidia-smi "
                  "lists the processes that hold it)");
  case CUDA_ERROR_ILLEGAL_ADDRESS:
  case CUDA_ERROR_LAUNCH_FAILED:
  case CUDA_ERROR_MISALIGNED_ADDRESS:
  case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    return Status::internal(
        message + "; a kernel faulted (the error may come from an earlier "
                  "asynchronous launch): rerun under compute-sanitizer to find "
                  "it, and report it as a Kiln bug");
  case CUDA_ERROR_NO_DEVICE:
  case CUDA_ERROR_INVALID_DEVICE:
  case CUDA_ERROR_DEVICE_UNAVAILABLE:
  case CUDA_ERROR_NO_BINARY_FOR_GPU:
  case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
    return Status::error(message);
  default:
    return Status::internal(message);
  }
}

Expected<std::vector<DeviceInfo>> listDevices(const Driver &d) {
  int count = 0;
  KILN_CU_TRY(d, cuDeviceGetCount(&count));
  std::vector<DeviceInfo> devices;
  for (int i = 0; i < count; ++i) {
    CUdevice dev = 0;
    KILN_CU_TRY(d, cuDeviceGet(&dev, i));
    DeviceInfo info;
    info.ordinal = i;
    char name[256] = {};
    KILN_CU_TRY(d, cuDeviceGetName(name, int(sizeof(name)) - 1, dev));
    info.name = name;
    KILN_CU_TRY(
        d, cuDeviceGetAttribute(
               &info.major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
    KILN_CU_TRY(
        d, cuDeviceGetAttribute(
               &info.minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
    KILN_CU_TRY(
        d, cuDeviceGetAttribute(&info.smCount,
                                CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    KILN_CU_TRY(d, cuDeviceGetAttribute(
                       &info.maxSharedPerBlock,
                       CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                       dev));
    KILN_CU_TRY(d, cuDeviceGetAttribute(&info.warpSize,
                                        CU_DEVICE_ATTRIBUTE_WARP_SIZE, dev));
    size_t bytes = 0;
    KILN_CU_TRY(d, cuDeviceTotalMem(&bytes, dev));
    info.totalMemory = int64_t(bytes);
    devices.push_back(std::move(info));
  }
  return devices;
}

std::string archName(const DeviceInfo &device) {
  return fmt::format("sm_{}{}", device.major, device.minor);
}

Expected<PrimaryContext> PrimaryContext::retain(const Driver &d, int ordinal) {
  int count = 0;
  KILN_CU_TRY(d, cuDeviceGetCount(&count));
  if (ordinal < 0 || ordinal >= count)
    return Status::error(fmt::format(
        "CUDA device {} does not exist: this machine has {} (ordinals 0..{}); "
        "pick one of them or check CUDA_VISIBLE_DEVICES",
        ordinal, count, count - 1));
  CUdevice dev = 0;
  KILN_CU_TRY(d, cuDeviceGet(&dev, ordinal));
  CUcontext ctx = nullptr;
  KILN_CU_TRY(d, cuDevicePrimaryCtxRetain(&ctx, dev));
  PrimaryContext guard(&d, dev, ctx, ordinal);
  if (Status s = guard.makeCurrent(); !s)
    return s; // the guard releases the retain
  return guard;
}

Status PrimaryContext::makeCurrent() const {
  if (!driver_)
    return Status::internal(
        "PrimaryContext::makeCurrent on a moved-from context");
  return KILN_CU_CHECK(*driver_, cuCtxSetCurrent(context_));
}

PrimaryContext::PrimaryContext(PrimaryContext &&o) noexcept
    : driver_(o.driver_), device_(o.device_), context_(o.context_),
      ordinal_(o.ordinal_) {
  o.driver_ = nullptr;
  o.context_ = nullptr;
}

PrimaryContext &PrimaryContext::operator=(PrimaryContext &&o) noexcept {
  if (this != &o) {
    reset();
    driver_ = o.driver_;
    device_ = o.device_;
    context_ = o.context_;
    ordinal_ = o.ordinal_;
    o.driver_ = nullptr;
    o.context_ = nullptr;
  }
  return *this;
}

PrimaryContext::~PrimaryContext() { reset(); }

void PrimaryContext::reset() {
  if (!driver_ || !context_)
    return;
  // Do not leave this thread pointing at a context that the release may
  // destroy (when this was the last retain).
  CUcontext current = nullptr;
  if (driver_->cuCtxGetCurrent(&current) == CUDA_SUCCESS && current == context_)
    (void)driver_->cuCtxSetCurrent(nullptr);
  (void)driver_->cuDevicePrimaryCtxRelease(device_);
  driver_ = nullptr;
  context_ = nullptr;
}

} // namespace kiln::cuda
