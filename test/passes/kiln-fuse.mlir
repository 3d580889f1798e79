// kiln-fuse: each kernel form, and fusion through broadcasts, data movement,
// reductions with prologues and epilogues, sibling reductions, GEMM
// epilogues, duplicated cheap producers and optimizer updates.
// RUN: kiln-opt %s --kiln-fuse --split-input-file | FileCheck %s
// RUN: kiln-opt %s --kiln-fuse=disable --split-input-file | FileCheck %s --check-prefix=OFF

// CHECK-LABEL: func.func @bias_relu
// CHECK: %[[F:.*]] = kiln.fusion "elementwise" rows = 2 ins(%arg0, %arg1)
// CHECK-NEXT: ^bb0
// CHECK-NEXT: kiln.broadcast_in_dim
// CHECK-NEXT: kiln.add
// CHECK-NEXT: kiln.relu
// CHECK-NEXT: kiln.yield
// CHECK: return %[[F]]
// Loop fusion through a broadcast of an argument: one elementwise kernel.
func.func @bias_relu(%x: tensor<8x16xf32>, %b: tensor<16xf32>) -> tensor<8x16xf32> {
  %0 = kiln.broadcast_in_dim %b, dims = [1] : tensor<16xf32> -> tensor<8x16xf32>
  %1 = kiln.add %x, %0 : tensor<8x16xf32>
  %2 = kiln.relu %1 : tensor<8x16xf32>
  return %2 : tensor<8x16xf32>
}

// -----

// CHECK-LABEL: func.func @movement
// CHECK: %[[F:.*]] = kiln.fusion "elementwise" rows = 1 ins(%arg0)
// CHECK: kiln.slice
// CHECK-NEXT: kiln.transpose
// CHECK-NEXT: kiln.exp
// CHECK-NEXT: kiln.pad
// CHECK-NEXT: kiln.reshape
// CHECK-NEXT: kiln.neg
// CHECK-NEXT: kiln.yield
// The last reshape only renames the result: it stays outside (an alias).
// CHECK: kiln.reshape %[[F]]
// Through reshapes, transposes, slices and pads (index maps).
func.func @movement(%x: tensor<4x8x6xf32>) -> tensor<4x6x16xf32> {
  %0 = kiln.slice %x start = [0, 0, 0] limit = [4, 8, 4] stride = [1, 1, 1] : tensor<4x8x6xf32> -> tensor<4x8x4xf32>
  %1 = kiln.transpose %0 perm = [0, 2, 1] : tensor<4x8x4xf32> -> tensor<4x4x8xf32>
  %2 = kiln.exp %1 : tensor<4x4x8xf32>
  %3 = kiln.pad %2 low = [0, 2, 0] high = [0, 0, 8] interior = [0, 0, 0] value = 0.000000e+00 : tensor<4x4x8xf32> -> tensor<4x6x16xf32>
  %4 = kiln.reshape %3 : tensor<4x6x16xf32> -> tensor<4x96xf32>
  %5 = kiln.neg %4 : tensor<4x96xf32>
  %6 = kiln.reshape %5 : tensor<4x96xf32> -> tensor<4x6x16xf32>
  return %6 : tensor<4x6x16xf32>
}

// -----

// CHECK-LABEL: func.func @softmax_rows
// CHECK: kiln.fusion "row_reduction" rows = 1 ins(%arg0, %arg1)
// CHECK: kiln.constant
// CHECK-NEXT: kiln.mul
// CHECK-NEXT: kiln.softmax
// CHECK-NEXT: kiln.mul
// CHECK-NEXT: kiln.yield
// CHECK-NOT: kiln.fusion
// A row reduction with prologue and epilogue: softmax of a scaled input, then a product.
func.func @softmax_rows(%x: tensor<8x32xf32>, %y: tensor<8x32xf32>) -> tensor<8x32xf32> {
  %c = kiln.constant dense<0.5> : tensor<8x32xf32>
  %0 = kiln.mul %x, %c : tensor<8x32xf32>
  %1 = kiln.softmax %0 axis = 1 : tensor<8x32xf32>
  %2 = kiln.mul %1, %y : tensor<8x32xf32>
  return %2 : tensor<8x32xf32>
}

// -----

// CHECK-LABEL: func.func @mean_var
// CHECK: kiln.fusion "row_reduction" rows = 1 ins(%arg0)
// CHECK-COUNT-2: kiln.reduce_mean
// CHECK: kiln.rsqrt
// CHECK: kiln.yield
// CHECK-NOT: kiln.fusion
// Mean and variance of rows, normalised: several reductions over the same rows in one kernel.
func.func @mean_var(%x: tensor<8x32xf32>) -> tensor<8x32xf32> {
  %0 = kiln.reduce_mean %x axes = [1] keepdims : tensor<8x32xf32> -> tensor<8x1xf32>
  %1 = kiln.broadcast_in_dim %0, dims = [0, 1] : tensor<8x1xf32> -> tensor<8x32xf32>
  %2 = kiln.sub %x, %1 : tensor<8x32xf32>
  %3 = kiln.mul %2, %2 : tensor<8x32xf32>
  %4 = kiln.reduce_mean %3 axes = [1] keepdims : tensor<8x32xf32> -> tensor<8x1xf32>
  %5 = kiln.rsqrt %4 : tensor<8x1xf32>
  %6 = kiln.broadcast_in_dim %5, dims = [0, 1] : tensor<8x1xf32> -> tensor<8x32xf32>
  %7 = kiln.mul %2, %6 : tensor<8x32xf32>
  return %7 : tensor<8x32xf32>
}

// -----

// CHECK-LABEL: func.func @siblings
// CHECK: %[[F:.*]]:2 = kiln.fusion "column_reduction" rows = 0 ins(%arg0, %arg1)
// CHECK-COUNT-2: kiln.reduce_sum
// CHECK: kiln.yield
// CHECK: return %[[F]]#0, %[[F]]#1
// Column reductions: a scale and a bias gradient over the same rows share a kernel (siblings).
func.func @siblings(%g: tensor<64x32xf32>, %xh: tensor<64x32xf32>) -> (tensor<32xf32>, tensor<32xf32>) {
  %0 = kiln.mul %g, %xh : tensor<64x32xf32>
  %1 = kiln.reduce_sum %0 axes = [0] : tensor<64x32xf32> -> tensor<32xf32>
  %2 = kiln.reduce_sum %g axes = [0] : tensor<64x32xf32> -> tensor<32xf32>
  return %1, %2 : tensor<32xf32>, tensor<32xf32>
}

// -----

// CHECK-LABEL: func.func @gemm_epilogue
// CHECK: kiln.fusion "gemm_epilogue" rows = 1 ins(%arg0, %arg1, %arg2)
// CHECK: kiln.matmul
// CHECK-NEXT: kiln.add
// CHECK-NEXT: kiln.gelu
// CHECK-NOT: kiln.fusion
// A GEMM with a bias and GELU epilogue.
func.func @gemm_epilogue(%x: tensor<8x16xf32>, %w: tensor<32x16xf32>, %b: tensor<32xf32>) -> tensor<8x32xf32> {
  %0 = kiln.matmul %x, %w transpose_rhs : tensor<8x16xf32>, tensor<32x16xf32> -> tensor<8x32xf32>
  %1 = kiln.broadcast_in_dim %b, dims = [1] : tensor<32xf32> -> tensor<8x32xf32>
  %2 = kiln.add %0, %1 : tensor<8x32xf32>
  %3 = kiln.gelu erf, %2 : tensor<8x32xf32>
  return %3 : tensor<8x32xf32>
}

// -----

// CHECK-LABEL: func.func @duplicate
// CHECK-NOT: kiln.iota
// CHECK: kiln.fusion "row_reduction" rows = 2 ins(%arg0)
// CHECK: kiln.iota dim = 0
// CHECK: kiln.select
// CHECK-NEXT: kiln.softmax
// The masked value feeds a reduction: it fuses with that, not the GEMM.
// CHECK: kiln.fusion "gemm" rows = 2
// CHECK-NEXT: ^bb0
// CHECK-NEXT: kiln.matmul
// CHECK-NEXT: kiln.yield
// CHECK: kiln.fusion "row_reduction" rows = 2
// CHECK: kiln.iota dim = 0
// CHECK: kiln.select
// CHECK-NEXT: kiln.softmax
// A causal mask from iotas is recomputed in each kernel that reads it.
func.func @duplicate(%s: tensor<2x16x16xf32>, %t: tensor<2x16x16xf32>) -> (tensor<2x16x16xf32>, tensor<2x16x16xf32>) {
  %0 = kiln.iota dim = 0 : tensor<16x16xi32>
  %1 = kiln.iota dim = 1 : tensor<16x16xi32>
  %2 = kiln.compare ge, %0, %1 : tensor<16x16xi32>
  %3 = kiln.broadcast_in_dim %2, dims = [1, 2] : tensor<16x16xi1> -> tensor<2x16x16xi1>
  %ninf = kiln.constant dense<0xFF800000> : tensor<2x16x16xf32>
  %4 = kiln.select %3, %s, %ninf : tensor<2x16x16xi1>, tensor<2x16x16xf32>
  %5 = kiln.softmax %4 axis = 2 : tensor<2x16x16xf32>
  %6 = kiln.matmul %5, %t : tensor<2x16x16xf32>, tensor<2x16x16xf32> -> tensor<2x16x16xf32>
  %7 = kiln.select %3, %6, %ninf : tensor<2x16x16xi1>, tensor<2x16x16xf32>
  %8 = kiln.softmax %7 axis = 2 : tensor<2x16x16xf32>
  return %5, %8 : tensor<2x16x16xf32>, tensor<2x16x16xf32>
}

// -----

// An expensive producer is never recomputed: exp of a [16] vector read by a
// row kernel and a column kernel is computed once, in a kernel of its own.
// On a scalar (a cosine schedule's learning rate) a transcendental function
// is cheap and recomputed in each reader.
// CHECK-LABEL: func.func @no_duplicate_expensive
// CHECK: kiln.fusion "elementwise" rows = 1 ins(%arg1)
// CHECK-NEXT: ^bb0
// CHECK-NEXT: kiln.exp
// CHECK-NOT: kiln.exp
// CHECK: return
func.func @no_duplicate_expensive(%s: tensor<8x16xf32>, %w: tensor<16xf32>) -> (tensor<8x16xf32>, tensor<16xf32>) {
  %0 = kiln.exp %w : tensor<16xf32>
  %1 = kiln.broadcast_in_dim %0, dims = [1] : tensor<16xf32> -> tensor<8x16xf32>
  %2 = kiln.mul %s, %1 : tensor<8x16xf32>
  %3 = kiln.softmax %2 axis = 1 : tensor<8x16xf32>
  %4 = kiln.add %s, %1 : tensor<8x16xf32>
  %5 = kiln.reduce_sum %4 axes = [0] : tensor<8x16xf32> -> tensor<16xf32>
  return %3, %5 : tensor<8x16xf32>, tensor<16xf32>
}

// -----

// CHECK-LABEL: func.func @duplicate_scalar_cos
// CHECK: kiln.fusion "row_reduction"
// CHECK: kiln.cos
// CHECK: kiln.fusion "column_reduction"
// CHECK: kiln.cos
func.func @duplicate_scalar_cos(%s: tensor<8x16xf32>, %t: tensor<f32>) -> (tensor<8x16xf32>, tensor<16xf32>) {
  %0 = kiln.cos %t : tensor<f32>
  %1 = kiln.broadcast_in_dim %0, dims = [] : tensor<f32> -> tensor<8x16xf32>
  %2 = kiln.mul %s, %1 : tensor<8x16xf32>
  %3 = kiln.softmax %2 axis = 1 : tensor<8x16xf32>
  %4 = kiln.add %s, %1 : tensor<8x16xf32>
  %5 = kiln.reduce_sum %4 axes = [0] : tensor<8x16xf32> -> tensor<16xf32>
  return %3, %5 : tensor<8x16xf32>, tensor<16xf32>
}

// -----

// CHECK-LABEL: func.func @updates
// CHECK: %[[F:.*]]:2 = kiln.fusion "elementwise" rows = 1
// CHECK: kiln.cast
// CHECK-COUNT-2: kiln.sub
// CHECK: return %[[F]]#{{[01]}}, %[[F]]#{{[01]}}
// Optimizer updates of two same-shaped parameters (their values leave the
// function) share one multi-output kernel; the learning rate from the step
// counter is recomputed inside it.
func.func @updates(%p: tensor<16xf32>, %g: tensor<16xf32>, %q: tensor<16xf32>, %h: tensor<16xf32>, %step: tensor<i64>) -> (tensor<16xf32>, tensor<16xf32>) {
  %0 = kiln.cast %step : tensor<i64> -> tensor<f32>
  %c = kiln.constant dense<1.0e-03> : tensor<f32>
  %1 = kiln.mul %0, %c : tensor<f32>
  %2 = kiln.broadcast_in_dim %1, dims = [] : tensor<f32> -> tensor<16xf32>
  %3 = kiln.mul %g, %2 : tensor<16xf32>
  %4 = kiln.sub %p, %3 : tensor<16xf32>
  %5 = kiln.mul %h, %2 : tensor<16xf32>
  %6 = kiln.sub %q, %5 : tensor<16xf32>
  return %4, %6 : tensor<16xf32>, tensor<16xf32>
}

// -----

// CHECK-LABEL: func.func @disabled
// CHECK: kiln.fusion "elementwise" rows = 2 ins(%arg0)
// CHECK-NEXT: ^bb0
// CHECK-NEXT: kiln.exp
// CHECK-NEXT: kiln.neg
// OFF-LABEL: func.func @disabled
// OFF: %[[A:.*]] = kiln.fusion "elementwise" rows = 2 ins(%arg0)
// OFF-NEXT: ^bb0
// OFF-NEXT: kiln.exp
// OFF-NEXT: kiln.yield
// OFF: kiln.fusion "elementwise" rows = 2 ins(%[[A]])
// OFF-NEXT: ^bb0
// OFF-NEXT: kiln.neg
// With disable=true every op is a kernel of its own.
func.func @disabled(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = kiln.exp %x : tensor<8x16xf32>
  %1 = kiln.neg %0 : tensor<8x16xf32>
  return %1 : tensor<8x16xf32>
}
