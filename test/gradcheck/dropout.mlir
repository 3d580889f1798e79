// Op-level gradient checks: dropout.
//
// dropout at rate 0.3 with a seed input: the backward pass must apply the same
// mask and the same 1/(1 - rate) scale.
//
// Each case is a tiny @forward; `kilnc --gradcheck` builds the train program,
// evaluates @grad in float64 on the reference interpreter and compares it with
// 5-point central differences of @forward (docs/training.md). Parameters start
// N(0, 1); float inputs are N(0, 1), integer inputs uniform in their range.
// A non-scalar result y becomes the loss as sum(y * r) with a random input r,
// so every output coordinate carries a different weight.
//
// RUN: split-file %s %t
// RUN: kilnc %t/dropout.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/dropout-small.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/dropout-two-sites.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/dropout-seed-input.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s

// CHECK: gradcheck: loss
// CHECK-NOT: FAIL
// CHECK: gradcheck: worst relative error {{.*}}, tolerance 1e-06: PASS

//--- dropout.mlir
// dropout rate 0.3 with the seed input (the checker feeds dropout_seed =
// 12345): the mask is fixed, so the op is linear with the same mask backwards.
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %dropout_seed: tensor<i64> {kiln.input = "dropout_seed"},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.dropout %p, %dropout_seed rate = 3.000000e-01 salt = 1 : tensor<3x5x7xf32>, tensor<i64>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- dropout-small.mlir
// dropout rate 0.3 of a [3,5] parameter (every coordinate checked).
func.func @forward(%p: tensor<3x5xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %dropout_seed: tensor<i64> {kiln.input = "dropout_seed"},
                   %r: tensor<3x5xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.dropout %p, %dropout_seed rate = 3.000000e-01 salt = 7 : tensor<3x5xf32>, tensor<i64>
  %weighted = kiln.mul %y, %r : tensor<3x5xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1] : tensor<3x5xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- dropout-two-sites.mlir
// Two dropout sites (different salts) on one value, then a nonlinearity:
// each site replays its own mask in the backward pass.
func.func @forward(%p: tensor<3x5xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %dropout_seed: tensor<i64> {kiln.input = "dropout_seed"},
                   %r: tensor<3x5xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %a = kiln.dropout %p, %dropout_seed rate = 3.000000e-01 salt = 1 : tensor<3x5xf32>, tensor<i64>
  %b = kiln.dropout %p, %dropout_seed rate = 3.000000e-01 salt = 2 : tensor<3x5xf32>, tensor<i64>
  %ta = kiln.tanh %a : tensor<3x5xf32>
  %y = kiln.mul %ta, %b : tensor<3x5xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1] : tensor<3x5xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- dropout-seed-input.mlir
// dropout whose seed is an ordinary i64 input (not named dropout_seed):
// the checker draws it like an integer input; it gets no gradient.
func.func @forward(%p: tensor<3x5xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %seed: tensor<i64> {kiln.input = "seed"},
                   %r: tensor<3x5xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.dropout %p, %seed rate = 3.000000e-01 salt = 3 : tensor<3x5xf32>, tensor<i64>
  %weighted = kiln.mul %y, %r : tensor<3x5xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1] : tensor<3x5xf32> -> tensor<f32>
  return %loss : tensor<f32>
}
