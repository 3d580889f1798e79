// Composite ops decomposed by kiln-lower-to-linalg, and data movement,
// compiled and run on the CPU against hand-computed values.
// RUN: kiln-opt %s --kiln-lower-to-linalg | mlir-opt %cpu_pipeline | mlir-cpu-runner -e main -entry-point-result=void -shared-libs=%runner_libs | FileCheck %s

func.func private @printMemrefF32(memref<*xf32>)
func.func @p(%t: tensor<2x3xf32>) {
  %m = bufferization.to_memref %t : memref<2x3xf32>
  %u = memref.cast %m : memref<2x3xf32> to memref<*xf32>
  call @printMemrefF32(%u) : (memref<*xf32>) -> ()
  return
}
func.func @main() {
  %x = kiln.constant dense<[[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]> : tensor<2x3xf32>
  // softmax([1, 2, 3]) = [0.0900306, 0.244728, 0.665241]; uniform row = 1/3
  // CHECK: {{\[}}[0.0900306, 0.244728, 0.665241],
  // CHECK-NEXT: [0.333333, 0.333333, 0.333333]]
  %s = kiln.softmax %x axis = 1 : tensor<2x3xf32>
  call @p(%s) : (tensor<2x3xf32>) -> ()
  // CHECK: {{\[}}[-2.40761, -1.40761, -0.407606],
  // CHECK-NEXT: [-1.09861, -1.09861, -1.09861]]
  %l = kiln.log_softmax %x axis = 1 : tensor<2x3xf32>
  call @p(%l) : (tensor<2x3xf32>) -> ()
  // layer_norm([1, 2, 3]): mean 2, var 2/3, x-hat = [-1.22474, 0, 1.22474];
  // * [1, 2, 0.5] + [0, 1, -1]
  // CHECK: {{\[}}[-1.22474, 1, -0.387632],
  // CHECK-NEXT: [0, 1, -1]]
  %g = kiln.constant dense<[1.0, 2.0, 0.5]> : tensor<3xf32>
  %b = kiln.constant dense<[0.0, 1.0, -1.0]> : tensor<3xf32>
  %n = kiln.layer_norm %x scale(%g : tensor<3xf32>) bias(%b : tensor<3xf32>) : tensor<2x3xf32>
  call @p(%n) : (tensor<2x3xf32>) -> ()
  // cross_entropy: (0.407606 + 1.098612) / 2 = 0.753109
  // CHECK: [0.753109]
  %t = kiln.constant dense<[2, 0]> : tensor<2xi32>
  %ce = kiln.cross_entropy %x, %t reduction = mean : tensor<2x3xf32>, tensor<2xi32> -> tensor<f32>
  %c1 = bufferization.to_memref %ce : memref<f32>
  %c2 = memref.cast %c1 : memref<f32> to memref<*xf32>
  call @printMemrefF32(%c2) : (memref<*xf32>) -> ()
  // gather rows [2, 0]
  // CHECK: {{\[}}[30, 31, 32],
  // CHECK-NEXT: [10, 11, 12]]
  %tab = kiln.constant dense<[[10.0, 11.0, 12.0], [20.0, 21.0, 22.0], [30.0, 31.0, 32.0]]> : tensor<3x3xf32>
  %ix = kiln.constant dense<[2, 0]> : tensor<2xi32>
  %ga = kiln.gather %tab[%ix] axis = 0 : tensor<3x3xf32>, tensor<2xi32> -> tensor<2x3xf32>
  call @p(%ga) : (tensor<2x3xf32>) -> ()
  // strided slice: rows 0 and 2
  // CHECK: {{\[}}[10, 11, 12],
  // CHECK-NEXT: [30, 31, 32]]
  %sl = kiln.slice %tab start = [0, 0] limit = [3, 3] stride = [2, 1] : tensor<3x3xf32> -> tensor<2x3xf32>
  call @p(%sl) : (tensor<2x3xf32>) -> ()
  // pad [[1, 2]] with one row above and interior padding 1 in dim 1
  // CHECK: {{\[}}[7, 7, 7],
  // CHECK-NEXT: [1, 7, 2]]
  %small = kiln.constant dense<[[1.0, 2.0]]> : tensor<1x2xf32>
  %pd = kiln.pad %small low = [1, 0] high = [0, 0] interior = [0, 1] value = 7.0 : tensor<1x2xf32> -> tensor<2x3xf32>
  call @p(%pd) : (tensor<2x3xf32>) -> ()
  // CHECK: {{\[}}[1, 3, 4],
  // CHECK-NEXT: [2, 5, 6]]
  %a1 = kiln.constant dense<[[1.0], [2.0]]> : tensor<2x1xf32>
  %a2 = kiln.constant dense<[[3.0, 4.0], [5.0, 6.0]]> : tensor<2x2xf32>
  %cc = kiln.concat %a1, %a2 dim = 1 : tensor<2x1xf32>, tensor<2x2xf32> -> tensor<2x3xf32>
  call @p(%cc) : (tensor<2x3xf32>) -> ()
  // Counter-based random numbers match runtime/core/Random.h (values from an
  // independent Python implementation of the same hash).
  // CHECK: [0.751968,  0.193147,  0.305273,  0.498535]
  // CHECK: [0.264022,  -1.54042,  2.10452,  -1.95508]
  // CHECK: [0,  0,  0,  8]
  %seed = kiln.constant dense<7> : tensor<i64>
  %ru = kiln.random uniform, %seed salt = 3 : tensor<i64> -> tensor<4xf32>
  call @p4(%ru) : (tensor<4xf32>) -> ()
  %rn = kiln.random normal, %seed salt = 3 : tensor<i64> -> tensor<4xf32>
  call @p4(%rn) : (tensor<4xf32>) -> ()
  %v = kiln.constant dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>
  %dr = kiln.dropout %v, %seed rate = 5.000000e-01 salt = 5 : tensor<4xf32>, tensor<i64>
  call @p4(%dr) : (tensor<4xf32>) -> ()
  // scatter_add: rows 2, 0, 2 of a 4-row result
  // CHECK: {{\[}}[3, 4],
  // CHECK-NEXT: [0, 0],
  // CHECK-NEXT: [6, 8],
  // CHECK-NEXT: [0, 0]]
  %up = kiln.constant dense<[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]> : tensor<3x2xf32>
  %si = kiln.constant dense<[2, 0, 2]> : tensor<3xi32>
  %sa = kiln.scatter_add %up[%si] axis = 0 : tensor<3x2xf32>, tensor<3xi32> -> tensor<4x2xf32>
  %sm = bufferization.to_memref %sa : memref<4x2xf32>
  %sc = memref.cast %sm : memref<4x2xf32> to memref<*xf32>
  call @printMemrefF32(%sc) : (memref<*xf32>) -> ()
  return
}

func.func @p4(%t: tensor<4xf32>) {
  %m = bufferization.to_memref %t : memref<4xf32>
  %u = memref.cast %m : memref<4xf32> to memref<*xf32>
  call @printMemrefF32(%u) : (memref<*xf32>) -> ()
  return
}
