//===- EmulatedDevice.cpp - The CUDA emulator as a Device -----------------===//
//
// Device memory is host memory; the artifact's CUDA source (the same text
// NVRTC compiles) is built by the host compiler and every launch runs in the
// emulator (runtime/cuda/emu) with CUDA's thread, barrier and warp rules;
// GEMMs run on the CPU's BLAS with kiln.matmul's semantics. Everything is
// synchronous: streams and events only order what already happened. This
// is for tests on machines without a GPU; its results are emulation.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/Device.h"
#include "runtime/cuda/emu/Module.h"
#include "runtime/cpu/Gemm.h"

#include <cmath>

#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

namespace kiln::cuda {

namespace {

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
    cpu::matmulTyped(g, host(lhs), host(rhs), host(out));
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

private:
  std::optional<emu::Module> module_;
  std::vector<emu::Shim> shims_;
  std::vector<std::string> names_;
  std::vector<std::chrono::steady_clock::time_point> events_;
};

} // namespace

Expected<std::unique_ptr<Device>> openEmulatedDevice() {
  return std::unique_ptr<Device>(new EmulatedDevice());
}

} // namespace kiln::cuda
