//===- Assemble.h - The CUDA side of an artifact ----------------*- C++ -*-===//
//
// assembleCuda() turns emitCuda()'s program into the artifact's CUDA
// sections (runtime/core/GpuPlan.h, docs/artifact.md):
//   kernels.cuda.source      [#define KILN_MAX_REGISTERS N] + prelude + source
//   kernels.cuda.plan        gpu::Plan as JSON (launches, NVRTC version,
//                            ptxas's report per architecture)
//   kernels.cuda.sm_XY.ptx   NVRTC's PTX and CUBIN per ahead-of-time
//   kernels.cuda.sm_XY.cubin architecture (only when built with NVRTC)
// and the manifest's "kernels.cuda" entry. Without NVRTC the artifact holds
// the source and plan only; kiln-run compiles the source when it loads.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_COMPILER_CUDA_ASSEMBLE_H
#define KILN_COMPILER_CUDA_ASSEMBLE_H

#include "compiler/cuda/Emitter.h"
#include "runtime/core/Artifact.h"
#include "runtime/core/Status.h"

#include <functional>
#include <string>
#include <vector>

namespace kiln {

struct CudaAssembleOptions {
  /// Architectures compiled ahead of time ("sm_80", "sm_90").
  std::vector<std::string> archs;
  /// Registers per thread (KILN_MAX_REGISTERS in the source, so that a
  /// load-time compile for another architecture honours it too); 0: none.
  int maxRegisters = 0;
};

struct CudaArtifact {
  /// kernels.cuda.source, kernels.cuda.plan, then PTX (and CUBIN) per arch.
  std::vector<artifact::Section> sections;
  /// The manifest's "kernels" -> "cuda" entry (JSON text).
  std::string manifest;
};

/// Compiles `program` (emitted for a program of `numKernels` kernels) for every
/// architecture in `options`. `note` receives one line per architecture, a
/// warning per function that spills registers, and a line when built without
/// NVRTC. Fails with NVRTC's log when a compile fails (an internal error:
/// the emitter wrote code NVRTC rejects).
Expected<CudaArtifact> assembleCuda(const CudaProgram &program, size_t numKernels,
                                    const CudaAssembleOptions &options,
                                    const std::function<void(const std::string &)> &note);

} // namespace kiln

#endif // KILN_COMPILER_CUDA_ASSEMBLE_H
