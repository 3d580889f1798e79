// RUN: kiln-opt %s --kiln-widen-low-precision --split-input-file | FileCheck %s

// kiln-widen-low-precision (passes/WidenLowPrecision.cpp): bf16/f16 values
// are widened to f32 where loaded, every op computes in f32, and a value is
// rounded once, where the generic stores it.

#id = affine_map<(d0) -> (d0)>

// a(b(x)) in bf16 => f32 ops between one extf per input and one truncf.
// CHECK-LABEL: func.func @chain
// CHECK: ^bb0(%[[A:.*]]: bf16, %[[B:.*]]: bf16, %{{.*}}: bf16):
// CHECK-DAG: %[[B32:.*]] = arith.extf %[[B]] : bf16 to f32
// CHECK-DAG: %[[A32:.*]] = arith.extf %[[A]] : bf16 to f32
// CHECK: %[[S:.*]] = arith.addf %[[A32]], %[[B32]] : f32
// CHECK: %[[E:.*]] = math.exp %[[S]] : f32
// CHECK: %[[M:.*]] = arith.mulf %[[E]], %[[B32]] : f32
// CHECK: %[[R:.*]] = arith.truncf %[[M]] : f32 to bf16
// CHECK-NEXT: linalg.yield %[[R]] : bf16
// CHECK-NOT: bf16 to f32
func.func @chain(%a: tensor<4xbf16>, %b: tensor<4xbf16>) -> tensor<4xbf16> {
  %e = tensor.empty() : tensor<4xbf16>
  %r = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel"]}
      ins(%a, %b : tensor<4xbf16>, tensor<4xbf16>) outs(%e : tensor<4xbf16>) {
  ^bb0(%x: bf16, %y: bf16, %o: bf16):
    %0 = arith.addf %x, %y : bf16
    %1 = math.exp %0 : bf16
    %2 = arith.mulf %1, %y : bf16
    linalg.yield %2 : bf16
  } -> tensor<4xbf16>
  return %r : tensor<4xbf16>
}

// -----

#id = affine_map<(d0) -> (d0)>

// A user's cast to f16 is a rounding point (truncf then extf); a constant
// becomes an f32 constant; a comparison and a select run on f32.
// CHECK-LABEL: func.func @cast_is_a_rounding_point
// CHECK: %[[X32:.*]] = arith.extf %{{.*}} : f16 to f32
// CHECK: %[[T:.*]] = arith.truncf %{{.*}} : f32 to f16
// CHECK-NEXT: %[[T32:.*]] = arith.extf %[[T]] : f16 to f32
// CHECK: %[[C:.*]] = arith.constant 2.000000e+00 : f32
// CHECK: %[[P:.*]] = arith.mulf %[[T32]], %[[C]] : f32
// CHECK: %[[LT:.*]] = arith.cmpf olt, %[[P]], %[[X32]] : f32
// CHECK: %[[SEL:.*]] = arith.select %[[LT]], %[[P]], %[[X32]] : f32
// CHECK: %[[R:.*]] = arith.truncf %[[SEL]] : f32 to f16
// CHECK-NEXT: linalg.yield %[[R]], %[[T]] : f16, f16
func.func @cast_is_a_rounding_point(%a: tensor<4xf32>, %h: tensor<4xf16>) -> (tensor<4xf16>, tensor<4xf16>) {
  %e = tensor.empty() : tensor<4xf16>
  %r:2 = linalg.generic {indexing_maps = [#id, #id, #id, #id], iterator_types = ["parallel"]}
      ins(%a, %h : tensor<4xf32>, tensor<4xf16>) outs(%e, %e : tensor<4xf16>, tensor<4xf16>) {
  ^bb0(%x: f32, %y: f16, %o: f16, %o2: f16):
    %t = arith.truncf %x : f32 to f16
    %c = arith.constant 2.0 : f16
    %p = arith.mulf %t, %c : f16
    %lt = arith.cmpf olt, %p, %y : f16
    %s = arith.select %lt, %p, %y : f16
    linalg.yield %s, %t : f16, f16
  } -> (tensor<4xf16>, tensor<4xf16>)
  return %r#0, %r#1 : tensor<4xf16>, tensor<4xf16>
}

// -----

#id = affine_map<(d0) -> (d0)>


// The end of an f32 accumulation (kiln_accumulator) is not rounded where
// the kernel uses it, only where it is stored.
// CHECK-LABEL: func.func @accumulator
// CHECK: ^bb0(%[[S:.*]]: f32, %[[X:.*]]: bf16, %{{.*}}: bf16, %{{.*}}: bf16):
// CHECK: %[[X32:.*]] = arith.extf %[[X]] : bf16 to f32
// CHECK: %[[ST:.*]] = arith.truncf %[[S]] {kiln_accumulator} : f32 to bf16
// CHECK: %[[D:.*]] = arith.divf %[[X32]], %[[S]] : f32
// CHECK: %[[R:.*]] = arith.truncf %[[D]] : f32 to bf16
// CHECK: linalg.yield %[[R]], %[[ST]] : bf16, bf16
func.func @accumulator(%sum: tensor<4xf32>, %x: tensor<4xbf16>) -> (tensor<4xbf16>, tensor<4xbf16>) {
  %e = tensor.empty() : tensor<4xbf16>
  %r:2 = linalg.generic {indexing_maps = [#id, #id, #id, #id], iterator_types = ["parallel"]}
      ins(%sum, %x : tensor<4xf32>, tensor<4xbf16>) outs(%e, %e : tensor<4xbf16>, tensor<4xbf16>) {
  ^bb0(%s: f32, %v: bf16, %o: bf16, %o2: bf16):
    %st = arith.truncf %s {kiln_accumulator} : f32 to bf16
    %d = arith.divf %v, %st : bf16
    linalg.yield %d, %st : bf16, bf16
  } -> (tensor<4xbf16>, tensor<4xbf16>)
  return %r#0, %r#1 : tensor<4xbf16>, tensor<4xbf16>
}

// -----

#id = affine_map<(d0) -> (d0)>

// f32 generics are untouched.
// CHECK-LABEL: func.func @f32_unchanged
// CHECK: ^bb0(%[[X:.*]]: f32, %{{.*}}: f32):
// CHECK-NEXT: %[[E:.*]] = math.exp %[[X]] : f32
// CHECK-NEXT: linalg.yield %[[E]] : f32
func.func @f32_unchanged(%a: tensor<4xf32>) -> tensor<4xf32> {
  %e = tensor.empty() : tensor<4xf32>
  %r = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel"]}
      ins(%a : tensor<4xf32>) outs(%e : tensor<4xf32>) {
  ^bb0(%x: f32, %o: f32):
    %0 = math.exp %x : f32
    linalg.yield %0 : f32
  } -> tensor<4xf32>
  return %r : tensor<4xf32>
}
