// RUN: kiln-opt %s --kiln-kernel-elementwise-fusion --split-input-file | FileCheck %s

// kiln-kernel-elementwise-fusion (passes/KernelFusion.cpp): an elementwise
// producer is fused into every consumer, even when several read it, so no
// intermediate array is left between fused ops; a reduction's result (one
// value per row) stays.

#id = affine_map<(d0) -> (d0)>

// Two readers of exp(x): each recomputes it.
// CHECK-LABEL: func.func @shared_producer
// CHECK-SAME: (%[[X:.*]]: tensor<4xf32>, %[[Y:.*]]: tensor<4xf32>)
// CHECK: %[[S:.*]] = linalg.generic {{.*}} ins(%[[X]], %[[Y]] :
// CHECK-NEXT: ^bb0
// CHECK-NEXT: %[[E1:.*]] = math.exp
// CHECK-NEXT: arith.addf %[[E1]]
// CHECK: %[[M:.*]] = linalg.generic {{.*}} ins(%[[X]], %[[Y]] :
// CHECK-NEXT: ^bb0
// CHECK-NEXT: %[[E2:.*]] = math.exp
// CHECK-NEXT: arith.mulf %[[E2]]
// CHECK-NOT: linalg.generic
// CHECK: return %[[S]], %[[M]]
func.func @shared_producer(%x: tensor<4xf32>, %y: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  %t0 = tensor.empty() : tensor<4xf32>
  %e = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel"]}
      ins(%x : tensor<4xf32>) outs(%t0 : tensor<4xf32>) {
  ^bb0(%a: f32, %o: f32):
    %0 = math.exp %a : f32
    linalg.yield %0 : f32
  } -> tensor<4xf32>
  %t1 = tensor.empty() : tensor<4xf32>
  %s = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel"]}
      ins(%e, %y : tensor<4xf32>, tensor<4xf32>) outs(%t1 : tensor<4xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %0 = arith.addf %a, %b : f32
    linalg.yield %0 : f32
  } -> tensor<4xf32>
  %t2 = tensor.empty() : tensor<4xf32>
  %m = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel"]}
      ins(%e, %y : tensor<4xf32>, tensor<4xf32>) outs(%t2 : tensor<4xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %0 = arith.mulf %a, %b : f32
    linalg.yield %0 : f32
  } -> tensor<4xf32>
  return %s, %m : tensor<4xf32>, tensor<4xf32>
}

// -----

#id2 = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d0)>

// A softmax-like row: exp(x) / rowsum(exp(x)). The exponentials are computed
// in the reduction and again in the division; the row sums stay in memory.
// CHECK-LABEL: func.func @reduction_result_stays
// CHECK-SAME: (%[[X:.*]]: tensor<2x3xf32>)
// CHECK: %[[SUM:.*]] = linalg.generic {{.*}} iterator_types = ["parallel", "reduction"]} ins(%[[X]] :
// CHECK-NEXT: ^bb0
// CHECK-NEXT: math.exp
// CHECK-NEXT: arith.addf
// CHECK: linalg.generic {{.*}} ins(%[[X]], %[[SUM]] :
// CHECK-NEXT: ^bb0
// CHECK-NEXT: %[[E:.*]] = math.exp
// CHECK-NEXT: arith.divf %[[E]]
func.func @reduction_result_stays(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %t0 = tensor.empty() : tensor<2x3xf32>
  %e = linalg.generic {indexing_maps = [#id2, #id2], iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<2x3xf32>) outs(%t0 : tensor<2x3xf32>) {
  ^bb0(%a: f32, %o: f32):
    %0 = math.exp %a : f32
    linalg.yield %0 : f32
  } -> tensor<2x3xf32>
  %zero = arith.constant 0.0 : f32
  %t1 = tensor.empty() : tensor<2xf32>
  %init = linalg.fill ins(%zero : f32) outs(%t1 : tensor<2xf32>) -> tensor<2xf32>
  %sum = linalg.generic {indexing_maps = [#id2, #row], iterator_types = ["parallel", "reduction"]}
      ins(%e : tensor<2x3xf32>) outs(%init : tensor<2xf32>) {
  ^bb0(%a: f32, %acc: f32):
    %0 = arith.addf %a, %acc : f32
    linalg.yield %0 : f32
  } -> tensor<2xf32>
  %t2 = tensor.empty() : tensor<2x3xf32>
  %d = linalg.generic {indexing_maps = [#id2, #row, #id2], iterator_types = ["parallel", "parallel"]}
      ins(%e, %sum : tensor<2x3xf32>, tensor<2xf32>) outs(%t2 : tensor<2x3xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %0 = arith.divf %a, %b : f32
    linalg.yield %0 : f32
  } -> tensor<2x3xf32>
  return %d : tensor<2x3xf32>
}
