//===- Device.h - A GPU as the CUDA executor sees it ------------*- C++ -*-===//
//
// The CUDA executor (Executor.h) runs a program's plan through this
// interface, so the same executor drives:
//   * a real GPU (openCudaDevice: the driver API loaded at run time, kernels
//     from the artifact's CUBIN or PTX, or compiled by NVRTC for the device's
//     architecture, GEMMs in cuBLASLt), and
//   * the CUDA emulator (openEmulatedDevice: "device" memory is host memory,
//     the artifact's CUDA source is compiled by the host compiler and run by
//     runtime/cuda/emu, GEMMs by the CPU's BLAS) — a test tool: every result
//     it gives is emulation, never a GPU's.
// No CUDA headers here: the executor builds without the toolkit.
//
// Two streams: Compute (kernels, GEMMs, device copies) and Copy (input
// uploads from pinned host memory); events order them.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CUDA_DEVICE_H
#define KILN_RUNTIME_CUDA_DEVICE_H

#include "runtime/core/GpuPlan.h"
#include "runtime/core/Package.h"
#include "runtime/core/Program.h"
#include "runtime/core/Status.h"

#include <cstdint>
#include <memory>
#include <string>

namespace kiln::cuda {

using DevicePtr = uint64_t;
enum class Stream { Compute, Copy };

class Device {
public:
  virtual ~Device() = default;
  /// "cuda:0 NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)".
  virtual std::string describe() const = 0;
  /// True for the emulator (messages and reports say so).
  virtual bool emulated() const = 0;

  virtual Expected<DevicePtr> alloc(size_t bytes) = 0;
  virtual void release(DevicePtr p) = 0;
  /// Page-locked host memory (uploads from it run asynchronously).
  virtual Expected<void *> allocHost(size_t bytes) = 0;
  virtual void releaseHost(void *p) = 0;

  virtual Status upload(DevicePtr dst, const void *src, size_t bytes, Stream s) = 0;
  virtual Status download(void *dst, DevicePtr src, size_t bytes, Stream s) = 0;
  virtual Status copy(DevicePtr dst, DevicePtr src, size_t bytes, Stream s) = 0;
  virtual Status fill(DevicePtr dst, uint8_t value, size_t bytes, Stream s) = 0;

  /// Loads the artifact's kernels; function(name) then resolves them.
  virtual Status loadKernels(const Package &pkg) = 0;
  /// A handle for a __global__ function of the loaded kernels.
  virtual Expected<int> function(const std::string &name) = 0;
  virtual Status launch(int function, const gpu::Launch &l, void **params, Stream s) = 0;
  /// A GEMM's library epilogue (program::LtEpilogue) with its buffers.
  struct Epilogue {
    program::LtEpilogue::Activation activation = program::LtEpilogue::Activation::None;
    DevicePtr bias = 0; ///< [n], or 0
    DevicePtr aux = 0;  ///< the pre-activation [batch * m, n], or 0
  };
  /// kiln.matmul on f32, f16 or bf16 buffers (the plan's GEMM step, g.dtype;
  /// float32 accumulation); with `epilogue` (f32 only),
  /// out = act(A B + bias) and aux = A B + bias instead.
  virtual Status gemm(const program::GemmParams &g, DevicePtr lhs, DevicePtr rhs, DevicePtr out,
                      Stream s, const Epilogue *epilogue = nullptr) = 0;

  /// Events: created once, recorded on a stream, waited for by a stream or
  /// the host; elapsed() is milliseconds between two completed events.
  virtual Expected<int> createEvent() = 0;
  virtual Status record(int event, Stream s) = 0;
  virtual Status wait(Stream s, int event) = 0;
  virtual Status synchronize(int event) = 0;
  virtual Expected<float> elapsed(int from, int to) = 0;
  virtual Status synchronize() = 0; ///< every stream
  /// The driver's handle of stream `s` (a CUstream), for libraries that
  /// enqueue on it (NCCL); nullptr where there is none (the emulator).
  virtual void *nativeStream(Stream s) {
    (void)s;
    return nullptr;
  }
};

/// Device `ordinal` through the driver (dlopen'ed: a clear error where there
/// is no driver or GPU). Built only with the CUDA toolkit. Both devices
/// split GEMMs into library calls as KILN_GEMM_PLAN says
/// (runtime/core/GemmPlan.h; an unknown value is an error here).
Expected<std::unique_ptr<Device>> openCudaDevice(int ordinal);
/// The CUDA emulator as a device (needs a host C++ compiler at run time).
Expected<std::unique_ptr<Device>> openEmulatedDevice();

} // namespace kiln::cuda

#endif // KILN_RUNTIME_CUDA_DEVICE_H
