// Elementwise kernels: grid-stride loops over any n (not a multiple of the
// block), float and half/bfloat16 storage with float arithmetic.

// y = a * x + b
KILN_KERNEL void axpb(float *__restrict__ y, const float *__restrict__ x,
                      float a, float b, long long n) {
  const long long stride = (long long)blockDim.x * gridDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += stride)
    y[i] = fmaf(a, __ldg(x + i), b);
}
KILN_EMU_SHIM(axpb);

// y = gelu(x) (tanh form), half in, bfloat16 out, float math.
KILN_KERNEL void gelu_h2b(__nv_bfloat16 *__restrict__ y,
                          const __half *__restrict__ x, long long n) {
  const long long stride = (long long)blockDim.x * gridDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    float v = kiln_to_float(x[i]);
    float inner = 0.7978845608f * (v + 0.044715f * v * v * v);
    y[i] = kiln_from_float<__nv_bfloat16>(0.5f * v * (1.0f + tanhf(inner)));
  }
}
KILN_EMU_SHIM(gelu_h2b);

// A 2-D grid over a rows x cols matrix: out = x * scale[col] + exp(-|x|).
KILN_KERNEL void scale_cols_2d(float *out, const float *x, const float *scale,
                               int rows, int cols) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  int r = blockIdx.y * blockDim.y + threadIdx.y;
  if (r < rows && c < cols)
    out[(long long)r * cols + c] =
        x[(long long)r * cols + c] * scale[c] + __expf(-fabsf(x[(long long)r * cols + c]));
}
KILN_EMU_SHIM(scale_cols_2d);
