//===- CostTest.cpp - The per-op cost facts of the kiln dialect -----------===//
//
// CostOpInterface and Kiln_Transcendental (KilnOps.td) against the three
// lists they replaced: the FLOP estimate (10 per element for transcendental
// functions and square roots, 1 for arithmetic, per input element for
// reductions, 14/8 for the composites, 2 m n k for matmul), the ops kiln-fuse
// will not duplicate on tensors, and the ops that give a CPU kernel 512-bit
// vectors. Exact integer counts: no tolerance.
//
//===----------------------------------------------------------------------===//
#include "dialects/kiln/KilnDialect.h"
#include "dialects/kiln/KilnOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace {

struct Fact {
  int64_t flops;
  bool transcendental;
};

TEST(CostTest, EveryOpOnce) {
  mlir::MLIRContext ctx;
  ctx.loadDialect<kiln::KilnDialect, mlir::func::FuncDialect>();
  auto module = mlir::parseSourceString<mlir::ModuleOp>(R"mlir(
func.func @f(%x: tensor<4x8xf32>, %i: tensor<4xi32>, %w: tensor<8x3xf32>, %s: tensor<i64>) {
  %neg = kiln.neg %x : tensor<4x8xf32>
  %abs = kiln.abs %x : tensor<4x8xf32>
  %exp = kiln.exp %x : tensor<4x8xf32>
  %log = kiln.log %x : tensor<4x8xf32>
  %sqrt = kiln.sqrt %x : tensor<4x8xf32>
  %rsqrt = kiln.rsqrt %x : tensor<4x8xf32>
  %tanh = kiln.tanh %x : tensor<4x8xf32>
  %sigmoid = kiln.sigmoid %x : tensor<4x8xf32>
  %relu = kiln.relu %x : tensor<4x8xf32>
  %silu = kiln.silu %x : tensor<4x8xf32>
  %erf = kiln.erf %x : tensor<4x8xf32>
  %cos = kiln.cos %x : tensor<4x8xf32>
  %sin = kiln.sin %x : tensor<4x8xf32>
  %gelu = kiln.gelu tanh, %x : tensor<4x8xf32>
  %cast = kiln.cast %x : tensor<4x8xf32> -> tensor<4x8xbf16>
  %add = kiln.add %x, %x : tensor<4x8xf32>
  %sub = kiln.sub %x, %x : tensor<4x8xf32>
  %mul = kiln.mul %x, %x : tensor<4x8xf32>
  %div = kiln.div %x, %x : tensor<4x8xf32>
  %pow = kiln.pow %x, %x : tensor<4x8xf32>
  %max = kiln.max %x, %x : tensor<4x8xf32>
  %min = kiln.min %x, %x : tensor<4x8xf32>
  %cmp = kiln.compare ge, %x, %x : tensor<4x8xf32>
  %sel = kiln.select %cmp, %x, %x : tensor<4x8xi1>, tensor<4x8xf32>
  %rs = kiln.reduce_sum %x axes = [1] : tensor<4x8xf32> -> tensor<4xf32>
  %rm = kiln.reduce_mean %x axes = [1] : tensor<4x8xf32> -> tensor<4xf32>
  %rx = kiln.reduce_max %x axes = [1] : tensor<4x8xf32> -> tensor<4xf32>
  %mm = kiln.matmul %x, %w : tensor<4x8xf32>, tensor<8x3xf32> -> tensor<4x3xf32>
  %sm = kiln.softmax %x axis = 1 : tensor<4x8xf32>
  %lsm = kiln.log_softmax %x axis = 1 : tensor<4x8xf32>
  %ln = kiln.layer_norm %x : tensor<4x8xf32>
  %ce = kiln.cross_entropy %x, %i reduction = none : tensor<4x8xf32>, tensor<4xi32> -> tensor<4xf32>
  %t = kiln.transpose %x perm = [1, 0] : tensor<4x8xf32> -> tensor<8x4xf32>
  %r = kiln.reshape %x : tensor<4x8xf32> -> tensor<32xf32>
  %d = kiln.dropout %x, %s rate = 5.000000e-01 salt = 1 : tensor<4x8xf32>, tensor<i64>
  return
}
)mlir", &ctx);
  ASSERT_TRUE(module);
  const int64_t n = 32; // elements of %x
  std::map<std::string, Fact> want = {
      {"kiln.neg", {n, false}},         {"kiln.abs", {n, false}},
      {"kiln.exp", {10 * n, true}},     {"kiln.log", {10 * n, true}},
      {"kiln.sqrt", {10 * n, false}},   {"kiln.rsqrt", {10 * n, false}},
      {"kiln.tanh", {10 * n, true}},    {"kiln.sigmoid", {10 * n, true}},
      {"kiln.relu", {n, false}},        {"kiln.erf", {10 * n, true}},
      {"kiln.silu", {11 * n, true}},
      {"kiln.cos", {10 * n, true}},     {"kiln.sin", {10 * n, true}},
      {"kiln.gelu", {10 * n, true}},    {"kiln.cast", {n, false}},
      {"kiln.add", {n, false}},         {"kiln.sub", {n, false}},
      {"kiln.mul", {n, false}},         {"kiln.div", {n, false}},
      {"kiln.pow", {10 * n, true}},     {"kiln.max", {n, false}},
      {"kiln.min", {n, false}},         {"kiln.compare", {n, false}},
      {"kiln.select", {n, false}},      {"kiln.reduce_sum", {n, false}},
      {"kiln.reduce_mean", {n, false}}, {"kiln.reduce_max", {n, false}},
      {"kiln.matmul", {2 * 4 * 3 * 8, false}},
      {"kiln.softmax", {14 * n, true}}, {"kiln.log_softmax", {14 * n, true}},
      {"kiln.layer_norm", {8 * n, false}},
      {"kiln.cross_entropy", {14 * n, true}},
      {"kiln.transpose", {0, false}},   {"kiln.reshape", {0, false}},
      {"kiln.dropout", {0, false}},
  };
  auto fn = module->lookupSymbol<mlir::func::FuncOp>("f");
  size_t seen = 0;
  fn.walk([&](mlir::Operation *op) {
    std::string name = op->getName().getStringRef().str();
    auto it = want.find(name);
    if (it == want.end())
      return;
    ++seen;
    auto cost = mlir::dyn_cast<kiln::CostOpInterface>(op);
    EXPECT_EQ(cost ? cost.estimateFlops() : 0, it->second.flops) << name;
    EXPECT_EQ(op->hasTrait<kiln::trait::Transcendental>(), it->second.transcendental) << name;
    // By name, as the CPU lowering asks (it has only the kernel's op names).
    auto registered = mlir::RegisteredOperationName::lookup(name, &ctx);
    ASSERT_TRUE(registered) << name;
    EXPECT_EQ(registered->hasTrait<kiln::trait::Transcendental>(), it->second.transcendental)
        << name;
  });
  EXPECT_EQ(seen, want.size());
}

} // namespace
