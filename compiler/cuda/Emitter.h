//===- Emitter.h - CUDA C++ for Kiln's kernels -------------*- C++ -*-===//
//
// emitCuda() turns every kernel of a compiled program (its target-neutral
// form: func @<symbol>(memref args) around one kiln.fusion) into CUDA C++:
// one translation unit, the prelude (runtime/cuda/kiln_cuda.h) first, then
// one or more `__global__` functions per kernel. Each kernel's launches take
// the kernel's buffers as their parameters, in the plan's order, so the
// runtime passes the same pointer list to every launch of a kernel.
//
// Kernel forms (docs/cuda.md):
//   elementwise  grid-stride loop over each output shape, every value
//                computed at the point's index from its inputs (broadcasts,
//                reshapes, transposes, slices, pads, concatenations, gathers
//                are index maps); 16-byte loads and stores when every
//                input is read at the output's index: float4 when every
//                buffer is f32, "elementwise(vec8)" (8 elements a thread,
//                a uint4 of halves or two float4 per buffer) when some
//                are f16/bf16;
//   rows         the fusion's leading `rows` dimensions index rows; each
//                reduction is a stage whose results later stages and the
//                outputs read. "rows(warp per row)" for rows of at most 1024
//                elements: a warp per row, 8 per block, warp butterflies,
//                no block barrier; "rows(block per row)" for wider rows: a
//                block per row, block reductions through shared memory (or
//                a warp per kept element when the row keeps an axis);
//   columns      reductions over leading dimensions: a block per reduced
//                element (shuffle + shared-memory tree), or a thread per
//                element looping over the column when there are many;
//   scatter      scatter_add: chunks of indices summed per row in shared
//                memory, then the chunks in order (two launches), or a
//                thread per output element or per (outer, inner) column
//                walking every index (deterministic, no float atomics).
// Accumulation is float32 (double for f64); f16/bf16 values are rounded to
// their type after every op, like the CPU code.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_COMPILER_CUDA_EMITTER_H
#define KILN_COMPILER_CUDA_EMITTER_H

#include "runtime/core/GpuPlan.h"
#include "runtime/core/Program.h"

#include "mlir/IR/BuiltinOps.h"

#include <string>
#include <vector>

namespace kiln {

struct CudaProgram {
  std::string source; ///< the whole translation unit
  /// Per program kernel (same index): its launches, in order (the plan's
  /// own Launch: assembleCuda writes them into gpu::Plan as they are).
  std::vector<std::vector<gpu::Launch>> kernels;
};

/// Choices between kernel forms, kept so a GPU run can time old against new.
struct CudaEmitOptions {
  /// Column reductions in the coalesced `columns(tiles[, split])` form where
  /// it applies; false: the older `columns(block per column)` form
  /// (kilnc --cuda-columns=block).
  bool columnTiles = true;
  /// scatter_add over many indices and few rows in the chunked
  /// `scatter(chunks)` + `scatter(chunk sums)` form where it applies; false:
  /// the older forms that walk every index per thread (kilnc
  /// --cuda-scatter=walk).
  bool scatterChunks = true;
  /// Elementwise kernels over f16/bf16 buffers in the `elementwise(vec8)`
  /// form (8 elements a thread, 16-byte loads and stores) where it applies;
  /// false: the scalar `elementwise` form (kilnc --cuda-half-vectors=off).
  bool halfVectors = true;
};

/// Emits CUDA C++ for `neutral` (CompiledProgram::neutralKernels). Fails
/// with `error` naming the kernel and the op that has no CUDA form.
mlir::FailureOr<CudaProgram> emitCuda(mlir::ModuleOp neutral, const program::Program &program,
                                      std::string &error, const CudaEmitOptions &options = {});

} // namespace kiln

#endif // KILN_COMPILER_CUDA_EMITTER_H
