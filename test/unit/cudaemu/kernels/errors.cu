// Kernels that break CUDA's rules; the emulator must report each one.
// (The markers at line ends let the tests find the lines.)

// blockDim 64: threads 16..63 skip the barrier and exit.
KILN_KERNEL void barrier_divergence(float *x) {
  if (threadIdx.x < 16)
    __syncthreads(); // @barrier_divergence
  x[threadIdx.x] = 1.0f;
}
KILN_EMU_SHIM(barrier_divergence);

// blockDim 64: the two halves of the block meet at different barriers.
KILN_KERNEL void barrier_sites(float *x) {
  if (threadIdx.x < 32) {
    x[threadIdx.x] = 1.0f;
    __syncthreads(); // @barrier_sites_a
  } else {
    __syncthreads(); // @barrier_sites_b
  }
  x[threadIdx.x] += 1.0f;
}
KILN_EMU_SHIM(barrier_sites);

// blockDim 32: half the warp waits at a barrier, the other half at a shuffle
// that needs the first half: a real deadlock.
KILN_KERNEL void barrier_vs_shuffle(float *x) {
  float v = x[threadIdx.x];
  if (threadIdx.x < 16)
    __syncthreads(); // @barrier_vs_shuffle_bar
  else
    v = __shfl_xor_sync(0xffffffffu, v, 1); // @barrier_vs_shuffle_shfl
  x[threadIdx.x] = v;
}
KILN_EMU_SHIM(barrier_vs_shuffle);

// blockDim 32: lane 5 leaves before a full-mask shuffle.
KILN_KERNEL void shuffle_after_exit(float *x) {
  if (threadIdx.x == 5)
    return;
  x[threadIdx.x] = __shfl_xor_sync(0xffffffffu, x[threadIdx.x], 1); // @shuffle_after_exit
}
KILN_EMU_SHIM(shuffle_after_exit);

// blockDim 32: lane 0 leaves first, then the others shuffle with it named.
KILN_KERNEL void shuffle_exited_first(float *x) {
  if (threadIdx.x == 0)
    return;
  x[threadIdx.x] = __shfl_down_sync(0xffffffffu, x[threadIdx.x], 1); // @shuffle_exited_first
}
KILN_EMU_SHIM(shuffle_exited_first);

// blockDim 32: the two half-warps diverge into different full-mask shuffles.
KILN_KERNEL void shuffle_diverged(float *x) {
  float v = x[threadIdx.x];
  if (threadIdx.x < 16)
    v = __shfl_xor_sync(0xffffffffu, v, 1); // @shuffle_diverged_xor
  else
    v = __shfl_down_sync(0xffffffffu, v, 1); // @shuffle_diverged_down
  x[threadIdx.x] = v;
}
KILN_EMU_SHIM(shuffle_diverged);

// blockDim 48: a full-mask shuffle in a partial warp names lanes that do not
// exist.
KILN_KERNEL void partial_warp(float *x) {
  x[threadIdx.x] = __shfl_xor_sync(0xffffffffu, x[threadIdx.x], 1);
}
KILN_EMU_SHIM(partial_warp);

// The calling lane must be in its own mask.
KILN_KERNEL void mask_without_self(float *x) {
  if (threadIdx.x == 0)
    x[0] = __shfl_sync(0x2u, x[0], 1);
}
KILN_EMU_SHIM(mask_without_self);

// Shuffle widths must be powers of two.
KILN_KERNEL void bad_width(float *x) {
  x[threadIdx.x] = __shfl_xor_sync(0xffffffffu, x[threadIdx.x], 1, 12);
}
KILN_EMU_SHIM(bad_width);

// __trap() stops the kernel.
KILN_KERNEL void trap_kernel(float *x) {
  if (threadIdx.x == 3)
    __trap(); // @trap
  x[threadIdx.x] = 2.0f;
}
KILN_EMU_SHIM(trap_kernel);
