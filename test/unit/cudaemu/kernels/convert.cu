// float <-> half / bfloat16 conversions, bit patterns in and out.
KILN_KERNEL void float_to_half(unsigned short *out, const float *in, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    out[i] = __half_as_ushort(__float2half_rn(in[i]));
}
KILN_EMU_SHIM(float_to_half);

KILN_KERNEL void half_to_float(float *out, const unsigned short *in, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    out[i] = __half2float(__ushort_as_half(in[i]));
}
KILN_EMU_SHIM(half_to_float);

KILN_KERNEL void float_to_bf16(unsigned short *out, const float *in, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(in[i]));
}
KILN_EMU_SHIM(float_to_bf16);

KILN_KERNEL void bf16_to_float(float *out, const unsigned short *in, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    out[i] = __bfloat162float(__ushort_as_bfloat16(in[i]));
}
KILN_EMU_SHIM(bf16_to_float);
