//===- EmulatedDevice.cpp - The CUDA emulator as a Device -----------------===//
//
// Device memory is host memory; the artifact's CUDA source (the same text
// NVRTC compiles) is built by the host compiler and every launch runs in the
// emulator (runtime/cuda/emu) with CUDA's thread, barrier and warp rules;
// GEMMs run the calls cuBLASLt would get (runtime/core/GemmPlan.h: the same
// plan, offsets and batch strides) on the CPU's BLAS, one column-major sgemm
// per matrix, so a wrong plan gives wrong results here. Everything is
// synchronous: streams and events only order what already happened. This
// is for tests on machines without a GPU; its results are emulation.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/Device.h"
#include "runtime/cuda/emu/Module.h"
#include "runtime/core/GemmPlan.h"
#include "runtime/core/Half.h"
#include "runtime/cpu/Blas.h"

#include <cmath>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

namespace kiln::cuda {

namespace {

/// Elements an operand of `g` spans: the furthest element any matrix of any
/// call touches, plus one.
int64_t extent(const std::vector<int64_t> &offsets, int64_t stride, int64_t batch,
               int64_t rows, int64_t cols, int64_t ld) {
  int64_t last = 0;
  for (int64_t off : offsets)
    last = std::max(last, off + (batch - 1) * stride + (cols - 1) * ld + rows);
  return last;
}

/// The calls of `g` as cuBLASLt runs them, on float32 buffers: for every
/// call c and matrix i, D = op(A) op(B) at offset[c] + i * stride
/// (column-major, leading dimensions lda/ldb/ldc; A is Kiln's rhs, B its
/// lhs). One sgemm per matrix: float32 products and sums.
void runLtCalls(const gpu::LtGemm &g, const float *a, const float *b, float *d) {
  enum { kColMajor = 102 };
  cpu::Blas::Sgemm sgemm = cpu::sgemm();
  for (int64_t c = 0; c < g.calls(); ++c)
    for (int64_t i = 0; i < g.batch; ++i)
      sgemm(kColMajor, g.transA ? cpu::kCblasTrans : cpu::kCblasNoTrans,
            g.transB ? cpu::kCblasTrans : cpu::kCblasNoTrans, int(g.m), int(g.n), int(g.k), 1.0f,
            a + g.offsetA[size_t(c)] + i * g.strideA, int(g.lda),
            b + g.offsetB[size_t(c)] + i * g.strideB, int(g.ldb), 0.0f,
            d + g.offsetC[size_t(c)] + i * g.strideC, int(g.ldc));
}

/// runLtCalls() on f16/bf16 buffers: operands widened to float32 (exact),
/// float32 accumulation, and only the output matrices' elements rounded
/// back (nearest even), as cuBLASLt with CUBLAS_COMPUTE_32F writes them.
void runLtCallsHalf(program::DType t, const gpu::LtGemm &g, const uint16_t *a, const uint16_t *b,
                    uint16_t *d) {
  thread_local std::vector<float> fa, fb, fd;
  int64_t na = extent(g.offsetA, g.strideA, g.batch, g.rowsA(), g.colsA(), g.lda);
  int64_t nb = extent(g.offsetB, g.strideB, g.batch, g.rowsB(), g.colsB(), g.ldb);
  int64_t nd = extent(g.offsetC, g.strideC, g.batch, g.m, g.n, g.ldc);
  fa.resize(size_t(na));
  fb.resize(size_t(nb));
  fd.assign(size_t(nd), 0.0f);
  for (int64_t i = 0; i < na; ++i)
    fa[size_t(i)] = halfToFloat(t, a[i]);
  for (int64_t i = 0; i < nb; ++i)
    fb[size_t(i)] = halfToFloat(t, b[i]);
  runLtCalls(g, fa.data(), fb.data(), fd.data());
  for (int64_t c = 0; c < g.calls(); ++c)
    for (int64_t i = 0; i < g.batch; ++i)
      for (int64_t col = 0; col < g.n; ++col) {
        int64_t at = g.offsetC[size_t(c)] + i * g.strideC + col * g.ldc;
        for (int64_t r = 0; r < g.m; ++r)
          d[at + r] = floatToHalf(t, fd[size_t(at + r)]);
      }
}

/// runLtCalls() with TF32 operands (GemmParams::tf32): each operand element
/// rounded to TF32, products accumulated in float32.
void runLtCallsTf32(const gpu::LtGemm &g, const float *a, const float *b, float *d) {
  thread_local std::vector<float> ta, tb;
  int64_t na = extent(g.offsetA, g.strideA, g.batch, g.rowsA(), g.colsA(), g.lda);
  int64_t nb = extent(g.offsetB, g.strideB, g.batch, g.rowsB(), g.colsB(), g.ldb);
  ta.resize(size_t(na));
  tb.resize(size_t(nb));
  for (int64_t i = 0; i < na; ++i)
    ta[size_t(i)] = roundToTf32(a[i]);
  for (int64_t i = 0; i < nb; ++i)
    tb[size_t(i)] = roundToTf32(b[i]);
  runLtCalls(g, ta.data(), tb.data(), d);
}

class EmulatedDevice : public Device {
public:
  std::string describe() const override {
    return "cuda-emu (the CUDA emulator on the CPU: emulation, not a GPU)";
  }
  bool emulated() const override { return true; }

  Expected<DevicePtr> alloc(size_t bytes) override {
    void *p = std::aligned_alloc(256, (std::max<size_t>(bytes, 1) + 255) / 256 * 256);
    if (!p)
      return Status::error(fmt::format("the emulator cannot allocate {} bytes", bytes));
    return DevicePtr(reinterpret_cast<uintptr_t>(p));
  }
  void release(DevicePtr p) override { std::free(reinterpret_cast<void *>(uintptr_t(p))); }
  Expected<void *> allocHost(size_t bytes) override {
    void *p = std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64);
    if (!p)
      return Status::error(fmt::format("cannot allocate {} bytes of host memory", bytes));
    return p;
  }
  void releaseHost(void *p) override { std::free(p); }

  static void *host(DevicePtr p) { return reinterpret_cast<void *>(uintptr_t(p)); }
  Status upload(DevicePtr dst, const void *src, size_t n, Stream) override {
    std::memcpy(host(dst), src, n);
    return Status::ok();
  }
  Status download(void *dst, DevicePtr src, size_t n, Stream) override {
    std::memcpy(dst, host(src), n);
    return Status::ok();
  }
  Status copy(DevicePtr dst, DevicePtr src, size_t n, Stream) override {
    std::memmove(host(dst), host(src), n);
    return Status::ok();
  }
  Status fill(DevicePtr dst, uint8_t v, size_t n, Stream) override {
    std::memset(host(dst), v, n);
    return Status::ok();
  }

  Status loadKernels(const Package &pkg) override {
    emu::CompileOptions o;
    o.pastePrelude = false; // the artifact's source starts with the prelude
    auto m = emu::Module::compile(pkg.cudaSource, "kernels.cuda", o);
    if (!m)
      return m.status();
    module_.emplace(std::move(*m));
    return Status::ok();
  }
  Expected<int> function(const std::string &name) override {
    if (!module_)
      return Status::internal("the emulator has no kernels loaded");
    auto s = module_->shim(name);
    if (!s)
      return s.status();
    shims_.push_back(*s);
    names_.push_back(name);
    return int(shims_.size()) - 1;
  }
  Status launch(int f, const gpu::Launch &l, void **params, Stream) override {
    emu::LaunchOptions o;
    o.kernel = names_[size_t(f)];
    emu::Dim3 grid{unsigned(l.grid[0]), unsigned(l.grid[1]), unsigned(l.grid[2])};
    emu::Dim3 block{unsigned(l.block[0]), unsigned(l.block[1]), unsigned(l.block[2])};
    return emu::launch(shims_[size_t(f)], grid, block, size_t(l.sharedBytes), params, o);
  }
  Status gemm(const program::GemmParams &g, DevicePtr lhs, DevicePtr rhs, DevicePtr out,
              Stream, const Epilogue *epilogue) override {
    auto plan = gpu::planGemm(g, gemmPlan_);
    if (!plan)
      return plan.status();
    if (g.dtype == program::DType::F32 && (g.tf32 || allTf32_))
      runLtCallsTf32(*plan, static_cast<const float *>(host(rhs)),
                     static_cast<const float *>(host(lhs)), static_cast<float *>(host(out)));
    else if (g.dtype == program::DType::F32)
      runLtCalls(*plan, static_cast<const float *>(host(rhs)),
                 static_cast<const float *>(host(lhs)), static_cast<float *>(host(out)));
    else if (g.dtype == program::DType::F16 || g.dtype == program::DType::BF16)
      runLtCallsHalf(g.dtype, *plan, static_cast<const uint16_t *>(host(rhs)),
                     static_cast<const uint16_t *>(host(lhs)), static_cast<uint16_t *>(host(out)));
    else
      return Status::internal(fmt::format("the emulator's GEMMs are f32, f16 or bf16, not {}",
                                          program::dtypeName(g.dtype)));
    if (!epilogue)
      return Status::ok();
    float *o = static_cast<float *>(host(out)); // library epilogues: f32 only
    // cuBLASLt's epilogues, on the host: bias, then the pre-activation to
    // aux, then the activation (GELU with tanh, computed in float as the
    // library's kernels do).
    using Act = program::LtEpilogue::Activation;
    const float *bias = epilogue->bias ? static_cast<const float *>(host(epilogue->bias)) : nullptr;
    float *aux = epilogue->aux ? static_cast<float *>(host(epilogue->aux)) : nullptr;
    int64_t rows = g.batch * g.m;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < g.n; ++j) {
        float x = o[i * g.n + j] + (bias ? bias[j] : 0.0f);
        if (aux)
          aux[i * g.n + j] = x;
        if (epilogue->activation == Act::Relu)
          x = x > 0.0f ? x : (x == x ? 0.0f : x);
        else if (epilogue->activation == Act::GeluTanh)
          x = 0.5f * x * (1.0f + std::tanh(0.7978845608f * (x + 0.044715f * x * x * x)));
        o[i * g.n + j] = x;
      }
    return Status::ok();
  }

  Expected<int> createEvent() override {
    events_.push_back({});
    return int(events_.size()) - 1;
  }
  Status record(int e, Stream) override {
    events_[size_t(e)] = std::chrono::steady_clock::now();
    return Status::ok();
  }
  Status wait(Stream, int) override { return Status::ok(); }
  Status synchronize(int) override { return Status::ok(); }
  Expected<float> elapsed(int a, int b) override {
    return float(std::chrono::duration<double, std::milli>(events_[size_t(b)] - events_[size_t(a)])
                     .count());
  }
  Status synchronize() override { return Status::ok(); }

  gpu::GemmPlanForm gemmPlan_ = gpu::GemmPlanForm::Heads;
  bool allTf32_ = false; ///< KILN_CUDA_TF32=1

private:
  std::optional<emu::Module> module_;
  std::vector<emu::Shim> shims_;
  std::vector<std::string> names_;
  std::vector<std::chrono::steady_clock::time_point> events_;
};

} // namespace

Expected<std::unique_ptr<Device>> openEmulatedDevice() {
  auto form = gpu::gemmPlanFormFromEnv(); // KILN_GEMM_PLAN
  if (!form)
    return form.status();
  auto tf32 = gpu::allTf32FromEnv(); // KILN_CUDA_TF32
  if (!tf32)
    return tf32.status();
  auto device = std::make_unique<EmulatedDevice>();
  device->gemmPlan_ = *form;
  device->allTf32_ = *tf32;
  return std::unique_ptr<Device>(std::move(device));
}

} // namespace kiln::cuda
