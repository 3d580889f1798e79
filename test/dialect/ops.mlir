// RUN: kiln-opt %s --split-input-file | FileCheck %s
// RUN: kiln-opt %s --split-input-file | kiln-opt --split-input-file | FileCheck %s

// Every kiln op, and the kiln function/module attributes, round-trip through
// the printer and the parser. The second RUN line re-parses the printed form.

//===----------------------------------------------------------------------===//
// Constants
//===----------------------------------------------------------------------===//

// CHECK-LABEL: func.func @constant
// CHECK: kiln.constant dense<1.000000e+00> : tensor<2x2xf32>
// CHECK: kiln.constant dense<[1.000000e-01, 2.000000e-01]> : tensor<2xf64>
// CHECK: kiln.constant dense<5.000000e-01> : tensor<3xf16>
// CHECK: kiln.constant dense<[1.500000e+00, -2.000000e+00]> : tensor<2xbf16>
// CHECK: kiln.constant dense<[1, 2, 3]> : tensor<3xi64>
// CHECK: kiln.constant dense<-7> : tensor<2x3xi32>
// CHECK: kiln.constant dense<true> : tensor<i1>
// CHECK: kiln.constant dense<{{\[}}[0, 1], [2, 3]]> : tensor<2x2xi32>
func.func @constant() -> (tensor<2x2xf32>, tensor<2xf64>, tensor<3xf16>, tensor<2xbf16>,
                          tensor<3xi64>, tensor<2x3xi32>, tensor<i1>, tensor<2x2xi32>) {
  %0 = kiln.constant dense<1.0> : tensor<2x2xf32>
  %1 = kiln.constant dense<[0.1, 0.2]> : tensor<2xf64>
  %2 = kiln.constant dense<0.5> : tensor<3xf16>
  %3 = kiln.constant dense<[1.5, -2.0]> : tensor<2xbf16>
  %4 = kiln.constant dense<[1, 2, 3]> : tensor<3xi64>
  %5 = kiln.constant dense<-7> : tensor<2x3xi32>
  %6 = kiln.constant dense<true> : tensor<i1>
  %7 = kiln.constant dense<[[0, 1], [2, 3]]> : tensor<2x2xi32>
  return %0, %1, %2, %3, %4, %5, %6, %7 : tensor<2x2xf32>, tensor<2xf64>, tensor<3xf16>, tensor<2xbf16>,
                                          tensor<3xi64>, tensor<2x3xi32>, tensor<i1>, tensor<2x2xi32>
}

// -----

// CHECK-LABEL: func.func @iota
// CHECK: kiln.iota dim = 0 : tensor<2x3xi32>
// CHECK: kiln.iota dim = 1 : tensor<2x3xi64>
// CHECK: kiln.iota dim = 0 : tensor<5xf32>
// CHECK: kiln.iota dim = 2 : tensor<2x3x4xbf16>
func.func @iota() -> (tensor<2x3xi32>, tensor<2x3xi64>, tensor<5xf32>, tensor<2x3x4xbf16>) {
  %0 = kiln.iota dim = 0 : tensor<2x3xi32>
  %1 = kiln.iota dim = 1 : tensor<2x3xi64>
  %2 = kiln.iota dim = 0 : tensor<5xf32>
  %3 = kiln.iota dim = 2 : tensor<2x3x4xbf16>
  return %0, %1, %2, %3 : tensor<2x3xi32>, tensor<2x3xi64>, tensor<5xf32>, tensor<2x3x4xbf16>
}

//===----------------------------------------------------------------------===//
// Unary elementwise
//===----------------------------------------------------------------------===//

// -----

// CHECK-LABEL: func.func @neg_abs_relu
// CHECK: kiln.neg %arg0 : tensor<4x8xf32>
// CHECK: kiln.neg %arg1 : tensor<4xi32>
// CHECK: kiln.abs %arg2 : tensor<f64>
// CHECK: kiln.abs %arg3 : tensor<3xi64>
// CHECK: kiln.relu %arg0 : tensor<4x8xf32>
// CHECK: kiln.relu %arg4 : tensor<2x2xbf16>
// CHECK: kiln.relu %arg1 : tensor<4xi32>
func.func @neg_abs_relu(%f32: tensor<4x8xf32>, %i32: tensor<4xi32>, %f64: tensor<f64>,
                        %i64: tensor<3xi64>, %bf16: tensor<2x2xbf16>) {
  %0 = kiln.neg %f32 : tensor<4x8xf32>
  %1 = kiln.neg %i32 : tensor<4xi32>
  %2 = kiln.abs %f64 : tensor<f64>
  %3 = kiln.abs %i64 : tensor<3xi64>
  %4 = kiln.relu %f32 : tensor<4x8xf32>
  %5 = kiln.relu %bf16 : tensor<2x2xbf16>
  %6 = kiln.relu %i32 : tensor<4xi32>
  return
}

// -----

// CHECK-LABEL: func.func @transcendental
// CHECK: kiln.exp %arg0 : tensor<4x8xf32>
// CHECK: kiln.log %arg1 : tensor<3xf64>
// CHECK: kiln.sqrt %arg2 : tensor<2x2xf16>
// CHECK: kiln.rsqrt %arg3 : tensor<8xbf16>
// CHECK: kiln.tanh %arg0 : tensor<4x8xf32>
// CHECK: kiln.sigmoid %arg1 : tensor<3xf64>
// CHECK: kiln.silu %arg0 : tensor<4x8xf32>
// CHECK: kiln.softplus %arg1 : tensor<3xf64>
func.func @transcendental(%f32: tensor<4x8xf32>, %f64: tensor<3xf64>,
                          %f16: tensor<2x2xf16>, %bf16: tensor<8xbf16>) {
  %0 = kiln.exp %f32 : tensor<4x8xf32>
  %1 = kiln.log %f64 : tensor<3xf64>
  %2 = kiln.sqrt %f16 : tensor<2x2xf16>
  %3 = kiln.rsqrt %bf16 : tensor<8xbf16>
  %4 = kiln.tanh %f32 : tensor<4x8xf32>
  %5 = kiln.sigmoid %f64 : tensor<3xf64>
  %6 = kiln.silu %f32 : tensor<4x8xf32>
  %7 = kiln.softplus %f64 : tensor<3xf64>
  return
}

// -----

// CHECK-LABEL: func.func @gelu
// CHECK: kiln.gelu erf, %arg0 : tensor<4x8xf32>
// CHECK: kiln.gelu tanh, %arg0 : tensor<4x8xf32>
// CHECK: kiln.gelu tanh, %arg1 : tensor<16xbf16>
func.func @gelu(%x: tensor<4x8xf32>, %y: tensor<16xbf16>) {
  %0 = kiln.gelu erf, %x : tensor<4x8xf32>
  %1 = kiln.gelu tanh, %x : tensor<4x8xf32>
  %2 = kiln.gelu tanh, %y : tensor<16xbf16>
  return
}

// -----

// CHECK-LABEL: func.func @cast
// CHECK: kiln.cast %arg0 : tensor<4x8xf32> -> tensor<4x8xbf16>
// CHECK: kiln.cast %arg0 : tensor<4x8xf32> -> tensor<4x8xf64>
// CHECK: kiln.cast %arg0 : tensor<4x8xf32> -> tensor<4x8xi32>
// CHECK: kiln.cast %arg1 : tensor<3xi64> -> tensor<3xi1>
// CHECK: kiln.cast %arg2 : tensor<3xi1> -> tensor<3xf16>
func.func @cast(%x: tensor<4x8xf32>, %i: tensor<3xi64>, %b: tensor<3xi1>) {
  %0 = kiln.cast %x : tensor<4x8xf32> -> tensor<4x8xbf16>
  %1 = kiln.cast %x : tensor<4x8xf32> -> tensor<4x8xf64>
  %2 = kiln.cast %x : tensor<4x8xf32> -> tensor<4x8xi32>
  %3 = kiln.cast %i : tensor<3xi64> -> tensor<3xi1>
  %4 = kiln.cast %b : tensor<3xi1> -> tensor<3xf16>
  return
}

//===----------------------------------------------------------------------===//
// Binary elementwise
//===----------------------------------------------------------------------===//

// -----

// CHECK-LABEL: func.func @arith
// CHECK: kiln.add %arg0, %arg1 : tensor<4x8xf32>
// CHECK: kiln.sub %arg2, %arg2 : tensor<3xi64>
// CHECK: kiln.mul %arg3, %arg3 : tensor<2xf16>
// CHECK: kiln.div %arg4, %arg4 : tensor<5xi32>
// CHECK: kiln.div %arg5, %arg5 : tensor<f64>
// CHECK: kiln.add %arg6, %arg6 : tensor<2x2xbf16>
func.func @arith(%a: tensor<4x8xf32>, %b: tensor<4x8xf32>, %i64: tensor<3xi64>,
                 %f16: tensor<2xf16>, %i32: tensor<5xi32>, %f64: tensor<f64>,
                 %bf16: tensor<2x2xbf16>) {
  %0 = kiln.add %a, %b : tensor<4x8xf32>
  %1 = kiln.sub %i64, %i64 : tensor<3xi64>
  %2 = kiln.mul %f16, %f16 : tensor<2xf16>
  %3 = kiln.div %i32, %i32 : tensor<5xi32>
  %4 = kiln.div %f64, %f64 : tensor<f64>
  %5 = kiln.add %bf16, %bf16 : tensor<2x2xbf16>
  return
}

// -----

// CHECK-LABEL: func.func @pow_max_min
// CHECK: kiln.pow %arg0, %arg1 : tensor<4xf32>
// CHECK: kiln.pow %arg2, %arg2 : tensor<2xbf16>
// CHECK: kiln.max %arg0, %arg1 : tensor<4xf32>
// CHECK: kiln.max %arg3, %arg3 : tensor<3xi32>
// CHECK: kiln.min %arg0, %arg1 : tensor<4xf32>
// CHECK: kiln.min %arg4, %arg4 : tensor<3xi64>
func.func @pow_max_min(%a: tensor<4xf32>, %b: tensor<4xf32>, %bf16: tensor<2xbf16>,
                       %i32: tensor<3xi32>, %i64: tensor<3xi64>) {
  %0 = kiln.pow %a, %b : tensor<4xf32>
  %1 = kiln.pow %bf16, %bf16 : tensor<2xbf16>
  %2 = kiln.max %a, %b : tensor<4xf32>
  %3 = kiln.max %i32, %i32 : tensor<3xi32>
  %4 = kiln.min %a, %b : tensor<4xf32>
  %5 = kiln.min %i64, %i64 : tensor<3xi64>
  return
}

// -----

// CHECK-LABEL: func.func @compare
// CHECK: kiln.compare eq, %arg0, %arg1 : tensor<4x8xf32>
// CHECK: kiln.compare ne, %arg0, %arg1 : tensor<4x8xf32>
// CHECK: kiln.compare lt, %arg0, %arg1 : tensor<4x8xf32>
// CHECK: kiln.compare le, %arg2, %arg2 : tensor<64x64xi32>
// CHECK: kiln.compare gt, %arg3, %arg3 : tensor<f16>
// CHECK: kiln.compare ge, %arg2, %arg2 : tensor<64x64xi32>
// CHECK: return {{.*}} : tensor<4x8xi1>, tensor<4x8xi1>, tensor<4x8xi1>, tensor<64x64xi1>, tensor<i1>, tensor<64x64xi1>
func.func @compare(%a: tensor<4x8xf32>, %b: tensor<4x8xf32>, %i: tensor<64x64xi32>, %h: tensor<f16>)
    -> (tensor<4x8xi1>, tensor<4x8xi1>, tensor<4x8xi1>, tensor<64x64xi1>, tensor<i1>, tensor<64x64xi1>) {
  %0 = kiln.compare eq, %a, %b : tensor<4x8xf32>
  %1 = kiln.compare ne, %a, %b : tensor<4x8xf32>
  %2 = kiln.compare lt, %a, %b : tensor<4x8xf32>
  %3 = kiln.compare le, %i, %i : tensor<64x64xi32>
  %4 = kiln.compare gt, %h, %h : tensor<f16>
  %5 = kiln.compare ge, %i, %i : tensor<64x64xi32>
  return %0, %1, %2, %3, %4, %5 : tensor<4x8xi1>, tensor<4x8xi1>, tensor<4x8xi1>, tensor<64x64xi1>, tensor<i1>, tensor<64x64xi1>
}

// -----

// CHECK-LABEL: func.func @select
// CHECK: kiln.select %arg0, %arg1, %arg2 : tensor<4x8xi1>, tensor<4x8xf32>
// CHECK: kiln.select %arg0, %arg3, %arg3 : tensor<4x8xi1>, tensor<4x8xi32>
// CHECK: kiln.select %arg0, %arg0, %arg0 : tensor<4x8xi1>, tensor<4x8xi1>
func.func @select(%p: tensor<4x8xi1>, %a: tensor<4x8xf32>, %b: tensor<4x8xf32>, %i: tensor<4x8xi32>) {
  %0 = kiln.select %p, %a, %b : tensor<4x8xi1>, tensor<4x8xf32>
  %1 = kiln.select %p, %i, %i : tensor<4x8xi1>, tensor<4x8xi32>
  %2 = kiln.select %p, %p, %p : tensor<4x8xi1>, tensor<4x8xi1>
  return
}

//===----------------------------------------------------------------------===//
// Broadcasting and reductions
//===----------------------------------------------------------------------===//

// -----

// CHECK-LABEL: func.func @broadcast_in_dim
// CHECK: kiln.broadcast_in_dim %arg0, dims = [2] : tensor<384xf32> -> tensor<12x64x384xf32>
// CHECK: kiln.broadcast_in_dim %arg1, dims = [0, 2] : tensor<4x1xi32> -> tensor<4x5x6xi32>
// CHECK: kiln.broadcast_in_dim %arg2, dims = [] : tensor<f16> -> tensor<2x3xf16>
// CHECK: kiln.broadcast_in_dim %arg3, dims = [1] : tensor<3xi1> -> tensor<2x3xi1>
func.func @broadcast_in_dim(%bias: tensor<384xf32>, %col: tensor<4x1xi32>, %s: tensor<f16>,
                            %m: tensor<3xi1>) {
  %0 = kiln.broadcast_in_dim %bias, dims = [2] : tensor<384xf32> -> tensor<12x64x384xf32>
  %1 = kiln.broadcast_in_dim %col, dims = [0, 2] : tensor<4x1xi32> -> tensor<4x5x6xi32>
  %2 = kiln.broadcast_in_dim %s, dims = [] : tensor<f16> -> tensor<2x3xf16>
  %3 = kiln.broadcast_in_dim %m, dims = [1] : tensor<3xi1> -> tensor<2x3xi1>
  return
}

// -----

// CHECK-LABEL: func.func @reduce
// CHECK: kiln.reduce_sum %arg0 axes = [1] : tensor<4x8xf32> -> tensor<4xf32>
// CHECK: kiln.reduce_sum %arg0 axes = [1] keepdims : tensor<4x8xf32> -> tensor<4x1xf32>
// CHECK: kiln.reduce_sum %arg1 axes = [0, 2] : tensor<2x3x4xi32> -> tensor<3xi32>
// CHECK: kiln.reduce_mean %arg0 axes = [0, 1] : tensor<4x8xf32> -> tensor<f32>
// CHECK: kiln.reduce_mean %arg2 axes = [0] keepdims : tensor<5x6xbf16> -> tensor<1x6xbf16>
// CHECK: kiln.reduce_max %arg3 axes = [1] : tensor<2x3xf64> -> tensor<2xf64>
// CHECK: kiln.reduce_max %arg1 axes = [0, 2] keepdims : tensor<2x3x4xi32> -> tensor<1x3x1xi32>
func.func @reduce(%x: tensor<4x8xf32>, %i: tensor<2x3x4xi32>, %h: tensor<5x6xbf16>, %d: tensor<2x3xf64>) {
  %0 = kiln.reduce_sum %x axes = [1] : tensor<4x8xf32> -> tensor<4xf32>
  %1 = kiln.reduce_sum %x axes = [1] keepdims : tensor<4x8xf32> -> tensor<4x1xf32>
  %2 = kiln.reduce_sum %i axes = [0, 2] : tensor<2x3x4xi32> -> tensor<3xi32>
  %3 = kiln.reduce_mean %x axes = [0, 1] : tensor<4x8xf32> -> tensor<f32>
  %4 = kiln.reduce_mean %h axes = [0] keepdims : tensor<5x6xbf16> -> tensor<1x6xbf16>
  %5 = kiln.reduce_max %d axes = [1] : tensor<2x3xf64> -> tensor<2xf64>
  %6 = kiln.reduce_max %i axes = [0, 2] keepdims : tensor<2x3x4xi32> -> tensor<1x3x1xi32>
  return
}

//===----------------------------------------------------------------------===//
// Linear algebra
//===----------------------------------------------------------------------===//

// -----

// CHECK-LABEL: func.func @matmul
// CHECK: kiln.matmul %arg0, %arg1 : tensor<4x5xf32>, tensor<5x6xf32> -> tensor<4x6xf32>
// CHECK: kiln.matmul %arg1, %arg2 transpose_lhs : tensor<5x6xf32>, tensor<5x7xf32> -> tensor<6x7xf32>
// CHECK: kiln.matmul %arg0, %arg3 transpose_rhs : tensor<4x5xf32>, tensor<7x5xf32> -> tensor<4x7xf32>
// CHECK: kiln.matmul %arg1, %arg3 transpose_lhs transpose_rhs : tensor<5x6xf32>, tensor<7x5xf32> -> tensor<6x7xf32>
// CHECK: kiln.matmul %arg4, %arg4 : tensor<3x2x2xi32>, tensor<3x2x2xi32> -> tensor<3x2x2xi32>
// CHECK: kiln.matmul %arg5, %arg5 transpose_lhs : tensor<3x3xf64>, tensor<3x3xf64> -> tensor<3x3xf64>
func.func @matmul(%a: tensor<4x5xf32>, %b: tensor<5x6xf32>, %c: tensor<5x7xf32>, %d: tensor<7x5xf32>,
                  %i: tensor<3x2x2xi32>, %e: tensor<3x3xf64>) {
  %0 = kiln.matmul %a, %b : tensor<4x5xf32>, tensor<5x6xf32> -> tensor<4x6xf32>
  %1 = kiln.matmul %b, %c transpose_lhs : tensor<5x6xf32>, tensor<5x7xf32> -> tensor<6x7xf32>
  %2 = kiln.matmul %a, %d transpose_rhs : tensor<4x5xf32>, tensor<7x5xf32> -> tensor<4x7xf32>
  %3 = kiln.matmul %b, %d transpose_lhs transpose_rhs : tensor<5x6xf32>, tensor<7x5xf32> -> tensor<6x7xf32>
  %4 = kiln.matmul %i, %i : tensor<3x2x2xi32>, tensor<3x2x2xi32> -> tensor<3x2x2xi32>
  %5 = kiln.matmul %e, %e transpose_lhs : tensor<3x3xf64>, tensor<3x3xf64> -> tensor<3x3xf64>
  return
}

// -----

// A weight without batch dims is shared across the batch, on either side.
// CHECK-LABEL: func.func @matmul_batched
// CHECK: kiln.matmul %arg0, %arg1 : tensor<2x12x64x32xbf16>, tensor<2x12x32x64xbf16> -> tensor<2x12x64x64xbf16>
// CHECK: kiln.matmul %arg2, %arg3 transpose_rhs : tensor<12x64x128xf32>, tensor<512x128xf32> -> tensor<12x64x512xf32>
// CHECK: kiln.matmul %arg4, %arg2 : tensor<7x64xf32>, tensor<12x64x128xf32> -> tensor<12x7x128xf32>
func.func @matmul_batched(%q: tensor<2x12x64x32xbf16>, %k: tensor<2x12x32x64xbf16>,
                          %x: tensor<12x64x128xf32>, %w: tensor<512x128xf32>, %v: tensor<7x64xf32>) {
  %0 = kiln.matmul %q, %k : tensor<2x12x64x32xbf16>, tensor<2x12x32x64xbf16> -> tensor<2x12x64x64xbf16>
  %1 = kiln.matmul %x, %w transpose_rhs : tensor<12x64x128xf32>, tensor<512x128xf32> -> tensor<12x64x512xf32>
  %2 = kiln.matmul %v, %x : tensor<7x64xf32>, tensor<12x64x128xf32> -> tensor<12x7x128xf32>
  return
}

//===----------------------------------------------------------------------===//
// Shape manipulation
//===----------------------------------------------------------------------===//

// -----

// CHECK-LABEL: func.func @reshape
// CHECK: kiln.reshape %arg0 : tensor<12x64x384xf32> -> tensor<12x64x6x64xf32>
// CHECK: kiln.reshape %arg1 : tensor<2x3xi64> -> tensor<6xi64>
// CHECK: kiln.reshape %arg2 : tensor<1x1xi1> -> tensor<i1>
func.func @reshape(%x: tensor<12x64x384xf32>, %i: tensor<2x3xi64>, %b: tensor<1x1xi1>) {
  %0 = kiln.reshape %x : tensor<12x64x384xf32> -> tensor<12x64x6x64xf32>
  %1 = kiln.reshape %i : tensor<2x3xi64> -> tensor<6xi64>
  %2 = kiln.reshape %b : tensor<1x1xi1> -> tensor<i1>
  return
}

// -----

// CHECK-LABEL: func.func @transpose
// CHECK: kiln.transpose %arg0 perm = [0, 2, 1, 3] : tensor<12x64x6x64xf32> -> tensor<12x6x64x64xf32>
// CHECK: kiln.transpose %arg1 perm = [1, 0] : tensor<2x3xi32> -> tensor<3x2xi32>
// CHECK: kiln.transpose %arg2 perm = [2, 0, 1] : tensor<2x3x4xf16> -> tensor<4x2x3xf16>
func.func @transpose(%x: tensor<12x64x6x64xf32>, %i: tensor<2x3xi32>, %h: tensor<2x3x4xf16>) {
  %0 = kiln.transpose %x perm = [0, 2, 1, 3] : tensor<12x64x6x64xf32> -> tensor<12x6x64x64xf32>
  %1 = kiln.transpose %i perm = [1, 0] : tensor<2x3xi32> -> tensor<3x2xi32>
  %2 = kiln.transpose %h perm = [2, 0, 1] : tensor<2x3x4xf16> -> tensor<4x2x3xf16>
  return
}

// -----

// CHECK-LABEL: func.func @slice
// CHECK: kiln.slice %arg0 start = [0, 0, 0] limit = [12, 64, 384] stride = [1, 1, 1] : tensor<12x64x1152xf32> -> tensor<12x64x384xf32>
// CHECK: kiln.slice %arg0 start = [0, 0, 384] limit = [12, 64, 768] stride = [1, 1, 1] : tensor<12x64x1152xf32> -> tensor<12x64x384xf32>
// CHECK: kiln.slice %arg1 start = [1] limit = [10] stride = [3] : tensor<10xi64> -> tensor<3xi64>
// CHECK: kiln.slice %arg1 start = [4] limit = [4] stride = [1] : tensor<10xi64> -> tensor<0xi64>
func.func @slice(%qkv: tensor<12x64x1152xf32>, %i: tensor<10xi64>) {
  %0 = kiln.slice %qkv start = [0, 0, 0] limit = [12, 64, 384] stride = [1, 1, 1] : tensor<12x64x1152xf32> -> tensor<12x64x384xf32>
  %1 = kiln.slice %qkv start = [0, 0, 384] limit = [12, 64, 768] stride = [1, 1, 1] : tensor<12x64x1152xf32> -> tensor<12x64x384xf32>
  %2 = kiln.slice %i start = [1] limit = [10] stride = [3] : tensor<10xi64> -> tensor<3xi64>
  %3 = kiln.slice %i start = [4] limit = [4] stride = [1] : tensor<10xi64> -> tensor<0xi64>
  return
}

// -----

// CHECK-LABEL: func.func @concat
// CHECK: kiln.concat %arg0, %arg1 dim = 1 : tensor<4x3xf32>, tensor<4x5xf32> -> tensor<4x8xf32>
// CHECK: kiln.concat %arg0, %arg0, %arg0 dim = 0 : tensor<4x3xf32>, tensor<4x3xf32>, tensor<4x3xf32> -> tensor<12x3xf32>
// CHECK: kiln.concat %arg2 dim = 0 : tensor<2xi1> -> tensor<2xi1>
func.func @concat(%a: tensor<4x3xf32>, %b: tensor<4x5xf32>, %m: tensor<2xi1>) {
  %0 = kiln.concat %a, %b dim = 1 : tensor<4x3xf32>, tensor<4x5xf32> -> tensor<4x8xf32>
  %1 = kiln.concat %a, %a, %a dim = 0 : tensor<4x3xf32>, tensor<4x3xf32>, tensor<4x3xf32> -> tensor<12x3xf32>
  %2 = kiln.concat %m dim = 0 : tensor<2xi1> -> tensor<2xi1>
  return
}

// -----

// CHECK-LABEL: func.func @gather
// CHECK: kiln.gather %arg0[%arg1] axis = 0 : tensor<65x384xf32>, tensor<12x64xi32> -> tensor<12x64x384xf32>
// CHECK: kiln.gather %arg2[%arg3] axis = 1 : tensor<2x5x3xi64>, tensor<4xi64> -> tensor<2x4x3xi64>
// CHECK: kiln.gather %arg0[%arg4] axis = 0 : tensor<65x384xf32>, tensor<i32> -> tensor<384xf32>
func.func @gather(%wte: tensor<65x384xf32>, %tokens: tensor<12x64xi32>, %t: tensor<2x5x3xi64>,
                  %idx: tensor<4xi64>, %one: tensor<i32>) {
  %0 = kiln.gather %wte[%tokens] axis = 0 : tensor<65x384xf32>, tensor<12x64xi32> -> tensor<12x64x384xf32>
  %1 = kiln.gather %t[%idx] axis = 1 : tensor<2x5x3xi64>, tensor<4xi64> -> tensor<2x4x3xi64>
  %2 = kiln.gather %wte[%one] axis = 0 : tensor<65x384xf32>, tensor<i32> -> tensor<384xf32>
  return
}

//===----------------------------------------------------------------------===//
// Neural-network composites
//===----------------------------------------------------------------------===//

// -----

// CHECK-LABEL: func.func @softmax
// CHECK: kiln.softmax %arg0 axis = 3 : tensor<12x4x64x64xf32>
// CHECK: kiln.softmax %arg1 axis = 0 : tensor<8xbf16>
// CHECK: kiln.log_softmax %arg0 axis = 1 : tensor<12x4x64x64xf32>
// CHECK: kiln.log_softmax %arg2 axis = 1 : tensor<2x10xf64>
func.func @softmax(%s: tensor<12x4x64x64xf32>, %h: tensor<8xbf16>, %d: tensor<2x10xf64>) {
  %0 = kiln.softmax %s axis = 3 : tensor<12x4x64x64xf32>
  %1 = kiln.softmax %h axis = 0 : tensor<8xbf16>
  %2 = kiln.log_softmax %s axis = 1 : tensor<12x4x64x64xf32>
  %3 = kiln.log_softmax %d axis = 1 : tensor<2x10xf64>
  return
}

// -----

// The default epsilon (1e-5) is not printed.
// CHECK-LABEL: func.func @layer_norm
// CHECK: kiln.layer_norm %arg0 : tensor<12x64x384xf32>
// CHECK: kiln.layer_norm %arg0 : tensor<12x64x384xf32>
// CHECK: kiln.layer_norm %arg0 scale(%arg1 : tensor<384xf32>) : tensor<12x64x384xf32>
// CHECK: kiln.layer_norm %arg0 scale(%arg1 : tensor<384xf32>) bias(%arg2 : tensor<384xf32>) {epsilon = 1.000000e-03 : f64} : tensor<12x64x384xf32>
// CHECK: kiln.layer_norm %arg0 bias(%arg2 : tensor<384xf32>) : tensor<12x64x384xf32>
// CHECK: kiln.layer_norm %arg3 scale(%arg4 : tensor<8xbf16>) bias(%arg4 : tensor<8xbf16>) : tensor<8xbf16>
func.func @layer_norm(%x: tensor<12x64x384xf32>, %g: tensor<384xf32>, %b: tensor<384xf32>,
                      %h: tensor<8xbf16>, %hg: tensor<8xbf16>) {
  %0 = kiln.layer_norm %x : tensor<12x64x384xf32>
  %1 = kiln.layer_norm %x {epsilon = 1.0e-05 : f64} : tensor<12x64x384xf32>
  %2 = kiln.layer_norm %x scale(%g : tensor<384xf32>) : tensor<12x64x384xf32>
  %3 = kiln.layer_norm %x scale(%g : tensor<384xf32>) bias(%b : tensor<384xf32>) {epsilon = 1.0e-03 : f64} : tensor<12x64x384xf32>
  %4 = kiln.layer_norm %x bias(%b : tensor<384xf32>) : tensor<12x64x384xf32>
  %5 = kiln.layer_norm %h scale(%hg : tensor<8xbf16>) bias(%hg : tensor<8xbf16>) : tensor<8xbf16>
  return
}

// -----

// CHECK-LABEL: func.func @cross_entropy
// CHECK: kiln.cross_entropy %arg0, %arg1 reduction = mean : tensor<12x64x65xf32>, tensor<12x64xi32> -> tensor<f32>
// CHECK: kiln.cross_entropy %arg0, %arg1 reduction = sum : tensor<12x64x65xf32>, tensor<12x64xi32> -> tensor<f32>
// CHECK: kiln.cross_entropy %arg0, %arg1 reduction = none : tensor<12x64x65xf32>, tensor<12x64xi32> -> tensor<12x64xf32>
// CHECK: kiln.cross_entropy %arg2, %arg3 reduction = none : tensor<10xbf16>, tensor<i64> -> tensor<bf16>
func.func @cross_entropy(%logits: tensor<12x64x65xf32>, %targets: tensor<12x64xi32>,
                         %l1: tensor<10xbf16>, %t1: tensor<i64>) {
  %0 = kiln.cross_entropy %logits, %targets reduction = mean : tensor<12x64x65xf32>, tensor<12x64xi32> -> tensor<f32>
  %1 = kiln.cross_entropy %logits, %targets reduction = sum : tensor<12x64x65xf32>, tensor<12x64xi32> -> tensor<f32>
  %2 = kiln.cross_entropy %logits, %targets reduction = none : tensor<12x64x65xf32>, tensor<12x64xi32> -> tensor<12x64xf32>
  %3 = kiln.cross_entropy %l1, %t1 reduction = none : tensor<10xbf16>, tensor<i64> -> tensor<bf16>
  return
}

// -----

// CHECK-LABEL: func.func @dropout
// CHECK: %[[D:.*]] = kiln.dropout %arg0, %arg1 rate = 1.000000e-01 salt = 3 : tensor<12x64x384xf32>, tensor<i64>
// CHECK: kiln.dropout %[[D]], %arg1 rate = 0.000000e+00 salt = 0 : tensor<12x64x384xf32>, tensor<i64>
// CHECK: kiln.dropout %arg2, %arg1 rate = 5.000000e-01 salt = -1 : tensor<4xf16>, tensor<i64>
func.func @dropout(%x: tensor<12x64x384xf32>, %seed: tensor<i64>, %h: tensor<4xf16>) {
  %0 = kiln.dropout %x, %seed rate = 1.0e-01 salt = 3 : tensor<12x64x384xf32>, tensor<i64>
  %1 = kiln.dropout %0, %seed rate = 0.0 salt = 0 : tensor<12x64x384xf32>, tensor<i64>
  %2 = kiln.dropout %h, %seed rate = 0.5 salt = -1 : tensor<4xf16>, tensor<i64>
  return
}

//===----------------------------------------------------------------------===//
// Function argument and result attributes
//===----------------------------------------------------------------------===//

// -----

// CHECK-LABEL: func.func @param_attrs
// CHECK-SAME: %arg0: tensor<65x384xf32> {kiln.init = {kind = "normal", mean = 0.000000e+00 : f64, std = 2.000000e-02 : f64}, kiln.layer = "wte", kiln.param = "wte.weight"}
// CHECK-SAME: %arg1: tensor<384x384xf32> {kiln.init = {high = 1.000000e-01 : f64, kind = "uniform", low = -1.000000e-01 : f64}, kiln.layer = "fc", kiln.param = "fc.weight"}
// CHECK-SAME: %arg2: tensor<384xf32> {kiln.init = {kind = "zeros"}, kiln.param = "fc.bias"}
// CHECK-SAME: %arg3: tensor<384xbf16> {kiln.init = {kind = "ones"}, kiln.param = "ln.scale"}
// CHECK-SAME: %arg4: tensor<12x64xi32> {kiln.input = "tokens"}
// CHECK-SAME: -> (tensor<f32> {kiln.output = "loss"}, tensor<384xf32> {kiln.output = "grad"})
func.func @param_attrs(
    %wte: tensor<65x384xf32> {kiln.param = "wte.weight", kiln.layer = "wte",
                              kiln.init = {kind = "normal", mean = 0.0 : f64, std = 0.02 : f64}},
    %w: tensor<384x384xf32> {kiln.param = "fc.weight", kiln.layer = "fc",
                             kiln.init = {kind = "uniform", low = -0.1 : f64, high = 0.1 : f64}},
    %b: tensor<384xf32> {kiln.param = "fc.bias", kiln.init = {kind = "zeros"}},
    %g: tensor<384xbf16> {kiln.param = "ln.scale", kiln.init = {kind = "ones"}},
    %tokens: tensor<12x64xi32> {kiln.input = "tokens"})
    -> (tensor<f32> {kiln.output = "loss"}, tensor<384xf32> {kiln.output = "grad"}) {
  %loss = kiln.constant dense<0.0> : tensor<f32>
  return %loss, %b : tensor<f32>, tensor<384xf32>
}

//===----------------------------------------------------------------------===//
// Module attributes
//===----------------------------------------------------------------------===//

// -----

// CHECK: module attributes
// CHECK-SAME: kiln.dims = {block_size = 64 : i64, n_embd = 384 : i64}
// CHECK-SAME: kiln.model = "gpt"
// CHECK-SAME: kiln.source = "examples/gpt.kiln"
// CHECK-SAME: kiln.train = {batch_size = 12 : i64, lr = 3.000000e-04 : f64, optimizer = "adamw"}
// CHECK-LABEL: func.func @module_attrs
module attributes {kiln.model = "gpt", kiln.source = "examples/gpt.kiln",
                   kiln.train = {optimizer = "adamw", lr = 3.0e-04 : f64, batch_size = 12 : i64},
                   kiln.dims = {n_embd = 384 : i64, block_size = 64 : i64}} {
  func.func @module_attrs() {
    return
  }
}

// -----

// An empty kiln.train dictionary is allowed.
// CHECK: module attributes {kiln.model = "tiny", kiln.train = {}}
// CHECK-LABEL: func.func @module_attrs_empty_train
module attributes {kiln.model = "tiny", kiln.train = {}} {
  func.func @module_attrs_empty_train() {
    return
  }
}
