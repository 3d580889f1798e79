// Op-level gradient checks: select and compare.
//
// select with predicates from compare (every direction) on parameters, inputs
// and iotas; compare itself is not differentiable (i1) and sits off the path.
//
// Each case is a tiny @forward; `kilnc --gradcheck` builds the train program,
// evaluates @grad in float64 on the reference interpreter and compares it with
// 5-point central differences of @forward (docs/training.md). Parameters start
// N(0, 1); float inputs are N(0, 1), integer inputs uniform in their range.
// A non-scalar result y becomes the loss as sum(y * r) with a random input r,
// so every output coordinate carries a different weight.
//
// RUN: split-file %s %t
// RUN: kilnc %t/select-compare.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/select-input-pred.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/select-same-value.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/compare-all-directions.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/compare-param.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s

// CHECK: gradcheck: loss
// CHECK-NOT: FAIL
// CHECK: gradcheck: worst relative error {{.*}}, tolerance 1e-06: PASS

//--- select-compare.mlir
// select(a > c, a, c) built from compare and select (a max by hand):
// the predicate gets no gradient, each branch gets g where chosen.
func.func @forward(%a: tensor<3x5x7xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %c: tensor<3x5x7xf32> {kiln.param = "c", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %gt = kiln.compare gt, %a, %c : tensor<3x5x7xf32>
  %y = kiln.select %gt, %a, %c : tensor<3x5x7xi1>, tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- select-input-pred.mlir
// The predicate comes from an input (x < 0.3); the branches are
// exp(a) and c*c.
func.func @forward(%a: tensor<3x5xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %c: tensor<3x5xf32> {kiln.param = "c", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %x: tensor<3x5xf32> {kiln.input = "x"},
                   %r: tensor<3x5xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %thr = kiln.constant dense<3.000000e-01> : tensor<3x5xf32>
  %lt = kiln.compare lt, %x, %thr : tensor<3x5xf32>
  %ea = kiln.exp %a : tensor<3x5xf32>
  %cc = kiln.mul %c, %c : tensor<3x5xf32>
  %y = kiln.select %lt, %ea, %cc : tensor<3x5xi1>, tensor<3x5xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1] : tensor<3x5xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- select-same-value.mlir
// Both branches read the same value: select(p, a, -a), i.e. a * (p ? 1 : -1)
// with p from an integer compare of iotas (ne).
func.func @forward(%a: tensor<3x5xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %i = kiln.iota dim = 0 : tensor<3x5xi32>
  %j = kiln.iota dim = 1 : tensor<3x5xi32>
  %ne = kiln.compare ne, %i, %j : tensor<3x5xi32>
  %na = kiln.neg %a : tensor<3x5xf32>
  %y = kiln.select %ne, %a, %na : tensor<3x5xi1>, tensor<3x5xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1] : tensor<3x5xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- compare-all-directions.mlir
// Each comparison direction (eq ne lt le gt ge) drives a select
// between a and a*a; only the branch values carry gradients.
func.func @forward(%a: tensor<2x7xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %x: tensor<2x7xf32> {kiln.input = "x"},
                   %r: tensor<2x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %zero = kiln.constant dense<0.000000e+00> : tensor<2x7xf32>
  %sq = kiln.mul %a, %a : tensor<2x7xf32>
  %p1 = kiln.compare eq, %x, %zero : tensor<2x7xf32>
  %p2 = kiln.compare ne, %x, %zero : tensor<2x7xf32>
  %p3 = kiln.compare lt, %x, %zero : tensor<2x7xf32>
  %p4 = kiln.compare le, %x, %zero : tensor<2x7xf32>
  %p5 = kiln.compare gt, %x, %zero : tensor<2x7xf32>
  %p6 = kiln.compare ge, %x, %zero : tensor<2x7xf32>
  %s1 = kiln.select %p1, %a, %sq : tensor<2x7xi1>, tensor<2x7xf32>
  %s2 = kiln.select %p2, %a, %sq : tensor<2x7xi1>, tensor<2x7xf32>
  %s3 = kiln.select %p3, %a, %sq : tensor<2x7xi1>, tensor<2x7xf32>
  %s4 = kiln.select %p4, %a, %sq : tensor<2x7xi1>, tensor<2x7xf32>
  %s5 = kiln.select %p5, %a, %sq : tensor<2x7xi1>, tensor<2x7xf32>
  %s6 = kiln.select %p6, %a, %sq : tensor<2x7xi1>, tensor<2x7xf32>
  %t1 = kiln.add %s1, %s2 : tensor<2x7xf32>
  %t2 = kiln.mul %s3, %s4 : tensor<2x7xf32>
  %t3 = kiln.sub %s5, %s6 : tensor<2x7xf32>
  %t4 = kiln.add %t1, %t2 : tensor<2x7xf32>
  %y = kiln.add %t4, %t3 : tensor<2x7xf32>
  %weighted = kiln.mul %y, %r : tensor<2x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1] : tensor<2x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- compare-param.mlir
// compare on a parameter-dependent value (a > 0) used as a predicate:
// the compare is off the gradient path (i1 result) and needs no rule.
func.func @forward(%a: tensor<3x5xf32> {kiln.param = "a", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %zero = kiln.constant dense<0.000000e+00> : tensor<3x5xf32>
  %pos = kiln.compare gt, %a, %zero : tensor<3x5xf32>
  %sa = kiln.sin %a : tensor<3x5xf32>
  %y = kiln.select %pos, %sa, %a : tensor<3x5xi1>, tensor<3x5xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1] : tensor<3x5xf32> -> tensor<f32>
  return %loss : tensor<f32>
}
