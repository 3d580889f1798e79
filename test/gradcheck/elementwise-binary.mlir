// Op-level gradient checks: binary elementwise ops.
//
// add sub mul div pow max min, ties of max/min (they go to the lhs), a value
// with several uses, operands broadcast from [7] and [5,1] parameters, and
// parameters combined with inputs.
//
// Each case is a tiny @forward; `kilnc --gradcheck` builds the train program,
// evaluates @grad in float64 on the reference interpreter and compares it with
// 5-point central differences of @forward (docs/training.md). Parameters start
// N(0, 1); float inputs are N(0, 1), integer inputs uniform in their range.
// A non-scalar result y becomes the loss as sum(y * r) with a random input r,
// so every output coordinate carries a different weight.
//
// RUN: split-file %s %t
// RUN: kilnc %t/add.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/sub.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/mul.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/div.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/pow.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/max.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/min.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/max-tie.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/min-tie.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/fan-out.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/broadcast-operands.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/input-operand.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s

// CHECK: gradcheck: loss
// CHECK-NOT: FAIL
// CHECK: gradcheck: worst relative error {{.*}}, tolerance 1e-06: PASS

//--- add.mlir
// kiln.add of two [3,5,7] parameters.
func.func @forward(%a: tensor<3x5x7xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %c: tensor<3x5x7xf32> {kiln.param = "c", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.add %a, %c : tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- sub.mlir
// kiln.sub: the rhs gets -g.
func.func @forward(%a: tensor<3x5x7xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %c: tensor<3x5x7xf32> {kiln.param = "c", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.sub %a, %c : tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- mul.mlir
// kiln.mul: each side gets g times the other operand.
func.func @forward(%a: tensor<3x5x7xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %c: tensor<3x5x7xf32> {kiln.param = "c", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.mul %a, %c : tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- div.mlir
// kiln.div by c*c + 0.5 (kept away from 0).
func.func @forward(%a: tensor<3x5x7xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %c: tensor<3x5x7xf32> {kiln.param = "c", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %half = kiln.constant dense<5.000000e-01> : tensor<3x5x7xf32>
  %cc = kiln.mul %c, %c : tensor<3x5x7xf32>
  %d = kiln.add %cc, %half : tensor<3x5x7xf32>
  %y = kiln.div %a, %d : tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- pow.mlir
// kiln.pow with base a*a + 0.5 (positive) and a free exponent c: both
// the base rule (g e a^(e-1)) and the exponent rule (g y ln a) are checked.
func.func @forward(%a: tensor<3x5x7xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %c: tensor<3x5x7xf32> {kiln.param = "c", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %half = kiln.constant dense<5.000000e-01> : tensor<3x5x7xf32>
  %aa = kiln.mul %a, %a : tensor<3x5x7xf32>
  %base = kiln.add %aa, %half : tensor<3x5x7xf32>
  %y = kiln.pow %base, %c : tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- max.mlir
// kiln.max of two independent normal tensors (no ties).
func.func @forward(%a: tensor<3x5x7xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %c: tensor<3x5x7xf32> {kiln.param = "c", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.max %a, %c : tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- min.mlir
// kiln.min of two independent normal tensors (no ties).
func.func @forward(%a: tensor<3x5x7xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %c: tensor<3x5x7xf32> {kiln.param = "c", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.min %a, %c : tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- max-tie.mlir
// kiln.max(a, a): every element is a tie; the gradient goes to the lhs only,
// so d/da = 1 exactly (not 2, not 0).
func.func @forward(%a: tensor<3x5x7xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.max %a, %a : tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- min-tie.mlir
// kiln.min(a, a): ties go to the lhs, d/da = 1.
func.func @forward(%a: tensor<3x5xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.min %a, %a : tensor<3x5xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1] : tensor<3x5xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- fan-out.mlir
// One value used several times: contributions are summed
// (y = a*a + a/(a*a + 1) - a).
func.func @forward(%a: tensor<3x5xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %one = kiln.constant dense<1.000000e+00> : tensor<3x5xf32>
  %sq = kiln.mul %a, %a : tensor<3x5xf32>
  %den = kiln.add %sq, %one : tensor<3x5xf32>
  %q = kiln.div %a, %den : tensor<3x5xf32>
  %s = kiln.add %sq, %q : tensor<3x5xf32>
  %y = kiln.sub %s, %a : tensor<3x5xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1] : tensor<3x5xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- broadcast-operands.mlir
// Binary ops whose operands are broadcasts of a [7] and a [5,1] parameter
// into [3,5,7] (the bias / per-row scale patterns), all coordinates checked.
func.func @forward(%a: tensor<3x5x7xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %v: tensor<7xf32> {kiln.param = "v", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %w: tensor<5x1xf32> {kiln.param = "w", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %vb = kiln.broadcast_in_dim %v, dims = [2] : tensor<7xf32> -> tensor<3x5x7xf32>
  %wb = kiln.broadcast_in_dim %w, dims = [1, 2] : tensor<5x1xf32> -> tensor<3x5x7xf32>
  %s = kiln.add %a, %vb : tensor<3x5x7xf32>
  %m = kiln.mul %s, %wb : tensor<3x5x7xf32>
  %e = kiln.exp %wb : tensor<3x5x7xf32>
  %q = kiln.div %m, %e : tensor<3x5x7xf32>
  %y = kiln.sub %q, %vb : tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- input-operand.mlir
// A parameter combined with inputs: only the parameter side is
// differentiated (exp(x) / (a*a + 1), (a*a + 1) ^ x).
func.func @forward(%a: tensor<3x5xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %x: tensor<3x5xf32> {kiln.input = "x"},
                   %r: tensor<3x5xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %one = kiln.constant dense<1.000000e+00> : tensor<3x5xf32>
  %sq = kiln.mul %a, %a : tensor<3x5xf32>
  %base = kiln.add %sq, %one : tensor<3x5xf32>
  %ex = kiln.exp %x : tensor<3x5xf32>
  %q = kiln.div %ex, %base : tensor<3x5xf32>
  %pw = kiln.pow %base, %x : tensor<3x5xf32>
  %y = kiln.add %q, %pw : tensor<3x5xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1] : tensor<3x5xf32> -> tensor<f32>
  return %loss : tensor<f32>
}
