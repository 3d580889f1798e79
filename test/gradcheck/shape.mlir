// Op-level gradient checks: shape ops.
//
// reshape, transpose, slice (contiguous and strided, stride 2 and 3), pad
// (low, high, interior, non-zero value) and concat.
//
// Each case is a tiny @forward; `kilnc --gradcheck` builds the train program,
// evaluates @grad in float64 on the reference interpreter and compares it with
// 5-point central differences of @forward (docs/training.md). Parameters start
// N(0, 1); float inputs are N(0, 1), integer inputs uniform in their range.
// A non-scalar result y becomes the loss as sum(y * r) with a random input r,
// so every output coordinate carries a different weight.
//
// RUN: split-file %s %t
// RUN: kilnc %t/reshape.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/reshape-split.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/transpose.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/transpose-2d.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/transpose-rank4.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/slice.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/slice-stride2.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/slice-stride2-limit.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/pad.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/pad-edges.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/concat.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/concat-repeat.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/slice-pad-chain.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s

// CHECK: gradcheck: loss
// CHECK-NOT: FAIL
// CHECK: gradcheck: worst relative error {{.*}}, tolerance 1e-06: PASS

//--- reshape.mlir
// reshape [3,5,7] -> [5,21].
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<5x21xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.reshape %p : tensor<3x5x7xf32> -> tensor<5x21xf32>
  %weighted = kiln.mul %y, %r : tensor<5x21xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1] : tensor<5x21xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- reshape-split.mlir
// reshape [15,7] -> [3,5,7] (splitting a dim) then exp.
func.func @forward(%p: tensor<15x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %q = kiln.reshape %p : tensor<15x7xf32> -> tensor<3x5x7xf32>
  %y = kiln.exp %q : tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- transpose.mlir
// transpose perm = [2, 0, 1].
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<7x3x5xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.transpose %p perm = [2, 0, 1] : tensor<3x5x7xf32> -> tensor<7x3x5xf32>
  %weighted = kiln.mul %y, %r : tensor<7x3x5xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<7x3x5xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- transpose-2d.mlir
// transpose of a [3,5] matrix, all coordinates checked.
func.func @forward(%p: tensor<3x5xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<5x3xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.transpose %p perm = [1, 0] : tensor<3x5xf32> -> tensor<5x3xf32>
  %weighted = kiln.mul %y, %r : tensor<5x3xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1] : tensor<5x3xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- transpose-rank4.mlir
// transpose perm = [0, 2, 1, 3] (attention heads).
func.func @forward(%p: tensor<2x3x4x5xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<2x4x3x5xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.transpose %p perm = [0, 2, 1, 3] : tensor<2x3x4x5xf32> -> tensor<2x4x3x5xf32>
  %weighted = kiln.mul %y, %r : tensor<2x4x3x5xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2, 3] : tensor<2x4x3x5xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- slice.mlir
// Contiguous slice start = [1, 0, 2] limit = [3, 4, 7].
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<2x4x5xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.slice %p start = [1, 0, 2] limit = [3, 4, 7] stride = [1, 1, 1] : tensor<3x5x7xf32> -> tensor<2x4x5xf32>
  %weighted = kiln.mul %y, %r : tensor<2x4x5xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<2x4x5xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- slice-stride2.mlir
// Strided slice: stride 2 on dims 0 and 1, 3 on dim 2
// (start = [0, 1, 0], limit = [3, 5, 7] -> [2, 2, 3]); the gradient is a pad with
// interior padding.
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<2x2x3xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.slice %p start = [0, 1, 0] limit = [3, 5, 7] stride = [2, 2, 3] : tensor<3x5x7xf32> -> tensor<2x2x3xf32>
  %weighted = kiln.mul %y, %r : tensor<2x2x3xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<2x2x3xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- slice-stride2-limit.mlir
// Stride 2 where the limit is not reached by the last index
// (start = [1], limit = [6], stride = [2] on a [7] vector: indices 1, 3, 5).
func.func @forward(%p: tensor<7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.slice %p start = [1] limit = [6] stride = [2] : tensor<7xf32> -> tensor<3xf32>
  %weighted = kiln.mul %y, %r : tensor<3xf32>
  %loss = kiln.reduce_sum %weighted axes = [0] : tensor<3xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- pad.mlir
// pad low = [1, 0, 2] high = [0, 2, 1] interior = [0, 1, 2] value = 0.5.
func.func @forward(%p: tensor<2x3x4xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x7x13xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.pad %p low = [1, 0, 2] high = [0, 2, 1] interior = [0, 1, 2] value = 5.000000e-01 : tensor<2x3x4xf32> -> tensor<3x7x13xf32>
  %weighted = kiln.mul %y, %r : tensor<3x7x13xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x7x13xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- pad-edges.mlir
// pad with only low/high padding of a [3,5] matrix.
func.func @forward(%p: tensor<3x5xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<6x8xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.pad %p low = [2, 0] high = [1, 3] interior = [0, 0] value = 0.000000e+00 : tensor<3x5xf32> -> tensor<6x8xf32>
  %weighted = kiln.mul %y, %r : tensor<6x8xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1] : tensor<6x8xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- concat.mlir
// concat of three parameters along dim 1: [3,2,7] ++ [3,5,7] ++ [3,1,7].
func.func @forward(%a: tensor<3x2x7xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<3x5x7xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %c: tensor<3x1x7xf32> {kiln.param = "c", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x8x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.concat %a, %b, %c dim = 1 : tensor<3x2x7xf32>, tensor<3x5x7xf32>, tensor<3x1x7xf32> -> tensor<3x8x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x8x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x8x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- concat-repeat.mlir
// concat of the same value twice along the last dim (gradients summed)
// with a second operand: [2,3] ++ [2,3] ++ [2,1].
func.func @forward(%a: tensor<2x3xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %c: tensor<2x1xf32> {kiln.param = "c", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<2x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %e = kiln.sin %a : tensor<2x3xf32>
  %y = kiln.concat %e, %e, %c dim = 1 : tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x1xf32> -> tensor<2x7xf32>
  %weighted = kiln.mul %y, %r : tensor<2x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1] : tensor<2x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- slice-pad-chain.mlir
// Shape ops in sequence: reshape, transpose, strided slice, pad, concat
// (the sort of chain attention heads produce).
func.func @forward(%p: tensor<3x35xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<6x4x6xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %r1 = kiln.reshape %p : tensor<3x35xf32> -> tensor<3x5x7xf32>
  %t = kiln.transpose %r1 perm = [1, 0, 2] : tensor<3x5x7xf32> -> tensor<5x3x7xf32>
  %s = kiln.slice %t start = [0, 0, 1] limit = [5, 3, 7] stride = [2, 1, 2] : tensor<5x3x7xf32> -> tensor<3x3x3xf32>
  %pd = kiln.pad %s low = [0, 1, 0] high = [1, 0, 0] interior = [1, 0, 0] value = 0.000000e+00 : tensor<3x3x3xf32> -> tensor<6x4x3xf32>
  %th = kiln.tanh %pd : tensor<6x4x3xf32>
  %y = kiln.concat %th, %pd dim = 2 : tensor<6x4x3xf32>, tensor<6x4x3xf32> -> tensor<6x4x6xf32>
  %weighted = kiln.mul %y, %r : tensor<6x4x6xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<6x4x6xf32> -> tensor<f32>
  return %loss : tensor<f32>
}
