// Row and column reductions.

// One warp per row (blockDim (32, warpsPerBlock)); butterfly over the lanes.
// Whole warps leave together when the grid has more warps than rows.
KILN_KERNEL void row_sum_warp(float *__restrict__ out,
                              const float *__restrict__ x, int rows, int cols) {
  const int row = blockIdx.x * blockDim.y + threadIdx.y;
  if (row >= rows)
    return;
  const float *r = x + (long long)row * cols;
  float acc = 0.0f;
  for (int c = threadIdx.x; c < cols; c += 32)
    acc += r[c];
  for (int offset = 16; offset > 0; offset >>= 1)
    acc += __shfl_xor_sync(0xffffffffu, acc, offset);
  if (threadIdx.x == 0)
    out[row] = acc;
}
KILN_EMU_SHIM(row_sum_warp);

// One block per row: warp shuffles, per-warp partials in __shared__ memory,
// then warp 0 alone reduces the partials.
KILN_KERNEL void row_sum_block(float *__restrict__ out,
                               const float *__restrict__ x, int cols) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = (blockDim.x + 31) >> 5;
  const float *r = x + (long long)blockIdx.x * cols;
  float acc = 0.0f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x)
    acc += r[c];
  for (int offset = 16; offset > 0; offset >>= 1)
    acc += __shfl_down_sync(0xffffffffu, acc, offset);
  if (lane == 0)
    partial[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    acc = lane < warps ? partial[lane] : 0.0f;
    for (int offset = 16; offset > 0; offset >>= 1)
      acc += __shfl_down_sync(0xffffffffu, acc, offset);
    if (lane == 0)
      out[blockIdx.x] = acc;
  }
}
KILN_EMU_SHIM(row_sum_block);

// One thread per column, looping over the rows (coalesced across threads).
KILN_KERNEL void col_sum(float *__restrict__ out, const float *__restrict__ x,
                         int rows, int cols) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols)
    return;
  float acc = 0.0f;
  for (int r = 0; r < rows; ++r)
    acc += x[(long long)r * cols + c];
  out[c] = acc;
}
KILN_EMU_SHIM(col_sum);

// Global accumulation with atomics: a float sum (warp-reduced first) and an
// integer count of positive elements.
KILN_KERNEL void atomic_sum(float *sum, int *positives, const float *x,
                            long long n) {
  const long long stride = (long long)blockDim.x * gridDim.x;
  float acc = 0.0f;
  int count = 0;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    acc += x[i];
    count += x[i] > 0.0f;
  }
  acc = kiln_warp_sum(acc);
  if ((threadIdx.x & 31) == 0)
    atomicAdd(sum, acc);
  atomicAdd(positives, count);
}
KILN_EMU_SHIM(atomic_sum);
