//===- ModuleTest.cpp - Host compilation, the cache and its errors --------===//
#include "test/unit/cudaemu/EmuTest.h"

#include "runtime/cuda/emu/Prelude.h"

#include <cstdlib>
#include <sys/stat.h>
#include <unistd.h>

namespace kiln::cuda::emu::test {
namespace {

/// A fresh cache directory, removed with its files at the end of the test.
class TempDir {
public:
  TempDir() {
    const char *tmp = std::getenv("TMPDIR");
    std::string pattern =
        std::string(tmp && *tmp ? tmp : "/tmp") + "/kiln-emu-test-XXXXXX";
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back(0);
    EXPECT_NE(mkdtemp(buf.data()), nullptr);
    path_ = buf.data();
  }
  ~TempDir() {
    std::string cmd = "rm -rf '" + path_ + "'";
    EXPECT_EQ(std::system(cmd.c_str()), 0);
  }
  const std::string &path() const { return path_; }

private:
  std::string path_;
};

const char *kTwice = R"(
KILN_KERNEL void twice(int *x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    x[i] *= 2;
}
KILN_EMU_SHIM(twice);
)";

Status runTwice(const Module &m) {
  std::vector<int> x = {1, 2, 3, 4, 5};
  int n = 5;
  int *px = x.data();
  void *params[] = {&px, &n};
  if (Status s = m.launch("twice", {1}, {32}, 0, params); !s)
    return s;
  EXPECT_EQ(x, (std::vector<int>{2, 4, 6, 8, 10}));
  return Status::ok();
}

TEST(CudaEmuModule, CompilesThenHitsTheCache) {
  TempDir dir;
  CompileOptions options;
  options.cacheDir = dir.path();
  Expected<Module> first = Module::compile(kTwice, "twice", options);
  ASSERT_TRUE(first) << first.status().message();
  EXPECT_FALSE(first->cacheHit());
  EXPECT_GT(first->compileSeconds(), 0.0);
  EXPECT_EQ(first->sourcePath().rfind(dir.path(), 0), 0u)
      << first->sourcePath();
  ASSERT_TRUE(runTwice(*first));

  Expected<Module> second = Module::compile(kTwice, "twice", options);
  ASSERT_TRUE(second) << second.status().message();
  EXPECT_TRUE(second->cacheHit());
  EXPECT_EQ(second->libraryPath(), first->libraryPath());
  ASSERT_TRUE(runTwice(*second));

  // Other flags are another object.
  options.optimization = "-O0";
  Expected<Module> third = Module::compile(kTwice, "twice", options);
  ASSERT_TRUE(third) << third.status().message();
  EXPECT_FALSE(third->cacheHit());
  EXPECT_NE(third->libraryPath(), first->libraryPath());
}

TEST(CudaEmuModule, UncachedModulesCleanUp) {
  CompileOptions options;
  options.useCache = false;
  std::string library;
  {
    Expected<Module> m = Module::compile(kTwice, "twice", options);
    ASSERT_TRUE(m) << m.status().message();
    EXPECT_FALSE(m->cacheHit());
    library = m->libraryPath();
    ASSERT_TRUE(runTwice(*m));
  }
  struct stat st;
  EXPECT_NE(stat(library.c_str(), &st), 0) << library << " was left behind";
}

TEST(CudaEmuModule, CompileErrorsCarryTheLogAndTheSource) {
  TempDir dir;
  CompileOptions options;
  options.cacheDir = dir.path();
  const std::string broken = "KILN_KERNEL void broken(float *x) {\n"
                             "  x[threadIdx.x] = undeclared_name;\n"
                             "}\n"
                             "KILN_EMU_SHIM(broken);\n";
  Expected<Module> m = Module::compile(broken, "broken", options);
  ASSERT_FALSE(m);
  const std::string &msg = m.status().message();
  EXPECT_CONTAINS(msg, "compiling module 'broken' for host emulation failed");
  EXPECT_CONTAINS(msg, "source: " + dir.path() + "/broken-");
  EXPECT_CONTAINS(msg, "undeclared_name");
  // Diagnostics use the kernel source's own line numbers.
  EXPECT_CONTAINS(msg, "broken.cu:2:");
}

TEST(CudaEmuModule, MissingCompilerIsReported) {
  CompileOptions options;
  options.compiler = "/nonexistent/kiln-no-such-c++";
  Expected<Module> m = Module::compile(kTwice, "twice", options);
  ASSERT_FALSE(m);
  EXPECT_CONTAINS(m.status().message(), "cannot run the host compiler");
}

TEST(CudaEmuModule, MissingShimIsReported) {
  Expected<Module> m = Module::compile(
      "KILN_KERNEL void no_shim(float *x) { x[0] = 1; }\n", "no_shim");
  ASSERT_TRUE(m) << m.status().message();
  Expected<Shim> s = m->shim("no_shim");
  ASSERT_FALSE(s);
  EXPECT_CONTAINS(s.status().message(), "KILN_EMU_SHIM(no_shim);");
}

TEST(CudaEmuModule, PreludePastedTwiceIsHarmless) {
  // The emitter pastes the prelude itself; Module::compile pasting it again
  // must be a no-op thanks to the include guards.
  std::string source = std::string(preludeText()) + kTwice;
  Expected<Module> m = Module::compile(source, "twice_pasted");
  ASSERT_TRUE(m) << m.status().message();
  ASSERT_TRUE(runTwice(*m));
}

TEST(CudaEmuModule, PreludeTextIsTheHeader) {
  std::string_view text = preludeText();
  EXPECT_NE(text.find("#define KILN_CUDA_PRELUDE_H"), std::string_view::npos);
  EXPECT_NE(text.find("KILN_EMU_SHIM"), std::string_view::npos);
}

} // namespace
} // namespace kiln::cuda::emu::test
