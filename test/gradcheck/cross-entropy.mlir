// Op-level gradient checks: cross_entropy.
//
// reduction mean / sum / none, rank-2 and rank-3 logits, i32 and i64 targets
// (drawn uniformly in [0, classes) by the checker).
//
// Each case is a tiny @forward; `kilnc --gradcheck` builds the train program,
// evaluates @grad in float64 on the reference interpreter and compares it with
// 5-point central differences of @forward (docs/training.md). Parameters start
// N(0, 1); float inputs are N(0, 1), integer inputs uniform in their range.
// A non-scalar result y becomes the loss as sum(y * r) with a random input r,
// so every output coordinate carries a different weight.
//
// RUN: split-file %s %t
// RUN: kilnc %t/mean.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/sum.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/none.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/rank3-mean.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/rank3-sum.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/rank3-none.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/small.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/after-linear.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s

// CHECK: gradcheck: loss
// CHECK-NOT: FAIL
// CHECK: gradcheck: worst relative error {{.*}}, tolerance 1e-06: PASS

//--- mean.mlir
// cross_entropy, reduction = mean, logits [5,7], i32 targets.
func.func @forward(%z: tensor<5x7xf32> {kiln.param = "z", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %t: tensor<5xi32> {kiln.input = "t"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.cross_entropy %z, %t reduction = mean : tensor<5x7xf32>, tensor<5xi32> -> tensor<f32>
  return %y : tensor<f32>
}

//--- sum.mlir
// cross_entropy, reduction = sum.
func.func @forward(%z: tensor<5x7xf32> {kiln.param = "z", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %t: tensor<5xi32> {kiln.input = "t"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.cross_entropy %z, %t reduction = sum : tensor<5x7xf32>, tensor<5xi32> -> tensor<f32>
  return %y : tensor<f32>
}

//--- none.mlir
// cross_entropy, reduction = none: per-position losses [5], weighted.
func.func @forward(%z: tensor<5x7xf32> {kiln.param = "z", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %t: tensor<5xi32> {kiln.input = "t"},
                   %r: tensor<5xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.cross_entropy %z, %t reduction = none : tensor<5x7xf32>, tensor<5xi32> -> tensor<5xf32>
  %weighted = kiln.mul %y, %r : tensor<5xf32>
  %loss = kiln.reduce_sum %weighted axes = [0] : tensor<5xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- rank3-mean.mlir
// Rank-3 logits [2,3,7] (batch, time, classes), mean.
func.func @forward(%z: tensor<2x3x7xf32> {kiln.param = "z", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %t: tensor<2x3xi32> {kiln.input = "t"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.cross_entropy %z, %t reduction = mean : tensor<2x3x7xf32>, tensor<2x3xi32> -> tensor<f32>
  return %y : tensor<f32>
}

//--- rank3-sum.mlir
// Rank-3 logits [2,3,7], sum, i64 targets.
func.func @forward(%z: tensor<2x3x7xf32> {kiln.param = "z", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %t: tensor<2x3xi64> {kiln.input = "t"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.cross_entropy %z, %t reduction = sum : tensor<2x3x7xf32>, tensor<2x3xi64> -> tensor<f32>
  return %y : tensor<f32>
}

//--- rank3-none.mlir
// Rank-3 logits [2,3,7], none: [2,3] losses, weighted.
func.func @forward(%z: tensor<2x3x7xf32> {kiln.param = "z", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %t: tensor<2x3xi32> {kiln.input = "t"},
                   %r: tensor<2x3xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.cross_entropy %z, %t reduction = none : tensor<2x3x7xf32>, tensor<2x3xi32> -> tensor<2x3xf32>
  %weighted = kiln.mul %y, %r : tensor<2x3xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1] : tensor<2x3xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- small.mlir
// Logits [2,5] (every coordinate checked), mean.
func.func @forward(%z: tensor<2x5xf32> {kiln.param = "z", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %t: tensor<2xi32> {kiln.input = "t"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.cross_entropy %z, %t reduction = mean : tensor<2x5xf32>, tensor<2xi32> -> tensor<f32>
  return %y : tensor<f32>
}

//--- after-linear.mlir
// A classifier head: x[2,3,5] (input) times W[7,5]^T plus bias b[7], then
// mean cross-entropy over [2,3] targets.
func.func @forward(%w: tensor<7x5xf32> {kiln.param = "w", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<7xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %x: tensor<2x3x5xf32> {kiln.input = "x"},
                   %t: tensor<2x3xi32> {kiln.input = "t"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %h = kiln.matmul %x, %w transpose_rhs : tensor<2x3x5xf32>, tensor<7x5xf32> -> tensor<2x3x7xf32>
  %bb = kiln.broadcast_in_dim %b, dims = [2] : tensor<7xf32> -> tensor<2x3x7xf32>
  %z = kiln.add %h, %bb : tensor<2x3x7xf32>
  %y = kiln.cross_entropy %z, %t reduction = mean : tensor<2x3x7xf32>, tensor<2x3xi32> -> tensor<f32>
  return %y : tensor<f32>
}
