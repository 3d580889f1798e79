// RUN: kiln-opt %s --kiln-train-step --split-input-file --verify-diagnostics

// Errors of the kiln-train-step pass.

// grad_accum splits every data input along its first dim; a scalar input
// cannot be split.
module attributes {kiln.train = {grad_accum = 2 : i64}} {
  // expected-error @+1 {{grad_accum needs batched inputs; 'scale' is a scalar}}
  func.func @forward(%w: tensor<3xf32> {kiln.param = "w", kiln.init = {kind = "zeros"}},
                     %s: tensor<f32> {kiln.input = "scale"}) -> (tensor<f32> {kiln.output = "loss"}) {
    %0 = kiln.reduce_sum %w axes = [0] : tensor<3xf32> -> tensor<f32>
    %1 = kiln.mul %0, %s : tensor<f32>
    return %1 : tensor<f32>
  }
}

// -----

// expected-error @+1 {{kiln-train-step needs a func.func @forward}}
module {
  func.func @model(%w: tensor<4xf32>) -> tensor<4xf32> {
    return %w : tensor<4xf32>
  }
}

// -----

// expected-error @+1 {{@init already exists}}
module {
  func.func @forward(%w: tensor<4xf32> {kiln.param = "w"}) -> (tensor<f32> {kiln.output = "loss"}) {
    %0 = kiln.reduce_sum %w axes = [0] : tensor<4xf32> -> tensor<f32>
    return %0 : tensor<f32>
  }
  func.func @init() {
    return
  }
}

// -----

// An op without a gradient rule on the parameter -> loss path fails the
// train step like it fails kiln-autodiff.
func.func private @helper(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = kiln.exp %a : tensor<4xf32>
  return %0 : tensor<4xf32>
}
func.func @forward(%w: tensor<4xf32> {kiln.param = "w"}) -> (tensor<f32> {kiln.output = "loss"}) {
  // expected-error @+1 {{'func.call' op has no gradient rule but lies between a parameter and the loss}}
  %0 = func.call @helper(%w) : (tensor<4xf32>) -> tensor<4xf32>
  %1 = kiln.reduce_sum %0 axes = [0] : tensor<4xf32> -> tensor<f32>
  return %1 : tensor<f32>
}

// -----

// A hand-written kiln.train is validated, not trusted.
// expected-error @+1 {{kiln.train: unknown optimizer 'rmsprop' (expected sgd, adam or adamw)}}
module attributes {kiln.train = {optimizer = {name = "rmsprop", lr = 1.000000e-01 : f64}}} {
  func.func @forward(%w: tensor<4xf32> {kiln.param = "w"}) -> (tensor<f32> {kiln.output = "loss"}) {
    %0 = kiln.reduce_sum %w axes = [0] : tensor<4xf32> -> tensor<f32>
    return %0 : tensor<f32>
  }
}

// -----

// expected-error @+1 {{kiln.train: grad_accum and steps must be >= 1 and warmup >= 0}}
module attributes {kiln.train = {grad_accum = 0 : i64}} {
  func.func @forward(%w: tensor<4xf32> {kiln.param = "w"}) -> (tensor<f32> {kiln.output = "loss"}) {
    %0 = kiln.reduce_sum %w axes = [0] : tensor<4xf32> -> tensor<f32>
    return %0 : tensor<f32>
  }
}

// -----

// A master-weight copy must read a parameter (kiln-mixed-precision's
// contract, dialects/kiln/Precision.h): the train step makes it state.
module attributes {kiln.precision = "bf16"} {
  func.func @forward(%w: tensor<4xf32> {kiln.param = "w"}, %x: tensor<4xf32> {kiln.input = "x"}) -> (tensor<f32> {kiln.output = "loss"}) {
    // expected-error @+1 {{'kiln.cast' op has kiln.precision.rule = "master-weight-copy" but does not read a parameter argument of @forward}}
    %xl = kiln.cast %x {kiln.precision.rule = "master-weight-copy"} : tensor<4xf32> -> tensor<4xbf16>
    %xf = kiln.cast %xl {kiln.precision.rule = "loss-fp32"} : tensor<4xbf16> -> tensor<4xf32>
    %p = kiln.mul %xf, %w : tensor<4xf32>
    %0 = kiln.reduce_sum %p axes = [0] : tensor<4xf32> -> tensor<f32>
    return %0 : tensor<f32>
  }
}

// -----

// expected-error @+1 {{kiln.train: unknown loss_scale 'adaptive' (expected dynamic, static or none)}}
module attributes {kiln.train = {loss_scale = {name = "adaptive"}}} {
  func.func @forward(%w: tensor<4xf32> {kiln.param = "w"}) -> (tensor<f32> {kiln.output = "loss"}) {
    %0 = kiln.reduce_sum %w axes = [0] : tensor<4xf32> -> tensor<f32>
    return %0 : tensor<f32>
  }
}
