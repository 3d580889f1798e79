//===- MultiDeviceTest.cpp - The launch around trainReplicas, without kiln-run
//
// runtime/train/MultiDevice.h as a front end other than kiln-run (the
// Python package) uses it: the device request checked against the launch
// and the artifact, in-process communicators made, each replica's backend
// from one DeviceOptions, the start-up handshake, tracers per replica, and
// the traces rendered for rank 0, on a real two-device artifact
// (examples/mlp.kiln compiled with kilnc --devices 2 at build time) and
// the CPU backend.
//
//===----------------------------------------------------------------------===//
#include "TrainFixtures.h"

#include "runtime/core/Trace.h"
#include "runtime/train/MultiDevice.h"
#include "runtime/train/Overview.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <mutex>

using namespace kiln;
using namespace kiln::train;

namespace {

std::string tempDir() { return fixtures::freshDir("kiln-multidevice-"); }

std::unique_ptr<Model> open(const char *path) {
  auto m = Model::open(path);
  EXPECT_TRUE(m) << m.status().message();
  return m ? std::move(*m) : nullptr;
}

TEST(MultiDevice, PlanChecksTheRequestAgainstTheLaunchAndTheArtifact) {
  auto one = open(KILN_TEST_MLP_KPACK);
  auto two = open(KILN_TEST_MLP_DP2_KPACK);
  ASSERT_TRUE(one && two);
  Launch alone;
  auto cpu2 = parseDeviceSpec("cpu:2");
  ASSERT_TRUE(cpu2);
  auto ok = planReplicas(alone, *cpu2, "cpu:2", two->prog(), "two.kpack");
  ASSERT_TRUE(ok) << ok.status().message();
  EXPECT_EQ(ok->how, "--device cpu:2");
  EXPECT_EQ(ok->devices, 2);
  EXPECT_TRUE(ok->gpus.empty());

  auto wrongCount = planReplicas(alone, *cpu2, "cpu:2", one->prog(), "one.kpack");
  ASSERT_FALSE(wrongCount);
  EXPECT_NE(wrongCount.status().message().find(
                "one.kpack was compiled for 1 device, but --device cpu:2 asks for 2"),
            std::string::npos)
      << wrongCount.status().message();

  Launch launched;
  launched.launcher = "torchrun";
  launched.size = 2;
  auto both = planReplicas(launched, *cpu2, "cpu:2", two->prog(), "two.kpack");
  ASSERT_FALSE(both);
  EXPECT_EQ(both.status().message(), "--device cpu:2 runs 2 devices in one process; under "
                                     "torchrun each process is one device: use --device cpu");

  DeviceSpec emu{"cuda-emu", 2, {}};
  auto kind = planReplicas(alone, emu, "cuda-emu", two->prog(), "two.kpack");
  ASSERT_FALSE(kind);
  EXPECT_NE(kind.status().message().find("training on several cuda-emu devices is not supported"),
            std::string::npos)
      << kind.status().message();
}

TEST(MultiDevice, RelaunchCommandsFollowTheLauncher) {
  Launch l;
  EXPECT_EQ(relaunchCommand(l, 1), "");
  l.size = 4;
  l.launcher = "openmpi";
  EXPECT_EQ(relaunchCommand(l, 4), "mpirun -np 4 ");
  l.launcher = "slurm";
  EXPECT_EQ(relaunchCommand(l, 4), "srun -n 4 ");
  l.launcher = "torchrun";
  EXPECT_EQ(relaunchCommand(l, 4), "(torchrun with 4 processes) ");
}

TEST(MultiDevice, TheHandshakeNeedsTheArtifactsBytes) {
  auto missing = sameArtifactHandshake("/nonexistent/model.kpack");
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.status().message().find("/nonexistent/model.kpack"), std::string::npos);
  EXPECT_TRUE(sameArtifactHandshake(KILN_TEST_MLP_DP2_KPACK));
}

/// Two in-process devices trained through the launch's pieces alone, as a
/// front end would: every replica runs, the handshake passes, each device
/// has its tracer, and rank 0 gets both devices' traces.
TEST(MultiDevice, AFrontEndTrainsTwoDevicesThroughTheLaunch) {
  if (availableDevices().find("cpu") == std::string::npos)
    GTEST_SKIP() << "this build has no CPU backend";
  std::string dir = tempDir();
  auto model = open(KILN_TEST_MLP_DP2_KPACK);
  ASSERT_TRUE(model);
  fixtures::writeData(*model, dir);
  auto spec = parseDeviceSpec("cpu:2");
  ASSERT_TRUE(spec);
  auto run = planReplicas(Launch{}, *spec, "cpu:2", model->prog(), KILN_TEST_MLP_DP2_KPACK);
  ASSERT_TRUE(run) << run.status().message();
  auto comms = connectReplicas(*run, 30);
  ASSERT_TRUE(comms) << comms.status().message();
  ASSERT_EQ(comms->program.size(), 2u);
  EXPECT_TRUE(comms->host.empty());
  EXPECT_TRUE(comms->started.status);
  EXPECT_TRUE(comms->error);
  EXPECT_FALSE(comms->multiProcess);
  EXPECT_EQ(comms->program[1]->rank(), 1);

  ReplicaOptions ro;
  ro.train.artifact = KILN_TEST_MLP_DP2_KPACK;
  ro.train.data = dir;
  ro.train.steps = 4;
  ro.train.evalInterval = 0;
  ro.train.quiet = true;
  ro.train.checkpoint = dir + "/ckpt.safetensors";
  std::mutex lossesMutex; // every replica reports its steps, each on its thread
  std::vector<float> losses;
  ro.train.onStep = [&](const StepMetrics &s) {
    std::lock_guard<std::mutex> lock(lossesMutex);
    losses.push_back(s.loss);
  };
  ro.how = run->how;
  for (auto &c : comms->program)
    ro.comms.push_back(c.get());
  DeviceOptions d;
  d.device = "cpu";
  d.artifact = KILN_TEST_MLP_DP2_KPACK;
  d.threads = 1;
  d.quiet = true;
  d.cacheDir = dir + "/cache";
  ro.backend = replicaBackends(d, run->gpus, {});
  auto handshake = sameArtifactHandshake(KILN_TEST_MLP_DP2_KPACK);
  ASSERT_TRUE(handshake);
  ro.handshake = *handshake;
  Tracer rank0;
  std::vector<std::unique_ptr<Tracer>> own;
  ro.tracers = replicaTracers(ro.comms, &rank0, own);
  ASSERT_EQ(ro.tracers.size(), 2u);
  EXPECT_EQ(ro.tracers[0], &rank0);
  EXPECT_EQ(own.size(), 1u);
  EXPECT_EQ(ro.tracers[1]->rank, 1);
  ro.train.tracer = &rank0;
  profileWindow(ro.train);
  ro.train.traceFrom = 0;
  ro.train.traceTo = INT64_MAX;
  ro.train.traceWarmup = 0;

  auto r = trainReplicas(model->pkg, ro, {});
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ(r->result.next, 4);
  ASSERT_EQ(r->models.size(), 2u);
  EXPECT_EQ(r->models[1]->comm, comms->program[1].get());
  ASSERT_EQ(losses.size(), 8u); // 4 steps on each of the 2 replicas
  for (float l : losses)
    EXPECT_TRUE(std::isfinite(l));
  for (Tracer *t : ro.tracers)
    EXPECT_FALSE(t->spans().empty()) << "device " << t->rank << " recorded nothing";

  auto traces = collectTraces(ro.tracers, *r, false, true, true);
  ASSERT_TRUE(traces) << traces.status().message();
  ASSERT_EQ(traces->chrome.size(), 2u);
  ASSERT_EQ(traces->xspaces.size(), 2u);
  EXPECT_NE(traces->chrome[1].find("rank 1 \u00b7 cpu"), std::string::npos);
  auto rows = collectStageRows(ro.tracers, *r, false);
  ASSERT_TRUE(rows) << rows.status().message();
  EXPECT_EQ(rows->size(), 2u);
}

} // namespace
