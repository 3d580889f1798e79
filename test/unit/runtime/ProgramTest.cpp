//===- ProgramTest.cpp - The plan section's parser rejects bad plans -----===//
//
// The artifact's CRCs catch damage after writing; these cases are plans
// that are well-formed JSON but wrong (a buggy or hostile writer). Each must
// be rejected with a message naming the file, never accepted or crash.
//
//===----------------------------------------------------------------------===//
#include "runtime/core/Program.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <functional>

namespace {

using kiln::program::Program;
using json = nlohmann::ordered_json;

/// A small valid plan: a parameter, an input, an output; one kernel step,
/// one GEMM, one copy.
json validPlan() {
  return json::parse(R"({
    "version": 2, "mesh": {"axes": []}, "queues": 1,
    "devices": [{"device": 0, "persistent_bytes": 64, "arena_bytes": 512, "buffers": [
      {"name": "w", "role": "param", "dtype": "f32", "shape": [2, 2], "offset": 0, "bytes": 16},
      {"name": "x", "role": "input", "dtype": "f32", "shape": [2, 2], "offset": 64, "bytes": 16},
      {"name": "", "role": "temp", "dtype": "f32", "shape": [2, 2], "offset": 128, "bytes": 16},
      {"name": "y", "role": "output", "dtype": "f32", "shape": [2, 2], "offset": 192, "bytes": 16}
    ]}],
    "kernels": [
      {"symbol": "k0_relu", "op": "kiln.relu", "num_args": 2, "chunks": 1, "in_place_safe": true,
       "ops": ["kiln.relu"], "kind": "elementwise", "flops": 4, "locs": ["m.kiln:3:5"]}
    ],
    "functions": [
      {"name": "train_step", "args": [0, 1], "results": [3], "scratch_bytes": 192,
       "steps": [
         {"kind": "gemm", "args": [1, 0, 2], "loc": "", "queue": 0, "deps": [],
          "gemm": {"batch": 1, "m": 2, "n": 2, "k": 2, "transpose_lhs": false,
                   "transpose_rhs": true, "lhs_batched": false, "rhs_batched": false}},
         {"kind": "kernel", "kernel": 0, "args": [2, 3], "loc": "m.kiln:3:5", "queue": 0,
          "deps": [0]},
         {"kind": "copy", "args": [3, 0], "loc": "", "queue": 0, "deps": [0, 1]}
       ]}
    ]})");
}

void expectRejected(const std::function<void(json &)> &damage, const std::string &why) {
  json j = validPlan();
  damage(j);
  auto p = Program::parse(j.dump(), "model.kpack");
  ASSERT_FALSE(p.isOk()) << "accepted a plan with " << why;
  EXPECT_NE(p.status().message().find("model.kpack"), std::string::npos)
      << p.status().message();
  EXPECT_NE(p.status().message().find("recompile"), std::string::npos)
      << p.status().message();
}

TEST(Program, ValidPlanRoundTrips) {
  auto p = Program::parse(validPlan().dump(), "model.kpack");
  ASSERT_TRUE(p.isOk()) << p.status().message();
  EXPECT_EQ(p->buffers.size(), 4u);
  EXPECT_EQ(p->kernels[0].kind, "elementwise");
  EXPECT_EQ(p->function("train_step")->steps.size(), 3u);
  EXPECT_EQ(p->persistent("w"), 0);
  auto again = Program::parse(p->toJson(), "again");
  ASSERT_TRUE(again.isOk()) << again.status().message();
  EXPECT_EQ(again->toJson(), p->toJson());
}

TEST(Program, RejectsWrongPlans) {
  expectRejected([](json &j) { j = json::array(); }, "a non-object");
  expectRejected([](json &j) { j["devices"][0].erase("buffers"); }, "no buffers");
  expectRejected([](json &j) { j["devices"][0]["arena_bytes"] = 32; }, "a persistent region beyond the arena");
  expectRejected([](json &j) { j["devices"][0]["buffers"][1]["offset"] = 1024; }, "a buffer outside the arena");
  expectRejected([](json &j) { j["devices"][0]["buffers"][1]["offset"] = 65; }, "a misaligned buffer");
  expectRejected([](json &j) { j["devices"][0]["buffers"][1]["bytes"] = 12; }, "bytes that disagree with the shape");
  expectRejected([](json &j) { j["devices"][0]["buffers"][0]["offset"] = 128; }, "a parameter outside the persistent region");
  expectRejected([](json &j) { j["devices"][0]["buffers"][1]["dtype"] = "f128"; }, "an unknown dtype");
  expectRejected([](json &j) { j["devices"][0]["buffers"][1]["role"] = "ghost"; }, "an unknown role");
  expectRejected([](json &j) { j["devices"][0]["buffers"][1]["shape"] = {-2, 2}; }, "a negative dimension");
  expectRejected([](json &j) { j["devices"][0]["buffers"][1]["shape"] = {int64_t(1) << 40, int64_t(1) << 40}; },
                 "an overflowing shape");
  expectRejected([](json &j) { j["kernels"][0]["num_args"] = 0; }, "a kernel without arguments");
  expectRejected([](json &j) { j["kernels"][0]["chunks"] = 0; }, "zero pieces");
  expectRejected([](json &j) { j["functions"][0]["args"] = {0, 9}; }, "an unknown argument buffer");
  expectRejected([](json &j) { j["functions"][0]["steps"][1]["kernel"] = 3; }, "an unknown kernel");
  expectRejected([](json &j) { j["functions"][0]["steps"][1]["args"] = {2}; },
                 "a kernel call with the wrong arity");
  expectRejected([](json &j) { j["functions"][0]["steps"][1]["args"] = {2, 7}; },
                 "a step naming an unknown buffer");
  expectRejected([](json &j) { j["functions"][0]["steps"][0]["gemm"]["m"] = 3; },
                 "a GEMM whose buffers do not match its shape");
  expectRejected([](json &j) { j["functions"][0]["steps"][0]["gemm"].erase("k"); },
                 "a GEMM without K");
  expectRejected([](json &j) { j["functions"][0]["steps"][2]["args"] = {3}; }, "a one-buffer copy");
  expectRejected([](json &j) { j["functions"][0]["steps"][2]["kind"] = "teleport"; },
                 "an unknown step kind");
}

TEST(Program, DeterministicRoundTripsAndIsCheckedWhenPresent) {
  // Absent: the default (member order), and toJson leaves it out.
  auto plain = Program::parse(validPlan().dump(), "model.kpack");
  ASSERT_TRUE(plain.isOk()) << plain.status().message();
  EXPECT_FALSE(plain->deterministic);
  EXPECT_EQ(plain->toJson().find("deterministic"), std::string::npos);
  json j = validPlan();
  j["deterministic"] = "devices";
  auto p = Program::parse(j.dump(), "model.kpack");
  ASSERT_TRUE(p.isOk()) << p.status().message();
  EXPECT_TRUE(p->deterministic);
  auto again = Program::parse(p->toJson(), "again");
  ASSERT_TRUE(again.isOk()) << again.status().message();
  EXPECT_TRUE(again->deterministic);
  expectRejected([](json &j) { j["deterministic"] = "sometimes"; }, "an unknown deterministic mode");
  expectRejected([](json &j) { j["deterministic"] = 1; }, "a non-string deterministic mode");
}

} // namespace
