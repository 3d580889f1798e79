// RUN: kiln-opt %s --kiln-polynomial-math --split-input-file | FileCheck %s
// RUN: kiln-opt %s --kiln-polynomial-math --split-input-file | FileCheck %s --check-prefix=NOCALL

// kiln-polynomial-math (passes/PolynomialMath.cpp): float32 functions become
// polynomial or rational approximations (FMAs, a division, clamps); float64
// functions stay calls.

// NOCALL-NOT: math.tanh {{.*}} : f32
// NOCALL-NOT: math.erf {{.*}} : f32

// CHECK-LABEL: func.func @f32_functions
// CHECK-SAME: (%[[X:.*]]: f32)
// tanh: clamp, then p(x) / q(x) in x^2
// CHECK: arith.cmpf ult, %[[X]]
// CHECK: %[[X2:.*]] = arith.mulf %[[CLAMPED:.*]], %[[CLAMPED]] : f32
// CHECK: math.fma %[[X2]]
// CHECK: arith.divf
// CHECK: return
func.func @f32_functions(%x: f32) -> (f32, f32) {
  %0 = math.tanh %x : f32
  %1 = math.erf %x : f32
  return %0, %1 : f32, f32
}

// -----

// CHECK-LABEL: func.func @f64_kept
// CHECK-NEXT: math.erf %{{.*}} : f64
// CHECK-NEXT: return
func.func @f64_kept(%x: f64) -> f64 {
  %0 = math.erf %x : f64
  return %0 : f64
}
