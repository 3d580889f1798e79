// Op-level gradient checks: unary elementwise ops.
//
// neg abs exp log sqrt rsqrt tanh sigmoid silu softplus relu erf cos sin, gelu (erf and tanh)
// and cast (f32 -> f64 -> f32, f32 -> f16 / bf16 -> f32). The operand is
// p[3,5,7] + broadcast(b[7]), so b's 7 coordinates are all checked (each sums 15
// positions) and p is sampled.
//
// Each case is a tiny @forward; `kilnc --gradcheck` builds the train program,
// evaluates @grad in float64 on the reference interpreter and compares it with
// 5-point central differences of @forward (docs/training.md). Parameters start
// N(0, 1); float inputs are N(0, 1), integer inputs uniform in their range.
// A non-scalar result y becomes the loss as sum(y * r) with a random input r,
// so every output coordinate carries a different weight.
//
// RUN: split-file %s %t
// RUN: kilnc %t/neg.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/abs.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/exp.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/log.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/sqrt.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/rsqrt.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/tanh.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/sigmoid.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/silu.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/softplus.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/relu.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/erf.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/cos.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/sin.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/gelu-erf.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/gelu-tanh.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/cast-chain.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/cast-chain-f16.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/cast-chain-bf16.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s
// RUN: kilnc %t/small-exhaustive.mlir --gradcheck --gradcheck-tolerance 1e-6 | FileCheck %s

// CHECK: gradcheck: loss
// CHECK-NOT: FAIL
// CHECK: gradcheck: worst relative error {{.*}}, tolerance 1e-06: PASS

//--- neg.mlir
// kiln.neg of p + broadcast(b[7]) over [3,5,7].
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<7xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %bb = kiln.broadcast_in_dim %b, dims = [2] : tensor<7xf32> -> tensor<3x5x7xf32>
  %x = kiln.add %p, %bb : tensor<3x5x7xf32>
  %y = kiln.neg %x : tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- abs.mlir
// kiln.abs; random normal inputs keep away from the kink at 0.
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<7xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %bb = kiln.broadcast_in_dim %b, dims = [2] : tensor<7xf32> -> tensor<3x5x7xf32>
  %x = kiln.add %p, %bb : tensor<3x5x7xf32>
  %y = kiln.abs %x : tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- exp.mlir
// kiln.exp of p + broadcast(b[7]) over [3,5,7].
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<7xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %bb = kiln.broadcast_in_dim %b, dims = [2] : tensor<7xf32> -> tensor<3x5x7xf32>
  %x = kiln.add %p, %bb : tensor<3x5x7xf32>
  %y = kiln.exp %x : tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- log.mlir
// kiln.log of x*x + 0.5 (positive).
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<7xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %bb = kiln.broadcast_in_dim %b, dims = [2] : tensor<7xf32> -> tensor<3x5x7xf32>
  %x = kiln.add %p, %bb : tensor<3x5x7xf32>
  %half = kiln.constant dense<5.000000e-01> : tensor<3x5x7xf32>
  %xx = kiln.mul %x, %x : tensor<3x5x7xf32>
  %u = kiln.add %xx, %half : tensor<3x5x7xf32>
  %y = kiln.log %u : tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- sqrt.mlir
// kiln.sqrt of x*x + 0.5 (positive).
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<7xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %bb = kiln.broadcast_in_dim %b, dims = [2] : tensor<7xf32> -> tensor<3x5x7xf32>
  %x = kiln.add %p, %bb : tensor<3x5x7xf32>
  %half = kiln.constant dense<5.000000e-01> : tensor<3x5x7xf32>
  %xx = kiln.mul %x, %x : tensor<3x5x7xf32>
  %u = kiln.add %xx, %half : tensor<3x5x7xf32>
  %y = kiln.sqrt %u : tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- rsqrt.mlir
// kiln.rsqrt of x*x + 0.5 (positive).
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<7xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %bb = kiln.broadcast_in_dim %b, dims = [2] : tensor<7xf32> -> tensor<3x5x7xf32>
  %x = kiln.add %p, %bb : tensor<3x5x7xf32>
  %half = kiln.constant dense<5.000000e-01> : tensor<3x5x7xf32>
  %xx = kiln.mul %x, %x : tensor<3x5x7xf32>
  %u = kiln.add %xx, %half : tensor<3x5x7xf32>
  %y = kiln.rsqrt %u : tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- tanh.mlir
// kiln.tanh of p + broadcast(b[7]) over [3,5,7].
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<7xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %bb = kiln.broadcast_in_dim %b, dims = [2] : tensor<7xf32> -> tensor<3x5x7xf32>
  %x = kiln.add %p, %bb : tensor<3x5x7xf32>
  %y = kiln.tanh %x : tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- sigmoid.mlir
// kiln.sigmoid of p + broadcast(b[7]) over [3,5,7].
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<7xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %bb = kiln.broadcast_in_dim %b, dims = [2] : tensor<7xf32> -> tensor<3x5x7xf32>
  %x = kiln.add %p, %bb : tensor<3x5x7xf32>
  %y = kiln.sigmoid %x : tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- silu.mlir
// kiln.silu of p + broadcast(b[7]) over [3,5,7].
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<7xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %bb = kiln.broadcast_in_dim %b, dims = [2] : tensor<7xf32> -> tensor<3x5x7xf32>
  %x = kiln.add %p, %bb : tensor<3x5x7xf32>
  %y = kiln.silu %x : tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- softplus.mlir
// kiln.softplus of p + broadcast(b[7]) over [3,5,7].
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<7xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %bb = kiln.broadcast_in_dim %b, dims = [2] : tensor<7xf32> -> tensor<3x5x7xf32>
  %x = kiln.add %p, %bb : tensor<3x5x7xf32>
  %y = kiln.softplus %x : tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- relu.mlir
// kiln.relu; random normal inputs keep away from the kink at 0.
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<7xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %bb = kiln.broadcast_in_dim %b, dims = [2] : tensor<7xf32> -> tensor<3x5x7xf32>
  %x = kiln.add %p, %bb : tensor<3x5x7xf32>
  %y = kiln.relu %x : tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- erf.mlir
// kiln.erf of p + broadcast(b[7]) over [3,5,7].
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<7xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %bb = kiln.broadcast_in_dim %b, dims = [2] : tensor<7xf32> -> tensor<3x5x7xf32>
  %x = kiln.add %p, %bb : tensor<3x5x7xf32>
  %y = kiln.erf %x : tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- cos.mlir
// kiln.cos of p + broadcast(b[7]) over [3,5,7].
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<7xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %bb = kiln.broadcast_in_dim %b, dims = [2] : tensor<7xf32> -> tensor<3x5x7xf32>
  %x = kiln.add %p, %bb : tensor<3x5x7xf32>
  %y = kiln.cos %x : tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- sin.mlir
// kiln.sin of p + broadcast(b[7]) over [3,5,7].
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<7xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %bb = kiln.broadcast_in_dim %b, dims = [2] : tensor<7xf32> -> tensor<3x5x7xf32>
  %x = kiln.add %p, %bb : tensor<3x5x7xf32>
  %y = kiln.sin %x : tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- gelu-erf.mlir
// kiln.gelu erf (exact GELU).
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<7xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %bb = kiln.broadcast_in_dim %b, dims = [2] : tensor<7xf32> -> tensor<3x5x7xf32>
  %x = kiln.add %p, %bb : tensor<3x5x7xf32>
  %y = kiln.gelu erf, %x : tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- gelu-tanh.mlir
// kiln.gelu tanh (the tanh approximation).
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<7xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %bb = kiln.broadcast_in_dim %b, dims = [2] : tensor<7xf32> -> tensor<3x5x7xf32>
  %x = kiln.add %p, %bb : tensor<3x5x7xf32>
  %y = kiln.gelu tanh, %x : tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- cast-chain.mlir
// kiln.cast f32 -> f64, an op in f64, then f64 -> f32: the gradient is cast
// back at each step. Note: --gradcheck now raises every f32 in @forward to f64
// first, so these two casts become f64 -> f64 and fold away; the f16 / bf16
// chains below keep real casts.
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %b: tensor<7xf32> {kiln.param = "b", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5x7xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %bb = kiln.broadcast_in_dim %b, dims = [2] : tensor<7xf32> -> tensor<3x5x7xf32>
  %x = kiln.add %p, %bb : tensor<3x5x7xf32>
  %x64 = kiln.cast %x : tensor<3x5x7xf32> -> tensor<3x5x7xf64>
  %t64 = kiln.tanh %x64 : tensor<3x5x7xf64>
  %y = kiln.cast %t64 : tensor<3x5x7xf64> -> tensor<3x5x7xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5x7xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- cast-chain-f16.mlir
// kiln.cast through f16 and back (f32 -> f16 -> exp in f16 -> f32). Unlike the
// f64 chain this stays a real cast when --gradcheck raises f32 to f64.
func.func @forward(%p: tensor<3x5xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %h = kiln.cast %p : tensor<3x5xf32> -> tensor<3x5xf16>
  %e = kiln.sin %h : tensor<3x5xf16>
  %y = kiln.cast %e : tensor<3x5xf16> -> tensor<3x5xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1] : tensor<3x5xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- cast-chain-bf16.mlir
// kiln.cast f32 -> bf16 -> f32 around a mul by itself (two uses of the
// bf16 value).
func.func @forward(%p: tensor<3x5xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %h = kiln.cast %p : tensor<3x5xf32> -> tensor<3x5xbf16>
  %sq = kiln.mul %h, %h : tensor<3x5xbf16>
  %y = kiln.cast %sq : tensor<3x5xbf16> -> tensor<3x5xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1] : tensor<3x5xf32> -> tensor<f32>
  return %loss : tensor<f32>
}

//--- small-exhaustive.mlir
// Every coordinate of a small (<= 16 elements) parameter is checked:
// a chain of unary ops on p[3,5].
func.func @forward(%p: tensor<3x5xf32> {kiln.param = "p", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1.0 : f64}},
                   %r: tensor<3x5xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %a = kiln.sin %p : tensor<3x5xf32>
  %c = kiln.exp %a : tensor<3x5xf32>
  %d = kiln.sigmoid %c : tensor<3x5xf32>
  %e = kiln.gelu tanh, %d : tensor<3x5xf32>
  %y = kiln.neg %e : tensor<3x5xf32>
  %weighted = kiln.mul %y, %r : tensor<3x5xf32>
  %loss = kiln.reduce_sum %weighted axes = [0, 1] : tensor<3x5xf32> -> tensor<f32>
  return %loss : tensor<f32>
}
