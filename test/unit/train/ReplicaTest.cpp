//===- ReplicaTest.cpp - Replicas of a compiled model on threads ----------===//
//
// The trainer on a real artifact (examples/mlp.kiln, compiled by kilnc at
// build time) and the CPU backend: two replicas on two threads of this
// process, each with its own backend and data source, train bit for bit
// alike and like a replica trained alone.
//
//===----------------------------------------------------------------------===//
#include "TrainFixtures.h"

#include "runtime/train/Devices.h"
#include "runtime/train/Trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <thread>

using namespace kiln;
using namespace kiln::train;
using fixtures::writeData;

namespace {

std::string tempDir() { return fixtures::freshDir("kiln-replica-"); }

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
