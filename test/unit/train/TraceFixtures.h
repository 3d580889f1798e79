//===- TraceFixtures.h - Programs the trace writers' tests trace -*- C++ -*-===//
#ifndef KILN_TEST_UNIT_TRAIN_TRACEFIXTURES_H
#define KILN_TEST_UNIT_TRAIN_TRACEFIXTURES_H

#include "runtime/core/Program.h"

namespace kiln::tracetest {

/// One kernel of a one-step train_step, at a model line.
inline program::Program oneKernel() {
  program::Program p;
  program::Kernel k;
  k.symbol = "k0_fused2_softmax_L7";
  k.op = "kiln.softmax";
  k.ops = {"kiln.exp", "kiln.softmax"};
  k.locs = {"/models/m.kiln:7:3", "/models/m.kiln:9:1"};
  k.flops = 1000;
  p.kernels.push_back(k);
  program::Function f;
  f.name = "train_step";
  program::Step s;
  s.kind = program::Step::Kernel;
  s.kernel = 0;
  s.loc = "/models/m.kiln:7:3";
  f.steps.push_back(s);
  p.functions.push_back(f);
  return p;
}

} // namespace kiln::tracetest

#endif // KILN_TEST_UNIT_TRAIN_TRACEFIXTURES_H
