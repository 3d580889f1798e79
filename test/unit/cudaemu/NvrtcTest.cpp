//===- NvrtcTest.cpp - The test kernels are valid CUDA as well ------------===//
//
// Every kernel file the emulator tests run is compiled here, prelude first,
// by NVRTC for sm_80 and sm_90: the prelude and the kernels must be valid
// CUDA C++ as well as valid host C++. Needs the CUDA toolkit (NVRTC), not a
// GPU; built only where CMake found the toolkit.
//
//===----------------------------------------------------------------------===//
#include "test/unit/cudaemu/EmuTest.h"

#include "runtime/cuda/emu/Prelude.h"

#include <nvrtc.h>

namespace kiln::cuda::emu::test {
namespace {

/// Compiles `source` to PTX for `arch`; returns "" or the failure with the log.
std::string nvrtcCompile(const std::string &source, const std::string &name,
                         const std::string &arch, std::string *ptx) {
  nvrtcProgram program;
  nvrtcResult rc = nvrtcCreateProgram(
      &program, source.c_str(), (name + ".cu").c_str(), 0, nullptr, nullptr);
  if (rc != NVRTC_SUCCESS)
    return std::string("nvrtcCreateProgram: ") + nvrtcGetErrorString(rc);
  const std::string archFlag = "--gpu-architecture=" + arch;
  const std::string include = std::string("-I") + KILN_CUDA_INCLUDE_DIR;
  const char *options[] = {archFlag.c_str(), "-std=c++17", include.c_str()};
  rc = nvrtcCompileProgram(program, 3, options);
  size_t logSize = 0;
  nvrtcGetProgramLogSize(program, &logSize);
  std::string log(logSize, '\0');
  if (logSize)
    nvrtcGetProgramLog(program, log.data());
  std::string failure;
  if (rc != NVRTC_SUCCESS) {
    failure = std::string("nvrtcCompileProgram(") + name + ", " + arch +
              "): " + nvrtcGetErrorString(rc) + "\n" + log;
  } else {
    size_t ptxSize = 0;
    nvrtcGetPTXSize(program, &ptxSize);
    ptx->assign(ptxSize, '\0');
    nvrtcGetPTX(program, ptx->data());
  }
  nvrtcDestroyProgram(&program);
  return failure;
}

class CudaEmuNvrtc : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaEmuNvrtc, KernelsCompileForSm80AndSm90) {
  const std::string file = GetParam();
  const std::string source =
      std::string(preludeText()) + "\n" + kernelSource(file);
  for (const char *arch : {"sm_80", "sm_90"}) {
    std::string ptx;
    std::string failure = nvrtcCompile(source, file, arch, &ptx);
    ASSERT_EQ(failure, "") << failure;
    // Every kernel of the file is in the PTX as an entry point.
    std::istringstream in(kernelSource(file));
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("KILN_EMU_SHIM(", 0) != 0)
        continue;
      std::string kernel = line.substr(14, line.find(')') - 14);
      EXPECT_NE(ptx.find(".entry " + kernel + "("), std::string::npos)
          << kernel << " missing from the " << arch << " PTX of " << file;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(KernelFiles, CudaEmuNvrtc,
                         ::testing::ValuesIn(kernelFiles()),
                         [](const auto &info) { return info.param; });

} // namespace
} // namespace kiln::cuda::emu::test
