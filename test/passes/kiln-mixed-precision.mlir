// RUN: kiln-opt %s --kiln-mixed-precision --split-input-file | FileCheck %s
// RUN: kiln-opt %s --kiln-mixed-precision=mode=autocast --split-input-file | FileCheck %s --check-prefix=AUTO
// RUN: kiln-opt %s --kiln-mixed-precision=precision=fp16 --split-input-file | FileCheck %s --check-prefix=F16

// kiln-mixed-precision (passes/MixedPrecision.cpp) with the policy table of
// dialects/kiln/Precision.cpp. Every case is a module whose kiln.train asks
// for bf16 (the fp32 case excepted); the AUTO run applies PyTorch autocast's
// lists instead, the F16 run overrides the precision with the pass option.

// Every class in one function: a GEMM (low), layer_norm and softmax (low in
// and out, fp32 statistics), gelu and mul (low), exp (fp32), cross_entropy
// (the loss, fp32). One master-weight copy per parameter, at the entry, even
// though %w feeds two GEMMs; the splat constant is rounded once, not cast;
// the logits are returned in f32 through the cast the loss already made.
// CHECK-LABEL: module attributes {kiln.precision = "bf16", kiln.precision.mode = "kiln"
// CHECK: func.func @forward(%[[W:[a-z0-9]+]]: tensor<4x4xf32> {kiln.param = "w"}, %[[G:[a-z0-9]+]]: tensor<4xf32> {kiln.param = "g"}, %[[X:[a-z0-9]+]]: tensor<2x4xf32> {kiln.input = "x"}, %[[T:[a-z0-9]+]]: tensor<2xi32> {kiln.input = "t"})
// CHECK-SAME: -> (tensor<f32> {kiln.output = "loss"}, tensor<2x4xf32> {kiln.output = "logits"})
// CHECK-NEXT: %[[XB:[0-9]+]] = kiln.cast %[[X]] {kiln.precision.rule = "gemm-low"} : tensor<2x4xf32> -> tensor<2x4xbf16>
// CHECK-NEXT: %[[WB:[0-9]+]] = kiln.cast %[[W]] {kiln.precision.rule = "master-weight-copy"} : tensor<4x4xf32> -> tensor<4x4xbf16>
// CHECK-NEXT: %[[GB:[0-9]+]] = kiln.cast %[[G]] {kiln.precision.rule = "master-weight-copy"} : tensor<4xf32> -> tensor<4xbf16>
// CHECK-NEXT: %[[M0:[0-9]+]] = kiln.matmul %[[XB]], %[[WB]] : tensor<2x4xbf16>, tensor<4x4xbf16> -> tensor<2x4xbf16>
// CHECK-NEXT: %[[LN:[0-9]+]] = kiln.layer_norm %[[M0]] scale(%[[GB]] : tensor<4xbf16>) {kiln.precision.rule = "layer-norm-fp32-stats"} : tensor<2x4xbf16>
// CHECK-NEXT: %[[GE:[0-9]+]] = kiln.gelu tanh, %[[LN]] : tensor<2x4xbf16>
// CHECK-NEXT: kiln.constant dense<5.000000e-01> : tensor<2x4xf32>
// CHECK-NEXT: %[[HALF:[0-9]+]] = kiln.constant dense<5.000000e-01> : tensor<2x4xbf16> {kiln.precision.rule = "elementwise-low"}
// CHECK-NEXT: %[[MU:[0-9]+]] = kiln.mul %[[GE]], %[[HALF]] : tensor<2x4xbf16>
// CHECK-NEXT: %[[M1:[0-9]+]] = kiln.matmul %[[MU]], %[[WB]] transpose_rhs : tensor<2x4xbf16>, tensor<4x4xbf16> -> tensor<2x4xbf16>
// CHECK-NEXT: %[[SM:[0-9]+]] = kiln.softmax %[[M1]] axis = 1 {kiln.precision.rule = "softmax-fp32-stats"} : tensor<2x4xbf16>
// CHECK-NEXT: %[[SMF:[0-9]+]] = kiln.cast %[[SM]] {kiln.precision.rule = "exp-log-pow-fp32"} : tensor<2x4xbf16> -> tensor<2x4xf32>
// CHECK-NEXT: %[[EX:[0-9]+]] = kiln.exp %[[SMF]] {kiln.precision.rule = "exp-log-pow-fp32"} : tensor<2x4xf32>
// CHECK-NEXT: %[[EXB:[0-9]+]] = kiln.cast %[[EX]] {kiln.precision.rule = "elementwise-low"} : tensor<2x4xf32> -> tensor<2x4xbf16>
// CHECK-NEXT: %[[SUM:[0-9]+]] = kiln.add %[[EXB]], %[[M1]] : tensor<2x4xbf16>
// CHECK-NEXT: %[[SUMF:[0-9]+]] = kiln.cast %[[SUM]] {kiln.precision.rule = "loss-fp32"} : tensor<2x4xbf16> -> tensor<2x4xf32>
// CHECK-NEXT: %[[L:[0-9]+]] = kiln.cross_entropy %[[SUMF]], %[[T]] reduction = mean {kiln.precision.rule = "loss-fp32"} : tensor<2x4xf32>, tensor<2xi32> -> tensor<f32>
// CHECK-NEXT: return %[[L]], %[[SUMF]] : tensor<f32>, tensor<2x4xf32>
//
// autocast: the GEMMs in bf16, layer_norm, softmax, exp and the loss in
// fp32 (its fp32 list), gelu/mul/add in the widest input type: gelu reads
// layer_norm's f32 output and stays f32; the add of exp (f32) and a GEMM
// (bf16) promotes to f32. The constant does not widen anything.
// AUTO-LABEL: module attributes {kiln.precision = "bf16", kiln.precision.mode = "autocast"
// AUTO: %[[M0:[0-9]+]] = kiln.matmul {{.*}} -> tensor<2x4xbf16>
// AUTO: %[[M0F:[0-9]+]] = kiln.cast %[[M0]] {kiln.precision.rule = "autocast-fp32"} : tensor<2x4xbf16> -> tensor<2x4xf32>
// AUTO: kiln.layer_norm %[[M0F]] scale(%{{.*}} : tensor<4xf32>) {kiln.precision.rule = "autocast-fp32"} : tensor<2x4xf32>
// AUTO: kiln.gelu tanh, %{{.*}} : tensor<2x4xf32>
// AUTO: kiln.mul %{{.*}}, %{{.*}} : tensor<2x4xf32>
// AUTO: kiln.cast %{{.*}} {kiln.precision.rule = "autocast-lower-precision"} : tensor<2x4xf32> -> tensor<2x4xbf16>
// AUTO: %[[M1:[0-9]+]] = kiln.matmul {{.*}} transpose_rhs : tensor<2x4xbf16>, tensor<4x4xbf16> -> tensor<2x4xbf16>
// AUTO: %[[M1F:[0-9]+]] = kiln.cast %[[M1]] {kiln.precision.rule = "autocast-fp32"} : tensor<2x4xbf16> -> tensor<2x4xf32>
// AUTO: kiln.softmax %[[M1F]] axis = 1 {kiln.precision.rule = "autocast-fp32"} : tensor<2x4xf32>
// AUTO: %[[EX:[0-9]+]] = kiln.exp %{{.*}} {kiln.precision.rule = "autocast-fp32"} : tensor<2x4xf32>
// AUTO: %[[SUM:[0-9]+]] = kiln.add %[[EX]], %[[M1F]] : tensor<2x4xf32>
// AUTO: kiln.cross_entropy %[[SUM]], %{{.*}} reduction = mean {kiln.precision.rule = "autocast-fp32"}
//
// fp16 from the pass option, over the train section's bf16.
// F16-LABEL: module attributes {kiln.precision = "fp16", kiln.precision.mode = "kiln"
// F16: kiln.matmul {{.*}} : tensor<2x4xf16>, tensor<4x4xf16> -> tensor<2x4xf16>
// F16: kiln.cross_entropy {{.*}} : tensor<2x4xf32>, tensor<2xi32> -> tensor<f32>
module attributes {kiln.train = {precision = "bf16"}} {
  func.func @forward(%w: tensor<4x4xf32> {kiln.param = "w"}, %g: tensor<4xf32> {kiln.param = "g"},
                     %x: tensor<2x4xf32> {kiln.input = "x"}, %t: tensor<2xi32> {kiln.input = "t"})
      -> (tensor<f32> {kiln.output = "loss"}, tensor<2x4xf32> {kiln.output = "logits"}) {
    %0 = kiln.matmul %x, %w : tensor<2x4xf32>, tensor<4x4xf32> -> tensor<2x4xf32>
    %1 = kiln.layer_norm %0 scale(%g : tensor<4xf32>) : tensor<2x4xf32>
    %2 = kiln.gelu tanh, %1 : tensor<2x4xf32>
    %c = kiln.constant dense<0.5> : tensor<2x4xf32>
    %3 = kiln.mul %2, %c : tensor<2x4xf32>
    %4 = kiln.matmul %3, %w transpose_rhs : tensor<2x4xf32>, tensor<4x4xf32> -> tensor<2x4xf32>
    %5 = kiln.softmax %4 axis = 1 : tensor<2x4xf32>
    %6 = kiln.exp %5 : tensor<2x4xf32>
    %7 = kiln.add %6, %4 : tensor<2x4xf32>
    %8 = kiln.cross_entropy %7, %t reduction = mean : tensor<2x4xf32>, tensor<2xi32> -> tensor<f32>
    return %8, %7 : tensor<f32>, tensor<2x4xf32>
  }
}

// -----

// Data movement follows its input: a parameter read by gather (an
// embedding) or broadcast is its master copy; reductions (sum, mean) and
// log_softmax widen to fp32, and the value they share is cast once.
// CHECK-LABEL: {kiln.param = "emb"}
// CHECK: %[[EB:[0-9]+]] = kiln.cast %arg0 {kiln.precision.rule = "master-weight-copy"} : tensor<8x4xf32> -> tensor<8x4xbf16>
// CHECK: %[[PB:[0-9]+]] = kiln.cast %arg1 {kiln.precision.rule = "master-weight-copy"} : tensor<3x4xf32> -> tensor<3x4xbf16>
// CHECK: %[[E:[0-9]+]] = kiln.gather %[[EB]][%arg2] axis = 0 : tensor<8x4xbf16>, tensor<2x3xi32> -> tensor<2x3x4xbf16>
// CHECK: %[[P:[0-9]+]] = kiln.broadcast_in_dim %[[PB]], dims = [1, 2] : tensor<3x4xbf16> -> tensor<2x3x4xbf16>
// CHECK: %[[S:[0-9]+]] = kiln.add %[[E]], %[[P]] : tensor<2x3x4xbf16>
// CHECK: %[[SF:[0-9]+]] = kiln.cast %[[S]] {kiln.precision.rule = "reduction-fp32"} : tensor<2x3x4xbf16> -> tensor<2x3x4xf32>
// CHECK-NOT: kiln.cast
// CHECK: kiln.reduce_sum %[[SF]] axes = [2] {kiln.precision.rule = "reduction-fp32"} : tensor<2x3x4xf32> -> tensor<2x3xf32>
// CHECK: kiln.reduce_mean %[[SF]] axes = [2] {kiln.precision.rule = "reduction-fp32"} : tensor<2x3x4xf32> -> tensor<2x3xf32>
// CHECK: kiln.log_softmax %[[SF]] axis = 2 {kiln.precision.rule = "log-softmax-fp32"} : tensor<2x3x4xf32>
// CHECK: %[[MX:[0-9]+]] = kiln.reduce_max %[[S]] axes = [2] : tensor<2x3x4xbf16> -> tensor<2x3xbf16>
// Elementwise ops narrow with their inputs: sum + mean (both f32) stays f32,
// adding the bf16 max narrows; the loss arithmetic (f32 + f32) stays f32.
// CHECK: %[[A:[0-9]+]] = kiln.add %{{[0-9]+}}, %{{[0-9]+}} : tensor<2x3xf32>
// CHECK: %[[AB:[0-9]+]] = kiln.cast %[[A]] {kiln.precision.rule = "elementwise-low"} : tensor<2x3xf32> -> tensor<2x3xbf16>
// CHECK: kiln.add %[[AB]], %[[MX]] : tensor<2x3xbf16>
// CHECK: %[[L:[0-9]+]] = kiln.add %{{[0-9]+}}, %{{[0-9]+}} : tensor<f32>
// CHECK-NEXT: return %[[L]] : tensor<f32>
// AUTO-LABEL: {kiln.param = "emb"}
// AUTO: kiln.gather %arg0[%arg2] axis = 0 : tensor<8x4xf32>, tensor<2x3xi32> -> tensor<2x3x4xf32>
// AUTO: kiln.reduce_sum %{{.*}} {kiln.precision.rule = "autocast-fp32"} : tensor<2x3x4xf32> -> tensor<2x3xf32>
// AUTO-NOT: kiln.cast
// AUTO: return
module attributes {kiln.train = {precision = "bf16"}} {
  func.func @forward(%emb: tensor<8x4xf32> {kiln.param = "emb"}, %pos: tensor<3x4xf32> {kiln.param = "pos"},
                     %tok: tensor<2x3xi32> {kiln.input = "tokens"})
      -> (tensor<f32> {kiln.output = "loss"}) {
    %0 = kiln.gather %emb[%tok] axis = 0 : tensor<8x4xf32>, tensor<2x3xi32> -> tensor<2x3x4xf32>
    %1 = kiln.broadcast_in_dim %pos, dims = [1, 2] : tensor<3x4xf32> -> tensor<2x3x4xf32>
    %2 = kiln.add %0, %1 : tensor<2x3x4xf32>
    %3 = kiln.reduce_sum %2 axes = [2] : tensor<2x3x4xf32> -> tensor<2x3xf32>
    %4 = kiln.reduce_mean %2 axes = [2] : tensor<2x3x4xf32> -> tensor<2x3xf32>
    %5 = kiln.log_softmax %2 axis = 2 : tensor<2x3x4xf32>
    %6 = kiln.reduce_max %2 axes = [2] : tensor<2x3x4xf32> -> tensor<2x3xf32>
    %7 = kiln.add %3, %4 : tensor<2x3xf32>
    %8 = kiln.add %7, %6 : tensor<2x3xf32>
    %9 = kiln.reduce_sum %5 axes = [0, 1, 2] : tensor<2x3x4xf32> -> tensor<f32>
    %10 = kiln.reduce_sum %8 axes = [0, 1] : tensor<2x3xf32> -> tensor<f32>
    %11 = kiln.add %9, %10 : tensor<f32>
    return %11 : tensor<f32>
  }
}

// -----

// The user's own casts are kept as written, and the ops they typed in bf16
// are left alone (no rule, no cast around them); ops tagged
// kiln.precision.fp32 by the frontend's override stay fp32 with rule
// "user-fp32-override", even a GEMM, and read the parameter itself.
// CHECK-LABEL: {kiln.param = "w3"}
// CHECK: %[[U:[0-9]+]] = kiln.cast %arg1 : tensor<2x4xf32> -> tensor<2x4xbf16>
// CHECK: %[[UW:[0-9]+]] = kiln.cast %arg0 : tensor<4x4xf32> -> tensor<4x4xbf16>
// CHECK: %[[UM:[0-9]+]] = kiln.matmul %[[U]], %[[UW]] : tensor<2x4xbf16>, tensor<4x4xbf16> -> tensor<2x4xbf16>
// CHECK: %[[UB:[0-9]+]] = kiln.cast %[[UM]] : tensor<2x4xbf16> -> tensor<2x4xf32>
// CHECK: %[[O:[0-9]+]] = kiln.matmul %[[UB]], %arg0 {kiln.precision.fp32 = "lm_head", kiln.precision.rule = "user-fp32-override"} : tensor<2x4xf32>, tensor<4x4xf32> -> tensor<2x4xf32>
// CHECK: kiln.reduce_sum %[[O]]
// CHECK-NOT: kiln.cast
// CHECK: return
module attributes {kiln.train = {precision = "bf16"}} {
  func.func @forward(%w: tensor<4x4xf32> {kiln.param = "w3"}, %x: tensor<2x4xf32> {kiln.input = "x"})
      -> (tensor<f32> {kiln.output = "loss"}) {
    %0 = kiln.cast %x : tensor<2x4xf32> -> tensor<2x4xbf16>
    %1 = kiln.cast %w : tensor<4x4xf32> -> tensor<4x4xbf16>
    %2 = kiln.matmul %0, %1 : tensor<2x4xbf16>, tensor<4x4xbf16> -> tensor<2x4xbf16>
    %3 = kiln.cast %2 : tensor<2x4xbf16> -> tensor<2x4xf32>
    %4 = kiln.matmul %3, %w {kiln.precision.fp32 = "lm_head"} : tensor<2x4xf32>, tensor<4x4xf32> -> tensor<2x4xf32>
    %5 = kiln.reduce_sum %4 axes = [0, 1] : tensor<2x4xf32> -> tensor<f32>
    return %5 : tensor<f32>
  }
}

// -----

// A user cast whose operand the policy narrowed reads it in the type the
// user wrote: the pass casts it back rather than change the user's cast.
// CHECK-LABEL: {kiln.param = "w4"}
// CHECK: %[[G:[0-9]+]] = kiln.gelu erf, %{{.*}} : tensor<4xbf16>
// CHECK: %[[GF:[0-9]+]] = kiln.cast %[[G]] {kiln.precision.rule = "user-typed"} : tensor<4xbf16> -> tensor<4xf32>
// CHECK: kiln.cast %[[GF]] : tensor<4xf32> -> tensor<4xf16>
module attributes {kiln.train = {precision = "bf16"}} {
  func.func @forward(%w: tensor<4xf32> {kiln.param = "w4"}) -> (tensor<f32> {kiln.output = "loss"}) {
    %0 = kiln.gelu erf, %w : tensor<4xf32>
    %1 = kiln.cast %0 : tensor<4xf32> -> tensor<4xf16>
    %2 = kiln.reduce_sum %1 axes = [0] : tensor<4xf16> -> tensor<f16>
    %3 = kiln.cast %2 : tensor<f16> -> tensor<f32>
    return %3 : tensor<f32>
  }
}

// -----

// fp32 (or no precision): nothing changes, not even the module's attributes.
// CHECK-LABEL: module attributes {kiln.train = {precision = "fp32"}}
// CHECK-NOT: kiln.precision
// CHECK: kiln.matmul %arg1, %arg0 : tensor<2x4xf32>, tensor<4x4xf32> -> tensor<2x4xf32>
// CHECK-NOT: kiln.cast
// CHECK: return
module attributes {kiln.train = {precision = "fp32"}} {
  func.func @forward(%w: tensor<4x4xf32> {kiln.param = "w"}, %x: tensor<2x4xf32> {kiln.input = "x"})
      -> (tensor<f32> {kiln.output = "loss"}) {
    %0 = kiln.matmul %x, %w : tensor<2x4xf32>, tensor<4x4xf32> -> tensor<2x4xf32>
    %1 = kiln.reduce_sum %0 axes = [0, 1] : tensor<2x4xf32> -> tensor<f32>
    return %1 : tensor<f32>
  }
}
