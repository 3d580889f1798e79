//===- TensorParallelTest.cpp - Tensor-parallel sharded parameters --------===//
//
// The per-dimension form of a sharded buffer (program::Buffer::shardDim,
// shardOuter; docs/parallel.md): dimension D of the logical tensor viewed
// as [K, S/K], device c holding block c of N of each part.
//   - cutDimBlock/joinDimBlocks: exact element positions against
//     hand-computed blocks (K = 1 and 3, dims 0 to 2, ranks 1 to 3), against
//     an element-by-element index formula, and the round trip; refusals;
//   - the trainer: on a ["dp", "tp"] = [2, 2] mesh, four replicas load
//     their blocks from the logical initial values, save a checkpoint by
//     gathering over their tp group (a communicator that fails a gather
//     over any other group), the file holds the logical tensors, and it
//     loads on one device (whole tensors) and on two (blocks).
//
//===----------------------------------------------------------------------===//
#include "FakeWorld.h"

#include "runtime/core/Half.h"
#include "runtime/train/Shards.h"
#include "runtime/train/Trainer.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <thread>

using namespace kiln;
using namespace kiln::train;
using program::Buffer;
using program::DType;
using program::Role;

namespace {

/// A float32 tensor of `shape` whose element at (i0, i1, ...) is the
/// number with decimal digits i0 i1 ... (so 123 is element (1, 2, 3)).
std::string digits(const std::vector<int64_t> &shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  std::string out;
  for (int64_t e = 0; e < n; ++e) {
    int64_t rest = e, value = 0, scale = 1;
    for (size_t i = shape.size(); i-- > 0;) {
      value += (rest % shape[i]) * scale;
      rest /= shape[i];
      scale *= 10;
    }
    float v = float(value);
    out.append(reinterpret_cast<const char *>(&v), 4);
  }
  return out;
}

std::vector<float> floats(const std::string &bytes) {
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

std::string cut(const std::string &logical, const std::vector<int64_t> &shape,
                int64_t dim, int64_t outer, int parts, int index) {
  auto b = cutDimBlock(logical, shape, dim, outer, 4, parts, index, "t");
  EXPECT_TRUE(b) << b.status().message();
  return b ? *b : std::string();
}

/// Every device's block by the definition, one element at a time: logical
/// index s on `dim` is part k = s / (S/K), block c = (s % (S/K)) / r, row
/// j = s % r (r = S / (K N)); its local index on `dim` is k * r + j.
std::vector<std::vector<float>> byDefinition(const std::vector<int64_t> &shape,
                                             int64_t dim, int64_t outer,
                                             int parts) {
  std::vector<float> logical = floats(digits(shape));
  int64_t size = shape[size_t(dim)], r = size / (outer * parts), inner = 1;
  for (size_t i = size_t(dim) + 1; i < shape.size(); ++i)
    inner *= shape[i];
  std::vector<int64_t> local = shape;
  local[size_t(dim)] = size / parts;
  std::vector<std::vector<float>> out(
      size_t(parts), std::vector<float>(logical.size() / size_t(parts)));
  for (size_t e = 0; e < logical.size(); ++e) {
    int64_t before = int64_t(e) / (size * inner), s = int64_t(e) / inner % size,
            after = int64_t(e) % inner;
    int64_t k = s / (size / outer), c = s % (size / outer) / r, j = s % r;
    int64_t l = (before * local[size_t(dim)] + k * r + j) * inner + after;
    out[size_t(c)][size_t(l)] = logical[e];
  }
  return out;
}

/// Cuts `shape` into `parts` blocks, checks them against byDefinition()
/// and joins them back to the logical tensor.
void checkRoundTrip(const std::vector<int64_t> &shape, int64_t dim,
                    int64_t outer, int parts) {
  SCOPED_TRACE(::testing::Message()
               << "shape rank " << shape.size() << " dim " << dim << " outer "
               << outer << " parts " << parts);
  std::string logical = digits(shape);
  std::vector<std::vector<float>> want = byDefinition(shape, dim, outer, parts);
  std::string all;
  for (int c = 0; c < parts; ++c) {
    std::string block = cut(logical, shape, dim, outer, parts, c);
    EXPECT_EQ(floats(block), want[size_t(c)]) << "device " << c;
    all += block;
  }
  auto joined = joinDimBlocks(all, shape, dim, outer, 4, parts, "t");
  ASSERT_TRUE(joined) << joined.status().message();
  EXPECT_EQ(floats(*joined), floats(logical));
}

TEST(TensorParallelShards, PlainSplitOfDim0Rank1) {
  std::string logical = digits({8}); // 0 .. 7
  EXPECT_EQ(floats(cut(logical, {8}, 0, 1, 4, 0)), (std::vector<float>{0, 1}));
  EXPECT_EQ(floats(cut(logical, {8}, 0, 1, 4, 3)), (std::vector<float>{6, 7}));
  checkRoundTrip({8}, 0, 1, 4);
}

TEST(TensorParallelShards, PlainSplitOfDim1Rank2) {
  // [2, 6] over 3 devices: columns 2c, 2c+1 of both rows.
  std::string logical = digits({2, 6});
  EXPECT_EQ(floats(cut(logical, {2, 6}, 1, 1, 3, 0)),
            (std::vector<float>{0, 1, 10, 11}));
  EXPECT_EQ(floats(cut(logical, {2, 6}, 1, 1, 3, 1)),
            (std::vector<float>{2, 3, 12, 13}));
  EXPECT_EQ(floats(cut(logical, {2, 6}, 1, 1, 3, 2)),
            (std::vector<float>{4, 5, 14, 15}));
  checkRoundTrip({2, 6}, 1, 1, 3);
  checkRoundTrip({6, 2}, 0, 1, 3);
}

TEST(TensorParallelShards, FusedQkvRowsByHeads) {
  // A fused q/k/v weight [3C, C], C = 4, over 2 devices: rows 0-3 are q,
  // 4-7 k, 8-11 v; device c holds q's, k's and v's rows 2c, 2c+1.
  std::string logical = digits({12, 4});
  auto rows = [](std::vector<int> rs) {
    std::vector<float> v;
    for (int r : rs)
      for (int col = 0; col < 4; ++col)
        v.push_back(float(r * 10 + col));
    return v;
  };
  EXPECT_EQ(floats(cut(logical, {12, 4}, 0, 3, 2, 0)),
            rows({0, 1, 4, 5, 8, 9}));
  EXPECT_EQ(floats(cut(logical, {12, 4}, 0, 3, 2, 1)),
            rows({2, 3, 6, 7, 10, 11}));
  checkRoundTrip({12, 4}, 0, 3, 2);
  // Its bias [3C]: rank 1.
  EXPECT_EQ(floats(cut(digits({12}), {12}, 0, 3, 2, 1)),
            (std::vector<float>{2, 3, 6, 7, 10, 11}));
  checkRoundTrip({12}, 0, 3, 2);
  checkRoundTrip({12}, 0, 3, 4);
}

TEST(TensorParallelShards, ThreePartsOfDim1Rank3) {
  // [2, 6, 2], dim 1 as 3 parts of 2 over 2 devices: device 1 holds
  // dim-1 indices 1, 3, 5 for each leading index.
  std::string logical = digits({2, 6, 2});
  EXPECT_EQ(floats(cut(logical, {2, 6, 2}, 1, 3, 2, 1)),
            (std::vector<float>{10, 11, 30, 31, 50, 51, 110, 111, 130, 131, 150,
                                151}));
  checkRoundTrip({2, 6, 2}, 1, 3, 2);
  checkRoundTrip({2, 6, 2}, 1, 1, 3);
  checkRoundTrip({3, 4, 4}, 2, 1, 2);
  checkRoundTrip({3, 4, 4}, 2, 2, 2);
  checkRoundTrip({6, 2, 3}, 0, 3, 2);
  checkRoundTrip({4, 3, 2}, 0, 1, 1); // one device: the whole tensor
  EXPECT_EQ(cut(digits({4, 3, 2}), {4, 3, 2}, 0, 1, 1, 0), digits({4, 3, 2}));
}

TEST(TensorParallelShards, RefusesWhatDoesNotDivide) {
  std::string logical = digits({6, 4});
  auto b = cutDimBlock(logical, {6, 4}, 0, 1, 4, 4, 0, "model.kpack: 'w'");
  ASSERT_FALSE(b);
  EXPECT_NE(b.status().message().find("model.kpack: 'w'"), std::string::npos)
      << b.status().message();
  EXPECT_NE(b.status().message().find("dimension 0 (size 6)"),
            std::string::npos)
      << b.status().message();
  EXPECT_TRUE(
      cutDimBlock(logical, {6, 4}, 0, 3, 4, 2, 0, "w")); // 6 = 3 x 2 x 1
  EXPECT_FALSE(cutDimBlock(logical, {6, 4}, 0, 3, 4, 4, 0, "w")); // 3 x 4 > 6
  EXPECT_FALSE(cutDimBlock(logical, {6, 4}, 1, 3, 4, 1, 0, "w")); // 4 % 3
  EXPECT_FALSE(
      cutDimBlock(logical, {6, 4}, 2, 1, 4, 2, 0, "w")); // no dimension 2
  EXPECT_FALSE(
      cutDimBlock(logical.substr(4), {6, 4}, 1, 1, 4, 2, 0, "w")); // short
  EXPECT_FALSE(joinDimBlocks(logical, {6, 4}, 1, 1, 4, 3, "w"));   // 4 % 3
}

// --- The trainer: load, gather for the checkpoint, resume ----------------

/// Holds every buffer on the host; runs nothing.
class HostBackend : public Backend {
public:
  explicit HostBackend(const program::Program &p) : p_(p) {
    for (const Buffer &b : p.buffers)
      data_.emplace_back(size_t(b.bytes), '\0');
  }
  const program::Program &program() const override { return p_; }
  std::string describe() const override { return "host buffers"; }
  Status write(int id, const void *src, size_t bytes) override {
    if (bytes != data_[size_t(id)].size())
      return Status::internal(fmt::format("write of {} bytes into '{}' of {}",
                                          bytes, p_.buffers[size_t(id)].name,
                                          data_[size_t(id)].size()));
    std::memcpy(data_[size_t(id)].data(), src, bytes);
    return Status::ok();
  }
  Status read(int id, void *dst, size_t bytes) override {
    if (bytes > data_[size_t(id)].size())
      return Status::internal("read of the wrong size");
    std::memcpy(dst, data_[size_t(id)].data(), bytes);
    return Status::ok();
  }
  Status runSteps(const std::string &, size_t, size_t) override {
    return Status::internal("HostBackend runs nothing");
  }
  Status synchronize() override { return Status::ok(); }
  void setProfiling(bool) override {}
  std::vector<Timing> timings() override { return {}; }

private:
  const program::Program &p_;
  std::vector<std::string> data_;
};

/// A fake communicator for one tp group that fails any gather over another
/// group than `expect` (world ranks), as gathering over the world would.
class GroupComm : public test::FakeComm {
public:
  GroupComm(std::shared_ptr<test::FakeWorld> w, int rank, comm::Group expect)
      : FakeComm(std::move(w), rank), expect_(std::move(expect)) {}
  Status allGather(const void *send, void *recv, int64_t sendCount,
                   ElementType type, const comm::Group &group = {}) override {
    if (group != expect_)
      return Status::internal(
          fmt::format("all_gather over [{}], not the tp group [{}]",
                      fmt::join(group, " "), fmt::join(expect_, " ")));
    return FakeComm::allGather(send, recv, sendCount, type, group);
  }

private:
  comm::Group expect_;
};

/// Parameters w [2, 4] split on dim 1 and qkv [6, 2] split on dim 0 in 3
/// parts, and w's momentum "m:w" like w, over "tp" of a mesh dp x tp (no
/// mesh when both are 1); plus an unsharded bias.
Package tpPackage(int dp, int tp) {
  Package pkg;
  pkg.path = "tp.kpack";
  pkg.model = "tp";
  pkg.sourceHash = "0123456789abcdef";
  program::Program &p = pkg.program;
  if (dp > 1)
    p.mesh.axes.push_back({"dp", dp});
  if (tp > 1)
    p.mesh.axes.push_back({"tp", tp});
  auto add = [&](const char *name, Role role, std::vector<int64_t> logical,
                 int64_t dim, int64_t outer) {
    Buffer b;
    b.name = name;
    b.role = role;
    b.shape = logical;
    if (dim >= 0 && tp > 1) {
      b.shardAxis = "tp";
      b.logicalShape = logical;
      b.shardDim = dim;
      b.shardOuter = outer;
      b.shape[size_t(dim)] /= tp;
    }
    b.bytes = b.numElements() * 4;
    b.offset = p.arenaBytes;
    p.arenaBytes += (b.bytes + 63) / 64 * 64;
    p.buffers.push_back(b);
    ckpt::Tensor t;
    t.name = name;
    t.dtype = "F32";
    t.shape = logical;
    t.bytes = digits(logical);
    pkg.initial.tensors.push_back(t);
  };
  add("w", Role::Param, {2, 4}, 1, 1);
  add("qkv", Role::Param, {6, 2}, 0, 3);
  add("m:w", Role::State, {2, 4}, 1, 1);
  add("b", Role::Param, {3}, -1, 1);
  p.persistentBytes = p.arenaBytes;
  for (int d = 1; d < dp * tp; ++d)
    p.otherDevices.push_back(
        program::BufferPlan{p.buffers, p.persistentBytes, p.arenaBytes});
  // What kilnc writes, the runtime reads: the fields survive the plan's JSON.
  auto parsed = program::Program::parse(p.toJson(), "tp plan");
  EXPECT_TRUE(parsed) << parsed.status().message();
  if (parsed) {
    EXPECT_EQ(parsed->buffers[0].shardDim, tp > 1 ? 1 : -1);
    EXPECT_EQ(parsed->buffers[1].shardOuter, tp > 1 ? 3 : 1);
    p = std::move(*parsed);
  }
  return pkg;
}

std::vector<float> buffer(Model &m, const std::string &name) {
  auto v = m.exec->readAll<float>(m.prog().persistent(name));
  EXPECT_TRUE(v) << v.status().message();
  return v ? *v : std::vector<float>{};
}

TEST(TensorParallelShards, CheckpointGathersOverTheTpGroupAndResumesAnywhere) {
  std::string dir = testing::TempDir() + "kiln-tp-checkpoint";
  ASSERT_EQ(
      std::system(("rm -rf '" + dir + "' && mkdir -p '" + dir + "'").c_str()),
      0);
  // Devices 0, 1 (dp 0) and 2, 3 (dp 1): one in-process world per tp group.
  std::vector<std::shared_ptr<test::FakeWorld>> worlds = {
      std::make_shared<test::FakeWorld>(2),
      std::make_shared<test::FakeWorld>(2)};
  std::vector<std::unique_ptr<GroupComm>> comms;
  std::vector<std::unique_ptr<Model>> models;
  for (int d = 0; d < 4; ++d) {
    comms.push_back(std::make_unique<GroupComm>(
        worlds[size_t(d / 2)], d % 2,
        axisGroup(tpPackage(2, 2).program.mesh, d, "tp")));
    comms.back()->setTimeout(10);
    auto m = std::make_unique<Model>();
    m->pkg = tpPackage(2, 2);
    m->comm = comms.back().get();
    m->device = d;
    // attach() loads the logical initial values: each device its blocks.
    ASSERT_TRUE(m->attach(std::make_unique<HostBackend>(m->pkg.program)));
    ASSERT_TRUE(m->hasShardedState());
    int c = d % 2;
    std::vector<float> w = c == 0 ? std::vector<float>{0, 1, 10, 11}
                                  : std::vector<float>{2, 3, 12, 13};
    EXPECT_EQ(buffer(*m, "w"), w) << "device " << d;
    EXPECT_EQ(buffer(*m, "m:w"), w) << "device " << d;
    EXPECT_EQ(buffer(*m, "qkv"),
              c == 0 ? (std::vector<float>{0, 1, 20, 21, 40, 41})
                     : (std::vector<float>{10, 11, 30, 31, 50, 51}))
        << "device " << d;
    EXPECT_EQ(buffer(*m, "b"), (std::vector<float>{0, 1, 2}));
    models.push_back(std::move(m));
  }
  // Train "a step": every device adds 100 * (its tp coordinate + 1) to w,
  // so the checkpoint must put each device's block in its place.
  for (int d = 0; d < 4; ++d) {
    std::vector<float> w = buffer(*models[size_t(d)], "w");
    for (float &v : w)
      v += 100.f * float(d % 2 + 1);
    ASSERT_TRUE(models[size_t(d)]->exec->write(
        models[size_t(d)]->prog().persistent("w"), w.data(), w.size() * 4));
  }
  std::string path = dir + "/c.safetensors";
  Status saved[4];
  std::vector<std::thread> others;
  for (int d = 1; d < 4; ++d)
    others.emplace_back([&, d] {
      saved[d] =
          saveCheckpoint(*models[size_t(d)], path, 5, 3, /*write=*/false);
    });
  saved[0] = saveCheckpoint(*models[0], path, 5, 3, /*write=*/true);
  for (std::thread &t : others)
    t.join();
  for (int d = 0; d < 4; ++d)
    ASSERT_TRUE(saved[d]) << "device " << d << ": " << saved[d].message();

  auto c = ckpt::read(path);
  ASSERT_TRUE(c) << c.status().message();
  std::vector<float> trained = {100, 101, 202, 203, 110, 111, 212, 213};
  EXPECT_EQ(floats(c->find("w")->bytes), trained);
  EXPECT_EQ(c->find("w")->shape, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(c->find("qkv")->bytes, digits({6, 2}));
  EXPECT_EQ(c->find("qkv")->shape, (std::vector<int64_t>{6, 2}));
  EXPECT_EQ(c->find("m:w")->bytes, digits({2, 4}));
  EXPECT_EQ(floats(c->find("b")->bytes), (std::vector<float>{0, 1, 2}));

  // One device: the logical tensors.
  {
    Model one;
    one.pkg = tpPackage(1, 1);
    auto r = readCheckpoint(one, path, true, {});
    ASSERT_TRUE(r) << r.status().message();
    one.exec = std::make_unique<HostBackend>(one.pkg.program);
    ASSERT_TRUE(one.setPersistent(*r));
    EXPECT_EQ(buffer(one, "w"), trained);
    EXPECT_EQ(buffer(one, "qkv"), floats(digits({6, 2})));
  }
  // Two devices on tp alone: blocks again.
  for (int d = 0; d < 2; ++d) {
    Model m;
    m.pkg = tpPackage(1, 2);
    m.device = d;
    auto r = readCheckpoint(m, path, true, {});
    ASSERT_TRUE(r) << r.status().message();
    m.exec = std::make_unique<HostBackend>(m.pkg.program);
    ASSERT_TRUE(m.setPersistent(*r));
    EXPECT_EQ(buffer(m, "w"), d == 0
                                  ? (std::vector<float>{100, 101, 110, 111})
                                  : (std::vector<float>{202, 203, 212, 213}));
    EXPECT_EQ(buffer(m, "qkv"),
              d == 0 ? (std::vector<float>{0, 1, 20, 21, 40, 41})
                     : (std::vector<float>{10, 11, 30, 31, 50, 51}));
  }
}

/// Mixed precision: the low copy "lowp:w" of a tensor-parallel parameter is
/// not in checkpoints; on load it is rounded from the logical float32 w and
/// cut like w (device 1's block of [2, 4] split on dim 1: columns 2, 3).
TEST(TensorParallelShards, LowCopyOfATpParameterIsItsBlockRounded) {
  for (int d = 0; d < 2; ++d) {
    Model m;
    m.pkg = tpPackage(1, 2);
    program::Program &p = m.pkg.program;
    // lowp:w as bf16, sharded like w, appended to every device's plan.
    Buffer low = p.buffers[size_t(p.persistent("w"))];
    low.name = "lowp:w";
    low.role = Role::State;
    low.dtype = DType::BF16;
    low.bytes = low.numElements() * 2;
    low.offset = p.arenaBytes;
    p.arenaBytes += 64;
    p.persistentBytes = p.arenaBytes;
    p.buffers.push_back(low);
    for (program::BufferPlan &o : p.otherDevices) {
      o.buffers.push_back(low);
      o.arenaBytes = o.persistentBytes = p.arenaBytes;
    }
    m.device = d;
    ckpt::Checkpoint c = m.pkg.initial;
    // w + 2^-10: bf16 (8 significant bits) rounds it away from every value
    // >= 1 and keeps it at 0 (2^-10 is exact).
    std::vector<float> w = floats(c.find("w")->bytes);
    for (float &v : w)
      v += 1.f / 1024;
    const_cast<ckpt::Tensor *>(c.find("w"))
        ->bytes.assign(reinterpret_cast<const char *>(w.data()), w.size() * 4);
    m.exec = std::make_unique<HostBackend>(p);
    ASSERT_TRUE(m.setPersistent(c));
    std::string bytes(8, '\0');
    ASSERT_TRUE(m.exec->read(p.persistent("lowp:w"), bytes.data(), 8));
    std::vector<float> got;
    for (int k = 0; k < 4; ++k) {
      uint16_t h;
      std::memcpy(&h, bytes.data() + 2 * k, 2);
      got.push_back(halfToFloat(DType::BF16, h));
    }
    EXPECT_EQ(got, d == 0 ? (std::vector<float>{1.f / 1024, 1, 10, 11})
                          : (std::vector<float>{2, 3, 12, 13}))
        << "device " << d;
  }
}

/// A checkpoint gathered over the world instead of the tp group is refused
/// by GroupComm: the harness above can fail.
TEST(TensorParallelShards, GroupCommRefusesTheWorld) {
  auto world = std::make_shared<test::FakeWorld>(1);
  GroupComm comm(world, 0, {2, 3});
  float x = 1, y[4];
  EXPECT_FALSE(comm.allGather(&x, y, 1, ElementType::F32, {0, 1, 2, 3}));
  EXPECT_TRUE(comm.allGather(&x, y, 1, ElementType::F32, {2, 3}));
}

} // namespace
