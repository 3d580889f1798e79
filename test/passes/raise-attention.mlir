// RUN: kiln-opt %s --split-input-file --kiln-raise-attention=min-keys=0 | FileCheck %s

// kiln-raise-attention: what it raises into kiln.attention, and the remark
// it leaves for each rank-4 softmax it does not raise.

// The attention layer's expansion: q kᵀ (transpose_rhs), a splat scale, the
// rows >= cols iota mask filled with -inf, softmax over the keys, p v. The
// mask becomes `causal`; the chain is gone.
// CHECK-LABEL: module attributes {kiln.attention_remarks = ["{{.*}}: raised kiln.attention (causal, scale 0.25) from 5 ops"]}
// CHECK: func.func @forward
// CHECK: %{{.*}}, %{{.*}} = kiln.attention %arg0, %arg1, %arg2 scale = 2.500000e-01 causal {kiln.block = "h.0"}
// CHECK-NOT: kiln.softmax
// CHECK-NOT: kiln.matmul
func.func @forward(%q: tensor<2x2x8x4xf32>, %k: tensor<2x2x8x4xf32>, %v: tensor<2x2x8x4xf32>) -> tensor<2x2x8x4xf32> {
  %s = kiln.matmul %q, %k transpose_rhs : tensor<2x2x8x4xf32>, tensor<2x2x8x4xf32> -> tensor<2x2x8x8xf32>
  %c = kiln.constant dense<2.500000e-01> : tensor<2x2x8x8xf32>
  %ss = kiln.mul %s, %c : tensor<2x2x8x8xf32>
  %rows = kiln.iota dim = 0 : tensor<8x8xi32>
  %cols = kiln.iota dim = 1 : tensor<8x8xi32>
  %m = kiln.compare ge, %rows, %cols : tensor<8x8xi32>
  %mb = kiln.broadcast_in_dim %m, dims = [2, 3] : tensor<8x8xi1> -> tensor<2x2x8x8xi1>
  %ninf = kiln.constant dense<0xFF800000> : tensor<2x2x8x8xf32>
  %sm = kiln.select %mb, %ss, %ninf : tensor<2x2x8x8xi1>, tensor<2x2x8x8xf32>
  %p = kiln.softmax %sm axis = 3 {kiln.block = "h.0"} : tensor<2x2x8x8xf32>
  %y = kiln.matmul %p, %v : tensor<2x2x8x8xf32>, tensor<2x2x8x4xf32> -> tensor<2x2x8x4xf32>
  return %y : tensor<2x2x8x4xf32>
}

// -----

// The near miss: softmax over the queries (axis 2), not the keys.
// CHECK: kiln.attention_remarks = ["{{.*}}: attention not raised: the softmax is over axis 2 of a rank-4 tensor, not the last (the keys)
// CHECK-NOT: kiln.attention %
// CHECK: kiln.softmax
func.func @forward(%q: tensor<1x2x8x4xf32>, %k: tensor<1x2x8x4xf32>, %v: tensor<1x2x8x4xf32>) -> tensor<1x2x8x4xf32> {
  %s = kiln.matmul %q, %k transpose_rhs : tensor<1x2x8x4xf32>, tensor<1x2x8x4xf32> -> tensor<1x2x8x8xf32>
  %p = kiln.softmax %s axis = 2 : tensor<1x2x8x8xf32>
  %y = kiln.matmul %p, %v : tensor<1x2x8x8xf32>, tensor<1x2x8x4xf32> -> tensor<1x2x8x4xf32>
  return %y : tensor<1x2x8x4xf32>
}

// -----

// The probabilities are returned too (attention weights a user keeps): the
// fused op does not store them.
// CHECK: attention not raised: the probabilities have other uses
func.func @forward(%q: tensor<1x2x8x4xf32>, %k: tensor<1x2x8x4xf32>, %v: tensor<1x2x8x4xf32>) -> (tensor<1x2x8x4xf32>, tensor<1x2x8x8xf32>) {
  %s = kiln.matmul %q, %k transpose_rhs : tensor<1x2x8x4xf32>, tensor<1x2x8x4xf32> -> tensor<1x2x8x8xf32>
  %p = kiln.softmax %s axis = 3 : tensor<1x2x8x8xf32>
  %y = kiln.matmul %p, %v : tensor<1x2x8x8xf32>, tensor<1x2x8x4xf32> -> tensor<1x2x8x4xf32>
  return %y, %p : tensor<1x2x8x4xf32>, tensor<1x2x8x8xf32>
}

// -----

// A mask filled with -1e4 rather than -inf: masked keys would keep a tiny
// weight, which the fused op (which drops them) would not reproduce.
// CHECK: attention not raised: the mask fills with something other than -inf
func.func @forward(%q: tensor<1x1x4x4xf32>, %k: tensor<1x1x4x4xf32>, %v: tensor<1x1x4x4xf32>, %m: tensor<1x1x4x4xi1>) -> tensor<1x1x4x4xf32> {
  %s = kiln.matmul %q, %k transpose_rhs : tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32> -> tensor<1x1x4x4xf32>
  %big = kiln.constant dense<-1.000000e+04> : tensor<1x1x4x4xf32>
  %sm = kiln.select %m, %s, %big : tensor<1x1x4x4xi1>, tensor<1x1x4x4xf32>
  %p = kiln.softmax %sm axis = 3 : tensor<1x1x4x4xf32>
  %y = kiln.matmul %p, %v : tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32> -> tensor<1x1x4x4xf32>
  return %y : tensor<1x1x4x4xf32>
}

// -----

// An additive mask computed from an input: it would need a gradient.
// CHECK: attention not raised: the additive mask depends on an input or a parameter
func.func @forward(%q: tensor<1x1x4x4xf32>, %k: tensor<1x1x4x4xf32>, %v: tensor<1x1x4x4xf32>, %bias: tensor<4x4xf32>) -> tensor<1x1x4x4xf32> {
  %s = kiln.matmul %q, %k transpose_rhs : tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32> -> tensor<1x1x4x4xf32>
  %b = kiln.broadcast_in_dim %bias, dims = [2, 3] : tensor<4x4xf32> -> tensor<1x1x4x4xf32>
  %sb = kiln.add %s, %b : tensor<1x1x4x4xf32>
  %p = kiln.softmax %sb axis = 3 : tensor<1x1x4x4xf32>
  %y = kiln.matmul %p, %v : tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32> -> tensor<1x1x4x4xf32>
  return %y : tensor<1x1x4x4xf32>
}

// -----

// A boolean mask input (a padding mask) is raised with the mask as an operand.
// CHECK: raised kiln.attention (masked, scale 1) from 4 ops
// CHECK: kiln.attention %arg0, %arg1, %arg2 mask(%arg3 : tensor<1x1x4x4xi1>) scale = 1.000000e+00 :
func.func @forward(%q: tensor<1x1x4x4xf32>, %k: tensor<1x1x4x4xf32>, %v: tensor<1x1x4x4xf32>, %m: tensor<1x1x4x4xi1>) -> tensor<1x1x4x4xf32> {
  %s = kiln.matmul %q, %k transpose_rhs : tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32> -> tensor<1x1x4x4xf32>
  %ninf = kiln.constant dense<0xFF800000> : tensor<1x1x4x4xf32>
  %sm = kiln.select %m, %s, %ninf : tensor<1x1x4x4xi1>, tensor<1x1x4x4xf32>
  %p = kiln.softmax %sm axis = 3 : tensor<1x1x4x4xf32>
  %y = kiln.matmul %p, %v : tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32> -> tensor<1x1x4x4xf32>
  return %y : tensor<1x1x4x4xf32>
}
