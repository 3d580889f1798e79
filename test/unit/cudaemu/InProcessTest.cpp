//===- InProcessTest.cpp - A kernel compiled into the test binary itself --===//
//
// kiln_cuda.h also works as an ordinary header (or with -include): a kernel
// compiled with the rest of a program, launched through its shim with the
// free launch(), no Module involved. Include it after other headers: it
// defines CUDA's names (threadIdx, __device__, min, ...) as macros and
// globals.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/emu/Emulator.h"

#include <gtest/gtest.h>

#include <vector>

#include "runtime/cuda/kiln_cuda.h"

// Prefix sums within each warp (Hillis-Steele with __shfl_up_sync).
KILN_KERNEL void warp_scan(int *data) {
  int v = data[threadIdx.x];
  for (int offset = 1; offset < 32; offset <<= 1) {
    int up = __shfl_up_sync(0xffffffffu, v, offset);
    if ((threadIdx.x & 31) >= unsigned(offset))
      v += up;
  }
  data[threadIdx.x] = v;
}
KILN_EMU_SHIM(warp_scan);

namespace kiln::cuda::emu {
namespace {

TEST(CudaEmuInProcess, KernelInTheTestBinary) {
  std::vector<int> data(96);
  for (int i = 0; i < 96; ++i)
    data[size_t(i)] = i % 7 + 1;
  std::vector<int> expected(data);
  for (int i = 0; i < 96; ++i)
    if (i % 32)
      expected[size_t(i)] += expected[size_t(i - 1)];
  int *p = data.data();
  void *params[] = {&p};
  LaunchOptions options;
  options.kernel = "warp_scan";
  Status s = launch(warp_scan__emu, {1}, {96}, 0, params, options);
  ASSERT_TRUE(s) << s.message();
  EXPECT_EQ(data, expected);
}

} // namespace
} // namespace kiln::cuda::emu
