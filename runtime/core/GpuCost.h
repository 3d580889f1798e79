//===- GpuCost.h - Predicted GPU time of a plan, without a GPU ---*- C++ -*-===//
//
// A cost model of a CUDA plan: each step's FLOPs and bytes against a table
// of devices (H100 SXM, H200, A100), giving a predicted time per call of an
// entry point. It sees exactly what the runtime will launch: the program's
// steps, the CUDA plan's launches (form, grid, block) and how many library
// calls each GEMM becomes. No timing and no GPU: the same plan gives the
// same prediction on every machine, so CI can pin it (scripts/perf-guard.py)
// and a change that makes the plan slower on paper fails without a GPU.
//
// The model (docs/cuda.md "The GPU cost model" has its derivation and how
// far off it was against the one measured H200 run):
//   - a GEMM library call: its tiles (128 x 128 per CTA) in waves over the
//     SMs; time = max(FLOPs / (peak x efficiency x wave fill), bytes /
//     bandwidth) + a fixed per-call cost (ramp and tail of a short kernel);
//   - a generated kernel launch: bytes / (bandwidth x access efficiency x
//     fill), where the access efficiency follows each thread's load width
//     (16-byte float4 paths, 4-byte, 2-byte half loads) and, for the form
//     that reads a column per block, the sector waste of strided loads; the
//     scatter form that loops over every index is latency-bound;
//   - every launch pays the GPU's gap between kernels, and the host's cost of
//     issuing it counts where the host, not the GPU, is the slower of the two.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CORE_GPUCOST_H
#define KILN_RUNTIME_CORE_GPUCOST_H

#include "runtime/core/GemmPlan.h"
#include "runtime/core/GpuPlan.h"
#include "runtime/core/Program.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace kiln::gpu {

/// What the model knows about a GPU: datasheet peaks and the fractions of
/// them measured or commonly reached (docs/cuda.md lists the sources).
struct DeviceSpec {
  std::string name; ///< "H100-SXM", "H200", "A100-SXM"
  int sms = 0;
  double clockHz = 0;         ///< boost clock
  double fp32Flops = 0;       ///< FFMA peak (no tensor cores), FLOP/s
  double tf32Flops = 0;       ///< dense tensor-core peak
  double halfFlops = 0;       ///< dense bf16/f16 tensor-core peak
  double bandwidth = 0;       ///< HBM, bytes/s
  double l2LatencyCycles = 0; ///< a dependent load that hits L2
  /// The devices the model knows, in a fixed order.
  static const std::vector<DeviceSpec> &table();
  /// By name (case-insensitive, "h100" matches "H100-SXM"); nullptr if none.
  static const DeviceSpec *find(const std::string &name);
};

/// How the runtime issues one GEMM step: `calls` library calls of `batch`
/// matrices each (the CUDA backend's GEMM plan).
struct GemmCalls {
  int64_t calls = 1, batch = 1;
};
using GemmSplit = std::function<GemmCalls(const program::GemmParams &)>;
/// The CUDA backend's own split (gpu::planGemm in `form`, the runtime's
/// plan); one call of the whole batch for a shape the plan refuses (the
/// runtime fails on it, which a count cannot say).
GemmCalls gemmCalls(const program::GemmParams &g, GemmPlanForm form);

/// How the step is issued: per-launch host costs (no CUDA graphs) or a
/// replayed graph.
struct CostOptions {
  bool tf32 = false;        ///< f32 GEMMs on TF32 tensor cores
  bool cudaGraphs = false;  ///< the step replayed as one graph
  GemmSplit gemmSplit;      ///< default: one call of the whole batch
};

/// One step of the plan as the model sees it.
struct CostItem {
  int step = 0;
  std::string what;  ///< kernel symbol or "gemm MxNxK ..." label
  std::string form;  ///< launch form, "gemm" for library calls
  int64_t launches = 0;
  double flops = 0, bytes = 0;
  double seconds = 0; ///< GPU time, gaps included
  std::string bound;  ///< "compute", "memory", "latency", "launch"
};

struct CostReport {
  std::string device;
  double seconds = 0;       ///< the predicted call
  double gemmSeconds = 0;   ///< library calls
  double kernelSeconds = 0; ///< generated kernels
  double hostSeconds = 0;   ///< the host's issue time (shows when it binds)
  int64_t launches = 0;     ///< generated-kernel launches
  int64_t libraryCalls = 0; ///< GEMM library calls
  std::vector<CostItem> items; ///< in plan order
};

/// Predicts one call of `f` on `dev` (on a mesh, the device with the largest
/// arena, as program::countPlan counts it). `launches` is the CUDA plan's
/// per-kernel launch list (gpu::Plan::kernels).
CostReport predict(const program::Program &p, const program::Function &f,
                   const std::vector<std::vector<Launch>> &launches,
                   const DeviceSpec &dev, const CostOptions &options = {});

/// The report as text: the total and its parts, then the `top` most
/// expensive steps.
std::string formatReport(const CostReport &r, size_t top);

} // namespace kiln::gpu

#endif // KILN_RUNTIME_CORE_GPUCOST_H
