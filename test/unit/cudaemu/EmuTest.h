//===- EmuTest.h - Shared helpers for the CUDA emulator's tests -*- C++ -*-===//
//
// The test kernels live in kernels/*.cu (prelude dialect, no prelude
// included): the emulator tests compile them through Module::compile, the
// NVRTC test compiles the same text for sm_80 and sm_90.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_TEST_UNIT_CUDAEMU_EMUTEST_H
#define KILN_TEST_UNIT_CUDAEMU_EMUTEST_H

#include "runtime/cuda/emu/Module.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>

/// Expects `needle` in the string `haystack` (without gmock).
#define EXPECT_CONTAINS(haystack, needle)                                      \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos)             \
      << "expected to find:\n  " << (needle) << "\nin:\n"                      \
      << (haystack)

namespace kiln::cuda::emu::test {

/// The names of the kernel files under kernels/.
inline const std::vector<std::string> &kernelFiles() {
  static const std::vector<std::string> files = {
      "elementwise", "vector", "reduce", "softmax",
      "convert",     "warp",   "errors"};
  return files;
}

inline std::string kernelSource(const std::string &file) {
  std::string path = std::string(KILN_CUDAEMU_KERNELS) + "/" + file + ".cu";
  std::ifstream in(path);
  EXPECT_TRUE(bool(in)) << "cannot read " << path;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// The line of kernels/<file>.cu that carries `// @marker`.
inline int markerLine(const std::string &file, const std::string &marker) {
  std::istringstream in(kernelSource(file));
  int n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    if (line.find("// @" + marker) != std::string::npos)
      return n;
  }
  ADD_FAILURE() << "no marker @" << marker << " in " << file << ".cu";
  return -1;
}

/// kernels/<file>.cu compiled for emulation, once per process (the disk
/// cache makes later processes fast).
inline const Module &kernels(const std::string &file) {
  static std::map<std::string, std::unique_ptr<Module>> modules;
  auto it = modules.find(file);
  if (it == modules.end()) {
    Expected<Module> m = Module::compile(kernelSource(file), file);
    if (!m) {
      ADD_FAILURE() << m.status().message();
      std::abort();
    }
    it = modules.emplace(file, std::make_unique<Module>(std::move(*m))).first;
  }
  return *it->second;
}

/// A fresh seed per test (printed on failure through SCOPED_TRACE).
inline uint32_t freshSeed() { return std::random_device{}(); }

/// Uniform values in [lo, hi) that are never exactly zero.
inline std::vector<float> randomFloats(std::mt19937 &rng, size_t n, float lo,
                                       float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float &x : v) {
    do
      x = dist(rng);
    while (x == 0.0f);
  }
  return v;
}

} // namespace kiln::cuda::emu::test

#endif // KILN_TEST_UNIT_CUDAEMU_EMUTEST_H
