//===- Blas.h - kiln.matmul on the GPU through cuBLASLt ---------*- C++ -*-===//
//
// The GPU counterpart of runtime/cpu/Gemm.h, with the same semantics
// (docs/dialect.md, kiln.matmul; program::GemmParams): row-major
// C[b] = op(A[b or 0]) * op(B[b or 0]) with optional transposes of either
// operand, batch dimensions on both sides or on one side only (a weight
// shared by the batch), and the strided "head" layouts the compiler folds
// [0, 2, 1, 3] transposes into.
//
// Precision: f32, f16 or bf16 operands and output, always accumulated in f32
// (CUBLAS_COMPUTE_32F); TF32 tensor cores for f32 operands only when asked
// (CUBLAS_COMPUTE_32F_FAST_TF32: 10-bit mantissa products, ~1e-3 relative).
//
// Epilogues run inside the GEMM: a bias over the output's last dim, GELU,
// GELU keeping its input (the pre-activation, for the backward pass), and
// accumulation into the output (beta = 1). cuBLASLt's GELU is the tanh
// approximation, i.e. kiln.gelu's `tanh` form (the language's gelu_tanh);
// exact (erf) GELU must stay a kernel.
//
// Row-major through column-major cuBLASLt: a row-major [r, c] matrix with
// row stride ld is a column-major [c, r] matrix with leading dimension ld,
// so C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T: cuBLASLt's "A"
// is Kiln's rhs, its "B" is Kiln's lhs, the transposes carry over unchanged.
//
// Batches (runtime/core/GemmPlan.h, planGemm): one cuBLASLt call with a
// batch count and strided batch offsets (stride 0 for a shared operand); a
// shared weight with a batched, untransposed lhs is one GEMM of batch*m
// rows (as on the CPU). Head layouts (heads != 0: matrix b at
// (b/heads)*outer + (b%heads)*inner) are one call where every operand's
// matrices are one stride apart, else one call per head (stride `outer`,
// offset h*inner; or one per batch entry where there are fewer entries than
// heads): never more than min(heads, batch/heads) calls. This keeps
// everything on the stream with no device pointer arrays to build and
// upload (cublasGemmBatchedEx would need one host->device copy per call, or
// a persistent table per shape in device memory) and no extra library.
//
// Descriptors, layouts and the algorithm (cublasLtMatmulAlgoGetHeuristic)
// are cached per distinct shape, dtype, epilogue and pointer alignment.
// A Blas object is not thread-safe and its workspace serves one stream at
// a time: use one per stream (or serialise).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CUDA_BLAS_H
#define KILN_RUNTIME_CUDA_BLAS_H

#include "runtime/core/GemmPlan.h"
#include "runtime/core/Program.h"
#include "runtime/core/Status.h"
#include "runtime/cuda/Driver.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kiln::cuda {

/// The call plan is runtime/core/GemmPlan.h's, shared with the emulator and
/// `kilnc --emit=counters`.
using gpu::foldsBatch;
using gpu::GemmPlanForm;
using gpu::LtGemm;
using gpu::planGemm;

/// The activation applied to the (bias-added) product.
enum class Activation {
  None,
  Relu,    ///< max(x, 0)
  Gelu,    ///< GELU, tanh approximation
  GeluAux, ///< GELU, and the pre-activation written to MatmulArgs::aux
};

/// Everything about a matmul except where its buffers are.
struct MatmulOp {
  program::GemmParams shape;
  program::DType inputType = program::DType::F32;  ///< lhs and rhs
  program::DType outputType = program::DType::F32; ///< out, bias and aux
  /// out += op(lhs) op(rhs) (beta = 1) instead of out = ... (beta = 0).
  bool accumulate = false;
  /// Allow TF32 tensor cores for f32 operands (ignored for f16/bf16).
  bool tf32 = false;
  /// Add MatmulArgs::bias ([n], outputType) to every output row.
  bool bias = false;
  Activation activation = Activation::None;
  /// GeluAux: row stride of the aux buffer in elements, a multiple of 8 and
  /// >= n; 0 means n rounded up to a multiple of 8. The aux buffer is
  /// [batch * m, auxLd] (matrix b at b * m * auxLd).
  int64_t auxLd = 0;
  /// How head layouts are split into calls (KILN_GEMM_PLAN; GemmPlan.h).
  GemmPlanForm plan = GemmPlanForm::Heads;
};

/// Device buffers of one matmul call (CUdeviceptr; 0 where unused).
struct MatmulArgs {
  CUdeviceptr lhs = 0, rhs = 0, out = 0;
  CUdeviceptr bias = 0; ///< MatmulOp::bias
  CUdeviceptr aux = 0;  ///< Activation::GeluAux
};

/// Checks what cuBLASLt can do with `op` (dtype pairs, epilogue options),
/// before any GPU work; the message says what to change.
Status checkMatmul(const MatmulOp &op);

/// A cuBLASLt handle, its workspace and the per-shape plans.
class Blas {
public:
  /// 32 MiB: what cuBLASLt's Hopper kernels want; enough for Ampere.
  static constexpr size_t kDefaultWorkspace = size_t(32) << 20;

  /// A handle without a workspace (setWorkspace() adds one). Needs a current
  /// context (PrimaryContext::retain); with no driver or GPU it fails with a
  /// Status, never a crash.
  static Expected<std::unique_ptr<Blas>> create();
  /// A handle with its own `workspaceBytes` workspace from `driver`, freed by
  /// the destructor (which must run while the context is alive).
  static Expected<std::unique_ptr<Blas>>
  create(const Driver &driver, size_t workspaceBytes = kDefaultWorkspace);
  ~Blas();
  Blas(const Blas &) = delete;
  Blas &operator=(const Blas &) = delete;

  /// Uses caller-owned device memory as the workspace (replacing an owned
  /// one, which is freed); drops the cached plans, whose algorithms were
  /// chosen for the old size.
  void setWorkspace(CUdeviceptr workspace, size_t bytes);

  /// Enqueues `op` on `stream` (a cudaStream_t is the same type). Buffers
  /// must be device memory of the current context; nothing is synchronised.
  Status matmul(const MatmulOp &op, const MatmulArgs &args, CUstream stream);

  /// Distinct plans built so far (descriptors + chosen algorithm).
  size_t cachedPlans() const;

  /// cuBLASLt's version, e.g. "13.1.0": part of cache keys and reports.
  static std::string version();

private:
  struct Impl;
  explicit Blas(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

} // namespace kiln::cuda

#endif // KILN_RUNTIME_CUDA_BLAS_H
