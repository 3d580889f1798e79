// RUN: kiln-opt %s --kiln-lower-to-linalg --split-input-file --verify-diagnostics | FileCheck %s

// Elementwise ops: one linalg.generic, identity maps, arith/math body.
// CHECK-LABEL: func.func @elementwise
// CHECK: tensor.empty() : tensor<4x8xf32>
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "parallel"]
// CHECK:   arith.addf
// CHECK: linalg.generic
// CHECK:   math.exp
// CHECK-NOT: kiln.
func.func @elementwise(%a: tensor<4x8xf32>, %b: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %0 = kiln.add %a, %b : tensor<4x8xf32>
  %1 = kiln.exp %0 : tensor<4x8xf32>
  return %1 : tensor<4x8xf32>
}

// -----

// Integer ops use integer arithmetic.
// CHECK-LABEL: func.func @integers
// CHECK: arith.muli
// CHECK: arith.cmpi slt
func.func @integers(%a: tensor<4xi32>, %b: tensor<4xi32>) -> tensor<4xi1> {
  %0 = kiln.mul %a, %b : tensor<4xi32>
  %1 = kiln.compare lt, %0, %b : tensor<4xi32>
  return %1 : tensor<4xi1>
}

// -----

// broadcast_in_dim: the input map names the result dims it fills; a size-1
// dim that broadcasts is pinned to 0.
// CHECK-DAG: #[[$IN:.*]] = affine_map<(d0, d1, d2) -> (0, d2)>
// CHECK-LABEL: func.func @broadcast
// CHECK: linalg.generic {indexing_maps = [#[[$IN]], {{.*}}]
func.func @broadcast(%a: tensor<1x8xf32>) -> tensor<2x4x8xf32> {
  %0 = kiln.broadcast_in_dim %a, dims = [1, 2] : tensor<1x8xf32> -> tensor<2x4x8xf32>
  return %0 : tensor<2x4x8xf32>
}

// -----

// Reductions: fill, reduction iterators, keepdims by expand_shape.
// CHECK-LABEL: func.func @reduce
// CHECK: linalg.fill
// CHECK: iterator_types = ["parallel", "reduction"]
// CHECK: arith.maximumf
// CHECK: tensor.expand_shape {{.*}} {{\[\[}}0, 1]]
func.func @reduce(%a: tensor<4x8xf32>) -> tensor<4x1xf32> {
  %0 = kiln.reduce_max %a axes = [1] keepdims : tensor<4x8xf32> -> tensor<4x1xf32>
  return %0 : tensor<4x1xf32>
}

// -----

// matmul: one generic over (batch, m, n, k); transpose_rhs swaps the rhs
// map, a shared weight has no batch dim.
// CHECK-DAG: #[[$L:.*]] = affine_map<(d0, d1, d2, d3) -> (d0, d1, d3)>
// CHECK-DAG: #[[$R:.*]] = affine_map<(d0, d1, d2, d3) -> (d2, d3)>
// CHECK-DAG: #[[$O:.*]] = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>
// CHECK-LABEL: func.func @matmul
// CHECK: linalg.generic {indexing_maps = [#[[$L]], #[[$R]], #[[$O]]], iterator_types = ["parallel", "parallel", "parallel", "reduction"]}
// CHECK:   arith.mulf
// CHECK:   arith.addf
func.func @matmul(%x: tensor<2x3x4xf32>, %w: tensor<5x4xf32>) -> tensor<2x3x5xf32> {
  %0 = kiln.matmul %x, %w transpose_rhs : tensor<2x3x4xf32>, tensor<5x4xf32> -> tensor<2x3x5xf32>
  return %0 : tensor<2x3x5xf32>
}

// -----

// CHECK-LABEL: func.func @shapes
// CHECK: linalg.transpose {{.*}} permutation = [1, 0]
// CHECK: tensor.collapse_shape
// CHECK: tensor.expand_shape
func.func @shapes(%a: tensor<4x6xf32>) -> (tensor<6x4xf32>, tensor<2x12xf32>) {
  %0 = kiln.transpose %a perm = [1, 0] : tensor<4x6xf32> -> tensor<6x4xf32>
  %1 = kiln.reshape %a : tensor<4x6xf32> -> tensor<2x12xf32>
  return %0, %1 : tensor<6x4xf32>, tensor<2x12xf32>
}

// -----

// scatter_add is a loop over index positions (data-dependent rows).
// CHECK-LABEL: func.func @scatter
// CHECK: scf.for
// CHECK:   tensor.extract_slice
// CHECK:   tensor.insert_slice
func.func @scatter(%u: tensor<6x8xf32>, %i: tensor<6xi32>) -> tensor<4x8xf32> {
  %0 = kiln.scatter_add %u[%i] axis = 0 : tensor<6x8xf32>, tensor<6xi32> -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

// Composites are decomposed into primitives and lowered in the same run.
// CHECK-LABEL: func.func @softmax
// CHECK: arith.maximumf
// CHECK: math.exp
// CHECK: arith.divf
// CHECK-NOT: kiln.
func.func @softmax(%a: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %0 = kiln.softmax %a axis = 1 : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

// CHECK-LABEL: func.func @data_movement
// CHECK: tensor.extract_slice {{.*}}[0, 1] [4, 3] [1, 2]
// CHECK: tensor.insert_slice
// CHECK: tensor.extract %
func.func @data_movement(%a: tensor<4x8xf32>, %i: tensor<3xi32>) -> (tensor<4x3xf32>, tensor<4x9xf32>, tensor<3x8xf32>) {
  %0 = kiln.slice %a start = [0, 1] limit = [4, 7] stride = [1, 2] : tensor<4x8xf32> -> tensor<4x3xf32>
  %1 = kiln.pad %a low = [0, 1] high = [0, 0] interior = [0, 0] value = 0.0 : tensor<4x8xf32> -> tensor<4x9xf32>
  %2 = kiln.gather %a[%i] axis = 0 : tensor<4x8xf32>, tensor<3xi32> -> tensor<3x8xf32>
  return %0, %1, %2 : tensor<4x3xf32>, tensor<4x9xf32>, tensor<3x8xf32>
}
