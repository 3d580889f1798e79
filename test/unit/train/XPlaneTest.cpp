//===- XPlaneTest.cpp - The TensorBoard profile's XSpace encoding ---------===//
//
// Spans placed by hand, rendered as an XSpace and decoded again with a
// protobuf wire reader written here from xplane.proto's field numbers:
// the plane and its lines, each event's name, offset and duration in
// picoseconds, its stats with their types; the run's name and the files.
// test/tools/tensorboard-profile.test reads real runs through TensorBoard.
//
//===----------------------------------------------------------------------===//
#include "test/unit/train/TraceFixtures.h"
#include "runtime/train/XPlane.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <variant>

using namespace kiln;

namespace {

/// One decoded field: a varint, a fixed64 or a length-delimited payload.
struct Field {
  uint32_t number = 0;
  uint64_t varint = 0;
  uint64_t fixed64 = 0;
  std::string bytes;
};

uint64_t readVarint(const std::string &s, size_t &at) {
  uint64_t v = 0;
  for (int shift = 0; at < s.size(); shift += 7) {
    unsigned char c = static_cast<unsigned char>(s[at++]);
    v |= uint64_t(c & 0x7F) << shift;
    if (!(c & 0x80))
      return v;
  }
  ADD_FAILURE() << "truncated varint";
  return v;
}

std::vector<Field> decode(const std::string &s) {
  std::vector<Field> out;
  size_t at = 0;
  while (at < s.size()) {
    uint64_t key = readVarint(s, at);
    Field f;
    f.number = uint32_t(key >> 3);
    switch (key & 7) {
    case 0:
      f.varint = readVarint(s, at);
      break;
    case 1:
      std::memcpy(&f.fixed64, s.data() + at, 8);
      at += 8;
      break;
    case 2: {
      uint64_t n = readVarint(s, at);
      f.bytes = s.substr(at, n);
      at += n;
      break;
    }
    default:
      ADD_FAILURE() << "unexpected wire type " << (key & 7);
      return out;
    }
    out.push_back(std::move(f));
  }
  return out;
}

std::vector<Field> all(const std::vector<Field> &fs, uint32_t number) {
  std::vector<Field> out;
  for (const Field &f : fs)
    if (f.number == number)
      out.push_back(f);
  return out;
}

const Field *one(const std::vector<Field> &fs, uint32_t number) {
  for (const Field &f : fs)
    if (f.number == number)
      return &f;
  return nullptr;
}

/// map<int64, X*Metadata> entries -> id: name.
std::map<int64_t, std::string> metadata(const std::vector<Field> &plane, uint32_t number) {
  std::map<int64_t, std::string> out;
  for (const Field &entry : all(plane, number)) {
    std::vector<Field> e = decode(entry.bytes);
    std::vector<Field> meta = decode(one(e, 2)->bytes);
    EXPECT_EQ(int64_t(one(e, 1)->varint), int64_t(one(meta, 1)->varint));
    out[int64_t(one(e, 1)->varint)] = one(meta, 2)->bytes;
  }
  return out;
}

using StatValue = std::variant<int64_t, double, std::string>;

struct Event {
  std::string name;
  int64_t offsetPs = 0, durationPs = 0;
  std::map<std::string, StatValue> stats;
};

struct Line {
  int64_t id = 0;
  std::string name, displayName;
  int64_t timestampNs = -1;
  std::vector<Event> events;
};

std::vector<Line> linesOf(const std::string &space, std::string &planeName,
                          std::vector<std::string> &hostnames) {
  std::vector<Field> s = decode(space);
  for (const Field &h : all(s, 4))
    hostnames.push_back(h.bytes);
  std::vector<Field> planes = all(s, 1);
  EXPECT_EQ(planes.size(), 1u);
  std::vector<Field> plane = decode(planes.at(0).bytes);
  planeName = one(plane, 2)->bytes;
  auto eventNames = metadata(plane, 4), statNames = metadata(plane, 5);
  std::vector<Line> lines;
  for (const Field &lf : all(plane, 3)) {
    std::vector<Field> l = decode(lf.bytes);
    Line line;
    line.id = one(l, 1) ? int64_t(one(l, 1)->varint) : 0;
    line.name = one(l, 2)->bytes;
    line.displayName = one(l, 11) ? one(l, 11)->bytes : "";
    line.timestampNs = one(l, 3) ? int64_t(one(l, 3)->varint) : 0;
    for (const Field &ef : all(l, 4)) {
      std::vector<Field> e = decode(ef.bytes);
      Event ev;
      ev.name = eventNames.at(int64_t(one(e, 1)->varint));
      ev.offsetPs = one(e, 2) ? int64_t(one(e, 2)->varint) : 0;
      ev.durationPs = one(e, 3) ? int64_t(one(e, 3)->varint) : 0;
      for (const Field &sf : all(e, 4)) {
        std::vector<Field> st = decode(sf.bytes);
        std::string key = statNames.at(int64_t(one(st, 1)->varint));
        if (const Field *v = one(st, 4))
          ev.stats[key] = int64_t(v->varint);
        else if (const Field *d = one(st, 2)) {
          double x;
          std::memcpy(&x, &d->fixed64, 8);
          ev.stats[key] = x;
        } else if (const Field *t = one(st, 5))
          ev.stats[key] = t->bytes;
        else
          ADD_FAILURE() << "stat " << key << " has no value";
      }
      line.events.push_back(std::move(ev));
    }
    lines.push_back(std::move(line));
  }
  return lines;
}

using tracetest::oneKernel;

} // namespace

TEST(XPlane, EncodesTheDevicesTracksAsLinesOfTheHostPlane) {
  program::Program p = oneKernel();
  Tracer t;
  t.setEnabled(true);
  Span step;
  step.kind = Span::Step;
  step.name = "step 4";
  step.step = 4;
  step.start = 10e-6;
  step.seconds = 100e-6;
  t.add(step);
  Span k;
  k.kind = Span::Kernel;
  k.kernel = 0;
  k.planStep = 0;
  k.function = "train_step";
  k.step = 4;
  k.start = 20e-6;
  k.seconds = 1.6e-6;
  k.flops = 3000;
  k.bytes = 1000;
  t.add(k);
  Span c; // a collective of no measurable length: an event of duration 0
  c.kind = Span::Collective;
  c.name = "all_reduce";
  c.queue = 1;
  c.step = 4;
  c.start = 30e-6;
  c.seconds = 0;
  t.add(c);
  train::TraceSource src;
  src.tracer = &t;
  src.program = &p;
  src.process = "rank 1 · cpu (2 threads)";
  src.pid = 1;
  src.shift = 1e-3; // this tracer started 1 ms after the trace's origin

  std::string planeName;
  std::vector<std::string> hosts;
  std::vector<Line> lines = linesOf(train::renderXSpace(src, "vm"), planeName, hosts);
  EXPECT_EQ(planeName, "/host:CPU");
  EXPECT_EQ(hosts, std::vector<std::string>{"vm"});
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].name, "trainer");
  EXPECT_EQ(lines[0].displayName, "trainer \u2014 rank 1 · cpu (2 threads)");
  EXPECT_EQ(lines[1].name, "compute (queue 0)");
  EXPECT_EQ(lines[2].name, "communication (queue 1)");
  for (const Line &l : lines)
    EXPECT_EQ(l.timestampNs, 0) << l.name;

  // The trainer's step: picoseconds from the trace's origin (shift added).
  ASSERT_EQ(lines[0].events.size(), 1u);
  EXPECT_EQ(lines[0].events[0].name, "step 4");
  EXPECT_EQ(lines[0].events[0].offsetPs, 1'010'000'000);
  EXPECT_EQ(lines[0].events[0].durationPs, 100'000'000);
  EXPECT_EQ(std::get<int64_t>(lines[0].events[0].stats.at("step")), 4);

  // Queue 0: the kernel, named by its model line, and the step's idle gaps.
  const Event *kernel = nullptr;
  int idle = 0;
  for (const Event &e : lines[1].events) {
    if (e.name == "m.kiln:7 softmax")
      kernel = &e;
    idle += e.name == "idle";
  }
  ASSERT_TRUE(kernel);
  EXPECT_EQ(idle, 2);
  EXPECT_EQ(kernel->offsetPs, 1'020'000'000);
  EXPECT_EQ(kernel->durationPs, 1'600'000);
  EXPECT_EQ(std::get<std::string>(kernel->stats.at("symbol")), "k0_fused2_softmax_L7");
  EXPECT_EQ(std::get<std::string>(kernel->stats.at("ops")), "exp, softmax");
  EXPECT_EQ(std::get<std::string>(kernel->stats.at("function")), "train_step");
  EXPECT_EQ(std::get<int64_t>(kernel->stats.at("flops")), 3000);
  EXPECT_EQ(std::get<int64_t>(kernel->stats.at("plan step")), 0); // a zero is still a value
  EXPECT_NEAR(std::get<double>(kernel->stats.at("GFLOP/s")), 1.875, 1e-6); // not whole: a double

  ASSERT_EQ(lines[2].events.size(), 1u);
  EXPECT_EQ(lines[2].events[0].name, "all_reduce");
  EXPECT_EQ(lines[2].events[0].durationPs, 0);

  // No tracer: nothing to write.
  EXPECT_EQ(train::renderXSpace(train::TraceSource{}, "vm"), "");
}

TEST(XPlane, NamesTheRunAndWritesOneFilePerHost) {
  EXPECT_EQ(train::profileRunName(0), "1970_01_01_00_00_00");
  EXPECT_EQ(train::profileRunName(1796527097), "2026_12_06_03_18_17");
  EXPECT_EQ(train::profileHostName(3), "rank3");
  std::string dir = ::testing::TempDir() + "kiln-xplane-test";
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(train::checkProfileDir(dir, "r"));
  EXPECT_TRUE(std::filesystem::is_directory(dir + "/plugins/profile"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/plugins/profile/r"));
  auto written = train::writeProfile(dir, "r", {{"rank0", "abc"}, {"rank1", ""}});
  ASSERT_TRUE(written) << written.status().message();
  EXPECT_EQ(written->dir, dir + "/plugins/profile/r");
  ASSERT_EQ(written->files.size(), 1u);
  EXPECT_EQ(written->files[0], dir + "/plugins/profile/r/rank0.xplane.pb");
  std::ifstream in(written->files[0], std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "abc");
  EXPECT_FALSE(std::filesystem::exists(dir + "/plugins/profile/r/rank1.xplane.pb"));
  // Another run of the same second: a directory of its own.
  auto again = train::writeProfile(dir, "r", {{"rank0", "def"}});
  ASSERT_TRUE(again) << again.status().message();
  EXPECT_EQ(again->dir, dir + "/plugins/profile/r_2");
  std::ifstream first(written->files[0], std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(first), {}), "abc");
  std::filesystem::remove_all(dir);

  // A file where the directory should be: an error naming it.
  std::ofstream(dir) << "x";
  Status s = train::checkProfileDir(dir, "r");
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("'" + dir + "/plugins/profile'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("choose another --tensorboard directory"), std::string::npos);
  std::filesystem::remove(dir);
}
