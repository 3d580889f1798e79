//===- GpuPlan.h - How a program's kernels launch on a GPU -------*- C++ -*-===//
//
// The CUDA side of an artifact (docs/artifact.md): kilnc writes
//   kernels.cuda.source      the CUDA C++ of every kernel, prelude included
//   kernels.cuda.plan        this plan (JSON)
//   kernels.cuda.sm_XY.ptx   NVRTC's PTX for each architecture compiled
//   kernels.cuda.sm_XY.cubin and its CUBIN (ahead of time)
// The plan lists, per program kernel (same index as Program::kernels), the
// __global__ functions to launch in order, each with its grid, block and
// dynamic shared memory; every launch of a kernel takes the kernel's buffers
// as its parameters. It also records NVRTC's version and, per architecture,
// ptxas's resource report (registers, spills, stack, shared memory).
// No CUDA headers: the compiler writes it, the runtime reads it.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CORE_GPUPLAN_H
#define KILN_RUNTIME_CORE_GPUPLAN_H

#include "runtime/core/Status.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kiln::gpu {

struct Launch {
  std::string function; ///< extern "C" __global__ symbol
  std::string form;     ///< elementwise, rows, columns, scatter, matmul
  int64_t grid[3] = {1, 1, 1}, block[3] = {1, 1, 1};
  int64_t sharedBytes = 0; ///< dynamic shared memory
};

/// ptxas's report for one function on one architecture.
struct Resources {
  std::string function;
  int registers = 0;
  int64_t spillStores = 0, spillLoads = 0, stackBytes = 0, sharedBytes = 0;
};

struct Plan {
  std::string nvrtcVersion;          ///< of the ahead-of-time compiles
  std::vector<std::string> archs;    ///< compiled ahead of time ("sm_90")
  std::vector<std::vector<Launch>> kernels;
  std::map<std::string, std::vector<Resources>> resources; ///< arch -> report

  std::string toJson() const;
  /// Parses and checks (`kernels` entries must match the program's count;
  /// launch dimensions positive and within CUDA's limits).
  static Expected<Plan> parse(const std::string &json, const std::string &origin,
                              size_t numKernels);
};

} // namespace kiln::gpu

#endif // KILN_RUNTIME_CORE_GPUPLAN_H
