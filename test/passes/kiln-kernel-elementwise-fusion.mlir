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

// -----

// A reduction's f32 result truncated to bf16 as the end of an accumulation
// (kiln_accumulator) moves through the reshape after it and fuses into its
// reader: no bf16 temporary holds the row sums (kiln-widen-low-precision
// then keeps them f32). Reshapes of other generics stay where they are.
#id2 = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d0)>
#id1 = affine_map<(d0) -> (d0)>
#bc = affine_map<(d0, d1) -> (d0, 0)>
// CHECK-LABEL: func.func @accumulator_through_reshape
// CHECK: %[[SUM:.*]] = linalg.generic {{.*}}iterator_types = ["parallel", "reduction"]
// CHECK-NOT: tensor.expand_shape {{.*}} tensor<6xbf16>
// CHECK: linalg.generic {{.*}} ins(%{{.*}}, %{{.*}} : tensor<6x1xf32>, tensor<6x40xbf16>)
// CHECK: arith.truncf %{{.*}} {kiln_accumulator} : f32 to bf16
// CHECK: arith.divf
func.func @accumulator_through_reshape(%x: tensor<6x40xbf16>) -> tensor<6x40xbf16> {
  %zero = arith.constant 0.0 : f32
  %e6 = tensor.empty() : tensor<6xf32>
  %init = linalg.fill ins(%zero : f32) outs(%e6 : tensor<6xf32>) -> tensor<6xf32>
  %sum = linalg.generic {indexing_maps = [#id2, #row], iterator_types = ["parallel", "reduction"]}
      ins(%x : tensor<6x40xbf16>) outs(%init : tensor<6xf32>) {
  ^bb0(%a: bf16, %acc: f32):
    %w = arith.extf %a : bf16 to f32
    %s = arith.addf %w, %acc : f32
    linalg.yield %s : f32
  } -> tensor<6xf32>
  %eb = tensor.empty() : tensor<6xbf16>
  %low = linalg.generic {indexing_maps = [#id1, #id1], iterator_types = ["parallel"]}
      ins(%sum : tensor<6xf32>) outs(%eb : tensor<6xbf16>) {
  ^bb0(%s: f32, %o: bf16):
    %t = arith.truncf %s {kiln_accumulator} : f32 to bf16
    linalg.yield %t : bf16
  } -> tensor<6xbf16>
  %col = tensor.expand_shape %low [[0, 1]] output_shape [6, 1] : tensor<6xbf16> into tensor<6x1xbf16>
  %e = tensor.empty() : tensor<6x40xbf16>
  %r = linalg.generic {indexing_maps = [#bc, #id2, #id2], iterator_types = ["parallel", "parallel"]}
      ins(%col, %x : tensor<6x1xbf16>, tensor<6x40xbf16>) outs(%e : tensor<6x40xbf16>) {
  ^bb0(%s: bf16, %a: bf16, %o: bf16):
    %d = arith.divf %a, %s : bf16
    linalg.yield %d : bf16
  } -> tensor<6x40xbf16>
  return %r : tensor<6x40xbf16>
}
