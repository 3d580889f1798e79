// Op-level gradient checks: matmul.
//
// All four transpose combinations, unbatched and batched; a batched lhs with a
// rank-2 rhs (the linear layer, whose weight gradient is one flattened GEMM
// when the layout allows) in every transpose combination; a rank-2 lhs with a
// batched rhs; two batch dims.
//
// Each case is a tiny @forward; `kilnc --gradcheck` builds the train program,
// evaluates @grad in float64 on the reference interpreter and compares it with
// 5-point central differences of @forward (docs/training.md). Parameters start
// N(0, 1); float inputs are N(0, 1), integer inputs uniform in their range.
// A non-scalar result y becomes the loss as sum(y * r) with a random input r,
// so every output coordinate carries a different weight.
//
// RUN: split-file %s %t
// RUN: kilnc %t/nn.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/tn.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/nt.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/tt.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/batched-nn.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/batched-tn.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/batched-nt.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/batched-tt.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/batched-rank4.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/linear-nt.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/linear-nn.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/linear-tn.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/linear-tt.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/linear-rank4.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/linear-input.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/rhs-batched-nn.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/rhs-batched-tn.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/rhs-batched-nt.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/rhs-batched-tt.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/chain.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s

// CHECK: gradcheck: loss
// CHECK-NOT: FAIL
// CHECK: gradcheck: worst relative error {{.*}}, tolerance 1e-06: PASS

//--- nn.mlir
// [3,5] x [5,7].
func.func @forward(%a: tensor<3x5xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<5x7xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.matmul %a, %b : tensor<3x5xf32>, tensor<5x7xf32> -> tensor<3x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1] : tensor<3x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- tn.mlir
// transpose_lhs: [5,3]^T x [5,7].
func.func @forward(%a: tensor<5x3xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<5x7xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.matmul %a, %b transpose_lhs : tensor<5x3xf32>, tensor<5x7xf32> -> tensor<3x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1] : tensor<3x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- nt.mlir
// transpose_rhs: [3,5] x [7,5]^T.
func.func @forward(%a: tensor<3x5xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<7x5xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.matmul %a, %b transpose_rhs : tensor<3x5xf32>, tensor<7x5xf32> -> tensor<3x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1] : tensor<3x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- tt.mlir
// transpose_lhs and transpose_rhs: [5,3]^T x [7,5]^T.
func.func @forward(%a: tensor<5x3xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<7x5xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.matmul %a, %b transpose_lhs transpose_rhs : tensor<5x3xf32>, tensor<7x5xf32> -> tensor<3x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1] : tensor<3x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- batched-nn.mlir
// Batched, both sides [2, ...]: [2,3,5] x [2,5,7].
func.func @forward(%a: tensor<2x3x5xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<2x5x7xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<2x3x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.matmul %a, %b : tensor<2x3x5xf32>, tensor<2x5x7xf32> -> tensor<2x3x7xf32>
  %weighted = kiln.mul %y, %r : tensor<2x3x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<2x3x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- batched-tn.mlir
// Batched with transpose_lhs: [2,5,3]^T x [2,5,7].
func.func @forward(%a: tensor<2x5x3xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<2x5x7xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<2x3x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.matmul %a, %b transpose_lhs : tensor<2x5x3xf32>, tensor<2x5x7xf32> -> tensor<2x3x7xf32>
  %weighted = kiln.mul %y, %r : tensor<2x3x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<2x3x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- batched-nt.mlir
// Batched with transpose_rhs: [2,3,5] x [2,7,5]^T (attention scores).
func.func @forward(%a: tensor<2x3x5xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<2x7x5xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<2x3x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.matmul %a, %b transpose_rhs : tensor<2x3x5xf32>, tensor<2x7x5xf32> -> tensor<2x3x7xf32>
  %weighted = kiln.mul %y, %r : tensor<2x3x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<2x3x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- batched-tt.mlir
// Batched with both transposes: [2,5,3]^T x [2,7,5]^T.
func.func @forward(%a: tensor<2x5x3xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<2x7x5xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<2x3x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.matmul %a, %b transpose_lhs transpose_rhs : tensor<2x5x3xf32>, tensor<2x7x5xf32> -> tensor<2x3x7xf32>
  %weighted = kiln.mul %y, %r : tensor<2x3x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<2x3x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- batched-rank4.mlir
// Two batch dims: [2,3,4,5] x [2,3,5,2].
func.func @forward(%a: tensor<2x3x4x5xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<2x3x5x2xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<2x3x4x2xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.matmul %a, %b : tensor<2x3x4x5xf32>, tensor<2x3x5x2xf32> -> tensor<2x3x4x2xf32>
  %weighted = kiln.mul %y, %r : tensor<2x3x4x2xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2, 3] : tensor<2x3x4x2xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- linear-nt.mlir
// The linear-layer case: lhs [2,3,5] with batch dims, a rank-2 weight
// [7,5] with transpose_rhs (the weight gradient is one flattened GEMM).
func.func @forward(%a: tensor<2x3x5xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<7x5xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<2x3x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.matmul %a, %b transpose_rhs : tensor<2x3x5xf32>, tensor<7x5xf32> -> tensor<2x3x7xf32>
  %weighted = kiln.mul %y, %r : tensor<2x3x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<2x3x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- linear-nn.mlir
// lhs-batched [2,3,5] x rank-2 [5,7], no transposes (flattened GEMM).
func.func @forward(%a: tensor<2x3x5xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<5x7xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<2x3x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.matmul %a, %b : tensor<2x3x5xf32>, tensor<5x7xf32> -> tensor<2x3x7xf32>
  %weighted = kiln.mul %y, %r : tensor<2x3x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<2x3x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- linear-tn.mlir
// lhs-batched with transpose_lhs, [2,5,3]^T x rank-2 [5,7]: the weight
// gradient takes the batched path and is summed over the batch.
func.func @forward(%a: tensor<2x5x3xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<5x7xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<2x3x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.matmul %a, %b transpose_lhs : tensor<2x5x3xf32>, tensor<5x7xf32> -> tensor<2x3x7xf32>
  %weighted = kiln.mul %y, %r : tensor<2x3x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<2x3x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- linear-tt.mlir
// lhs-batched with both transposes, [2,5,3]^T x rank-2 [7,5]^T.
func.func @forward(%a: tensor<2x5x3xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<7x5xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<2x3x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.matmul %a, %b transpose_lhs transpose_rhs : tensor<2x5x3xf32>, tensor<7x5xf32> -> tensor<2x3x7xf32>
  %weighted = kiln.mul %y, %r : tensor<2x3x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<2x3x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- linear-rank4.mlir
// Two batch dims on the lhs, rank-2 weight with transpose_rhs:
// [2,3,4,5] x [3,5]^T.
func.func @forward(%a: tensor<2x3x4x5xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<3x5xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<2x3x4x3xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.matmul %a, %b transpose_rhs : tensor<2x3x4x5xf32>, tensor<3x5xf32> -> tensor<2x3x4x3xf32>
  %weighted = kiln.mul %y, %r : tensor<2x3x4x3xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2, 3] : tensor<2x3x4x3xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- linear-input.mlir
// The linear layer proper: x is an input [2,3,5], only W[7,5] is a
// parameter.
func.func @forward(%b: tensor<7x5xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %a: tensor<2x3x5xf32> {kiln.input = "a"},
                   %r: tensor<2x3x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.matmul %a, %b transpose_rhs : tensor<2x3x5xf32>, tensor<7x5xf32> -> tensor<2x3x7xf32>
  %weighted = kiln.mul %y, %r : tensor<2x3x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<2x3x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- rhs-batched-nn.mlir
// Rank-2 lhs [3,5] with a batched rhs [2,5,7]: the lhs gradient is
// summed over the batch.
func.func @forward(%a: tensor<3x5xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<2x5x7xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<2x3x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.matmul %a, %b : tensor<3x5xf32>, tensor<2x5x7xf32> -> tensor<2x3x7xf32>
  %weighted = kiln.mul %y, %r : tensor<2x3x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<2x3x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- rhs-batched-tn.mlir
// Rank-2 lhs with transpose_lhs [5,3]^T x batched rhs [2,5,7].
func.func @forward(%a: tensor<5x3xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<2x5x7xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<2x3x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.matmul %a, %b transpose_lhs : tensor<5x3xf32>, tensor<2x5x7xf32> -> tensor<2x3x7xf32>
  %weighted = kiln.mul %y, %r : tensor<2x3x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<2x3x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- rhs-batched-nt.mlir
// Rank-2 lhs [3,5] x batched rhs with transpose_rhs [2,7,5]^T.
func.func @forward(%a: tensor<3x5xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<2x7x5xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<2x3x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.matmul %a, %b transpose_rhs : tensor<3x5xf32>, tensor<2x7x5xf32> -> tensor<2x3x7xf32>
  %weighted = kiln.mul %y, %r : tensor<2x3x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<2x3x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- rhs-batched-tt.mlir
// Rank-2 lhs [5,3]^T x batched rhs [2,7,5]^T.
func.func @forward(%a: tensor<5x3xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<2x7x5xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<2x3x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.matmul %a, %b transpose_lhs transpose_rhs : tensor<5x3xf32>, tensor<2x7x5xf32> -> tensor<2x3x7xf32>
  %weighted = kiln.mul %y, %r : tensor<2x3x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<2x3x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- chain.mlir
// Two matmuls sharing an operand: y = (a b) b^T with a[3,4], b[4,4]
// (b is used twice, once transposed).
func.func @forward(%a: tensor<3x4xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<4x4xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x4xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %ab = kiln.matmul %a, %b : tensor<3x4xf32>, tensor<4x4xf32> -> tensor<3x4xf32>
  %y = kiln.matmul %ab, %b transpose_rhs : tensor<3x4xf32>, tensor<4x4xf32> -> tensor<3x4xf32>
  %weighted = kiln.mul %y, %r : tensor<3x4xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1] : tensor<3x4xf32> -> tensor<f32>
  return %loss : tensor<f32>
}
