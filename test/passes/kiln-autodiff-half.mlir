// RUN: kiln-opt %s --kiln-autodiff --split-input-file | FileCheck %s

// Gradient rules on bf16/f16 values (what kiln-mixed-precision leaves):
// the statistics of softmax and layer_norm are computed in f32 between
// casts that carry the op's policy rule, and gelu's small-|x| threshold is a
// number the type can hold.

// softmax: y (g - sum(g y)) in f32, the result cast back to bf16.
// CHECK-LABEL: func.func @grad
// CHECK-DAG: %[[G32:[0-9]+]] = kiln.cast %{{[0-9]+}} {kiln.precision.rule = "softmax-fp32-stats"} : tensor<2x4xbf16> -> tensor<2x4xf32>
// CHECK-DAG: %[[Y32:[0-9]+]] = kiln.cast %{{[0-9]+}} {kiln.precision.rule = "softmax-fp32-stats"} : tensor<2x4xbf16> -> tensor<2x4xf32>
// CHECK-DAG: kiln.reduce_sum %{{[0-9]+}} axes = [1] keepdims : tensor<2x4xf32> -> tensor<2x1xf32>
// CHECK: %[[DX:[0-9]+]] = kiln.mul %[[Y32]], %{{[0-9]+}} : tensor<2x4xf32>
// CHECK: kiln.cast %[[DX]] {kiln.precision.rule = "softmax-fp32-stats"} : tensor<2x4xf32> -> tensor<2x4xbf16>
module {
  func.func @forward(%x: tensor<2x4xbf16> {kiln.param = "x"}) -> (tensor<f32> {kiln.output = "loss"}) {
    %0 = kiln.softmax %x axis = 1 : tensor<2x4xbf16>
    %1 = kiln.mul %0, %0 : tensor<2x4xbf16>
    %2 = kiln.cast %1 : tensor<2x4xbf16> -> tensor<2x4xf32>
    %3 = kiln.reduce_sum %2 axes = [0, 1] : tensor<2x4xf32> -> tensor<f32>
    return %3 : tensor<f32>
  }
}

// -----

// layer_norm: mean, variance and the sums in f32; dx, dgamma, dbeta cast
// back to their operands' types.
// CHECK-LABEL: func.func @grad
// CHECK: kiln.cast %arg0 {kiln.precision.rule = "layer-norm-fp32-stats"} : tensor<2x4xf16> -> tensor<2x4xf32>
// CHECK-NOT: kiln.reduce_sum {{.*}}xf16
// CHECK-DAG: kiln.cast %{{[0-9]+}} {kiln.precision.rule = "layer-norm-fp32-stats"} : tensor<2x4xf32> -> tensor<2x4xf16>
// CHECK-DAG: kiln.cast %{{[0-9]+}} {kiln.precision.rule = "layer-norm-fp32-stats"} : tensor<4xf32> -> tensor<4xf16>
// CHECK: return
module {
  func.func @forward(%x: tensor<2x4xf16> {kiln.param = "x"}, %g: tensor<4xf16> {kiln.param = "g"}) -> (tensor<f32> {kiln.output = "loss"}) {
    %0 = kiln.layer_norm %x scale(%g : tensor<4xf16>) : tensor<2x4xf16>
    %1 = kiln.mul %0, %0 : tensor<2x4xf16>
    %2 = kiln.mul %1, %1 : tensor<2x4xf16>
    %3 = kiln.cast %2 : tensor<2x4xf16> -> tensor<2x4xf32>
    %4 = kiln.reduce_sum %3 axes = [0, 1] : tensor<2x4xf32> -> tensor<f32>
    return %4 : tensor<f32>
  }
}

// -----

// gelu (erf) in f16: 1e-20 would round to 0 and x = 0 would give 0 / 0;
// the threshold is f16's smallest normal, 2^-14.
// CHECK-LABEL: func.func @grad
// CHECK: kiln.constant dense<6.103520e-05> : tensor<4xf16>
module {
  func.func @forward(%x: tensor<4xf16> {kiln.param = "x"}) -> (tensor<f32> {kiln.output = "loss"}) {
    %0 = kiln.gelu erf, %x : tensor<4xf16>
    %1 = kiln.cast %0 : tensor<4xf16> -> tensor<4xf32>
    %2 = kiln.reduce_sum %1 axes = [0] : tensor<4xf32> -> tensor<f32>
    return %2 : tensor<f32>
  }
}
