// Op-level gradient checks: softmax and log_softmax.
//
// softmax and log_softmax over the last, middle and first axes of [3,5,7],
// and a causally masked softmax feeding a matmul.
//
// Each case is a tiny @forward; `kilnc --gradcheck` builds the train program,
// evaluates @grad in float64 on the reference interpreter and compares it with
// 5-point central differences of @forward (docs/training.md). Parameters start
// N(0, 1); float inputs are N(0, 1), integer inputs uniform in their range.
// A non-scalar result y becomes the loss as sum(y * r) with a random input r,
// so every output coordinate carries a different weight.
//
// RUN: split-file %s %t
// RUN: kilnc %t/softmax-last.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/softmax-middle.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/softmax-first.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/log-softmax-last.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/log-softmax-middle.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/log-softmax-first.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/softmax-small.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/softmax-masked.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s

// CHECK: gradcheck: loss
// CHECK-NOT: FAIL
// CHECK: gradcheck: worst relative error {{.*}}, tolerance 1e-06: PASS

//--- softmax-last.mlir
// softmax over the last axis of p * broadcast(s[7]).
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %s: tensor<7xf32> {kiln.param = "s", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %sb = kiln.broadcast_in_dim %s, dims = [2] : tensor<7xf32> -> tensor<3x5x7xf32>
  %x = kiln.mul %p, %sb : tensor<3x5x7xf32>
  %y = kiln.softmax %x axis = 2 : tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- softmax-middle.mlir
// softmax over axis 1 (not the last).
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %s: tensor<7xf32> {kiln.param = "s", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %sb = kiln.broadcast_in_dim %s, dims = [2] : tensor<7xf32> -> tensor<3x5x7xf32>
  %x = kiln.mul %p, %sb : tensor<3x5x7xf32>
  %y = kiln.softmax %x axis = 1 : tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- softmax-first.mlir
// softmax over axis 0.
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %s: tensor<7xf32> {kiln.param = "s", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %sb = kiln.broadcast_in_dim %s, dims = [2] : tensor<7xf32> -> tensor<3x5x7xf32>
  %x = kiln.mul %p, %sb : tensor<3x5x7xf32>
  %y = kiln.softmax %x axis = 0 : tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- log-softmax-last.mlir
// log_softmax over the last axis.
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %s: tensor<7xf32> {kiln.param = "s", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %sb = kiln.broadcast_in_dim %s, dims = [2] : tensor<7xf32> -> tensor<3x5x7xf32>
  %x = kiln.mul %p, %sb : tensor<3x5x7xf32>
  %y = kiln.log_softmax %x axis = 2 : tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- log-softmax-middle.mlir
// log_softmax over axis 1.
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %s: tensor<7xf32> {kiln.param = "s", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %sb = kiln.broadcast_in_dim %s, dims = [2] : tensor<7xf32> -> tensor<3x5x7xf32>
  %x = kiln.mul %p, %sb : tensor<3x5x7xf32>
  %y = kiln.log_softmax %x axis = 1 : tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- log-softmax-first.mlir
// log_softmax over axis 0.
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %s: tensor<7xf32> {kiln.param = "s", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %sb = kiln.broadcast_in_dim %s, dims = [2] : tensor<7xf32> -> tensor<3x5x7xf32>
  %x = kiln.mul %p, %sb : tensor<3x5x7xf32>
  %y = kiln.log_softmax %x axis = 0 : tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- softmax-small.mlir
// softmax of a [2,5] parameter: every coordinate checked.
func.func @forward(%p: tensor<2x5xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<2x5xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.softmax %p axis = 1 : tensor<2x5xf32>
  %weighted = kiln.mul %y, %r : tensor<2x5xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1] : tensor<2x5xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- softmax-masked.mlir
// Causal attention pattern: scores[5,5] masked with iota/compare/select
// (-1e4 above the diagonal), softmax, then times a value matrix v[5,3].
func.func @forward(%scores: tensor<5x5xf32> {kiln.param = "scores", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %v: tensor<5x3xf32> {kiln.param = "v", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<5x3xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %rows = kiln.iota dim = 0 : tensor<5x5xi32>
  %cols = kiln.iota dim = 1 : tensor<5x5xi32>
  %mask = kiln.compare ge, %rows, %cols : tensor<5x5xi32>
  %ninf = kiln.constant dense<-1.000000e+04> : tensor<5x5xf32>
  %m = kiln.select %mask, %scores, %ninf : tensor<5x5xi1>, tensor<5x5xf32>
  %pr = kiln.softmax %m axis = 1 : tensor<5x5xf32>
  %y = kiln.matmul %pr, %v : tensor<5x5xf32>, tensor<5x3xf32> -> tensor<5x3xf32>
  %weighted = kiln.mul %y, %r : tensor<5x3xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1] : tensor<5x3xf32> -> tensor<f32>
  return %loss : tensor<f32>
}
