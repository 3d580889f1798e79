// Kernels lowered by kiln-lower-to-linalg compile through upstream MLIR to
// LLVM and compute the right numbers (hand-computed; f32, printed to 6
// significant digits).
// RUN: kiln-opt %s --kiln-lower-to-linalg | mlir-opt %cpu_pipeline | mlir-cpu-runner -e main -entry-point-result=void -shared-libs=%runner_libs | FileCheck %s

func.func private @printMemrefF32(memref<*xf32>)

func.func @print2x3(%t: tensor<2x3xf32>) {
  %m = bufferization.to_memref %t : memref<2x3xf32>
  %u = memref.cast %m : memref<2x3xf32> to memref<*xf32>
  call @printMemrefF32(%u) : (memref<*xf32>) -> ()
  return
}

func.func @main() {
  %a = kiln.constant dense<[[1.0, -2.0, 3.0], [0.5, 0.0, -1.5]]> : tensor<2x3xf32>
  %b = kiln.constant dense<[0.25, 0.5, -0.75]> : tensor<3xf32>
  %w = kiln.constant dense<[[1.0, 0.0, 2.0], [0.0, 1.0, -1.0]]> : tensor<2x3xf32>
  // x = a + broadcast(b) = [[1.25, -1.5, 2.25], [0.75, 0.5, -2.25]]
  %bb = kiln.broadcast_in_dim %b, dims = [1] : tensor<3xf32> -> tensor<2x3xf32>
  %x = kiln.add %a, %bb : tensor<2x3xf32>
  // CHECK: {{\[}}[1.25, -1.5, 2.25],
  // CHECK-NEXT: [0.75, 0.5, -2.25]]
  call @print2x3(%x) : (tensor<2x3xf32>) -> ()
  // gelu(1.25) = 1.25 Phi(1.25) = 1.11794...
  // CHECK: {{\[}}[1.11794, -0.100211, 2.2225],
  // CHECK-NEXT: [0.580029, 0.345731, -0.027505]]
  %g = kiln.gelu erf, %x : tensor<2x3xf32>
  call @print2x3(%g) : (tensor<2x3xf32>) -> ()
  // max(x, 0) * 2 - 1 (relu, mul, sub with splat constants)
  // CHECK: {{\[}}[1.5, -1, 3.5],
  // CHECK-NEXT: [0.5, 0, -1]]
  %z = kiln.constant dense<2.0> : tensor<2x3xf32>
  %o = kiln.constant dense<1.0> : tensor<2x3xf32>
  %r0 = kiln.relu %x : tensor<2x3xf32>
  %r1 = kiln.mul %r0, %z : tensor<2x3xf32>
  %r2 = kiln.sub %r1, %o : tensor<2x3xf32>
  call @print2x3(%r2) : (tensor<2x3xf32>) -> ()
  // select(x > 0, x, -x) via compare (|x|)
  // CHECK: {{\[}}[1.25, 1.5, 2.25],
  // CHECK-NEXT: [0.75, 0.5, 2.25]]
  %zero = kiln.constant dense<0.0> : tensor<2x3xf32>
  %pos = kiln.compare gt, %x, %zero : tensor<2x3xf32>
  %nx = kiln.neg %x : tensor<2x3xf32>
  %ab = kiln.select %pos, %x, %nx : tensor<2x3xi1>, tensor<2x3xf32>
  call @print2x3(%ab) : (tensor<2x3xf32>) -> ()
  // Row sums (keepdims) and the overall max.
  // CHECK: {{\[}}[2],
  // CHECK-NEXT: [-1]]
  %s = kiln.reduce_sum %x axes = [1] keepdims : tensor<2x3xf32> -> tensor<2x1xf32>
  %s1 = bufferization.to_memref %s : memref<2x1xf32>
  %s2 = memref.cast %s1 : memref<2x1xf32> to memref<*xf32>
  call @printMemrefF32(%s2) : (memref<*xf32>) -> ()
  // CHECK: [2.25]
  %mx = kiln.reduce_max %x axes = [0, 1] : tensor<2x3xf32> -> tensor<f32>
  %m1 = bufferization.to_memref %mx : memref<f32>
  %m2 = memref.cast %m1 : memref<f32> to memref<*xf32>
  call @printMemrefF32(%m2) : (memref<*xf32>) -> ()
  // Mean over columns: [1, -0.5, 0]
  // CHECK: [1,  -0.5,  0]
  %mean = kiln.reduce_mean %x axes = [0] : tensor<2x3xf32> -> tensor<3xf32>
  %e1 = bufferization.to_memref %mean : memref<3xf32>
  %e2 = memref.cast %e1 : memref<3xf32> to memref<*xf32>
  call @printMemrefF32(%e2) : (memref<*xf32>) -> ()
  // x w^T = [[5.75, -3.75], [-3.75, 2.75]]
  // CHECK: {{\[}}[5.75, -3.75],
  // CHECK-NEXT: [-3.75, 2.75]]
  %mm = kiln.matmul %x, %w transpose_rhs : tensor<2x3xf32>, tensor<2x3xf32> -> tensor<2x2xf32>
  %mm1 = bufferization.to_memref %mm : memref<2x2xf32>
  %mm2 = memref.cast %mm1 : memref<2x2xf32> to memref<*xf32>
  call @printMemrefF32(%mm2) : (memref<*xf32>) -> ()
  // x^T w = [[1.25, 0.5 ... ]]: transpose_lhs on x (2x3 -> 3x2 via K = 2)
  // x^T [[1, 0, 2], [0, 1, -1]] = rows of x^T times w:
  // [1.25, 0.75] . cols -> [1.25, 0.75, 1.75], [-1.5, 0.5] -> [-1.5, 0.5, -3.5],
  // [2.25, -2.25] -> [2.25, -2.25, 6.75]
  // CHECK: {{\[}}[1.25, 0.75, 1.75],
  // CHECK-NEXT: [-1.5, 0.5, -3.5],
  // CHECK-NEXT: [2.25, -2.25, 6.75]]
  %tm = kiln.matmul %x, %w transpose_lhs : tensor<2x3xf32>, tensor<2x3xf32> -> tensor<3x3xf32>
  %tm1 = bufferization.to_memref %tm : memref<3x3xf32>
  %tm2 = memref.cast %tm1 : memref<3x3xf32> to memref<*xf32>
  call @printMemrefF32(%tm2) : (memref<*xf32>) -> ()
  // Transpose and reshape.
  // CHECK: {{\[}}[1.25, 0.75],
  // CHECK-NEXT: [-1.5, 0.5],
  // CHECK-NEXT: [2.25, -2.25]]
  %p = kiln.transpose %x perm = [1, 0] : tensor<2x3xf32> -> tensor<3x2xf32>
  %p1 = bufferization.to_memref %p : memref<3x2xf32>
  %p2 = memref.cast %p1 : memref<3x2xf32> to memref<*xf32>
  call @printMemrefF32(%p2) : (memref<*xf32>) -> ()
  // CHECK: [1.25,  -1.5,  2.25,  0.75,  0.5,  -2.25]
  %f = kiln.reshape %x : tensor<2x3xf32> -> tensor<6xf32>
  %f1 = bufferization.to_memref %f : memref<6xf32>
  %f2 = memref.cast %f1 : memref<6xf32> to memref<*xf32>
  call @printMemrefF32(%f2) : (memref<*xf32>) -> ()
  // iota and casts: cast(iota) to f32 = [0, 1, 2]
  // CHECK: [0,  1,  2]
  %i = kiln.iota dim = 0 : tensor<3xi32>
  %ic = kiln.cast %i : tensor<3xi32> -> tensor<3xf32>
  %i1 = bufferization.to_memref %ic : memref<3xf32>
  %i2 = memref.cast %i1 : memref<3xf32> to memref<*xf32>
  call @printMemrefF32(%i2) : (memref<*xf32>) -> ()
  return
}
