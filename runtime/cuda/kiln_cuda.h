//===- kiln_cuda.h - Prelude of every generated CUDA C++ kernel -*- C++ -*-===//
//
// Kiln's CUDA emitter pastes this text at the top of every translation unit
// it generates (it is self-contained: no includes beyond the CUDA and C++
// standard headers). The same kernel source then compiles two ways:
//
//  * as CUDA C++ under NVRTC or nvcc (`__CUDACC_RTC__` / `__CUDACC__`): the
//    prelude includes <cuda_fp16.h> and <cuda_bf16.h> (NVRTC 13 needs
//    `-I<cuda>/include` for them) and adds Kiln's helpers;
//  * as C++17 for the host compiler, for the CUDA EMULATOR
//    (runtime/cuda/emu): the prelude then defines what CUDA provides
//    (qualifiers, threadIdx/blockIdx/blockDim/gridDim, __syncthreads, warp
//    primitives, atomics, __half/__nv_bfloat16, vector types, intrinsics) on
//    top of a small C ABI the emulator implements. Emulation runs on the CPU,
//    one cooperatively scheduled fiber per CUDA thread; it is a test tool and
//    never a GPU.
//
// Conventions for generated (and handwritten) kernels:
//
//  * `KILN_KERNEL void name(params...)` declares a kernel (`extern "C"
//    __global__`, so the symbol is the plain name).
//  * After each kernel, `KILN_EMU_SHIM(name);` emits the emulator's entry
//    point (nothing under CUDA). Under emulation it defines
//        extern "C" void name__emu(KilnEmuThread *self, void **params);
//    which unpacks `params` exactly like cuLaunchKernel's kernelParams (entry
//    i points at the value of parameter i) and calls the kernel for one
//    emulated thread. The emulator calls it once per CUDA thread.
//  * `KILN_DYNAMIC_SHARED(type, name);` inside a kernel body declares `type
//    *const name` pointing at the block's dynamic shared memory (the size is
//    the launch's dynamicSharedBytes; 16-byte aligned). Several kernels in
//    one TU may use it with different types.
//  * Static shared memory is plain CUDA: `__shared__ float partial[32];`
//    (emulation: `static thread_local`; one OS thread runs one block at a
//    time, so the variable is per block; like CUDA it is not initialised).
//  * `__forceinline__` already means `inline` (as in CUDA): write
//    `__device__ __forceinline__ float f(...)`, never `inline __forceinline__`.
//  * KILN_CUDA_EMULATION is 1 under emulation and 0 under CUDA.
//  * Kiln's helpers (both modes, at the end): kiln_lane/kiln_warp,
//    kiln_to_float/kiln_from_float<T> for float/__half/__nv_bfloat16,
//    kiln_warp_sum/max (full-warp butterflies) and kiln_block_sum/max.
//
// Emulation in practice: runtime/cuda/emu/Module.h compiles a source (it
// pastes this text first; a second copy is empty thanks to the guards) and
// returns each kernel's shim; runtime/cuda/emu/Emulator.h launches it. The
// header can also be included (or -include'd) into an ordinary host TU,
// after the other headers, and `name__emu` passed to emu::launch directly.
// Under emulation the primitives capture their call site through
// __builtin_LINE (and __builtin_COLUMN where the compiler has it): that is
// how "the same primitive" is told apart from a diverged one.
//
// Emulation semantics (enforced by runtime/cuda/emu/Emulator.cpp):
//  * warps are 32 consecutive linear thread ids (x fastest);
//  * __syncthreads waits for every thread of the block that has not exited;
//    in strict mode (the default) a barrier that some threads reach while
//    others have exited, or that threads reach from different source lines,
//    is reported as an error (undefined in CUDA C++);
//  * a warp primitive waits for the lanes named in its mask, which must reach
//    the same primitive on the same source line with the same mask; a lane in
//    the mask that has exited (or does not exist in a partial warp) is
//    reported, and a schedule where no thread can proceed is reported as a
//    deadlock naming every thread's state — never a hang;
//  * a shuffle reading a lane that does not take part returns a NaN-pattern
//    poison value; width must be a power of two <= 32; the lane arithmetic is
//    PTX's shfl.sync;
//  * __expf/__logf/__fdividef and friends are the accurate libm functions;
//    float->half/bfloat16 conversions round to nearest even exactly, NaN
//    becomes the canonical NaN 0x7fff, half->float NaN becomes 0x7fffffff
//    (as CUDA's own host code);
//  * a stack overflow (default 64 KiB per emulated thread) faults on a guard
//    page and is reported with the kernel and thread before the process dies.
//
//===----------------------------------------------------------------------===//

//===----------------------------------------------------------------------===//
// The emulator's C ABI (host only). runtime/cuda/emu includes this part alone
// by defining KILN_EMU_ABI_ONLY; bump KILN_EMU_ABI_VERSION on any change.
//===----------------------------------------------------------------------===//
#if !defined(__CUDACC_RTC__) && !defined(__CUDACC__) && !defined(KILN_EMU_ABI_H)
#define KILN_EMU_ABI_H

#define KILN_EMU_ABI_VERSION 1

extern "C" {

/// Three unsigned coordinates: the emulator's uint3/dim3.
struct KilnEmuDim {
  unsigned x, y, z;
};

/// Kinds of block barriers (KilnEmuHooks::barrier).
enum KilnEmuBarrierKind {
  KILN_EMU_SYNCTHREADS = 0,
  KILN_EMU_SYNCTHREADS_COUNT = 1,
  KILN_EMU_SYNCTHREADS_AND = 2,
  KILN_EMU_SYNCTHREADS_OR = 3,
};

/// Kinds of warp primitives (KilnEmuWarpOp::kind).
enum KilnEmuWarpKind {
  KILN_EMU_SHFL_IDX = 0,
  KILN_EMU_SHFL_UP = 1,
  KILN_EMU_SHFL_DOWN = 2,
  KILN_EMU_SHFL_XOR = 3,
  KILN_EMU_BALLOT = 4,
  KILN_EMU_ANY = 5,
  KILN_EMU_ALL = 6,
  KILN_EMU_SYNCWARP = 7,
  KILN_EMU_ACTIVEMASK = 8,
  KILN_EMU_REDUCE_ADD = 9, ///< unsigned sum
  KILN_EMU_REDUCE_MIN_U = 10,
  KILN_EMU_REDUCE_MAX_U = 11,
  KILN_EMU_REDUCE_MIN_I = 12,
  KILN_EMU_REDUCE_MAX_I = 13,
  KILN_EMU_REDUCE_AND = 14,
  KILN_EMU_REDUCE_OR = 15,
  KILN_EMU_REDUCE_XOR = 16,
};

/// One lane's part in a warp primitive.
struct KilnEmuWarpOp {
  int kind;                 ///< KilnEmuWarpKind
  unsigned mask;            ///< the lanes that take part
  unsigned long long value; ///< the lane's value (low `bytes` bytes)
  int arg;                  ///< source lane, delta or lane mask
  int width;                ///< shuffle segment width
  int bytes;                ///< size of the value's type
  int line, column; ///< call site in the kernel source (column 0: unknown)
};

struct KilnEmuThread;

/// Services the emulator provides to kernel code. `trap` stays first forever
/// so that an ABI mismatch can still be reported.
struct KilnEmuHooks {
  void (*trap)(struct KilnEmuThread *self, const char *what, int line);
  int (*barrier)(struct KilnEmuThread *self, int kind, int predicate, int line,
                 int column);
  unsigned long long (*warp)(struct KilnEmuThread *self,
                             const struct KilnEmuWarpOp *op);
};

/// The builtin state of one emulated CUDA thread (owned by the emulator).
struct KilnEmuThread {
  struct KilnEmuDim threadIdx, blockIdx, blockDim, gridDim;
  void *dynamicShared;
  unsigned long long dynamicSharedBytes;
  const struct KilnEmuHooks *hooks;
  unsigned abiVersion; ///< KILN_EMU_ABI_VERSION of the emulator
};

/// The entry point KILN_EMU_SHIM(name) defines: `name__emu`.
typedef void (*KilnEmuShim)(struct KilnEmuThread *self, void **params);

} // extern "C"

#endif // KILN_EMU_ABI_H

#if !defined(KILN_EMU_ABI_ONLY) && !defined(KILN_CUDA_PRELUDE_H)
#define KILN_CUDA_PRELUDE_H
#define KILN_CUDA_PRELUDE_VERSION 1

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
//===----------------------------------------------------------------------===//
// CUDA (NVRTC, nvcc)
//===----------------------------------------------------------------------===//
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define KILN_CUDA_EMULATION 0
#define KILN_KERNEL extern "C" __global__
/// A kernel's launch bounds: the block size it is launched with, or, when
/// the artifact was compiled with a register cap (kilnc
/// --cuda-maxrregcount), that cap (launch bounds would override it).
#ifdef KILN_MAX_REGISTERS
#define KILN_BOUNDS(block) __maxnreg__(KILN_MAX_REGISTERS)
#else
#define KILN_BOUNDS(block) __launch_bounds__(block)
#endif
#define KILN_EMU_SHIM(name) static_assert(true, "no emulator shim under CUDA")
#define KILN_DYNAMIC_SHARED(type, name)                                        \
  extern __shared__ __align__(16) unsigned char kiln_dynamic_shared_[];        \
  type *const name = reinterpret_cast<type *>(kiln_dynamic_shared_)

#else
//===----------------------------------------------------------------------===//
// Host emulation: what CUDA provides, for the host C++ compiler.
//===----------------------------------------------------------------------===//
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <type_traits>
#include <utility>

#define KILN_CUDA_EMULATION 1

// Qualifiers (defined after the standard headers, which may use the names).
#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define __maxnreg__(...)
#define KILN_BOUNDS(block)
#define __shared__ static thread_local
// __restrict__ is a GNU keyword already.

#if defined(__has_builtin)
#if __has_builtin(__builtin_COLUMN)
#define KILN_EMU_COLUMN __builtin_COLUMN()
#endif
#endif
#ifndef KILN_EMU_COLUMN
#define KILN_EMU_COLUMN 0
#endif
/// Trailing parameters that capture a primitive's call site.
#define KILN_EMU_SITE                                                          \
  int kiln_line = __builtin_LINE(), int kiln_col = KILN_EMU_COLUMN

/// The emulated thread now running on this OS thread: set by the shim,
/// restored after every call that lets other emulated threads run.
static thread_local KilnEmuThread *kiln_emu_self_ = nullptr;

// Builtin variables (read-only, like CUDA's).
typedef KilnEmuDim uint3;
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x = 1, unsigned y = 1, unsigned z = 1)
      : x(x), y(y), z(z) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};
#define threadIdx (static_cast<const uint3 &>(kiln_emu_self_->threadIdx))
#define blockIdx (static_cast<const uint3 &>(kiln_emu_self_->blockIdx))
#define blockDim (static_cast<const uint3 &>(kiln_emu_self_->blockDim))
#define gridDim (static_cast<const uint3 &>(kiln_emu_self_->gridDim))
static constexpr int warpSize = 32;
#define KILN_DYNAMIC_SHARED(type, name)                                        \
  type *const name = reinterpret_cast<type *>(kiln_emu_self_->dynamicShared)

#define KILN_KERNEL extern "C" __global__

namespace kiln_emu_detail {

template <typename... Args, size_t... I>
inline void invoke(void (*kernel)(Args...), void **params,
                   std::index_sequence<I...>) {
  kernel(*static_cast<std::remove_cv_t<Args> *>(params[I])...);
}

/// Runs `kernel` for the emulated thread `self` (the body of every shim).
template <typename... Args>
inline void enter(void (*kernel)(Args...), KilnEmuThread *self, void **params) {
  kiln_emu_self_ = self;
  if (self->abiVersion != KILN_EMU_ABI_VERSION) {
    self->hooks->trap(self,
                      "kernel compiled against a different emulator ABI "
                      "(kiln_cuda.h and the emulator library disagree)",
                      0);
    return;
  }
  invoke(kernel, params, std::index_sequence_for<Args...>{});
}

template <typename T> inline unsigned long long toBits(T v) {
  static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8,
                "warp primitives exchange trivially copyable values of at "
                "most 8 bytes");
  unsigned long long bits = 0;
  memcpy(&bits, &v, sizeof(T));
  return bits;
}

template <typename T> inline T fromBits(unsigned long long bits) {
  T v;
  memcpy(&v, &bits, sizeof(T));
  return v;
}

inline unsigned long long warp(int kind, unsigned mask,
                               unsigned long long value, int bytes, int arg,
                               int width, int line, int col) {
  KilnEmuWarpOp op;
  op.kind = kind;
  op.mask = mask;
  op.value = value;
  op.arg = arg;
  op.width = width;
  op.bytes = bytes;
  op.line = line;
  op.column = col;
  KilnEmuThread *self = kiln_emu_self_;
  unsigned long long result = self->hooks->warp(self, &op);
  kiln_emu_self_ = self;
  return result;
}

template <typename T>
inline T shuffle(int kind, unsigned mask, T var, int arg, int width, int line,
                 int col) {
  return fromBits<T>(
      warp(kind, mask, toBits(var), int(sizeof(T)), arg, width, line, col));
}

inline int barrier(int kind, int predicate, int line, int col) {
  KilnEmuThread *self = kiln_emu_self_;
  int result = self->hooks->barrier(self, kind, predicate, line, col);
  kiln_emu_self_ = self;
  return result;
}

} // namespace kiln_emu_detail

/// Emits `extern "C" void name__emu(KilnEmuThread *, void **)`.
#define KILN_EMU_SHIM(name)                                                    \
  extern "C" __attribute__((visibility("default"))) void name##__emu(          \
      KilnEmuThread *kiln_self, void **kiln_params) {                          \
    kiln_emu_detail::enter(name, kiln_self, kiln_params);                      \
  }                                                                            \
  static_assert(true, "emulator shim of " #name)

//===--- Synchronisation --------------------------------------------------===//

static inline void __syncthreads(KILN_EMU_SITE) {
  kiln_emu_detail::barrier(KILN_EMU_SYNCTHREADS, 0, kiln_line, kiln_col);
}
static inline int __syncthreads_count(int predicate, KILN_EMU_SITE) {
  return kiln_emu_detail::barrier(KILN_EMU_SYNCTHREADS_COUNT, predicate != 0,
                                  kiln_line, kiln_col);
}
static inline int __syncthreads_and(int predicate, KILN_EMU_SITE) {
  return kiln_emu_detail::barrier(KILN_EMU_SYNCTHREADS_AND, predicate != 0,
                                  kiln_line, kiln_col);
}
static inline int __syncthreads_or(int predicate, KILN_EMU_SITE) {
  return kiln_emu_detail::barrier(KILN_EMU_SYNCTHREADS_OR, predicate != 0,
                                  kiln_line, kiln_col);
}
static inline void __syncwarp(unsigned mask = 0xffffffffu, KILN_EMU_SITE) {
  kiln_emu_detail::warp(KILN_EMU_SYNCWARP, mask, 0, 0, 0, 32, kiln_line,
                        kiln_col);
}
static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_block() {
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}
static inline void __trap(KILN_EMU_SITE) {
  kiln_emu_self_->hooks->trap(kiln_emu_self_, "__trap() called", kiln_line);
}

//===--- Warp primitives --------------------------------------------------===//

template <typename T>
static inline T __shfl_sync(unsigned mask, T var, int srcLane, int width = 32,
                            KILN_EMU_SITE) {
  return kiln_emu_detail::shuffle(KILN_EMU_SHFL_IDX, mask, var, srcLane, width,
                                  kiln_line, kiln_col);
}
template <typename T>
static inline T __shfl_up_sync(unsigned mask, T var, unsigned delta,
                               int width = 32, KILN_EMU_SITE) {
  return kiln_emu_detail::shuffle(KILN_EMU_SHFL_UP, mask, var, int(delta),
                                  width, kiln_line, kiln_col);
}
template <typename T>
static inline T __shfl_down_sync(unsigned mask, T var, unsigned delta,
                                 int width = 32, KILN_EMU_SITE) {
  return kiln_emu_detail::shuffle(KILN_EMU_SHFL_DOWN, mask, var, int(delta),
                                  width, kiln_line, kiln_col);
}
template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T var, int laneMask,
                                int width = 32, KILN_EMU_SITE) {
  return kiln_emu_detail::shuffle(KILN_EMU_SHFL_XOR, mask, var, laneMask, width,
                                  kiln_line, kiln_col);
}
static inline unsigned __ballot_sync(unsigned mask, int predicate,
                                     KILN_EMU_SITE) {
  return unsigned(kiln_emu_detail::warp(KILN_EMU_BALLOT, mask, predicate != 0,
                                        4, 0, 32, kiln_line, kiln_col));
}
static inline int __any_sync(unsigned mask, int predicate, KILN_EMU_SITE) {
  return int(kiln_emu_detail::warp(KILN_EMU_ANY, mask, predicate != 0, 4, 0, 32,
                                   kiln_line, kiln_col));
}
static inline int __all_sync(unsigned mask, int predicate, KILN_EMU_SITE) {
  return int(kiln_emu_detail::warp(KILN_EMU_ALL, mask, predicate != 0, 4, 0, 32,
                                   kiln_line, kiln_col));
}
/// The lanes of this warp that reach the same __activemask() call together
/// (the emulator resolves it once every lane of the block is blocked).
static inline unsigned __activemask(KILN_EMU_SITE) {
  return unsigned(kiln_emu_detail::warp(KILN_EMU_ACTIVEMASK, 0, 0, 4, 0, 32,
                                        kiln_line, kiln_col));
}
static inline unsigned __reduce_add_sync(unsigned mask, unsigned value,
                                         KILN_EMU_SITE) {
  return unsigned(kiln_emu_detail::warp(KILN_EMU_REDUCE_ADD, mask, value, 4, 0,
                                        32, kiln_line, kiln_col));
}
static inline unsigned __reduce_min_sync(unsigned mask, unsigned value,
                                         KILN_EMU_SITE) {
  return unsigned(kiln_emu_detail::warp(KILN_EMU_REDUCE_MIN_U, mask, value, 4,
                                        0, 32, kiln_line, kiln_col));
}
static inline unsigned __reduce_max_sync(unsigned mask, unsigned value,
                                         KILN_EMU_SITE) {
  return unsigned(kiln_emu_detail::warp(KILN_EMU_REDUCE_MAX_U, mask, value, 4,
                                        0, 32, kiln_line, kiln_col));
}
static inline int __reduce_min_sync(unsigned mask, int value, KILN_EMU_SITE) {
  return int(kiln_emu_detail::warp(KILN_EMU_REDUCE_MIN_I, mask,
                                   kiln_emu_detail::toBits(value), 4, 0, 32,
                                   kiln_line, kiln_col));
}
static inline int __reduce_max_sync(unsigned mask, int value, KILN_EMU_SITE) {
  return int(kiln_emu_detail::warp(KILN_EMU_REDUCE_MAX_I, mask,
                                   kiln_emu_detail::toBits(value), 4, 0, 32,
                                   kiln_line, kiln_col));
}
static inline unsigned __reduce_and_sync(unsigned mask, unsigned value,
                                         KILN_EMU_SITE) {
  return unsigned(kiln_emu_detail::warp(KILN_EMU_REDUCE_AND, mask, value, 4, 0,
                                        32, kiln_line, kiln_col));
}
static inline unsigned __reduce_or_sync(unsigned mask, unsigned value,
                                        KILN_EMU_SITE) {
  return unsigned(kiln_emu_detail::warp(KILN_EMU_REDUCE_OR, mask, value, 4, 0,
                                        32, kiln_line, kiln_col));
}
static inline unsigned __reduce_xor_sync(unsigned mask, unsigned value,
                                         KILN_EMU_SITE) {
  return unsigned(kiln_emu_detail::warp(KILN_EMU_REDUCE_XOR, mask, value, 4, 0,
                                        32, kiln_line, kiln_col));
}

//===--- Atomics (real atomics: blocks may run on several OS threads) -----===//

template <typename T> static inline T kiln_emu_atomic_add_fp(T *address, T v) {
  T old;
  __atomic_load(address, &old, __ATOMIC_RELAXED);
  T desired;
  do {
    desired = old + v;
  } while (!__atomic_compare_exchange(address, &old, &desired, true,
                                      __ATOMIC_RELAXED, __ATOMIC_RELAXED));
  return old;
}
static inline float atomicAdd(float *address, float v) {
  return kiln_emu_atomic_add_fp(address, v);
}
static inline double atomicAdd(double *address, double v) {
  return kiln_emu_atomic_add_fp(address, v);
}
static inline int atomicAdd(int *address, int v) {
  return __atomic_fetch_add(address, v, __ATOMIC_RELAXED);
}
static inline unsigned atomicAdd(unsigned *address, unsigned v) {
  return __atomic_fetch_add(address, v, __ATOMIC_RELAXED);
}
static inline unsigned long long atomicAdd(unsigned long long *address,
                                           unsigned long long v) {
  return __atomic_fetch_add(address, v, __ATOMIC_RELAXED);
}
static inline int atomicSub(int *address, int v) {
  return __atomic_fetch_sub(address, v, __ATOMIC_RELAXED);
}
static inline unsigned atomicSub(unsigned *address, unsigned v) {
  return __atomic_fetch_sub(address, v, __ATOMIC_RELAXED);
}
template <typename T>
static inline T kiln_emu_atomic_minmax(T *a, T v, bool mx) {
  T old = __atomic_load_n(a, __ATOMIC_RELAXED);
  while ((mx ? v > old : v < old) &&
         !__atomic_compare_exchange_n(a, &old, v, true, __ATOMIC_RELAXED,
                                      __ATOMIC_RELAXED)) {
  }
  return old;
}
static inline int atomicMax(int *a, int v) {
  return kiln_emu_atomic_minmax(a, v, true);
}
static inline int atomicMin(int *a, int v) {
  return kiln_emu_atomic_minmax(a, v, false);
}
static inline unsigned atomicMax(unsigned *a, unsigned v) {
  return kiln_emu_atomic_minmax(a, v, true);
}
static inline unsigned atomicMin(unsigned *a, unsigned v) {
  return kiln_emu_atomic_minmax(a, v, false);
}
static inline int atomicExch(int *a, int v) {
  return __atomic_exchange_n(a, v, __ATOMIC_RELAXED);
}
static inline unsigned atomicExch(unsigned *a, unsigned v) {
  return __atomic_exchange_n(a, v, __ATOMIC_RELAXED);
}
static inline float atomicExch(float *a, float v) {
  float old;
  __atomic_exchange(a, &v, &old, __ATOMIC_RELAXED);
  return old;
}
template <typename T>
static inline T kiln_emu_atomic_cas(T *a, T compare, T v) {
  __atomic_compare_exchange_n(a, &compare, v, false, __ATOMIC_RELAXED,
                              __ATOMIC_RELAXED);
  return compare; // the old value in both cases
}
static inline int atomicCAS(int *a, int compare, int v) {
  return kiln_emu_atomic_cas(a, compare, v);
}
static inline unsigned atomicCAS(unsigned *a, unsigned compare, unsigned v) {
  return kiln_emu_atomic_cas(a, compare, v);
}
static inline unsigned long long atomicCAS(unsigned long long *a,
                                           unsigned long long compare,
                                           unsigned long long v) {
  return kiln_emu_atomic_cas(a, compare, v);
}

//===--- Loads, bit casts, integer intrinsics -----------------------------===//

template <typename T> static inline T __ldg(const T *p) { return *p; }

static inline int __float_as_int(float x) {
  return kiln_emu_detail::fromBits<int>(kiln_emu_detail::toBits(x));
}
static inline unsigned __float_as_uint(float x) {
  return kiln_emu_detail::fromBits<unsigned>(kiln_emu_detail::toBits(x));
}
static inline float __int_as_float(int x) {
  return kiln_emu_detail::fromBits<float>(kiln_emu_detail::toBits(x));
}
static inline float __uint_as_float(unsigned x) {
  return kiln_emu_detail::fromBits<float>(kiln_emu_detail::toBits(x));
}
static inline long long __double_as_longlong(double x) {
  return kiln_emu_detail::fromBits<long long>(kiln_emu_detail::toBits(x));
}
static inline double __longlong_as_double(long long x) {
  return kiln_emu_detail::fromBits<double>(kiln_emu_detail::toBits(x));
}

static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) {
  return __builtin_popcountll(x);
}
static inline int __clz(int x) {
  return x == 0 ? 32 : __builtin_clz(unsigned(x));
}
static inline int __clzll(long long x) {
  return x == 0 ? 64 : __builtin_clzll((unsigned long long)x);
}
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline unsigned __brev(unsigned x) {
  unsigned r = 0;
  for (int i = 0; i < 32; ++i, x >>= 1)
    r = (r << 1) | (x & 1u);
  return r;
}
static inline unsigned __umulhi(unsigned a, unsigned b) {
  return unsigned((unsigned long long)a * b >> 32);
}

//===--- Math
//---------------------------------------------------------------===//
// <math.h> provides expf, logf, erff, tanhf, sqrtf, fmaxf, fminf, fmaf, ...
// CUDA's fast intrinsics are the accurate functions here: compare with a
// tolerance that covers the GPU's approximations.

static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
// glibc declares its own __expf, __logf, ... : rename CUDA's.
static inline float kiln_emu_expf(float x) { return expf(x); }
static inline float kiln_emu_exp10f(float x) { return powf(10.0f, x); }
static inline float kiln_emu_logf(float x) { return logf(x); }
static inline float kiln_emu_log2f(float x) { return log2f(x); }
static inline float kiln_emu_log10f(float x) { return log10f(x); }
static inline float kiln_emu_sinf(float x) { return sinf(x); }
static inline float kiln_emu_cosf(float x) { return cosf(x); }
static inline float kiln_emu_tanf(float x) { return tanf(x); }
static inline float kiln_emu_powf(float x, float y) { return powf(x, y); }
#define __expf kiln_emu_expf
#define __exp10f kiln_emu_exp10f
#define __logf kiln_emu_logf
#define __log2f kiln_emu_log2f
#define __log10f kiln_emu_log10f
#define __sinf kiln_emu_sinf
#define __cosf kiln_emu_cosf
#define __tanf kiln_emu_tanf
#define __powf kiln_emu_powf
static inline float __fdividef(float x, float y) { return x / y; }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __fsqrt_rn(float x) { return sqrtf(x); }
static inline float __fmaf_rn(float a, float b, float c) {
  return fmaf(a, b, c);
}
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __saturatef(float x) {
  return x >= 1.0f ? 1.0f : (x > 0.0f ? x : 0.0f); // NaN -> 0
}
static inline float normcdff(float x) {
  return 0.5f * erfcf(-x * 0.70710678118654752f);
}
static inline int __float2int_rn(float x) { return int(nearbyintf(x)); }
static inline int __float2int_rz(float x) { return int(x); }

static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long min(long a, long b) { return a < b ? a : b; }
static inline long max(long a, long b) { return a > b ? a : b; }
static inline unsigned long min(unsigned long a, unsigned long b) {
  return a < b ? a : b;
}
static inline unsigned long max(unsigned long a, unsigned long b) {
  return a > b ? a : b;
}
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline unsigned long long min(unsigned long long a,
                                     unsigned long long b) {
  return a < b ? a : b;
}
static inline unsigned long long max(unsigned long long a,
                                     unsigned long long b) {
  return a > b ? a : b;
}
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }

//===--- Vector types
//-------------------------------------------------------===//

struct __align__(8) float2 {
  float x, y;
};
struct float3 {
  float x, y, z;
};
struct __align__(16) float4 {
  float x, y, z, w;
};
struct __align__(16) double2 {
  double x, y;
};
struct __align__(8) int2 {
  int x, y;
};
struct __align__(16) int4 {
  int x, y, z, w;
};
struct __align__(8) uint2 {
  unsigned x, y;
};
struct __align__(16) uint4 {
  unsigned x, y, z, w;
};
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
static inline float3 make_float3(float x, float y, float z) {
  return float3{x, y, z};
}
static inline float4 make_float4(float x, float y, float z, float w) {
  return float4{x, y, z, w};
}
static inline double2 make_double2(double x, double y) { return double2{x, y}; }
static inline int2 make_int2(int x, int y) { return int2{x, y}; }
static inline int4 make_int4(int x, int y, int z, int w) {
  return int4{x, y, z, w};
}
static inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
  return uint4{x, y, z, w};
}
static inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) {
  return uint3{x, y, z};
}

//===--- __half and __nv_bfloat16 -----------------------------------------===//
// 16-bit storage types; arithmetic happens in float (convert explicitly or
// through the implicit float conversions CUDA also has).

namespace kiln_emu_detail {

/// float -> binary16, round to nearest even; NaN -> 0x7fff.
inline unsigned short floatToHalfBits(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t u = x & 0x7fffffffu;
  if (u > 0x7f800000u)
    return 0x7fff;
  if (u >= 0x477ff000u) // >= 65520 (the tie above 65504 rounds to even: inf)
    return (unsigned short)(sign | 0x7c00u);
  if (u < 0x38800000u) {  // below 2^-14: a subnormal half or zero
    if (u <= 0x33000000u) // <= 2^-25: the tie at 2^-25 rounds to even (zero)
      return (unsigned short)sign;
    uint32_t exponent = u >> 23; // 102..112
    uint32_t mantissa = (u & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exponent; // 14..24
    uint32_t m = mantissa >> shift;
    uint32_t rest = mantissa & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (m & 1u)))
      ++m; // 0x400 is the smallest normal: the encoding carries into it
    return (unsigned short)(sign | m);
  }
  uint32_t h = (u >> 13) - (112u << 10); // rebias the exponent 127 -> 15
  uint32_t rest = u & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
    ++h;
  return (unsigned short)(sign | h);
}

/// binary16 -> float, exact; NaN -> 0x7fffffff.
inline float halfBitsToFloat(unsigned short h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = mantissa ? 0x7fffffffu : (sign | 0x7f800000u);
  } else if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {
      uint32_t e = 113;
      while (!(mantissa & 0x400u)) {
        mantissa <<= 1;
        --e;
      }
      bits = sign | (e << 23) | ((mantissa & 0x3ffu) << 13);
    }
  } else {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

/// float -> bfloat16, round to nearest even; NaN -> 0x7fff.
inline unsigned short floatToBfloat16Bits(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u)
    return 0x7fff;
  x += 0x7fffu + ((x >> 16) & 1u);
  return (unsigned short)(x >> 16);
}

/// bfloat16 -> float, exact.
inline float bfloat16BitsToFloat(unsigned short b) {
  uint32_t bits = uint32_t(b) << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

} // namespace kiln_emu_detail

struct __half_raw {
  unsigned short x;
};
struct __nv_bfloat16_raw {
  unsigned short x;
};

struct __align__(2) __half {
  unsigned short __x;
  __half() = default;
  constexpr __half(__half_raw r) : __x(r.x) {}
  __half(float f) : __x(kiln_emu_detail::floatToHalfBits(f)) {}
  __half(double f) : __x(kiln_emu_detail::floatToHalfBits(float(f))) {}
  operator float() const { return kiln_emu_detail::halfBitsToFloat(__x); }
  operator __half_raw() const { return __half_raw{__x}; }
};

struct __align__(2) __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  constexpr __nv_bfloat16(__nv_bfloat16_raw r) : __x(r.x) {}
  __nv_bfloat16(float f) : __x(kiln_emu_detail::floatToBfloat16Bits(f)) {}
  __nv_bfloat16(double f)
      : __x(kiln_emu_detail::floatToBfloat16Bits(float(f))) {}
  operator float() const { return kiln_emu_detail::bfloat16BitsToFloat(__x); }
  operator __nv_bfloat16_raw() const { return __nv_bfloat16_raw{__x}; }
};

struct __align__(4) __half2 {
  __half x, y;
};
struct __align__(4) __nv_bfloat162 {
  __nv_bfloat16 x, y;
};

static inline __half __float2half_rn(float f) {
  return __half(__half_raw{kiln_emu_detail::floatToHalfBits(f)});
}
static inline __half __float2half(float f) { return __float2half_rn(f); }
static inline float __half2float(__half h) {
  return kiln_emu_detail::halfBitsToFloat(h.__x);
}
static inline unsigned short __half_as_ushort(__half h) { return h.__x; }
static inline __half __ushort_as_half(unsigned short x) {
  return __half(__half_raw{x});
}
static inline __half2 __floats2half2_rn(float a, float b) {
  return __half2{__float2half_rn(a), __float2half_rn(b)};
}
static inline float2 __half22float2(__half2 h) {
  return float2{__half2float(h.x), __half2float(h.y)};
}

static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  return __nv_bfloat16(
      __nv_bfloat16_raw{kiln_emu_detail::floatToBfloat16Bits(f)});
}
static inline __nv_bfloat16 __float2bfloat16(float f) {
  return __float2bfloat16_rn(f);
}
static inline float __bfloat162float(__nv_bfloat16 b) {
  return kiln_emu_detail::bfloat16BitsToFloat(b.__x);
}
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) {
  return b.__x;
}
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short x) {
  return __nv_bfloat16(__nv_bfloat16_raw{x});
}
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  return __nv_bfloat162{__float2bfloat16_rn(a), __float2bfloat16_rn(b)};
}
static inline float2 __bfloat1622float2(__nv_bfloat162 b) {
  return float2{__bfloat162float(b.x), __bfloat162float(b.y)};
}

#endif // host emulation

//===----------------------------------------------------------------------===//
// Kiln's helpers (CUDA and emulation alike)
//===----------------------------------------------------------------------===//

#define KILN_DEVICE __device__ __forceinline__
/// Every lane of a warp.
#define KILN_FULL_MASK 0xffffffffu

/// Linear thread id within the block (x fastest), lane and warp.
KILN_DEVICE unsigned kiln_thread_linear() {
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}
KILN_DEVICE unsigned kiln_lane() { return kiln_thread_linear() & 31u; }
KILN_DEVICE unsigned kiln_warp() { return kiln_thread_linear() >> 5; }

/// Loads as float / stores from float, for float, __half and __nv_bfloat16
/// storage (their accumulation is float; f64 accumulates in double).
KILN_DEVICE float kiln_to_float(float x) { return x; }
KILN_DEVICE float kiln_to_float(__half x) { return __half2float(x); }
KILN_DEVICE float kiln_to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> KILN_DEVICE T kiln_from_float(float x);
template <> KILN_DEVICE float kiln_from_float<float>(float x) { return x; }
template <> KILN_DEVICE __half kiln_from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <> KILN_DEVICE __nv_bfloat16 kiln_from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

/// max that propagates NaN from either side, like the CPU code's
/// arith.maximumf (fmaxf would drop a NaN that only some lanes saw).
KILN_DEVICE float kiln_nanmax(float a, float b) { return (a != a || b != b) ? a + b : fmaxf(a, b); }
KILN_DEVICE double kiln_nanmax(double a, double b) { return (a != a || b != b) ? a + b : fmax(a, b); }

/// -infinity (max's identity) without <math.h>, which NVRTC lacks.
template <typename T> KILN_DEVICE T kiln_neg_inf();
template <> KILN_DEVICE float kiln_neg_inf<float>() { return __uint_as_float(0xff800000u); }
template <> KILN_DEVICE double kiln_neg_inf<double>() {
  return __longlong_as_double(static_cast<long long>(0xfff0000000000000ULL));
}

/// Butterfly reductions over a full warp: every lane gets the result.
/// float or double (f64 reductions accumulate in double).
template <typename T> KILN_DEVICE T kiln_warp_sum(T v) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v += __shfl_xor_sync(KILN_FULL_MASK, v, offset);
  return v;
}
template <typename T> KILN_DEVICE T kiln_warp_max(T v) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v = kiln_nanmax(v, __shfl_xor_sync(KILN_FULL_MASK, v, offset));
  return v;
}

/// Block-wide sum; every thread of the block must call it (blockDim a
/// multiple of 32, at most 1024) and gets the result. `scratch` is __shared__
/// memory for 32 values of T; it is free again when the call returns.
template <typename T> KILN_DEVICE T kiln_block_sum(T v, T *scratch) {
  const unsigned lane = kiln_lane(), warp = kiln_warp();
  const unsigned warps = (blockDim.x * blockDim.y * blockDim.z) >> 5;
  v = kiln_warp_sum(v);
  if (lane == 0)
    scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : T(0);
  v = kiln_warp_sum(v);
  __syncthreads();
  return v;
}
/// Block-wide max, under the same rules as kiln_block_sum.
template <typename T> KILN_DEVICE T kiln_block_max(T v, T *scratch) {
  const unsigned lane = kiln_lane(), warp = kiln_warp();
  const unsigned warps = (blockDim.x * blockDim.y * blockDim.z) >> 5;
  v = kiln_warp_max(v);
  if (lane == 0)
    scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : kiln_neg_inf<T>();
  v = kiln_warp_max(v);
  __syncthreads();
  return v;
}

#endif // KILN_CUDA_PRELUDE_H
