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
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "llvm/Support/raw_ostream.h"

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

// ZeRO: a state argument with kiln.shard becomes a buffer with shardAxis
// and logicalShape (ceil(6 / 4) = 2 elements per device), written to the
// plan's JSON and checked when it is read back.
TEST(CollectivePlanTest, ShardedStateBuffer) {
  mlir::MLIRContext ctx;
  ctx.loadDialect<kiln::KilnDialect, mlir::func::FuncDialect>();
  auto module = mlir::parseSourceString<mlir::ModuleOp>(R"mlir(
module attributes {kiln.mesh = {axes = ["dp"], shape = array<i64: 4>}} {
func.func @train_step(%w: tensor<6xf32> {kiln.param = "w"},
                      %m: tensor<2xf32> {kiln.state = "m:w"})
    -> (tensor<6xf32> {kiln.output = "w"}, tensor<2xf32> {kiln.output = "m:w"}) {
  %h = kiln.constant dense<0.5> : tensor<2xf32>
  %m2 = kiln.mul %m, %h : tensor<2xf32>
  %g = kiln.all_gather %m2 axis = "dp" dim = 0 : tensor<2xf32> -> tensor<8xf32>
  %s = kiln.slice %g start = [0] limit = [6] stride = [1] : tensor<8xf32> -> tensor<6xf32>
  %w2 = kiln.sub %w, %s : tensor<6xf32>
  return %w2, %m2 : tensor<6xf32>, tensor<2xf32>
}
}
)mlir", &ctx);
  ASSERT_TRUE(module);
  // kiln.shard = {axis = "dp", shape = array<i64: 6>}, set after parsing:
  // the dialect's verifier learns the attribute with the data-parallel pass.
  auto step = module->lookupSymbol<mlir::func::FuncOp>("train_step");
  mlir::Builder b(&ctx);
  step.setArgAttr(1, "kiln.shard",
                  b.getDictionaryAttr({b.getNamedAttr("axis", b.getStringAttr("dp")),
                                       b.getNamedAttr("shape", b.getDenseI64ArrayAttr({6}))}));
  kiln::CodegenOptions options;
  options.emitLLVM = false;
  std::string error;
  auto compiled = kiln::compileProgram(*module, options, error);
  ASSERT_TRUE(mlir::succeeded(compiled)) << error;
  const kiln::program::Program &p = compiled->program;
  int m = p.persistent("m:w"), w = p.persistent("w");
  ASSERT_GE(m, 0);
  ASSERT_GE(w, 0);
  EXPECT_EQ(p.buffers[m].shardAxis, "dp");
  EXPECT_EQ(p.buffers[m].logicalShape, (std::vector<int64_t>{6}));
  EXPECT_EQ(p.buffers[m].shape, (std::vector<int64_t>{2}));
  EXPECT_TRUE(p.buffers[w].shardAxis.empty());
  EXPECT_EQ(p.plan(3).buffers[m].shardAxis, "dp");
  // Psi counts w once; the momentum slot is 4 bytes per parameter.
  kiln::ZeroMemory z = kiln::zeroMemory(p);
  EXPECT_EQ(z.psi, 6);
  EXPECT_EQ(z.optimizerBytes, 24);
  std::string json = p.toJson();
  auto parsed = kiln::program::Program::parse(json, "sharded");
  ASSERT_TRUE(parsed) << parsed.status().message();
  EXPECT_EQ(parsed->buffers[m].shardAxis, "dp");
  EXPECT_EQ(parsed->buffers[m].logicalShape, (std::vector<int64_t>{6}));
  EXPECT_EQ(parsed->buffers[m].shardDim, -1);
  // ZeRO buffers are written as before tensor parallelism.
  EXPECT_EQ(json.find("shard_dim"), std::string::npos);
  EXPECT_EQ(json.find("shard_outer"), std::string::npos);
  // A logical shape whose block is not the buffer's size is refused.
  // (Pretty-printed JSON: the 6 follows the key on a later line, once per
  // device.)
  std::string bad = json;
  int replaced = 0;
  for (size_t at = bad.find("\"logical_shape\""); at != std::string::npos;
       at = bad.find("\"logical_shape\"", at + 1)) {
    size_t six = bad.find('6', at);
    ASSERT_NE(six, std::string::npos);
    bad[six] = '9';
    ++replaced;
  }
  EXPECT_EQ(replaced, 4);
  auto refused = kiln::program::Program::parse(bad, "sharded");
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.status().message().find("sharded buffer 'm:w' holds 2 elements, but a block "
                                            "of its 9-element logical tensor over 4 devices has 3"),
            std::string::npos)
      << refused.status().message();
}

namespace {
/// kiln.shard of a tensor-parallel split: dimension `dim` of `shape` in
/// `outer` parts over tp, then ZeRO blocks over `zero` when it is not empty.
mlir::DictionaryAttr tpShard(mlir::Builder &b, llvm::ArrayRef<int64_t> shape, int64_t dim,
                             int64_t outer, llvm::StringRef zero = "") {
  llvm::SmallVector<mlir::NamedAttribute> a = {
      b.getNamedAttr("axis", b.getStringAttr("tp")),
      b.getNamedAttr("shape", b.getDenseI64ArrayAttr(shape)),
      b.getNamedAttr("dim", b.getI64IntegerAttr(dim)),
      b.getNamedAttr("outer", b.getI64IntegerAttr(outer))};
  if (!zero.empty())
    a.push_back(b.getNamedAttr("zero", b.getStringAttr(zero)));
  return b.getDictionaryAttr(a);
}

/// The plan listing (--emit=plan) of `p`.
std::string listingOf(const kiln::program::Program &p) {
  std::string listing;
  llvm::raw_string_ostream os(listing);
  kiln::printPlan(p, os);
  os.flush();
  return listing;
}

/// The plan JSON `json` with every `from` replaced by `to`, parsed as `name`.
auto parseEdited(std::string json, const std::string &from, const std::string &to,
                 const std::string &name) {
  for (size_t at = json.find(from); at != std::string::npos; at = json.find(from, at + 1))
    json.replace(at, from.size(), to);
  return kiln::program::Program::parse(json, name);
}

/// The tensor-parallel module: on a mesh dp x tp = 2 x 2, w [4, 4] split on
/// dim 1 (local [4, 2]) and a fused q/k/v weight [12, 2] split on dim 0 in
/// 3 parts (local [6, 2]), each with its kiln.shard set after parsing (see
/// ShardedStateBuffer), `qkvShard` overriding qkv's.
mlir::OwningOpRef<mlir::ModuleOp> tpModule(mlir::MLIRContext &ctx,
                                           mlir::DictionaryAttr qkvShard = {}) {
  ctx.loadDialect<kiln::KilnDialect, mlir::func::FuncDialect>();
  auto module = mlir::parseSourceString<mlir::ModuleOp>(R"mlir(
module attributes {kiln.mesh = {axes = ["dp", "tp"], shape = array<i64: 2, 2>}} {
func.func @train_step(%w: tensor<4x2xf32> {kiln.param = "w"},
                      %qkv: tensor<6x2xf32> {kiln.param = "qkv"})
    -> (tensor<4x2xf32> {kiln.output = "w"}, tensor<6x2xf32> {kiln.output = "qkv"}) {
  %h = kiln.constant dense<0.5> : tensor<4x2xf32>
  %w2 = kiln.mul %w, %h : tensor<4x2xf32>
  %q = kiln.constant dense<0.25> : tensor<6x2xf32>
  %qkv2 = kiln.sub %qkv, %q : tensor<6x2xf32>
  return %w2, %qkv2 : tensor<4x2xf32>, tensor<6x2xf32>
}
}
)mlir",
                                                        &ctx);
  if (!module)
    return module;
  auto step = module->lookupSymbol<mlir::func::FuncOp>("train_step");
  mlir::Builder b(&ctx);
  step.setArgAttr(0, "kiln.shard", tpShard(b, {4, 4}, 1, 1));
  step.setArgAttr(1, "kiln.shard", qkvShard ? qkvShard : tpShard(b, {12, 2}, 0, 3));
  return module;
}
} // namespace

// Tensor parallelism: kiln.shard with dim and outer becomes Buffer::shardDim
// and shardOuter on every device's plan, round-trips through the plan's
// JSON, is listed by --emit=plan, and counts by its local block in the
// memory report.
TEST(CollectivePlanTest, TensorParallelBuffers) {
  mlir::MLIRContext ctx;
  auto module = tpModule(ctx);
  ASSERT_TRUE(module);
  kiln::CodegenOptions options;
  options.emitLLVM = false;
  std::string error;
  auto compiled = kiln::compileProgram(*module, options, error);
  ASSERT_TRUE(mlir::succeeded(compiled)) << error;
  const kiln::program::Program &p = compiled->program;
  int w = p.persistent("w"), qkv = p.persistent("qkv");
  ASSERT_GE(w, 0);
  ASSERT_GE(qkv, 0);
  EXPECT_EQ(p.numDevices(), 4);
  for (int d = 0; d < 4; ++d) {
    const kiln::program::Buffer &bw = p.plan(d).buffers[size_t(w)];
    EXPECT_EQ(bw.shardAxis, "tp");
    EXPECT_EQ(bw.logicalShape, (std::vector<int64_t>{4, 4}));
    EXPECT_EQ(bw.shape, (std::vector<int64_t>{4, 2}));
    EXPECT_EQ(bw.shardDim, 1);
    EXPECT_EQ(bw.shardOuter, 1);
    const kiln::program::Buffer &bq = p.plan(d).buffers[size_t(qkv)];
    EXPECT_EQ(bq.logicalShape, (std::vector<int64_t>{12, 2}));
    EXPECT_EQ(bq.shardDim, 0);
    EXPECT_EQ(bq.shardOuter, 3);
  }
  std::string json = p.toJson();
  auto parsed = kiln::program::Program::parse(json, "tp");
  ASSERT_TRUE(parsed) << parsed.status().message();
  for (int d = 0; d < 4; ++d) {
    EXPECT_EQ(parsed->plan(d).buffers[size_t(w)].shardDim, 1);
    EXPECT_EQ(parsed->plan(d).buffers[size_t(w)].shardOuter, 1);
    EXPECT_EQ(parsed->plan(d).buffers[size_t(qkv)].shardDim, 0);
    EXPECT_EQ(parsed->plan(d).buffers[size_t(qkv)].shardOuter, 3);
    EXPECT_EQ(parsed->plan(d).buffers[size_t(qkv)].logicalShape,
              (std::vector<int64_t>{12, 2}));
  }
  EXPECT_EQ(parsed->toJson(), json);

  // The listing.
  std::string listing = listingOf(p);
  EXPECT_NE(
      listing.find("w: f32[4x2] of logical [4x4], sharded over tp on dim 1\n"),
      std::string::npos)
      << listing;
  EXPECT_NE(
      listing.find(
          "qkv: f32[6x2] of logical [12x2], sharded over tp on dim 0 in 3 "
          "parts\n"),
      std::string::npos)
      << listing;

  // Memory: each device holds 8 + 12 parameters; ZeRO's N is dp's 2.
  kiln::ZeroMemory z = kiln::zeroMemory(p);
  EXPECT_EQ(z.psi, 20);
  EXPECT_EQ(z.devices, 2);

  // The parser refuses a shard_dim outside the logical shape and a block
  // shape that is not the logical one split.
  auto edit = [&](const std::string &from, const std::string &to) {
    return parseEdited(json, from, to, "tp");
  };
  auto farDim = edit("\"shard_dim\": 1", "\"shard_dim\": 2");
  ASSERT_FALSE(farDim);
  EXPECT_NE(
      farDim.status().message().find(
          "sharded buffer 'w' has a shard_dim outside its 2-d logical_shape"),
      std::string::npos)
      << farDim.status().message();
  auto outer = edit("\"shard_outer\": 3", "\"shard_outer\": 5");
  ASSERT_FALSE(outer);
  EXPECT_NE(outer.status().message().find(
                "buffer 'qkv' splits dimension 0 (size 12) of its "
                "logical tensor into 5 x 2 blocks"),
            std::string::npos)
      << outer.status().message();
}

// ZeRO over dp inside tensor parallelism: state whose kiln.shard keeps the
// tp split and adds zero = "dp" is the device's tp block ([4, 2], 8
// elements) cut into dp blocks (4 elements): Buffer::zeroAxis on every
// device's plan, through the plan's JSON and the listing; the parser
// refuses a block of the wrong size and a zero axis equal to the split's.
TEST(CollectivePlanTest, TensorParallelZeroBuffers) {
  mlir::MLIRContext ctx;
  ctx.loadDialect<kiln::KilnDialect, mlir::func::FuncDialect>();
  auto module = mlir::parseSourceString<mlir::ModuleOp>(R"mlir(
module attributes {kiln.mesh = {axes = ["dp", "tp"], shape = array<i64: 2, 2>}} {
func.func @train_step(%w: tensor<4x2xf32> {kiln.param = "w"},
                      %m: tensor<4xf32> {kiln.state = "m:w"})
    -> (tensor<4x2xf32> {kiln.output = "w"}, tensor<4xf32> {kiln.output = "m:w"}) {
  %h = kiln.constant dense<0.5> : tensor<4x2xf32>
  %w2 = kiln.mul %w, %h : tensor<4x2xf32>
  %q = kiln.constant dense<0.25> : tensor<4xf32>
  %m2 = kiln.sub %m, %q : tensor<4xf32>
  return %w2, %m2 : tensor<4x2xf32>, tensor<4xf32>
}
}
)mlir",
                                                        &ctx);
  ASSERT_TRUE(module);
  auto step = module->lookupSymbol<mlir::func::FuncOp>("train_step");
  mlir::Builder b(&ctx);
  step.setArgAttr(0, "kiln.shard", tpShard(b, {4, 4}, 1, 1));
  step.setArgAttr(1, "kiln.shard", tpShard(b, {4, 4}, 1, 1, "dp"));
  step.setResultAttr(1, "kiln.shard", tpShard(b, {4, 4}, 1, 1, "dp"));
  ASSERT_TRUE(mlir::succeeded(mlir::verify(*module)));
  kiln::CodegenOptions options;
  options.emitLLVM = false;
  std::string error;
  auto compiled = kiln::compileProgram(*module, options, error);
  ASSERT_TRUE(mlir::succeeded(compiled)) << error;
  const kiln::program::Program &p = compiled->program;
  int w = p.persistent("w"), m = p.persistent("m:w");
  ASSERT_GE(m, 0);
  for (int d = 0; d < 4; ++d) {
    const kiln::program::Buffer &bw = p.plan(d).buffers[size_t(w)];
    EXPECT_EQ(bw.zeroAxis, "");
    const kiln::program::Buffer &bm = p.plan(d).buffers[size_t(m)];
    EXPECT_EQ(bm.shardAxis, "tp");
    EXPECT_EQ(bm.shardDim, 1);
    EXPECT_EQ(bm.zeroAxis, "dp");
    EXPECT_EQ(bm.logicalShape, (std::vector<int64_t>{4, 4}));
    EXPECT_EQ(bm.shape, (std::vector<int64_t>{4}));
  }
  std::string json = p.toJson();
  auto parsed = kiln::program::Program::parse(json, "tpzero");
  ASSERT_TRUE(parsed) << parsed.status().message();
  EXPECT_EQ(parsed->plan(3).buffers[size_t(m)].zeroAxis, "dp");
  EXPECT_EQ(parsed->toJson(), json);

  std::string listing = listingOf(p);
  EXPECT_NE(listing.find("m:w: f32[4] of logical [4x4], sharded over tp on dim 1, then ZeRO "
                         "blocks over dp\n"),
            std::string::npos)
      << listing;

  auto same = parseEdited(json, "\"shard_zero\": \"dp\"", "\"shard_zero\": \"tp\"", "tpzero");
  ASSERT_FALSE(same);
  EXPECT_NE(same.status().message().find(
                "sharded buffer 'm:w' has a shard_zero that is not another mesh axis"),
            std::string::npos)
      << same.status().message();
  // A logical [4, 8]: its tp block has 16 elements, a dp block 8, not the
  // buffer's 4.
  std::string grown = json;
  for (size_t at = grown.find("\"name\": \"m:w\""); at != std::string::npos;
       at = grown.find("\"name\": \"m:w\"", at + 1)) {
    size_t logical = grown.find("\"logical_shape\": [", at);
    ASSERT_NE(logical, std::string::npos);
    size_t four = grown.find('4', grown.find(',', logical));
    grown[four] = '8';
  }
  auto wrong = kiln::program::Program::parse(grown, "tpzero");
  ASSERT_FALSE(wrong);
  EXPECT_NE(wrong.status().message().find("a ZeRO block over 2 devices of its 16-element "
                                          "tensor-parallel block has 8 elements"),
            std::string::npos)
      << wrong.status().message();
}

// The compiler refuses a kiln.shard whose dimension does not divide into
// outer x N blocks, naming the argument.
TEST(CollectivePlanTest, TensorParallelShardMustDivide) {
  mlir::MLIRContext ctx;
  mlir::Builder b(&ctx);
  auto bad = b.getDictionaryAttr(
      {b.getNamedAttr("axis", b.getStringAttr("tp")),
       b.getNamedAttr("shape", b.getDenseI64ArrayAttr({9, 2})),
       b.getNamedAttr("dim", b.getI64IntegerAttr(0)),
       b.getNamedAttr("outer", b.getI64IntegerAttr(3))});
  auto module = tpModule(ctx, bad);
  ASSERT_TRUE(module);
  kiln::CodegenOptions options;
  options.emitLLVM = false;
  std::string error;
  auto compiled = kiln::compileProgram(*module, options, error);
  ASSERT_TRUE(mlir::failed(compiled));
  EXPECT_NE(error.find("argument 1 ('qkv') splits dimension 0 (size 9) as 3 "
                       "part(s) over the 2 "
                       "devices of 'tp', but 9 is not a multiple of 6"),
            std::string::npos)
      << error;
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
