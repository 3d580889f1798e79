// kiln-fuse leaves collectives outside every kernel: they are plan steps
// between kernels (communication, no code), so the elementwise ops before
// and after an all_reduce form two kernels, and the refusal is reported
// with the rule "collective".
// RUN: kiln-opt %s --kiln-fuse --split-input-file | FileCheck %s
// RUN: kiln-opt %s --kiln-fuse=disable --split-input-file | FileCheck %s --check-prefix=OFF
// RUN: kiln-opt %s --kiln-fuse=remarks --split-input-file --verify-diagnostics -o /dev/null

// CHECK-LABEL: func.func @around_all_reduce
// CHECK: %[[A:.*]] = kiln.fusion "elementwise" rows = 2 ins(%arg0)
// CHECK-NEXT: ^bb0
// CHECK-NEXT: kiln.mul
// CHECK-NEXT: kiln.exp
// CHECK-NEXT: kiln.yield
// CHECK: %[[R:.*]] = kiln.all_reduce %[[A]] axis = "dp" reduction = mean {kiln.overlap} : tensor<8x4xf32>
// CHECK: %[[B:.*]] = kiln.fusion "elementwise" rows = 2 ins(%[[R]])
// CHECK-NOT: kiln.all_reduce
// CHECK: kiln.yield
// CHECK: return %[[B]]
// OFF-LABEL: func.func @around_all_reduce
// OFF-COUNT-2: kiln.fusion "elementwise"
// OFF: kiln.all_reduce
// OFF-COUNT-2: kiln.fusion "elementwise"
module attributes {kiln.mesh = {axes = ["dp"], shape = array<i64: 2>}} {
func.func @around_all_reduce(%x: tensor<8x4xf32>) -> tensor<8x4xf32> {
  %0 = kiln.mul %x, %x : tensor<8x4xf32>
  %1 = kiln.exp %0 : tensor<8x4xf32>
  // expected-remark @below {{not fused with kiln.exp: collective: communication between devices is a plan step of its own, never part of a kernel}}
  %2 = kiln.all_reduce %1 axis = "dp" reduction = mean {kiln.overlap} : tensor<8x4xf32>
  // expected-remark @below {{not fused with kiln.all_reduce: collective: communication between devices is a plan step of its own, never part of a kernel}}
  %3 = kiln.tanh %2 : tensor<8x4xf32>
  %4 = kiln.neg %3 : tensor<8x4xf32>
  // expected-remark @below {{result}}
  return %4 : tensor<8x4xf32>
}
}

// -----

// Between collectives: the gathered parameter is a kernel's input, the
// kernel's result the reduce_scatter's operand.
// CHECK-LABEL: func.func @gather_then_scatter
// CHECK: %[[G:.*]] = kiln.all_gather %arg0 axis = "dp" dim = 0 : tensor<4x3xf32> -> tensor<8x3xf32>
// CHECK: %[[F:.*]] = kiln.fusion "elementwise" rows = 2 ins(%[[G]], %arg1)
// CHECK: kiln.reduce_scatter %[[F]] axis = "dp" reduction = sum dim = 0 : tensor<8x3xf32> -> tensor<4x3xf32>
module attributes {kiln.mesh = {axes = ["dp"], shape = array<i64: 2>}} {
func.func @gather_then_scatter(%w: tensor<4x3xf32>, %c: tensor<8x3xf32>) -> tensor<4x3xf32> {
  %0 = kiln.all_gather %w axis = "dp" dim = 0 : tensor<4x3xf32> -> tensor<8x3xf32>
  // expected-remark @below {{not fused with kiln.all_gather: collective: communication between devices is a plan step of its own, never part of a kernel}}
  %1 = kiln.mul %0, %c : tensor<8x3xf32>
  // expected-remark @below {{not fused with kiln.mul: collective: communication between devices is a plan step of its own, never part of a kernel}}
  %2 = kiln.reduce_scatter %1 axis = "dp" reduction = sum dim = 0 : tensor<8x3xf32> -> tensor<4x3xf32>
  return %2 : tensor<4x3xf32>
}
}
