// bf16 is a storage type: a fused kernel computes in f32 and rounds once
// per stored value; reductions accumulate in f32 (kiln-widen-low-precision,
// docs/dialect.md "Element types"). Row 0 of x is 1.0, row 1 is 0.5; the
// kernel adds the bf16 constant 0.001 (0.00099945068 in bf16) twenty times
// and sums each row of 1000 such values.
//
// Exact math (f64): 1.01998901 and 0.51998901; row sums 1019.989 and
// 519.989. Stored once-rounded to bf16 (8 significant bits: at most half
// an ulp, 2^-8 of the value's power of two): 1.0234375 (|err| 3.5e-3 <=
// 3.9e-3), 0.51953125 (4.6e-4 <= 2.0e-3), 1020 (0.011 <= 2) and 520
// (0.011 <= 2): the nearest bf16 values, which is what these CHECKs pin.
//
// Rounding after every op (what LLVM does with bfloat arithmetic) would
// fail every line: 1.0 + 0.001 rounds back to 1.0 (half an ulp at 1.0 is
// 3.9e-3), so the chain stays at 1.0 and 0.5, and a bf16 running sum of
// 1.0s stops growing at 256 (256 + 1 ties to 256).
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
  // CHECK: [1.02344,  0.519531]
  call @print2(%am) : (tensor<2xf32>) -> ()
  %sf = kiln.cast %s : tensor<2xbf16> -> tensor<2xf32>
  // CHECK: [1020,  520]
  call @print2(%sf) : (tensor<2xf32>) -> ()
  return
}
