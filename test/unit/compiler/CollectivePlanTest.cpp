//===- CollectivePlanTest.cpp - Collective steps in the compiled plan -----===//
//
// The hand-written data-parallel step test/codegen/Inputs/dp_step.mlir
// compiled by compileProgram: the mesh and the replicated device plans,
// every collective step's fields, the queues, and the plan's JSON read back
// by the runtime's parser (Program::parse checks collectives against the
// mesh and their buffers), so the executors can load what kilnc writes.
// Also the ZeRO paper's memory accounting on fp32 Adam (16 / 10 / 7 bytes
// per parameter on 4 devices).
//
//===----------------------------------------------------------------------===//
#include "compiler/Codegen.h"
#include "dialects/kiln/KilnDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"

#include <gtest/gtest.h>

#include <string>

namespace {

using kiln::program::Collective;
using kiln::program::Step;

TEST(CollectivePlanTest, DataParallelStep) {
  mlir::MLIRContext ctx;
  ctx.loadDialect<kiln::KilnDialect, mlir::func::FuncDialect>();
  auto module = mlir::parseSourceFile<mlir::ModuleOp>(
      std::string(KILN_SOURCE_DIR) + "/test/codegen/Inputs/dp_step.mlir", &ctx);
  ASSERT_TRUE(module);
  kiln::CodegenOptions options;
  options.emitLLVM = false;
  std::string error;
  auto compiled = kiln::compileProgram(*module, options, error);
  ASSERT_TRUE(mlir::succeeded(compiled)) << error;
  const kiln::program::Program &p = compiled->program;
  ASSERT_EQ(p.mesh.axes.size(), 1u);
  EXPECT_EQ(p.mesh.axes[0].name, "dp");
  EXPECT_EQ(p.numDevices(), 4);
  EXPECT_EQ(p.queues, 2);
  for (int d = 1; d < 4; ++d) {
    ASSERT_EQ(p.plan(d).buffers.size(), p.buffers.size());
    EXPECT_EQ(p.plan(d).arenaBytes, p.arenaBytes);
    for (size_t b = 0; b < p.buffers.size(); ++b)
      EXPECT_EQ(p.plan(d).buffers[b].offset, p.buffers[b].offset);
  }
  const kiln::program::Function *f = p.function("train_step");
  ASSERT_TRUE(f);
  std::vector<const Step *> colls;
  for (const Step &s : f->steps)
    if (s.kind == Step::Collective)
      colls.push_back(&s);
  ASSERT_EQ(colls.size(), 3u);
  int64_t expectBytes[] = {4, 128, 8192};
  int expectQueue[] = {0, 1, 1};
  for (size_t i = 0; i < 3; ++i) {
    const Collective &c = colls[i]->collective;
    EXPECT_EQ(c.op, Collective::Op::AllReduce);
    EXPECT_EQ(c.reduction, Collective::Reduction::Mean);
    EXPECT_EQ(c.axis, "dp");
    EXPECT_TRUE(c.group.empty());
    EXPECT_EQ(c.dtype, kiln::program::DType::F32);
    EXPECT_EQ(c.bytes, expectBytes[i]);
    EXPECT_EQ(c.sendOffset, 0);
    EXPECT_EQ(c.recvOffset, 0);
    EXPECT_EQ(colls[i]->queue, expectQueue[i]);
    ASSERT_EQ(colls[i]->args.size(), 2u);
    // The loss is returned, so it gets its own buffer; the buckets'
    // operands die at the collective, so they receive in place.
    EXPECT_EQ(colls[i]->args[0] == colls[i]->args[1], i > 0) << "collective " << i;
  }
  // The runtime reads it back: collectives, queues and dependencies valid.
  auto parsed = kiln::program::Program::parse(p.toJson(), "dp_step");
  ASSERT_TRUE(parsed) << parsed.status().message();
  EXPECT_EQ(parsed->queues, 2);
  EXPECT_EQ(parsed->numDevices(), 4);
  const kiln::program::Function *g = parsed->function("train_step");
  ASSERT_TRUE(g);
  ASSERT_EQ(g->steps.size(), f->steps.size());
  for (size_t i = 0; i < f->steps.size(); ++i) {
    EXPECT_EQ(g->steps[i].queue, f->steps[i].queue);
    EXPECT_EQ(g->steps[i].deps, f->steps[i].deps);
    EXPECT_EQ(g->steps[i].collective.bytes, f->steps[i].collective.bytes);
  }
}

// fp32 Adam (slots m and v), Psi = 1000 + 24: 16 Psi for plain DP; ZeRO-1
// 4 + 4 + 8/4 = 10 Psi; ZeRO-2 4 + 12/4 = 7 Psi (the ZeRO paper's
// 2 + 2 + K with K = 12 for mixed precision becomes 4 + 4 + 8 in fp32).
TEST(CollectivePlanTest, ZeroMemoryAccounting) {
  kiln::program::Program p;
  p.mesh.axes.push_back({"dp", 4});
  auto add = [&](const std::string &name, kiln::program::Role role, std::vector<int64_t> shape) {
    kiln::program::Buffer b;
    b.name = name;
    b.role = role;
    b.shape = shape;
    b.bytes = b.numElements() * 4;
    p.buffers.push_back(b);
  };
  using kiln::program::Role;
  add("w", Role::Param, {40, 25});
  add("b", Role::Param, {24});
  add("m:w", Role::State, {40, 25});
  add("v:w", Role::State, {40, 25});
  add("m:b", Role::State, {24});
  add("v:b", Role::State, {24});
  add("step", Role::State, {});
  add("x", Role::Input, {8, 40});
  kiln::ZeroMemory m = kiln::zeroMemory(p);
  EXPECT_EQ(m.psi, 1024);
  EXPECT_EQ(m.devices, 4);
  EXPECT_EQ(m.plainDP(), 16 * 1024);
  EXPECT_EQ(m.zero1(), 10 * 1024);
  EXPECT_EQ(m.zero2(), 7 * 1024);
}

} // namespace
