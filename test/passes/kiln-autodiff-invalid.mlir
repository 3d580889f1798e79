// RUN: kiln-opt %s --kiln-autodiff --split-input-file --verify-diagnostics

// Errors of the kiln-autodiff pass. Every kiln op with a float result and a
// float operand has a gradient rule (the ops without one, constant, iota,
// compare and random, have no float operand or no float result and so can
// never lie on a parameter -> loss path). The op without a rule here is
// therefore a non-kiln op: a func.call of a helper that was not inlined.

func.func private @helper(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = kiln.exp %a : tensor<4xf32>
  return %0 : tensor<4xf32>
}
func.func @forward(%w: tensor<4xf32> {kiln.param = "w"}) -> (tensor<f32> {kiln.output = "loss"}) {
  // expected-error @+1 {{'func.call' op has no gradient rule but lies between a parameter and the loss; add GradientOpInterface to it}}
  %0 = func.call @helper(%w) : (tensor<4xf32>) -> tensor<4xf32>
  %1 = kiln.reduce_sum %0 axes = [0] : tensor<4xf32> -> tensor<f32>
  return %1 : tensor<f32>
}

// -----

// The same call off the path (on an input only) is fine: no error, nothing to
// differentiate through it.
func.func private @helper(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = kiln.exp %a : tensor<4xf32>
  return %0 : tensor<4xf32>
}
func.func @forward(%w: tensor<4xf32> {kiln.param = "w"}, %x: tensor<4xf32> {kiln.input = "x"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %0 = func.call @helper(%x) : (tensor<4xf32>) -> tensor<4xf32>
  %1 = kiln.mul %0, %w : tensor<4xf32>
  %2 = kiln.reduce_sum %1 axes = [0] : tensor<4xf32> -> tensor<f32>
  return %2 : tensor<f32>
}

// -----

// expected-error @+1 {{kiln-autodiff needs a func.func @forward}}
module {
  func.func @model(%w: tensor<4xf32>) -> tensor<4xf32> {
    return %w : tensor<4xf32>
  }
}

// -----

// expected-error @+1 {{@grad already exists}}
module {
  func.func @forward(%w: tensor<4xf32> {kiln.param = "w"}) -> (tensor<f32> {kiln.output = "loss"}) {
    %0 = kiln.reduce_sum %w axes = [0] : tensor<4xf32> -> tensor<f32>
    return %0 : tensor<f32>
  }
  func.func @grad() {
    return
  }
}

// -----

// expected-error @+1 {{@forward must return the loss first}}
func.func @forward(%w: tensor<4xf32> {kiln.param = "w"}) {
  return
}
