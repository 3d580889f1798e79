//===- TraceFileTest.cpp - The trace file's rendering, window and gathering --===//
//
// What lit cannot reach: spans placed by hand (a neighbour overlapping by
// clock noise, a child leaking out of its parent, gaps) rendered and read
// back as JSON; the step window's defaults; the gathering of two ranks'
// events with their clock offsets, through in-process communicators.
//
//===----------------------------------------------------------------------===//
#include "test/unit/train/TraceFixtures.h"
#include "runtime/train/TraceFile.h"
#include "runtime/train/Devices.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <thread>

using namespace kiln;
using nlohmann::json;

namespace {

using tracetest::oneKernel;

Span span(Span::Kind kind, double startUs, double durUs, int kernel = -1) {
  Span s;
  s.kind = kind;
  s.name = kind == Span::Step ? "step 4" : kind == Span::DataWait ? "data wait" : "k";
  s.start = startUs * 1e-6;
  s.seconds = durUs * 1e-6;
  s.step = 4;
  if (kernel >= 0) {
    s.kernel = kernel;
    s.planStep = 0;
    s.function = "train_step";
    s.flops = 1000;
    s.bytes = 4096;
  }
  return s;
}

json events(const std::string &text) { return json::parse("[" + text + "]"); }

/// A collective (or the wait for one) of plan step `plan` of `function`,
/// on queue 1.
Span collective(Span::Kind kind, double startUs, double durUs, int plan,
                const char *name = "all_reduce", const char *function = "train_step") {
  Span s = span(kind, startUs, durUs);
  s.name = name;
  s.queue = 1;
  s.function = function;
  s.planStep = plan;
  s.bytes = 1024;
  return s;
}

} // namespace

TEST(TraceFile, ParsesTheStepWindow) {
  auto w = train::parseTraceSteps("10:20");
  ASSERT_TRUE(w) << w.status().message();
  EXPECT_EQ(w->first, 10);
  EXPECT_EQ(w->second, 20);
  for (const char *bad : {"5:3", "3:3", "a:b", "5", "-1:3", "1:", ":4", "1:2x"}) {
    auto e = train::parseTraceSteps(bad);
    ASSERT_FALSE(e) << bad;
    EXPECT_NE(e.status().message().find("--trace-steps needs A:B"), std::string::npos) << bad;
  }
}

TEST(TraceFile, DefaultWindowIsTenStepsAfterTwoWarmUpClippedToTheRun) {
  using W = std::pair<int64_t, int64_t>;
  EXPECT_EQ(train::traceWindow(-1, -1, 0, 100), W(2, 12));
  EXPECT_EQ(train::traceWindow(-1, -1, 50, 100), W(52, 62)); // a resumed run
  EXPECT_EQ(train::traceWindow(-1, -1, 0, 5), W(2, 5));
  EXPECT_EQ(train::traceWindow(-1, -1, 0, 2), W(0, 2)); // too short to warm up
  EXPECT_EQ(train::traceWindow(10, 20, 0, 15), W(10, 15));
  EXPECT_EQ(train::traceWindow(30, 40, 0, 15), W(15, 15)); // nothing traced
  EXPECT_EQ(train::traceWindow(0, 5, 3, 10), W(3, 5));
}

TEST(TraceFile, SlicesNestAndGapsBecomeIdle) {
  program::Program p = oneKernel();
  Tracer t;
  t.setEnabled(true);
  // Step 4 from 0 to 1000 us; its data wait 0..50 us; kernels at 100..300
  // and from 299.999 us (1 ns before the first ends: clock noise) to 500;
  // a gap to 900, a last kernel 900..1000.
  t.add(span(Span::Step, 0, 1000));
  t.add(span(Span::DataWait, 0, 50));
  t.add(span(Span::Kernel, 100, 200, 0));
  t.add(span(Span::Kernel, 299.999, 200.001, 0));
  t.add(span(Span::Kernel, 900, 100, 0));
  train::TraceSource src;
  src.tracer = &t;
  src.program = &p;
  src.process = "rank 0 · test";
  json ev = events(train::renderTraceEvents(src));

  std::map<std::string, std::string> threadNames;
  std::vector<json> kernels, idle;
  bool process = false;
  for (const json &e : ev) {
    if (e["ph"] == "M" && e["name"] == "thread_name")
      threadNames[std::to_string(e["tid"].get<int>())] = e["args"]["name"];
    if (e["ph"] == "M" && e["name"] == "process_name")
      process = e["args"]["name"] == "rank 0 · test";
    if (e["ph"] == "X" && e["cat"] == "kernel")
      kernels.push_back(e);
    if (e["ph"] == "X" && e["cat"] == "idle")
      idle.push_back(e);
  }
  EXPECT_TRUE(process);
  // pid = rank + 1, tid = pid * 1000 + track (never 0: special to Perfetto).
  EXPECT_EQ(threadNames["1001"], "trainer");
  EXPECT_EQ(threadNames["1002"], "compute (queue 0)");
  ASSERT_EQ(kernels.size(), 3u);
  // Named by the first model line and the main op, with every line and op.
  EXPECT_EQ(kernels[0]["name"], "m.kiln:7 softmax");
  EXPECT_EQ(kernels[0]["args"]["lines"].size(), 2u);
  EXPECT_EQ(kernels[0]["args"]["ops"], json({"exp", "softmax"}));
  EXPECT_EQ(kernels[0]["args"]["symbol"], "k0_fused2_softmax_L7");
  // 1000 flops in 200 us: 0.005 GFLOP/s.
  EXPECT_NEAR(kernels[0]["args"]["GFLOP/s"].get<double>(), 0.005, 1e-9);
  // The neighbour overlapping by noise starts where the first ends (in the
  // file's nanosecond digits).
  double end0 = kernels[0]["ts"].get<double>() + kernels[0]["dur"].get<double>();
  EXPECT_NEAR(kernels[1]["ts"].get<double>(), end0, 1e-9);
  EXPECT_NEAR(kernels[1]["ts"].get<double>() + kernels[1]["dur"].get<double>(), 500.0, 1e-9);
  // Idle: 0..100 (before the first kernel) and 500..900, not the 1 ns.
  ASSERT_EQ(idle.size(), 2u);
  EXPECT_NEAR(idle[0]["ts"].get<double>(), 0.0, 1e-9);
  EXPECT_NEAR(idle[0]["dur"].get<double>(), 100.0, 1e-9);
  EXPECT_NEAR(idle[1]["ts"].get<double>(), 500.0, 1e-9);
  EXPECT_NEAR(idle[1]["dur"].get<double>(), 400.0, 1e-9);
  EXPECT_EQ(idle[1]["args"]["microseconds"].get<double>(), 400.0);
}

TEST(TraceFile, AChildLeakingOutOfItsParentIsClipped) {
  Tracer t;
  t.setEnabled(true);
  t.add(span(Span::Step, 0, 1000));
  // A data wait of the step ending 0.4 ns after it (mostly inside: a child).
  t.add(span(Span::DataWait, 10, 990.0004));
  train::TraceSource src;
  src.tracer = &t;
  json ev = events(train::renderTraceEvents(src));
  for (const json &e : ev) {
    if (e["ph"] == "X" && e["cat"] == "data wait") {
      EXPECT_NEAR(e["ts"].get<double>() + e["dur"].get<double>(), 1000.0, 1e-9);
    }
  }
}

TEST(TraceFile, AnAsynchronousCollectiveEndsByTheWaitForIt) {
  // Recorded as started at 100 us for 50 us, but queue 0's wait for it
  // ended at 130 us (the loop's thread was late to note the start): it
  // ran 80..130. A collective within its wait stays where it was.
  Tracer t;
  t.setEnabled(true);
  t.add(span(Span::Step, 0, 1000));
  auto coll = [&](double start, double dur, int plan) {
    return collective(Span::Collective, start, dur, plan);
  };
  t.add(coll(100, 50, 3));
  Span w = coll(120, 10, 3);
  w.kind = Span::CollectiveWait;
  w.queue = 1;
  t.add(w);
  t.add(coll(300, 20, 5));
  Span w2 = coll(310, 40, 5);
  w2.kind = Span::CollectiveWait;
  t.add(w2);
  train::TraceSource src;
  src.tracer = &t;
  std::vector<std::pair<double, double>> runs;
  for (const json &e : events(train::renderTraceEvents(src)))
    if (e["ph"] == "X" && e["cat"] == "collective")
      runs.emplace_back(e["ts"].get<double>(), e["dur"].get<double>());
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_NEAR(runs[0].first, 80.0, 1e-9);
  EXPECT_NEAR(runs[0].second, 50.0, 1e-9);
  EXPECT_NEAR(runs[1].first, 300.0, 1e-9);
  EXPECT_NEAR(runs[1].second, 20.0, 1e-9);
}

TEST(TraceFile, QueuedCollectivesFollowEachOtherAndWaitsStayOnCompute) {
  // Two buckets handed to queue 1 at 100 and 110 us; the first ran 100..160,
  // the second (40 us) only after it, 160..200; the waits for them (and
  // for a pipeline's receive, whose wait names queue 1) are queue 0's.
  Tracer t;
  t.setEnabled(true);
  t.add(span(Span::Step, 0, 1000));
  auto coll = [&](Span::Kind kind, double start, double dur, int plan, const char *name) {
    return collective(kind, start, dur, plan, name);
  };
  t.add(coll(Span::Collective, 100, 60, 3, "all_reduce"));
  t.add(coll(Span::Collective, 110, 40, 4, "all_reduce"));
  t.add(coll(Span::CollectiveWait, 150, 10, 3, "all_reduce"));
  t.add(coll(Span::CollectiveWait, 190, 15, 4, "all_reduce"));
  t.add(coll(Span::Collective, 400, 30, 7, "recv"));
  t.add(coll(Span::CollectiveWait, 410, 25, 7, "recv"));
  train::TraceSource src;
  src.tracer = &t;
  std::vector<std::pair<double, double>> runs;
  std::map<int, std::string> tracks;
  json all = events(train::renderTraceEvents(src));
  for (const json &e : all)
    if (e["ph"] == "M" && e["name"] == "thread_name")
      tracks[e["tid"].get<int>()] = e["args"]["name"].get<std::string>();
  for (const json &e : all) {
    if (e["ph"] != "X")
      continue;
    if (e["cat"] == "collective") {
      runs.emplace_back(e["ts"].get<double>(), e["dur"].get<double>());
      EXPECT_EQ(tracks[e["tid"].get<int>()], "communication (queue 1)");
    }
    if (e["cat"] == "collective wait") {
      EXPECT_EQ(tracks[e["tid"].get<int>()], "compute (queue 0)") << e["name"];
    }
  }
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_NEAR(runs[0].first, 100.0, 1e-9);
  EXPECT_NEAR(runs[0].second, 60.0, 1e-9);
  EXPECT_NEAR(runs[1].first, 160.0, 1e-9); // not 110: behind the first
  EXPECT_NEAR(runs[1].second, 40.0, 1e-9);
  EXPECT_NEAR(runs[2].first, 400.0, 1e-9);
}

TEST(TraceFile, RepeatedCallsOfAPlanStepMatchTheirOwnWaits) {
  // @eval_step run twice in one step: its all_reduce (plan step 3) twice,
  // each ending by its own wait (130 us, then 400 us).
  Tracer t;
  t.setEnabled(true);
  t.add(span(Span::Step, 0, 1000));
  auto coll = [&](Span::Kind kind, double start, double dur) {
    return collective(kind, start, dur, 3, "all_reduce", "eval_step");
  };
  t.add(coll(Span::Collective, 100, 50));
  t.add(coll(Span::CollectiveWait, 120, 10));
  t.add(coll(Span::Collective, 300, 50));
  t.add(coll(Span::CollectiveWait, 310, 90));
  train::TraceSource src;
  src.tracer = &t;
  std::vector<double> starts;
  for (const json &e : events(train::renderTraceEvents(src)))
    if (e["ph"] == "X" && e["cat"] == "collective")
      starts.push_back(e["ts"].get<double>());
  ASSERT_EQ(starts.size(), 2u);
  EXPECT_NEAR(starts[0], 80.0, 1e-9); // by the first wait, not the last
  EXPECT_NEAR(starts[1], 300.0, 1e-9);
}

TEST(TraceFile, WritesTheJsonObjectFormat) {
  Tracer t;
  t.setEnabled(true);
  t.add(span(Span::Step, 0, 10));
  train::TraceSource src;
  src.tracer = &t;
  std::string path = ::testing::TempDir() + "kiln-trace-test.json";
  ASSERT_TRUE(train::writeTraceFile(path, {train::renderTraceEvents(src), ""},
                                    {{"steps", "[4,5]"}, {"model", "\"m\""}}));
  std::ifstream in(path);
  json doc = json::parse(std::string(std::istreambuf_iterator<char>(in), {}));
  EXPECT_EQ(doc["displayTimeUnit"], "ms");
  EXPECT_EQ(doc["otherData"]["steps"], json({4, 5}));
  EXPECT_GT(doc["traceEvents"].size(), 3u);
  std::remove(path.c_str());
  // An unwritable place is an error naming the flag.
  Status s = train::checkTraceFile("/nonexistent-dir/t.json");
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("--trace /nonexistent-dir/t.json"), std::string::npos);
}

TEST(TraceFile, GathersRanksWithTheirClockOffsets) {
  auto comms = train::makeInProcessCommunicators(2, 30);
  ASSERT_TRUE(comms) << comms.status().message();
  Tracer t0;
  std::this_thread::sleep_for(std::chrono::milliseconds(2)); // origins apart
  Tracer t1;
  for (Tracer *t : {&t0, &t1}) {
    t->setEnabled(true);
    t->add(span(Span::Step, 100, 10));
  }
  // Rank 1's span starts (origin1 - origin0) later on the common clock.
  double offsetUs = double(train::originNanos(t1) - train::originNanos(t0)) / 1e3;
  ASSERT_GT(offsetUs, 0);
  std::vector<std::string> got[2];
  Status st[2] = {Status::ok(), Status::ok()};
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      train::TraceSource src;
      src.tracer = r == 0 ? &t0 : &t1;
      src.pid = r;
      src.process = "rank " + std::to_string(r);
      auto g = train::gatherTrace(*(*comms)[size_t(r)], src);
      if (!g)
        st[r] = g.status();
      else
        got[r] = *g;
    });
  for (auto &th : threads)
    th.join();
  ASSERT_TRUE(st[0]) << st[0].message();
  ASSERT_TRUE(st[1]) << st[1].message();
  ASSERT_EQ(got[0].size(), 2u);
  EXPECT_TRUE(got[1].empty());
  double ts[2];
  for (int r = 0; r < 2; ++r)
    for (const json &e : events(got[0][size_t(r)]))
      if (e["ph"] == "X" && e["cat"] == "step") {
        EXPECT_EQ(e["pid"], r + 1);
        ts[r] = e["ts"];
      }
  EXPECT_NEAR(ts[0], 100.0, 1e-9);
  EXPECT_NEAR(ts[1], 100.0 + offsetUs, 2e-3); // the file's nanosecond rounding
}
