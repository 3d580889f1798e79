// Op-level gradient checks: gather and scatter_add.
//
// gather along axes 0, 1 and the middle of a rank-3 operand with i32 and i64
// indices, repeated indices, scatter_add along axes 0 and 1, and the round trip.
//
// Each case is a tiny @forward; `kilnc --gradcheck` builds the train program,
// evaluates @grad in float64 on the reference interpreter and compares it with
// 5-point central differences of @forward (docs/training.md). Parameters start
// N(0, 1); float inputs are N(0, 1), integer inputs uniform in their range.
// A non-scalar result y becomes the loss as sum(y * r) with a random input r,
// so every output coordinate carries a different weight.
//
// RUN: split-file %s %t
// RUN: kilnc %t/gather-embedding.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/gather-repeated.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/gather-axis1.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/gather-middle-axis.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/scatter-add.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/scatter-add-axis0.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/gather-scatter-roundtrip.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s

// CHECK: gradcheck: loss
// CHECK-NOT: FAIL
// CHECK: gradcheck: worst relative error {{.*}}, tolerance 1e-06: PASS

//--- gather-embedding.mlir
// Embedding lookup: table[11,7], indices i32[3,5] -> [3,5,7]; 15 indices
// from 11 rows repeat, so scatter_add must sum them.
func.func @forward(%table: tensor<11x7xf32> {kiln.param = "table", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %idx: tensor<3x5xi32> {kiln.input = "idx"},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.gather %table[%idx] axis = 0 : tensor<11x7xf32>, tensor<3x5xi32> -> tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- gather-repeated.mlir
// A 4-row table and 10 indices: repeats are certain; every coordinate
// of the [4,3] table is checked.
func.func @forward(%table: tensor<4x3xf32> {kiln.param = "table", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %idx: tensor<2x5xi32> {kiln.input = "idx"},
                   %r: tensor<2x5x3xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.gather %table[%idx] axis = 0 : tensor<4x3xf32>, tensor<2x5xi32> -> tensor<2x5x3xf32>
  %weighted = kiln.mul %y, %r : tensor<2x5x3xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<2x5x3xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- gather-axis1.mlir
// gather along axis 1 with i64 indices: [2,7] operand, indices [3,2]
// -> [2,3,2].
func.func @forward(%p: tensor<2x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %idx: tensor<3x2xi64> {kiln.input = "idx"},
                   %r: tensor<2x3x2xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.gather %p[%idx] axis = 1 : tensor<2x7xf32>, tensor<3x2xi64> -> tensor<2x3x2xf32>
  %weighted = kiln.mul %y, %r : tensor<2x3x2xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<2x3x2xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- gather-middle-axis.mlir
// gather along the middle axis of a rank-3 operand: [2,5,3], indices [4]
// -> [2,4,3].
func.func @forward(%p: tensor<2x5x3xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %idx: tensor<4xi32> {kiln.input = "idx"},
                   %r: tensor<2x4x3xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y = kiln.gather %p[%idx] axis = 1 : tensor<2x5x3xf32>, tensor<4xi32> -> tensor<2x4x3xf32>
  %weighted = kiln.mul %y, %r : tensor<2x4x3xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<2x4x3xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- scatter-add.mlir
// scatter_add of updates [2,5,3] along axis 1 into [2,4,3]. The index
// input also feeds a gather from a [4] table (whose result enters the loss) so
// the checker draws indices in [0, 4): 5 indices in 4 rows always repeat.
func.func @forward(%u: tensor<2x5x3xf32> {kiln.param = "u", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %idx: tensor<5xi32> {kiln.input = "idx"},
                   %tbl: tensor<4xf32> {kiln.input = "tbl"},
                   %r: tensor<2x4x3xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %s = kiln.scatter_add %u[%idx] axis = 1 : tensor<2x5x3xf32>, tensor<5xi32> -> tensor<2x4x3xf32>
  %g = kiln.gather %tbl[%idx] axis = 0 : tensor<4xf32>, tensor<5xi32> -> tensor<5xf32>
  %gs = kiln.reduce_sum %g axes = [0] : tensor<5xf32> -> tensor<f32>
  %gsb = kiln.broadcast_in_dim %gs, dims = [] : tensor<f32> -> tensor<2x4x3xf32>
  %y = kiln.mul %s, %gsb : tensor<2x4x3xf32>
  %weighted = kiln.mul %y, %r : tensor<2x4x3xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<2x4x3xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- scatter-add-axis0.mlir
// scatter_add along axis 0 (the embedding-gradient layout): updates
// [6,3] into [4,3], indices bounded by a gather from a [4,2] input table.
func.func @forward(%u: tensor<6x3xf32> {kiln.param = "u", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %idx: tensor<6xi32> {kiln.input = "idx"},
                   %tbl: tensor<4x2xf32> {kiln.input = "tbl"},
                   %r: tensor<4x3xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %s = kiln.scatter_add %u[%idx] axis = 0 : tensor<6x3xf32>, tensor<6xi32> -> tensor<4x3xf32>
  %sq = kiln.mul %s, %s : tensor<4x3xf32>
  %g = kiln.gather %tbl[%idx] axis = 0 : tensor<4x2xf32>, tensor<6xi32> -> tensor<6x2xf32>
  %gs = kiln.reduce_sum %g axes = [0, 1] : tensor<6x2xf32> -> tensor<f32>
  %gsb = kiln.broadcast_in_dim %gs, dims = [] : tensor<f32> -> tensor<4x3xf32>
  %y = kiln.add %sq, %gsb : tensor<4x3xf32>
  %weighted = kiln.mul %y, %r : tensor<4x3xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1] : tensor<4x3xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- gather-scatter-roundtrip.mlir
// gather(scatter_add(u, idx), idx): the two rules are each other's
// gradient.
func.func @forward(%u: tensor<5x3xf32> {kiln.param = "u", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %idx: tensor<5xi32> {kiln.input = "idx"},
                   %r: tensor<5x3xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %s = kiln.scatter_add %u[%idx] axis = 0 : tensor<5x3xf32>, tensor<5xi32> -> tensor<4x3xf32>
  %e = kiln.tanh %s : tensor<4x3xf32>
  %y = kiln.gather %e[%idx] axis = 0 : tensor<4x3xf32>, tensor<5xi32> -> tensor<5x3xf32>
  %weighted = kiln.mul %y, %r : tensor<5x3xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1] : tensor<5x3xf32> -> tensor<f32>
  return %loss : tensor<f32>
}
