//===- ExecutorCollectiveTest.cpp - CPU executors running collective steps ===//
//
// Hand-built plan-v2 programs over a mesh of 2 and 4 devices, each device
// run by its own CPU executor on its own thread, exchanging through the
// in-process communicator (runtime/comm/InProcess.h):
//   - all_reduce in place on queue 1, a dependent copy on queue 0,
//     reduce_scatter and all_gather: results bitwise as the communicator
//     contract defines them (member order, a mean divides the sum by N),
//     with every device's buffers at its own offsets;
//   - a queue-1 collective overlaps a later queue-0 step that does not
//     depend on it (the collective cannot finish until that step ran);
//   - the same with no communication thread (ExecutorOptions::commThread
//     Off): the same bits, the collective made at the wait, the same
//     errors;
//   - a device that never runs: the others fail within the deadline, the
//     error naming the step, its location and the ranks missing;
//   - the start-up handshake refuses another artifact hash and another
//     collective sequence;
//   - the CUDA executor's collective path, on a host-memory test device
//     (no GPU, no emulator: kernel-free programs need neither), and its
//     pipeline stages (only its stage's steps and buffers).
// Programs without kernels (copies and collectives only), so no JIT.
//
//===----------------------------------------------------------------------===//
#include "runtime/comm/InProcess.h"
#include "runtime/core/Collectives.h"
#include "runtime/core/Handshake.h"
#include "runtime/core/Program.h"
#include "runtime/core/StepLoop.h"
#include "runtime/cpu/Executor.h"
#include "runtime/cuda/Executor.h"
#include "test/unit/runtime/MeshProgram.h"
#include "test/unit/runtime/PipelineProgram.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <tuple>

namespace {

using namespace kiln;
using namespace kiln::program;
using namespace kiln::test;
using Clock = std::chrono::steady_clock;

std::vector<float> randomVector(std::mt19937 &rng, int64_t n) {
  std::normal_distribution<float> dist;
  std::vector<float> v(static_cast<size_t>(n));
  for (float &x : v)
    x = dist(rng);
  return v;
}

/// Runs `body(device)` on one thread per device; joins them all.
void onThreads(int n, const std::function<void(int)> &body) {
  std::vector<std::thread> ts;
  for (int d = 0; d < n; ++d)
    ts.emplace_back(body, d);
  for (std::thread &t : ts)
    t.join();
}

using CommThread = cpu::ExecutorOptions::CommThread;

std::unique_ptr<cpu::Executor> executor(const Program &p, comm::Communicator *c,
                                        int threads = 1,
                                        CommThread mode = CommThread::On) {
  cpu::ExecutorOptions o;
  o.threads = threads;
  o.communicator = c;
  o.commThread = mode;
  auto e = cpu::Executor::create(p, nullptr, o);
  EXPECT_TRUE(e.isOk()) << e.status().message();
  return e.isOk() ? std::move(*e) : nullptr;
}

bool sameBits(const std::vector<float> &a, const std::vector<float> &b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

/// (devices, collectives on the compute thread).
class Collectives : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(Collectives, BitwiseAsTheContractSays) {
  int n = std::get<0>(GetParam());
  CommThread mode = std::get<1>(GetParam()) ? CommThread::Off : CommThread::On;
  Program p = meshProgram(n);
  ASSERT_EQ(p.functions[0].steps[2].deps,
            std::vector<int>{0}); // c = copy(g) waits for 0
  auto comms = comm::makeInProcessCommunicators(n);
  std::mt19937 rng(1234 + n);
  std::vector<std::vector<float>> g(static_cast<size_t>(n)),
      x(static_cast<size_t>(n));
  for (int d = 0; d < n; ++d) {
    g[size_t(d)] = randomVector(rng, kN);
    x[size_t(d)] = randomVector(rng, kN);
  }
  // The contract: sum in member order, member 0 first; mean = sum / n.
  std::vector<float> sum(kN), mean(kN);
  for (int64_t e = 0; e < kN; ++e) {
    float s = g[0][size_t(e)];
    for (int d = 1; d < n; ++d)
      s += g[size_t(d)][size_t(e)];
    sum[size_t(e)] = s;
    // reduce_scatter of the already-summed g: n equal values summed in order.
    float t = s;
    for (int d = 1; d < n; ++d)
      t += s;
    mean[size_t(e)] = t / float(n);
  }
  std::vector<std::vector<float>> gOut(static_cast<size_t>(n)),
      block(static_cast<size_t>(n)), gathered(static_cast<size_t>(n)),
      c(static_cast<size_t>(n)), y(static_cast<size_t>(n));
  std::vector<std::string> errors(static_cast<size_t>(n));
  onThreads(n, [&](int d) {
    auto e = executor(p, comms[size_t(d)].get(), 1, mode);
    if (!e)
      return;
    EXPECT_EQ(e->device(), d);
    EXPECT_EQ(e->describe().find("no communication thread") != std::string::npos,
              mode == CommThread::Off)
        << e->describe();
    size_t i = size_t(d);
    // Its own layout: buffers where plan(d) puts them.
    const BufferPlan &plan = p.plan(d);
    EXPECT_EQ(static_cast<char *>(e->data(5)) - static_cast<char *>(e->data(0)),
              plan.buffers[5].offset - plan.buffers[0].offset);
    ASSERT_TRUE(e->write(0, g[i].data(), kN * 4));
    ASSERT_TRUE(e->write(4, x[i].data(), kN * 4));
    // Twice: the second run starts from the first's results (g summed).
    for (int run = 0; run < 2; ++run) {
      if (run == 1) {
        ASSERT_TRUE(e->write(0, g[i].data(), kN * 4));
      }
      Status s = e->run("train_step");
      if (!s) {
        errors[i] = s.message();
        return;
      }
    }
    gOut[i] = *e->readAll<float>(0);
    block[i] = *e->readAll<float>(1);
    gathered[i] = *e->readAll<float>(2);
    c[i] = *e->readAll<float>(3);
    y[i] = *e->readAll<float>(5);
  });
  for (int d = 0; d < n; ++d) {
    size_t i = size_t(d);
    ASSERT_EQ(errors[i], "") << "device " << d;
    EXPECT_TRUE(sameBits(gOut[i], sum))
        << "device " << d << ": all_reduce(sum)";
    EXPECT_TRUE(sameBits(c[i], sum))
        << "device " << d << ": the copy after the all_reduce";
    std::vector<float> want(mean.begin() + d * (kN / n),
                            mean.begin() + (d + 1) * (kN / n));
    EXPECT_TRUE(sameBits(block[i], want))
        << "device " << d << ": reduce_scatter(mean)";
    EXPECT_TRUE(sameBits(gathered[i], mean))
        << "device " << d << ": all_gather";
    EXPECT_TRUE(sameBits(y[i], x[i]))
        << "device " << d << ": the independent copy";
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, Collectives,
                         ::testing::Combine(::testing::Values(2, 4), ::testing::Bool()),
                         [](const auto &info) {
                           return fmt::format("n{}{}", std::get<0>(info.param),
                                              std::get<1>(info.param) ? "_inline" : "");
                         });

// Auto (the default) keeps a communication thread, with one thread or
// more; Off has none.
TEST(Collectives, OnlyOffRunsCollectivesOnTheDevicesThread) {
  Program p = meshProgram(2);
  auto comms = comm::makeInProcessCommunicators(2);
  auto one = executor(p, comms[0].get(), 1, CommThread::Auto);
  auto off = executor(p, comms[1].get(), 2, CommThread::Off);
  ASSERT_TRUE(one && off);
  EXPECT_EQ(one->describe().find("no communication thread"), std::string::npos)
      << one->describe();
  EXPECT_NE(off->describe().find("(2 threads, no communication thread, in-process"),
            std::string::npos)
      << off->describe();
}

/// Forwards to a communicator; all_reduce first waits (5 s at most) until
/// `ready` says the queue-0 step that does not depend on it has run.
class GatedCommunicator : public comm::Communicator {
public:
  GatedCommunicator(comm::Communicator &inner, std::function<bool()> ready)
      : inner_(inner), ready_(std::move(ready)) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const char *kind() const override { return inner_.kind(); }
  Status allReduce(const void *send, void *recv, int64_t count,
                   ElementType type, comm::Reduction r,
                   const comm::Group &group) override {
    auto until = Clock::now() + std::chrono::seconds(5);
    while (!ready_()) {
      if (Clock::now() > until)
        return Status::error(
            "the gate never opened: the step loop did not run the queue-0 "
            "step while the all_reduce was in flight");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    gated++;
    return inner_.allReduce(send, recv, count, type, r, group);
  }
  Status reduceScatter(const void *send, void *recv, int64_t n, ElementType t,
                       comm::Reduction r, const comm::Group &g) override {
    return inner_.reduceScatter(send, recv, n, t, r, g);
  }
  Status allGather(const void *send, void *recv, int64_t n, ElementType t,
                   const comm::Group &g) override {
    return inner_.allGather(send, recv, n, t, g);
  }
  Status broadcast(void *b, int64_t n, ElementType t, int root,
                   const comm::Group &g) override {
    return inner_.broadcast(b, n, t, root, g);
  }
  Status send(const void *b, int64_t n, ElementType t, int peer) override {
    return inner_.send(b, n, t, peer);
  }
  Status recv(void *b, int64_t n, ElementType t, int peer) override {
    return inner_.recv(b, n, t, peer);
  }
  void abort(const std::string &why) override { inner_.abort(why); }
  std::atomic<int> gated{0};

private:
  comm::Communicator &inner_;
  std::function<bool()> ready_;
};

// Step 0 (all_reduce, queue 1) cannot finish before step 1 (copy x -> y,
// queue 0) has run: a loop that waited for the collective before going on
// would time out at the gate. With no communication thread the call is
// made at step 2's wait, after step 1, so it passes the gate too.
class CollectivesMode : public ::testing::TestWithParam<bool> {};

TEST_P(CollectivesMode, QueueOneOverlapsLaterQueueZeroSteps) {
  CommThread mode = GetParam() ? CommThread::Off : CommThread::On;
  int n = 2;
  Program p = meshProgram(n);
  auto comms = comm::makeInProcessCommunicators(n);
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<double> ran(static_cast<size_t>(n)),
      exposed(static_cast<size_t>(n));
  std::vector<int> gated(static_cast<size_t>(n));
  onThreads(n, [&](int d) {
    std::unique_ptr<cpu::Executor> e;
    float marker = 42.0f + float(d);
    GatedCommunicator gate(*comms[size_t(d)], [&] {
      float v;
      std::memcpy(&v, e->data(5), 4); // y: written by step 1
      return v == marker;
    });
    e = executor(p, &gate, 1, mode);
    if (!e)
      return;
    std::vector<float> x(kN, marker);
    ASSERT_TRUE(e->write(4, x.data(), kN * 4));
    e->setProfiling(true);
    Status s = e->run("train_step");
    errors[size_t(d)] = s.message();
    ran[size_t(d)] = e->profile().collectiveSeconds();
    exposed[size_t(d)] = e->profile().exposedCollectiveSeconds();
    gated[size_t(d)] = gate.gated;
    // The profile lists each op's run time and its exposed time.
    bool listed = false;
    for (const Backend::Timing &t : e->timings())
      listed |= t.name == "all_reduce exposed" && t.op == "collective wait" &&
                t.calls == 1;
    EXPECT_TRUE(listed) << "device " << d;
  });
  for (int d = 0; d < n; ++d) {
    EXPECT_EQ(errors[size_t(d)], "") << "device " << d;
    EXPECT_EQ(gated[size_t(d)], 1);
    EXPECT_GT(ran[size_t(d)], 0);
    // The wait also counts the waiter's wake-up after the collective ends:
    // on a loaded 2-core machine that reached 2 ms (a CI run with a build
    // beside it), so allow 20 ms. This checks that exposed time is part of the
    // collective's time, not an exact bound.
    EXPECT_GE(ran[size_t(d)] + 20e-3, exposed[size_t(d)]);
  }
}

// Device 1 never runs: device 0's queue-1 all_reduce times out and the
// error surfaces when step 2 waits for it, naming the step, its location,
// the communicator's context and the missing rank, within the deadline.
TEST_P(CollectivesMode, AMissingDeviceFailsTheOthersWithinTheDeadline) {
  CommThread mode = GetParam() ? CommThread::Off : CommThread::On;
  int n = 2;
  Program p = meshProgram(n);
  auto comms = comm::makeInProcessCommunicators(n);
  comms[0]->setTimeout(0.5);
  auto e = executor(p, comms[0].get(), 1, mode);
  ASSERT_TRUE(e);
  e->setContext("training step 7");
  auto t0 = Clock::now();
  Status s = e->run("train_step");
  double took = std::chrono::duration<double>(Clock::now() - t0).count();
  ASSERT_FALSE(s);
  const std::string &m = s.message();
  EXPECT_NE(
      m.find("@train_step step 0 (all_reduce on queue 1 at m.kiln:9:3): "),
      std::string::npos)
      << m;
  EXPECT_NE(m.find("surfaced when step 2 waited for it"), std::string::npos)
      << m;
  EXPECT_NE(
      m.find("training step 7, @train_step step 0 (all_reduce of 32 bytes"),
      std::string::npos)
      << m; // the communicator's context
  EXPECT_NE(m.find("rank 0"), std::string::npos) << m;
  EXPECT_NE(m.find("timed out"), std::string::npos) << m;
  EXPECT_LT(took, 5.0); // 0.5 s deadline; generous for a loaded 2-core machine
  // The executor is not wedged: later runs fail at once, naming the cause.
  auto t1 = Clock::now();
  Status again = e->run("train_step");
  EXPECT_FALSE(again);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t1).count(), 5.0);
}

INSTANTIATE_TEST_SUITE_P(CommThread, CollectivesMode, ::testing::Bool(),
                         [](const auto &info) {
                           return info.param ? "Inline" : "Thread";
                         });

// A communication thread's call overlaps compute until someone waits for
// it (Communicator::waitedFor() false: the MPI communicator then polls
// sparingly); once wait() blocks the flag is set, and an idle queue leaves
// it set for direct callers of the communicator.
TEST(CollectiveQueue, ACallIsWaitedForOnlyOnceSomeoneWaits) {
  auto comms = comm::makeInProcessCommunicators(1);
  comm::Communicator &c = *comms[0];
  CollectiveQueue q(c, 0);
  std::atomic<int> before{-1}, after{-1};
  uint64_t t = q.push(
      [&] {
        before = c.waitedFor() ? 1 : 0;
        auto until = Clock::now() + std::chrono::seconds(5);
        while (!c.waitedFor() && Clock::now() < until)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        after = c.waitedFor() ? 1 : 0;
        return Status::ok();
      },
      "test");
  auto until = Clock::now() + std::chrono::seconds(5);
  while (before < 0 && Clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  double seconds = 0;
  EXPECT_TRUE(q.wait(t, seconds));
  EXPECT_EQ(before, 0); // running, nobody waiting yet
  EXPECT_EQ(after, 1);  // the wait made it urgent
  EXPECT_TRUE(c.waitedFor());
}

TEST(Collectives, MeshPlansNeedAMatchingCommunicator) {
  Program p = meshProgram(2);
  auto none = cpu::Executor::create(p, nullptr, 1);
  ASSERT_FALSE(none);
  EXPECT_NE(none.status().message().find("mesh of 2 devices"),
            std::string::npos);
  auto comms = comm::makeInProcessCommunicators(4);
  cpu::ExecutorOptions o;
  o.communicator = comms[1].get();
  auto wrong = cpu::Executor::create(p, nullptr, o);
  ASSERT_FALSE(wrong);
  EXPECT_NE(
      wrong.status().message().find("compiled for a mesh of 2 devices but the "
                                    "in-process communicator has 4 ranks"),
      std::string::npos)
      << wrong.status().message();
}

TEST(Collectives, ADeterministicPlanSetsTheTreeOrder) {
  // deterministic = "devices" (docs/parallel.md): the executor puts the
  // communicator in the fixed pairwise-tree order; a plain plan leaves the
  // member order.
  for (bool deterministic : {false, true}) {
    Program p = meshProgram(2);
    p.deterministic = deterministic;
    auto comms = comm::makeInProcessCommunicators(2);
    for (int d = 0; d < 2; ++d) {
      auto e = executor(p, comms[size_t(d)].get());
      ASSERT_TRUE(e);
      EXPECT_EQ(comms[size_t(d)]->sumOrder(),
                deterministic ? comm::SumOrder::Tree : comm::SumOrder::Members);
    }
  }
}

TEST(Collectives, ThreadSharesNeverOversubscribeMuch) {
  EXPECT_EQ(cpu::Executor::threadShare(2, 4, 0), 1);
  EXPECT_EQ(cpu::Executor::threadShare(2, 4, 3), 1);
  EXPECT_EQ(cpu::Executor::threadShare(8, 3, 0), 3);
  EXPECT_EQ(cpu::Executor::threadShare(8, 3, 1), 3);
  EXPECT_EQ(cpu::Executor::threadShare(8, 3, 2), 2);
  EXPECT_EQ(cpu::Executor::threadShare(16, 4, 2), 4);
}

TEST(Collectives, GroupsFollowTheMeshAxis) {
  Mesh m;
  m.axes = {{"dp", 2}, {"tp", 2}}; // device = 2 * dp + tp
  Collective c;
  c.axis = "dp";
  EXPECT_EQ(collectiveGroup(m, c, 0), (comm::Group{0, 2}));
  EXPECT_EQ(collectiveGroup(m, c, 3), (comm::Group{1, 3}));
  c.axis = "tp";
  EXPECT_EQ(collectiveGroup(m, c, 3), (comm::Group{2, 3}));
  c.axis.clear();
  c.group = {3, 1};
  EXPECT_EQ(collectiveGroup(m, c, 1), (comm::Group{3, 1}));
  Mesh line;
  line.axes = {{"dp", 4}};
  c.group.clear();
  c.axis = "dp";
  EXPECT_TRUE(
      collectiveGroup(line, c, 2).empty()); // everyone: the default group
  // The subgroups a program needs prepared: dp over 2 x 2 gives {0,2}, {1,3}.
  Program p = meshProgram(4);
  EXPECT_TRUE(collectiveGroups(p).empty());
  p.mesh = m;
  EXPECT_EQ(collectiveGroups(p), (std::vector<comm::Group>{{0, 2}, {1, 3}}));
  p.functions[0].steps[0].collective.axis = "tp";
  EXPECT_EQ(collectiveGroups(p),
            (std::vector<comm::Group>{{0, 1}, {0, 2}, {1, 3}, {2, 3}}));
}

/// Runs the handshake on n ranks; rank r uses programs[r] and hashes[r].
std::vector<std::string> handshake(const std::vector<Program> &programs,
                                   const std::vector<std::string> &hashes) {
  int n = int(programs.size());
  auto comms = comm::makeInProcessCommunicators(n);
  std::vector<std::string> out(static_cast<size_t>(n));
  onThreads(n, [&](int r) {
    comms[size_t(r)]->setTimeout(10);
    out[size_t(r)] = checkSameProgram(*comms[size_t(r)], programs[size_t(r)],
                                      hashes[size_t(r)])
                         .message();
  });
  return out;
}

TEST(Handshake, RefusesAnotherArtifactOrCollectiveSequence) {
  Program p = meshProgram(2);
  EXPECT_EQ(collectiveCount(p), 3);
  EXPECT_NE(collectiveSequence(p).find(
                "@train_step 0: all_reduce axis=dp f32 sum 32 bytes"),
            std::string::npos)
      << collectiveSequence(p);
  std::string h = contentHash("model bytes", 11);
  EXPECT_EQ(h.size(), 16u);
  for (const std::string &m : handshake({p, p}, {h, h}))
    EXPECT_EQ(m, "");

  for (const std::string &m :
       handshake({p, p}, {h, contentHash("other bytes", 11)})) {
    EXPECT_NE(m.find("rank 1 loaded a different artifact than rank 0"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("recompile with the same kilnc and model file"),
              std::string::npos)
        << m;
  }

  Program q = p; // the same file name and hash, another collective order
  std::swap(q.functions[0].steps[3].collective.reduction,
            q.functions[0].steps[0].collective.reduction);
  EXPECT_NE(collectiveDigest(p), collectiveDigest(q));
  for (const std::string &m : handshake({p, q}, {h, h})) {
    EXPECT_NE(
        m.find(
            "the compiled collective sequence of rank 1 differs from rank 0's"),
        std::string::npos)
        << m;
    EXPECT_NE(m.find("recompile"), std::string::npos) << m;
    EXPECT_NE(
        m.find(
            "the first difference is collective 0: rank 0 runs '@train_step 0: "
            "all_reduce axis=dp f32 sum 32 bytes peer=-1 send=0 recv=0 "
            "queue=1', rank "
            "1 '@train_step 0: all_reduce axis=dp f32 mean 32 bytes"),
        std::string::npos)
        << m;
  }
  // Rank 2 of 3 has one collective fewer (the sequences are compared before
  // the mesh's size): the first difference is where its sequence ends.
  Program p3 = meshProgram(2);
  Program shorter = p3;
  shorter.functions[0].steps.pop_back();
  for (const std::string &m : handshake({p3, p3, shorter}, {h, h, h})) {
    EXPECT_NE(m.find("of rank 2 differs from rank 0's (2 collectives"),
              std::string::npos)
        << m;
    EXPECT_NE(
        m.find(
            "the first difference is collective 2: rank 0 runs '@train_step 4: "
            "all_gather axis=dp f32 none 16 bytes"),
        std::string::npos)
        << m;
    EXPECT_NE(m.find("rank 2 'no such collective'"), std::string::npos) << m;
  }

  // A program for 2 devices run by 4 ranks.
  Program p4 = meshProgram(2);
  for (const std::string &m : handshake({p4, p4, p4, p4}, {h, h, h, h}))
    EXPECT_NE(
        m.find("compiled for a mesh of 2 devices but the run has 4 ranks"),
        std::string::npos)
        << m;
}

/// A CUDA device whose memory is host memory and whose streams are
/// synchronous: enough for the CUDA executor on kernel-free programs.
class HostDevice : public cuda::Device {
public:
  std::string describe() const override { return "host test device"; }
  bool emulated() const override { return true; }
  Expected<cuda::DevicePtr> alloc(size_t bytes) override {
    void *p = std::calloc(bytes, 1);
    return cuda::DevicePtr(uintptr_t(p));
  }
  void release(cuda::DevicePtr p) override {
    std::free(reinterpret_cast<void *>(uintptr_t(p)));
  }
  Expected<void *> allocHost(size_t bytes) override {
    return std::calloc(bytes, 1);
  }
  void releaseHost(void *p) override { std::free(p); }
  Status upload(cuda::DevicePtr dst, const void *src, size_t n,
                cuda::Stream) override {
    std::memcpy(reinterpret_cast<void *>(uintptr_t(dst)), src, n);
    return Status::ok();
  }
  Status download(void *dst, cuda::DevicePtr src, size_t n,
                  cuda::Stream) override {
    std::memcpy(dst, reinterpret_cast<void *>(uintptr_t(src)), n);
    return Status::ok();
  }
  Status copy(cuda::DevicePtr dst, cuda::DevicePtr src, size_t n,
              cuda::Stream) override {
    std::memmove(reinterpret_cast<void *>(uintptr_t(dst)),
                 reinterpret_cast<void *>(uintptr_t(src)), n);
    return Status::ok();
  }
  Status fill(cuda::DevicePtr dst, uint8_t v, size_t n, cuda::Stream) override {
    std::memset(reinterpret_cast<void *>(uintptr_t(dst)), v, n);
    return Status::ok();
  }
  Status loadKernels(const Package &) override { return Status::ok(); }
  Expected<int> function(const std::string &name) override {
    return Status::error("no kernel " + name);
  }
  Status launch(int, const gpu::Launch &, void **, cuda::Stream) override {
    return Status::error("no kernels");
  }
  Status gemm(const GemmParams &, cuda::DevicePtr, cuda::DevicePtr,
              cuda::DevicePtr, cuda::Stream, const Epilogue *) override {
    return Status::error("no GEMMs");
  }
  Expected<int> createEvent() override { return events_++; }
  Status record(int, cuda::Stream) override { return Status::ok(); }
  Status wait(cuda::Stream, int) override { return Status::ok(); }
  Status synchronize(int) override { return Status::ok(); }
  Expected<float> elapsed(int, int) override { return 0.5f; }
  Status synchronize() override {
    synchronized++;
    return Status::ok();
  }
  int synchronized = 0;

private:
  int events_ = 0;
};

// The CUDA executor runs collective steps in order through a communicator
// with pointers into its own device's arena: the same bits as the CPU's.
TEST(CudaExecutor, RunsCollectivesThroughACommunicator) {
  int n = 2;
  Package pkg;
  pkg.path = "mesh.kpack";
  pkg.program = meshProgram(n);
  pkg.hasCuda = true;
  auto comms = comm::makeInProcessCommunicators(n);
  std::mt19937 rng(99);
  std::vector<std::vector<float>> g = {randomVector(rng, kN),
                                       randomVector(rng, kN)};
  std::vector<float> sum(kN);
  for (int64_t e = 0; e < kN; ++e)
    sum[size_t(e)] = g[0][size_t(e)] + g[1][size_t(e)];
  std::vector<std::vector<float>> c(2), gathered(2);
  std::vector<std::string> errors(2);
  onThreads(n, [&](int d) {
    auto dev = std::make_unique<HostDevice>();
    cuda::ExecutorOptions o;
    o.communicator = comms[size_t(d)].get();
    auto e = cuda::Executor::create(pkg, std::move(dev), o);
    if (!e) {
      errors[size_t(d)] = e.status().message();
      return;
    }
    ASSERT_TRUE((*e)->write(0, g[size_t(d)].data(), kN * 4));
    Status s = (*e)->run("train_step");
    errors[size_t(d)] = s.message();
    c[size_t(d)] = *(*e)->readAll<float>(3);
    gathered[size_t(d)] = *(*e)->readAll<float>(2);
  });
  for (int d = 0; d < n; ++d) {
    ASSERT_EQ(errors[size_t(d)], "") << "device " << d;
    EXPECT_TRUE(sameBits(c[size_t(d)], sum)) << "device " << d;
    std::vector<float> mean(kN);
    for (int64_t e = 0; e < kN; ++e)
      mean[size_t(e)] = (sum[size_t(e)] + sum[size_t(e)]) / 2.0f;
    EXPECT_TRUE(sameBits(gathered[size_t(d)], mean)) << "device " << d;
  }
  // Without a communicator the plan is refused at creation, as before.
  auto none = cuda::Executor::create(pkg, std::make_unique<HostDevice>());
  ASSERT_FALSE(none);
  EXPECT_NE(none.status().message().find("mesh of 2 devices"),
            std::string::npos);
}

// Pipeline stages on the CUDA executor (PipelineProgram.h over ["pp", 2,
// "dp", 2]): each device runs its stage's steps only, the transfer reaches
// the stage-1 device of its dp coordinate, the broadcast every device, and
// another stage's buffers (sharing bytes with this stage's) are untouched
// and refused.
TEST(CudaExecutor, RunsOnlyItsPipelineStage) {
  namespace pl = kiln::test::pipeline;
  Package pkg;
  pkg.path = "pp.kpack";
  pkg.program = pl::pipelineProgram(2);
  pkg.hasCuda = true;
  int n = 4;
  auto comms = comm::makeInProcessCommunicators(n);
  std::vector<std::string> errors(4), foreign(4);
  std::vector<std::vector<float>> out(4), mine(4);
  auto filled = [](float base) {
    std::vector<float> v(pl::kN);
    for (int64_t i = 0; i < pl::kN; ++i)
      v[size_t(i)] = base + float(i);
    return v;
  };
  onThreads(n, [&](int d) {
    comms[size_t(d)]->setTimeout(20);
    cuda::ExecutorOptions o;
    o.communicator = comms[size_t(d)].get();
    auto e = cuda::Executor::create(pkg, std::make_unique<HostDevice>(), o);
    if (!e) {
      errors[size_t(d)] = e.status().message();
      comms[size_t(d)]->abort("no executor");
      return;
    }
    int stage = pkg.program.stageOf(d);
    Status s = stage == 0 ? (*e)->write(pl::S0, filled(-70).data(), pl::kN * 4)
                          : (*e)->write(pl::W1, filled(50).data(), pl::kN * 4);
    if (s)
      s = (*e)->write(pl::X, filled(float(100 * d)).data(), pl::kN * 4);
    if (s)
      s = (*e)->run("train_step");
    if (!s) {
      errors[size_t(d)] = s.message();
      return;
    }
    out[size_t(d)] = *(*e)->readAll<float>(pl::Out);
    mine[size_t(d)] = *(*e)->readAll<float>(stage == 0 ? pl::S0 : pl::D1);
    auto other = (*e)->readAll<float>(stage == 0 ? pl::C1 : pl::A0);
    foreign[size_t(d)] = other ? "" : other.status().message();
  });
  for (int d = 0; d < n; ++d) {
    ASSERT_EQ(errors[size_t(d)], "") << "device " << d;
    EXPECT_EQ(out[size_t(d)], filled(float(100 * (d % 2)))) << "device " << d;
    EXPECT_EQ(mine[size_t(d)], d < 2 ? filled(-70) : filled(50))
        << "device " << d;
    EXPECT_NE(foreign[size_t(d)].find("cannot read buffer"), std::string::npos)
        << "device " << d << ": " << foreign[size_t(d)];
  }
}

/// A host device that claims native streams (so the executor orders
/// collectives through StreamOrdering instead of host synchronization).
class StreamedHostDevice : public HostDevice {
public:
  void *nativeStream(cuda::Stream) override { return this; }
};

/// Logs the collective calls (forwarding them) and the stream orderings.
class LoggingCommunicator : public GatedCommunicator,
                            public cuda::StreamOrdering {
public:
  LoggingCommunicator(comm::Communicator &inner, std::vector<std::string> &log)
      : GatedCommunicator(inner, [] { return true; }), log_(log) {}
  Status allReduce(const void *a, void *b, int64_t n, ElementType t,
                   comm::Reduction r, const comm::Group &g) override {
    log_.push_back("all_reduce");
    return GatedCommunicator::allReduce(a, b, n, t, r, g);
  }
  Status reduceScatter(const void *a, void *b, int64_t n, ElementType t,
                       comm::Reduction r, const comm::Group &g) override {
    log_.push_back("reduce_scatter");
    return GatedCommunicator::reduceScatter(a, b, n, t, r, g);
  }
  Status allGather(const void *a, void *b, int64_t n, ElementType t,
                   const comm::Group &g) override {
    log_.push_back("all_gather");
    return GatedCommunicator::allGather(a, b, n, t, g);
  }
  Status setComputeStream(void *) override {
    log_.push_back("set compute stream");
    return Status::ok();
  }
  Status computeWaits() override {
    log_.push_back("compute waits");
    return Status::ok();
  }
  Status synchronize() override {
    log_.push_back("synchronize");
    return Status::ok();
  }

private:
  std::vector<std::string> &log_;
};

// With stream ordering, the host never waits for a collective: queue-0
// collectives are followed by a device-side wait, the queue-1 all_reduce
// only where step 2 depends on it; read() polls the deadline first.
TEST(CudaExecutor, OrdersCollectivesOnStreams) {
  int n = 2;
  Package pkg;
  pkg.path = "mesh.kpack";
  pkg.program = meshProgram(n);
  pkg.hasCuda = true;
  auto comms = comm::makeInProcessCommunicators(n);
  std::vector<std::vector<std::string>> logs(2);
  std::vector<std::vector<float>> gathered(2);
  onThreads(n, [&](int d) {
    LoggingCommunicator c(*comms[size_t(d)], logs[size_t(d)]);
    cuda::ExecutorOptions o;
    o.communicator = &c;
    o.streams = &c;
    auto e =
        cuda::Executor::create(pkg, std::make_unique<StreamedHostDevice>(), o);
    ASSERT_TRUE(e.isOk()) << e.status().message();
    std::vector<float> g(kN, 1.5f + float(d));
    ASSERT_TRUE((*e)->write(0, g.data(), kN * 4));
    ASSERT_TRUE((*e)->run("train_step"));
    gathered[size_t(d)] = *(*e)->readAll<float>(2);
  });
  for (int d = 0; d < n; ++d) {
    EXPECT_EQ(logs[size_t(d)],
              (std::vector<std::string>{"set compute stream", "all_reduce",
                                        "compute waits", "reduce_scatter",
                                        "compute waits", "all_gather",
                                        "compute waits", "synchronize"}))
        << "device " << d;
    // sum = 1.5 + 2.5 = 4; reduce_scatter(mean) of the summed g: (4 + 4) / 2.
    EXPECT_EQ(gathered[size_t(d)], std::vector<float>(kN, 4.0f))
        << "device " << d;
  }
}

/// Records what the loop asks for, with asynchronous queues.
class AsyncHooks : public StepHooks {
public:
  std::vector<std::string> calls;
  std::string failWait; ///< waitAsync's error, if not empty
  Status runKernel(int k, const std::vector<int> &) override {
    calls.push_back("kernel " + std::to_string(k));
    return Status::ok();
  }
  Status runGemm(const Step &, bool) override { return Status::ok(); }
  Status runCopy(const Step &s) override {
    calls.push_back(fmt::format("copy {}->{}", s.args[0], s.args[1]));
    return Status::ok();
  }
  Status runCollective(const Step &s) override {
    calls.push_back(std::string("run ") + collectiveOpName(s.collective.op));
    return Status::ok();
  }
  bool concurrentQueues() const override { return true; }
  Status startAsync(const Function &, const Step &, size_t i) override {
    calls.push_back("start " + std::to_string(i));
    return Status::ok();
  }
  Status waitAsync(size_t i, double &seconds) override {
    calls.push_back("wait " + std::to_string(i));
    seconds = 0.25;
    if (!failWait.empty())
      return Status::error(failWait);
    return Status::ok();
  }
  const char *gemmName() const override { return "gemm (test)"; }
  Status beginTimed() override { return Status::ok(); }
  Expected<double> endTimed() override { return 0.125; }
};

TEST(StepLoopQueues, StartsWaitsOnlyWhereNeededAndDrains) {
  Program p = meshProgram(2);
  AsyncHooks hooks;
  StepProfile profile;
  ASSERT_TRUE(runSteps(p, p.functions[0], 0, SIZE_MAX, hooks, &profile));
  EXPECT_EQ(hooks.calls, (std::vector<std::string>{
                             "start 0", "copy 4->5", "wait 0", "copy 0->3",
                             "run reduce_scatter", "run all_gather"}));
  // The async all_reduce: 0.25 s run, 0.125 s waited; the synchronous
  // ones: 0.125 s each, all of it exposed.
  EXPECT_DOUBLE_EQ(profile.collectiveSeconds(), 0.25 + 2 * 0.125);
  EXPECT_DOUBLE_EQ(profile.exposedCollectiveSeconds(), 3 * 0.125);
  // A range that ends before anything waits still finishes what it started.
  hooks.calls.clear();
  ASSERT_TRUE(runSteps(p, p.functions[0], 0, 2, hooks, nullptr));
  EXPECT_EQ(hooks.calls,
            (std::vector<std::string>{"start 0", "copy 4->5", "wait 0"}));
  // An asynchronous error surfaces at the wait with the step's location.
  hooks.calls.clear();
  hooks.failWait = "rank 1 did not arrive";
  Status s = runSteps(p, p.functions[0], 0, SIZE_MAX, hooks, nullptr);
  ASSERT_FALSE(s);
  EXPECT_EQ(
      s.message(),
      "@train_step step 0 (all_reduce on queue 1 at m.kiln:9:3): rank 1 did "
      "not arrive (surfaced when step 2 waited for it)");
  EXPECT_EQ(hooks.calls,
            (std::vector<std::string>{"start 0", "copy 4->5", "wait 0"}));
}

} // namespace
