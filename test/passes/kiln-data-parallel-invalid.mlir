// RUN: kiln-opt %s --kiln-train-step=emit-grad=false --kiln-data-parallel --split-input-file --verify-diagnostics

// Errors of the kiln-data-parallel pass.

// ZeRO shards over dp: it needs a mesh with dp > 1 (a train section without
// devices > 1 is refused before, by the dialect's verifier:
// test/dialect/train-invalid.mlir).
// expected-error @+1 {{kiln-data-parallel: zero = 1 needs a kiln.mesh with a dp axis of size > 1}}
module attributes {kiln.train = {devices = 2 : i64, zero = 1 : i64}} {
  func.func @forward(%w: tensor<3xf32> {kiln.param = "w", kiln.init = {kind = "zeros"}},
                     %x: tensor<2x3xf32> {kiln.input = "x"}) -> (tensor<f32> {kiln.output = "loss"}) {
    %0 = kiln.broadcast_in_dim %w, dims = [1] : tensor<3xf32> -> tensor<2x3xf32>
    %1 = kiln.mul %0, %x : tensor<2x3xf32>
    %2 = kiln.reduce_mean %1 axes = [0, 1] : tensor<2x3xf32> -> tensor<f32>
    return %2 : tensor<f32>
  }
}

// -----

// Every data input is split on its leading (batch) dimension over dp.
module attributes {kiln.mesh = {axes = ["dp"], shape = array<i64: 2>}} {
  // expected-error @+1 {{kiln-data-parallel: input 'scale' has no batch dimension to split over dp}}
  func.func @forward(%w: tensor<3xf32> {kiln.param = "w", kiln.init = {kind = "zeros"}},
                     %s: tensor<f32> {kiln.input = "scale"}) -> (tensor<f32> {kiln.output = "loss"}) {
    %0 = kiln.reduce_sum %w axes = [0] : tensor<3xf32> -> tensor<f32>
    %1 = kiln.mul %0, %s : tensor<f32>
    return %1 : tensor<f32>
  }
}

// -----

// ZeRO stages are 0, 1 and 2.
// expected-error @+1 {{kiln-data-parallel: zero must be 0, 1 or 2, got 3}}
module attributes {kiln.mesh = {axes = ["dp"], shape = array<i64: 2>}, kiln.train = {zero = 3 : i64}} {
  func.func @forward(%w: tensor<3xf32> {kiln.param = "w", kiln.init = {kind = "zeros"}},
                     %x: tensor<2x3xf32> {kiln.input = "x"}) -> (tensor<f32> {kiln.output = "loss"}) {
    %0 = kiln.broadcast_in_dim %w, dims = [1] : tensor<3xf32> -> tensor<2x3xf32>
    %1 = kiln.mul %0, %x : tensor<2x3xf32>
    %2 = kiln.reduce_mean %1 axes = [0, 1] : tensor<2x3xf32> -> tensor<f32>
    return %2 : tensor<f32>
  }
}

// -----

// A gradient split over dp (here: the parameter is multiplied into the
// batch and never reduced over it) is a model whose loss does not reduce
// over the batch.
module attributes {kiln.mesh = {axes = ["dp"], shape = array<i64: 2>}} {
  // expected-error @+1 {{kiln-data-parallel: the gradient of 'w' is split over dp ([[dp]]), not a partial sum}}
  func.func @forward(%w: tensor<2xf32> {kiln.param = "w", kiln.init = {kind = "zeros"}},
                     %x: tensor<2xf32> {kiln.input = "x"}) -> (tensor<f32> {kiln.output = "loss"}) {
    %0 = kiln.mul %w, %x : tensor<2xf32>
    %1 = kiln.reduce_sum %0 axes = [0] : tensor<2xf32> -> tensor<f32>
    return %1 : tensor<f32>
  }
}

// -----

// kiln.sharding is checked: one sharding per result, mesh axes only.
module attributes {kiln.mesh = {axes = ["dp"], shape = array<i64: 2>}} {
  func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> {
    // expected-error @+1 {{kiln.sharding names 'tp', which is not a mesh axis}}
    %0 = kiln.neg %x {kiln.sharding = [{split = [["tp"]], partial = []}]} : tensor<2xf32>
    return %0 : tensor<2xf32>
  }
}
