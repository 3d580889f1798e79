//===- NvrtcTest.cpp - Run-time compilation with NVRTC --------------------===//
//
// NVRTC needs no driver or GPU, so all of these run on every machine with the
// toolkit.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/Nvrtc.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <tuple>
#include <sys/stat.h>
#include <unistd.h>

using namespace kiln;
using namespace kiln::cuda;

namespace {

const char *kFloatKernel = R"(
extern "C" __global__ void axpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
)";

const char *kHalfKernel = R"(
#include <cuda_fp16.h>
extern "C" __global__ void scale_half(const __half* x, __half* y, float s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __float2half(__half2float(x[i]) * s);
}
)";

const char *kBf16Kernel = R"(
#include <cuda_bf16.h>
extern "C" __global__ void add_bf16(const __nv_bfloat16* x, const __nv_bfloat16* y,
                                    __nv_bfloat16* z, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) z[i] = __float2bfloat16(__bfloat162float(x[i]) + __bfloat162float(y[i]));
}
)";

// One block sums its row: warp shuffles, then the warps' partials through
// shared memory.
const char *kReduceKernel = R"(
__device__ float warpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
extern "C" __global__ void row_sum(const float* x, float* out, int cols) {
  __shared__ float partial[32];
  const float* row = x + (long long)blockIdx.x * cols;
  float v = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) v += row[c];
  v = warpSum(v);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < (blockDim.x >> 5) ? partial[threadIdx.x] : 0.f;
    v = warpSum(v);
    if (threadIdx.x == 0) out[blockIdx.x] = v;
  }
}
)";

// 40 live values summed in all pairs under __launch_bounds__(1024, 2): at
// most 32 registers per thread, so ptxas must spill.
const char *kSpillKernel = R"(
extern "C" __global__ void __launch_bounds__(1024, 2) spill(float* out, const float* in) {
  float r[40];
#pragma unroll
  for (int i = 0; i < 40; ++i) r[i] = in[i * 1024 + threadIdx.x];
  float s = 0;
#pragma unroll
  for (int j = 1; j < 40; ++j)
#pragma unroll
    for (int i = 0; i < 40; ++i) s += r[i] * r[(i + j) % 40];
  out[threadIdx.x] = s;
}
)";

bool isElf(const std::string &image) {
  return image.size() > 4 && image.compare(0, 4,
                                           "\x7f"
                                           "ELF") == 0;
}

std::string tempDir() {
  const char *base = std::getenv("TMPDIR");
  std::string pattern =
      std::string(base && *base ? base : "/tmp") + "/kiln-nvrtc-test-XXXXXX";
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  char *dir = mkdtemp(buf.data());
  return dir ? dir : "";
}

std::string readAll(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// The file libnvrtc was loaded from (/proc/self/maps), for messages.
std::string nvrtcLibrary() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (size_t at = line.find('/'); at != std::string::npos &&
                                    line.find("libnvrtc", at) != std::string::npos &&
                                    line.find("builtins", at) == std::string::npos)
      return line.substr(at);
  return "(libnvrtc not in /proc/self/maps)";
}

} // namespace

TEST(Nvrtc, VersionAndArchitectures) {
  EXPECT_TRUE(std::regex_match(nvrtcVersion(), std::regex("[0-9]+\\.[0-9]+")))
      << nvrtcVersion();
  std::vector<int> archs = supportedArchs();
  ASSERT_FALSE(archs.empty());
  EXPECT_NE(std::find(archs.begin(), archs.end(), 80), archs.end());
  EXPECT_NE(std::find(archs.begin(), archs.end(), 90), archs.end());
  EXPECT_EQ(targetFor(9, 0), "sm_90");
  EXPECT_EQ(targetFor(8, 0), "sm_80");
  // A GPU newer than this NVRTC gets PTX for the newest architecture it knows.
  EXPECT_EQ(targetFor(99, 9), "compute_" + std::to_string(archs.back()));
  // Older than everything supported: nothing to compile for.
  EXPECT_EQ(targetFor(3, 0), "");
  EXPECT_EQ(hashHex("kiln"), hashHex("kiln"));
  EXPECT_NE(hashHex("kiln"), hashHex("kilo"));
  EXPECT_EQ(hashHex("").size(), 16u);
}

// NVRTC 13 has no built-in cuda_fp16.h/cuda_bf16.h: compile() finds the
// toolkit's include folder. On this (toolkit) machine it must be found.
TEST(Nvrtc, FindsTheToolkitHeaders) {
  const std::string &dir = cudaIncludeDir();
  ASSERT_FALSE(dir.empty());
  struct stat st;
  EXPECT_EQ(stat((dir + "/cuda_fp16.h").c_str(), &st), 0) << dir;
  EXPECT_EQ(stat((dir + "/cuda_bf16.h").c_str(), &st), 0) << dir;
}

class NvrtcArch : public ::testing::TestWithParam<std::string> {};

TEST_P(NvrtcArch, CompilesFloatHalfBf16AndShuffleKernels) {
  struct Source {
    const char *name, *text, *entry;
  } sources[] = {{"axpy.cu", kFloatKernel, "axpy"},
                 {"half.cu", kHalfKernel, "scale_half"},
                 {"bf16.cu", kBf16Kernel, "add_bf16"},
                 {"reduce.cu", kReduceKernel, "row_sum"}};
  for (const Source &src : sources) {
    CompileOptions options;
    options.arch = GetParam();
    auto module = compile(src.text, src.name, options);
    ASSERT_TRUE(module.isOk()) << module.status().message();
    EXPECT_EQ(module->arch, GetParam());
    EXPECT_NE(module->ptx.find(".entry " + std::string(src.entry)),
              std::string::npos)
        << src.name;
    EXPECT_NE(module->ptx.find(".target " + GetParam()), std::string::npos)
        << src.name;
    EXPECT_TRUE(isElf(module->cubin))
        << src.name << ": CUBIN is not an ELF image";
    EXPECT_EQ(module->image(), static_cast<const void *>(module->cubin.data()));
    const KernelResources *r = module->resourcesFor(src.entry);
    // Seen once on the H200 machine (same NVRTC 13.0 as here): reduce.cu's
    // log came back empty. Say everything that could explain it.
    ASSERT_NE(r, nullptr) << src.name << " for " << GetParam() << " with NVRTC "
                          << nvrtcVersion() << " from " << nvrtcLibrary()
                          << ": no ptxas report for " << src.entry << "; log ("
                          << module->log.size() << " bytes, "
                          << module->resources.size() << " functions parsed):\n"
                          << module->log << "\nPTX " << module->ptx.size()
                          << " bytes, CUBIN " << module->cubin.size() << " bytes";
    EXPECT_GT(r->registers, 0) << module->log;
    EXPECT_FALSE(r->spills()) << module->log;
  }
}

INSTANTIATE_TEST_SUITE_P(Targets, NvrtcArch,
                         ::testing::Values("sm_80", "sm_90"),
                         [](const auto &info) { return info.param; });

TEST(Nvrtc, VirtualArchitectureGivesPtxOnly) {
  CompileOptions options;
  options.arch = "compute_90";
  auto module = compile(kHalfKernel, "half.cu", options);
  ASSERT_TRUE(module.isOk()) << module.status().message();
  EXPECT_NE(module->ptx.find(".entry scale_half"), std::string::npos);
  EXPECT_TRUE(module->cubin.empty());
  EXPECT_TRUE(module->resources.empty()); // ptxas does not run
  EXPECT_EQ(module->image(), static_cast<const void *>(module->ptx.c_str()));
}

TEST(Nvrtc, SyntaxErrorCarriesLogAndWrittenSource) {
  std::string dir = tempDir();
  ASSERT_FALSE(dir.empty());
  std::string source = "extern \"C\" __global__ void broken(float* x) {\n"
                       "  x[0] = 1.0f\n"
                       "}\n";
  CompileOptions options;
  options.arch = "sm_90";
  options.failureDir = dir;
  auto module = compile(source, "broken.cu", options);
  ASSERT_FALSE(module.isOk());
  const std::string &m = module.status().message();
  // NVRTC's own diagnostic line, with the file name and line number (the
  // missing ';' is noticed at the '}' on line 3).
  EXPECT_NE(m.find("broken.cu(3): error: expected a \";\""), std::string::npos)
      << m;
  EXPECT_NE(m.find("NVRTC " + nvrtcVersion() +
                   " failed to compile the CUDA kernels for sm_90"),
            std::string::npos)
      << m;
  std::string path = dir + "/kiln-nvrtc-" + hashHex(source) + ".cu";
  EXPECT_NE(m.find("the source is in " + path), std::string::npos) << m;
  EXPECT_NE(m.find("reproduce with: nvcc --std=c++17 -arch=sm_90"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("NVRTC options: --std=c++17 -arch=sm_90 -default-device"),
            std::string::npos)
      << m;
  EXPECT_EQ(readAll(path), source);
  EXPECT_NE(readAll(path + ".log").find("expected a \";\""), std::string::npos);
  std::remove((path + ".log").c_str());
  std::remove(path.c_str());
  rmdir(dir.c_str());
}

TEST(Nvrtc, FailingSourceGoesToTmpdirByDefault) {
  std::string dir = tempDir();
  ASSERT_FALSE(dir.empty());
  const char *old = std::getenv("TMPDIR");
  std::string saved = old ? old : "";
  setenv("TMPDIR", dir.c_str(), 1);
  std::string source = "__global__ void k() { undeclared_thing(); }\n";
  auto module = compile(source, "undeclared.cu", {});
  if (old)
    setenv("TMPDIR", saved.c_str(), 1);
  else
    unsetenv("TMPDIR");
  ASSERT_FALSE(module.isOk());
  std::string path = dir + "/kiln-nvrtc-" + hashHex(source) + ".cu";
  EXPECT_NE(module.status().message().find(path), std::string::npos)
      << module.status().message();
  EXPECT_NE(module.status().message().find(
                "identifier \"undeclared_thing\" is undefined"),
            std::string::npos)
      << module.status().message();
  EXPECT_EQ(readAll(path), source);
  std::remove((path + ".log").c_str());
  std::remove(path.c_str());
  rmdir(dir.c_str());
}

TEST(Nvrtc, UnknownOrUnsupportedTargets) {
  CompileOptions options;
  options.arch = "hopper";
  auto a = compile(kFloatKernel, "axpy.cu", options);
  ASSERT_FALSE(a.isOk());
  EXPECT_NE(a.status().message().find("unknown CUDA target 'hopper'"),
            std::string::npos);
  options.arch = "sm_35";
  auto b = compile(kFloatKernel, "axpy.cu", options);
  ASSERT_FALSE(b.isOk());
  EXPECT_NE(
      b.status().message().find("cannot compile for sm_35 (it supports sm_"),
      std::string::npos)
      << b.status().message();
  options.arch = "sm_90";
  options.extraOptions = {"--no-such-option"};
  auto c = compile(kFloatKernel, "axpy.cu", options);
  ASSERT_FALSE(c.isOk());
  EXPECT_NE(c.status().message().find(
                "nvrtcCompileProgram failed at runtime/cuda/Nvrtc.cpp:"),
            std::string::npos)
      << c.status().message();
  EXPECT_NE(c.status().message().find("NVRTC_ERROR_INVALID_OPTION"),
            std::string::npos)
      << c.status().message();
}

TEST(Nvrtc, OptionsReachTheCompiler) {
  const char *src = R"(
extern "C" __global__ void divide(const float* x, float* y) {
  y[threadIdx.x] = x[threadIdx.x] / y[threadIdx.x];
}
#ifndef WIDTH
#error "WIDTH must be defined"
#endif
)";
  CompileOptions options;
  options.arch = "sm_90";
  options.extraOptions = {"-DWIDTH=4"};
  auto precise = compile(src, "div.cu", options);
  ASSERT_TRUE(precise.isOk()) << precise.status().message();
  // IEEE division by default; fast math is opt-in.
  EXPECT_NE(precise->ptx.find("div.rn.f32"), std::string::npos);
  EXPECT_EQ(precise->ptx.find(".loc"), std::string::npos);
  options.fastMath = true;
  options.lineInfo = true;
  auto fast = compile(src, "div.cu", options);
  ASSERT_TRUE(fast.isOk()) << fast.status().message();
  EXPECT_EQ(fast->ptx.find("div.rn.f32"), std::string::npos);
  EXPECT_NE(fast->ptx.find("div.approx"), std::string::npos);
  EXPECT_NE(fast->ptx.find(".loc"), std::string::npos); // -lineinfo
}

TEST(Nvrtc, ResourceReportCountsRegistersSharedMemoryAndSpills) {
  for (const char *arch : {"sm_80", "sm_90"}) {
    CompileOptions options;
    options.arch = arch;
    auto reduce = compile(kReduceKernel, "reduce.cu", options);
    ASSERT_TRUE(reduce.isOk()) << reduce.status().message();
    const KernelResources *r = reduce->resourcesFor("row_sum");
    ASSERT_NE(r, nullptr) << reduce->log;
    EXPECT_GT(r->registers, 0);
    EXPECT_EQ(r->sharedBytes, 32 * 4) << reduce->log;
    EXPECT_EQ(r->barriers, 1) << reduce->log;
    EXPECT_FALSE(r->spills());

    auto spill = compile(kSpillKernel, "spill.cu", options);
    ASSERT_TRUE(spill.isOk()) << spill.status().message();
    ASSERT_EQ(spill->resources.size(), 1u) << spill->log;
    const KernelResources &s = spill->resources[0];
    EXPECT_EQ(s.name, "spill");
    EXPECT_LE(s.registers, 32) << spill->log; // __launch_bounds__(1024, 2)
    EXPECT_GT(s.spillStores, 0) << spill->log;
    EXPECT_GT(s.spillLoads, 0) << spill->log;
    EXPECT_GT(s.stackBytes, 0) << spill->log;
  }
  // Without the report option nothing is parsed.
  CompileOptions quiet;
  quiet.arch = "sm_90";
  quiet.resourceUsage = false;
  auto q = compile(kFloatKernel, "axpy.cu", quiet);
  ASSERT_TRUE(q.isOk());
  EXPECT_TRUE(q->resources.empty());
  EXPECT_TRUE(q->log.empty()) << q->log;
}

// The fallback for a log without the ptxas report (seen on the H200
// machine): registers and stack frame read from the CUBIN's .nv.info agree
// with what ptxas reports for the same compile, for a kernel with shared
// memory and barriers and for one that spills.
TEST(Nvrtc, CubinResourcesAgreeWithThePtxasReport) {
  for (const char *arch : {"sm_80", "sm_90"})
    for (auto [text, name, entry] :
         {std::tuple{kReduceKernel, "reduce.cu", "row_sum"},
          std::tuple{kSpillKernel, "spill.cu", "spill"},
          std::tuple{kBf16Kernel, "bf16.cu", "add_bf16"}}) {
      CompileOptions options;
      options.arch = arch;
      auto m = compile(text, name, options);
      ASSERT_TRUE(m.isOk()) << m.status().message();
      std::vector<KernelResources> parsed = parseResourceUsage(m->log);
      ASSERT_EQ(parsed.size(), 1u) << name << " " << arch << ":\n" << m->log;
      std::vector<KernelResources> fromCubin = resourcesFromCubin(m->cubin);
      ASSERT_EQ(fromCubin.size(), 1u) << name << " " << arch;
      EXPECT_EQ(fromCubin[0].name, entry);
      EXPECT_TRUE(fromCubin[0].fromCubin);
      EXPECT_FALSE(parsed[0].fromCubin);
      EXPECT_GT(fromCubin[0].registers, 0);
      EXPECT_EQ(fromCubin[0].registers, parsed[0].registers) << name << " " << arch;
      EXPECT_EQ(fromCubin[0].stackBytes, parsed[0].stackBytes) << name << " " << arch;
    }
  // Not a CUBIN, or a truncated one: nothing, and no crash.
  EXPECT_TRUE(resourcesFromCubin("").empty());
  EXPECT_TRUE(resourcesFromCubin(std::string("\x7f" "ELF", 4)).empty());
  CompileOptions options;
  options.arch = "sm_90";
  auto m = compile(kReduceKernel, "reduce.cu", options);
  ASSERT_TRUE(m.isOk());
  for (size_t cut : {size_t(64), m->cubin.size() / 2, m->cubin.size() - 1})
    (void)resourcesFromCubin(m->cubin.substr(0, cut));
}

TEST(Nvrtc, ParsesPtxasReportFormats) {
  // CUDA 13 (no cmem on sm_90, cumulative stack), CUDA 12-style with cmem and
  // smem, a non-entry function, and unrelated log lines.
  std::string log =
      "axpy.cu(3): warning #177-D: variable \"t\" was declared but never "
      "referenced\n"
      "ptxas info    : 0 bytes gmem\n"
      "ptxas info    : Compiling entry function 'spill' for 'sm_90'\n"
      "ptxas info    : Function properties for spill\n"
      "ptxas         .     2856 bytes stack frame, 3200 bytes spill stores, "
      "5376 bytes spill loads\n"
      "ptxas info    : Used 32 registers, used 0 barriers, 2856 bytes "
      "cumulative stack size\n"
      "ptxas info    : Compile time = 158.657 ms\n"
      "ptxas info    : Compiling entry function '_Z2smPf' for 'sm_80'\n"
      "ptxas info    : Function properties for _Z2smPf\n"
      "ptxas         .     256 bytes stack frame, 0 bytes spill stores, 0 "
      "bytes spill loads\n"
      "ptxas info    : Used 40 registers, used 1 barriers, 256 bytes "
      "cumulative stack size, "
      "1024 bytes smem, 360 bytes cmem[0]\n"
      "ptxas info    : Function properties for _Z6helperPfi\n"
      "ptxas         .     64 bytes stack frame, 8 bytes spill stores, 8 bytes "
      "spill loads\n"
      "ptxas info    : Compiling entry function 'old' for 'sm_75'\n"
      "ptxas info    : Used 10 registers, 16 bytes smem, 352 bytes cmem[0]\n";
  std::vector<KernelResources> r = parseResourceUsage(log);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].name, "spill");
  EXPECT_EQ(r[0].registers, 32);
  EXPECT_EQ(r[0].stackBytes, 2856);
  EXPECT_EQ(r[0].spillStores, 3200);
  EXPECT_EQ(r[0].spillLoads, 5376);
  EXPECT_EQ(r[0].sharedBytes, 0);
  EXPECT_EQ(r[1].name, "_Z2smPf");
  EXPECT_EQ(r[1].registers, 40);
  EXPECT_EQ(r[1].barriers, 1);
  EXPECT_EQ(r[1].sharedBytes, 1024);
  EXPECT_EQ(r[1].constantBytes, 360);
  EXPECT_EQ(r[1].stackBytes, 256);
  EXPECT_FALSE(r[1].spills()); // the helper's spills are not the kernel's
  EXPECT_EQ(r[2].name, "old");
  EXPECT_EQ(r[2].registers, 10);
  EXPECT_EQ(r[2].sharedBytes, 16);
  EXPECT_EQ(r[2].constantBytes, 352);
  EXPECT_TRUE(parseResourceUsage("").empty());
  EXPECT_TRUE(
      parseResourceUsage("ptxas fatal   : Unresolved extern function 'f'\n")
          .empty());
}
