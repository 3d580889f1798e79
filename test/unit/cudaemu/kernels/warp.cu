// The warp primitives' lane arithmetic and the block barrier variants.

// blockDim 64: out[k * 64 + t] holds thread t's result of primitive k.
KILN_KERNEL void primitives(int *out, double *dout, int width) {
  const int t = threadIdx.x, n = blockDim.x;
  const int v = 100 + t;
  const unsigned full = 0xffffffffu;
  out[0 * n + t] = __shfl_sync(full, v, 5, width);
  out[1 * n + t] = __shfl_up_sync(full, v, 3, width);
  out[2 * n + t] = __shfl_down_sync(full, v, 3, width);
  out[3 * n + t] = __shfl_xor_sync(full, v, 5, width);
  out[4 * n + t] = (int)__ballot_sync(full, t % 3 == 0);
  out[5 * n + t] = __any_sync(full, t == 7);
  out[6 * n + t] = __all_sync(full, t < 40);
  out[7 * n + t] = (int)__reduce_add_sync(full, (unsigned)t);
  out[8 * n + t] = __reduce_max_sync(full, 20 - t);
  dout[t] = __shfl_xor_sync(full, 0.25 + t, 1);
  long long big = (long long)t << 40;
  dout[n + t] = (double)(__shfl_down_sync(full, big, 1) >> 40);
}
KILN_EMU_SHIM(primitives);

// Divergent but legal: each half-warp shuffles among itself on its own line.
// Lane 15's __shfl_down_sync reads lane 16, outside its mask: undefined in
// CUDA, poison in emulation.
KILN_KERNEL void split_halves(int *out) {
  const int lane = threadIdx.x & 31;
  int v = threadIdx.x;
  if (lane < 16)
    v += __shfl_down_sync(0x0000ffffu, v, 1);
  else
    v += __shfl_xor_sync(0xffff0000u, v, 1);
  out[threadIdx.x] = v;
}
KILN_EMU_SHIM(split_halves);

// __activemask(): the lanes that reach the same call together.
KILN_KERNEL void active_mask(unsigned *out) {
  unsigned m;
  if ((threadIdx.x & 31) < 10)
    m = __activemask();
  else
    m = __activemask();
  out[threadIdx.x] = m;
}
KILN_EMU_SHIM(active_mask);

// __syncthreads_count/and/or, and shared memory across __syncwarp.
KILN_KERNEL void barrier_variants(int *out) {
  __shared__ int buf[1024];
  const int t = threadIdx.x, n = blockDim.x;
  out[0 * n + t] = __syncthreads_count(t % 3 == 0);
  out[1 * n + t] = __syncthreads_and(t < 1000);
  out[2 * n + t] = __syncthreads_or(t == 77);
  buf[t] = 2 * t;
  __syncwarp();
  out[3 * n + t] = buf[t ^ 1];
}
KILN_EMU_SHIM(barrier_variants);

// A 3-D block: warps are 32 consecutive linear ids, x fastest.
KILN_KERNEL void block3d(int *out) {
  const int linear =
      threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  out[linear] = __shfl_sync(0xffffffffu, linear, 0);
  out[blockDim.x * blockDim.y * blockDim.z + linear] = (int)kiln_lane();
}
KILN_EMU_SHIM(block3d);

// The prelude's reductions: a NaN in any lane reaches every lane of a max
// (like the CPU code's maximumf), and double reductions stay double.
// blockDim 64: out[t] = warp max of x, out[64 + t] = block max, out[128 + t]
// = block sum; dout[t] = double warp sum of dx, dout[64 + t] = block sum.
KILN_KERNEL void reductions(const float *x, float *out, const double *dx, double *dout) {
  __shared__ float scratch[32];
  __shared__ double dscratch[32];
  const int t = threadIdx.x, n = blockDim.x;
  out[t] = kiln_warp_max(x[t]);
  out[n + t] = kiln_block_max(x[t], scratch);
  out[2 * n + t] = kiln_block_sum(x[t], scratch);
  dout[t] = kiln_warp_sum(dx[t]);
  dout[n + t] = kiln_block_sum(dx[t], dscratch);
}
KILN_EMU_SHIM(reductions);
