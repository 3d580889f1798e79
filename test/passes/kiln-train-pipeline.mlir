// RUN: kiln-opt %s --kiln-train-pipeline | FileCheck %s
// RUN: kiln-opt %s --kiln-train-pipeline=grad-only=true | FileCheck %s --check-prefix=GRADONLY

// kiln-train-pipeline (passes/Pipelines.cpp): what kilnc runs before code
// generation, kiln-train-step then canonicalize and cse. SGD without momentum
// on loss = sum(w * x): grad w = x, w' = w - 0.375 * x.

// CHECK-LABEL: func.func @init
// CHECK-LABEL: func.func @grad
// CHECK-LABEL: func.func @train_step(
// CHECK-SAME: %[[W:[a-z0-9]+]]: tensor<4xf32> {kiln.param = "w"}, %[[X:[a-z0-9]+]]: tensor<4xf32> {kiln.input = "x"}
// Canonicalize hoists the constants; cse leaves one w * x.
// CHECK-DAG: %[[LR:[0-9]+]] = kiln.constant dense<3.750000e-01> : tensor<4xf32>
// CHECK-DAG: %[[LRS:[0-9]+]] = kiln.constant dense<3.750000e-01> : tensor<f32>
// CHECK: %[[WX:[0-9]+]] = kiln.mul %[[W]], %[[X]]
// CHECK-NEXT: %[[LOSS:[0-9]+]] = kiln.reduce_sum %[[WX]]
// CHECK-NOT: kiln.mul %[[W]], %[[X]]
// CHECK: %[[STEP:[0-9]+]] = kiln.mul %[[X]], %[[LR]]
// CHECK-NEXT: %[[NEW:[0-9]+]] = kiln.sub %[[W]], %[[STEP]]
// CHECK-NEXT: return %[[NEW]], %[[LOSS]], %{{[0-9]+}}, %[[LRS]]
// CHECK-LABEL: func.func @eval_step

// GRADONLY: func.func @init
// GRADONLY: func.func @grad
// GRADONLY-NOT: func.func @train_step

module attributes {kiln.train = {optimizer = {name = "sgd", lr = 3.750000e-01 : f64, momentum = 0.000000e+00 : f64, nesterov = false, weight_decay = 0.000000e+00 : f64}, schedule = {name = "constant"}}} {
  func.func @forward(%w: tensor<4xf32> {kiln.param = "w", kiln.init = {kind = "ones"}},
                     %x: tensor<4xf32> {kiln.input = "x"}) -> (tensor<f32> {kiln.output = "loss"}) {
    %0 = kiln.mul %w, %x : tensor<4xf32>
    %1 = kiln.reduce_sum %0 axes = [0] : tensor<4xf32> -> tensor<f32>
    return %1 : tensor<f32>
  }
}
