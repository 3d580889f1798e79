//===- DistributedTest.cpp - The multi-rank trainer -----------------------===//
//
// What the trainer adds for several devices, on hand-built programs and a
// fake data-parallel backend (a linear model whose step all-reduces its
// gradient through the replica's communicator, as a compiled DP step does):
//   - each replica's data is its block of the global batch: N replicas
//     together read exactly the rows one device with an N-times batch reads
//     (npy rows and token windows), disjoint, a function of the step;
//   - ZeRO-sharded state: a device takes its block of the logical tensor on
//     load, the blocks are gathered for the checkpoint (logical layout), and
//     a checkpoint resumes on any device count;
//   - N replicas on threads train like one device on the N-times batch, and
//     bit for bit alike from run to run; a resumed run on another device
//     count continues it;
//   - a replica that exits or stalls (KILN_FAULT_INJECT) makes the others
//     stop within the collective timeout, naming the rank and the step, and
//     the last checkpoint stays as it was;
//   - --device specs, the device-count check, launcher environments.
// The communicator is a test fake (FakeWorld.h), so these run without
// runtime/comm.
//
//===----------------------------------------------------------------------===//
#include "FakeWorld.h"

#include "TrainFixtures.h"
#include "runtime/core/Data.h"
#include "runtime/core/Random.h"
#include "runtime/train/Devices.h"
#include "runtime/train/Launch.h"
#include "runtime/train/Replicas.h"
#include "runtime/train/Shards.h"
#include "runtime/train/Trainer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <stdexcept>
#include <thread>

using namespace kiln;
using namespace kiln::train;
using program::Buffer;
using program::DType;
using program::Role;

namespace {

constexpr int64_t kFeatures =
    5; // not a multiple of 2 or 4: ZeRO blocks are padded

enum Id { W, M, X, Y, StepIn, ReplicaIn, Loss, Norm, Lr, NumBuffers };

/// A linear model y = w.x trained by SGD with momentum, `rows` rows per
/// device, on a mesh of `devices` along "dp" (no mesh for one). With
/// `shardM`, the momentum is ZeRO-sharded: a block of ceil(5 / devices).
Package dpPackage(int64_t rows, int devices, bool shardM = false) {
  Package pkg;
  pkg.path = "dp.kpack";
  pkg.model = "linear";
  pkg.sourceHash = "0123456789abcdef";
  program::Program &p = pkg.program;
  if (devices > 1)
    p.mesh.axes.push_back({"dp", devices});
  auto add = [&](const char *name, Role role, DType t,
                 std::vector<int64_t> shape) {
    Buffer b;
    b.name = name;
    b.role = role;
    b.dtype = t;
    b.shape = std::move(shape);
    b.bytes = b.numElements() * program::dtypeBytes(t);
    b.offset = p.arenaBytes;
    p.arenaBytes += (b.bytes + 63) / 64 * 64;
    p.buffers.push_back(b);
  };
  add("w", Role::Param, DType::F32, {kFeatures});
  add("m:w", Role::State, DType::F32,
      {shardM ? blockElements(kFeatures, devices) : kFeatures});
  add("x", Role::Input, DType::F32, {rows, kFeatures});
  add("y", Role::Input, DType::F32, {rows});
  add("step", Role::Input, DType::I64, {});
  add("replica", Role::Input, DType::I64, {});
  add("loss", Role::Output, DType::F32, {});
  add("grad_norm", Role::Output, DType::F32, {});
  add("lr", Role::Output, DType::F32, {});
  p.persistentBytes = p.buffers[X].offset;
  for (int d = 1; d < devices; ++d)
    p.otherDevices.push_back(
        program::BufferPlan{p.buffers, p.persistentBytes, p.arenaBytes});
  program::Function train;
  train.name = "train_step";
  train.args = {W, M, X, Y, StepIn, ReplicaIn};
  train.results = {Loss, Norm, Lr};
  p.functions = {train};
  for (int id : {W, M}) {
    ckpt::Tensor t;
    t.name = p.buffers[id].name;
    t.dtype = "F32";
    t.shape = {kFeatures};
    for (int64_t k = 0; k < kFeatures; ++k) {
      float v = id == W ? 0.1f * float(k) : 0.f;
      t.bytes.append(reinterpret_cast<const char *>(&v), 4);
    }
    pkg.initial.tensors.push_back(t);
  }
  pkg.train.steps = 20;
  pkg.train.seed = 7;
  return pkg;
}

/// The shardings dpPackage() means (this build's Buffer may lack the fields).
std::vector<ShardSpec> dpShards(bool shardM) {
  std::vector<ShardSpec> s(NumBuffers);
  for (int id = 0; id < NumBuffers; ++id)
    s[size_t(id)].logicalShape = id == W || id == M
                                     ? std::vector<int64_t>{kFeatures}
                                     : std::vector<int64_t>{};
  if (shardM)
    s[M].axis = "dp";
  return s;
}

/// Runs the linear model's step on the host as a compiled data-parallel
/// step would: the mean gradient over this device's rows, all-reduced as a
/// mean over the devices (member order), the loss likewise, then the
/// update on every device.
class DpBackend : public Backend {
public:
  DpBackend(const program::Program &p, comm::Communicator *c)
      : p_(p), comm_(c) {
    for (const Buffer &b : p.buffers)
      data_.emplace_back(size_t(b.bytes), '\0');
  }
  const program::Program &program() const override { return p_; }
  std::string describe() const override { return "fake dp"; }
  Status write(int id, const void *src, size_t bytes) override {
    if (bytes != data_[size_t(id)].size())
      return Status::internal(
          fmt::format("write of {} bytes into a buffer of {}", bytes,
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
    int64_t rows = p_.buffers[X].shape[0];
    float *w = f(W), *m = f(M), *x = f(X), *y = f(Y);
    float grad[kFeatures + 1] = {}; // the loss rides along as the last entry
    for (int64_t r = 0; r < rows; ++r) {
      float pred = 0;
      for (int64_t k = 0; k < kFeatures; ++k)
        pred += w[k] * x[r * kFeatures + k];
      float e = pred - y[r];
      grad[kFeatures] += e * e / float(rows);
      for (int64_t k = 0; k < kFeatures; ++k)
        grad[k] += 2 * e * x[r * kFeatures + k] / float(rows);
    }
    if (comm_)
      if (Status s = comm_->allReduce(grad, grad, kFeatures + 1,
                                      ElementType::F32, comm::Reduction::Mean);
          !s)
        return s;
    int64_t step, replica;
    std::memcpy(&step, data_[StepIn].data(), 8);
    std::memcpy(&replica, data_[ReplicaIn].data(), 8);
    replicas.push_back(replica);
    float norm = 0, lr = 0.05f;
    for (int64_t k = 0; k < kFeatures; ++k) {
      norm += grad[k] * grad[k];
      m[k] = 0.9f * m[k] + grad[k];
      w[k] = w[k] - lr * m[k];
    }
    *f(Loss) = grad[kFeatures];
    *f(Norm) = std::sqrt(norm);
    *f(Lr) = lr;
    return Status::ok();
  }
  Status synchronize() override { return Status::ok(); }
  void setProfiling(bool) override {}
  std::vector<Timing> timings() override { return {}; }
  std::vector<float> weights() {
    return std::vector<float>(f(W), f(W) + kFeatures);
  }
  /// The "replica" input of every step run.
  std::vector<int64_t> replicas;

private:
  float *f(int id) {
    return reinterpret_cast<float *>(data_[size_t(id)].data());
  }
  const program::Program &p_;
  comm::Communicator *comm_;
  std::vector<std::string> data_;
};

std::string tempDir() { return fixtures::freshDir("kiln-dist-"); }

/// DIR/x.npy, DIR/y.npy: `rows` rows; x's first feature is the row's index
/// (so a batch says which rows it took), y = (1, -2, 0.5, 3, 1) . x / 40.
void writeData(const std::string &dir, int64_t rows) {
  data::NpyArray x, y;
  x.descr = y.descr = "<f4";
  x.shape = {rows, kFeatures};
  y.shape = {rows};
  const double truth[kFeatures] = {1, -2, 0.5, 3, 1};
  for (int64_t r = 0; r < rows; ++r) {
    double v = 0;
    for (int64_t k = 0; k < kFeatures; ++k) {
      double e = k == 0 ? double(r) / 40
                        : random::uniform(3, uint64_t(r), uint64_t(k)) * 2 - 1;
      x.f.push_back(e);
      v += truth[k] * e;
    }
    y.f.push_back(v);
  }
  ASSERT_TRUE(data::writeNpy(dir + "/x.npy", x));
  ASSERT_TRUE(data::writeNpy(dir + "/y.npy", y));
}

Model modelOf(Package pkg) {
  Model m;
  m.pkg = std::move(pkg);
  return m;
}

std::vector<float> floats(const std::string &bytes) {
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

// --- Data: each replica's block of the global batch -------------------------

TEST(DataShards, NpyReplicasTogetherReadTheRowsOfOneDeviceWithTheGlobalBatch) {
  std::string dir = tempDir();
  writeData(dir, 40);
  for (int n : {2, 4}) {
    const int64_t rows =
        3; // per device; 40 rows are 3.3 (n = 4) or 6.7 global batches
    Model one = modelOf(dpPackage(rows * n, 1));
    auto whole = openData(dir, one, "train_step", 7, true, "training");
    ASSERT_TRUE(whole) << whole.status().message();
    std::vector<std::unique_ptr<DataSource>> parts;
    Model dev = modelOf(dpPackage(rows, n));
    for (int r = 0; r < n; ++r) {
      auto s = openData(dir, dev, "train_step", 7, true, "training",
                        DataShard{r, n});
      ASSERT_TRUE(s) << s.status().message();
      parts.push_back(std::move(*s));
    }
    EXPECT_EQ((*whole)->epochBatches(), parts[0]->epochBatches());
    for (uint64_t i = 0; i < 25; ++i) {
      Batch g = (*whole)->batch(i);
      std::string x, y;
      for (auto &p : parts) {
        Batch b = p->batch(i);
        x += b.bytes[0];
        y += b.bytes[1];
      }
      ASSERT_EQ(x, g.bytes[0]) << n << " replicas, batch " << i;
      ASSERT_EQ(y, g.bytes[1]) << n << " replicas, batch " << i;
    }
    // Disjoint: the replicas of one step take different rows (a step
    // within an epoch: 40 rows hold 3 global batches of 12).
    for (uint64_t i = 0; i < 3; ++i) {
      std::set<float> ids;
      for (auto &p : parts) {
        std::vector<float> v = floats(p->batch(i).bytes[0]);
        for (int64_t r = 0; r < rows; ++r)
          EXPECT_TRUE(ids.insert(v[size_t(r * kFeatures)]).second)
              << "row repeated in step " << i;
      }
    }
    // Resume: a fresh source at step 17 reads what the first did.
    auto again = openData(dir, dev, "train_step", 7, true, "training",
                          DataShard{n - 1, n});
    ASSERT_TRUE(again);
    EXPECT_EQ((*again)->batch(17).bytes, parts[size_t(n - 1)]->batch(17).bytes);
    EXPECT_NE(parts[0]->describe().find("replica 0 of " + std::to_string(n)),
              std::string::npos)
        << parts[0]->describe();
  }
}

TEST(DataShards,
     TokenReplicasTogetherReadTheWindowsOfOneDeviceWithTheGlobalBatch) {
  std::string dir = tempDir();
  {
    std::ofstream f(dir + "/tokens.bin", std::ios::binary);
    for (int i = 0; i < 3000; ++i) {
      uint16_t t = uint16_t(random::bits(5, 0, uint64_t(i)) % 60);
      f.write(reinterpret_cast<const char *>(&t), 2);
    }
  }
  auto lm = [](int64_t rows, int devices) {
    Package pkg = dpPackage(1, devices);
    for (int id : {X, Y}) {
      Buffer &b = pkg.program.buffers[size_t(id)];
      b.dtype = DType::I32;
      b.shape = {rows, 16};
      b.bytes = rows * 16 * 4;
    }
    return modelOf(pkg);
  };
  const int n = 4, rows = 2;
  Model one = lm(rows * n, 1), dev = lm(rows, n);
  auto whole =
      openData(dir + "/tokens.bin", one, "train_step", 9, true, "training");
  ASSERT_TRUE(whole) << whole.status().message();
  for (uint64_t i = 0; i < 10; ++i) {
    std::string x;
    for (int r = 0; r < n; ++r) {
      auto s = openData(dir + "/tokens.bin", dev, "train_step", 9, true,
                        "training", DataShard{r, n});
      ASSERT_TRUE(s) << s.status().message();
      x += (*s)->batch(i).bytes[0];
    }
    EXPECT_EQ(x, (*whole)->batch(i).bytes[0]) << "batch " << i;
  }
}

TEST(DataShards, TooFewRowsForTheGlobalBatchIsAnError) {
  std::string dir = tempDir();
  writeData(dir, 10);
  Model dev = modelOf(dpPackage(3, 4));
  auto s =
      openData(dir, dev, "train_step", 7, true, "training", DataShard{0, 4});
  ASSERT_FALSE(s);
  EXPECT_NE(
      s.status().message().find("fewer than one batch of 12 (4 devices x 3)"),
      std::string::npos)
      << s.status().message();
}

// --- The input pipeline: workers, shuffle buffer, token shards ---------------

TEST(DataPipeline, ReplicasWithDataWorkersReadTheGlobalBatchOfOneDevice) {
  // Each replica's batches through a Prefetcher with several workers and
  // another depth: together still exactly one device's batches, read with
  // one worker (the trainer's pipeline for every replica).
  std::string dir = tempDir();
  writeData(dir, 40);
  const int n = 2, rows = 3;
  Model one = modelOf(dpPackage(rows * n, 1));
  auto whole = openData(dir, one, "train_step", 7, true, "training");
  ASSERT_TRUE(whole) << whole.status().message();
  Model dev = modelOf(dpPackage(rows, n));
  for (int workers : {1, 3}) {
    std::vector<std::unique_ptr<DataSource>> parts;
    std::vector<std::unique_ptr<data::Prefetcher<Batch>>> pipes;
    for (int r = 0; r < n; ++r) {
      auto s = openData(dir, dev, "train_step", 7, true, "training",
                        DataShard{r, n});
      ASSERT_TRUE(s) << s.status().message();
      parts.push_back(std::move(*s));
      data::PrefetchOptions po;
      po.workers = workers;
      po.depth = size_t(2 + r * 3);
      const DataSource *src = parts.back().get();
      pipes.push_back(std::make_unique<data::Prefetcher<Batch>>(
          [src](uint64_t i) { return src->batch(i); }, 5, po));
    }
    for (uint64_t i = 5; i < 40; ++i) { // past several epochs of 6-row steps
      Batch g = (*whole)->batch(i);
      std::string x, y;
      for (auto &p : pipes) {
        auto b = p->next();
        ASSERT_TRUE(b) << b.status().message();
        x += b->bytes[0];
        y += b->bytes[1];
      }
      ASSERT_EQ(x, g.bytes[0]) << workers << " workers, batch " << i;
      ASSERT_EQ(y, g.bytes[1]) << workers << " workers, batch " << i;
    }
  }
}

/// The row indices (x's first feature times 40) of `n` consecutive batches.
std::vector<int64_t> rowsOf(const DataSource &s, uint64_t first, uint64_t n,
                            int64_t rows) {
  std::vector<int64_t> out;
  for (uint64_t i = first; i < first + n; ++i) {
    std::vector<float> v = floats(s.batch(i).bytes[0]);
    for (int64_t r = 0; r < rows; ++r)
      out.push_back(int64_t(std::lround(v[size_t(r * kFeatures)] * 40)));
  }
  return out;
}

TEST(DataPipeline,
     TheShuffleBufferCoversEveryRowOncePerEpochDeterministically) {
  std::string dir = tempDir();
  writeData(dir, 40);
  const int64_t rows = 4, window = 8; // an epoch: 10 batches of 4
  Model m = modelOf(dpPackage(rows, 1));
  auto plain = openData(dir, m, "train_step", 7, true, "training");
  auto buf = openData(dir, m, "train_step", 7, true, "training", {}, window);
  auto again = openData(dir, m, "train_step", 7, true, "training", {}, window);
  auto seed8 = openData(dir, m, "train_step", 8, true, "training", {}, window);
  ASSERT_TRUE(plain && buf && again && seed8);
  EXPECT_NE(
      (*buf)->describe().find("shuffled per epoch with a buffer of 8 rows"),
      std::string::npos)
      << (*buf)->describe();
  std::vector<int64_t> fileOrder(40);
  std::iota(fileOrder.begin(), fileOrder.end(), 0);
  std::vector<int64_t> previous;
  for (uint64_t epoch = 0; epoch < 3; ++epoch) {
    std::vector<int64_t> got = rowsOf(**buf, epoch * 10, 10, rows);
    // Coverage: every row exactly once in the epoch.
    std::vector<int64_t> sorted = got;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, fileOrder) << "epoch " << epoch;
    // tf.data's window: the row at position p is among file rows [0, p + 8).
    for (size_t p = 0; p < got.size(); ++p)
      EXPECT_LT(got[p], int64_t(p) + window)
          << "epoch " << epoch << ", position " << p;
    EXPECT_NE(got, fileOrder);
    EXPECT_NE(got, previous) << "epoch " << epoch << " repeats the last";
    // Deterministic in (seed, epoch): a fresh source, even read from the
    // middle (a resumed run), draws the same; another seed does not.
    EXPECT_EQ(rowsOf(**again, epoch * 10 + 3, 7, rows),
              std::vector<int64_t>(got.begin() + 12, got.end()));
    EXPECT_NE(rowsOf(**seed8, epoch * 10, 10, rows), got);
    previous = got;
  }
  // Without the flag: the uniform permutation of before (another order).
  EXPECT_NE(rowsOf(**plain, 0, 10, rows), rowsOf(**buf, 0, 10, rows));
  // Evaluation data (not shuffled) ignores it: file order.
  auto ordered =
      openData(dir, m, "train_step", 7, false, "validation", {}, window);
  ASSERT_TRUE(ordered);
  EXPECT_EQ(rowsOf(**ordered, 0, 10, rows), fileOrder);
}

TEST(DataPipeline, TokenShardsOpenFromAListAGlobOrADirectory) {
  std::string dir = tempDir();
  std::filesystem::create_directories(dir + "/shards");
  for (int k = 0; k < 3; ++k) {
    std::ofstream f(dir + fmt::format("/shards/train-{}.bin", k),
                    std::ios::binary);
    for (int i = 0; i < 400 + 300 * k; ++i) {
      uint16_t t = uint16_t(random::bits(5, uint64_t(k), uint64_t(i)) % 60);
      f.write(reinterpret_cast<const char *>(&t), 2);
    }
  }
  Package pkg = dpPackage(1, 1);
  for (int id : {X, Y}) {
    Buffer &b = pkg.program.buffers[size_t(id)];
    b.dtype = DType::I32;
    b.shape = {4, 16};
    b.bytes = 4 * 16 * 4;
  }
  Model m = modelOf(pkg);
  std::string s = dir + "/shards/train-";
  auto list = openData(s + "0.bin," + s + "1.bin," + s + "2.bin", m,
                       "train_step", 9, true, "training");
  auto glob = openData(s + "*.bin", m, "train_step", 9, true, "training");
  auto whole = openData(dir + "/shards", m, "train_step", 9, true, "training");
  ASSERT_TRUE(list) << list.status().message();
  ASSERT_TRUE(glob) << glob.status().message();
  ASSERT_TRUE(whole) << whole.status().message();
  EXPECT_NE(
      (*glob)->describe().find("(3 shards, 2100 tokens; random windows of 16"),
      std::string::npos)
      << (*glob)->describe();
  for (uint64_t i = 0; i < 20; ++i) {
    EXPECT_EQ((*list)->batch(i).bytes, (*glob)->batch(i).bytes);
    EXPECT_EQ((*list)->batch(i).bytes, (*whole)->batch(i).bytes);
  }
  auto none =
      openData(dir + "/train-*.bin", m, "train_step", 9, true, "training");
  ASSERT_FALSE(none);
  EXPECT_NE(none.status().message().find("matches no file"), std::string::npos);
  // Two replicas of 2 rows, each through 2 data workers: together the
  // windows of the one device of 4 rows.
  Package half = pkg;
  half.program.mesh.axes.push_back({"dp", 2});
  for (int id : {X, Y}) {
    Buffer &b = half.program.buffers[size_t(id)];
    b.shape = {2, 16};
    b.bytes = 2 * 16 * 4;
  }
  Model dev = modelOf(half);
  std::vector<std::unique_ptr<DataSource>> parts;
  std::vector<std::unique_ptr<data::Prefetcher<Batch>>> pipes;
  for (int r = 0; r < 2; ++r) {
    auto p = openData(s + "*.bin", dev, "train_step", 9, true, "training",
                      DataShard{r, 2});
    ASSERT_TRUE(p) << p.status().message();
    parts.push_back(std::move(*p));
    const DataSource *src = parts.back().get();
    data::PrefetchOptions po;
    po.workers = 2;
    pipes.push_back(std::make_unique<data::Prefetcher<Batch>>(
        [src](uint64_t i) { return src->batch(i); }, 0, po));
  }
  for (uint64_t i = 0; i < 20; ++i) {
    std::string x, y;
    for (auto &p : pipes) {
      auto b = p->next();
      ASSERT_TRUE(b) << b.status().message();
      x += b->bytes[0];
      y += b->bytes[1];
    }
    EXPECT_EQ(x, (*glob)->batch(i).bytes[0]) << "batch " << i;
    EXPECT_EQ(y, (*glob)->batch(i).bytes[1]) << "batch " << i;
  }
}

TEST(DataPipeline, AFailingDataSourceStopsTheRunWithItsMessage) {
  // A source whose batch 3 throws (a read error): the trainer returns the
  // error naming the data, with 1 or 3 workers, and does not hang.
  struct Failing : DataSource {
    Batch batch(uint64_t i) const override {
      if (i == 3)
        throw std::runtime_error("read error at byte 96");
      Batch b;
      b.bytes = {std::string(size_t(2 * kFeatures * 4), '\0'),
                 std::string(8, '\0')};
      return b;
    }
    std::string describe() const override { return "broken.npy"; }
  };
  for (int workers : {1, 3}) {
    Model m = modelOf(dpPackage(2, 1));
    ASSERT_TRUE(m.attach(std::make_unique<DpBackend>(m.pkg.program, nullptr)));
    TrainOptions o;
    o.artifact = "dp.kpack";
    o.steps = 10;
    o.evalInterval = 0;
    o.quiet = true;
    o.dataWorkers = workers;
    o.checkpoint = tempDir() + "/c.safetensors";
    auto t = Trainer::create(m, o, std::make_shared<Failing>(), nullptr,
                             nullptr, {});
    ASSERT_TRUE(t) << t.status().message();
    auto r = (*t)->run();
    ASSERT_FALSE(r);
    EXPECT_EQ(r.status().message(), "cannot make batch 3 of the training data "
                                    "broken.npy: read error at byte 96");
  }
}

// --- ZeRO-sharded state and logical checkpoints
// ---------------------------------

TEST(Shards, BlocksArePaddedAndJoinBack) {
  std::string logical;
  for (int i = 0; i < 10; ++i) {
    float v = float(i) + 0.5f;
    logical.append(reinterpret_cast<const char *>(&v), 4);
  }
  EXPECT_EQ(blockElements(10, 4), 3);
  std::string all;
  for (int d = 0; d < 4; ++d)
    all += cutBlock(logical, 10, 4, 4, d);
  EXPECT_EQ(all.size(), 12u * 4);
  EXPECT_EQ(floats(all.substr(36)), (std::vector<float>{9.5f, 0.f, 0.f}));
  EXPECT_EQ(joinBlocks(all, 10, 4), logical);
}

TEST(Shards, AxisGroupsAreRowMajor) {
  program::Mesh mesh;
  mesh.axes = {{"dp", 2}, {"tp", 3}};
  int c = -1;
  EXPECT_EQ(axisGroup(mesh, 4, "dp", &c), (std::vector<int>{1, 4}));
  EXPECT_EQ(c, 1);
  EXPECT_EQ(axisGroup(mesh, 4, "tp", &c), (std::vector<int>{3, 4, 5}));
  EXPECT_EQ(c, 1);
  EXPECT_EQ(axisGroup(mesh, 4, "pp", &c), (std::vector<int>{4}));
  EXPECT_EQ(c, 0);
}

/// Two devices with the momentum sharded: each holds its block after a
/// load; the checkpoint they save together is the logical tensor; it loads
/// on 4 devices (blocks of 2) and on one (the whole tensor).
TEST(Shards, ShardedStateIsGatheredForTheCheckpointAndCutOnLoad) {
  std::string dir = tempDir();
  auto comms = test::FakeComm::world(2, 5.0);
  std::vector<std::unique_ptr<Model>> models;
  ckpt::Checkpoint logical = dpPackage(3, 1).initial;
  std::vector<float> mom = {1, 2, 3, 4, 5};
  const_cast<ckpt::Tensor *>(logical.find("m:w"))
      ->bytes.assign(reinterpret_cast<const char *>(mom.data()), 20);
  for (int d = 0; d < 2; ++d) {
    auto m = std::make_unique<Model>();
    m->pkg = dpPackage(3, 2, /*shardM=*/true);
    m->shards = dpShards(true);
    m->comm = comms[size_t(d)].get();
    m->device = d;
    ASSERT_TRUE(
        m->attach(std::make_unique<DpBackend>(m->pkg.program, m->comm)));
    ASSERT_TRUE(m->hasShardedState());
    ASSERT_TRUE(m->setPersistent(logical));
    auto block = m->exec->readAll<float>(M);
    ASSERT_TRUE(block);
    EXPECT_EQ(*block, d == 0 ? (std::vector<float>{1, 2, 3})
                             : (std::vector<float>{4, 5, 0}));
    models.push_back(std::move(m));
  }
  Status saved[2];
  std::string path = dir + "/c.safetensors";
  std::thread t1([&] {
    saved[1] = saveCheckpoint(*models[1], path, 7, 11, /*write=*/false);
  });
  saved[0] = saveCheckpoint(*models[0], path, 7, 11, /*write=*/true);
  t1.join();
  ASSERT_TRUE(saved[0]) << saved[0].message();
  ASSERT_TRUE(saved[1]) << saved[1].message();
  auto c = ckpt::read(path);
  ASSERT_TRUE(c) << c.status().message();
  EXPECT_EQ(floats(c->find("m:w")->bytes), mom);
  EXPECT_EQ(c->find("m:w")->shape, (std::vector<int64_t>{kFeatures}));
  EXPECT_EQ(checkpointStep(*c), 7);
  // The device count is recorded for the resume's note only ("global batch
  // kept (2 devices -> 4 ...)"); loading below ignores it: the layout is
  // logical, and four devices load what two wrote.
  CheckpointBatch cb = checkpointBatch(*c);
  EXPECT_EQ(cb.devices, 2);
  EXPECT_EQ(cb.globalBatch, globalBatchRows(*models[0]));
  EXPECT_GT(cb.globalBatch, 0);
  EXPECT_EQ(c->metadata.at("data_samples"), std::to_string(7 * cb.globalBatch));

  // Four devices: blocks of two.
  for (int d = 0; d < 4; ++d) {
    Model m = modelOf(dpPackage(3, 4, true));
    m.shards = dpShards(true);
    m.device = d;
    auto r = readCheckpoint(m, path, true, {});
    ASSERT_TRUE(r) << r.status().message();
    m.exec = std::make_unique<DpBackend>(m.pkg.program, nullptr);
    ASSERT_TRUE(m.setPersistent(*r));
    auto block = m.exec->readAll<float>(M);
    std::vector<float> want = {float(2 * d + 1),
                               d == 2 ? 0.f : float(2 * d + 2)};
    if (d == 3)
      want = {0, 0};
    EXPECT_EQ(*block, want) << "device " << d;
  }
  // One device: the whole tensor.
  Model one = modelOf(dpPackage(3, 1));
  auto r = readCheckpoint(one, path, true, {});
  ASSERT_TRUE(r) << r.status().message();
  one.exec = std::make_unique<DpBackend>(one.pkg.program, nullptr);
  ASSERT_TRUE(one.setPersistent(*r));
  EXPECT_EQ(*one.exec->readAll<float>(M), mom);
}

// --- Replicas on threads
// ---------------------------------------------------------

struct RunOut {
  Status status = Status::ok();
  bool interrupted = false;
  int64_t next = 0;
  std::vector<float> losses, weights;
  std::vector<int64_t> replicas;
  double seconds = 0;
};

/// Trains `devices` replicas of the linear model (rows per device) on
/// threads through the fake communicator; one device trains alone.
RunOut trainDp(const std::string &dir, int devices, int64_t rows, int64_t steps,
               const std::string &resume = "", int64_t checkpointEvery = 0,
               double timeout = 10, int64_t stopAt = -1, int dataWorkers = 1,
               int prefetch = 3) {
  RunOut out;
  Package pkg = dpPackage(rows, devices);
  auto comms = test::FakeComm::world(devices, timeout);
  std::mutex mu;
  std::vector<DpBackend *> backends(static_cast<size_t>(devices));
  ReplicaOptions o;
  o.train.artifact = "dp.kpack";
  o.train.data = dir;
  o.train.steps = steps;
  o.train.evalInterval = 0;
  o.train.checkpointEvery = checkpointEvery;
  o.train.checkpoint = dir + "/c.safetensors";
  o.train.resume = resume;
  o.train.quiet = true;
  o.train.dataWorkers = dataWorkers;
  o.train.prefetch = prefetch;
  // A Ctrl-C that one replica sees later than the others: the last to
  // finish step `stopAt` raises the shared flag, when the others have
  // most likely checked it already.
  std::atomic<bool> stop{false};
  std::atomic<int> finished{0};
  o.train.stop = &stop;
  o.train.onStep = [&](const StepMetrics &s) {
    if (s.step == stopAt && ++finished == devices)
      stop = true;
    std::lock_guard<std::mutex> lock(mu);
    if (out.losses.size() <= size_t(s.step))
      out.losses.resize(size_t(s.step) + 1, NAN);
    out.losses[size_t(s.step)] = s.loss;
  };
  o.how = "--device cpu:" + std::to_string(devices);
  for (auto &c : comms)
    o.comms.push_back(c.get());
  o.backend = [&](int device, comm::Communicator *c) -> BackendFactory {
    return
        [&, device, c](const Package &p) -> Expected<std::unique_ptr<Backend>> {
          auto b =
              std::make_unique<DpBackend>(p.program, devices > 1 ? c : nullptr);
          backends[size_t(device)] = b.get();
          return std::unique_ptr<Backend>(std::move(b));
        };
  };
  auto t0 = std::chrono::steady_clock::now();
  auto r = trainReplicas(pkg, o, {});
  out.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  if (!r) {
    out.status = r.status();
    return out;
  }
  out.interrupted = r->result.interrupted;
  out.next = r->result.next;
  out.weights = backends[0]->weights();
  for (DpBackend *b : backends)
    out.replicas.insert(out.replicas.end(), b->replicas.begin(),
                        b->replicas.end());
  for (int d = 1; d < devices; ++d)
    EXPECT_EQ(backends[size_t(d)]->weights(), out.weights)
        << "device " << d << " differs";
  return out;
}

/// |a - b| <= 1e-5 |b| + 1e-6: float32 sums in another order (a mean of
/// per-device means against one mean) differ by a few ulps per step.
void expectClose(const std::vector<float> &a, const std::vector<float> &b,
                 const char *what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_NEAR(a[i], b[i], 1e-5 * std::fabs(b[i]) + 1e-6) << what << " " << i;
}

TEST(Replicas, DataParallelReplicasTrainLikeOneDeviceOnTheGlobalBatch) {
  std::string dir = tempDir();
  writeData(dir, 64);
  RunOut one = trainDp(dir, 1, 8, 12);
  ASSERT_TRUE(one.status) << one.status.message();
  for (int n : {2, 4}) {
    RunOut dp = trainDp(dir, n, 8 / n, 12);
    ASSERT_TRUE(dp.status) << dp.status.message();
    ASSERT_EQ(dp.losses.size(), 12u);
    expectClose(dp.losses, one.losses, "loss");
    expectClose(dp.weights, one.weights, "weight");
    // Every replica got its coordinate on dp as the "replica" input.
    std::map<int64_t, int> seen;
    for (int64_t r : dp.replicas)
      seen[r]++;
    ASSERT_EQ(seen.size(), size_t(n));
    for (auto &[r, count] : seen)
      EXPECT_EQ(count, 12) << "replica " << r;
    // Bit for bit from run to run.
    RunOut again = trainDp(dir, n, 8 / n, 12);
    ASSERT_TRUE(again.status);
    EXPECT_EQ(again.losses, dp.losses);
    EXPECT_EQ(again.weights, dp.weights);
  }
}

TEST(Replicas, DataWorkersAndPrefetchDepthDoNotChangeTraining) {
  // Bit for bit: the same losses and weights with 3 data workers and
  // another depth, on one device and on 2 replicas.
  std::string dir = tempDir();
  writeData(dir, 64);
  for (int n : {1, 2}) {
    RunOut base = trainDp(dir, n, 8 / n, 12);
    ASSERT_TRUE(base.status) << base.status.message();
    for (int prefetch : {1, 5}) {
      RunOut w = trainDp(dir, n, 8 / n, 12, "", 0, 10, -1, /*dataWorkers=*/3,
                         prefetch);
      ASSERT_TRUE(w.status) << w.status.message();
      EXPECT_EQ(w.losses, base.losses)
          << n << " devices, prefetch " << prefetch;
      EXPECT_EQ(w.weights, base.weights)
          << n << " devices, prefetch " << prefetch;
    }
  }
}

TEST(Replicas, ACheckpointResumesOnAnotherDeviceCount) {
  std::string dir = tempDir();
  writeData(dir, 64);
  RunOut straight = trainDp(dir, 1, 8, 10);
  ASSERT_TRUE(straight.status);
  // 4 devices to step 6, then 1 device to step 10.
  RunOut first = trainDp(dir, 4, 2, 6);
  ASSERT_TRUE(first.status) << first.status.message();
  RunOut rest = trainDp(dir, 1, 8, 10, dir + "/c.safetensors");
  ASSERT_TRUE(rest.status) << rest.status.message();
  expectClose(rest.weights, straight.weights, "4 -> 1 weight");
  // 1 device to step 6, then 2 devices to step 10.
  ASSERT_TRUE(trainDp(dir, 1, 8, 6).status);
  RunOut rest2 = trainDp(dir, 2, 4, 10, dir + "/c.safetensors");
  ASSERT_TRUE(rest2.status) << rest2.status.message();
  expectClose(rest2.weights, straight.weights, "1 -> 2 weight");
}

/// A stop request seen by one replica only stops all of them after the
/// same step (they agree through the communicator), with one checkpoint;
/// without the agreement the others would wait for it at the next step.
TEST(Replicas, AStopRequestStopsEveryReplicaAtTheSameStep) {
  std::string dir = tempDir();
  writeData(dir, 64);
  for (int rep = 0; rep < 5; ++rep) {
    RunOut r = trainDp(dir, 4, 2, 50, "", 0, 5.0, /*stopAt=*/3);
    ASSERT_TRUE(r.status) << r.status.message();
    EXPECT_TRUE(r.interrupted);
    // The replica that raised the flag after step 3 brings it to that
    // step's agreement, so every replica stops after step 3.
    EXPECT_EQ(r.next, 4);
    auto c = ckpt::read(dir + "/c.safetensors");
    ASSERT_TRUE(c) << c.status().message();
    EXPECT_EQ(checkpointStep(*c), r.next);
  }
}

class RankFaults : public testing::TestWithParam<const char *> {};

TEST_P(RankFaults, StopTheOthersWithinTheTimeoutNamingRankAndStep) {
  std::string dir = tempDir();
  writeData(dir, 64);
  std::string spec = std::string(GetParam()) + "@5:1";
  ::setenv("KILN_FAULT_INJECT", spec.c_str(), 1);
  RunOut r = trainDp(dir, 3, 2, 12, "", /*checkpointEvery=*/4, /*timeout=*/0.5);
  ::unsetenv("KILN_FAULT_INJECT");
  ASSERT_FALSE(r.status) << "a run with a missing rank succeeded";
  const std::string &m = r.status.message();
  EXPECT_NE(m.find("step 5"), std::string::npos) << m;
  EXPECT_NE(m.find("rank(s) 1 did not arrive"), std::string::npos) << m;
  EXPECT_LT(r.seconds, 5.0) << "the others did not stop within the timeout";
  // The last checkpoint (after step 4) is intact.
  auto c = ckpt::read(dir + "/c.safetensors");
  ASSERT_TRUE(c) << c.status().message();
  EXPECT_EQ(checkpointStep(*c), 4);
}

INSTANTIATE_TEST_SUITE_P(Trainer, RankFaults,
                         testing::Values("rank-exit", "rank-stall"));

TEST(RankFault, Parses) {
  RankFault f = RankFault::parse("rank-stall@12:3");
  EXPECT_EQ(f.kind, RankFault::Stall);
  EXPECT_EQ(f.step, 12);
  EXPECT_EQ(f.rank, 3);
  EXPECT_EQ(RankFault::parse("rank-exit@2:0").kind, RankFault::Exit);
  EXPECT_EQ(RankFault::parse("checkpoint-kill@300").kind, RankFault::None);
  EXPECT_EQ(RankFault::parse(nullptr).kind, RankFault::None);
}

// --- Devices and launchers
// -----------------------------------------------------

TEST(Devices, ParsesDeviceSpecs) {
  auto cpu4 = parseDeviceSpec("cpu:4");
  ASSERT_TRUE(cpu4);
  EXPECT_EQ(cpu4->kind, "cpu");
  EXPECT_EQ(cpu4->count, 4);
  EXPECT_EQ(parseDeviceSpec("cpu")->count, 1);
  auto gpus = parseDeviceSpec("cuda:0,1,2,3");
  ASSERT_TRUE(gpus);
  EXPECT_EQ(gpus->count, 4);
  EXPECT_EQ(gpus->ordinals, (std::vector<int>{0, 1, 2, 3}));
  auto one = parseDeviceSpec("cuda:1");
  ASSERT_TRUE(one);
  EXPECT_EQ(one->count, 1);
  EXPECT_EQ(one->ordinals, (std::vector<int>{1}));
  EXPECT_FALSE(parseDeviceSpec("cpu:0"));
  EXPECT_FALSE(parseDeviceSpec("cpu:x"));
  EXPECT_FALSE(parseDeviceSpec("cuda:1,"));
  EXPECT_FALSE(parseDeviceSpec("tpu"));
}

TEST(Devices, TheDeviceCountMustMatchTheMesh) {
  Package one = dpPackage(2, 1), four = dpPackage(2, 4);
  EXPECT_TRUE(checkDeviceCount(four.program, 4, "--device cpu:4", "m.kpack"));
  Status s = checkDeviceCount(one.program, 4, "--device cpu:4", "m.kpack");
  ASSERT_FALSE(s);
  EXPECT_NE(
      s.message().find(
          "m.kpack was compiled for 1 device, but --device cpu:4 asks for 4; "
          "recompile with kilnc --devices 4"),
      std::string::npos)
      << s.message();
  s = checkDeviceCount(four.program, 2, "mpirun with 2 processes", "m.kpack");
  ASSERT_FALSE(s);
  EXPECT_NE(
      s.message().find(
          "compiled for 4 devices, but mpirun with 2 processes gives 2; run "
          "it with --device cpu:4 or mpirun -np 4"),
      std::string::npos)
      << s.message();
}

TEST(Launch, ReadsTheLaunchersEnvironments) {
  auto with = [](std::map<std::string, std::string> env) {
    auto l = detectLaunch([env](const char *name) -> const char * {
      auto it = env.find(name);
      return it == env.end() ? nullptr : it->second.c_str();
    });
    EXPECT_TRUE(l) << l.status().message();
    return l ? *l : Launch{};
  };
  Launch none = with({});
  EXPECT_TRUE(none.launcher.empty());
  EXPECT_FALSE(none.multiProcess());
  Launch ompi = with({{"OMPI_COMM_WORLD_RANK", "2"},
                      {"OMPI_COMM_WORLD_SIZE", "4"},
                      {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  EXPECT_EQ(ompi.launcher, "openmpi");
  EXPECT_EQ(ompi.rank, 2);
  EXPECT_EQ(ompi.size, 4);
  EXPECT_EQ(ompi.localRank, 0);
  EXPECT_EQ(ompi.localSize, 2);
  EXPECT_TRUE(ompi.multiProcess());
  Launch slurm = with({{"SLURM_PROCID", "1"},
                       {"SLURM_NTASKS", "2"},
                       {"SLURM_LOCALID", "1"},
                       {"SLURM_NTASKS_PER_NODE", "2(x3)"}});
  EXPECT_EQ(slurm.launcher, "slurm");
  EXPECT_EQ(slurm.rank, 1);
  EXPECT_EQ(slurm.localSize, 2);
  Launch torch = with({{"RANK", "3"},
                       {"WORLD_SIZE", "8"},
                       {"LOCAL_RANK", "3"},
                       {"LOCAL_WORLD_SIZE", "4"}});
  EXPECT_EQ(torch.launcher, "torchrun");
  EXPECT_EQ(torch.rank, 3);
  EXPECT_EQ(torch.size, 8);
  EXPECT_EQ(torch.localSize, 4);
  Launch pmi = with({{"PMI_RANK", "0"}, {"PMI_SIZE", "1"}});
  EXPECT_EQ(pmi.launcher, "pmi");
  EXPECT_FALSE(pmi.multiProcess());
}

} // namespace
