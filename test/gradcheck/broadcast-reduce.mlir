// Op-level gradient checks: broadcast_in_dim and reductions.
//
// broadcast_in_dim from [7], [3], [], [5,1], [1,5,1], [5,7], [3,1] into [3,5,7];
// reduce_sum / reduce_mean / reduce_max with and without keepdims.
//
// Each case is a tiny @forward; `kilnc --gradcheck` builds the train program,
// evaluates @grad in float64 on the reference interpreter and compares it with
// 5-point central differences of @forward (docs/training.md). Parameters start
// N(0, 1); float inputs are N(0, 1), integer inputs uniform in their range.
// A non-scalar result y becomes the loss as sum(y * r) with a random input r,
// so every output coordinate carries a different weight.
//
// RUN: split-file %s %t
// RUN: kilnc %t/broadcast-last.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/broadcast-first.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/broadcast-scalar.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/broadcast-size1-middle.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/broadcast-size1-all.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/broadcast-trailing.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/broadcast-outer.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/reduce-sum.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/reduce-sum-keepdims.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/reduce-sum-all.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/reduce-mean.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/reduce-mean-keepdims.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/reduce-max.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/reduce-max-keepdims.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/reduce-max-multi.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/broadcast-reduce-chain.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s

// CHECK: gradcheck: loss
// CHECK-NOT: FAIL
// CHECK: gradcheck: worst relative error {{.*}}, tolerance 1e-06: PASS

//--- broadcast-last.mlir
// [7] -> [3,5,7], dims = [2] (a bias).
func.func @forward(%v: tensor<7xf32> {kiln.param = "v", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.broadcast_in_dim %v, dims = [2] : tensor<7xf32> -> tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- broadcast-first.mlir
// [3] -> [3,5,7], dims = [0].
func.func @forward(%v: tensor<3xf32> {kiln.param = "v", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.broadcast_in_dim %v, dims = [0] : tensor<3xf32> -> tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- broadcast-scalar.mlir
// [] -> [3,5,7], dims = [] (a scalar).
func.func @forward(%v: tensor<f32> {kiln.param = "v", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.broadcast_in_dim %v, dims = [] : tensor<f32> -> tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- broadcast-size1-middle.mlir
// [5,1] -> [3,5,7], dims = [1, 2]: a size-1 operand dim is repeated
// (its gradient is summed and reshaped back to [5,1]).
func.func @forward(%v: tensor<5x1xf32> {kiln.param = "v", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.broadcast_in_dim %v, dims = [1, 2] : tensor<5x1xf32> -> tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- broadcast-size1-all.mlir
// [1,5,1] -> [3,5,7], dims = [0, 1, 2]: same rank, two size-1 dims.
func.func @forward(%v: tensor<1x5x1xf32> {kiln.param = "v", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.broadcast_in_dim %v, dims = [0, 1, 2] : tensor<1x5x1xf32> -> tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- broadcast-trailing.mlir
// [5,7] -> [3,5,7], dims = [1, 2].
func.func @forward(%v: tensor<5x7xf32> {kiln.param = "v", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.broadcast_in_dim %v, dims = [1, 2] : tensor<5x7xf32> -> tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- broadcast-outer.mlir
// [3,1] -> [3,5,7], dims = [0, 2]: dim 1 is new, dim 2 is repeated.
func.func @forward(%v: tensor<3x1xf32> {kiln.param = "v", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.broadcast_in_dim %v, dims = [0, 2] : tensor<3x1xf32> -> tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- reduce-sum.mlir
// reduce_sum over the middle axis, dropped.
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.reduce_sum %p axes = [1] : tensor<3x5x7xf32> -> tensor<3x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1] : tensor<3x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- reduce-sum-keepdims.mlir
// reduce_sum over axes [0, 2], kept as size 1.
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<1x5x1xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.reduce_sum %p axes = [0, 2] keepdims : tensor<3x5x7xf32> -> tensor<1x5x1xf32>
  %weighted = kiln.mul %y, %r : tensor<1x5x1xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<1x5x1xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- reduce-sum-all.mlir
// reduce_sum over every axis of a [2,7] parameter to a scalar, then
// through exp (so the gradient is not constant).
func.func @forward(%p: tensor<2x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.reduce_sum %p axes = [0, 1] : tensor<2x7xf32> -> tensor<f32>
  %e = kiln.exp %y : tensor<f32>
  return %e : tensor<f32>
}

//--- reduce-mean.mlir
// reduce_mean over the last axis.
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.reduce_mean %p axes = [2] : tensor<3x5x7xf32> -> tensor<3x5xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1] : tensor<3x5xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- reduce-mean-keepdims.mlir
// reduce_mean over axes [0, 1], kept.
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<1x1x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.reduce_mean %p axes = [0, 1] keepdims : tensor<3x5x7xf32> -> tensor<1x1x7xf32>
  %weighted = kiln.mul %y, %r : tensor<1x1x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<1x1x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- reduce-max.mlir
// reduce_max over the middle axis (normal inputs: no ties).
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.reduce_max %p axes = [1] : tensor<3x5x7xf32> -> tensor<3x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1] : tensor<3x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- reduce-max-keepdims.mlir
// reduce_max over the last axis, kept.
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x1xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.reduce_max %p axes = [2] keepdims : tensor<3x5x7xf32> -> tensor<3x5x1xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x1xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x1xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- reduce-max-multi.mlir
// reduce_max over axes [0, 2] of a [3,4,5] parameter.
func.func @forward(%p: tensor<3x4x5xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<4xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.reduce_max %p axes = [0, 2] : tensor<3x4x5xf32> -> tensor<4xf32>
  %weighted = kiln.mul %y, %r : tensor<4xf32>
  %loss = kiln.reduce_sum %weighted axes = [0] : tensor<4xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- broadcast-reduce-chain.mlir
// A layer's worth of broadcasting: row statistics of x (keepdims
// mean, reduce_max) broadcast back and combined with a [7] scale.
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %s: tensor<7xf32> {kiln.param = "s", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %mean = kiln.reduce_mean %p axes = [2] keepdims : tensor<3x5x7xf32> -> tensor<3x5x1xf32>
  %meanb = kiln.broadcast_in_dim %mean, dims = [0, 1, 2] : tensor<3x5x1xf32> -> tensor<3x5x7xf32>
  %xc = kiln.sub %p, %meanb : tensor<3x5x7xf32>
  %mx = kiln.reduce_max %xc axes = [2] : tensor<3x5x7xf32> -> tensor<3x5xf32>
  %mxb = kiln.broadcast_in_dim %mx, dims = [0, 1] : tensor<3x5xf32> -> tensor<3x5x7xf32>
  %z = kiln.sub %xc, %mxb : tensor<3x5x7xf32>
  %sb = kiln.broadcast_in_dim %s, dims = [2] : tensor<7xf32> -> tensor<3x5x7xf32>
  %y = kiln.mul %z, %sb : tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}
