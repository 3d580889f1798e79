//===- CudaDevice.cpp - A real GPU through the driver API -----------------===//
//
// The driver is loaded at run time (Driver.h): a binary with this backend
// starts on a machine without one, and openCudaDevice() explains what is
// missing. Kernels come from the artifact: the CUBIN for the device's
// architecture when kilnc compiled one; else NVRTC compiles the CUDA source
// for it (cached on disk under the source hash, the architecture and NVRTC's
// version); else the driver JIT-compiles the closest PTX.
//
//===----------------------------------------------------------------------===//
#include "runtime/core/Files.h"
#include "runtime/cuda/Blas.h"
#include "runtime/cuda/Device.h"
#include "runtime/cuda/Driver.h"
#include "runtime/cuda/Nvrtc.h"

#include <fmt/format.h>

#include <cstdlib>
#include <fstream>
#include <sys/stat.h>
#include <unistd.h>

namespace kiln::cuda {

namespace {

std::string cacheDir() {
  if (const char *d = std::getenv("KILN_CACHE_DIR"))
    return std::string(d) + "/cuda";
  if (const char *x = std::getenv("XDG_CACHE_HOME"))
    return std::string(x) + "/kiln/cuda";
  if (const char *h = std::getenv("HOME"))
    return std::string(h) + "/.cache/kiln/cuda";
  return "/tmp/kiln-cuda-cache";
}

void writeFileAtomically(const std::string &path, const std::string &bytes) {
  std::string dir = path.substr(0, path.rfind('/'));
  for (size_t i = 1; i <= dir.size(); ++i)
    if (i == dir.size() || dir[i] == '/')
      ::mkdir(dir.substr(0, i).c_str(), 0755);
  std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary);
    out.write(bytes.data(), std::streamsize(bytes.size()));
    if (!out)
      return;
  }
  std::rename(tmp.c_str(), path.c_str());
}

class CudaDevice : public Device {
public:
  ~CudaDevice() override {
    if (!d_)
      return;
    (void)ctx_->makeCurrent();
    d_->cuCtxSynchronize();
    blas_.reset();
    for (CUevent e : events_)
      d_->cuEventDestroy(e);
    if (module_)
      d_->cuModuleUnload(module_);
    for (CUstream s : streams_)
      if (s)
        d_->cuStreamDestroy(s);
  }

  static Expected<std::unique_ptr<Device>> open(int ordinal) {
    auto form = gpu::gemmPlanFormFromEnv(); // KILN_GEMM_PLAN
    if (!form)
      return form.status();
    auto tf32 = gpu::allTf32FromEnv(); // KILN_CUDA_TF32
    if (!tf32)
      return tf32.status();
    auto driver = Driver::load();
    if (!driver)
      return driver.status();
    auto devices = listDevices(**driver);
    if (!devices)
      return devices.status();
    if (devices->empty())
      return Status::error("the NVIDIA driver reports no GPU; run on a machine with one, or "
                           "use --device cpu");
    if (ordinal < 0 || size_t(ordinal) >= devices->size())
      return Status::error(fmt::format("there is no GPU {} (this machine has {}: cuda:0..cuda:{})",
                                       ordinal, devices->size(), devices->size() - 1));
    auto ctx = PrimaryContext::retain(**driver, ordinal);
    if (!ctx)
      return ctx.status();
    std::unique_ptr<CudaDevice> dev(new CudaDevice());
    dev->d_ = *driver;
    dev->info_ = (*devices)[size_t(ordinal)];
    dev->ctx_.emplace(std::move(*ctx));
    const Driver &d = *dev->d_;
    for (CUstream &s : dev->streams_)
      KILN_CU_TRY(d, cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    auto blas = Blas::create(d);
    if (!blas)
      return blas.status();
    dev->blas_ = std::move(*blas);
    dev->gemmPlan_ = *form;
    dev->allTf32_ = *tf32;
    return std::unique_ptr<Device>(std::move(dev));
  }

  std::string describe() const override {
    return fmt::format("cuda:{} {} ({}, {} SMs, {:.1f} GiB, driver {})", info_.ordinal, info_.name,
                       archName(info_), info_.smCount, double(info_.totalMemory) / (1 << 30),
                       d_->versionString());
  }
  bool emulated() const override { return false; }

  CUstream stream(Stream s) const { return streams_[s == Stream::Compute ? 0 : 1]; }
  void *nativeStream(Stream s) override { return static_cast<void *>(stream(s)); }

  Expected<DevicePtr> alloc(size_t bytes) override {
    CUdeviceptr p = 0;
    if (Status s = KILN_CU_CHECK(*d_, cuMemAlloc(&p, std::max<size_t>(bytes, 1))); !s)
      return s;
    return DevicePtr(p);
  }
  void release(DevicePtr p) override { d_->cuMemFree(CUdeviceptr(p)); }
  Expected<void *> allocHost(size_t bytes) override {
    void *p = nullptr;
    if (Status s = KILN_CU_CHECK(*d_, cuMemHostAlloc(&p, std::max<size_t>(bytes, 1), 0)); !s)
      return s;
    return p;
  }
  void releaseHost(void *p) override { d_->cuMemFreeHost(p); }

  Status upload(DevicePtr dst, const void *src, size_t n, Stream s) override {
    return KILN_CU_CHECK(*d_, cuMemcpyHtoDAsync(CUdeviceptr(dst), src, n, stream(s)));
  }
  Status download(void *dst, DevicePtr src, size_t n, Stream s) override {
    return KILN_CU_CHECK(*d_, cuMemcpyDtoHAsync(dst, CUdeviceptr(src), n, stream(s)));
  }
  Status copy(DevicePtr dst, DevicePtr src, size_t n, Stream s) override {
    return KILN_CU_CHECK(*d_, cuMemcpyDtoDAsync(CUdeviceptr(dst), CUdeviceptr(src), n, stream(s)));
  }
  Status fill(DevicePtr dst, uint8_t v, size_t n, Stream s) override {
    return KILN_CU_CHECK(*d_, cuMemsetD8Async(CUdeviceptr(dst), v, n, stream(s)));
  }

  Status loadImage(const std::string &image, const std::string &what) {
    char log[8192] = {0};
    CUjit_option opts[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void *vals[] = {log, reinterpret_cast<void *>(uintptr_t(sizeof log))};
    CUresult r = d_->cuModuleLoadDataEx(&module_, image.data(), 2, opts, vals);
    if (r != CUDA_SUCCESS)
      return Status::error(fmt::format("loading the CUDA kernels ({}) on {} failed: {}{}{}", what,
                                       describe(), d_->describe(r), log[0] ? "\n" : "", log));
    how_ = what;
    return Status::ok();
  }

  Status loadKernels(const Package &pkg) override {
    std::string arch = archName(info_);
    if (auto it = pkg.cudaCubin.find(arch); it != pkg.cudaCubin.end())
      return loadImage(it->second, "the artifact's " + arch + " CUBIN");
    // Compile for this device with NVRTC, through the disk cache.
    std::string target = targetFor(info_.major, info_.minor);
    if (!target.empty()) {
      std::string key = hashHex(pkg.cudaSource + "|" + target + "|" + nvrtcVersion());
      std::string path = cacheDir() + "/" + key + (target.rfind("sm_", 0) == 0 ? ".cubin" : ".ptx");
      std::string image;
      if (readFile(path, image) && !image.empty())
        return loadImage(image, "NVRTC " + target + " from the cache " + path);
      CompileOptions o;
      o.arch = target;
      auto m = compile(pkg.cudaSource, pkg.path + ".cu", o);
      if (m) {
        image = m->cubin.empty() ? m->ptx + std::string(1, '\0') : m->cubin;
        writeFileAtomically(path, image);
        return loadImage(image, fmt::format("NVRTC {} compiled in {:.1f} s", target, m->seconds));
      }
      if (pkg.cudaPtx.empty())
        return m.status();
    }
    // The driver JIT-compiles the newest PTX it can take (by number:
    // sm_100 is newer than sm_90).
    const std::string *best = nullptr;
    int bestCc = -1;
    for (const auto &[name, ptx] : pkg.cudaPtx) {
      int cc = std::atoi(name.c_str() + 3);
      if (cc <= info_.major * 10 + info_.minor && cc > bestCc) {
        bestCc = cc;
        best = &name;
      }
    }
    if (best)
      return loadImage(pkg.cudaPtx.at(*best) + std::string(1, '\0'),
                       "the driver's JIT of " + *best + " PTX");
    return Status::error(fmt::format("{}: no CUDA kernels fit {} ({}); recompile with kilnc "
                                     "--target=cuda --cuda-arch={}",
                                     pkg.path, describe(), arch, arch));
  }
  Expected<int> function(const std::string &name) override {
    CUfunction f = nullptr;
    if (Status s = KILN_CU_CHECK(*d_, cuModuleGetFunction(&f, module_, name.c_str())); !s)
      return s;
    functions_.push_back(f);
    return int(functions_.size()) - 1;
  }
  Status launch(int f, const gpu::Launch &l, void **params, Stream s) override {
    return KILN_CU_CHECK(*d_, cuLaunchKernel(functions_[size_t(f)], unsigned(l.grid[0]),
                                             unsigned(l.grid[1]), unsigned(l.grid[2]),
                                             unsigned(l.block[0]), unsigned(l.block[1]),
                                             unsigned(l.block[2]), unsigned(l.sharedBytes),
                                             stream(s), params, nullptr));
  }
  Status gemm(const program::GemmParams &g, DevicePtr lhs, DevicePtr rhs, DevicePtr out,
              Stream s, const Epilogue *epilogue) override {
    MatmulOp op;
    op.shape = g;
    op.inputType = op.outputType = g.dtype; // f16/bf16: float32 accumulation
    op.plan = gemmPlan_;
    op.tf32 = g.tf32 || allTf32_; // CUBLAS_COMPUTE_32F_FAST_TF32
    MatmulArgs args;
    args.lhs = CUdeviceptr(lhs);
    args.rhs = CUdeviceptr(rhs);
    args.out = CUdeviceptr(out);
    if (epilogue) {
      using Act = program::LtEpilogue::Activation;
      op.bias = epilogue->bias != 0;
      args.bias = CUdeviceptr(epilogue->bias);
      if (epilogue->activation == Act::Relu) {
        op.activation = Activation::Relu;
      } else if (epilogue->activation == Act::GeluTanh) {
        op.activation = epilogue->aux ? Activation::GeluAux : Activation::Gelu;
        op.auxLd = g.n; // the plan's pre-activation is dense (n % 8 == 0)
        args.aux = CUdeviceptr(epilogue->aux);
      } else if (epilogue->aux) {
        return Status::internal("a library epilogue with a pre-activation but no GELU");
      }
    }
    return blas_->matmul(op, args, stream(s));
  }

  Expected<int> createEvent() override {
    CUevent e = nullptr;
    if (Status s = KILN_CU_CHECK(*d_, cuEventCreate(&e, CU_EVENT_DEFAULT)); !s)
      return s;
    events_.push_back(e);
    return int(events_.size()) - 1;
  }
  Status record(int e, Stream s) override {
    return KILN_CU_CHECK(*d_, cuEventRecord(events_[size_t(e)], stream(s)));
  }
  Status wait(Stream s, int e) override {
    return KILN_CU_CHECK(*d_, cuStreamWaitEvent(stream(s), events_[size_t(e)], 0));
  }
  Status synchronize(int e) override {
    return KILN_CU_CHECK(*d_, cuEventSynchronize(events_[size_t(e)]));
  }
  Expected<float> elapsed(int a, int b) override {
    float ms = 0;
    if (Status s = KILN_CU_CHECK(*d_, cuEventElapsedTime(&ms, events_[size_t(a)], events_[size_t(b)]));
        !s)
      return s;
    return ms;
  }
  Status synchronize() override {
    for (CUstream s : streams_)
      KILN_CU_TRY(*d_, cuStreamSynchronize(s));
    return Status::ok();
  }

private:
  CudaDevice() = default;
  const Driver *d_ = nullptr;
  DeviceInfo info_;
  std::optional<PrimaryContext> ctx_;
  CUstream streams_[2] = {nullptr, nullptr};
  std::unique_ptr<Blas> blas_;
  gpu::GemmPlanForm gemmPlan_ = gpu::GemmPlanForm::Heads;
  bool allTf32_ = false; ///< KILN_CUDA_TF32=1
  CUmodule module_ = nullptr;
  std::string how_;
  std::vector<CUfunction> functions_;
  std::vector<CUevent> events_;
};

} // namespace

Expected<std::unique_ptr<Device>> openCudaDevice(int ordinal) { return CudaDevice::open(ordinal); }

} // namespace kiln::cuda
