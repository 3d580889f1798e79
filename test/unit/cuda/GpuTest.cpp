//===- GpuTest.cpp - NVRTC kernels through the driver on a device ---------===//
//
// Compile with NVRTC, load with cuModuleLoadDataEx, launch with
// cuLaunchKernel, check the results: the path the executor takes. Skips with
// "no CUDA device: <why>" where Driver::load() or device 0 is unavailable.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/Driver.h"
#include "runtime/cuda/Nvrtc.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

using namespace kiln;
using namespace kiln::cuda;

namespace {

struct Device {
  const Driver *driver = nullptr;
  std::optional<PrimaryContext> context;
  DeviceInfo info;
  std::string unavailable;
};

/// Device 0 with its primary context current; leaked on purpose (nothing
/// CUDA runs from static destructors).
Device &device() {
  static Device *dev = [] {
    auto *d = new Device();
    auto driver = Driver::load();
    if (!driver) {
      d->unavailable = driver.status().message();
      return d;
    }
    d->driver = *driver;
    auto devices = listDevices(**driver);
    if (!devices || devices->empty()) {
      d->unavailable = devices ? "the NVIDIA driver reports no device"
                               : devices.status().message();
      return d;
    }
    d->info = (*devices)[0];
    auto ctx = PrimaryContext::retain(**driver, 0);
    if (!ctx) {
      d->unavailable = "device 0: " + ctx.status().message();
      return d;
    }
    d->context.emplace(std::move(*ctx));
    return d;
  }();
  return *dev;
}

#define KILN_REQUIRE_DEVICE()                                                  \
  do {                                                                         \
    if (!device().unavailable.empty())                                         \
      GTEST_SKIP() << "no CUDA device: " << device().unavailable;              \
  } while (0)

#define KILN_ASSERT_CU(call)                                                   \
  do {                                                                         \
    ::kiln::Status kiln_s_ = KILN_CU_CHECK(*device().driver, call);            \
    ASSERT_TRUE(kiln_s_.isOk()) << kiln_s_.message();                          \
  } while (0)

const char *kKernels = R"(
#include <cuda_fp16.h>
#include <cuda_bf16.h>
__device__ float scale_factor;
extern "C" __global__ void axpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
__device__ float warpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
extern "C" __global__ void row_sum(const float* x, float* out, int cols) {
  extern __shared__ float partial[];
  const float* row = x + (long long)blockIdx.x * cols;
  float v = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) v += row[c];
  v = warpSum(v);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < (blockDim.x >> 5) ? partial[threadIdx.x] : 0.f;
    v = warpSum(v);
    if (threadIdx.x == 0) out[blockIdx.x] = v * scale_factor;
  }
}
extern "C" __global__ void half_to_bf16(const __half* x, __nv_bfloat16* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __float2bfloat16(__half2float(x[i]) * 2.0f);
}
)";

/// Compiles kKernels for `arch`, loads it, runs axpy and row_sum, checks.
void compileLoadAndRun(const std::string &arch) {
  const Driver &d = *device().driver;
  SCOPED_TRACE(arch);
  CompileOptions options;
  options.arch = arch;
  auto compiled = compile(kKernels, "gpu-test.cu", options);
  ASSERT_TRUE(compiled.isOk()) << compiled.status().message();

  CUmodule module = nullptr;
  char jitLog[4096] = {};
  CUjit_option keys[] = {CU_JIT_ERROR_LOG_BUFFER,
                         CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void *values[] = {jitLog, reinterpret_cast<void *>(sizeof(jitLog))};
  Status loaded = KILN_CU_CHECK(
      d, cuModuleLoadDataEx(&module, compiled->image(), 2, keys, values));
  ASSERT_TRUE(loaded.isOk()) << loaded.message() << "\n" << jitLog;
  CUfunction axpy = nullptr, rowSum = nullptr, convert = nullptr;
  KILN_ASSERT_CU(cuModuleGetFunction(&axpy, module, "axpy"));
  KILN_ASSERT_CU(cuModuleGetFunction(&rowSum, module, "row_sum"));
  KILN_ASSERT_CU(cuModuleGetFunction(&convert, module, "half_to_bf16"));
  // The driver's register count matches ptxas's report (real targets).
  if (const KernelResources *r = compiled->resourcesFor("row_sum")) {
    int regs = 0;
    KILN_ASSERT_CU(
        cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, rowSum));
    EXPECT_EQ(regs, r->registers) << compiled->log;
  }
  KILN_ASSERT_CU(cuFuncSetAttribute(
      rowSum, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 32 * 4));

  CUstream stream = nullptr;
  KILN_ASSERT_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  const int rows = 37, cols = 1000, n = rows * cols;
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> u(-1, 1);
  float *host = nullptr; // pinned, for the async copies
  KILN_ASSERT_CU(cuMemHostAlloc(reinterpret_cast<void **>(&host),
                                sizeof(float) * n * 2, 0));
  float *hx = host, *hy = host + n;
  for (int i = 0; i < n; ++i) {
    hx[i] = u(rng);
    hy[i] = u(rng);
  }
  CUdeviceptr x = 0, y = 0, y2 = 0, sums = 0;
  KILN_ASSERT_CU(cuMemAlloc(&x, sizeof(float) * n));
  KILN_ASSERT_CU(cuMemAlloc(&y, sizeof(float) * n));
  KILN_ASSERT_CU(cuMemAlloc(&y2, sizeof(float) * n));
  KILN_ASSERT_CU(cuMemAlloc(&sums, sizeof(float) * rows));
  KILN_ASSERT_CU(cuMemcpyHtoDAsync(x, hx, sizeof(float) * n, stream));
  KILN_ASSERT_CU(cuMemcpyHtoDAsync(y, hy, sizeof(float) * n, stream));
  KILN_ASSERT_CU(
      cuMemsetD32Async(sums, 0x7fc00000u, rows, stream)); // NaN poison
  float scale = 0.5f;
  CUdeviceptr global = 0;
  size_t globalBytes = 0;
  KILN_ASSERT_CU(
      cuModuleGetGlobal(&global, &globalBytes, module, "scale_factor"));
  ASSERT_EQ(globalBytes, sizeof(float));
  KILN_ASSERT_CU(cuMemcpyHtoDAsync(global, &scale, sizeof(float), stream));

  CUevent start = nullptr, stop = nullptr;
  KILN_ASSERT_CU(cuEventCreate(&start, CU_EVENT_DEFAULT));
  KILN_ASSERT_CU(cuEventCreate(&stop, CU_EVENT_DEFAULT));
  KILN_ASSERT_CU(cuEventRecord(start, stream));
  float a = 2.0f;
  int count = n;
  void *axpyArgs[] = {&a, &x, &y, &count};
  KILN_ASSERT_CU(cuLaunchKernel(axpy, (n + 255) / 256, 1, 1, 256, 1, 1, 0,
                                stream, axpyArgs, nullptr));
  KILN_ASSERT_CU(cuMemcpyDtoDAsync(y2, y, sizeof(float) * n, stream));
  int c = cols;
  void *sumArgs[] = {&y2, &sums, &c};
  KILN_ASSERT_CU(cuLaunchKernel(rowSum, rows, 1, 1, 256, 1, 1, 32 * 4, stream,
                                sumArgs, nullptr));
  KILN_ASSERT_CU(cuEventRecord(stop, stream));
  KILN_ASSERT_CU(cuStreamWaitEvent(stream, stop, 0));
  std::vector<float> gotY(n), gotSums(rows);
  KILN_ASSERT_CU(cuMemcpyDtoHAsync(gotY.data(), y, sizeof(float) * n, stream));
  KILN_ASSERT_CU(
      cuMemcpyDtoHAsync(gotSums.data(), sums, sizeof(float) * rows, stream));
  KILN_ASSERT_CU(cuStreamSynchronize(stream));
  KILN_ASSERT_CU(cuEventSynchronize(stop));
  float ms = -1;
  KILN_ASSERT_CU(cuEventElapsedTime(&ms, start, stop));
  EXPECT_GE(ms, 0.0f);

  // axpy is one fma-or-mul+add per element: exact up to one rounding.
  for (int i = 0; i < n; ++i)
    ASSERT_NEAR(gotY[i], 2.0f * hx[i] + hy[i], 1e-6f) << "y[" << i << "]";
  // Row sums of 1000 values in [-3, 3] accumulated in f32, in a tree order:
  // within 1e-4 of the double sum (error ~ log2(1000) * 2^-24 * sum|y|).
  for (int r = 0; r < rows; ++r) {
    double want = 0, mag = 0;
    for (int j = 0; j < cols; ++j) {
      want += gotY[size_t(r * cols + j)];
      mag += std::fabs(gotY[size_t(r * cols + j)]);
    }
    ASSERT_NEAR(gotSums[size_t(r)], 0.5 * want, 1e-6 * mag + 1e-6)
        << "row " << r;
  }

  size_t freeBytes = 0, totalBytes = 0;
  KILN_ASSERT_CU(cuMemGetInfo(&freeBytes, &totalBytes));
  EXPECT_GT(totalBytes, 0u);
  EXPECT_LE(freeBytes, totalBytes);
  KILN_ASSERT_CU(cuCtxSynchronize());
  KILN_ASSERT_CU(cuEventDestroy(start));
  KILN_ASSERT_CU(cuEventDestroy(stop));
  KILN_ASSERT_CU(cuMemFree(x));
  KILN_ASSERT_CU(cuMemFree(y));
  KILN_ASSERT_CU(cuMemFree(y2));
  KILN_ASSERT_CU(cuMemFree(sums));
  KILN_ASSERT_CU(cuMemFreeHost(host));
  KILN_ASSERT_CU(cuStreamDestroy(stream));
  KILN_ASSERT_CU(cuModuleUnload(module));
}

} // namespace

TEST(CudaGpu, CompileLoadAndLaunchForTheDevice) {
  KILN_REQUIRE_DEVICE();
  std::string target = targetFor(device().info.major, device().info.minor);
  ASSERT_FALSE(target.empty())
      << archName(device().info) << " is older than NVRTC " << nvrtcVersion()
      << " supports";
  compileLoadAndRun(target); // CUBIN for this GPU (or PTX for a newer one)
}

TEST(CudaGpu, PtxIsCompiledByTheDriver) {
  KILN_REQUIRE_DEVICE();
  std::string target = targetFor(device().info.major, device().info.minor);
  ASSERT_FALSE(target.empty());
  compileLoadAndRun("compute_" + target.substr(target.find('_') + 1));
}

TEST(CudaGpu, FailedCallsNameCallPlaceAndError) {
  KILN_REQUIRE_DEVICE();
  const Driver &d = *device().driver;
  CUdeviceptr ptr = 0;
  // More than any GPU has: CUDA_ERROR_OUT_OF_MEMORY from the real driver.
  Status s = KILN_CU_CHECK(d, cuMemAlloc(&ptr, size_t(1) << 50));
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("cuMemAlloc(&ptr, size_t(1) << 50) failed at "
                             "test/unit/cuda/GpuTest.cpp:"),
            std::string::npos)
      << s.message();
  // The driver answers OUT_OF_MEMORY (or INVALID_VALUE for a size it will
  // not consider); either way its name and description are in the message.
  EXPECT_TRUE(
      s.message().find("CUDA_ERROR_OUT_OF_MEMORY (") != std::string::npos ||
      s.message().find("CUDA_ERROR_INVALID_VALUE (") != std::string::npos)
      << s.message();
  auto missing = PrimaryContext::retain(d, 1000);
  ASSERT_FALSE(missing.isOk());
  EXPECT_NE(missing.status().message().find("CUDA device 1000 does not exist"),
            std::string::npos);
}
