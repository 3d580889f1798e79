//===- PipelineProgram.h - A hand-built two-stage plan for tests -*- C++ -*-===//
//
// Shared by kiln-pipeline-tests and kiln-executor-mpi-test: a kernel-free
// plan-v2 program over mesh ["pp", 2] or ["pp", 2, "dp", dp] whose steps
// and buffers belong to pipeline stages (see pipelineProgram()).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_TEST_UNIT_RUNTIME_PIPELINEPROGRAM_H
#define KILN_TEST_UNIT_RUNTIME_PIPELINEPROGRAM_H

#include "runtime/core/Program.h"

#include <cstdio>
#include <string>
#include <vector>

namespace kiln::test::pipeline {

using namespace kiln::program;

inline constexpr int64_t kN = 8; // elements of every buffer

inline Buffer buffer(const std::string &name, Role role, int stage, int64_t offset) {
  Buffer b;
  b.name = name;
  b.role = role;
  b.shape = {kN};
  b.offset = offset;
  b.bytes = kN * 4;
  b.stage = stage;
  return b;
}

inline Step copyStep(int from, int to, int stage) {
  Step s;
  s.kind = Step::Copy;
  s.args = {from, to};
  s.stage = stage;
  return s;
}

inline Step ppStep(Collective::Op op, std::vector<int> args, int peer, int stage) {
  Step s;
  s.kind = Step::Collective;
  s.args = std::move(args);
  s.collective.op = op;
  s.collective.axis = "pp";
  s.collective.bytes = kN * 4;
  s.collective.peer = peer;
  s.stage = stage;
  return s;
}

// Buffer ids of pipelineProgram().
enum : int { W0, W1, X, A0, B1, C1, S0, Out, D1 };

/// Two stages over mesh ["pp", 2] (dp = 1) or ["pp", 2, "dp", dp]. One
/// layout: w0 (stage 0) and w1 (stage 1) share the persistent bytes
/// [0, 32); a0 (stage 0) and b1 (stage 1) share [128, 160); s0 (stage 0)
/// and c1 (stage 1) share [192, 224); d1 (stage 1) lies at 320, past the
/// stage-0 devices' 320-byte arena (stage 1's is 384).
/// @train_step:
///   0: a0 = copy(x)                    stage 0
///   1: send a0 to stage 1 (queue 1)    stage 0
///   2: b1 = recv from stage 0          stage 1
///   3: c1 = copy(b1)                   stage 1
///   4: d1 = copy(w1)                   stage 1
///   5: out = broadcast(c1) from 1      every stage
inline Program pipelineProgram(int dp, bool parse = true) {
  Program p;
  p.mesh.axes = {{"pp", 2}};
  if (dp > 1)
    p.mesh.axes.push_back({"dp", dp});
  std::vector<Buffer> bufs = {
      buffer("w0", Role::Param, 0, 0),    buffer("w1", Role::Param, 1, 0),
      buffer("x", Role::Input, -1, 64),   buffer("a0", Role::Temp, 0, 128),
      buffer("b1", Role::Temp, 1, 128),   buffer("c1", Role::Temp, 1, 192),
      buffer("s0", Role::Output, 0, 192), buffer("out", Role::Output, -1, 256),
      buffer("d1", Role::Output, 1, 320)};
  for (int d = 0; d < 2 * dp; ++d) {
    BufferPlan plan;
    plan.buffers = bufs;
    plan.persistentBytes = 64;
    plan.arenaBytes = d / dp == 0 ? 320 : 384;
    if (d == 0)
      static_cast<BufferPlan &>(p) = plan;
    else
      p.otherDevices.push_back(plan);
  }
  Function f;
  f.name = "train_step";
  f.args = {X};
  f.results = {Out, S0, D1};
  f.scratchBytes = 384 - 64;
  Step bc = ppStep(Collective::Op::Broadcast, {C1, Out}, 1, -1);
  bc.loc = "m.kiln:12:5";
  f.steps = {copyStep(X, A0, 0),
             ppStep(Collective::Op::Send, {A0}, 1, 0),
             ppStep(Collective::Op::Recv, {B1}, 0, 1),
             copyStep(B1, C1, 1),
             copyStep(W1, D1, 1),
             bc};
  f.steps[1].loc = "m.kiln:8:3";
  f.steps[2].loc = "m.kiln:8:3";
  computeDependencies(p, f);
  f.steps[1].queue = 1;
  p.queues = 2;
  p.functions = {f};
  if (!parse)
    return p;
  // What kilnc writes is what the runtime reads: parse() checks it all.
  auto q = Program::parse(p.toJson(), "pp.kpack");
  if (!q) {
    std::fprintf(stderr, "pipelineProgram(%d): %s\n", dp, q.status().message().c_str());
    return p;
  }
  return *q;
}

} // namespace kiln::test::pipeline

#endif // KILN_TEST_UNIT_RUNTIME_PIPELINEPROGRAM_H
