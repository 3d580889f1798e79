//===- PlanV2Test.cpp - Mesh, collectives, queues, dependencies, step loop ===//
//
// Plan v2 as the next issues will fill it: a program over a two-device mesh
// with every kind of collective step on two queues survives toJson/parse
// unchanged, and each way a collective, a queue or a dependency can be
// wrong is refused with a message that names the file and the fault. The
// compiler emits none of these yet, so this is where they are exercised.
// Then the dependency helper the compiler calls, and the step loop's
// dispatch (order, epilogues, the no-communicator error).
//
//===----------------------------------------------------------------------===//
#include "runtime/core/Program.h"
#include "runtime/core/StepLoop.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <functional>

namespace {

using namespace kiln;
using namespace kiln::program;
using json = nlohmann::ordered_json;

Buffer buffer(const std::string &name, Role role, std::vector<int64_t> shape, int64_t offset) {
  Buffer b;
  b.name = name;
  b.role = role;
  b.shape = std::move(shape);
  b.offset = offset;
  b.bytes = b.numElements() * 4;
  return b;
}

Step collective(Collective::Op op, std::vector<int> args, int64_t bytes) {
  Step s;
  s.kind = Step::Collective;
  s.args = std::move(args);
  s.collective.op = op;
  s.collective.bytes = bytes;
  s.collective.group = {0, 1};
  return s;
}

/// Two devices along axis "data"; buffers g (f32[8]) and h (f32[4]); one
/// step of every collective kind, on two queues.
Program meshProgram() {
  Program p;
  p.mesh.axes = {{"data", 2}};
  p.queues = 2;
  p.persistentBytes = 64;
  p.arenaBytes = 128;
  p.buffers = {buffer("g", Role::State, {8}, 0), buffer("", Role::Temp, {4}, 64)};
  BufferPlan other = p; // same buffers; its own sizes
  other.arenaBytes = 192;
  p.otherDevices = {other};
  Function f;
  f.name = "train_step";
  f.args = {0};
  f.scratchBytes = 64;
  Step ar = collective(Collective::Op::AllReduce, {0, 0}, 32);
  ar.collective.group.clear();
  ar.collective.axis = "data";
  ar.collective.reduction = Collective::Reduction::Mean;
  ar.queue = 1;
  ar.loc = "m.kiln:9:3";
  Step rs = collective(Collective::Op::ReduceScatter, {0, 1}, 32);
  rs.collective.reduction = Collective::Reduction::Sum;
  rs.deps = {0};
  Step ag = collective(Collective::Op::AllGather, {1, 0}, 16);
  ag.deps = {1};
  Step bc = collective(Collective::Op::Broadcast, {0, 0}, 16);
  bc.collective.peer = 1;
  bc.collective.sendOffset = bc.collective.recvOffset = 16;
  bc.deps = {2};
  Step sd = collective(Collective::Op::Send, {1}, 8);
  sd.collective.peer = 1;
  sd.collective.sendOffset = 8;
  sd.queue = 1;
  sd.deps = {3};
  Step rv = collective(Collective::Op::Recv, {1}, 8);
  rv.collective.peer = 0;
  rv.deps = {4};
  f.steps = {ar, rs, ag, bc, sd, rv};
  p.functions = {f};
  return p;
}

TEST(PlanV2, CollectivesRoundTrip) {
  Program p = meshProgram();
  std::string text = p.toJson();
  auto q = Program::parse(text, "mesh.kpack");
  ASSERT_TRUE(q.isOk()) << q.status().message();
  EXPECT_EQ(q->toJson(), text);
  EXPECT_EQ(q->numDevices(), 2);
  EXPECT_EQ(q->mesh.numDevices(), 2);
  EXPECT_EQ(q->plan(1).arenaBytes, 192);
  EXPECT_EQ(q->queues, 2);
  const Function &f = q->functions[0];
  ASSERT_EQ(f.steps.size(), 6u);
  EXPECT_EQ(f.steps[0].kind, Step::Collective);
  EXPECT_EQ(f.steps[0].collective.axis, "data");
  EXPECT_EQ(f.steps[0].collective.groupSize(q->mesh), 2);
  EXPECT_EQ(f.steps[0].collective.reduction, Collective::Reduction::Mean);
  EXPECT_EQ(f.steps[0].queue, 1);
  EXPECT_EQ(f.steps[1].collective.op, Collective::Op::ReduceScatter);
  EXPECT_EQ(f.steps[1].collective.group, (std::vector<int>{0, 1}));
  EXPECT_EQ(f.steps[3].collective.peer, 1);
  EXPECT_EQ(f.steps[3].collective.recvOffset, 16);
  EXPECT_EQ(f.steps[4].collective.op, Collective::Op::Send);
  EXPECT_EQ(f.steps[5].deps, (std::vector<int>{4}));
  // A listing names what crosses queues only.
  EXPECT_EQ(scheduleNote(f, 0), "[queue 1]");
  EXPECT_EQ(scheduleNote(f, 1), "[queue 0, after 0]");
  EXPECT_EQ(scheduleNote(f, 3), "");
  EXPECT_EQ(scheduleNote(f, 4), "[queue 1, after 3]");
}

/// `damage` applied to the mesh program's JSON must be refused with a
/// message naming the file and containing `want`.
void expectRefused(const std::function<void(json &)> &damage, const std::string &want) {
  json j = json::parse(meshProgram().toJson());
  damage(j);
  auto p = Program::parse(j.dump(), "mesh.kpack");
  ASSERT_FALSE(p.isOk()) << "accepted a plan that should fail with: " << want;
  const std::string &m = p.status().message();
  EXPECT_NE(m.find("mesh.kpack"), std::string::npos) << m;
  EXPECT_NE(m.find(want), std::string::npos) << m;
  EXPECT_NE(m.find("recompile"), std::string::npos) << m;
}

json &step(json &j, int i) { return j["functions"][0]["steps"][i]; }
json &coll(json &j, int i) { return step(j, i)["collective"]; }

TEST(PlanV2, RefusesWrongCollectives) {
  expectRefused([](json &j) { coll(j, 0)["op"] = "all_to_all"; }, "unknown collective op 'all_to_all'");
  expectRefused([](json &j) { coll(j, 0)["reduction"] = "none"; }, "all_reduce needs a reduction");
  expectRefused([](json &j) { coll(j, 0)["reduction"] = "product"; }, "unknown reduction 'product'");
  expectRefused([](json &j) { coll(j, 2)["reduction"] = "sum"; }, "all_gather takes no reduction");
  expectRefused([](json &j) { coll(j, 0)["group"] = {0, 1}; }, "either a group of devices or a mesh axis");
  expectRefused([](json &j) { coll(j, 1).erase("group"); }, "either a group of devices or a mesh axis");
  expectRefused([](json &j) { coll(j, 0)["axis"] = "model"; }, "mesh axis 'model'");
  expectRefused([](json &j) { coll(j, 1)["group"] = {0, 2}; }, "'group' holds a bad index");
  expectRefused([](json &j) { coll(j, 1)["group"] = {1, 1}; }, "names a device twice");
  expectRefused([](json &j) { coll(j, 1)["group"] = json::array(); }, "group is empty");
  expectRefused([](json &j) { coll(j, 0)["dtype"] = "f128"; }, "unknown dtype 'f128'");
  expectRefused([](json &j) { coll(j, 0)["dtype"] = "f16"; }, "outside its f16 buffers");
  expectRefused([](json &j) { coll(j, 0)["bytes"] = 30; }, "not whole elements");
  expectRefused([](json &j) { coll(j, 3)["send_offset"] = 2; }, "not whole elements");
  expectRefused([](json &j) { coll(j, 0)["bytes"] = 0; }, "'bytes' = 0 is out of range");
  expectRefused([](json &j) { coll(j, 1)["bytes"] = 36; }, "does not split into 2 equal parts");
  expectRefused([](json &j) { coll(j, 0)["bytes"] = 64; }, "reads or writes outside");
  expectRefused([](json &j) { coll(j, 2)["bytes"] = 32; }, "reads or writes outside"); // gathers 64 into 32
  expectRefused([](json &j) { coll(j, 3)["recv_offset"] = 20; }, "reads or writes outside");
  expectRefused([](json &j) { coll(j, 4)["send_offset"] = 12; }, "reads or writes outside");
  expectRefused([](json &j) { step(j, 4)["args"] = {1, 0}; }, "a send step needs 1 buffer");
  expectRefused([](json &j) { step(j, 0)["args"] = {0}; }, "an all_reduce step needs 2 buffers");
  expectRefused([](json &j) { coll(j, 4)["peer"] = -1; }, "a send needs a peer");
  expectRefused([](json &j) { coll(j, 0)["peer"] = 0; }, "an all_reduce takes no peer");
  expectRefused([](json &j) { coll(j, 5)["peer"] = 2; }, "'peer' = 2 is out of range");
  expectRefused([](json &j) { step(j, 0).erase("collective"); }, "'op' is missing");
}

TEST(PlanV2, RefusesWrongQueuesDependenciesAndMeshes) {
  expectRefused([](json &j) { step(j, 0)["queue"] = 2; }, "(the plan has 2 queues)");
  expectRefused([](json &j) { step(j, 0)["queue"] = -1; }, "'queue' = -1 is out of range");
  expectRefused([](json &j) { j["queues"] = 0; }, "'queues' = 0 is out of range");
  expectRefused([](json &j) { step(j, 2)["deps"] = {2}; }, "step 2 of @train_step depends on 2, which is not an earlier step");
  expectRefused([](json &j) { step(j, 2)["deps"] = {5}; }, "depends on 5, which is not an earlier step");
  expectRefused([](json &j) { step(j, 2)["deps"] = {"a"}; }, "which is not an earlier step");
  expectRefused([](json &j) { step(j, 2).erase("deps"); }, "has no dependency list");
  expectRefused([](json &j) { j["mesh"]["axes"][0]["size"] = 3; }, "the mesh has 3 devices but the plan has 2 buffer plans");
  expectRefused([](json &j) { j["mesh"]["axes"].push_back({{"name", "data"}, {"size", 1}}); }, "distinct, non-empty names");
  expectRefused([](json &j) { j.erase("mesh"); }, "the device mesh is missing");
  expectRefused([](json &j) { j["devices"][1]["device"] = 0; }, "buffer plan 1 is for device 0");
  expectRefused([](json &j) { j["devices"][1]["buffers"][1]["shape"] = {2, 2}; }, "device 1's buffers differ from device 0's");
  expectRefused([](json &j) { j["devices"][1]["arena_bytes"] = 64; }, "lies outside the 64-byte arena");
}

TEST(PlanV2, OlderPlansAreRefusedWithBothVersions) {
  json j = json::parse(meshProgram().toJson());
  for (int version : {1, 3}) {
    j["version"] = version;
    auto p = Program::parse(j.dump(), "old.kpack");
    ASSERT_FALSE(p.isOk());
    EXPECT_NE(p.status().message().find(fmt::format(
                  "old.kpack: the buffer plan has version {} but this Kiln reads plan version 2; "
                  "recompile the model with this kilnc", version)),
              std::string::npos)
        << p.status().message();
  }
  // A version 1 plan has no "version" at all.
  j.erase("version");
  auto p = Program::parse(j.dump(), "old.kpack");
  ASSERT_FALSE(p.isOk());
  EXPECT_NE(p.status().message().find("has version 1 but"), std::string::npos)
      << p.status().message();
}

// Buffers: 0 param w [0, 64), 1 and 2 temps sharing [64, 128) (liveness
// reuse), 3 output [128, 192). Kernel 0 reads arg 0, writes arg 1.
Program aliasingProgram() {
  Program p;
  p.persistentBytes = 64;
  p.arenaBytes = 192;
  p.buffers = {buffer("w", Role::Param, {4}, 0), buffer("", Role::Temp, {4}, 64),
               buffer("", Role::Temp, {4}, 64), buffer("y", Role::Output, {4}, 128)};
  Kernel k;
  k.symbol = "k0";
  k.numArgs = 2;
  k.numInputs = 1;
  k.writes = {1};
  p.kernels = {k};
  auto call = [](int in, int out) {
    Step s;
    s.kernel = 0;
    s.args = {in, out};
    return s;
  };
  Function f;
  f.name = "train_step";
  Step copy;
  copy.kind = Step::Copy;
  copy.args = {3, 0};
  // 0: t1 = k(w); 1: y = k(t1); 2: t2 = k(w) (over t1's memory: after 1
  // read t1); 3: y = k(t2) (WAW on y, RAW on t2); 4: w = copy(y).
  f.steps = {call(0, 1), call(1, 3), call(0, 2), call(2, 3), copy};
  p.functions = {f};
  return p;
}

TEST(PlanV2, DependenciesFollowMemoryNotBufferIds) {
  Program p = aliasingProgram();
  computeDependencies(p, p.functions[0]);
  const auto &s = p.functions[0].steps;
  EXPECT_EQ(s[0].deps, std::vector<int>{});
  EXPECT_EQ(s[1].deps, std::vector<int>{0});
  EXPECT_EQ(s[2].deps, (std::vector<int>{0, 1})); // WAW on t1's memory, WAR after step 1
  EXPECT_EQ(s[3].deps, (std::vector<int>{1, 2}));
  EXPECT_EQ(s[4].deps, (std::vector<int>{0, 2, 3})); // reads y; overwrites w, read by 0 and 2
  for (const Step &st : s)
    EXPECT_EQ(st.queue, 0);
  // The compiler's plans keep their listing: one queue says nothing.
  for (size_t i = 0; i < s.size(); ++i)
    EXPECT_EQ(scheduleNote(p.functions[0], i), "");
  // Parse accepts what it computes.
  auto q = Program::parse(p.toJson(), "alias.kpack");
  ASSERT_TRUE(q.isOk()) << q.status().message();
  EXPECT_EQ(q->functions[0].steps[4].deps, (std::vector<int>{0, 2, 3}));
}

/// Records what the loop asks for.
class RecordingHooks : public StepHooks {
public:
  std::vector<std::string> calls;
  bool library = false;
  Status runKernel(int kernel, const std::vector<int> &) override {
    calls.push_back("kernel " + std::to_string(kernel));
    return Status::ok();
  }
  Status runGemm(const Step &, bool libraryEpilogue) override {
    calls.push_back(libraryEpilogue ? "gemm+lt" : "gemm");
    return Status::ok();
  }
  Status runCopy(const Step &) override {
    calls.push_back("copy");
    return Status::ok();
  }
  bool libraryEpilogues() const override { return library; }
  const char *gemmName() const override { return "gemm (test)"; }
  Status beginTimed() override { return Status::ok(); }
  Expected<double> endTimed() override { return 0.5; }
};

TEST(StepLoop, DispatchesInOrderAndProfilesOnce) {
  Program p = aliasingProgram();
  p.kernels.push_back(p.kernels[0]);
  p.kernels[1].symbol = "k1_epilogue";
  Step g;
  g.kind = Step::Gemm;
  g.gemm.m = g.gemm.n = g.gemm.k = 2;
  g.args = {0, 1, 2};
  g.epilogue = 1;
  g.epilogueArgs = {2, 3};
  g.lt.out = 3;
  p.functions[0].steps.insert(p.functions[0].steps.begin() + 1, g);
  RecordingHooks hooks;
  StepProfile profile(p.kernels.size());
  ASSERT_TRUE(runSteps(p, p.functions[0], 0, SIZE_MAX, hooks, &profile));
  EXPECT_EQ(hooks.calls, (std::vector<std::string>{"kernel 0", "gemm", "kernel 1", "kernel 0",
                                                   "kernel 0", "kernel 0", "copy"}));
  auto t = profile.timings(p);
  ASSERT_EQ(t.size(), 4u); // k0, the epilogue, the GEMM's shape, copy
  EXPECT_EQ(t[0].name, "k0");
  EXPECT_EQ(t[0].calls, 4);
  EXPECT_DOUBLE_EQ(t[0].seconds, 2.0);
  EXPECT_EQ(t[1].name, "k1_epilogue");
  EXPECT_EQ(t[2].op, "gemm (test)");
  EXPECT_EQ(t[3].name, "copy");
  // A library epilogue replaces the epilogue kernel; a range runs a part.
  hooks.calls.clear();
  hooks.library = true;
  ASSERT_TRUE(runSteps(p, p.functions[0], 1, 3, hooks, nullptr));
  EXPECT_EQ(hooks.calls, (std::vector<std::string>{"gemm+lt", "kernel 0"}));
}

TEST(StepLoop, TracesEveryTimedStepWhileEnabled) {
  Program p = aliasingProgram();
  p.kernels[0].flops = 100;
  RecordingHooks hooks;
  StepProfile profile(p.kernels.size());
  Tracer tracer;
  profile.tracer = &tracer;
  // Disabled: nothing recorded, the profile still counts.
  ASSERT_TRUE(runSteps(p, p.functions[0], 0, SIZE_MAX, hooks, &profile));
  EXPECT_TRUE(tracer.spans().empty());
  tracer.setEnabled(true);
  tracer.setStep(7);
  ASSERT_TRUE(runSteps(p, p.functions[0], 0, SIZE_MAX, hooks, &profile));
  auto spans = tracer.spans();
  ASSERT_EQ(spans.size(), p.functions[0].steps.size());
  for (size_t i = 0; i < spans.size(); ++i) {
    EXPECT_EQ(spans[i].planStep, int(i));
    EXPECT_EQ(spans[i].step, 7);
    EXPECT_EQ(spans[i].function, p.functions[0].name);
    EXPECT_DOUBLE_EQ(spans[i].seconds, 0.5); // what the hooks measured
    if (i > 0) {
      EXPECT_GE(spans[i].start, spans[i - 1].start);
    }
  }
  EXPECT_EQ(spans[0].kind, Span::Kernel);
  EXPECT_EQ(spans[0].name, "k0");
  EXPECT_EQ(spans[0].kernel, 0);
  EXPECT_DOUBLE_EQ(spans[0].flops, 100);
  EXPECT_GT(spans[0].bytes, 0);
  EXPECT_EQ(spans.back().kind, Span::Copy);
}

TEST(StepLoop, CollectivesNeedACommunicator) {
  Program p = meshProgram();
  RecordingHooks hooks;
  Status s = runSteps(p, p.functions[0], 0, SIZE_MAX, hooks, nullptr);
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("@train_step step 0 (all_reduce on queue 1 at m.kiln:9:3): this "
                             "backend has no communicator"),
            std::string::npos)
      << s.message();
}

} // namespace

// Another device's plan may lay buffers out differently: a conflict there
// is a dependency too (every device runs the same steps).
TEST(PlanV2, DependenciesFollowEveryDevicesMemory) {
  Program p = aliasingProgram();
  p.buffers = {buffer("a", Role::Param, {4}, 0), buffer("", Role::Temp, {4}, 64),
               buffer("c", Role::Output, {4}, 128)};
  auto call = [](int in, int out) {
    Step st;
    st.kernel = 0;
    st.args = {in, out};
    return st;
  };
  p.functions[0].steps = {call(0, 1), call(0, 2)}; // b = k(a); c = k(a)
  computeDependencies(p, p.functions[0]);
  EXPECT_EQ(p.functions[0].steps[1].deps, std::vector<int>{}); // apart on device 0
  BufferPlan other = p;
  other.buffers[2].offset = 64; // device 1: c over b's memory
  p.mesh.axes = {{"data", 2}};
  p.otherDevices = {other};
  computeDependencies(p, p.functions[0]);
  EXPECT_EQ(p.functions[0].steps[1].deps, std::vector<int>{0}); // WAW on device 1
}

// A backend without a communicator refuses a plan with collectives when it
// is created, naming the step, instead of failing half-way through it.
TEST(StepLoop, SingleDeviceBackendsRefuseCollectivesAtLoad) {
  Program mesh = meshProgram();
  Status s = checkSingleDevice(mesh);
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("mesh of 2 devices"), std::string::npos) << s.message();
  Program one = meshProgram();
  one.mesh.axes.clear();
  one.otherDevices.clear();
  s = checkSingleDevice(one);
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("@train_step step 0 is a collective (all_reduce)"), std::string::npos)
      << s.message();
  EXPECT_TRUE(checkSingleDevice(aliasingProgram()));
}
