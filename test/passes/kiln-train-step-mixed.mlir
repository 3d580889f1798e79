// RUN: kiln-opt %s --kiln-train-step=emit-grad=false --split-input-file | FileCheck %s

// kiln-train-step on modules kiln-mixed-precision has rewritten (here by
// hand: casts carry kiln.precision.rule, the module kiln.precision):
// master-weight copies become state written by the update, and fp16 gets
// the loss scaler (docs/training.md "Master weights and loss scaling").

//===----------------------------------------------------------------------===//
// bf16, grad_accum = 2: the copy of w is state "lowp:w"; no scaler
//===----------------------------------------------------------------------===//

// @init: the copy of the initial w, cast as the pass casts it.
// CHECK-LABEL: func.func @init(
// CHECK-SAME: tensor<3x4xf32> {kiln.output = "v:w"}, tensor<3xf32> {kiln.output = "v:b"}, tensor<3x4xbf16> {kiln.output = "lowp:w"})
// CHECK: %[[W0:[0-9]+]] = kiln.add
// CHECK: %[[C0:[0-9]+]] = kiln.cast %[[W0]] {kiln.precision.rule = "master-weight-copy"} : tensor<3x4xf32> -> tensor<3x4xbf16>
// CHECK: return %[[W0]], {{.*}}, %[[C0]] :

// @train_step reads the copy (an argument) instead of casting w; each
// micro-batch's gradient of the copy goes back to f32 before the sum; the
// new copy is the cast of the new w; no scaler state.
// CHECK-LABEL: func.func @train_step(
// CHECK-SAME: %[[W:[a-z0-9]+]]: tensor<3x4xf32> {kiln.param = "w"}
// CHECK-SAME: %[[LOW:[a-z0-9]+]]: tensor<3x4xbf16> {kiln.state = "lowp:w"}, %{{[a-z0-9]+}}: tensor<4x4xf32> {kiln.input = "x"}
// CHECK-SAME: tensor<3x4xbf16> {kiln.output = "lowp:w"}, tensor<f32> {kiln.output = "loss"}
// CHECK-NOT: kiln.cast %[[W]]
// CHECK: kiln.matmul %{{[0-9]+}}, %[[LOW]] transpose_rhs
// CHECK: %[[G0L:[0-9]+]] = kiln.matmul {{.*}} transpose_lhs : tensor<2x3xbf16>, tensor<2x4xbf16> -> tensor<3x4xbf16>
// CHECK: %[[G0:[0-9]+]] = kiln.cast %[[G0L]] {kiln.precision.rule = "master-weight-grad"} : tensor<3x4xbf16> -> tensor<3x4xf32>
// CHECK: kiln.matmul %{{[0-9]+}}, %[[LOW]] transpose_rhs
// CHECK: %[[G1L:[0-9]+]] = kiln.matmul {{.*}} transpose_lhs : tensor<2x3xbf16>, tensor<2x4xbf16> -> tensor<3x4xbf16>
// CHECK: %[[G1:[0-9]+]] = kiln.cast %[[G1L]] {kiln.precision.rule = "master-weight-grad"} : tensor<3x4xbf16> -> tensor<3x4xf32>
// CHECK: kiln.add %[[G0]], %[[G1]] : tensor<3x4xf32>
// CHECK-NOT: loss_scale
// CHECK: %[[NEWW:[0-9]+]] = kiln.sub %[[W]], %{{[0-9]+}} : tensor<3x4xf32>
// CHECK-NOT: kiln.cast %[[W]]
// CHECK: %[[NEWC:[0-9]+]] = kiln.cast %[[NEWW]] {kiln.precision.rule = "master-weight-copy"} : tensor<3x4xf32> -> tensor<3x4xbf16>
// CHECK: return %[[NEWW]], {{.*}}, %[[NEWC]], {{.*}} :

// @eval_step keeps the plain cast (no state).
// CHECK-LABEL: func.func @eval_step(
// CHECK-SAME: %[[EW:[a-z0-9]+]]: tensor<3x4xf32> {kiln.param = "w"}
// CHECK: kiln.cast %[[EW]] {kiln.precision.rule = "master-weight-copy"}
module attributes {kiln.precision = "bf16", kiln.precision.mode = "kiln", kiln.train = {optimizer = {name = "adamw", lr = 3.750000e-01 : f64, beta1 = 7.500000e-01 : f64, beta2 = 8.750000e-01 : f64, eps = 6.250000e-02 : f64, weight_decay = 5.000000e-01 : f64}, schedule = {name = "constant"}, grad_accum = 2 : i64, steps = 10 : i64}} {
  func.func @forward(%w: tensor<3x4xf32> {kiln.param = "w", kiln.layer = "linear", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 5.000000e-01 : f64}},
                     %b: tensor<3xf32> {kiln.param = "b", kiln.layer = "linear", kiln.init = {kind = "zeros"}},
                     %x: tensor<2x4xf32> {kiln.input = "x"},
                     %t: tensor<2xi32> {kiln.input = "targets"}) -> (tensor<f32> {kiln.output = "loss"}) {
    %wl = kiln.cast %w {kiln.precision.rule = "master-weight-copy"} : tensor<3x4xf32> -> tensor<3x4xbf16>
    %xl = kiln.cast %x {kiln.precision.rule = "gemm-low"} : tensor<2x4xf32> -> tensor<2x4xbf16>
    %1 = kiln.matmul %xl, %wl transpose_rhs : tensor<2x4xbf16>, tensor<3x4xbf16> -> tensor<2x3xbf16>
    %2 = kiln.cast %1 {kiln.precision.rule = "loss-fp32"} : tensor<2x3xbf16> -> tensor<2x3xf32>
    %bb = kiln.broadcast_in_dim %b, dims = [1] : tensor<3xf32> -> tensor<2x3xf32>
    %3 = kiln.add %2, %bb : tensor<2x3xf32>
    %4 = kiln.cross_entropy %3, %t reduction = mean : tensor<2x3xf32>, tensor<2xi32> -> tensor<f32>
    return %4 : tensor<f32>
  }
}

// -----

//===----------------------------------------------------------------------===//
// fp16: the loss scaler; w is read directly and through its copy
//===----------------------------------------------------------------------===//

// CHECK-LABEL: func.func @init(
// CHECK-SAME: tensor<4xf16> {kiln.output = "lowp:w"}, tensor<f32> {kiln.output = "loss_scale"}, tensor<f32> {kiln.output = "scale_good_steps"}, tensor<f32> {kiln.output = "skipped_steps"})
// CHECK: kiln.constant dense<6.553600e+04> : tensor<f32>

// CHECK-LABEL: func.func @train_step(
// CHECK-SAME: %[[W:[a-z0-9]+]]: tensor<4xf32> {kiln.param = "w"}, %[[M:[a-z0-9]+]]: tensor<4xf32> {kiln.state = "m:w"}, %[[V:[a-z0-9]+]]: tensor<4xf32> {kiln.state = "v:w"}, %[[LOW:[a-z0-9]+]]: tensor<4xf16> {kiln.state = "lowp:w"}, %[[S:[a-z0-9]+]]: tensor<f32> {kiln.state = "loss_scale"}, %[[GOOD:[a-z0-9]+]]: tensor<f32> {kiln.state = "scale_good_steps"}, %[[SKIP:[a-z0-9]+]]: tensor<f32> {kiln.state = "skipped_steps"}
// CHECK-SAME: -> (tensor<4xf32> {kiln.output = "w"}, tensor<4xf32> {kiln.output = "m:w"}, tensor<4xf32> {kiln.output = "v:w"}, tensor<4xf16> {kiln.output = "lowp:w"}, tensor<f32> {kiln.output = "loss_scale"}, tensor<f32> {kiln.output = "scale_good_steps"}, tensor<f32> {kiln.output = "skipped_steps"}, tensor<f32> {kiln.output = "loss"}, tensor<f32> {kiln.output = "grad_norm"}, tensor<f32> {kiln.output = "lr"})
// 1/S for unscaling.
// CHECK: %[[INV:[0-9]+]] = kiln.div %{{[0-9]+}}, %[[S]] : tensor<f32>
// CHECK: kiln.mul %[[LOW]], %{{[0-9]+}} : tensor<4xf16>
// CHECK: %[[LOSS:[0-9]+]] = kiln.reduce_sum
// The backward seed is the scale (reduce_sum's gradient broadcasts it).
// CHECK: %[[SEED:[0-9]+]] = kiln.broadcast_in_dim %[[S]], dims = [] : tensor<f32> -> tensor<4xf32>
// CHECK: %[[DIRECT:[0-9]+]] = kiln.mul %[[SEED]], %{{[0-9]+}} : tensor<4xf32>
// CHECK: %[[VIALOW:[0-9]+]] = kiln.cast %{{[0-9]+}} {kiln.precision.rule = "master-weight-grad"} : tensor<4xf16> -> tensor<4xf32>
// CHECK: %[[G:[0-9]+]] = kiln.add %[[DIRECT]], %[[VIALOW]] : tensor<4xf32>
// CHECK: %[[INVB:[0-9]+]] = kiln.broadcast_in_dim %[[INV]], dims = [] : tensor<f32> -> tensor<4xf32>
// CHECK: %[[GU:[0-9]+]] = kiln.mul %[[G]], %[[INVB]] : tensor<4xf32>
// CHECK: kiln.mul %[[GU]], %[[GU]]
// CHECK: %[[NORM:[0-9]+]] = kiln.sqrt
// Adam's t counts applied steps: step - skipped + 1.
// CHECK: %[[IT:[0-9]+]] = kiln.cast %{{[a-z0-9]+}} : tensor<i64> -> tensor<f32>
// CHECK: %[[APPLIED:[0-9]+]] = kiln.sub %[[IT]], %[[SKIP]] : tensor<f32>
// CHECK: %[[T:[0-9]+]] = kiln.add %[[APPLIED]], %{{[0-9]+}} : tensor<f32>
// CHECK: kiln.pow %{{[0-9]+}}, %[[T]]
// CHECK: %[[UPD:[0-9]+]] = kiln.sub %[[W]], %{{[0-9]+}} : tensor<4xf32>
// A step with a non-finite norm keeps w, m and v.
// CHECK: %[[INF:[0-9]+]] = kiln.constant dense<0x7F800000> : tensor<f32>
// CHECK: %[[OKT:[0-9]+]] = kiln.compare lt, %{{[0-9]+}}, %{{[0-9]+}} : tensor<4xf32>
// CHECK: %[[NEWW:[0-9]+]] = kiln.select %[[OKT]], %[[UPD]], %[[W]] : tensor<4xi1>, tensor<4xf32>
// CHECK: %[[NEWM:[0-9]+]] = kiln.select %[[OKT]], %{{[0-9]+}}, %[[M]]
// CHECK: %[[NEWV:[0-9]+]] = kiln.select %[[OKT]], %{{[0-9]+}}, %[[V]]
// The scale: x2 after 2000 clean steps (if finite), x0.5 on a skipped step.
// CHECK: %[[OK:[0-9]+]] = kiln.compare lt, %[[NORM]], %[[INF]] : tensor<f32>
// CHECK: %[[GOOD1:[0-9]+]] = kiln.add %[[GOOD]], %{{[0-9]+}} : tensor<f32>
// CHECK: %[[INTERVAL:[0-9]+]] = kiln.constant dense<2.000000e+03> : tensor<f32>
// CHECK: %[[GROW:[0-9]+]] = kiln.compare ge, %[[GOOD1]], %[[INTERVAL]] : tensor<f32>
// CHECK: %[[TWO:[0-9]+]] = kiln.constant dense<2.000000e+00> : tensor<f32>
// CHECK: %[[GROWN:[0-9]+]] = kiln.mul %[[S]], %[[TWO]] : tensor<f32>
// CHECK: %[[FIN:[0-9]+]] = kiln.compare lt, %[[GROWN]], %[[INF]] : tensor<f32>
// CHECK: %[[GROWN2:[0-9]+]] = kiln.select %[[FIN]], %[[GROWN]], %[[S]]
// CHECK: %[[CLEAN:[0-9]+]] = kiln.select %[[GROW]], %[[GROWN2]], %[[S]]
// CHECK: %[[CLEANGOOD:[0-9]+]] = kiln.select %[[GROW]], %{{[0-9]+}}, %[[GOOD1]]
// CHECK: %[[HALF:[0-9]+]] = kiln.constant dense<5.000000e-01> : tensor<f32>
// CHECK: %[[BACK:[0-9]+]] = kiln.mul %[[S]], %[[HALF]] : tensor<f32>
// CHECK: %[[NEWS:[0-9]+]] = kiln.select %[[OK]], %[[CLEAN]], %[[BACK]]
// CHECK: %[[NEWGOOD:[0-9]+]] = kiln.select %[[OK]], %[[CLEANGOOD]], %{{[0-9]+}}
// CHECK: %[[SKIP1:[0-9]+]] = kiln.add %[[SKIP]], %{{[0-9]+}} : tensor<f32>
// CHECK: %[[NEWSKIP:[0-9]+]] = kiln.select %[[OK]], %[[SKIP]], %[[SKIP1]]
// CHECK: %[[NEWC:[0-9]+]] = kiln.cast %[[NEWW]] {kiln.precision.rule = "master-weight-copy"} : tensor<4xf32> -> tensor<4xf16>
// CHECK: return %[[NEWW]], %[[NEWM]], %[[NEWV]], %[[NEWC]], %[[NEWS]], %[[NEWGOOD]], %[[NEWSKIP]], %[[LOSS]], %[[NORM]],
module attributes {kiln.precision = "fp16", kiln.precision.mode = "kiln", kiln.train = {optimizer = {name = "adam", lr = 3.750000e-01 : f64, beta1 = 7.500000e-01 : f64, beta2 = 8.750000e-01 : f64, eps = 6.250000e-02 : f64, weight_decay = 0.000000e+00 : f64}, schedule = {name = "constant"}, steps = 10 : i64}} {
  func.func @forward(%w: tensor<4xf32> {kiln.param = "w", kiln.init = {kind = "ones"}},
                     %x: tensor<4xf32> {kiln.input = "x"}) -> (tensor<f32> {kiln.output = "loss"}) {
    %wl = kiln.cast %w {kiln.precision.rule = "master-weight-copy"} : tensor<4xf32> -> tensor<4xf16>
    %xl = kiln.cast %x {kiln.precision.rule = "elementwise-low"} : tensor<4xf32> -> tensor<4xf16>
    %p = kiln.mul %wl, %xl : tensor<4xf16>
    %pf = kiln.cast %p {kiln.precision.rule = "reduction-fp32"} : tensor<4xf16> -> tensor<4xf32>
    %q = kiln.mul %pf, %w : tensor<4xf32>
    %l = kiln.reduce_sum %q axes = [0] : tensor<4xf32> -> tensor<f32>
    return %l : tensor<f32>
  }
}

// -----

//===----------------------------------------------------------------------===//
// An explicit static loss_scale at fp32: the scaler without growth/backoff
//===----------------------------------------------------------------------===//

// CHECK-LABEL: func.func @init(
// CHECK-SAME: tensor<f32> {kiln.output = "loss_scale"}
// CHECK: kiln.constant dense<1.024000e+03> : tensor<f32>
// CHECK-LABEL: func.func @train_step(
// CHECK-NOT: lowp:
// CHECK: kiln.constant dense<1.000000e+00> : tensor<f32>
// CHECK: kiln.compare ge
// CHECK: return
module attributes {kiln.train = {optimizer = {name = "sgd", lr = 5.000000e-01 : f64}, loss_scale = {name = "static", init = 1.024000e+03 : f64}, steps = 4 : i64}} {
  func.func @forward(%w: tensor<4xf32> {kiln.param = "w", kiln.init = {kind = "ones"}}) -> (tensor<f32> {kiln.output = "loss"}) {
    %0 = kiln.reduce_sum %w axes = [0] : tensor<4xf32> -> tensor<f32>
    return %0 : tensor<f32>
  }
}
