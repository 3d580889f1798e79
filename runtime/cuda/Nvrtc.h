//===- Nvrtc.h - CUDA C++ to PTX and CUBIN through NVRTC --------*- C++ -*-===//
//
// The CUDA backend compiles its generated kernels at run time with NVRTC,
// which needs no driver and no GPU: a kernel module can be compiled (and its
// register use checked) on any machine with the toolkit's libnvrtc.
//
// One call compiles one translation unit for one target:
//   - "sm_XY" (a real architecture): PTX and a CUBIN for exactly that GPU;
//     ptxas runs, so the per-kernel resource report (registers, spills,
//     shared memory, stack) is available.
//   - "compute_XY" (a virtual architecture): PTX only, which the driver
//     JIT-compiles for any GPU of capability >= X.Y; no resource report.
//
// Half and bfloat16: NVRTC 13.0 has no built-in <cuda_fp16.h>/<cuda_bf16.h>
// ("could not open source file "cuda_fp16.h" (no directories in search
// list)"); the toolkit's include folder must be on the include path.
// cudaIncludeDir() finds it (see there) and compile() adds it.
//
// A failed compile returns an error holding the NVRTC log and the path where
// the source was written, so it can be read and recompiled by hand.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CUDA_NVRTC_H
#define KILN_RUNTIME_CUDA_NVRTC_H

#include "runtime/core/Status.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::cuda {

/// How to compile a module.
struct CompileOptions {
  /// "sm_80", "sm_90", ... (PTX + CUBIN) or "compute_80", ... (PTX only).
  std::string arch = "sm_80";
  /// --use_fast_math: approximate division, sqrt, exp and friends, flushes
  /// denormals. Off by default: Kiln's numerics tests assume IEEE results.
  bool fastMath = false;
  /// -lineinfo: source lines in the PTX/CUBIN for profilers and
  /// compute-sanitizer. No effect on the code.
  bool lineInfo = false;
  /// -default-device: functions without __host__/__device__ are device code.
  bool defaultDevice = true;
  /// Ask ptxas for its resource report (--ptxas-options=-v) and parse it into
  /// CompiledModule::resources. Real architectures only; costs nothing
  /// measurable.
  bool resourceUsage = true;
  /// Extra include folders, searched before the toolkit's.
  std::vector<std::string> includeDirs;
  /// Passed to NVRTC as given, after Kiln's own options ("-DN=4", ...).
  std::vector<std::string> extraOptions;
  /// Where a failing source is written. Empty: $TMPDIR (or /tmp), as
  /// kiln-nvrtc-<hash>.cu.
  std::string failureDir;
};

/// What ptxas reports for one entry function (a __global__ kernel).
struct KernelResources {
  std::string name;          ///< the symbol (mangled unless extern "C")
  int registers = 0;         ///< per thread
  int barriers = 0;          ///< named barriers used
  int64_t spillStores = 0;   ///< bytes stored to local memory by spills
  int64_t spillLoads = 0;    ///< bytes loaded back
  int64_t stackBytes = 0;    ///< stack frame (local arrays and spills)
  int64_t sharedBytes = 0;   ///< static shared memory ("smem")
  int64_t constantBytes = 0; ///< cmem[0]: kernel parameters and constants
  /// Read from the CUBIN (resourcesFromCubin), not ptxas's report: registers
  /// and stackBytes only; spills unknown (a stack frame may hide some).
  bool fromCubin = false;
  bool spills() const { return spillStores > 0 || spillLoads > 0; }
};

/// One compiled translation unit.
struct CompiledModule {
  std::string name; ///< as given to compile(), for messages
  std::string arch;
  std::string ptx;   ///< always present, NUL-free text
  std::string cubin; ///< ELF image; empty for compute_XY targets
  std::string log;   ///< NVRTC's log: warnings and the ptxas report
  std::vector<KernelResources> resources; ///< one per entry, in ptxas order
  double seconds = 0;                     ///< compile time

  /// What cuModuleLoadDataEx should load: the CUBIN when there is one, else
  /// the PTX (NUL-terminated, as std::string::c_str() gives it).
  const void *image() const {
    return cubin.empty() ? static_cast<const void *>(ptx.c_str())
                         : static_cast<const void *>(cubin.data());
  }
  /// The report for kernel `symbol`, or nullptr.
  const KernelResources *resourcesFor(const std::string &symbol) const;
};

/// Compiles `source` (one CUDA C++ translation unit) for options.arch.
/// `name` names it in messages and in NVRTC's log (e.g. "gpt.kernels.cu").
/// Always passes --std=c++17 and the toolkit's include folder.
Expected<CompiledModule> compile(const std::string &source,
                                 const std::string &name,
                                 const CompileOptions &options = {});

/// Registers and stack frame of every kernel in a CUBIN, from its ELF
/// .nv.info section (EIATTR_REGCOUNT 0x2f and EIATTR_FRAME_SIZE 0x11, each
/// {symbol index, value}): what compile() falls back on when NVRTC's log has
/// no ptxas report for a kernel (seen on the H200 machine with the same
/// NVRTC that reports here). Empty for anything that is not such an ELF.
std::vector<KernelResources> resourcesFromCubin(const std::string &cubin);

/// Parses ptxas's -v report (as it appears in NVRTC's log) into one entry per
/// "Compiling entry function"; non-entry (noinline device) functions are
/// skipped. Lines that are not part of the report are ignored.
std::vector<KernelResources> parseResourceUsage(const std::string &log);

/// NVRTC's version, "13.0": part of every kernel cache key.
std::string nvrtcVersion();

/// The real architectures this NVRTC can compile for, e.g. {75, 80, ..., 120}.
std::vector<int> supportedArchs();

/// The target to compile for a device of capability major.minor: "sm_XY"
/// when NVRTC supports it, otherwise PTX for the newest supported virtual
/// architecture below it ("compute_XY", JIT-compiled by the driver). Empty
/// when the device is older than every architecture NVRTC supports.
std::string targetFor(int major, int minor);

/// The folder holding cuda_fp16.h and cuda_bf16.h, or "" when none is found.
/// Searched in order: $KILN_CUDA_INCLUDE, $CUDA_PATH/include,
/// $CUDA_HOME/include, the toolkit Kiln was built with,
/// /usr/local/cuda/include. Looked up once per process.
const std::string &cudaIncludeDir();

/// A stable 64-bit FNV-1a hash, as 16 hex digits: kiln-nvrtc-<hash>.cu names
/// and cache keys.
std::string hashHex(const std::string &bytes);

} // namespace kiln::cuda

#endif // KILN_RUNTIME_CUDA_NVRTC_H
