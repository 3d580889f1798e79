//===- Placement.h - Where each step of an entry point runs -----*- C++ -*-===//
//
// `kiln-run train --log-placement` (and eval): before training, one line per
// step of an entry point in model-file terms (its index, the devices that
// run it, what it is, its model-file line), then a summary per pipeline
// stage (steps, kernels, GEMMs, sends and receives, bytes sent, arena).
// docs/runtime.md "Where steps run".
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_TRAIN_PLACEMENT_H
#define KILN_RUNTIME_TRAIN_PLACEMENT_H

#include "runtime/core/Program.h"

#include <string>
#include <vector>

namespace kiln::train {

/// "stage 1 (devices 2,3)", "all devices" (a step every device runs, on a
/// mesh of several) or "device 0" (one device): who runs step `s`.
std::string placementOf(const program::Program &p, const program::Step &s);
/// What step `s` is: "kernel fused_softmax_4 (kiln.softmax)", "gemm
/// 64x256x128 NN", "copy 4096 B", "send 4000 B to stage 1", "recv 4000 B
/// from stage 0", "broadcast 4 B from stage 1", "all_reduce 4096 B over dp
/// (sum)".
std::string describeStep(const program::Program &p, const program::Step &s);
/// The listing's lines for function `fn` (none when the program lacks it):
/// a heading, one line per step, then one summary line per stage.
std::vector<std::string> placementLines(const program::Program &p, const std::string &fn);

} // namespace kiln::train

#endif // KILN_RUNTIME_TRAIN_PLACEMENT_H
