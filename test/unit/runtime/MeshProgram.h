//===- MeshProgram.h - A hand-built mesh program for executor tests -*- C++
//-*-===//
//
// Shared by kiln-executor-tests and kiln-executor-mpi-test: a kernel-free
// plan-v2 program over a mesh of n devices on axis "dp" (see meshProgram()).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_TEST_UNIT_RUNTIME_MESHPROGRAM_H
#define KILN_TEST_UNIT_RUNTIME_MESHPROGRAM_H

#include "runtime/core/Program.h"

#include <cstdio>
#include <string>
#include <vector>

namespace kiln::test {

using namespace kiln::program;

inline constexpr int64_t kN = 8; // elements of the gradient-like buffer g

inline Buffer buffer(const std::string &name, Role role,
                     std::vector<int64_t> shape, int64_t offset) {
  Buffer b;
  b.name = name;
  b.role = role;
  b.shape = std::move(shape);
  b.offset = offset;
  b.bytes = b.numElements() * 4;
  return b;
}

inline Step collective(Collective::Op op, std::vector<int> args, int64_t bytes,
                       Collective::Reduction r = Collective::Reduction::None) {
  Step s;
  s.kind = Step::Collective;
  s.args = std::move(args);
  s.collective.op = op;
  s.collective.axis = "dp";
  s.collective.bytes = bytes;
  s.collective.reduction = r;
  return s;
}

inline Step copy(int from, int to) {
  Step s;
  s.kind = Step::Copy;
  s.args = {from, to};
  return s;
}

/// Buffers: 0 g f32[8] (state), 1 block f32[8/n], 2 gathered f32[8],
/// 3 copy of g f32[8], 4 x f32[8] (input), 5 y f32[8] (copy of x).
/// @train_step:
///   0: g = all_reduce(g, sum) in place, queue 1      (a gradient bucket)
///   1: y = copy(x), queue 0                         (independent of 0)
///   2: c = copy(g), queue 0                         (waits for 0)
///   3: block = reduce_scatter(g, mean), queue 0
///   4: gathered = all_gather(block), queue 0
/// Every device has its own layout: odd devices hold the scratch buffers
/// in the reverse order, and device d's sit 64 * d bytes further into its
/// arena.
inline Program meshProgram(int n) {
  Program p;
  p.mesh.axes = {{"dp", n}};
  std::vector<Buffer> bufs = {buffer("g", Role::State, {kN}, 0),
                              buffer("", Role::Temp, {kN / n}, 64),
                              buffer("gathered", Role::Output, {kN}, 128),
                              buffer("c", Role::Output, {kN}, 192),
                              buffer("x", Role::Input, {kN}, 256),
                              buffer("y", Role::Output, {kN}, 320)};
  for (int d = 0; d < n; ++d) {
    BufferPlan plan;
    plan.buffers = bufs;
    for (size_t i = 1; i < plan.buffers.size();
         ++i) // odd devices: scratch reversed
      plan.buffers[i].offset =
          64 * int64_t(d % 2 ? bufs.size() - i : i) + 64 * d;
    plan.buffers[0].offset = 64 * d;
    plan.persistentBytes = 64 * (d + 1);
    plan.arenaBytes = 384 + 64 * d;
    if (d == 0)
      static_cast<BufferPlan &>(p) = plan;
    else
      p.otherDevices.push_back(plan);
  }
  Function f;
  f.name = "train_step";
  f.args = {0, 4};
  f.results = {2, 3, 5};
  f.scratchBytes = 384 - 64;
  Step ar = collective(Collective::Op::AllReduce, {0, 0}, kN * 4,
                       Collective::Reduction::Sum);
  ar.loc = "m.kiln:9:3";
  Step rs = collective(Collective::Op::ReduceScatter, {0, 1}, kN * 4,
                       Collective::Reduction::Mean);
  Step ag = collective(Collective::Op::AllGather, {1, 2}, kN * 4 / n);
  f.steps = {ar, copy(4, 5), copy(0, 3), rs, ag};
  computeDependencies(p, f);
  f.steps[0].queue = 1;
  p.queues = 2;
  p.functions = {f};
  // What kilnc writes is what the runtime reads: parse() checks it all.
  auto q = Program::parse(p.toJson(), "mesh.kpack");
  if (!q) {
    std::fprintf(stderr, "meshProgram(%d): %s\n", n,
                 q.status().message().c_str());
    return p;
  }
  return *q;
}

} // namespace kiln::test

#endif // KILN_TEST_UNIT_RUNTIME_MESHPROGRAM_H
