// y = s * x with float4 loads and stores for the body and a scalar tail.
// x and y are 16-byte aligned; n need not be a multiple of 4.
KILN_KERNEL void scale4(float *__restrict__ y, const float *__restrict__ x,
                        float s, long long n) {
  const long long n4 = n / 4;
  const long long stride = (long long)blockDim.x * gridDim.x;
  const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const float4 *x4 = reinterpret_cast<const float4 *>(x);
  float4 *y4 = reinterpret_cast<float4 *>(y);
  for (long long i = first; i < n4; i += stride) {
    float4 v = x4[i];
    y4[i] = make_float4(s * v.x, s * v.y, s * v.z, s * v.w);
  }
  for (long long i = 4 * n4 + first; i < n; i += stride)
    y[i] = s * x[i];
}
KILN_EMU_SHIM(scale4);

// A 96 KiB local array per thread: more than the emulator's default 64 KiB
// fiber stack (LaunchOptions::stackBytes raises it). out[i] = sum of
// x[i] * k over k = 0..n-1, through the array.
KILN_KERNEL void big_frame(float *out, const float *x, int n) {
  float local[24576];
  const int i = threadIdx.x;
  for (int k = 0; k < 24576; ++k)
    local[k] = x[i] * (float)(k % n);
  float acc = 0.0f;
  for (int k = n - 1; k >= 0; --k)
    acc += local[k];
  out[i] = acc;
}
KILN_EMU_SHIM(big_frame);
