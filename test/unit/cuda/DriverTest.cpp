//===- DriverTest.cpp - Loading the CUDA driver at run time ---------------===//
//
// These run on every machine. Where no libcuda.so.1 exists, Driver::load()
// must fail with the "no NVIDIA driver" message; where one exists it must
// either list the devices or fail with one of the actionable cuInit
// messages. Either way the test checks something: it never passes by doing
// nothing.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/Driver.h"

#include <gtest/gtest.h>

#include <cstring>
#include <dlfcn.h>
#include <link.h>
#include <string>
#include <sys/stat.h>
#include <vector>

using namespace kiln;
using namespace kiln::cuda;

namespace {

bool systemHasLibcuda() {
  // RTLD_NOLOAD first: never load the library just to look.
  if (void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD)) {
    dlclose(h);
    return true;
  }
  void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (h)
    dlclose(h);
  return h != nullptr;
}

/// DT_NEEDED entries of every object loaded into this process.
int collectNeeded(struct dl_phdr_info *info, size_t, void *data) {
  auto *out = static_cast<std::vector<std::string> *>(data);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    if (info->dlpi_phdr[i].p_type != PT_DYNAMIC)
      continue;
    auto *dyn = reinterpret_cast<const ElfW(Dyn) *>(info->dlpi_addr +
                                                    info->dlpi_phdr[i].p_vaddr);
    const char *strtab = nullptr;
    for (const ElfW(Dyn) *d = dyn; d->d_tag != DT_NULL; ++d)
      if (d->d_tag == DT_STRTAB) {
        ElfW(Addr) p = d->d_un.d_ptr;
        // glibc relocates the dynamic section in place; the vDSO does not.
        strtab = reinterpret_cast<const char *>(
            p < info->dlpi_addr ? p + info->dlpi_addr : p);
      }
    if (!strtab)
      continue;
    for (const ElfW(Dyn) *d = dyn; d->d_tag != DT_NULL; ++d)
      if (d->d_tag == DT_NEEDED)
        out->push_back(strtab + d->d_un.d_val);
  }
  return 0;
}

} // namespace

// The binary must start without a driver: nothing in the process (this test,
// Kiln's libraries, NVRTC, cuBLASLt) may name libcuda as a dependency.
TEST(CudaDriver, NothingLinksLibcuda) {
  std::vector<std::string> needed;
  dl_iterate_phdr(collectNeeded, &needed);
  ASSERT_FALSE(needed.empty()) << "could not read any DT_NEEDED entry";
  bool sawNvrtc = false;
  for (const std::string &n : needed) {
    EXPECT_NE(n.rfind("libcuda.so", 0), 0u) << "something links " << n;
    sawNvrtc |= n.rfind("libnvrtc.so", 0) == 0;
  }
  EXPECT_TRUE(sawNvrtc) << "the scan should see libnvrtc (linked by the tests)";
}

TEST(CudaDriver, LoadFailsClearlyOrListsDevices) {
  auto driver = Driver::load();
  if (!systemHasLibcuda()) {
    ASSERT_FALSE(driver.isOk())
        << "no libcuda.so.1 on this machine, yet load() succeeded";
    const std::string &m = driver.status().message();
    EXPECT_EQ(m.rfind("no NVIDIA driver found (dlopen libcuda.so.1: ", 0), 0u)
        << m;
    EXPECT_NE(
        m.find("run on a machine with an NVIDIA GPU and driver, or use the "
               "CPU backend (--device cpu)"),
        std::string::npos)
        << m;
    EXPECT_EQ(driver.status().exitCode(), 1)
        << "a missing driver is a user error";
    std::printf("Driver::load() here: %s\n", m.c_str());
    // The failure is cached: the same answer, without retrying.
    EXPECT_EQ(Driver::load().status().message(), m);
    return;
  }
  if (!driver) {
    // A driver without a usable GPU: the message must say what to do.
    const std::string &m = driver.status().message();
    EXPECT_NE(m.find("--device cpu"), std::string::npos) << m;
    std::printf("Driver::load() here: %s\n", m.c_str());
    return;
  }
  const Driver &d = **driver;
  EXPECT_GE(d.version, kBuiltAgainstVersion / 1000 * 1000);
  auto devices = listDevices(d);
  ASSERT_TRUE(devices.isOk()) << devices.status().message();
  for (const DeviceInfo &info : *devices) {
    EXPECT_FALSE(info.name.empty());
    EXPECT_GE(info.major, 5);
    EXPECT_GT(info.smCount, 0);
    EXPECT_GT(info.totalMemory, 0);
    EXPECT_EQ(archName(info),
              "sm_" + std::to_string(info.major * 10 + info.minor));
    std::printf("device %d: %s, %s, %d SMs, %.1f GiB\n", info.ordinal,
                info.name.c_str(), archName(info).c_str(), info.smCount,
                double(info.totalMemory) / (1 << 30));
  }
}

TEST(CudaDriver, LoadFromMissingLibraryNamesIt) {
  auto driver = Driver::loadFrom("/nonexistent/libcuda.so.1");
  ASSERT_FALSE(driver.isOk());
  const std::string &m = driver.status().message();
  EXPECT_EQ(
      m.rfind("no NVIDIA driver found (dlopen /nonexistent/libcuda.so.1: ", 0),
      0u)
      << m;
  EXPECT_NE(m.find("No such file"), std::string::npos) << m;
}

TEST(CudaDriver, LibraryWithoutTheEntryPointsIsNotADriver) {
  // libdl/libc are certainly loaded and export none of the cu* symbols.
  auto driver = Driver::loadFrom("libc.so.6");
  ASSERT_FALSE(driver.isOk());
  const std::string &m = driver.status().message();
  EXPECT_NE(m.find("lacks cuInit, cuDriverGetVersion"), std::string::npos) << m;
  EXPECT_NE(m.find("more: it is older than CUDA"), std::string::npos) << m;
  EXPECT_NE(m.find("update the NVIDIA driver"), std::string::npos) << m;
}

// The toolkit's stub libcuda exports every real entry point (it is what
// -lcuda links against), so resolving against it checks each versioned name
// the header maps to (cuMemAlloc_v2, cuEventElapsedTime_v2, ...); its cuInit
// then answers CUDA_ERROR_STUB_LIBRARY. Run in a child process: once loaded,
// the stub (soname libcuda.so.1) would answer later dlopen("libcuda.so.1")
// calls in this process.
TEST(CudaDriver, StubLibraryResolvesEveryEntryPointThenRefusesToStart) {
  struct stat st;
  if (stat(KILN_CUDA_STUB_LIBRARY, &st) != 0)
    GTEST_SKIP() << "no stub library at " KILN_CUDA_STUB_LIBRARY;
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        auto driver = Driver::loadFrom(KILN_CUDA_STUB_LIBRARY);
        if (driver.isOk()) {
          std::fprintf(stderr, "stub load succeeded\n");
          std::exit(2);
        }
        std::fprintf(stderr, "%s\n", driver.status().message().c_str());
        const std::string &m = driver.status().message();
        bool ok =
            m.find("lacks") == std::string::npos &&
            m.find("the libcuda found is the CUDA toolkit's stub, not a driver "
                   "(cuInit: CUDA_ERROR_STUB_LIBRARY") != std::string::npos &&
            m.find("--device cpu") != std::string::npos &&
            m.find("stubs/libcuda.so]") != std::string::npos;
        std::exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "toolkit's stub");
}

TEST(CudaDriver, InitFailureMessagesSayWhatToDo) {
  struct Case {
    CUresult code;
    const char *expect;
  } cases[] = {
      {CUDA_ERROR_NO_DEVICE,
       "the NVIDIA driver found no CUDA device (cuInit: "
       "CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)): "
       "check nvidia-smi and CUDA_VISIBLE_DEVICES"},
      {CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER,
       "the NVIDIA driver is too old for CUDA "},
      {CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, "different versions"},
      {CUDA_ERROR_DEVICE_UNAVAILABLE, "exclusive-process mode"},
      {CUDA_ERROR_STUB_LIBRARY, "stub"},
      {CUDA_ERROR_UNKNOWN, "the NVIDIA driver failed to start (cuInit: "},
  };
  for (const Case &c : cases) {
    std::string m = initFailureMessage(
        c.code,
        c.code == CUDA_ERROR_NO_DEVICE ? "CUDA_ERROR_NO_DEVICE" : "NAME",
        c.code == CUDA_ERROR_NO_DEVICE ? "no CUDA-capable device is detected"
                                       : "text");
    EXPECT_NE(m.find(c.expect), std::string::npos) << m;
    EXPECT_NE(m.find("or use the CPU backend (--device cpu)"),
              std::string::npos)
        << m;
  }
}

#define KILN_TEST_STR2(x) #x
#define KILN_TEST_STR(x) KILN_TEST_STR2(x)

namespace {
CUresult fakeAllocOom(CUdeviceptr *, size_t) {
  return CUDA_ERROR_OUT_OF_MEMORY;
}
CUresult fakeAllocOk(CUdeviceptr *p, size_t) {
  *p = 0x1000;
  return CUDA_SUCCESS;
}
CUresult fakeName(CUresult, const char **s) {
  *s = "CUDA_ERROR_OUT_OF_MEMORY";
  return CUDA_SUCCESS;
}
CUresult fakeString(CUresult, const char **s) {
  *s = "out of memory";
  return CUDA_SUCCESS;
}
} // namespace

// The check macro calls the versioned member (cuMemAlloc -> cuMemAlloc_v2,
// as in <cuda.h>) and reports the call as written, the place and the error.
TEST(CudaDriver, CheckMacroNamesCallPlaceAndError) {
  Driver d;
  d.cuGetErrorName = fakeName;
  d.cuGetErrorString = fakeString;
  d.cuMemAlloc = fakeAllocOom;
  EXPECT_STREQ(KILN_TEST_STR(cuMemAlloc), "cuMemAlloc_v2");
  EXPECT_STREQ(KILN_TEST_STR(cuEventElapsedTime), "cuEventElapsedTime_v2");
  EXPECT_STREQ(KILN_TEST_STR(cuMemcpyHtoDAsync), "cuMemcpyHtoDAsync_v2");
  CUdeviceptr ptr = 0;
  int line = __LINE__ + 1;
  Status s = KILN_CU_CHECK(d, cuMemAlloc(&ptr, 1073741824));
  ASSERT_FALSE(s.isOk());
  std::string expect =
      "cuMemAlloc(&ptr, 1073741824) failed at test/unit/cuda/DriverTest.cpp:" +
      std::to_string(line) + ": CUDA_ERROR_OUT_OF_MEMORY (out of memory)";
  EXPECT_EQ(s.message().rfind(expect, 0), 0u) << s.message();
  EXPECT_NE(s.message().find("reduce the batch size"), std::string::npos);
  EXPECT_EQ(s.exitCode(), 1);

  d.cuMemAlloc = fakeAllocOk;
  auto allocate = [&]() -> Status {
    KILN_CU_TRY(d, cuMemAlloc(&ptr, 64));
    return Status::ok();
  };
  EXPECT_TRUE(allocate().isOk());
  EXPECT_EQ(ptr, CUdeviceptr(0x1000));
}

TEST(CudaDriver, VersionsAndArchNames) {
  EXPECT_EQ(formatCudaVersion(13000), "13.0");
  EXPECT_EQ(formatCudaVersion(12080), "12.8");
  DeviceInfo h100;
  h100.major = 9;
  h100.minor = 0;
  EXPECT_EQ(archName(h100), "sm_90");
  DeviceInfo ampere;
  ampere.major = 8;
  ampere.minor = 6;
  EXPECT_EQ(archName(ampere), "sm_86");
}
