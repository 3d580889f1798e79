//===- RandomFormsTest.cpp - The CUDA random hash against Random.h --------===//
//
// runtime/core/Random.h defines the counter-based hash once (its constants
// and mix/bits/uniform/normal); the CUDA emitter writes kiln_mix and
// kiln_unit from those constants. This test emits real kernels with emitCuda
// (kiln.random uniform and normal in f64, one kernel per salt), runs them
// on the CUDA emulator, and compares every element with Random.h; it also
// runs the emitted kiln_mix on fresh 64-bit inputs. (The CPU form is checked
// by test/codegen/lower-composites-run.mlir through mlir-cpu-runner.)
//
// Tolerances: uniforms are 24-bit integers times 2^-24, so exact. Normals go
// through the host's sqrt/log/cos on both sides but may be contracted
// differently by the host compiler: 1e-14 relative (a few ulps).
//
//===----------------------------------------------------------------------===//
#include "compiler/cuda/Emitter.h"
#include "dialects/kiln/KilnDialect.h"
#include "runtime/core/Random.h"
#include "runtime/cuda/emu/Module.h"

#include "mlir/Dialect/Bufferization/IR/Bufferization.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr int64_t kN = 1000;
const uint64_t kSalts[] = {0, 1, 3, 12345, 0x8000000000000007ull};

/// A kernel in emitCuda's input form: func @<name>(seed, out) around one
/// kiln.fusion computing kiln.random.
std::string kernel(const std::string &name, uint64_t salt, bool normal) {
  std::string t = "tensor<" + std::to_string(kN) + "xf64>";
  std::string m = "memref<" + std::to_string(kN) + "xf64>";
  return "func.func @" + name + "(%arg0: memref<i64>, %arg1: " + m + ") {\n" +
         "  %0 = bufferization.to_tensor %arg0 restrict : memref<i64>\n" +
         "  %1 = kiln.fusion \"elementwise\" rows = 0 ins(%0) : (tensor<i64>) -> " + t + " {\n" +
         "  ^bb0(%s: tensor<i64>):\n" + "    %r = kiln.random " +
         (normal ? "normal" : "uniform") + ", %s salt = " + std::to_string(int64_t(salt)) +
         " : tensor<i64> -> " + t + "\n" + "    kiln.yield %r : " + t + "\n  }\n" +
         "  bufferization.materialize_in_destination %1 in restrict writable %arg1 : (" + t +
         ", " + m + ") -> ()\n  return\n}\n";
}

TEST(RandomForms, EmittedCudaMatchesRandomH) {
  mlir::MLIRContext ctx;
  ctx.loadDialect<kiln::KilnDialect, mlir::func::FuncDialect,
                  mlir::bufferization::BufferizationDialect>();
  std::string text;
  kiln::program::Program program;
  for (bool normal : {false, true})
    for (uint64_t salt : kSalts) {
      kiln::program::Kernel k;
      k.symbol = "k" + std::to_string(program.kernels.size());
      k.kind = "elementwise";
      text += kernel(k.symbol, salt, normal);
      program.kernels.push_back(k);
    }
  auto module = mlir::parseSourceString<mlir::ModuleOp>(text, &ctx);
  ASSERT_TRUE(module) << text;
  std::string error;
  auto cuda = kiln::emitCuda(*module, program, error);
  ASSERT_TRUE(mlir::succeeded(cuda)) << error;
  // The emitted kiln_mix on its own, for all 64 bits.
  std::string source = cuda->source + R"cuda(
KILN_KERNEL void mix_all(const unsigned long long *__restrict__ in,
                         unsigned long long *__restrict__ out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = kiln_mix(in[i]);
}
KILN_EMU_SHIM(mix_all);
)cuda";
  auto emu = kiln::cuda::emu::Module::compile(source, "random-forms");
  ASSERT_TRUE(emu) << emu.status().message();

  uint64_t seed0 = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed0));
  std::mt19937_64 rng(seed0);
  size_t k = 0;
  for (bool normal : {false, true})
    for (uint64_t salt : kSalts) {
      SCOPED_TRACE((normal ? "normal, salt " : "uniform, salt ") + std::to_string(salt));
      const kiln::gpu::Launch &l = cuda->kernels[k].at(0);
      ++k;
      for (int64_t seed : {int64_t(0), int64_t(rng()), int64_t(rng())}) {
        std::vector<double> out(kN, -1.0);
        const int64_t *seedPtr = &seed;
        double *outPtr = out.data();
        void *params[] = {&seedPtr, &outPtr};
        kiln::Status s = emu->launch(l.function, {unsigned(l.grid[0])}, {unsigned(l.block[0])},
                                     size_t(l.sharedBytes), params);
        ASSERT_TRUE(s) << s.message();
        int bad = 0;
        for (int64_t i = 0; i < kN; ++i) {
          double want = normal ? kiln::random::normal(uint64_t(seed), salt, uint64_t(i))
                               : kiln::random::uniform(uint64_t(seed), salt, uint64_t(i));
          bool ok = normal ? std::fabs(out[i] - want) <= 1e-14 * std::max(1.0, std::fabs(want))
                           : out[i] == want;
          if (!ok && ++bad <= 3)
            ADD_FAILURE() << "element " << i << ": CUDA " << out[i] << ", Random.h " << want;
        }
      }
    }

  std::vector<unsigned long long> in(4096), out(in.size());
  for (size_t i = 0; i < in.size(); ++i)
    in[i] = i < 64 ? i : rng();
  const unsigned long long *inPtr = in.data();
  unsigned long long *outPtr = out.data();
  int n = int(in.size());
  void *params[] = {&inPtr, &outPtr, &n};
  kiln::Status s = emu->launch("mix_all", {unsigned(n / 256)}, {256}, 0, params);
  ASSERT_TRUE(s) << s.message();
  for (size_t i = 0; i < in.size(); ++i)
    ASSERT_EQ(out[i], kiln::random::mix(in[i])) << "mix(" << in[i] << ")";
}

} // namespace
