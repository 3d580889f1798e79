//===- Blas.cpp - kiln.matmul on the GPU through cuBLASLt -----------------===//
#include "runtime/cuda/Blas.h"

#include "runtime/core/Log.h"

#include <cublasLt.h>
#include <fmt/format.h>

#include <cstring>
#include <unordered_map>

namespace kiln::cuda {

using program::DType;
using program::GemmParams;

namespace {

std::string describe(cublasStatus_t s) {
  return fmt::format("{} ({})", cublasLtGetStatusName(s),
                     cublasLtGetStatusString(s));
}

Status blasStatus(cublasStatus_t s, const char *call, const char *file,
                  int line) {
  if (s == CUBLAS_STATUS_SUCCESS)
    return Status::ok();
  return Status::internal(fmt::format("{} failed at {}:{}: {}", call,
                                      sourcePath(file), line, describe(s)));
}

/// CUBLAS_CHECK of the house style: the call, file:line and cuBLAS's own
/// name and description of the status.
#define KILN_CUBLAS_TRY(call)                                                  \
  do {                                                                         \
    if (::kiln::Status kiln_s_ =                                               \
            blasStatus((call), #call, __FILE__, __LINE__);                     \
        !kiln_s_)                                                              \
      return kiln_s_;                                                          \
  } while (0)

cudaDataType_t cudaType(DType t) {
  switch (t) {
  case DType::F16:
    return CUDA_R_16F;
  case DType::BF16:
    return CUDA_R_16BF;
  default:
    return CUDA_R_32F;
  }
}

/// The largest power of two (at most 256) dividing every matrix start of an
/// operand: cuBLASLt picks kernels by the alignment it is promised.
uint32_t alignment(CUdeviceptr base, int bytes,
                   const std::vector<int64_t> &offsets, int64_t stride,
                   int64_t batch) {
  uint64_t bits = 256;
  for (int64_t off : offsets)
    bits |= uint64_t(base) + uint64_t(off) * uint64_t(bytes);
  if (batch > 1)
    bits |= uint64_t(stride) * uint64_t(bytes);
  return uint32_t(bits & (~bits + 1)); // lowest set bit
}

std::string shapeText(const GemmParams &s) { return gpu::gemmShapeText(s); }

/// Descriptors and the chosen algorithm for one distinct call shape.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  Plan() = default;
  Plan(const Plan &) = delete;
  ~Plan() {
    if (c)
      cublasLtMatrixLayoutDestroy(c);
    if (b)
      cublasLtMatrixLayoutDestroy(b);
    if (a)
      cublasLtMatrixLayoutDestroy(a);
    if (desc)
      cublasLtMatmulDescDestroy(desc);
  }
};

Status makeLayout(cublasLtMatrixLayout_t &layout, DType type, int64_t rows,
                  int64_t cols, int64_t ld, int64_t batch, int64_t stride) {
  KILN_CUBLAS_TRY(cublasLtMatrixLayoutCreate(
      &layout, cudaType(type), uint64_t(rows), uint64_t(cols), ld));
  if (batch > 1) {
    int32_t count = int32_t(batch);
    KILN_CUBLAS_TRY(cublasLtMatrixLayoutSetAttribute(
        layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    KILN_CUBLAS_TRY(cublasLtMatrixLayoutSetAttribute(
        layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
        sizeof(stride)));
  }
  return Status::ok();
}

int64_t auxLdOf(const MatmulOp &op) {
  return op.auxLd ? op.auxLd : (op.shape.n + 7) / 8 * 8;
}

} // namespace

Status checkMatmul(const MatmulOp &op) {
  auto name = [](DType t) { return program::dtypeName(t); };
  bool okIn = op.inputType == DType::F32 || op.inputType == DType::F16 ||
              op.inputType == DType::BF16;
  bool okPair = op.outputType == op.inputType ||
                (op.outputType == DType::F32 && op.inputType != DType::F32);
  if (!okIn || !okPair)
    return Status::internal(fmt::format(
        "cuBLASLt has no {} x {} -> {} matmul with f32 accumulation: operands "
        "must be f32, f16 or bf16, and the output the operands' type or f32 "
        "(cast the result in a separate kernel)",
        name(op.inputType), name(op.inputType), name(op.outputType)));
  if ((op.bias || op.activation != Activation::None) && op.shape.heads)
    return Status::internal(fmt::format(
        "matmul {}: bias and GELU epilogues are not supported with head "
        "layouts; apply them in a kernel",
        shapeText(op.shape)));
  if (op.activation == Activation::GeluAux) {
    int64_t ld = auxLdOf(op);
    if (ld % 8 || ld < op.shape.n)
      return Status::internal(fmt::format(
          "matmul {}: the GELU aux row stride {} must be a multiple of 8 and "
          "at least n = {} (cuBLASLt's rule)",
          shapeText(op.shape), ld, op.shape.n));
  }
  return Status::ok();
}

struct Blas::Impl {
  cublasLtHandle_t handle = nullptr;
  const Driver *driver = nullptr; ///< set when the workspace is owned
  CUdeviceptr workspace = 0;
  size_t workspaceBytes = 0;
  cublasLtMatmulPreference_t preference = nullptr;
  std::unordered_map<std::string, std::unique_ptr<Plan>> plans;

  void freeWorkspace() {
    if (driver && workspace)
      (void)driver->cuMemFree(workspace);
    driver = nullptr;
    workspace = 0;
    workspaceBytes = 0;
  }
  ~Impl() {
    plans.clear();
    if (preference)
      cublasLtMatmulPreferenceDestroy(preference);
    freeWorkspace();
    if (handle)
      cublasLtDestroy(handle);
  }

  Expected<Plan *> plan(const MatmulOp &op, const LtGemm &g,
                        const MatmulArgs &args);
};

Blas::Blas(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Blas::~Blas() = default;

std::string Blas::version() {
  size_t v = cublasLtGetVersion();
  return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

Expected<std::unique_ptr<Blas>> Blas::create() {
  auto impl = std::make_unique<Impl>();
  cublasStatus_t s = cublasLtCreate(&impl->handle);
  if (s != CUBLAS_STATUS_SUCCESS) {
    impl->handle = nullptr;
    return Status::error(fmt::format(
        "cuBLASLt {} could not start (cublasLtCreate: {}): it needs an NVIDIA "
        "driver, a GPU and a current CUDA context (PrimaryContext::retain); "
        "run on a machine with an NVIDIA GPU, or use the CPU backend "
        "(--device cpu)",
        version(), describe(s)));
  }
  KILN_CUBLAS_TRY(cublasLtMatmulPreferenceCreate(&impl->preference));
  return std::unique_ptr<Blas>(new Blas(std::move(impl)));
}

Expected<std::unique_ptr<Blas>> Blas::create(const Driver &driver,
                                             size_t bytes) {
  auto blas = create();
  if (!blas)
    return blas.status();
  if (bytes) {
    CUdeviceptr ws = 0;
    KILN_CU_TRY(driver, cuMemAlloc(&ws, bytes));
    (*blas)->impl_->driver = &driver;
    (*blas)->impl_->workspace = ws;
    (*blas)->impl_->workspaceBytes = bytes;
  }
  return blas;
}

void Blas::setWorkspace(CUdeviceptr workspace, size_t bytes) {
  impl_->freeWorkspace();
  impl_->workspace = workspace;
  impl_->workspaceBytes = workspace ? bytes : 0;
  impl_->plans.clear();
}

size_t Blas::cachedPlans() const { return impl_->plans.size(); }

Expected<Plan *> Blas::Impl::plan(const MatmulOp &op, const LtGemm &g,
                                  const MatmulArgs &args) {
  int inBytes = program::dtypeBytes(op.inputType);
  int outBytes = program::dtypeBytes(op.outputType);
  uint32_t alignA = alignment(args.rhs, inBytes, g.offsetA, g.strideA, g.batch);
  uint32_t alignB = alignment(args.lhs, inBytes, g.offsetB, g.strideB, g.batch);
  uint32_t alignC =
      alignment(args.out, outBytes, g.offsetC, g.strideC, g.batch);
  uint32_t alignBias = op.bias ? alignment(args.bias, outBytes, {0}, 0, 1) : 0;
  uint32_t alignAux = op.activation == Activation::GeluAux
                          ? alignment(args.aux, outBytes, {0}, 0, 1)
                          : 0;
  bool tf32 = op.tf32 && op.inputType == DType::F32;
  int64_t auxLd = auxLdOf(op);
  std::string key = fmt::format(
      "{}{} {}x{}x{} ld {} {} {} b{} s {} {} {} | {}>{} {}{} e{}{} aux{} | al "
      "{} "
      "{} {} {} {} | ws {}",
      int(g.transA), int(g.transB), g.m, g.n, g.k, g.lda, g.ldb, g.ldc, g.batch,
      g.strideA, g.strideB, g.strideC, int(op.inputType), int(op.outputType),
      int(op.accumulate), int(tf32), int(op.bias), int(op.activation), auxLd,
      alignA, alignB, alignC, alignBias, alignAux, workspaceBytes);
  if (auto it = plans.find(key); it != plans.end())
    return it->second.get();

  auto p = std::make_unique<Plan>();
  cublasComputeType_t compute =
      tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  KILN_CUBLAS_TRY(cublasLtMatmulDescCreate(&p->desc, compute, CUDA_R_32F));
  int32_t ta = g.transA ? CUBLAS_OP_T : CUBLAS_OP_N;
  int32_t tb = g.transB ? CUBLAS_OP_T : CUBLAS_OP_N;
  KILN_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(
      p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  KILN_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(
      p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  if (op.activation == Activation::Relu)
    epilogue = op.bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
  else if (op.activation == Activation::Gelu)
    epilogue = op.bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
  else if (op.activation == Activation::GeluAux)
    epilogue =
        op.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  else if (op.bias)
    epilogue = CUBLASLT_EPILOGUE_BIAS;
  KILN_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(
      p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  if (op.bias) {
    // The heuristic reads the pointer's alignment; the call sets it again.
    const void *bias = reinterpret_cast<const void *>(args.bias);
    KILN_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(
        p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    int64_t zero = 0; // one bias vector for every matrix of the batch
    KILN_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(
        p->desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &zero, sizeof(zero)));
  }
  if (op.activation == Activation::GeluAux) {
    void *aux = reinterpret_cast<void *>(args.aux);
    KILN_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(
        p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
    KILN_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(
        p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &auxLd, sizeof(auxLd)));
    if (g.batch > 1) {
      int64_t stride = g.n * auxLd; // matrix b at b * m * auxLd
      KILN_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(
          p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &stride,
          sizeof(stride)));
    }
  }
  if (Status s = makeLayout(p->a, op.inputType, g.rowsA(), g.colsA(), g.lda,
                            g.batch, g.strideA);
      !s)
    return s;
  if (Status s = makeLayout(p->b, op.inputType, g.rowsB(), g.colsB(), g.ldb,
                            g.batch, g.strideB);
      !s)
    return s;
  if (Status s =
          makeLayout(p->c, op.outputType, g.m, g.n, g.ldc, g.batch, g.strideC);
      !s)
    return s;

  uint64_t ws = workspaceBytes;
  KILN_CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  KILN_CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &alignA,
      sizeof(alignA)));
  KILN_CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &alignB,
      sizeof(alignB)));
  KILN_CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &alignC,
      sizeof(alignC)));
  KILN_CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &alignC,
      sizeof(alignC)));

  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  KILN_CUBLAS_TRY(cublasLtMatmulAlgoGetHeuristic(
      handle, p->desc, p->a, p->b, p->c, p->c, preference, 1, &result, &found));
  if (found == 0 || result.state != CUBLAS_STATUS_SUCCESS)
    return Status::internal(fmt::format(
        "cuBLASLt {} has no algorithm for matmul {} ({} -> {}, epilogue {}, "
        "alignments {}/{}/{} bytes, workspace {} bytes): align the buffers to "
        "16 bytes or report the shape as a Kiln bug",
        Blas::version(), shapeText(op.shape), program::dtypeName(op.inputType),
        program::dtypeName(op.outputType), epilogue, alignB, alignA, alignC,
        workspaceBytes));
  p->algo = result.algo;
  log::debug(
      "cuBLASLt plan for matmul {}: {} call(s) of batch {}, workspace {} of {} "
      "bytes",
      shapeText(op.shape), g.calls(), g.batch, result.workspaceSize,
      workspaceBytes);
  Plan *raw = p.get();
  plans.emplace(std::move(key), std::move(p));
  return raw;
}

Status Blas::matmul(const MatmulOp &op, const MatmulArgs &args,
                    CUstream stream) {
  if (Status s = checkMatmul(op); !s)
    return s;
  if (!args.lhs || !args.rhs || !args.out || (op.bias && !args.bias) ||
      (op.activation == Activation::GeluAux && !args.aux))
    return Status::internal(fmt::format("matmul {}: a null device pointer (lhs "
                                        "{:#x}, rhs {:#x}, out {:#x}, bias "
                                        "{:#x}, aux {:#x})",
                                        shapeText(op.shape), args.lhs, args.rhs,
                                        args.out, args.bias, args.aux));
  auto g = planGemm(op.shape, op.plan);
  if (!g)
    return g.status();
  auto p = impl_->plan(op, *g, args);
  if (!p)
    return p.status();
  Plan &plan = **p;
  if (op.bias) {
    const void *bias = reinterpret_cast<const void *>(args.bias);
    KILN_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(
        plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  if (op.activation == Activation::GeluAux) {
    void *aux = reinterpret_cast<void *>(args.aux);
    KILN_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(
        plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
        sizeof(aux)));
  }
  const float alpha = 1.0f, beta = op.accumulate ? 1.0f : 0.0f;
  int64_t inBytes = program::dtypeBytes(op.inputType);
  int64_t outBytes = program::dtypeBytes(op.outputType);
  void *workspace = reinterpret_cast<void *>(impl_->workspace);
  for (int64_t c = 0; c < g->calls(); ++c) {
    const void *a =
        reinterpret_cast<const void *>(args.rhs + g->offsetA[c] * inBytes);
    const void *b =
        reinterpret_cast<const void *>(args.lhs + g->offsetB[c] * inBytes);
    void *d = reinterpret_cast<void *>(args.out + g->offsetC[c] * outBytes);
    KILN_CUBLAS_TRY(cublasLtMatmul(impl_->handle, plan.desc, &alpha, a, plan.a,
                                   b, plan.b, &beta, d, plan.c, d, plan.c,
                                   &plan.algo, workspace, impl_->workspaceBytes,
                                   stream));
  }
  return Status::ok();
}

} // namespace kiln::cuda
