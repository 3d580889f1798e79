// RUN: kiln-opt %s --canonicalize --split-input-file | FileCheck %s

// Folders and canonicalization patterns of the kiln dialect, then cases where
// nothing may fold.

//===----------------------------------------------------------------------===//
// Arithmetic identities
//===----------------------------------------------------------------------===//

// add(x, -0.0) => x (the exact float identity)
// CHECK-LABEL: func.func @add_zero_rhs
// CHECK-NEXT: return %arg0 : tensor<4x8xf32>
func.func @add_zero_rhs(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %zero = kiln.constant dense<-0.0> : tensor<4x8xf32>
  %0 = kiln.add %x, %zero : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

// add(-0.0, x) => x
// CHECK-LABEL: func.func @add_zero_lhs
// CHECK-NEXT: return %arg0 : tensor<4xf16>
func.func @add_zero_lhs(%x: tensor<4xf16>) -> tensor<4xf16> {
  %zero = kiln.constant dense<-0.0> : tensor<4xf16>
  %0 = kiln.add %zero, %x : tensor<4xf16>
  return %0 : tensor<4xf16>
}

// -----

// add(x, +0.0) stays: -0.0 + 0.0 is +0.0, so it is not an identity
// CHECK-LABEL: func.func @add_positive_zero_kept
// CHECK: kiln.add
func.func @add_positive_zero_kept(%x: tensor<4xf32>) -> tensor<4xf32> {
  %zero = kiln.constant dense<0.0> : tensor<4xf32>
  %0 = kiln.add %x, %zero : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// add(x, 0) => x, integer
// CHECK-LABEL: func.func @add_zero_int
// CHECK-NEXT: return %arg0 : tensor<3xi32>
func.func @add_zero_int(%x: tensor<3xi32>) -> tensor<3xi32> {
  %zero = kiln.constant dense<0> : tensor<3xi32>
  %0 = kiln.add %x, %zero : tensor<3xi32>
  return %0 : tensor<3xi32>
}

// -----

// sub(x, 0) => x
// CHECK-LABEL: func.func @sub_zero
// CHECK-NEXT: return %arg0 : tensor<4x8xbf16>
func.func @sub_zero(%x: tensor<4x8xbf16>) -> tensor<4x8xbf16> {
  %zero = kiln.constant dense<0.0> : tensor<4x8xbf16>
  %0 = kiln.sub %x, %zero : tensor<4x8xbf16>
  return %0 : tensor<4x8xbf16>
}

// -----

// mul(x, 1) => x
// CHECK-LABEL: func.func @mul_one_rhs
// CHECK-NEXT: return %arg0 : tensor<4x8xf32>
func.func @mul_one_rhs(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %one = kiln.constant dense<1.0> : tensor<4x8xf32>
  %0 = kiln.mul %x, %one : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

// mul(1, x) => x
// CHECK-LABEL: func.func @mul_one_lhs
// CHECK-NEXT: return %arg0 : tensor<5xi64>
func.func @mul_one_lhs(%x: tensor<5xi64>) -> tensor<5xi64> {
  %one = kiln.constant dense<1> : tensor<5xi64>
  %0 = kiln.mul %one, %x : tensor<5xi64>
  return %0 : tensor<5xi64>
}

// -----

// div(x, 1) => x
// CHECK-LABEL: func.func @div_one
// CHECK-NEXT: return %arg0 : tensor<2x2xf64>
func.func @div_one(%x: tensor<2x2xf64>) -> tensor<2x2xf64> {
  %one = kiln.constant dense<1.0> : tensor<2x2xf64>
  %0 = kiln.div %x, %one : tensor<2x2xf64>
  return %0 : tensor<2x2xf64>
}

// -----

// div(x, 1) => x, integer
// CHECK-LABEL: func.func @div_one_int
// CHECK-NEXT: return %arg0 : tensor<3xi32>
func.func @div_one_int(%x: tensor<3xi32>) -> tensor<3xi32> {
  %one = kiln.constant dense<1> : tensor<3xi32>
  %0 = kiln.div %x, %one : tensor<3xi32>
  return %0 : tensor<3xi32>
}

// -----

// pow(x, 1) => x
// CHECK-LABEL: func.func @pow_one
// CHECK-NEXT: return %arg0 : tensor<4xf32>
func.func @pow_one(%x: tensor<4xf32>) -> tensor<4xf32> {
  %one = kiln.constant dense<1.0> : tensor<4xf32>
  %0 = kiln.pow %x, %one : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// neg(neg(x)) => x
// CHECK-LABEL: func.func @neg_neg
// CHECK-NEXT: return %arg0 : tensor<4xi32>
func.func @neg_neg(%x: tensor<4xi32>) -> tensor<4xi32> {
  %0 = kiln.neg %x : tensor<4xi32>
  %1 = kiln.neg %0 : tensor<4xi32>
  return %1 : tensor<4xi32>
}

// -----

// neg(neg(neg(x))) => neg(x)
// CHECK-LABEL: func.func @neg_neg_neg
// CHECK-NEXT: %[[N:.*]] = kiln.neg %arg0 : tensor<4xf32>
// CHECK-NEXT: return %[[N]] : tensor<4xf32>
func.func @neg_neg_neg(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = kiln.neg %x : tensor<4xf32>
  %1 = kiln.neg %0 : tensor<4xf32>
  %2 = kiln.neg %1 : tensor<4xf32>
  return %2 : tensor<4xf32>
}

// -----

// cast(x : T -> T) => x
// CHECK-LABEL: func.func @cast_same_type
// CHECK-NEXT: return %arg0 : tensor<4x8xbf16>
func.func @cast_same_type(%x: tensor<4x8xbf16>) -> tensor<4x8xbf16> {
  %0 = kiln.cast %x : tensor<4x8xbf16> -> tensor<4x8xbf16>
  return %0 : tensor<4x8xbf16>
}

//===----------------------------------------------------------------------===//
// Splat constant folding
//===----------------------------------------------------------------------===//

// -----

// add(splat 2.0, splat 3.0) => splat 5.0
// CHECK-LABEL: func.func @add_splats_float
// CHECK-NEXT: %[[C:.*]] = kiln.constant dense<5.000000e+00> : tensor<4xf32>
// CHECK-NEXT: return %[[C]] : tensor<4xf32>
func.func @add_splats_float() -> tensor<4xf32> {
  %a = kiln.constant dense<2.0> : tensor<4xf32>
  %b = kiln.constant dense<3.0> : tensor<4xf32>
  %0 = kiln.add %a, %b : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// add(splat 7, splat 5) => splat 12
// CHECK-LABEL: func.func @add_splats_int
// CHECK-NEXT: %[[C:.*]] = kiln.constant dense<12> : tensor<2x3xi64>
// CHECK-NEXT: return %[[C]] : tensor<2x3xi64>
func.func @add_splats_int() -> tensor<2x3xi64> {
  %a = kiln.constant dense<7> : tensor<2x3xi64>
  %b = kiln.constant dense<5> : tensor<2x3xi64>
  %0 = kiln.add %a, %b : tensor<2x3xi64>
  return %0 : tensor<2x3xi64>
}

// -----

// sub(splat 1.5, splat 4.0) => splat -2.5
// CHECK-LABEL: func.func @sub_splats_float
// CHECK-NEXT: %[[C:.*]] = kiln.constant dense<-2.500000e+00> : tensor<4xf64>
// CHECK-NEXT: return %[[C]] : tensor<4xf64>
func.func @sub_splats_float() -> tensor<4xf64> {
  %a = kiln.constant dense<1.5> : tensor<4xf64>
  %b = kiln.constant dense<4.0> : tensor<4xf64>
  %0 = kiln.sub %a, %b : tensor<4xf64>
  return %0 : tensor<4xf64>
}

// -----

// sub(splat 7, splat 10) => splat -3
// CHECK-LABEL: func.func @sub_splats_int
// CHECK-NEXT: %[[C:.*]] = kiln.constant dense<-3> : tensor<3xi32>
// CHECK-NEXT: return %[[C]] : tensor<3xi32>
func.func @sub_splats_int() -> tensor<3xi32> {
  %a = kiln.constant dense<7> : tensor<3xi32>
  %b = kiln.constant dense<10> : tensor<3xi32>
  %0 = kiln.sub %a, %b : tensor<3xi32>
  return %0 : tensor<3xi32>
}

// -----

// mul(splat 1.5, splat -2.0) => splat -3.0
// CHECK-LABEL: func.func @mul_splats_float
// CHECK-NEXT: %[[C:.*]] = kiln.constant dense<-3.000000e+00> : tensor<2x2xbf16>
// CHECK-NEXT: return %[[C]] : tensor<2x2xbf16>
func.func @mul_splats_float() -> tensor<2x2xbf16> {
  %a = kiln.constant dense<1.5> : tensor<2x2xbf16>
  %b = kiln.constant dense<-2.0> : tensor<2x2xbf16>
  %0 = kiln.mul %a, %b : tensor<2x2xbf16>
  return %0 : tensor<2x2xbf16>
}

// -----

// mul(splat 6, splat 7) => splat 42
// CHECK-LABEL: func.func @mul_splats_int
// CHECK-NEXT: %[[C:.*]] = kiln.constant dense<42> : tensor<8xi32>
// CHECK-NEXT: return %[[C]] : tensor<8xi32>
func.func @mul_splats_int() -> tensor<8xi32> {
  %a = kiln.constant dense<6> : tensor<8xi32>
  %b = kiln.constant dense<7> : tensor<8xi32>
  %0 = kiln.mul %a, %b : tensor<8xi32>
  return %0 : tensor<8xi32>
}

// -----

// div(splat 1.0, splat 4.0) => splat 0.25
// CHECK-LABEL: func.func @div_splats_float
// CHECK-NEXT: %[[C:.*]] = kiln.constant dense<2.500000e-01> : tensor<4xf16>
// CHECK-NEXT: return %[[C]] : tensor<4xf16>
func.func @div_splats_float() -> tensor<4xf16> {
  %a = kiln.constant dense<1.0> : tensor<4xf16>
  %b = kiln.constant dense<4.0> : tensor<4xf16>
  %0 = kiln.div %a, %b : tensor<4xf16>
  return %0 : tensor<4xf16>
}

// -----

// div(splat -7, splat 2) => splat -3 (signed, rounds toward zero)
// CHECK-LABEL: func.func @div_splats_int
// CHECK-NEXT: %[[C:.*]] = kiln.constant dense<-3> : tensor<3xi64>
// CHECK-NEXT: return %[[C]] : tensor<3xi64>
func.func @div_splats_int() -> tensor<3xi64> {
  %a = kiln.constant dense<-7> : tensor<3xi64>
  %b = kiln.constant dense<2> : tensor<3xi64>
  %0 = kiln.div %a, %b : tensor<3xi64>
  return %0 : tensor<3xi64>
}

// -----

// add(add(splat 1, splat 2), splat 3) => splat 6 (folds chain)
// CHECK-LABEL: func.func @fold_chain
// CHECK-NEXT: %[[C:.*]] = kiln.constant dense<6.000000e+00> : tensor<2xf32>
// CHECK-NEXT: return %[[C]] : tensor<2xf32>
func.func @fold_chain() -> tensor<2xf32> {
  %a = kiln.constant dense<1.0> : tensor<2xf32>
  %b = kiln.constant dense<2.0> : tensor<2xf32>
  %c = kiln.constant dense<3.0> : tensor<2xf32>
  %0 = kiln.add %a, %b : tensor<2xf32>
  %1 = kiln.add %0, %c : tensor<2xf32>
  return %1 : tensor<2xf32>
}

//===----------------------------------------------------------------------===//
// broadcast_in_dim
//===----------------------------------------------------------------------===//

// -----

// broadcast(splat) => splat
// CHECK-LABEL: func.func @broadcast_splat
// CHECK-NEXT: %[[C:.*]] = kiln.constant dense<5.000000e-01> : tensor<4x8xf32>
// CHECK-NEXT: return %[[C]] : tensor<4x8xf32>
func.func @broadcast_splat() -> tensor<4x8xf32> {
  %c = kiln.constant dense<0.5> : tensor<8xf32>
  %0 = kiln.broadcast_in_dim %c, dims = [1] : tensor<8xf32> -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

// broadcast(x : T -> T) => x
// CHECK-LABEL: func.func @broadcast_identity
// CHECK-NEXT: return %arg0 : tensor<4x8xi32>
func.func @broadcast_identity(%x: tensor<4x8xi32>) -> tensor<4x8xi32> {
  %0 = kiln.broadcast_in_dim %x, dims = [0, 1] : tensor<4x8xi32> -> tensor<4x8xi32>
  return %0 : tensor<4x8xi32>
}

// -----

// broadcast(broadcast(x, [1]), [1, 2]) => broadcast(x, [2])
// CHECK-LABEL: func.func @broadcast_broadcast
// CHECK-NEXT: %[[B:.*]] = kiln.broadcast_in_dim %arg0, dims = [2] : tensor<8xf32> -> tensor<2x4x8xf32>
// CHECK-NEXT: return %[[B]] : tensor<2x4x8xf32>
func.func @broadcast_broadcast(%x: tensor<8xf32>) -> tensor<2x4x8xf32> {
  %0 = kiln.broadcast_in_dim %x, dims = [1] : tensor<8xf32> -> tensor<4x8xf32>
  %1 = kiln.broadcast_in_dim %0, dims = [1, 2] : tensor<4x8xf32> -> tensor<2x4x8xf32>
  return %1 : tensor<2x4x8xf32>
}

// -----

// broadcast(broadcast(x, [0, 2]), [0, 1, 3]) => broadcast(x, [0, 3])
// CHECK-LABEL: func.func @broadcast_broadcast_size_one
// CHECK-NEXT: %[[B:.*]] = kiln.broadcast_in_dim %arg0, dims = [0, 3] : tensor<3x1xf32> -> tensor<3x5x4x6xf32>
// CHECK-NEXT: return %[[B]] : tensor<3x5x4x6xf32>
func.func @broadcast_broadcast_size_one(%x: tensor<3x1xf32>) -> tensor<3x5x4x6xf32> {
  %0 = kiln.broadcast_in_dim %x, dims = [0, 2] : tensor<3x1xf32> -> tensor<3x4x6xf32>
  %1 = kiln.broadcast_in_dim %0, dims = [0, 2, 3] : tensor<3x4x6xf32> -> tensor<3x5x4x6xf32>
  return %1 : tensor<3x5x4x6xf32>
}

//===----------------------------------------------------------------------===//
// reshape
//===----------------------------------------------------------------------===//

// -----

// reshape(x : T -> T) => x
// CHECK-LABEL: func.func @reshape_identity
// CHECK-NEXT: return %arg0 : tensor<4x8xf32>
func.func @reshape_identity(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %0 = kiln.reshape %x : tensor<4x8xf32> -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

// reshape(reshape(x)) => reshape(x)
// CHECK-LABEL: func.func @reshape_reshape
// CHECK-NEXT: %[[R:.*]] = kiln.reshape %arg0 : tensor<4x8xf32> -> tensor<2x2x8xf32>
// CHECK-NEXT: return %[[R]] : tensor<2x2x8xf32>
func.func @reshape_reshape(%x: tensor<4x8xf32>) -> tensor<2x2x8xf32> {
  %0 = kiln.reshape %x : tensor<4x8xf32> -> tensor<32xf32>
  %1 = kiln.reshape %0 : tensor<32xf32> -> tensor<2x2x8xf32>
  return %1 : tensor<2x2x8xf32>
}

// -----

// reshape(reshape(x : T -> U) : U -> T) => x
// CHECK-LABEL: func.func @reshape_reshape_identity
// CHECK-NEXT: return %arg0 : tensor<4x8xi64>
func.func @reshape_reshape_identity(%x: tensor<4x8xi64>) -> tensor<4x8xi64> {
  %0 = kiln.reshape %x : tensor<4x8xi64> -> tensor<32xi64>
  %1 = kiln.reshape %0 : tensor<32xi64> -> tensor<4x8xi64>
  return %1 : tensor<4x8xi64>
}

// -----

// reshape(splat) => splat
// CHECK-LABEL: func.func @reshape_splat
// CHECK-NEXT: %[[C:.*]] = kiln.constant dense<3> : tensor<2x16xi32>
// CHECK-NEXT: return %[[C]] : tensor<2x16xi32>
func.func @reshape_splat() -> tensor<2x16xi32> {
  %c = kiln.constant dense<3> : tensor<4x8xi32>
  %0 = kiln.reshape %c : tensor<4x8xi32> -> tensor<2x16xi32>
  return %0 : tensor<2x16xi32>
}

//===----------------------------------------------------------------------===//
// transpose
//===----------------------------------------------------------------------===//

// -----

// transpose(x, identity) => x
// CHECK-LABEL: func.func @transpose_identity
// CHECK-NEXT: return %arg0 : tensor<2x3x4xf32>
func.func @transpose_identity(%x: tensor<2x3x4xf32>) -> tensor<2x3x4xf32> {
  %0 = kiln.transpose %x perm = [0, 1, 2] : tensor<2x3x4xf32> -> tensor<2x3x4xf32>
  return %0 : tensor<2x3x4xf32>
}

// -----

// transpose(transpose(x, [1, 2, 0]), [1, 0, 2]) => transpose(x, [2, 1, 0])
// CHECK-LABEL: func.func @transpose_transpose
// CHECK-NEXT: %[[T:.*]] = kiln.transpose %arg0 perm = [2, 1, 0] : tensor<2x3x4xf32> -> tensor<4x3x2xf32>
// CHECK-NEXT: return %[[T]] : tensor<4x3x2xf32>
func.func @transpose_transpose(%x: tensor<2x3x4xf32>) -> tensor<4x3x2xf32> {
  %0 = kiln.transpose %x perm = [1, 2, 0] : tensor<2x3x4xf32> -> tensor<3x4x2xf32>
  %1 = kiln.transpose %0 perm = [1, 0, 2] : tensor<3x4x2xf32> -> tensor<4x3x2xf32>
  return %1 : tensor<4x3x2xf32>
}

// -----

// transpose(transpose(x, [1, 2, 0]), [2, 0, 1]) => x
// CHECK-LABEL: func.func @transpose_transpose_identity
// CHECK-NEXT: return %arg0 : tensor<2x3x4xbf16>
func.func @transpose_transpose_identity(%x: tensor<2x3x4xbf16>) -> tensor<2x3x4xbf16> {
  %0 = kiln.transpose %x perm = [1, 2, 0] : tensor<2x3x4xbf16> -> tensor<3x4x2xbf16>
  %1 = kiln.transpose %0 perm = [2, 0, 1] : tensor<3x4x2xbf16> -> tensor<2x3x4xbf16>
  return %1 : tensor<2x3x4xbf16>
}

// -----

// transpose(splat) => splat
// CHECK-LABEL: func.func @transpose_splat
// CHECK-NEXT: %[[C:.*]] = kiln.constant dense<2.000000e+00> : tensor<3x2xf32>
// CHECK-NEXT: return %[[C]] : tensor<3x2xf32>
func.func @transpose_splat() -> tensor<3x2xf32> {
  %c = kiln.constant dense<2.0> : tensor<2x3xf32>
  %0 = kiln.transpose %c perm = [1, 0] : tensor<2x3xf32> -> tensor<3x2xf32>
  return %0 : tensor<3x2xf32>
}

//===----------------------------------------------------------------------===//
// slice / concat / dropout
//===----------------------------------------------------------------------===//

// -----

// slice(x) taking everything => x
// CHECK-LABEL: func.func @slice_everything
// CHECK-NEXT: return %arg0 : tensor<4x8xf32>
func.func @slice_everything(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %0 = kiln.slice %x start = [0, 0] limit = [4, 8] stride = [1, 1] : tensor<4x8xf32> -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

// slice(splat) => splat
// CHECK-LABEL: func.func @slice_splat
// CHECK-NEXT: %[[C:.*]] = kiln.constant dense<-1> : tensor<2xi32>
// CHECK-NEXT: return %[[C]] : tensor<2xi32>
func.func @slice_splat() -> tensor<2xi32> {
  %c = kiln.constant dense<-1> : tensor<8xi32>
  %0 = kiln.slice %c start = [1] limit = [5] stride = [2] : tensor<8xi32> -> tensor<2xi32>
  return %0 : tensor<2xi32>
}

// -----

// concat(x) => x
// CHECK-LABEL: func.func @concat_one_input
// CHECK-NEXT: return %arg0 : tensor<4x3xf32>
func.func @concat_one_input(%x: tensor<4x3xf32>) -> tensor<4x3xf32> {
  %0 = kiln.concat %x dim = 1 : tensor<4x3xf32> -> tensor<4x3xf32>
  return %0 : tensor<4x3xf32>
}

// -----

// dropout(x, rate = 0) => x
// CHECK-LABEL: func.func @dropout_rate_zero
// CHECK-NEXT: return %arg0 : tensor<12x64xf32>
func.func @dropout_rate_zero(%x: tensor<12x64xf32>, %seed: tensor<i64>) -> tensor<12x64xf32> {
  %0 = kiln.dropout %x, %seed rate = 0.0 salt = 3 : tensor<12x64xf32>, tensor<i64>
  return %0 : tensor<12x64xf32>
}

//===----------------------------------------------------------------------===//
// Nothing folds
//===----------------------------------------------------------------------===//

// -----

// add(x, 1) stays
// CHECK-LABEL: func.func @no_fold_add_one
// CHECK-NEXT: %[[C:.*]] = kiln.constant dense<1.000000e+00> : tensor<4xf32>
// CHECK-NEXT: %[[R:.*]] = kiln.add %arg0, %[[C]] : tensor<4xf32>
// CHECK-NEXT: return %[[R]] : tensor<4xf32>
func.func @no_fold_add_one(%x: tensor<4xf32>) -> tensor<4xf32> {
  %one = kiln.constant dense<1.0> : tensor<4xf32>
  %0 = kiln.add %x, %one : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// add(x, non-splat constant with a zero) stays
// CHECK-LABEL: func.func @no_fold_add_dense
// CHECK-NEXT: %[[C:.*]] = kiln.constant dense<[0, 1]> : tensor<2xi32>
// CHECK-NEXT: kiln.add %arg0, %[[C]] : tensor<2xi32>
func.func @no_fold_add_dense(%x: tensor<2xi32>) -> tensor<2xi32> {
  %c = kiln.constant dense<[0, 1]> : tensor<2xi32>
  %0 = kiln.add %x, %c : tensor<2xi32>
  return %0 : tensor<2xi32>
}

// -----

// sub(0, x) stays (it is -x, not x)
// CHECK-LABEL: func.func @no_fold_zero_minus_x
// CHECK-NEXT: %[[Z:.*]] = kiln.constant dense<0.000000e+00> : tensor<4xf32>
// CHECK-NEXT: kiln.sub %[[Z]], %arg0 : tensor<4xf32>
func.func @no_fold_zero_minus_x(%x: tensor<4xf32>) -> tensor<4xf32> {
  %zero = kiln.constant dense<0.0> : tensor<4xf32>
  %0 = kiln.sub %zero, %x : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// mul(x, 2) stays
// CHECK-LABEL: func.func @no_fold_mul_two
// CHECK-NEXT: %[[C:.*]] = kiln.constant dense<2> : tensor<4xi32>
// CHECK-NEXT: %[[R:.*]] = kiln.mul %arg0, %[[C]] : tensor<4xi32>
// CHECK-NEXT: return %[[R]] : tensor<4xi32>
func.func @no_fold_mul_two(%x: tensor<4xi32>) -> tensor<4xi32> {
  %two = kiln.constant dense<2> : tensor<4xi32>
  %0 = kiln.mul %x, %two : tensor<4xi32>
  return %0 : tensor<4xi32>
}

// -----

// div(1, x) stays
// CHECK-LABEL: func.func @no_fold_one_over_x
// CHECK-NEXT: %[[C:.*]] = kiln.constant dense<1.000000e+00> : tensor<4xf32>
// CHECK-NEXT: kiln.div %[[C]], %arg0 : tensor<4xf32>
func.func @no_fold_one_over_x(%x: tensor<4xf32>) -> tensor<4xf32> {
  %one = kiln.constant dense<1.0> : tensor<4xf32>
  %0 = kiln.div %one, %x : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// pow(x, 2) stays
// CHECK-LABEL: func.func @no_fold_pow_two
// CHECK-NEXT: %[[C:.*]] = kiln.constant dense<2.000000e+00> : tensor<4xf32>
// CHECK-NEXT: kiln.pow %arg0, %[[C]] : tensor<4xf32>
func.func @no_fold_pow_two(%x: tensor<4xf32>) -> tensor<4xf32> {
  %two = kiln.constant dense<2.0> : tensor<4xf32>
  %0 = kiln.pow %x, %two : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// div(splat 7, splat 0) stays: integer division by zero must not fold
// CHECK-LABEL: func.func @no_fold_int_div_by_zero
// CHECK-DAG: %[[A:.*]] = kiln.constant dense<7> : tensor<4xi32>
// CHECK-DAG: %[[Z:.*]] = kiln.constant dense<0> : tensor<4xi32>
// CHECK: %[[R:.*]] = kiln.div %[[A]], %[[Z]] : tensor<4xi32>
// CHECK-NEXT: return %[[R]] : tensor<4xi32>
func.func @no_fold_int_div_by_zero() -> tensor<4xi32> {
  %a = kiln.constant dense<7> : tensor<4xi32>
  %zero = kiln.constant dense<0> : tensor<4xi32>
  %0 = kiln.div %a, %zero : tensor<4xi32>
  return %0 : tensor<4xi32>
}

// -----

// div(splat INT_MIN, splat -1) stays: the quotient overflows
// CHECK-LABEL: func.func @no_fold_int_div_overflow
// CHECK-DAG: %[[A:.*]] = kiln.constant dense<-2147483648> : tensor<4xi32>
// CHECK-DAG: %[[B:.*]] = kiln.constant dense<-1> : tensor<4xi32>
// CHECK: kiln.div %[[A]], %[[B]] : tensor<4xi32>
func.func @no_fold_int_div_overflow() -> tensor<4xi32> {
  %a = kiln.constant dense<-2147483648> : tensor<4xi32>
  %b = kiln.constant dense<-1> : tensor<4xi32>
  %0 = kiln.div %a, %b : tensor<4xi32>
  return %0 : tensor<4xi32>
}

// -----

// neg(x) stays
// CHECK-LABEL: func.func @no_fold_single_neg
// CHECK-NEXT: %[[N:.*]] = kiln.neg %arg0 : tensor<4xf32>
// CHECK-NEXT: return %[[N]] : tensor<4xf32>
func.func @no_fold_single_neg(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = kiln.neg %x : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// cast(x : T -> U) stays
// CHECK-LABEL: func.func @no_fold_real_cast
// CHECK: kiln.cast %arg0 : tensor<4xf32> -> tensor<4xbf16>
func.func @no_fold_real_cast(%x: tensor<4xf32>) -> tensor<4xbf16> {
  %0 = kiln.cast %x : tensor<4xf32> -> tensor<4xbf16>
  return %0 : tensor<4xbf16>
}

// -----

// broadcast(x) to a larger shape stays
// CHECK-LABEL: func.func @no_fold_broadcast
// CHECK: kiln.broadcast_in_dim %arg0, dims = [1] : tensor<8xf32> -> tensor<4x8xf32>
func.func @no_fold_broadcast(%x: tensor<8xf32>) -> tensor<4x8xf32> {
  %0 = kiln.broadcast_in_dim %x, dims = [1] : tensor<8xf32> -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

// transpose(x, non-identity) stays
// CHECK-LABEL: func.func @no_fold_transpose
// CHECK: kiln.transpose %arg0 perm = [1, 0] : tensor<2x3xf32> -> tensor<3x2xf32>
func.func @no_fold_transpose(%x: tensor<2x3xf32>) -> tensor<3x2xf32> {
  %0 = kiln.transpose %x perm = [1, 0] : tensor<2x3xf32> -> tensor<3x2xf32>
  return %0 : tensor<3x2xf32>
}

// -----

// slice(x) taking part stays
// CHECK-LABEL: func.func @no_fold_partial_slice
// CHECK: kiln.slice %arg0 start = [0, 1] limit = [4, 8] stride = [1, 1] : tensor<4x8xf32> -> tensor<4x7xf32>
func.func @no_fold_partial_slice(%x: tensor<4x8xf32>) -> tensor<4x7xf32> {
  %0 = kiln.slice %x start = [0, 1] limit = [4, 8] stride = [1, 1] : tensor<4x8xf32> -> tensor<4x7xf32>
  return %0 : tensor<4x7xf32>
}

// -----

// concat(x, y) stays
// CHECK-LABEL: func.func @no_fold_concat_two
// CHECK: kiln.concat %arg0, %arg1 dim = 0 : tensor<1x3xf32>, tensor<2x3xf32> -> tensor<3x3xf32>
func.func @no_fold_concat_two(%x: tensor<1x3xf32>, %y: tensor<2x3xf32>) -> tensor<3x3xf32> {
  %0 = kiln.concat %x, %y dim = 0 : tensor<1x3xf32>, tensor<2x3xf32> -> tensor<3x3xf32>
  return %0 : tensor<3x3xf32>
}

// -----

// dropout(x, rate = 0.1) stays
// CHECK-LABEL: func.func @no_fold_dropout
// CHECK: kiln.dropout %arg0, %arg1 rate = 1.000000e-01 salt = 3 : tensor<12x64xf32>, tensor<i64>
func.func @no_fold_dropout(%x: tensor<12x64xf32>, %seed: tensor<i64>) -> tensor<12x64xf32> {
  %0 = kiln.dropout %x, %seed rate = 0.1 salt = 3 : tensor<12x64xf32>, tensor<i64>
  return %0 : tensor<12x64xf32>
}

// -----

// The gradient of a split: add(pad(x), pad(y)) with the operands side by
// side along one axis => pad(concat(x, y)); a chain of three => one concat,
// no padding left.
// CHECK-LABEL: func.func @adjacent_pads_concat
// CHECK-NEXT: %0 = kiln.concat %arg2, %arg1, %arg0 dim = 1 : tensor<4x2xf32>, tensor<4x3xf32>, tensor<4x1xf32> -> tensor<4x6xf32>
// CHECK-NEXT: return %0
func.func @adjacent_pads_concat(%a: tensor<4x1xf32>, %b: tensor<4x3xf32>, %c: tensor<4x2xf32>) -> tensor<4x6xf32> {
  %pa = kiln.pad %a low = [0, 5] high = [0, 0] interior = [0, 0] value = 0.0 : tensor<4x1xf32> -> tensor<4x6xf32>
  %pb = kiln.pad %b low = [0, 2] high = [0, 1] interior = [0, 0] value = 0.0 : tensor<4x3xf32> -> tensor<4x6xf32>
  %pc = kiln.pad %c low = [0, 0] high = [0, 4] interior = [0, 0] value = 0.0 : tensor<4x2xf32> -> tensor<4x6xf32>
  %0 = kiln.add %pa, %pb : tensor<4x6xf32>
  %1 = kiln.add %0, %pc : tensor<4x6xf32>
  return %1 : tensor<4x6xf32>
}

// -----

// Two of three parts: the concat keeps the padding of the part missing.
// CHECK-LABEL: func.func @adjacent_pads_partial
// CHECK-NEXT: %0 = kiln.concat %arg1, %arg0 dim = 0 : tensor<1x3xf32>, tensor<2x3xf32> -> tensor<3x3xf32>
// CHECK-NEXT: %1 = kiln.pad %0 low = [1, 0] high = [0, 0] interior = [0, 0] value = 0.000000e+00 : tensor<3x3xf32> -> tensor<4x3xf32>
func.func @adjacent_pads_partial(%a: tensor<2x3xf32>, %b: tensor<1x3xf32>) -> tensor<4x3xf32> {
  %pa = kiln.pad %a low = [2, 0] high = [0, 0] interior = [0, 0] value = 0.0 : tensor<2x3xf32> -> tensor<4x3xf32>
  %pb = kiln.pad %b low = [1, 0] high = [2, 0] interior = [0, 0] value = 0.0 : tensor<1x3xf32> -> tensor<4x3xf32>
  %0 = kiln.add %pa, %pb : tensor<4x3xf32>
  return %0 : tensor<4x3xf32>
}

// -----

// Pads that leave a gap, overlap, fill with another value, or differ on two
// axes stay a sum.
// CHECK-LABEL: func.func @no_concat_gap
// CHECK: kiln.add
// CHECK-LABEL: func.func @no_concat_value
// CHECK: kiln.add
// CHECK-LABEL: func.func @no_concat_two_axes
// CHECK: kiln.add
func.func @no_concat_gap(%a: tensor<4x1xf32>, %b: tensor<4x1xf32>) -> tensor<4x3xf32> {
  %pa = kiln.pad %a low = [0, 0] high = [0, 2] interior = [0, 0] value = 0.0 : tensor<4x1xf32> -> tensor<4x3xf32>
  %pb = kiln.pad %b low = [0, 2] high = [0, 0] interior = [0, 0] value = 0.0 : tensor<4x1xf32> -> tensor<4x3xf32>
  %0 = kiln.add %pa, %pb : tensor<4x3xf32>
  return %0 : tensor<4x3xf32>
}
func.func @no_concat_value(%a: tensor<4x1xf32>, %b: tensor<4x2xf32>) -> tensor<4x3xf32> {
  %pa = kiln.pad %a low = [0, 0] high = [0, 2] interior = [0, 0] value = 1.0 : tensor<4x1xf32> -> tensor<4x3xf32>
  %pb = kiln.pad %b low = [0, 1] high = [0, 0] interior = [0, 0] value = 0.0 : tensor<4x2xf32> -> tensor<4x3xf32>
  %0 = kiln.add %pa, %pb : tensor<4x3xf32>
  return %0 : tensor<4x3xf32>
}
func.func @no_concat_two_axes(%a: tensor<1x1xf32>, %b: tensor<2x2xf32>) -> tensor<3x3xf32> {
  %pa = kiln.pad %a low = [0, 0] high = [2, 2] interior = [0, 0] value = 0.0 : tensor<1x1xf32> -> tensor<3x3xf32>
  %pb = kiln.pad %b low = [1, 1] high = [0, 0] interior = [0, 0] value = 0.0 : tensor<2x2xf32> -> tensor<3x3xf32>
  %0 = kiln.add %pa, %pb : tensor<3x3xf32>
  return %0 : tensor<3x3xf32>
}

// -----

// pad with no padding => its operand
// CHECK-LABEL: func.func @pad_nothing
// CHECK-NEXT: return %arg0
func.func @pad_nothing(%a: tensor<4x1xf32>) -> tensor<4x1xf32> {
  %0 = kiln.pad %a low = [0, 0] high = [0, 0] interior = [0, 0] value = 0.0 : tensor<4x1xf32> -> tensor<4x1xf32>
  return %0 : tensor<4x1xf32>
}
