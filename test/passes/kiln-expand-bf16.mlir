// RUN: kiln-opt %s --kiln-expand-bf16 --split-input-file | FileCheck %s

// kiln-expand-bf16 (passes/ExpandBF16.cpp): bf16 <-> f32 conversions become
// integer ops (so LLVM vectorizes the kernels that load or store bf16);
// f16 conversions and f32 code are left as they are.

// CHECK-LABEL: func.func @bf16_to_f32
// CHECK-NOT: arith.extf
// CHECK: %[[I:.*]] = arith.bitcast %{{.*}} : vector<16xbf16> to vector<16xi16>
// CHECK: %[[W:.*]] = arith.extui %[[I]] : vector<16xi16> to vector<16xi32>
// CHECK: %[[S:.*]] = arith.shli %[[W]], %{{.*}} : vector<16xi32>
// CHECK: arith.bitcast %[[S]] : vector<16xi32> to vector<16xf32>
func.func @bf16_to_f32(%x: vector<16xbf16>) -> vector<16xf32> {
  %0 = arith.extf %x : vector<16xbf16> to vector<16xf32>
  return %0 : vector<16xf32>
}

// -----

// Round to nearest even: the lowest kept bit plus 0x7fff (32767) is added,
// then the low 16 bits are dropped; a NaN is selected apart.
// CHECK-LABEL: func.func @f32_to_bf16
// CHECK-NOT: arith.truncf
// CHECK-DAG: arith.constant 32767 : i32
// CHECK-DAG: arith.cmpf une
// CHECK: arith.bitcast %{{.*}} : f32 to i32
// CHECK: arith.addi
// CHECK: arith.select
// CHECK: arith.bitcast %{{.*}} : i16 to bf16
func.func @f32_to_bf16(%x: f32) -> bf16 {
  %0 = arith.truncf %x : f32 to bf16
  return %0 : bf16
}

// -----

// CHECK-LABEL: func.func @f16_and_f32_kept
// CHECK-NEXT: arith.extf %{{.*}} : f16 to f32
// CHECK-NEXT: arith.truncf %{{.*}} : f32 to f16
// CHECK-NEXT: arith.maximumf
// CHECK-NEXT: return
func.func @f16_and_f32_kept(%x: f16, %y: f32) -> (f16, f32) {
  %0 = arith.extf %x : f16 to f32
  %1 = arith.truncf %0 : f32 to f16
  %2 = arith.maximumf %0, %y : f32
  return %1, %2 : f16, f32
}
