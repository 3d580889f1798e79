// bf16 is a storage type: a fused kernel computes in f32, and each kiln op
// whose result is bf16 rounds it, inside the kernel as when it is stored
// (kRoundAttr, kiln-widen-low-precision; docs/training.md "Kernels:
// low-precision storage, fp32 arithmetic"), so the bits are those of the
// same ops in separate kernels. Reductions accumulate in f32 and round once.
// Row 0 of x is 1.0, row 1 is 0.5; the kernel adds the bf16 constant 0.001
// (0.00099945068 in bf16) twenty times, as twenty kiln.add ops, and sums
// each row of 1000 such values.
//
// Each add rounds: 1.0 + 0.001 rounds back to 1.0 (half an ulp at 1.0 is
// 3.9e-3) and 0.5 + 0.001 back to 0.5 (half an ulp 2.0e-3), so the rows
// stay 1.0 and 0.5, as twenty one-op kernels storing bf16 would give
// (before the rule, the fused chain kept f32 and gave 1.0234375 and
// 0.51953125: bits that depended on fusion). The row sums accumulate in
// f32 and round once: 1000 and 500, exactly; a bf16 running sum of 1.0s
// would stop growing at 256 (256 + 1 ties to 256).
//
// RUN: kiln-opt %s --kiln-lower-to-linalg --canonicalize --kiln-kernel-elementwise-fusion --canonicalize --kiln-widen-low-precision | mlir-opt %cpu_pipeline | mlir-cpu-runner -e main -entry-point-result=void -shared-libs=%runner_libs | FileCheck %s

func.func private @printMemrefF32(memref<*xf32>)

func.func @print2(%t: tensor<2xf32>) {
  %m = bufferization.to_memref %t : memref<2xf32>
  %u = memref.cast %m : memref<2xf32> to memref<*xf32>
  call @printMemrefF32(%u) : (memref<*xf32>) -> ()
  return
}

// One kernel: the chain (stored as bf16) and the row sums (stored as bf16).
func.func @kernel(%x: tensor<2x1000xf32>) -> (tensor<2x1000xbf16>, tensor<2xbf16>) {
  %a0 = kiln.cast %x : tensor<2x1000xf32> -> tensor<2x1000xbf16>
  %c = kiln.constant dense<0.001> : tensor<2x1000xbf16>
  %a1 = kiln.add %a0, %c : tensor<2x1000xbf16>
  %a2 = kiln.add %a1, %c : tensor<2x1000xbf16>
  %a3 = kiln.add %a2, %c : tensor<2x1000xbf16>
  %a4 = kiln.add %a3, %c : tensor<2x1000xbf16>
  %a5 = kiln.add %a4, %c : tensor<2x1000xbf16>
  %a6 = kiln.add %a5, %c : tensor<2x1000xbf16>
  %a7 = kiln.add %a6, %c : tensor<2x1000xbf16>
  %a8 = kiln.add %a7, %c : tensor<2x1000xbf16>
  %a9 = kiln.add %a8, %c : tensor<2x1000xbf16>
  %a10 = kiln.add %a9, %c : tensor<2x1000xbf16>
  %a11 = kiln.add %a10, %c : tensor<2x1000xbf16>
  %a12 = kiln.add %a11, %c : tensor<2x1000xbf16>
  %a13 = kiln.add %a12, %c : tensor<2x1000xbf16>
  %a14 = kiln.add %a13, %c : tensor<2x1000xbf16>
  %a15 = kiln.add %a14, %c : tensor<2x1000xbf16>
  %a16 = kiln.add %a15, %c : tensor<2x1000xbf16>
  %a17 = kiln.add %a16, %c : tensor<2x1000xbf16>
  %a18 = kiln.add %a17, %c : tensor<2x1000xbf16>
  %a19 = kiln.add %a18, %c : tensor<2x1000xbf16>
  %a20 = kiln.add %a19, %c : tensor<2x1000xbf16>
  %s = kiln.reduce_sum %a20 axes = [1] : tensor<2x1000xbf16> -> tensor<2xbf16>
  return %a20, %s : tensor<2x1000xbf16>, tensor<2xbf16>
}

func.func @main() {
  %one = kiln.constant dense<1.0> : tensor<1000xf32>
  %half = kiln.constant dense<0.5> : tensor<1000xf32>
  %x = kiln.concat %one, %half dim = 0 : tensor<1000xf32>, tensor<1000xf32> -> tensor<2000xf32>
  %x2 = kiln.reshape %x : tensor<2000xf32> -> tensor<2x1000xf32>
  %a, %s = call @kernel(%x2) : (tensor<2x1000xf32>) -> (tensor<2x1000xbf16>, tensor<2xbf16>)
  // Every element of a row holds the same stored value: its max shows it.
  %af = kiln.cast %a : tensor<2x1000xbf16> -> tensor<2x1000xf32>
  %am = kiln.reduce_max %af axes = [1] : tensor<2x1000xf32> -> tensor<2xf32>
  // CHECK: [1,  0.5]
  call @print2(%am) : (tensor<2xf32>) -> ()
  %sf = kiln.cast %s : tensor<2xbf16> -> tensor<2xf32>
  // CHECK: [1000,  500]
  call @print2(%sf) : (tensor<2xf32>) -> ()
  return
}
