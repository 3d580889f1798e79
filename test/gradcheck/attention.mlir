// Op-level gradient checks: fused attention (kiln.attention and its
// gradient, kiln.attention_grad, on the reference interpreter).
//
// Attention written from primitives, which kiln-raise-attention turns into
// kiln.attention (the first RUN of each file checks that it did): causal
// with odd sizes, unmasked with a divided scale and an explicit transpose,
// a boolean mask, an additive constant mask, dropout with a seed input;
// and kiln.attention written directly: grouped keys/values (4 query heads
// over 2 key heads) with a value head size unlike the query's, and more
// keys than queries. See softmax.mlir for how --gradcheck works; 1e-6 as
// there (float64 central differences of an exact float64 program).
//
// RUN: split-file %s %t
// RUN: kiln-opt %t/causal.mlir --kiln-raise-attention=min-keys=0 | FileCheck %s --check-prefix=RAISED
// RUN: kilnc %t/causal.mlir --attention=fused --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kiln-opt %t/unmasked-div.mlir --kiln-raise-attention=min-keys=0 | FileCheck %s --check-prefix=RAISED
// RUN: kilnc %t/unmasked-div.mlir --attention=fused --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kiln-opt %t/bool-mask.mlir --kiln-raise-attention=min-keys=0 | FileCheck %s --check-prefix=RAISED
// RUN: kilnc %t/bool-mask.mlir --attention=fused --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kiln-opt %t/additive-mask.mlir --kiln-raise-attention=min-keys=0 | FileCheck %s --check-prefix=RAISED
// RUN: kilnc %t/additive-mask.mlir --attention=fused --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kiln-opt %t/dropout.mlir --kiln-raise-attention=min-keys=0 | FileCheck %s --check-prefix=RAISED
// RUN: kilnc %t/dropout.mlir --attention=fused --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/grouped.mlir --attention=fused --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/rectangle.mlir --attention=fused --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s

// RAISED: kiln.attention_remarks = ["{{.*}}raised kiln.attention
// RAISED-NOT: kiln.softmax
// RAISED: kiln.attention %
// RAISED-NOT: kiln.softmax

// CHECK: gradcheck: loss
// CHECK-NOT: FAIL
// CHECK: gradcheck: worst relative error {{.*}}, tolerance 1e-06: PASS

//--- causal.mlir
// softmax(q kᵀ * 0.5, causal) v over [2, 2, 5, 3] (T = 5: no tile multiple).
func.func @forward(%q: tensor<2x2x5x3xf32> {kiln.param = "q", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %k: tensor<2x2x5x3xf32> {kiln.param = "k", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %v: tensor<2x2x5x3xf32> {kiln.param = "v", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<2x2x5x3xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %s = kiln.matmul %q, %k transpose_rhs : tensor<2x2x5x3xf32>, tensor<2x2x5x3xf32> -> tensor<2x2x5x5xf32>
  %c = kiln.constant dense<5.000000e-01> : tensor<2x2x5x5xf32>
  %ss = kiln.mul %s, %c : tensor<2x2x5x5xf32>
  %rows = kiln.iota dim = 0 : tensor<5x5xi32>
  %cols = kiln.iota dim = 1 : tensor<5x5xi32>
  %m = kiln.compare ge, %rows, %cols : tensor<5x5xi32>
  %mb = kiln.broadcast_in_dim %m, dims = [2, 3] : tensor<5x5xi1> -> tensor<2x2x5x5xi1>
  %ninf = kiln.constant dense<0xFF800000> : tensor<2x2x5x5xf32>
  %sm = kiln.select %mb, %ss, %ninf : tensor<2x2x5x5xi1>, tensor<2x2x5x5xf32>
  %p = kiln.softmax %sm axis = 3 : tensor<2x2x5x5xf32>
  %y = kiln.matmul %p, %v : tensor<2x2x5x5xf32>, tensor<2x2x5x3xf32> -> tensor<2x2x5x3xf32>
  %w = kiln.mul %y, %r : tensor<2x2x5x3xf32>
  %loss = kiln.reduce_sum %w axes = [0, 1, 2, 3] : tensor<2x2x5x3xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- unmasked-div.mlir
// softmax(q transpose(k) / 2) v, keys transposed by a [0, 1, 3, 2] transpose.
func.func @forward(%q: tensor<1x3x4x2xf32> {kiln.param = "q", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %k: tensor<1x3x6x2xf32> {kiln.param = "k", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %v: tensor<1x3x6x5xf32> {kiln.param = "v", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<1x3x4x5xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %kt = kiln.transpose %k perm = [0, 1, 3, 2] : tensor<1x3x6x2xf32> -> tensor<1x3x2x6xf32>
  %s = kiln.matmul %q, %kt : tensor<1x3x4x2xf32>, tensor<1x3x2x6xf32> -> tensor<1x3x4x6xf32>
  %c = kiln.constant dense<2.000000e+00> : tensor<1x3x4x6xf32>
  %ss = kiln.div %s, %c : tensor<1x3x4x6xf32>
  %p = kiln.softmax %ss axis = 3 : tensor<1x3x4x6xf32>
  %y = kiln.matmul %p, %v : tensor<1x3x4x6xf32>, tensor<1x3x6x5xf32> -> tensor<1x3x4x5xf32>
  %w = kiln.mul %y, %r : tensor<1x3x4x5xf32>
  %loss = kiln.reduce_sum %w axes = [0, 1, 2, 3] : tensor<1x3x4x5xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- bool-mask.mlir
// A boolean [T, S] mask that is not causal (cols <= rows + 1): a mask operand.
func.func @forward(%q: tensor<2x1x4x3xf32> {kiln.param = "q", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %k: tensor<2x1x4x3xf32> {kiln.param = "k", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %v: tensor<2x1x4x3xf32> {kiln.param = "v", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<2x1x4x3xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %s = kiln.matmul %q, %k transpose_rhs : tensor<2x1x4x3xf32>, tensor<2x1x4x3xf32> -> tensor<2x1x4x4xf32>
  %rows = kiln.iota dim = 0 : tensor<4x4xi32>
  %cols = kiln.iota dim = 1 : tensor<4x4xi32>
  %one = kiln.constant dense<1> : tensor<4x4xi32>
  %lim = kiln.add %rows, %one : tensor<4x4xi32>
  %m = kiln.compare le, %cols, %lim : tensor<4x4xi32>
  %mb = kiln.broadcast_in_dim %m, dims = [2, 3] : tensor<4x4xi1> -> tensor<2x1x4x4xi1>
  %ninf = kiln.constant dense<0xFF800000> : tensor<2x1x4x4xf32>
  %sm = kiln.select %mb, %s, %ninf : tensor<2x1x4x4xi1>, tensor<2x1x4x4xf32>
  %p = kiln.softmax %sm axis = 3 : tensor<2x1x4x4xf32>
  %y = kiln.matmul %p, %v : tensor<2x1x4x4xf32>, tensor<2x1x4x3xf32> -> tensor<2x1x4x3xf32>
  %w = kiln.mul %y, %r : tensor<2x1x4x3xf32>
  %loss = kiln.reduce_sum %w axes = [0, 1, 2, 3] : tensor<2x1x4x3xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- additive-mask.mlir
// scores + a constant [T, S] bias (ALiBi-like), scaled first.
func.func @forward(%q: tensor<1x2x3x2xf32> {kiln.param = "q", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %k: tensor<1x2x3x2xf32> {kiln.param = "k", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %v: tensor<1x2x3x2xf32> {kiln.param = "v", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<1x2x3x2xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %s = kiln.matmul %q, %k transpose_rhs : tensor<1x2x3x2xf32>, tensor<1x2x3x2xf32> -> tensor<1x2x3x3xf32>
  %c = kiln.constant dense<7.000000e-01> : tensor<1x2x3x3xf32>
  %ss = kiln.mul %c, %s : tensor<1x2x3x3xf32>
  %bias = kiln.constant dense<[[0.0, -1.0, -2.0], [-1.0, 0.0, -1.0], [-2.0, -1.0, 0.0]]> : tensor<3x3xf32>
  %bb = kiln.broadcast_in_dim %bias, dims = [2, 3] : tensor<3x3xf32> -> tensor<1x2x3x3xf32>
  %sb = kiln.add %ss, %bb : tensor<1x2x3x3xf32>
  %p = kiln.softmax %sb axis = 3 : tensor<1x2x3x3xf32>
  %y = kiln.matmul %p, %v : tensor<1x2x3x3xf32>, tensor<1x2x3x2xf32> -> tensor<1x2x3x2xf32>
  %w = kiln.mul %y, %r : tensor<1x2x3x2xf32>
  %loss = kiln.reduce_sum %w axes = [0, 1, 2, 3] : tensor<1x2x3x2xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- dropout.mlir
// Causal attention with dropout 0.3 on the probabilities (the checker feeds
// dropout_seed = 12345): the fused op drops exactly what kiln.dropout drops.
func.func @forward(%q: tensor<1x2x5x3xf32> {kiln.param = "q", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %k: tensor<1x2x5x3xf32> {kiln.param = "k", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %v: tensor<1x2x5x3xf32> {kiln.param = "v", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %dropout_seed: tensor<i64> {kiln.input = "dropout_seed"},
                   %r: tensor<1x2x5x3xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %s = kiln.matmul %q, %k transpose_rhs : tensor<1x2x5x3xf32>, tensor<1x2x5x3xf32> -> tensor<1x2x5x5xf32>
  %rows = kiln.iota dim = 0 : tensor<5x5xi32>
  %cols = kiln.iota dim = 1 : tensor<5x5xi32>
  %m = kiln.compare ge, %rows, %cols : tensor<5x5xi32>
  %mb = kiln.broadcast_in_dim %m, dims = [2, 3] : tensor<5x5xi1> -> tensor<1x2x5x5xi1>
  %ninf = kiln.constant dense<0xFF800000> : tensor<1x2x5x5xf32>
  %sm = kiln.select %mb, %s, %ninf : tensor<1x2x5x5xi1>, tensor<1x2x5x5xf32>
  %p = kiln.softmax %sm axis = 3 : tensor<1x2x5x5xf32>
  %pd = kiln.dropout %p, %dropout_seed rate = 3.000000e-01 salt = 4 : tensor<1x2x5x5xf32>, tensor<i64>
  %y = kiln.matmul %pd, %v : tensor<1x2x5x5xf32>, tensor<1x2x5x3xf32> -> tensor<1x2x5x3xf32>
  %w = kiln.mul %y, %r : tensor<1x2x5x3xf32>
  %loss = kiln.reduce_sum %w axes = [0, 1, 2, 3] : tensor<1x2x5x3xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- grouped.mlir
// kiln.attention itself: 4 query heads over 2 key/value heads, causal, value
// head size 3 against a query head size 2.
func.func @forward(%q: tensor<1x4x5x2xf32> {kiln.param = "q", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %k: tensor<1x2x5x2xf32> {kiln.param = "k", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %v: tensor<1x2x5x3xf32> {kiln.param = "v", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<1x4x5x3xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %y, %lse = kiln.attention %q, %k, %v scale = 0.6 causal : tensor<1x4x5x2xf32>, tensor<1x2x5x2xf32>, tensor<1x2x5x3xf32>
  %w = kiln.mul %y, %r : tensor<1x4x5x3xf32>
  %loss = kiln.reduce_sum %w axes = [0, 1, 2, 3] : tensor<1x4x5x3xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- rectangle.mlir
// kiln.attention with 3 queries over 7 keys and a [B, 1, T, S] boolean mask
// input... as a constant here (inputs are sampled, and a row with every key
// dropped has no gradient to check).
func.func @forward(%q: tensor<2x2x3x2xf32> {kiln.param = "q", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %k: tensor<2x2x7x2xf32> {kiln.param = "k", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %v: tensor<2x2x7x2xf32> {kiln.param = "v", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<2x2x3x2xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %m = kiln.constant dense<[[[[true, true, false, true, true, false, true], [false, true, true, true, false, true, true], [true, false, true, true, true, true, false]]], [[[true, true, true, true, true, true, false], [false, false, true, false, true, true, true], [true, true, false, false, true, true, true]]]]> : tensor<2x1x3x7xi1>
  %y, %lse = kiln.attention %q, %k, %v mask(%m : tensor<2x1x3x7xi1>) scale = 0.9 : tensor<2x2x3x2xf32>, tensor<2x2x7x2xf32>, tensor<2x2x7x2xf32>
  %w = kiln.mul %y, %r : tensor<2x2x3x2xf32>
  %loss = kiln.reduce_sum %w axes = [0, 1, 2, 3] : tensor<2x2x3x2xf32> -> tensor<f32>
  return %loss : tensor<f32>
}
