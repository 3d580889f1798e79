// RUN: kiln-opt %s --kiln-cpu-kernel-lowering | FileCheck %s
// RUN: kilnc %examples/mlp.kiln --emit=kernels -o %t.kernels.mlir
// RUN: kiln-opt %t.kernels.mlir --kiln-cpu-kernel-lowering | FileCheck %s --check-prefix=MLP

// kiln-cpu-kernel-lowering (passes/Pipelines.cpp): the kernel module, as
// kilnc --emit=kernels prints it, to the LLVM dialect (what kilnc translates
// to LLVM IR for the CPU): loops over bare pointers, float32 tanh as a
// polynomial (FMAs), nothing of kiln, linalg, memref or bufferization left.

// CHECK-NOT: kiln.
// CHECK-NOT: linalg.
// CHECK-NOT: bufferization.
// CHECK-LABEL: llvm.func @k0_fused2_tanh_body(
// CHECK-SAME: %{{.*}}: !llvm.ptr {llvm.noalias}, %{{.*}}: !llvm.ptr {llvm.noalias}, %{{.*}}: !llvm.ptr {llvm.noalias})
// CHECK: llvm.fadd
// CHECK: llvm.intr.fma
// CHECK-NOT: math.tanh
// CHECK-NOT: llvm.call
// CHECK: llvm.return
func.func @k0_fused2_tanh_body(%arg0: memref<4x8xf32> {llvm.noalias}, %arg1: memref<4x8xf32> {llvm.noalias}, %arg2: memref<4x8xf32> {llvm.noalias}) {
  %0 = bufferization.to_tensor %arg0 restrict : memref<4x8xf32>
  %1 = bufferization.to_tensor %arg1 restrict : memref<4x8xf32>
  %2 = kiln.fusion "elementwise" rows = 2 ins(%0, %1) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32> {
  ^bb0(%x: tensor<4x8xf32>, %y: tensor<4x8xf32>):
    %3 = kiln.add %x, %y : tensor<4x8xf32>
    %4 = kiln.tanh %3 : tensor<4x8xf32>
    kiln.yield %4 : tensor<4x8xf32>
  }
  bufferization.materialize_in_destination %2 in restrict writable %arg2 : (tensor<4x8xf32>, memref<4x8xf32>) -> ()
  return
}

// Every kernel of the MLP, row pieces included (an index argument).
// MLP-NOT: kiln.
// MLP-NOT: linalg.
// MLP-LABEL: llvm.func @k0_constant_body(
// MLP-LABEL: llvm.func @k1_fused3_relu_L5_body(
// MLP-SAME: %{{.*}}: !llvm.ptr {llvm.noalias}, %{{.*}}: !llvm.ptr {llvm.noalias}, %{{.*}}: !llvm.ptr {llvm.noalias}, %{{.*}}: i64)
// MLP-LABEL: llvm.func @k2_fused3_cross_entropy_L15_body(
