// RUN: kiln-opt %s --split-input-file | FileCheck %s
// RUN: kiln-opt %s --split-input-file | kiln-opt --split-input-file | FileCheck %s

// kiln.attention and kiln.attention_grad round-trip; their result types
// (the output, the f32 log-sum-exp of half inputs) are inferred.

// CHECK-LABEL: func.func @causal
// CHECK: %[[O:.*]], %[[L:.*]] = kiln.attention %arg0, %arg1, %arg2 scale = 1.250000e-01 causal : tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>
// CHECK: kiln.attention_grad %arg0, %arg1, %arg2, %[[O]], %[[L]], %arg3 scale = 1.250000e-01 causal : {{.*}}, tensor<2x4x16xf32>, tensor<2x4x16x8xf32>
func.func @causal(%q: tensor<2x4x16x8xf32>, %k: tensor<2x4x16x8xf32>, %v: tensor<2x4x16x8xf32>,
                  %g: tensor<2x4x16x8xf32>) -> (tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>) {
  %o, %lse = kiln.attention %q, %k, %v scale = 0.125 causal : tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>
  %dq, %dk, %dv = kiln.attention_grad %q, %k, %v, %o, %lse, %g scale = 0.125 causal : tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16xf32>, tensor<2x4x16x8xf32>
  return %o, %dk : tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>
}

// -----

// Grouped keys and values (2 query heads per key head), a boolean mask,
// dropout with its seed, bf16 inputs with an f32 log-sum-exp.
// CHECK-LABEL: func.func @grouped_masked_dropout
// CHECK: kiln.attention %arg0, %arg1, %arg2 mask(%arg3 : tensor<16x12xi1>) seed(%arg4 : tensor<i64>) scale = 5.000000e-01 {dropout = 1.000000e-01 : f64, salt = 7 : i64} : tensor<2x4x16x8xbf16>, tensor<2x2x12x8xbf16>, tensor<2x2x12x8xbf16>
func.func @grouped_masked_dropout(%q: tensor<2x4x16x8xbf16>, %k: tensor<2x2x12x8xbf16>,
                                  %v: tensor<2x2x12x8xbf16>, %m: tensor<16x12xi1>,
                                  %seed: tensor<i64>) -> tensor<2x4x16xf32> {
  %o, %lse = kiln.attention %q, %k, %v mask(%m : tensor<16x12xi1>) seed(%seed : tensor<i64>) scale = 0.5 {dropout = 0.1 : f64, salt = 7 : i64} : tensor<2x4x16x8xbf16>, tensor<2x2x12x8xbf16>, tensor<2x2x12x8xbf16>
  return %lse : tensor<2x4x16xf32>
}
