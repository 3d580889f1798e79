//===- ReplicaTest.cpp - Replicas of a compiled model on threads ----------===//
//
// The trainer on a real artifact (examples/mlp.kiln, compiled by kilnc at
// build time) and the CPU backend: two replicas on two threads of this
// process, each with its own backend and data source, train bit for bit
// alike and like a replica trained alone.
//
//===----------------------------------------------------------------------===//
#include "runtime/core/Data.h"
#include "runtime/core/Random.h"
#include "runtime/train/Devices.h"
#include "runtime/train/Trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <thread>

using namespace kiln;
using namespace kiln::train;

namespace {

std::string tempDir() {
  std::string d = testing::TempDir() + "kiln-replica-" +
                  testing::UnitTest::GetInstance()->current_test_info()->name();
  std::string cmd = "rm -rf '" + d + "' && mkdir -p '" + d + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  return d;
}

/// DIR/<input>.npy for every data input of @train_step: 512 rows of floats
/// in [-1, 1), or of integers below the number of classes.
void writeData(const Model &m, const std::string &dir) {
  int64_t classes = m.vocabSize();
  for (int id : m.dataInputs("train_step")) {
    const program::Buffer &b = m.prog().buffers[size_t(id)];
    data::NpyArray a;
    a.shape = b.shape;
    a.shape[0] = 512;
    int64_t n = 1;
    for (int64_t d : a.shape)
      n *= d;
    bool isFloat = b.dtype == program::DType::F32;
    a.descr = isFloat ? "<f4" : "<i8";
    for (int64_t i = 0; i < n; ++i) {
      uint64_t r = random::bits(11, uint64_t(id), uint64_t(i));
      if (isFloat)
        a.f.push_back(random::uniform(11, uint64_t(id), uint64_t(i)) * 2 - 1);
      else
        a.i.push_back(int64_t(r % uint64_t(classes)));
    }
    ASSERT_TRUE(data::writeNpy(dir + "/" + b.name + ".npy", a));
  }
}

/// Trains one replica for 15 steps; returns its losses.
std::vector<float> trainReplica(const std::string &dir, int rank, int worldSize, Status &status) {
  std::vector<float> losses;
  auto m = Model::open(KILN_TEST_MLP_KPACK);
  if (!m) {
    status = m.status();
    return losses;
  }
  DeviceOptions d;
  d.device = "cpu";
  d.artifact = KILN_TEST_MLP_KPACK;
  d.threads = 1;
  d.quiet = true;
  d.cacheDir = dir + "/cache";
  TrainOptions o;
  o.artifact = KILN_TEST_MLP_KPACK;
  o.data = dir;
  o.steps = 15;
  o.evalInterval = 0;
  o.checkpoint = dir + "/rank" + std::to_string(rank) + "of" + std::to_string(worldSize) +
                 ".safetensors";
  o.rank = rank;
  o.worldSize = worldSize;
  o.onStep = [&](const StepMetrics &s) { losses.push_back(s.loss); };
  auto t = Trainer::open(**m, o, [d](const Package &p) { return makeBackend(p, d); }, {});
  if (!t) {
    status = t.status();
    return losses;
  }
  auto r = (*t)->run();
  status = r ? Status::ok() : r.status();
  return losses;
}

TEST(Replicas, TwoCpuReplicasOnThreadsTrainLikeOne) {
  if (availableDevices().find("cpu") == std::string::npos)
    GTEST_SKIP() << "this build has no CPU backend";
  std::string dir = tempDir();
  {
    auto m = Model::open(KILN_TEST_MLP_KPACK);
    ASSERT_TRUE(m) << m.status().message();
    writeData(**m, dir);
  }
  Status s0, s1, alone;
  std::vector<float> l0, l1;
  std::thread a([&] { l0 = trainReplica(dir, 0, 2, s0); });
  std::thread b([&] { l1 = trainReplica(dir, 1, 2, s1); });
  a.join();
  b.join();
  ASSERT_TRUE(s0) << s0.message();
  ASSERT_TRUE(s1) << s1.message();
  std::vector<float> single = trainReplica(dir, 0, 1, alone);
  ASSERT_TRUE(alone) << alone.message();
  ASSERT_EQ(l0.size(), 15u);
  for (float l : l0)
    EXPECT_TRUE(std::isfinite(l));
  EXPECT_EQ(l0, l1);
  EXPECT_EQ(l0, single);
}

} // namespace
