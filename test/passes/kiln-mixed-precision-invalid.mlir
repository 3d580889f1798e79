// RUN: kiln-opt %s --kiln-mixed-precision --split-input-file --verify-diagnostics

// Errors of kiln-mixed-precision.

// An op without a policy (PrecisionOpInterface) is refused. Every kiln op
// but the kernel-level kiln.fusion and kiln.yield must answer it (the build
// fails otherwise), so a new op cannot escape the policy silently.
module attributes {kiln.train = {precision = "bf16"}} {
  func.func @forward(%w: tensor<4xf32> {kiln.param = "w"}) -> (tensor<f32> {kiln.output = "loss"}) {
    // expected-error @+1 {{'kiln.fusion' op has no mixed-precision policy (PrecisionOpInterface, answered in the op's family file under dialects/kiln/ops/)}}
    %0 = kiln.fusion "elementwise" rows = 0 ins(%w) : (tensor<4xf32>) -> tensor<4xf32> {
    ^bb0(%x: tensor<4xf32>):
      %1 = kiln.relu %x : tensor<4xf32>
      kiln.yield %1 : tensor<4xf32>
    }
    %2 = kiln.reduce_sum %0 axes = [0] : tensor<4xf32> -> tensor<f32>
    return %2 : tensor<f32>
  }
}

// -----

// The dialect verifies the train section's values (verifyTrainSettings)
// before any pass runs.
// expected-error @+1 {{kiln.train: precision 'fp8' is not fp32, tf32, bf16 or fp16}}
module attributes {kiln.train = {precision = "fp8"}} {
  func.func @forward(%w: tensor<4xf32> {kiln.param = "w"}) -> (tensor<4xf32> {kiln.output = "loss"}) {
    return %w : tensor<4xf32>
  }
}

// -----

// expected-error @+1 {{kiln.train: precision_mode 'amp' is not kiln or autocast}}
module attributes {kiln.train = {precision = "bf16", precision_mode = "amp"}} {
  func.func @forward(%w: tensor<4xf32> {kiln.param = "w"}) -> (tensor<4xf32> {kiln.output = "loss"}) {
    return %w : tensor<4xf32>
  }
}

// -----

// expected-error @+1 {{kiln-mixed-precision needs a func.func @forward}}
module attributes {kiln.train = {precision = "bf16"}} {
  func.func @model(%w: tensor<4xf32>) -> tensor<4xf32> {
    return %w : tensor<4xf32>
  }
}

// -----

// expected-error @+1 {{this module already has the training program}}
module attributes {kiln.train = {precision = "fp16"}} {
  func.func @forward(%w: tensor<4xf32> {kiln.param = "w"}) -> (tensor<4xf32> {kiln.output = "loss"}) {
    return %w : tensor<4xf32>
  }
  func.func @train_step(%w: tensor<4xf32>) -> tensor<4xf32> {
    return %w : tensor<4xf32>
  }
}

// -----

// The module attributes the pass sets are checked by the dialect.
// expected-error @+1 {{'kiln.precision' must be "bf16" or "fp16"}}
module attributes {kiln.precision = "fp8"} {
}
