//===- PipelineTest.cpp - Stage-predicated plans on the runtime -----------===//
//
// Pipeline parallelism's runtime side (docs/parallel.md "Pipeline
// parallelism"), on hand-built plan-v2 programs without kernels:
//   - the plan's JSON keeps Buffer::stage and Step::stage ("stage" only
//     where >= 0), and parse() refuses a step touching another stage's
//     buffer, a stage outside the "pp" axis and a dependency on another
//     stage's step, with messages naming the function, step, buffer and
//     stages; each device's arena need only hold its own stage's buffers;
//   - CPU executors on the in-process communicator over meshes ["pp", 2]
//     and ["pp", 2, "dp", 2] (in order, on a communication thread or
//     without one, and on inter-op threads): a Send/Recv pair over "pp"
//     reaches the device of the same dp coordinate, a Broadcast from the
//     last stage reaches every device, no device runs or profiles another
//     stage's steps, and buffers of another stage sharing arena bytes with
//     this stage's are never written;
//   - a stage whose devices never run: the receiving stage fails within
//     the communicator's deadline, naming the step and the rank;
//   - Model::setPersistent and getPersistent with stage-owned parameters:
//     each device writes only its stage's, a checkpoint gathers every
//     tensor on every device, and one written under ["pp", 2, "dp", 2]
//     resumes under ["pp", 2].
//
//===----------------------------------------------------------------------===//
#include "runtime/comm/InProcess.h"
#include "runtime/core/Checkpoint.h"
#include "runtime/core/Counters.h"
#include "runtime/core/Handshake.h"
#include "runtime/core/Program.h"
#include "runtime/cpu/Executor.h"
#include "runtime/train/Model.h"
#include "runtime/train/Placement.h"
#include "test/unit/runtime/PipelineProgram.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

namespace {

using namespace kiln;
using namespace kiln::program;
using namespace kiln::test::pipeline;
using Clock = std::chrono::steady_clock;

/// The message parse() gives `p`'s JSON ("" when it accepts it).
std::string parseError(const Program &p) {
  auto q = Program::parse(p.toJson(), "pp.kpack");
  return q.isOk() ? "" : q.status().message();
}

size_t count(const std::string &s, const std::string &what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1))
    ++n;
  return n;
}

TEST(PipelinePlan, JsonKeepsStagesAndStageOf) {
  Program p = pipelineProgram(2);
  ASSERT_EQ(p.numDevices(), 4);
  EXPECT_EQ(p.numStages(), 2);
  // ["pp", 2, "dp", 2], row-major: devices 0, 1 on stage 0, 2, 3 on 1.
  EXPECT_EQ(p.stageOf(0), 0);
  EXPECT_EQ(p.stageOf(1), 0);
  EXPECT_EQ(p.stageOf(2), 1);
  EXPECT_EQ(p.stageOf(3), 1);
  const std::vector<int> stages = {0, 1, -1, 0, 1, 1, 0, -1, 1};
  for (int d = 0; d < 4; ++d)
    for (size_t id = 0; id < stages.size(); ++id)
      EXPECT_EQ(p.plan(d).buffers[id].stage, stages[id]) << "device " << d << " buffer " << id;
  const Function &f = p.functions[0];
  const std::vector<int> stepStages = {0, 0, 1, 1, 1, -1};
  ASSERT_EQ(f.steps.size(), stepStages.size());
  for (size_t i = 0; i < stepStages.size(); ++i)
    EXPECT_EQ(f.steps[i].stage, stepStages[i]) << "step " << i;
  EXPECT_EQ(p.plan(1).arenaBytes, 320);
  EXPECT_EQ(p.plan(2).arenaBytes, 384);
  // Dependencies never cross stages; the broadcast waits for c1's copy.
  EXPECT_EQ(f.steps[1].deps, std::vector<int>{0});
  EXPECT_EQ(f.steps[3].deps, std::vector<int>{2});
  EXPECT_TRUE(f.steps[4].deps.empty());
  EXPECT_EQ(f.steps[5].deps, std::vector<int>{3});
  // The same text again; "stage" only where >= 0: 7 stage-owned buffers
  // on each of 4 devices, 5 staged steps.
  std::string json = p.toJson();
  auto q = Program::parse(json, "again.kpack");
  ASSERT_TRUE(q.isOk()) << q.status().message();
  EXPECT_EQ(q->toJson(), json);
  EXPECT_EQ(count(json, "\"stage\""), size_t(7 * 4 + 5));
  // The start-up handshake's collective sequence names each one's stage.
  std::vector<std::string> seq = collectiveLines(p);
  ASSERT_EQ(seq.size(), size_t(3));
  EXPECT_EQ(
      seq[0],
      "@train_step 1: send axis=pp f32 none 32 bytes peer=1 send=0 recv=0 "
      "queue=1 stage=0");
  EXPECT_EQ(
      seq[2],
      "@train_step 5: broadcast axis=pp f32 none 32 bytes peer=1 send=0 recv=0 "
      "queue=0");
  // Without a "pp" axis: stage 0 everywhere.
  Program flat;
  flat.mesh.axes = {{"dp", 4}};
  EXPECT_EQ(flat.stageOf(3), 0);
  EXPECT_EQ(flat.numStages(), 1);
}

TEST(PipelinePlan, ParseRefusesCrossStageAccesses) {
  {
    // Stage 0's copy reads b1, a stage-1 buffer.
    Program p = pipelineProgram(1, false);
    p.functions[0].steps[0].args = {B1, A0};
    std::string m = parseError(p);
    EXPECT_NE(m.find("pp.kpack: the buffer plan is invalid: @train_step step 0 (stage 0) reads "
                     "buffer 'b1' of stage 1, which its devices do not hold"),
              std::string::npos)
        << m;
  }
  {
    // Stage 1's copy writes s0 (stage 0).
    Program p = pipelineProgram(1, false);
    p.functions[0].steps[3].args = {B1, S0};
    std::string m = parseError(p);
    EXPECT_NE(m.find("@train_step step 3 (stage 1) writes buffer 's0' of stage 0"),
              std::string::npos)
        << m;
  }
  {
    // A step every stage runs writes a stage-1 buffer.
    Program p = pipelineProgram(1, false);
    p.functions[0].steps[5].args = {C1, D1};
    std::string m = parseError(p);
    EXPECT_NE(m.find("@train_step step 5 (every stage) writes buffer 'd1' of stage 1"),
              std::string::npos)
        << m;
  }
  {
    // A broadcast from stage 0 of a stage-1 buffer.
    Program p = pipelineProgram(1, false);
    p.functions[0].steps[5].collective.peer = 0;
    std::string m = parseError(p);
    EXPECT_NE(m.find("@train_step step 5 (every stage) broadcasts buffer 'c1' of stage 1 from "
                     "stage 0"),
              std::string::npos)
        << m;
  }
  {
    // Stage 2 of a two-stage mesh: a step, then a buffer.
    Program p = pipelineProgram(1, false);
    p.functions[0].steps[4].stage = 2;
    std::string m = parseError(p);
    EXPECT_NE(m.find("@train_step step 4 is on pipeline stage 2, but the mesh has 2 stages"),
              std::string::npos)
        << m;
    Program q = pipelineProgram(1, false);
    q.otherDevices[0].buffers[D1].stage = 2;
    q.buffers[D1].stage = 2;
    m = parseError(q);
    EXPECT_NE(m.find("buffer 'd1' is on pipeline stage 2, but the mesh has 2 stages"),
              std::string::npos)
        << m;
  }
  {
    // Stage 1's copy waits for stage 0's send.
    Program p = pipelineProgram(1, false);
    p.functions[0].steps[3].deps = {1, 2};
    std::string m = parseError(p);
    EXPECT_NE(m.find("@train_step step 3 (stage 1) depends on step 1 of stage 0, which its "
                     "devices do not run"),
              std::string::npos)
        << m;
  }
  {
    // The devices disagree on a buffer's stage.
    Program p = pipelineProgram(1, false);
    p.otherDevices[0].buffers[S0].stage = -1;
    EXPECT_NE(parseError(p).find("device 1's buffers differ from device 0's"), std::string::npos);
  }
  {
    // Arena ranges per stage: d1 past stage 0's arena is fine (above), a
    // stage-0 buffer past it is not; nor a stage -1 one.
    Program p = pipelineProgram(1, false);
    p.buffers[S0].offset = 320;
    p.otherDevices[0].buffers[S0].offset = 320;
    EXPECT_NE(parseError(p).find("buffer 's0' [320, 352) lies outside the 320-byte arena"),
              std::string::npos)
        << parseError(p);
    Program q = pipelineProgram(1, false);
    q.buffers[D1].stage = -1;
    q.otherDevices[0].buffers[D1].stage = -1;
    q.functions[0].steps[4].stage = -1;
    q.functions[0].steps[4].args = {X, D1};
    EXPECT_NE(parseError(q).find("buffer 'd1' [320, 352) lies outside the 320-byte arena"),
              std::string::npos)
        << parseError(q);
    EXPECT_EQ(parseError(pipelineProgram(1, false)), "");
  }
}

/// Runs `body(device)` on one thread per device; joins them all.
void onThreads(int n, const std::function<void(int)> &body) {
  std::vector<std::thread> ts;
  for (int d = 0; d < n; ++d)
    ts.emplace_back(body, d);
  for (std::thread &t : ts)
    t.join();
}

std::vector<float> filled(float base) {
  std::vector<float> v(kN);
  for (int64_t i = 0; i < kN; ++i)
    v[size_t(i)] = base + float(i);
  return v;
}

std::vector<float> readFloats(Backend &e, int id, Status &st) {
  std::vector<float> v(kN, -1.f);
  st = e.read(id, v.data(), kN * 4);
  return v;
}

using CommThread = cpu::ExecutorOptions::CommThread;

struct Config {
  int dp;
  CommThread mode;
  int interOp;
};

class PipelineRun : public ::testing::TestWithParam<Config> {};

TEST_P(PipelineRun, EachStageRunsItsStepsAndTouchesOnlyItsBuffers) {
  Config c = GetParam();
  Program p = pipelineProgram(c.dp);
  int n = p.numDevices();
  auto comms = comm::makeInProcessCommunicators(n);
  size_t devices = size_t(n);
  std::vector<std::string> errors(devices), foreign(devices);
  std::vector<std::vector<float>> outs(devices), mine(devices);
  std::vector<std::vector<Backend::Timing>> timings(devices);
  onThreads(n, [&](int d) {
    comms[size_t(d)]->setTimeout(20);
    cpu::ExecutorOptions o;
    o.communicator = comms[size_t(d)].get();
    o.commThread = c.mode;
    o.interOpThreads = c.interOp;
    auto made = cpu::Executor::create(p, nullptr, o);
    if (!made) {
      errors[size_t(d)] = made.status().message();
      comms[size_t(d)]->abort("no executor");
      return;
    }
    cpu::Executor &e = **made;
    e.setProfiling(true);
    int stage = p.stageOf(d);
    auto check = [&](Status s) {
      if (!s && errors[size_t(d)].empty())
        errors[size_t(d)] = s.message();
    };
    // Stage 0: w0 and a sentinel in s0; stage 1: w1 (same bytes as w0).
    if (stage == 0) {
      check(e.write(W0, filled(7).data(), kN * 4));
      check(e.write(S0, filled(-70).data(), kN * 4));
    } else {
      check(e.write(W1, filled(50).data(), kN * 4));
    }
    for (int run = 0; run < 2; ++run) {
      check(e.write(X, filled(float(100 * d + 10 * run)).data(), kN * 4));
      check(e.run("train_step"));
    }
    Status st = Status::ok();
    outs[size_t(d)] = readFloats(e, Out, st);
    check(st);
    // What only this stage holds: s0 (never clobbered by c1's copy) on
    // stage 0, d1 (w1's copy) on stage 1.
    mine[size_t(d)] = readFloats(e, stage == 0 ? S0 : D1, st);
    check(st);
    // Another stage's buffer: refused, naming it.
    readFloats(e, stage == 0 ? C1 : A0, st);
    foreign[size_t(d)] = st ? "" : st.message();
    timings[size_t(d)] = e.timings();
  });
  for (int d = 0; d < n; ++d) {
    SCOPED_TRACE(fmt::format("device {} of {}", d, n));
    ASSERT_EQ(errors[size_t(d)], "");
    int stage = p.stageOf(d), dpc = d % c.dp;
    // The last run's x of the stage-0 device with this dp coordinate.
    EXPECT_EQ(outs[size_t(d)], filled(float(100 * dpc + 10)));
    EXPECT_EQ(mine[size_t(d)], stage == 0 ? filled(-70) : filled(50));
    EXPECT_NE(foreign[size_t(d)].find(fmt::format(
                  "device {} (pipeline stage {}) cannot read buffer '{}': it lives on the "
                  "devices of stage {} only",
                  d, stage, stage == 0 ? "c1" : "a0", 1 - stage)),
              std::string::npos)
        << foreign[size_t(d)];
    // The profile saw this stage's steps only: two runs.
    std::map<std::string, int64_t> calls;
    for (const Backend::Timing &t : timings[size_t(d)])
      calls[t.name] += t.calls;
    EXPECT_EQ(calls["copy"], stage == 0 ? 2 : 4);
    EXPECT_EQ(calls["send"], stage == 0 ? 2 : 0);
    EXPECT_EQ(calls["recv"], stage == 0 ? 0 : 2);
    EXPECT_EQ(calls["broadcast"], 2);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, PipelineRun,
    ::testing::Values(Config{1, CommThread::On, 1}, Config{2, CommThread::On, 1},
                      Config{1, CommThread::Off, 1}, Config{2, CommThread::Off, 1},
                      Config{2, CommThread::On, 2}),
    [](const auto &info) {
      const Config &c = info.param;
      return fmt::format("pp2dp{}{}{}", c.dp, c.mode == CommThread::Off ? "NoCommThread" : "",
                         c.interOp > 1 ? "InterOp" : "");
    });

// Stage 0's device never runs: stage 1's recv fails within its deadline,
// naming the step, its location and the rank that did not send.
TEST(PipelineStall, AStageThatNeverSendsFailsTheNextWithinTheDeadline) {
  Program p = pipelineProgram(1);
  auto comms = comm::makeInProcessCommunicators(2);
  comms[1]->setTimeout(0.5);
  cpu::ExecutorOptions o;
  o.communicator = comms[1].get();
  auto e = cpu::Executor::create(p, nullptr, o);
  ASSERT_TRUE(e.isOk()) << e.status().message();
  (*e)->setContext("training step 3");
  auto t0 = Clock::now();
  Status s = (*e)->run("train_step");
  double took = std::chrono::duration<double>(Clock::now() - t0).count();
  ASSERT_FALSE(s);
  const std::string &m = s.message();
  EXPECT_NE(m.find("@train_step step 2 (recv at m.kiln:8:3)"), std::string::npos) << m;
  EXPECT_NE(m.find("training step 3, @train_step step 2 (recv of 32 bytes"), std::string::npos)
      << m;
  EXPECT_NE(m.find("rank 1: recv (8 x f32 from rank 0)"), std::string::npos) << m;
  EXPECT_NE(m.find("rank(s) 0 did not arrive"), std::string::npos) << m;
  EXPECT_NE(m.find("timed out"), std::string::npos) << m;
  EXPECT_LT(took, 5.0);
}

ckpt::Tensor tensor(const std::string &name, const std::vector<float> &v) {
  ckpt::Tensor t;
  t.name = name;
  t.dtype = "F32";
  t.shape = {int64_t(v.size())};
  t.bytes.assign(reinterpret_cast<const char *>(v.data()), v.size() * 4);
  return t;
}

std::vector<float> floatsOf(const ckpt::Tensor *t) {
  if (!t)
    return {};
  std::vector<float> v(t->bytes.size() / 4);
  std::memcpy(v.data(), t->bytes.data(), v.size() * 4);
  return v;
}

Package pipelinePackage(int dp) {
  Package pkg;
  pkg.path = "pp.kpack";
  pkg.model = "pipeline";
  pkg.sourceHash = "0123456789abcdef";
  pkg.program = pipelineProgram(dp);
  pkg.initial.tensors = {tensor("w0", filled(1)), tensor("w1", filled(2))};
  return pkg;
}

/// Models of `pkg` on in-process devices: runs `body(model)` on each.
void onModels(const Package &pkg, std::vector<std::string> &errors,
              const std::function<void(train::Model &, std::vector<std::string> &)> &body) {
  int n = pkg.program.numDevices();
  auto comms = comm::makeInProcessCommunicators(n);
  errors.assign(size_t(n), "");
  onThreads(n, [&](int d) {
    comms[size_t(d)]->setTimeout(20);
    train::Model m;
    m.pkg = pkg;
    m.comm = comms[size_t(d)].get();
    m.device = d;
    cpu::ExecutorOptions o;
    o.communicator = m.comm;
    auto e = cpu::Executor::create(m.pkg.program, nullptr, o);
    Status s = e.isOk() ? m.attach(std::move(*e)) : e.status();
    if (!s) {
      errors[size_t(d)] = s.message();
      m.comm->abort("no model");
      return;
    }
    body(m, errors);
  });
}

TEST(PipelineModel, CheckpointsGatherEveryStageAndResumeUnderAnotherMesh) {
  std::string path = fmt::format("/tmp/kiln-pipeline-test-{}.safetensors", ::getpid());
  std::vector<std::string> errors;
  std::vector<ckpt::Checkpoint> got(4);
  std::vector<std::vector<float>> initial(4);
  std::vector<float> scalars(4, -1.f);
  onModels(pipelinePackage(2), errors, [&](train::Model &m, std::vector<std::string> &err) {
    int d = m.device, stage = m.prog().stageOf(d);
    int own = stage == 0 ? W0 : W1;
    // setPersistent wrote this stage's parameter (w0 and w1 share bytes).
    Status st = Status::ok();
    initial[size_t(d)] = readFloats(*m.exec, own, st);
    // A stage-1 scalar read on every device (broadcast over "pp").
    scalars[size_t(d)] = m.stageScalar(W1);
    // Training changes it on this stage's devices.
    st = m.exec->write(own, filled(10.f * float(stage + 1) + 0.5f).data(), kN * 4);
    auto c = st ? m.getPersistent() : Expected<ckpt::Checkpoint>(st);
    if (!c) {
      err[size_t(d)] = c.status().message();
      m.comm->abort("failed");
      return;
    }
    got[size_t(d)] = *c;
    // Every device takes part; device 0 writes the file.
    if (Status s = train::saveCheckpoint(m, path, 5, 9, d == 0); !s)
      err[size_t(d)] = s.message();
  });
  for (int d = 0; d < 4; ++d) {
    SCOPED_TRACE(fmt::format("device {}", d));
    ASSERT_EQ(errors[size_t(d)], "");
    EXPECT_EQ(initial[size_t(d)], d < 2 ? filled(1) : filled(2));
    EXPECT_EQ(scalars[size_t(d)], 2.f); // w1[0] from stage 1
    EXPECT_EQ(floatsOf(got[size_t(d)].find("w0")), filled(10.5f));
    EXPECT_EQ(floatsOf(got[size_t(d)].find("w1")), filled(20.5f));
  }
  auto saved = ckpt::read(path);
  std::remove(path.c_str());
  ASSERT_TRUE(saved.isOk()) << saved.status().message();
  EXPECT_EQ(floatsOf(saved->find("w0")), filled(10.5f));
  EXPECT_EQ(floatsOf(saved->find("w1")), filled(20.5f));
  // Resumed under ["pp", 2]: each stage gets its tensor.
  std::vector<std::vector<float>> resumed(2);
  onModels(pipelinePackage(1), errors, [&](train::Model &m, std::vector<std::string> &err) {
    int d = m.device;
    Status st = m.setPersistent(*saved);
    if (st)
      resumed[size_t(d)] = readFloats(*m.exec, d == 0 ? W0 : W1, st);
    if (!st)
      err[size_t(d)] = st.message();
  });
  for (int d = 0; d < 2; ++d) {
    ASSERT_EQ(errors[size_t(d)], "") << "device " << d;
    EXPECT_EQ(resumed[size_t(d)], d == 0 ? filled(10.5f) : filled(20.5f)) << "device " << d;
  }
}

// The counters of a pipelined plan: the steps of the device with the
// largest arena (stage 1's: recv, two copies, the broadcast).
TEST(PipelinePlan, CountersCountTheLargestDevicesSteps) {
  Counters c = countPlan(pipelineProgram(2));
  EXPECT_EQ(c.arenaBytes, 384);
  ASSERT_EQ(c.functions.size(), size_t(1));
  EXPECT_EQ(c.functions[0].steps, 4);
  EXPECT_EQ(c.functions[0].copies, 2);
  EXPECT_EQ(c.functions[0].collectives, 2);
  EXPECT_EQ(c.functions[0].collectiveBytes, 64);
}

// --log-placement's listing: who runs each step, what it is, its line;
// then each stage's share.
TEST(PipelinePlacement, ListsEveryStepAndEachStage) {
  Program p = pipelineProgram(2);
  std::vector<std::string> lines = train::placementLines(p, "train_step");
  for (const std::string &l : lines)
    std::printf("%s\n", l.c_str());
  ASSERT_EQ(lines.size(), size_t(1 + 6 + 2));
  EXPECT_EQ(lines[0], "placement of @train_step: 6 steps on 4 devices (mesh pp=2 x dp=2)");
  EXPECT_EQ(lines[1], "  0  stage 0 (devices 0,1)  copy 32 B                    -");
  EXPECT_EQ(lines[2], "  1  stage 0 (devices 0,1)  send 32 B to stage 1         m.kiln:8");
  EXPECT_EQ(lines[3], "  2  stage 1 (devices 2,3)  recv 32 B from stage 0       m.kiln:8");
  EXPECT_EQ(lines[6], "  5  all devices            broadcast 32 B from stage 1  m.kiln:12");
  EXPECT_EQ(lines[7], "  stage 0 (devices 0,1): 3 steps, 0 kernels, 0 GEMMs, 1 sends, 0 recvs, "
                      "32 B sent, arena 0.00 MiB (320 B)");
  EXPECT_EQ(lines[8], "  stage 1 (devices 2,3): 4 steps, 0 kernels, 0 GEMMs, 0 sends, 1 recvs, "
                      "0 B sent, arena 0.00 MiB (384 B)");
  // One device: everything on device 0.
  Program one = p;
  one.mesh.axes.clear();
  one.otherDevices.clear();
  for (Step &s : one.functions[0].steps)
    s.stage = -1;
  lines = train::placementLines(one, "train_step");
  ASSERT_EQ(lines.size(), size_t(1 + 6 + 1));
  EXPECT_EQ(lines[0], "placement of @train_step: 6 steps on 1 device");
  EXPECT_EQ(lines[1].substr(0, 14), "  0  device 0 ");
  EXPECT_EQ(lines[7], "  device 0: 6 steps, 0 kernels, 0 GEMMs, 1 sends, 1 recvs, 32 B sent, "
                      "arena 0.00 MiB (320 B)");
  EXPECT_TRUE(train::placementLines(p, "predict").empty());
}

} // namespace
