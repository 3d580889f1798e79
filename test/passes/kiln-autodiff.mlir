// RUN: kiln-opt %s --kiln-autodiff --split-input-file | FileCheck %s

// The reverse sweep of the kiln-autodiff pass (passes/Autodiff.cpp), one or
// two representative cases per op class: which gradient ops @grad contains,
// what they read, and what is left out (inputs, integer operands, values off
// the parameter -> loss path). The numbers are checked by test/gradcheck/;
// errors are in kiln-autodiff-invalid.mlir.

//===----------------------------------------------------------------------===//
// Signature, seeding, accumulation
//===----------------------------------------------------------------------===//

// @grad has @forward's arguments (attributes kept) and returns the loss, then
// one gradient per parameter. A parameter used twice (mul and add) gets the
// two contributions summed with kiln.add; the input x gets no gradient.
// CHECK-LABEL: func.func @grad(
// CHECK-SAME: %[[W:[a-z0-9]+]]: tensor<4xf32> {kiln.param = "w"}, %[[X:[a-z0-9]+]]: tensor<4xf32> {kiln.input = "x"})
// CHECK-SAME: -> (tensor<f32> {kiln.output = "loss"}, tensor<4xf32> {kiln.output = "grad:w"})
// CHECK: %[[M:.*]] = kiln.mul %[[W]], %[[X]] : tensor<4xf32>
// CHECK: %[[S:.*]] = kiln.add %[[M]], %[[W]] : tensor<4xf32>
// CHECK: %[[LOSS:.*]] = kiln.reduce_sum %[[S]] axes = [0] : tensor<4xf32> -> tensor<f32>
// CHECK: %[[ONE:.*]] = kiln.constant dense<1.000000e+00> : tensor<f32>
// CHECK: %[[G:.*]] = kiln.broadcast_in_dim %[[ONE]], dims = [] : tensor<f32> -> tensor<4xf32>
// CHECK: %[[GM:.*]] = kiln.mul %[[G]], %[[X]] : tensor<4xf32>
// CHECK: %[[ACC:.*]] = kiln.add %[[G]], %[[GM]] : tensor<4xf32>
// CHECK-NEXT: return %[[LOSS]], %[[ACC]] : tensor<f32>, tensor<4xf32>
func.func @forward(%w: tensor<4xf32> {kiln.param = "w"}, %x: tensor<4xf32> {kiln.input = "x"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %0 = kiln.mul %w, %x : tensor<4xf32>
  %1 = kiln.add %0, %w : tensor<4xf32>
  %2 = kiln.reduce_sum %1 axes = [0] : tensor<4xf32> -> tensor<f32>
  return %2 : tensor<f32>
}

// -----

// Both operands of one op are the same parameter: mul(w, w) contributes
// g*w twice, summed.
// CHECK-LABEL: func.func @grad(
// CHECK-SAME: %[[W:[a-z0-9]+]]: tensor<3xf32> {kiln.param = "w"})
// CHECK: %[[G:.*]] = kiln.broadcast_in_dim
// CHECK-NEXT: %[[D1:.*]] = kiln.mul %[[G]], %[[W]] : tensor<3xf32>
// CHECK-NEXT: %[[D2:.*]] = kiln.mul %[[G]], %[[W]] : tensor<3xf32>
// CHECK-NEXT: %[[ACC:.*]] = kiln.add %[[D1]], %[[D2]] : tensor<3xf32>
// CHECK-NEXT: return %{{.*}}, %[[ACC]]
func.func @forward(%w: tensor<3xf32> {kiln.param = "w"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %0 = kiln.mul %w, %w : tensor<3xf32>
  %1 = kiln.reduce_sum %0 axes = [0] : tensor<3xf32> -> tensor<f32>
  return %1 : tensor<f32>
}

// -----

// Two parameters, several params and inputs interleaved: results follow the
// order of the kiln.param arguments.
// CHECK-LABEL: func.func @grad(
// CHECK-SAME: %[[A:[a-z0-9]+]]: tensor<2xf32> {kiln.param = "a"}, %[[X:[a-z0-9]+]]: tensor<2xf32> {kiln.input = "x"}, %[[B:[a-z0-9]+]]: tensor<2xf32> {kiln.param = "b"})
// CHECK-SAME: -> (tensor<f32> {kiln.output = "loss"}, tensor<2xf32> {kiln.output = "grad:a"}, tensor<2xf32> {kiln.output = "grad:b"})
// CHECK: %[[AB:.*]] = kiln.mul %[[A]], %[[B]] : tensor<2xf32>
// CHECK: %[[G:.*]] = kiln.broadcast_in_dim
// CHECK: %[[GX:.*]] = kiln.mul %[[G]], %[[X]] : tensor<2xf32>
// CHECK: %[[GB:.*]] = kiln.mul %[[GX]], %[[B]] : tensor<2xf32>
// CHECK: %[[GA:.*]] = kiln.mul %[[GX]], %[[A]] : tensor<2xf32>
// CHECK: return %{{.*}}, %[[GB]], %[[GA]] : tensor<f32>, tensor<2xf32>, tensor<2xf32>
func.func @forward(%a: tensor<2xf32> {kiln.param = "a"}, %x: tensor<2xf32> {kiln.input = "x"}, %b: tensor<2xf32> {kiln.param = "b"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %0 = kiln.mul %a, %b : tensor<2xf32>
  %1 = kiln.mul %0, %x : tensor<2xf32>
  %2 = kiln.reduce_sum %1 axes = [0] : tensor<2xf32> -> tensor<f32>
  return %2 : tensor<f32>
}

// -----

//===----------------------------------------------------------------------===//
// Dead-gradient elimination
//===----------------------------------------------------------------------===//

// mul(w, x) with x an input: the rule builds g*w for x too, but nothing uses
// it and it is erased: after the seed, @grad holds exactly one mul (g*x).
// CHECK-LABEL: func.func @grad(
// CHECK-SAME: %[[W:[a-z0-9]+]]: tensor<4x3xf32> {kiln.param = "w"}, %[[X:[a-z0-9]+]]: tensor<4x3xf32> {kiln.input = "x"})
// CHECK: %[[ONE:.*]] = kiln.constant dense<1.000000e+00> : tensor<f32>
// CHECK-NEXT: %[[G:.*]] = kiln.broadcast_in_dim %[[ONE]], dims = [] : tensor<f32> -> tensor<4x3xf32>
// CHECK-NEXT: %[[D:.*]] = kiln.mul %[[G]], %[[X]] : tensor<4x3xf32>
// CHECK-NEXT: return %{{.*}}, %[[D]] : tensor<f32>, tensor<4x3xf32>
// CHECK-NOT: kiln.mul %[[G]], %[[W]]
func.func @forward(%w: tensor<4x3xf32> {kiln.param = "w"}, %x: tensor<4x3xf32> {kiln.input = "x"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %0 = kiln.mul %w, %x : tensor<4x3xf32>
  %1 = kiln.reduce_sum %0 axes = [0, 1] : tensor<4x3xf32> -> tensor<f32>
  return %1 : tensor<f32>
}

// -----

// Values off the parameter -> loss path are not differentiated: the branch
// on the input x alone (exp(x)) gets no gradient ops, and a forward op whose
// result nobody uses (tanh of w) is dropped from @grad altogether.
// CHECK-LABEL: func.func @grad(
// CHECK-SAME: %[[W:[a-z0-9]+]]: tensor<5xf32> {kiln.param = "w"}, %[[X:[a-z0-9]+]]: tensor<5xf32> {kiln.input = "x"})
// CHECK-NOT: kiln.tanh
// CHECK: %[[E:.*]] = kiln.exp %[[X]] : tensor<5xf32>
// CHECK: %[[S:.*]] = kiln.sin %[[W]] : tensor<5xf32>
// CHECK: %[[P:.*]] = kiln.add %[[E]], %[[S]] : tensor<5xf32>
// CHECK: %[[G:.*]] = kiln.broadcast_in_dim
// CHECK-NEXT: %[[C:.*]] = kiln.cos %[[W]] : tensor<5xf32>
// CHECK-NEXT: %[[D:.*]] = kiln.mul %[[G]], %[[C]] : tensor<5xf32>
// CHECK-NEXT: return %{{.*}}, %[[D]]
func.func @forward(%w: tensor<5xf32> {kiln.param = "w"}, %x: tensor<5xf32> {kiln.input = "x"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %t = kiln.tanh %w : tensor<5xf32>
  %0 = kiln.exp %x : tensor<5xf32>
  %1 = kiln.sin %w : tensor<5xf32>
  %2 = kiln.add %0, %1 : tensor<5xf32>
  %3 = kiln.reduce_sum %2 axes = [0] : tensor<5xf32> -> tensor<f32>
  return %3 : tensor<f32>
}

// -----

// A parameter the loss does not depend on gets a zero constant of its type.
// CHECK-LABEL: func.func @grad(
// CHECK-SAME: -> (tensor<f32> {kiln.output = "loss"}, tensor<4xf32> {kiln.output = "grad:w"}, tensor<2x3xf32> {kiln.output = "grad:unused"})
// CHECK-NOT: kiln.exp
// CHECK: kiln.broadcast_in_dim
// CHECK-NEXT: %[[GW:.*]] = kiln.mul
// CHECK-NEXT: %[[Z:.*]] = kiln.constant dense<0.000000e+00> : tensor<2x3xf32>
// CHECK-NEXT: return %{{.*}}, %[[GW]], %[[Z]] : tensor<f32>, tensor<4xf32>, tensor<2x3xf32>
func.func @forward(%w: tensor<4xf32> {kiln.param = "w"}, %unused: tensor<2x3xf32> {kiln.param = "unused"}, %x: tensor<4xf32> {kiln.input = "x"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %0 = kiln.mul %w, %x : tensor<4xf32>
  %1 = kiln.reduce_sum %0 axes = [0] : tensor<4xf32> -> tensor<f32>
  %2 = kiln.exp %unused : tensor<2x3xf32>
  return %1 : tensor<f32>
}

// -----

// Extra @forward results (logits) do not change @grad: only the first result
// is the loss.
// CHECK-LABEL: func.func @grad(
// CHECK-SAME: -> (tensor<f32> {kiln.output = "loss"}, tensor<3xf32> {kiln.output = "grad:w"})
// CHECK: return %{{.*}}, %{{.*}} : tensor<f32>, tensor<3xf32>
func.func @forward(%w: tensor<3xf32> {kiln.param = "w"}) -> (tensor<f32> {kiln.output = "loss"}, tensor<3xf32> {kiln.output = "logits"}) {
  %0 = kiln.exp %w : tensor<3xf32>
  %1 = kiln.reduce_sum %0 axes = [0] : tensor<3xf32> -> tensor<f32>
  return %1, %0 : tensor<f32>, tensor<3xf32>
}

// -----

//===----------------------------------------------------------------------===//
// Unary elementwise
//===----------------------------------------------------------------------===//

// exp reuses its result; log divides by its operand; tanh uses 1 - y^2. Ops
// are visited in reverse, so log's contribution comes first in the sum.
// CHECK-LABEL: func.func @grad(
// CHECK-SAME: %[[W:[a-z0-9]+]]: tensor<3xf32> {kiln.param = "w"})
// CHECK: %[[E:.*]] = kiln.exp %[[W]] : tensor<3xf32>
// CHECK: %[[T:.*]] = kiln.tanh %[[E]] : tensor<3xf32>
// CHECK: %[[L:.*]] = kiln.log %[[E]] : tensor<3xf32>
// CHECK: %[[G:.*]] = kiln.broadcast_in_dim
// CHECK: %[[DL:.*]] = kiln.div %[[G]], %[[E]] : tensor<3xf32>
// CHECK-DAG: %[[ONE3:.*]] = kiln.constant dense<1.000000e+00> : tensor<3xf32>
// CHECK-DAG: %[[T2:.*]] = kiln.mul %[[T]], %[[T]] : tensor<3xf32>
// CHECK: %[[OMT:.*]] = kiln.sub %[[ONE3]], %[[T2]] : tensor<3xf32>
// CHECK: %[[DT:.*]] = kiln.mul %[[G]], %[[OMT]] : tensor<3xf32>
// CHECK: %[[ACC:.*]] = kiln.add %[[DL]], %[[DT]] : tensor<3xf32>
// CHECK: %[[DW:.*]] = kiln.mul %[[ACC]], %[[E]] : tensor<3xf32>
// CHECK: return %{{.*}}, %[[DW]]
func.func @forward(%w: tensor<3xf32> {kiln.param = "w"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %0 = kiln.exp %w : tensor<3xf32>
  %1 = kiln.tanh %0 : tensor<3xf32>
  %2 = kiln.log %0 : tensor<3xf32>
  %3 = kiln.add %1, %2 : tensor<3xf32>
  %4 = kiln.reduce_sum %3 axes = [0] : tensor<3xf32> -> tensor<f32>
  return %4 : tensor<f32>
}

// -----

// relu selects on its result being positive (no pre-activation kept);
// cast casts the gradient back.
// CHECK-LABEL: func.func @grad(
// CHECK-SAME: %[[W:[a-z0-9]+]]: tensor<2x3xf32> {kiln.param = "w"})
// CHECK: %[[W64:.*]] = kiln.cast %[[W]] : tensor<2x3xf32> -> tensor<2x3xf64>
// CHECK: %[[R:.*]] = kiln.relu %[[W64]] : tensor<2x3xf64>
// CHECK: %[[G:.*]] = kiln.broadcast_in_dim %{{.*}}, dims = [] : tensor<f64> -> tensor<2x3xf64>
// CHECK: %[[POS:.*]] = kiln.compare gt, %[[R]], %{{.*}} : tensor<2x3xf64>
// CHECK: %[[DR:.*]] = kiln.select %[[POS]], %[[G]], %{{.*}} : tensor<2x3xi1>, tensor<2x3xf64>
// CHECK: %[[DW:.*]] = kiln.cast %[[DR]] : tensor<2x3xf64> -> tensor<2x3xf32>
// CHECK: return %{{.*}}, %[[DW]]
func.func @forward(%w: tensor<2x3xf32> {kiln.param = "w"}) -> (tensor<f64> {kiln.output = "loss"}) {
  %0 = kiln.cast %w : tensor<2x3xf32> -> tensor<2x3xf64>
  %1 = kiln.relu %0 : tensor<2x3xf64>
  %2 = kiln.reduce_sum %1 axes = [0, 1] : tensor<2x3xf64> -> tensor<f64>
  return %2 : tensor<f64>
}

// -----

//===----------------------------------------------------------------------===//
// Binary elementwise, select
//===----------------------------------------------------------------------===//

// sub negates the rhs gradient; div gives g / b and -g y / b.
// CHECK-LABEL: func.func @grad(
// CHECK-SAME: %[[A:[a-z0-9]+]]: tensor<3xf32> {kiln.param = "a"}, %[[B:[a-z0-9]+]]: tensor<3xf32> {kiln.param = "b"})
// CHECK: %[[Q:.*]] = kiln.div %[[A]], %[[B]] : tensor<3xf32>
// CHECK: %[[D:.*]] = kiln.sub %[[Q]], %[[B]] : tensor<3xf32>
// CHECK: %[[G:.*]] = kiln.broadcast_in_dim
// CHECK: %[[NG:.*]] = kiln.neg %[[G]] : tensor<3xf32>
// CHECK: %[[DA:.*]] = kiln.div %[[G]], %[[B]] : tensor<3xf32>
// CHECK: %[[GY:.*]] = kiln.mul %[[G]], %[[Q]] : tensor<3xf32>
// CHECK: %[[GYB:.*]] = kiln.div %[[GY]], %[[B]] : tensor<3xf32>
// CHECK: %[[DB:.*]] = kiln.neg %[[GYB]] : tensor<3xf32>
// CHECK: %[[ACC:.*]] = kiln.add %[[NG]], %[[DB]] : tensor<3xf32>
// CHECK: return %{{.*}}, %[[DA]], %[[ACC]]
func.func @forward(%a: tensor<3xf32> {kiln.param = "a"}, %b: tensor<3xf32> {kiln.param = "b"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %0 = kiln.div %a, %b : tensor<3xf32>
  %1 = kiln.sub %0, %b : tensor<3xf32>
  %2 = kiln.reduce_sum %1 axes = [0] : tensor<3xf32> -> tensor<f32>
  return %2 : tensor<f32>
}

// -----

// max: a >= b picks the lhs (ties to the lhs), the rhs gets the rest.
// CHECK-LABEL: func.func @grad(
// CHECK-SAME: %[[A:[a-z0-9]+]]: tensor<3xf32> {kiln.param = "a"}, %[[B:[a-z0-9]+]]: tensor<3xf32> {kiln.param = "b"})
// CHECK: %[[G:.*]] = kiln.broadcast_in_dim
// CHECK: %[[GE:.*]] = kiln.compare ge, %[[A]], %[[B]] : tensor<3xf32>
// CHECK: %[[Z:.*]] = kiln.constant dense<0.000000e+00> : tensor<3xf32>
// CHECK: %[[DA:.*]] = kiln.select %[[GE]], %[[G]], %[[Z]] : tensor<3xi1>, tensor<3xf32>
// CHECK: %[[DB:.*]] = kiln.select %[[GE]], %[[Z]], %[[G]] : tensor<3xi1>, tensor<3xf32>
// CHECK: return %{{.*}}, %[[DA]], %[[DB]]
func.func @forward(%a: tensor<3xf32> {kiln.param = "a"}, %b: tensor<3xf32> {kiln.param = "b"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %0 = kiln.max %a, %b : tensor<3xf32>
  %1 = kiln.reduce_sum %0 axes = [0] : tensor<3xf32> -> tensor<f32>
  return %1 : tensor<f32>
}

// -----

// A causal mask (iota, compare, constant: no gradient rules) feeding select:
// the mask ops are off the path, the masked branch gets select(m, g, 0) and
// the constant branch nothing.
// CHECK-LABEL: func.func @grad(
// CHECK-SAME: %[[S:[a-z0-9]+]]: tensor<4x4xf32> {kiln.param = "s"}
// CHECK: %[[M:.*]] = kiln.compare ge
// CHECK: %[[SEL:.*]] = kiln.select %[[M]], %[[S]], %{{.*}} : tensor<4x4xi1>, tensor<4x4xf32>
// CHECK: %[[P:.*]] = kiln.softmax %[[SEL]] axis = 1 : tensor<4x4xf32>
// CHECK: %[[Z:.*]] = kiln.constant dense<0.000000e+00> : tensor<4x4xf32>
// CHECK: %[[DS:.*]] = kiln.select %[[M]], %{{.*}}, %[[Z]] : tensor<4x4xi1>, tensor<4x4xf32>
// CHECK-NEXT: return %{{.*}}, %[[DS]]
func.func @forward(%s: tensor<4x4xf32> {kiln.param = "s"}, %v: tensor<4x4xf32> {kiln.input = "v"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %r = kiln.iota dim = 0 : tensor<4x4xi32>
  %c = kiln.iota dim = 1 : tensor<4x4xi32>
  %m = kiln.compare ge, %r, %c : tensor<4x4xi32>
  %ninf = kiln.constant dense<-1.000000e+09> : tensor<4x4xf32>
  %0 = kiln.select %m, %s, %ninf : tensor<4x4xi1>, tensor<4x4xf32>
  %1 = kiln.softmax %0 axis = 1 : tensor<4x4xf32>
  %2 = kiln.mul %1, %v : tensor<4x4xf32>
  %3 = kiln.reduce_sum %2 axes = [0, 1] : tensor<4x4xf32> -> tensor<f32>
  return %3 : tensor<f32>
}

// -----

//===----------------------------------------------------------------------===//
// Broadcasts and reductions
//===----------------------------------------------------------------------===//

// broadcast_in_dim becomes reduce_sum over the new and the repeated dims,
// reshaped back when the operand had size-1 dims: [7] over dims [0, 1];
// [5,1] over dims [0, 2], then reshape [5] -> [5,1].
// CHECK-LABEL: func.func @grad(
// CHECK-SAME: %[[B:[a-z0-9]+]]: tensor<5x1xf32> {kiln.param = "b"}, %[[V:[a-z0-9]+]]: tensor<7xf32> {kiln.param = "v"}
// CHECK-DAG: %[[DV:.*]] = kiln.reduce_sum %{{.*}} axes = [0, 1] : tensor<3x5x7xf32> -> tensor<7xf32>
// CHECK-DAG: %[[SB:.*]] = kiln.reduce_sum %{{.*}} axes = [0, 2] : tensor<3x5x7xf32> -> tensor<5xf32>
// CHECK: %[[DB:.*]] = kiln.reshape %[[SB]] : tensor<5xf32> -> tensor<5x1xf32>
// CHECK-NEXT: return %{{.*}}, %[[DB]], %[[DV]] : tensor<f32>, tensor<5x1xf32>, tensor<7xf32>
func.func @forward(%b: tensor<5x1xf32> {kiln.param = "b"}, %v: tensor<7xf32> {kiln.param = "v"}, %x: tensor<3x5x7xf32> {kiln.input = "x"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %0 = kiln.broadcast_in_dim %b, dims = [1, 2] : tensor<5x1xf32> -> tensor<3x5x7xf32>
  %1 = kiln.broadcast_in_dim %v, dims = [2] : tensor<7xf32> -> tensor<3x5x7xf32>
  %2 = kiln.mul %0, %x : tensor<3x5x7xf32>
  %3 = kiln.mul %2, %1 : tensor<3x5x7xf32>
  %4 = kiln.reduce_sum %3 axes = [0, 1, 2] : tensor<3x5x7xf32> -> tensor<f32>
  return %4 : tensor<f32>
}

// -----

// reduce_sum becomes broadcast_in_dim onto the kept dims; with keepdims the
// broadcast maps every dim (the reduced ones have size 1).
// CHECK-LABEL: func.func @grad(
// CHECK-SAME: %[[P:[a-z0-9]+]]: tensor<3x5x7xf32> {kiln.param = "p"}
// CHECK: %[[K:.*]] = kiln.reduce_sum %[[P]] axes = [1] keepdims : tensor<3x5x7xf32> -> tensor<3x1x7xf32>
// CHECK: %[[R:.*]] = kiln.reduce_sum %[[P]] axes = [1] : tensor<3x5x7xf32> -> tensor<3x7xf32>
// CHECK-DAG: %[[BR:.*]] = kiln.broadcast_in_dim %{{.*}}, dims = [0, 2] : tensor<3x7xf32> -> tensor<3x5x7xf32>
// CHECK-DAG: %[[BK:.*]] = kiln.broadcast_in_dim %{{.*}}, dims = [0, 1, 2] : tensor<3x1x7xf32> -> tensor<3x5x7xf32>
// CHECK: %[[ACC:.*]] = kiln.add
// CHECK-NEXT: return %{{.*}}, %[[ACC]]
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p"}, %r: tensor<3x1x7xf32> {kiln.input = "r"}, %q: tensor<3x7xf32> {kiln.input = "q"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %0 = kiln.reduce_sum %p axes = [1] keepdims : tensor<3x5x7xf32> -> tensor<3x1x7xf32>
  %1 = kiln.mul %0, %r : tensor<3x1x7xf32>
  %2 = kiln.reduce_sum %1 axes = [0, 1, 2] : tensor<3x1x7xf32> -> tensor<f32>
  %3 = kiln.reduce_sum %p axes = [1] : tensor<3x5x7xf32> -> tensor<3x7xf32>
  %4 = kiln.mul %3, %q : tensor<3x7xf32>
  %5 = kiln.reduce_sum %4 axes = [0, 1] : tensor<3x7xf32> -> tensor<f32>
  %6 = kiln.add %2, %5 : tensor<f32>
  return %6 : tensor<f32>
}

// -----

// reduce_mean scales the broadcast gradient by 1/n; reduce_max selects where
// the operand equals the (broadcast) maximum.
// CHECK-LABEL: func.func @grad(
// CHECK-SAME: %[[P:[a-z0-9]+]]: tensor<2x4xf32> {kiln.param = "p"}
// CHECK: %[[MX:.*]] = kiln.reduce_max %[[P]] axes = [1] : tensor<2x4xf32> -> tensor<2xf32>
// CHECK: %[[MN:.*]] = kiln.reduce_mean %[[P]] axes = [1] : tensor<2x4xf32> -> tensor<2xf32>
// CHECK-DAG: %[[QUARTER:.*]] = kiln.constant dense<2.500000e-01> : tensor<2x4xf32>
// CHECK-DAG: %[[MXB:.*]] = kiln.broadcast_in_dim %[[MX]], dims = [0] : tensor<2xf32> -> tensor<2x4xf32>
// CHECK-DAG: %[[EQ:.*]] = kiln.compare eq, %[[P]], %[[MXB]] : tensor<2x4xf32>
// CHECK-DAG: kiln.mul %{{.*}}, %[[QUARTER]] : tensor<2x4xf32>
// CHECK-DAG: kiln.select %[[EQ]], %{{.*}}, %{{.*}} : tensor<2x4xi1>, tensor<2x4xf32>
// CHECK: return
func.func @forward(%p: tensor<2x4xf32> {kiln.param = "p"}, %r: tensor<2xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %0 = kiln.reduce_max %p axes = [1] : tensor<2x4xf32> -> tensor<2xf32>
  %1 = kiln.reduce_mean %p axes = [1] : tensor<2x4xf32> -> tensor<2xf32>
  %2 = kiln.mul %0, %1 : tensor<2xf32>
  %3 = kiln.mul %2, %r : tensor<2xf32>
  %4 = kiln.reduce_sum %3 axes = [0] : tensor<2xf32> -> tensor<f32>
  return %4 : tensor<f32>
}

// -----

//===----------------------------------------------------------------------===//
// Matmul
//===----------------------------------------------------------------------===//

// C = A B^T (transpose_rhs, both rank 2): dA = g B (no transposes),
// dB = g^T A (transpose_lhs).
// CHECK-LABEL: func.func @grad(
// CHECK-SAME: %[[A:[a-z0-9]+]]: tensor<3x5xf32> {kiln.param = "a"}, %[[W:[a-z0-9]+]]: tensor<7x5xf32> {kiln.param = "w"}
// CHECK: kiln.matmul %[[A]], %[[W]] transpose_rhs : tensor<3x5xf32>, tensor<7x5xf32> -> tensor<3x7xf32>
// CHECK: %[[G:.*]] = kiln.broadcast_in_dim %{{.*}} -> tensor<3x7xf32>
// CHECK-NEXT: %[[DA:.*]] = kiln.matmul %[[G]], %[[W]] : tensor<3x7xf32>, tensor<7x5xf32> -> tensor<3x5xf32>
// CHECK-NEXT: %[[DW:.*]] = kiln.matmul %[[G]], %[[A]] transpose_lhs : tensor<3x7xf32>, tensor<3x5xf32> -> tensor<7x5xf32>
// CHECK-NEXT: return %{{.*}}, %[[DA]], %[[DW]]
func.func @forward(%a: tensor<3x5xf32> {kiln.param = "a"}, %w: tensor<7x5xf32> {kiln.param = "w"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %0 = kiln.matmul %a, %w transpose_rhs : tensor<3x5xf32>, tensor<7x5xf32> -> tensor<3x7xf32>
  %1 = kiln.reduce_sum %0 axes = [0, 1] : tensor<3x7xf32> -> tensor<f32>
  return %1 : tensor<f32>
}

// -----

// C = A^T B (transpose_lhs): dA = B g^T (transpose_rhs), dB = A g.
// CHECK-LABEL: func.func @grad(
// CHECK-SAME: %[[A:[a-z0-9]+]]: tensor<5x3xf32> {kiln.param = "a"}, %[[B:[a-z0-9]+]]: tensor<5x7xf32> {kiln.param = "b"}
// CHECK: %[[G:.*]] = kiln.broadcast_in_dim %{{.*}} -> tensor<3x7xf32>
// CHECK-NEXT: %[[DA:.*]] = kiln.matmul %[[B]], %[[G]] transpose_rhs : tensor<5x7xf32>, tensor<3x7xf32> -> tensor<5x3xf32>
// CHECK-NEXT: %[[DB:.*]] = kiln.matmul %[[A]], %[[G]] : tensor<5x3xf32>, tensor<3x7xf32> -> tensor<5x7xf32>
// CHECK-NEXT: return %{{.*}}, %[[DA]], %[[DB]]
func.func @forward(%a: tensor<5x3xf32> {kiln.param = "a"}, %b: tensor<5x7xf32> {kiln.param = "b"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %0 = kiln.matmul %a, %b transpose_lhs : tensor<5x3xf32>, tensor<5x7xf32> -> tensor<3x7xf32>
  %1 = kiln.reduce_sum %0 axes = [0, 1] : tensor<3x7xf32> -> tensor<f32>
  return %1 : tensor<f32>
}

// -----

// C = A^T B^T (both): dA = B^T g^T, dB = g^T A^T (both flags each).
// CHECK-LABEL: func.func @grad(
// CHECK-SAME: %[[A:[a-z0-9]+]]: tensor<5x3xf32> {kiln.param = "a"}, %[[B:[a-z0-9]+]]: tensor<7x5xf32> {kiln.param = "b"}
// CHECK: %[[G:.*]] = kiln.broadcast_in_dim %{{.*}} -> tensor<3x7xf32>
// CHECK-NEXT: %[[DA:.*]] = kiln.matmul %[[B]], %[[G]] transpose_lhs transpose_rhs : tensor<7x5xf32>, tensor<3x7xf32> -> tensor<5x3xf32>
// CHECK-NEXT: %[[DB:.*]] = kiln.matmul %[[G]], %[[A]] transpose_lhs transpose_rhs : tensor<3x7xf32>, tensor<5x3xf32> -> tensor<7x5xf32>
// CHECK-NEXT: return %{{.*}}, %[[DA]], %[[DB]]
func.func @forward(%a: tensor<5x3xf32> {kiln.param = "a"}, %b: tensor<7x5xf32> {kiln.param = "b"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %0 = kiln.matmul %a, %b transpose_lhs transpose_rhs : tensor<5x3xf32>, tensor<7x5xf32> -> tensor<3x7xf32>
  %1 = kiln.reduce_sum %0 axes = [0, 1] : tensor<3x7xf32> -> tensor<f32>
  return %1 : tensor<f32>
}

// -----

// The linear layer: x[2,3,5] (an input) times W[7,5]^T. The weight gradient
// is one GEMM over the flattened batch: reshape g to [6,7] and x to [6,5],
// then g^T x, with no batched matmul and no reduce_sum; x gets no gradient.
// CHECK-LABEL: func.func @grad(
// CHECK-SAME: %[[X:[a-z0-9]+]]: tensor<2x3x5xf32> {kiln.input = "x"}, %[[W:[a-z0-9]+]]: tensor<7x5xf32> {kiln.param = "w"}
// CHECK: %[[G:.*]] = kiln.broadcast_in_dim %{{.*}} -> tensor<2x3x7xf32>
// CHECK-NEXT: %[[X2:.*]] = kiln.reshape %[[X]] : tensor<2x3x5xf32> -> tensor<6x5xf32>
// CHECK-NEXT: %[[G2:.*]] = kiln.reshape %[[G]] : tensor<2x3x7xf32> -> tensor<6x7xf32>
// CHECK-NEXT: %[[DW:.*]] = kiln.matmul %[[G2]], %[[X2]] transpose_lhs : tensor<6x7xf32>, tensor<6x5xf32> -> tensor<7x5xf32>
// CHECK-NEXT: return %{{.*}}, %[[DW]] : tensor<f32>, tensor<7x5xf32>
func.func @forward(%x: tensor<2x3x5xf32> {kiln.input = "x"}, %w: tensor<7x5xf32> {kiln.param = "w"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %0 = kiln.matmul %x, %w transpose_rhs : tensor<2x3x5xf32>, tensor<7x5xf32> -> tensor<2x3x7xf32>
  %1 = kiln.reduce_sum %0 axes = [0, 1, 2] : tensor<2x3x7xf32> -> tensor<f32>
  return %1 : tensor<f32>
}

// -----

// The same with x a parameter too (and no transpose): dx = g W^T keeps the
// batch dims (rank-3 g times the rank-2 W), dW = x2^T g2 flattened.
// CHECK-LABEL: func.func @grad(
// CHECK-SAME: %[[X:[a-z0-9]+]]: tensor<2x3x5xf32> {kiln.param = "x"}, %[[W:[a-z0-9]+]]: tensor<5x7xf32> {kiln.param = "w"}
// CHECK: %[[G:.*]] = kiln.broadcast_in_dim %{{.*}} -> tensor<2x3x7xf32>
// CHECK-NEXT: %[[DX:.*]] = kiln.matmul %[[G]], %[[W]] transpose_rhs : tensor<2x3x7xf32>, tensor<5x7xf32> -> tensor<2x3x5xf32>
// CHECK-NEXT: %[[X2:.*]] = kiln.reshape %[[X]] : tensor<2x3x5xf32> -> tensor<6x5xf32>
// CHECK-NEXT: %[[G2:.*]] = kiln.reshape %[[G]] : tensor<2x3x7xf32> -> tensor<6x7xf32>
// CHECK-NEXT: %[[DW:.*]] = kiln.matmul %[[X2]], %[[G2]] transpose_lhs : tensor<6x5xf32>, tensor<6x7xf32> -> tensor<5x7xf32>
// CHECK-NEXT: return %{{.*}}, %[[DX]], %[[DW]]
func.func @forward(%x: tensor<2x3x5xf32> {kiln.param = "x"}, %w: tensor<5x7xf32> {kiln.param = "w"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %0 = kiln.matmul %x, %w : tensor<2x3x5xf32>, tensor<5x7xf32> -> tensor<2x3x7xf32>
  %1 = kiln.reduce_sum %0 axes = [0, 1, 2] : tensor<2x3x7xf32> -> tensor<f32>
  return %1 : tensor<f32>
}

// -----

// A batched lhs with transpose_lhs and a rank-2 rhs cannot use the flattened
// GEMM: the weight gradient is a batched matmul summed over the batch.
// CHECK-LABEL: func.func @grad(
// CHECK-SAME: %[[A:[a-z0-9]+]]: tensor<2x5x3xf32> {kiln.input = "a"}, %[[B:[a-z0-9]+]]: tensor<5x7xf32> {kiln.param = "b"}
// CHECK: %[[G:.*]] = kiln.broadcast_in_dim %{{.*}} -> tensor<2x3x7xf32>
// CHECK-NEXT: %[[DB3:.*]] = kiln.matmul %[[A]], %[[G]] : tensor<2x5x3xf32>, tensor<2x3x7xf32> -> tensor<2x5x7xf32>
// CHECK-NEXT: %[[DB:.*]] = kiln.reduce_sum %[[DB3]] axes = [0] : tensor<2x5x7xf32> -> tensor<5x7xf32>
// CHECK-NEXT: return %{{.*}}, %[[DB]]
func.func @forward(%a: tensor<2x5x3xf32> {kiln.input = "a"}, %b: tensor<5x7xf32> {kiln.param = "b"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %0 = kiln.matmul %a, %b transpose_lhs : tensor<2x5x3xf32>, tensor<5x7xf32> -> tensor<2x3x7xf32>
  %1 = kiln.reduce_sum %0 axes = [0, 1, 2] : tensor<2x3x7xf32> -> tensor<f32>
  return %1 : tensor<f32>
}

// -----

// A rank-2 lhs with a batched rhs: the lhs gradient is a batched matmul
// summed over the batch; the rhs gradient keeps its batch dim.
// CHECK-LABEL: func.func @grad(
// CHECK-SAME: %[[A:[a-z0-9]+]]: tensor<3x5xf32> {kiln.param = "a"}, %[[B:[a-z0-9]+]]: tensor<2x5x7xf32> {kiln.param = "b"}
// CHECK: %[[G:.*]] = kiln.broadcast_in_dim %{{.*}} -> tensor<2x3x7xf32>
// CHECK-NEXT: %[[DA3:.*]] = kiln.matmul %[[G]], %[[B]] transpose_rhs : tensor<2x3x7xf32>, tensor<2x5x7xf32> -> tensor<2x3x5xf32>
// CHECK-NEXT: %[[DA:.*]] = kiln.reduce_sum %[[DA3]] axes = [0] : tensor<2x3x5xf32> -> tensor<3x5xf32>
// CHECK-NEXT: %[[DB:.*]] = kiln.matmul %[[A]], %[[G]] transpose_lhs : tensor<3x5xf32>, tensor<2x3x7xf32> -> tensor<2x5x7xf32>
// CHECK-NEXT: return %{{.*}}, %[[DA]], %[[DB]]
func.func @forward(%a: tensor<3x5xf32> {kiln.param = "a"}, %b: tensor<2x5x7xf32> {kiln.param = "b"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %0 = kiln.matmul %a, %b : tensor<3x5xf32>, tensor<2x5x7xf32> -> tensor<2x3x7xf32>
  %1 = kiln.reduce_sum %0 axes = [0, 1, 2] : tensor<2x3x7xf32> -> tensor<f32>
  return %1 : tensor<f32>
}

// -----

//===----------------------------------------------------------------------===//
// Shape ops
//===----------------------------------------------------------------------===//

// slice becomes pad with zeros (stride 2 -> interior 1); transpose becomes
// the inverse permutation; reshape reshapes back.
// CHECK-LABEL: func.func @grad(
// CHECK-SAME: %[[P:[a-z0-9]+]]: tensor<3x5x7xf32> {kiln.param = "p"}
// CHECK: %[[T:.*]] = kiln.transpose %[[P]] perm = [2, 0, 1] : tensor<3x5x7xf32> -> tensor<7x3x5xf32>
// CHECK: %[[S:.*]] = kiln.slice %[[T]] start = [1, 0, 1] limit = [7, 3, 5] stride = [2, 1, 2] : tensor<7x3x5xf32> -> tensor<3x3x2xf32>
// CHECK: %[[R:.*]] = kiln.reshape %[[S]] : tensor<3x3x2xf32> -> tensor<18xf32>
// CHECK: %[[G:.*]] = kiln.broadcast_in_dim
// CHECK: %[[GR:.*]] = kiln.reshape %{{.*}} : tensor<18xf32> -> tensor<3x3x2xf32>
// CHECK-NEXT: %[[GP:.*]] = kiln.pad %[[GR]] low = [1, 0, 1] high = [1, 0, 1] interior = [1, 0, 1] value = 0.000000e+00 : tensor<3x3x2xf32> -> tensor<7x3x5xf32>
// CHECK-NEXT: %[[GT:.*]] = kiln.transpose %[[GP]] perm = [1, 2, 0] : tensor<7x3x5xf32> -> tensor<3x5x7xf32>
// CHECK-NEXT: return %{{.*}}, %[[GT]]
func.func @forward(%p: tensor<3x5x7xf32> {kiln.param = "p"}, %r: tensor<18xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %0 = kiln.transpose %p perm = [2, 0, 1] : tensor<3x5x7xf32> -> tensor<7x3x5xf32>
  %1 = kiln.slice %0 start = [1, 0, 1] limit = [7, 3, 5] stride = [2, 1, 2] : tensor<7x3x5xf32> -> tensor<3x3x2xf32>
  %2 = kiln.reshape %1 : tensor<3x3x2xf32> -> tensor<18xf32>
  %3 = kiln.mul %2, %r : tensor<18xf32>
  %4 = kiln.reduce_sum %3 axes = [0] : tensor<18xf32> -> tensor<f32>
  return %4 : tensor<f32>
}

// -----

// pad becomes a strided slice; concat becomes one slice per input.
// CHECK-LABEL: func.func @grad(
// CHECK-SAME: %[[A:[a-z0-9]+]]: tensor<2x3xf32> {kiln.param = "a"}, %[[B:[a-z0-9]+]]: tensor<2x4xf32> {kiln.param = "b"}
// CHECK: %[[C:.*]] = kiln.concat %[[A]], %[[B]] dim = 1 : tensor<2x3xf32>, tensor<2x4xf32> -> tensor<2x7xf32>
// CHECK: %[[P:.*]] = kiln.pad %[[C]] low = [1, 0] high = [0, 2] interior = [0, 1] value = 0.000000e+00 : tensor<2x7xf32> -> tensor<3x15xf32>
// CHECK: %[[GS:.*]] = kiln.slice %{{.*}} start = [1, 0] limit = [3, 13] stride = [1, 2] : tensor<3x15xf32> -> tensor<2x7xf32>
// CHECK-NEXT: %[[DA:.*]] = kiln.slice %[[GS]] start = [0, 0] limit = [2, 3] stride = [1, 1] : tensor<2x7xf32> -> tensor<2x3xf32>
// CHECK-NEXT: %[[DB:.*]] = kiln.slice %[[GS]] start = [0, 3] limit = [2, 7] stride = [1, 1] : tensor<2x7xf32> -> tensor<2x4xf32>
// CHECK-NEXT: return %{{.*}}, %[[DA]], %[[DB]]
func.func @forward(%a: tensor<2x3xf32> {kiln.param = "a"}, %b: tensor<2x4xf32> {kiln.param = "b"}, %r: tensor<3x15xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %0 = kiln.concat %a, %b dim = 1 : tensor<2x3xf32>, tensor<2x4xf32> -> tensor<2x7xf32>
  %1 = kiln.pad %0 low = [1, 0] high = [0, 2] interior = [0, 1] value = 0.000000e+00 : tensor<2x7xf32> -> tensor<3x15xf32>
  %2 = kiln.mul %1, %r : tensor<3x15xf32>
  %3 = kiln.reduce_sum %2 axes = [0, 1] : tensor<3x15xf32> -> tensor<f32>
  return %3 : tensor<f32>
}

// -----

//===----------------------------------------------------------------------===//
// Gather / scatter_add, integer operands
//===----------------------------------------------------------------------===//

// gather becomes scatter_add of g into the table's shape with the same
// indices and axis; the (sliced) integer targets and the indices get nothing:
// the only gradient results are the loss and the table's gradient.
// CHECK-LABEL: func.func @grad(
// CHECK-SAME: %[[T:[a-z0-9]+]]: tensor<11x7xf32> {kiln.param = "t"}, %[[I:[a-z0-9]+]]: tensor<3x5xi32> {kiln.input = "i"}, %[[Y:[a-z0-9]+]]: tensor<3x5xi32> {kiln.input = "y"})
// CHECK-SAME: -> (tensor<f32> {kiln.output = "loss"}, tensor<11x7xf32> {kiln.output = "grad:t"})
// CHECK: %[[E:.*]] = kiln.gather %[[T]][%[[I]]] axis = 0 : tensor<11x7xf32>, tensor<3x5xi32> -> tensor<3x5x7xf32>
// CHECK: %[[YS:.*]] = kiln.slice %[[Y]]
// CHECK: kiln.cross_entropy %{{.*}}, %[[YS]] reduction = mean
// CHECK: %[[SM:.*]] = kiln.softmax %{{.*}} axis = 2 : tensor<3x2x7xf32>
// CHECK: %[[IOTA:.*]] = kiln.iota dim = 2 : tensor<3x2x7xi32>
// CHECK: %[[YB:.*]] = kiln.broadcast_in_dim %[[YS]], dims = [0, 1] : tensor<3x2xi32> -> tensor<3x2x7xi32>
// CHECK: kiln.compare eq, %[[IOTA]], %[[YB]] : tensor<3x2x7xi32>
// CHECK: %[[GP:.*]] = kiln.pad %{{.*}} low = [0, 1, 0] high = [0, 1, 0] interior = [0, 1, 0] value = 0.000000e+00 : tensor<3x2x7xf32> -> tensor<3x5x7xf32>
// CHECK-NEXT: %[[DT:.*]] = kiln.scatter_add %[[GP]][%[[I]]] axis = 0 : tensor<3x5x7xf32>, tensor<3x5xi32> -> tensor<11x7xf32>
// CHECK-NEXT: return %{{.*}}, %[[DT]] : tensor<f32>, tensor<11x7xf32>
func.func @forward(%t: tensor<11x7xf32> {kiln.param = "t"}, %i: tensor<3x5xi32> {kiln.input = "i"}, %y: tensor<3x5xi32> {kiln.input = "y"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %0 = kiln.gather %t[%i] axis = 0 : tensor<11x7xf32>, tensor<3x5xi32> -> tensor<3x5x7xf32>
  %1 = kiln.slice %0 start = [0, 1, 0] limit = [3, 5, 7] stride = [1, 2, 1] : tensor<3x5x7xf32> -> tensor<3x2x7xf32>
  %2 = kiln.slice %y start = [0, 1] limit = [3, 5] stride = [1, 2] : tensor<3x5xi32> -> tensor<3x2xi32>
  %3 = kiln.cross_entropy %1, %2 reduction = mean : tensor<3x2x7xf32>, tensor<3x2xi32> -> tensor<f32>
  return %3 : tensor<f32>
}

// -----

// scatter_add becomes gather; an integer value computed from a parameter
// (cast f32 -> i32) is not differentiated, so the path through it adds
// nothing.
// CHECK-LABEL: func.func @grad(
// CHECK-SAME: %[[U:[a-z0-9]+]]: tensor<5x3xf32> {kiln.param = "u"}, %[[I:[a-z0-9]+]]: tensor<5xi32> {kiln.input = "i"}
// CHECK: %[[S:.*]] = kiln.scatter_add %[[U]][%[[I]]] axis = 0 : tensor<5x3xf32>, tensor<5xi32> -> tensor<4x3xf32>
// CHECK: %[[G:.*]] = kiln.broadcast_in_dim
// CHECK-NEXT: %[[DU:.*]] = kiln.gather %[[G]][%[[I]]] axis = 0 : tensor<4x3xf32>, tensor<5xi32> -> tensor<5x3xf32>
// CHECK-NEXT: return %{{.*}}, %[[DU]]
func.func @forward(%u: tensor<5x3xf32> {kiln.param = "u"}, %i: tensor<5xi32> {kiln.input = "i"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %0 = kiln.scatter_add %u[%i] axis = 0 : tensor<5x3xf32>, tensor<5xi32> -> tensor<4x3xf32>
  %1 = kiln.reduce_sum %0 axes = [0, 1] : tensor<4x3xf32> -> tensor<f32>
  %2 = kiln.cast %u : tensor<5x3xf32> -> tensor<5x3xi32>
  %3 = kiln.reduce_sum %2 axes = [0, 1] : tensor<5x3xi32> -> tensor<i32>
  %4 = kiln.cast %3 : tensor<i32> -> tensor<f32>
  %5 = kiln.add %1, %4 : tensor<f32>
  return %5 : tensor<f32>
}

// -----

//===----------------------------------------------------------------------===//
// NN composites
//===----------------------------------------------------------------------===//

// softmax: y (g - sum(g y)); log_softmax: g - e^y sum(g) (sums keepdims over
// the op's axis).
// CHECK-LABEL: func.func @grad(
// CHECK-SAME: %[[P:[a-z0-9]+]]: tensor<3x4xf32> {kiln.param = "p"}
// CHECK: %[[SM:.*]] = kiln.softmax %[[P]] axis = 0 : tensor<3x4xf32>
// CHECK: %[[LS:.*]] = kiln.log_softmax %[[SM]] axis = 1 : tensor<3x4xf32>
// CHECK: %[[SG:.*]] = kiln.reduce_sum %{{.*}} axes = [1] keepdims : tensor<3x4xf32> -> tensor<3x1xf32>
// CHECK: kiln.exp %[[LS]] : tensor<3x4xf32>
// CHECK: %[[GY:.*]] = kiln.mul %{{.*}}, %[[SM]] : tensor<3x4xf32>
// CHECK: kiln.reduce_sum %[[GY]] axes = [0] keepdims : tensor<3x4xf32> -> tensor<1x4xf32>
// CHECK: %[[D:.*]] = kiln.mul %[[SM]], %{{.*}} : tensor<3x4xf32>
// CHECK-NEXT: return %{{.*}}, %[[D]]
func.func @forward(%p: tensor<3x4xf32> {kiln.param = "p"}, %r: tensor<3x4xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %0 = kiln.softmax %p axis = 0 : tensor<3x4xf32>
  %1 = kiln.log_softmax %0 axis = 1 : tensor<3x4xf32>
  %2 = kiln.mul %1, %r : tensor<3x4xf32>
  %3 = kiln.reduce_sum %2 axes = [0, 1] : tensor<3x4xf32> -> tensor<f32>
  return %3 : tensor<f32>
}

// -----

// layer_norm recomputes mean and 1/std from its input (rsqrt of var + eps),
// and gives scale and bias gradients summed over the leading dims.
// CHECK-LABEL: func.func @grad(
// CHECK-SAME: %[[X:[a-z0-9]+]]: tensor<2x3x4xf32> {kiln.param = "x"}, %[[G:[a-z0-9]+]]: tensor<4xf32> {kiln.param = "g"}, %[[B:[a-z0-9]+]]: tensor<4xf32> {kiln.param = "b"}
// CHECK: kiln.layer_norm %[[X]] scale(%[[G]] : tensor<4xf32>) bias(%[[B]] : tensor<4xf32>) : tensor<2x3x4xf32>
// CHECK: kiln.reduce_sum %[[X]] axes = [2] keepdims : tensor<2x3x4xf32> -> tensor<2x3x1xf32>
// CHECK: kiln.rsqrt
// CHECK-DAG: %[[DG:.*]] = kiln.reduce_sum %{{.*}} axes = [0, 1] : tensor<2x3x4xf32> -> tensor<4xf32>
// CHECK-DAG: %[[DB:.*]] = kiln.reduce_sum %{{.*}} axes = [0, 1] : tensor<2x3x4xf32> -> tensor<4xf32>
// CHECK: return %{{.*}}, %{{.*}}, %[[DG]], %[[DB]] : tensor<f32>, tensor<2x3x4xf32>, tensor<4xf32>, tensor<4xf32>
func.func @forward(%x: tensor<2x3x4xf32> {kiln.param = "x"}, %g: tensor<4xf32> {kiln.param = "g"}, %b: tensor<4xf32> {kiln.param = "b"}, %r: tensor<2x3x4xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %0 = kiln.layer_norm %x scale(%g : tensor<4xf32>) bias(%b : tensor<4xf32>) : tensor<2x3x4xf32>
  %1 = kiln.mul %0, %r : tensor<2x3x4xf32>
  %2 = kiln.reduce_sum %1 axes = [0, 1, 2] : tensor<2x3x4xf32> -> tensor<f32>
  return %2 : tensor<f32>
}

// -----

// cross_entropy with reduction = none: (softmax - onehot) times g broadcast
// over the class dim.
// CHECK-LABEL: func.func @grad(
// CHECK-SAME: %[[Z:[a-z0-9]+]]: tensor<2x5xf32> {kiln.param = "z"}, %[[T:[a-z0-9]+]]: tensor<2xi64> {kiln.input = "t"}, %[[R:[a-z0-9]+]]: tensor<2xf32> {kiln.input = "r"}
// CHECK: kiln.cross_entropy %[[Z]], %[[T]] reduction = none : tensor<2x5xf32>, tensor<2xi64> -> tensor<2xf32>
// CHECK: %[[SM:.*]] = kiln.softmax %[[Z]] axis = 1 : tensor<2x5xf32>
// CHECK: kiln.iota dim = 1 : tensor<2x5xi64>
// CHECK: kiln.broadcast_in_dim %[[T]], dims = [0] : tensor<2xi64> -> tensor<2x5xi64>
// CHECK: %[[GB:.*]] = kiln.broadcast_in_dim %{{.*}}, dims = [0] : tensor<2xf32> -> tensor<2x5xf32>
// CHECK: %[[D:.*]] = kiln.sub %[[SM]], %{{.*}} : tensor<2x5xf32>
// CHECK: %[[DZ:.*]] = kiln.mul %[[D]], %[[GB]] : tensor<2x5xf32>
// CHECK-NEXT: return %{{.*}}, %[[DZ]]
func.func @forward(%z: tensor<2x5xf32> {kiln.param = "z"}, %t: tensor<2xi64> {kiln.input = "t"}, %r: tensor<2xf32> {kiln.input = "r"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %0 = kiln.cross_entropy %z, %t reduction = none : tensor<2x5xf32>, tensor<2xi64> -> tensor<2xf32>
  %1 = kiln.mul %0, %r : tensor<2xf32>
  %2 = kiln.reduce_sum %1 axes = [0] : tensor<2xf32> -> tensor<f32>
  return %2 : tensor<f32>
}

// -----

// dropout's gradient is dropout of g with the same seed, rate and salt; the
// seed gets no gradient.
// CHECK-LABEL: func.func @grad(
// CHECK-SAME: %[[P:[a-z0-9]+]]: tensor<3x4xf32> {kiln.param = "p"}, %[[SEED:[a-z0-9]+]]: tensor<i64> {kiln.input = "dropout_seed"}
// CHECK: kiln.dropout %[[P]], %[[SEED]] rate = 3.000000e-01 salt = 5 : tensor<3x4xf32>, tensor<i64>
// CHECK: %[[G:.*]] = kiln.broadcast_in_dim
// CHECK-NEXT: %[[D:.*]] = kiln.dropout %[[G]], %[[SEED]] rate = 3.000000e-01 salt = 5 : tensor<3x4xf32>, tensor<i64>
// CHECK-NEXT: return %{{.*}}, %[[D]]
func.func @forward(%p: tensor<3x4xf32> {kiln.param = "p"}, %seed: tensor<i64> {kiln.input = "dropout_seed"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %0 = kiln.dropout %p, %seed rate = 3.000000e-01 salt = 5 : tensor<3x4xf32>, tensor<i64>
  %1 = kiln.reduce_sum %0 axes = [0, 1] : tensor<3x4xf32> -> tensor<f32>
  return %1 : tensor<f32>
}
