// Row kernels with several passes over a row cached in dynamic shared memory.

// softmax over each row: one block per row; the row is cached in dynamic
// shared memory (cols floats) followed by 32 floats of reduction scratch.
// Memory traffic: one read and one write of the row; float accumulation.
KILN_KERNEL void softmax_rows(float *__restrict__ y,
                              const float *__restrict__ x, int cols) {
  KILN_DYNAMIC_SHARED(float, smem);
  float *row = smem;
  float *scratch = smem + cols;
  const float *in = x + (long long)blockIdx.x * cols;
  float m = __uint_as_float(0xff800000u); // -inf
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    row[c] = in[c];
    m = fmaxf(m, row[c]);
  }
  m = kiln_block_max(m, scratch);
  float s = 0.0f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    float e = __expf(row[c] - m);
    row[c] = e;
    s += e;
  }
  s = kiln_block_sum(s, scratch);
  const float inv = 1.0f / s;
  float *out = y + (long long)blockIdx.x * cols;
  for (int c = threadIdx.x; c < cols; c += blockDim.x)
    out[c] = row[c] * inv;
}
KILN_EMU_SHIM(softmax_rows);

// Layer norm with three outputs (y, mean, rstd): bfloat16 in and out, float
// statistics. One block per row; static shared scratch.
KILN_KERNEL void layernorm_bf16(__nv_bfloat16 *__restrict__ y,
                                float *__restrict__ mean,
                                float *__restrict__ rstd,
                                const __nv_bfloat16 *__restrict__ x,
                                const float *__restrict__ gamma,
                                const float *__restrict__ beta, int cols,
                                float eps) {
  __shared__ float scratch[32];
  const __nv_bfloat16 *in = x + (long long)blockIdx.x * cols;
  float s = 0.0f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x)
    s += __bfloat162float(in[c]);
  const float mu = kiln_block_sum(s, scratch) / cols;
  float v = 0.0f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    float d = __bfloat162float(in[c]) - mu;
    v += d * d;
  }
  const float r = rsqrtf(kiln_block_sum(v, scratch) / cols + eps);
  __nv_bfloat16 *out = y + (long long)blockIdx.x * cols;
  for (int c = threadIdx.x; c < cols; c += blockDim.x)
    out[c] = __float2bfloat16_rn((__bfloat162float(in[c]) - mu) * r * gamma[c] +
                                 beta[c]);
  if (threadIdx.x == 0) {
    mean[blockIdx.x] = mu;
    rstd[blockIdx.x] = r;
  }
}
KILN_EMU_SHIM(layernorm_bf16);
