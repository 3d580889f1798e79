//===- Driver.h - The CUDA driver API, loaded at run time -------*- C++ -*-===//
//
// Kiln never links libcuda: a binary built with the CUDA backend must start
// (and run on the CPU) on a machine without an NVIDIA driver. Driver::load()
// dlopens libcuda.so.1 once, resolves every entry point the executor uses and
// calls cuInit; failures come back as a Status that says what is missing and
// what to do (run on a GPU machine, or use --device cpu).
//
// The toolkit's <cuda.h> is included for types, enums and constants only. It
// also #defines the unversioned names to the current ABI (cuMemAlloc ->
// cuMemAlloc_v2, cuCtxDestroy -> cuCtxDestroy_v2, cuEventElapsedTime ->
// cuEventElapsedTime_v2, ...). The members below are declared with the plain
// names, so the preprocessor renames member and call alike
// (`driver.cuMemAlloc(&p, n)` calls the member `cuMemAlloc_v2`), and the
// symbol looked up is the stringified, renamed token: always the versioned
// entry point the header's prototype describes, never an older ABI.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CUDA_DRIVER_H
#define KILN_RUNTIME_CUDA_DRIVER_H

#include "runtime/core/Status.h"

#include <cuda.h>

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::cuda {

/// Every driver entry point Kiln calls, as X(name). The list is the single
/// source of truth: Driver's members and the symbol table are expanded from it.
#define KILN_CUDA_DRIVER_FUNCTIONS(X)                                          \
  X(cuInit)                                                                    \
  X(cuDriverGetVersion)                                                        \
  X(cuGetErrorName)                                                            \
  X(cuGetErrorString)                                                          \
  X(cuDeviceGetCount)                                                          \
  X(cuDeviceGet)                                                               \
  X(cuDeviceGetName)                                                           \
  X(cuDeviceGetAttribute)                                                      \
  X(cuDeviceTotalMem)                                                          \
  X(cuDevicePrimaryCtxRetain)                                                  \
  X(cuDevicePrimaryCtxRelease)                                                 \
  X(cuCtxSetCurrent)                                                           \
  X(cuCtxGetCurrent)                                                           \
  X(cuCtxSynchronize)                                                          \
  X(cuMemGetInfo)                                                              \
  X(cuMemAlloc)                                                                \
  X(cuMemFree)                                                                 \
  X(cuMemHostAlloc)                                                            \
  X(cuMemFreeHost)                                                             \
  X(cuMemcpyHtoD)                                                              \
  X(cuMemcpyDtoH)                                                              \
  X(cuMemcpyHtoDAsync)                                                         \
  X(cuMemcpyDtoHAsync)                                                         \
  X(cuMemcpyDtoDAsync)                                                         \
  X(cuMemsetD8Async)                                                           \
  X(cuMemsetD32Async)                                                          \
  X(cuStreamCreate)                                                            \
  X(cuStreamDestroy)                                                           \
  X(cuStreamSynchronize)                                                       \
  X(cuStreamWaitEvent)                                                         \
  X(cuEventCreate)                                                             \
  X(cuEventDestroy)                                                            \
  X(cuEventRecord)                                                             \
  X(cuEventSynchronize)                                                        \
  X(cuEventElapsedTime)                                                        \
  X(cuModuleLoadDataEx)                                                        \
  X(cuModuleUnload)                                                            \
  X(cuModuleGetFunction)                                                       \
  X(cuModuleGetGlobal)                                                         \
  X(cuFuncGetAttribute)                                                        \
  X(cuFuncSetAttribute)                                                        \
  X(cuLaunchKernel)

/// The loaded driver: one function pointer per entry point, all non-null
/// once load() succeeded. Immutable and shared by the whole process.
struct Driver {
#define KILN_CUDA_DECLARE_MEMBER(name) decltype(&::name) name = nullptr;
  KILN_CUDA_DRIVER_FUNCTIONS(KILN_CUDA_DECLARE_MEMBER)
#undef KILN_CUDA_DECLARE_MEMBER

  /// cuDriverGetVersion, e.g. 13000 for CUDA 13.0.
  int version = 0;
  /// The library that was opened ("libcuda.so.1" or a path given to loadFrom).
  std::string library;

  /// The process's driver: opened, resolved and initialised (cuInit) on the
  /// first call; later calls return the same pointer or the same error.
  /// Thread-safe. The library stays loaded until the process exits.
  static Expected<const Driver *> load();

  /// Like load() but from `library` (a soname or a path) and never cached;
  /// `library` stays open for the life of the process. For tests and for
  /// KILN_CUDA_DRIVER, which names another libcuda to use.
  static Expected<const Driver *> loadFrom(const std::string &library);

  /// "CUDA_ERROR_OUT_OF_MEMORY (out of memory)" for `code`.
  std::string describe(CUresult code) const;

  /// Driver version as "13.0".
  std::string versionString() const;
};

/// The CUDA version the toolkit headers describe (CUDA_VERSION, e.g. 13000):
/// the oldest driver API Kiln's entry points and kernels need.
constexpr int kBuiltAgainstVersion = CUDA_VERSION;

/// "13.0" for 13000.
std::string formatCudaVersion(int version);

/// The message Driver::load() gives when cuInit returns `code` (named
/// `errorName`, described by `errorText`): what went wrong in the user's
/// terms and what to do. Exposed for tests, which cannot make cuInit fail at
/// will.
std::string initFailureMessage(CUresult code, const std::string &errorName,
                               const std::string &errorText);

/// A Status for a failed driver call: "<call> failed at <file>:<line>:
/// <ERROR_NAME> (<error string>)". Ok when `code` is CUDA_SUCCESS.
Status checkResult(const Driver &driver, CUresult code, const char *call,
                   const char *file, int line);

/// Turns a driver call into a Status naming the call, the place and the
/// driver's error:
///   KILN_CU_CHECK(d, cuMemAlloc(&ptr, bytes))   // -> Status
/// evaluates `d.cuMemAlloc(&ptr, bytes)` once. `d` is a `const Driver &`.
#define KILN_CU_CHECK(driver, call)                                            \
  ::kiln::cuda::checkResult((driver), (driver).call, #call, __FILE__, __LINE__)

/// Returns from the enclosing function (which returns Status or Expected<T>)
/// when the call fails.
#define KILN_CU_TRY(driver, call)                                              \
  do {                                                                         \
    ::kiln::Status kiln_cu_status_ = KILN_CU_CHECK(driver, call);              \
    if (!kiln_cu_status_)                                                      \
      return kiln_cu_status_;                                                  \
  } while (0)

/// What the executor needs to know about one GPU.
struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int major = 0, minor = 0;  ///< compute capability
  int smCount = 0;           ///< multiprocessors
  int64_t totalMemory = 0;   ///< bytes
  int maxSharedPerBlock = 0; ///< bytes, with the opt-in carve-out
  int warpSize = 32;
};

/// Every device the driver reports, in ordinal order (may be empty: cuInit
/// succeeds on some systems with no usable device).
Expected<std::vector<DeviceInfo>> listDevices(const Driver &driver);

/// "sm_90" for compute capability 9.0.
std::string archName(const DeviceInfo &device);

/// The primary context of one device, retained and made current on the
/// calling thread for as long as this object lives (the usual RAII guard;
/// the primary context is the one cuBLAS and the runtime API share).
/// Move-only; the destructor releases the retain (the context stays alive
/// while anyone else holds it) and does not restore the previous context.
class PrimaryContext {
public:
  static Expected<PrimaryContext> retain(const Driver &driver, int ordinal);

  PrimaryContext(PrimaryContext &&other) noexcept;
  PrimaryContext &operator=(PrimaryContext &&other) noexcept;
  PrimaryContext(const PrimaryContext &) = delete;
  PrimaryContext &operator=(const PrimaryContext &) = delete;
  ~PrimaryContext();

  /// Makes the context current again (on another thread, for example).
  Status makeCurrent() const;
  CUcontext context() const { return context_; }
  CUdevice device() const { return device_; }
  int ordinal() const { return ordinal_; }

private:
  PrimaryContext(const Driver *driver, CUdevice device, CUcontext context,
                 int ordinal)
      : driver_(driver), device_(device), context_(context), ordinal_(ordinal) {
  }
  void reset();

  const Driver *driver_ = nullptr;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
  int ordinal_ = -1;
};

} // namespace kiln::cuda

#endif // KILN_RUNTIME_CUDA_DRIVER_H
