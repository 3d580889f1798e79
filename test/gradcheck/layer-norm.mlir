// Op-level gradient checks: layer_norm.
//
// layer_norm without scale/bias, with scale, with bias, with both, rank 3, and a
// non-default epsilon.
//
// Each case is a tiny @forward; `kilnc --gradcheck` builds the train program,
// evaluates @grad in float64 on the reference interpreter and compares it with
// 5-point central differences of @forward (docs/training.md). Parameters start
// N(0, 1); float inputs are N(0, 1), integer inputs uniform in their range.
// A non-scalar result y becomes the loss as sum(y * r) with a random input r,
// so every output coordinate carries a different weight.
//
// RUN: split-file %s %t
// RUN: kilnc %t/plain.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/scale.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/bias.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/scale-bias.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/rank3.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/rank3-plain.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/small.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/epsilon.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s

// CHECK: gradcheck: loss
// CHECK-NOT: FAIL
// CHECK: gradcheck: worst relative error {{.*}}, tolerance 1e-06: PASS

//--- plain.mlir
// layer_norm without scale or bias over the last axis of [5,7].
func.func @forward(%x: tensor<5x7xf32> {kiln.param = "x", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.layer_norm %x : tensor<5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1] : tensor<5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- scale.mlir
// layer_norm with a scale only.
func.func @forward(%x: tensor<5x7xf32> {kiln.param = "x", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %g: tensor<7xf32> {kiln.param = "g", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.layer_norm %x scale(%g : tensor<7xf32>) : tensor<5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1] : tensor<5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- bias.mlir
// layer_norm with a bias only.
func.func @forward(%x: tensor<5x7xf32> {kiln.param = "x", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<7xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.layer_norm %x bias(%b : tensor<7xf32>) : tensor<5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1] : tensor<5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- scale-bias.mlir
// layer_norm with scale and bias.
func.func @forward(%x: tensor<5x7xf32> {kiln.param = "x", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %g: tensor<7xf32> {kiln.param = "g", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<7xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.layer_norm %x scale(%g : tensor<7xf32>) bias(%b : tensor<7xf32>) : tensor<5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1] : tensor<5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- rank3.mlir
// layer_norm of a rank-3 [3,5,7] input with scale and bias (the
// parameter gradients sum over two leading dims).
func.func @forward(%x: tensor<3x5x7xf32> {kiln.param = "x", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %g: tensor<7xf32> {kiln.param = "g", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<7xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.layer_norm %x scale(%g : tensor<7xf32>) bias(%b : tensor<7xf32>) : tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- rank3-plain.mlir
// layer_norm of a rank-3 [2,3,5] input, no scale or bias.
func.func @forward(%x: tensor<2x3x5xf32> {kiln.param = "x", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<2x3x5xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.layer_norm %x : tensor<2x3x5xf32>
  %weighted = kiln.mul %y, %r : tensor<2x3x5xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<2x3x5xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- small.mlir
// layer_norm of a [2,6] input (every coordinate checked) with scale.
func.func @forward(%x: tensor<2x6xf32> {kiln.param = "x", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %g: tensor<6xf32> {kiln.param = "g", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<2x6xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.layer_norm %x scale(%g : tensor<6xf32>) : tensor<2x6xf32>
  %weighted = kiln.mul %y, %r : tensor<2x6xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1] : tensor<2x6xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- epsilon.mlir
// layer_norm with a large epsilon (0.1) so that the epsilon term matters.
// (Before --gradcheck evaluated everything in f64 this case failed with 5.7e-6:
// the rule's 1/n and epsilon constants were rounded to f32 while the forward
// used exact values, and cancellation in small gradient coordinates amplified
// the 1e-8 difference.)
func.func @forward(%x: tensor<3x5xf32> {kiln.param = "x", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %g: tensor<5xf32> {kiln.param = "g", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.layer_norm %x scale(%g : tensor<5xf32>) {epsilon = 1.000000e-01 : f64} : tensor<3x5xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1] : tensor<3x5xf32> -> tensor<f32>
  return %loss : tensor<f32>
}
