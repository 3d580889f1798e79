// RUN: kiln-opt %s --kiln-train-step --split-input-file | FileCheck %s
// RUN: kiln-opt %s --kiln-train-step=emit-grad=false --split-input-file | FileCheck %s --check-prefix=NOGRAD
// RUN: kiln-opt %s --kiln-train-step=grad-only=true --split-input-file | FileCheck %s --check-prefix=GRADONLY

// The kiln-train-step pass (passes/TrainStep.cpp): @init, @grad, @train_step,
// @eval_step and @predict for tiny @forward functions under different
// `kiln.train` dictionaries (as the frontend writes them, see
// test/frontend/train.kiln). Every formula is in docs/training.md.
//
// Hyper-parameters are exact binary fractions (lr 0.375, betas 0.75 / 0.875,
// eps 0.0625, weight decay 0.5, ...) so that each constant prints exactly and
// differs from the others. The optimizer checks walk the dataflow backwards
// from `sub %param, ...` with CHECK-DAG, so they do not depend on the order
// in which the pass happens to create sibling ops.

// With emit-grad=false there is no @grad, the rest is unchanged.
// NOGRAD: func.func @init
// NOGRAD-NOT: func.func @grad
// NOGRAD: func.func @train_step
// NOGRAD: func.func @eval_step

// With grad-only=true (what --gradcheck builds) there are only @init and @grad.
// GRADONLY: func.func @init
// GRADONLY: func.func @grad
// GRADONLY-NOT: func.func @train_step
// GRADONLY-NOT: func.func @eval_step
// GRADONLY-NOT: func.func @predict

//===----------------------------------------------------------------------===//
// AdamW, constant schedule, dropout, the no-decay group, @predict
//===----------------------------------------------------------------------===//

// @init: parameter i gets kiln.random with salt = i (its position among all
// parameters, whatever their init): normal -> mean + std * r, uniform -> low +
// (high - low) * r; zeros / ones are constants; then m and v, all zero, in
// parameter order.
// CHECK-LABEL: func.func @init(
// CHECK-SAME: %[[SEED:[a-z0-9]+]]: tensor<i64> {kiln.input = "seed"})
// CHECK-SAME: -> (tensor<6x4xf32> {kiln.output = "wte"}, tensor<4xf32> {kiln.output = "ln.weight"}, tensor<4xf32> {kiln.output = "ln.bias"}, tensor<3x4xf32> {kiln.output = "lin.weight"}, tensor<3xf32> {kiln.output = "lin.bias"},
// CHECK-SAME: tensor<6x4xf32> {kiln.output = "m:wte"}, tensor<4xf32> {kiln.output = "m:ln.weight"}, tensor<4xf32> {kiln.output = "m:ln.bias"}, tensor<3x4xf32> {kiln.output = "m:lin.weight"}, tensor<3xf32> {kiln.output = "m:lin.bias"},
// CHECK-SAME: tensor<6x4xf32> {kiln.output = "v:wte"}, tensor<4xf32> {kiln.output = "v:ln.weight"}, tensor<4xf32> {kiln.output = "v:ln.bias"}, tensor<3x4xf32> {kiln.output = "v:lin.weight"}, tensor<3xf32> {kiln.output = "v:lin.bias"})
// CHECK-DAG: %[[RN:[0-9]+]] = kiln.random normal, %[[SEED]] salt = 0 : tensor<i64> -> tensor<6x4xf32>
// CHECK-DAG: %[[STD:[0-9]+]] = kiln.constant dense<5.000000e-01> : tensor<6x4xf32>
// CHECK-DAG: %[[RNS:[0-9]+]] = kiln.mul %[[RN]], %[[STD]] : tensor<6x4xf32>
// CHECK-DAG: %[[WTE0:[0-9]+]] = kiln.add %[[RNS]], %[[MEAN:[0-9]+]] : tensor<6x4xf32>
// CHECK-DAG: %[[MEAN]] = kiln.constant dense<0.000000e+00> : tensor<6x4xf32>
// CHECK-DAG: %[[ONES:[0-9]+]] = kiln.constant dense<1.000000e+00> : tensor<4xf32>
// CHECK-DAG: %[[RU:[0-9]+]] = kiln.random uniform, %[[SEED]] salt = 3 : tensor<i64> -> tensor<3x4xf32>
// CHECK-DAG: %[[RANGE:[0-9]+]] = kiln.constant dense<7.500000e-01> : tensor<3x4xf32>
// CHECK-DAG: %[[LOW:[0-9]+]] = kiln.constant dense<-5.000000e-01> : tensor<3x4xf32>
// CHECK-DAG: %[[RUS:[0-9]+]] = kiln.mul %[[RU]], %[[RANGE]] : tensor<3x4xf32>
// CHECK-DAG: %[[W0:[0-9]+]] = kiln.add %[[RUS]], %[[LOW]] : tensor<3x4xf32>
// CHECK-DAG: kiln.constant dense<0.000000e+00> : tensor<6x4xf32>
// CHECK-DAG: kiln.constant dense<0.000000e+00> : tensor<3x4xf32>
// CHECK-NOT: kiln.random
// CHECK: return %[[WTE0]], %[[ONES]], %{{[0-9]+}}, %[[W0]], %{{[0-9]+}}, %{{[0-9]+}}, %{{[0-9]+}}, %{{[0-9]+}}, %{{[0-9]+}}, %{{[0-9]+}}, %{{[0-9]+}}, %{{[0-9]+}}, %{{[0-9]+}}, %{{[0-9]+}}, %{{[0-9]+}} :

// @grad keeps @forward's arguments, dropout_seed included.
// CHECK-LABEL: func.func @grad(
// CHECK-SAME: %{{[a-z0-9]+}}: tensor<i64> {kiln.input = "dropout_seed"})
// CHECK-SAME: -> (tensor<f32> {kiln.output = "loss"}, tensor<6x4xf32> {kiln.output = "grad:wte"}, tensor<4xf32> {kiln.output = "grad:ln.weight"}, tensor<4xf32> {kiln.output = "grad:ln.bias"}, tensor<3x4xf32> {kiln.output = "grad:lin.weight"}, tensor<3xf32> {kiln.output = "grad:lin.bias"})

// @train_step(params, m, v, inputs without dropout_seed, step) ->
// (params', m', v', loss, grad_norm, lr).
// CHECK-LABEL: func.func @train_step(
// CHECK-SAME: %[[WTE:[a-z0-9]+]]: tensor<6x4xf32> {kiln.param = "wte"}, %[[G:[a-z0-9]+]]: tensor<4xf32> {kiln.param = "ln.weight"}, %[[BLN:[a-z0-9]+]]: tensor<4xf32> {kiln.param = "ln.bias"}, %[[W:[a-z0-9]+]]: tensor<3x4xf32> {kiln.param = "lin.weight"}, %[[B:[a-z0-9]+]]: tensor<3xf32> {kiln.param = "lin.bias"},
// CHECK-SAME: %{{[a-z0-9]+}}: tensor<6x4xf32> {kiln.state = "m:wte"}, %{{[a-z0-9]+}}: tensor<4xf32> {kiln.state = "m:ln.weight"}, %{{[a-z0-9]+}}: tensor<4xf32> {kiln.state = "m:ln.bias"}, %[[MW:[a-z0-9]+]]: tensor<3x4xf32> {kiln.state = "m:lin.weight"}, %[[MB:[a-z0-9]+]]: tensor<3xf32> {kiln.state = "m:lin.bias"},
// CHECK-SAME: %{{[a-z0-9]+}}: tensor<6x4xf32> {kiln.state = "v:wte"}, %{{[a-z0-9]+}}: tensor<4xf32> {kiln.state = "v:ln.weight"}, %{{[a-z0-9]+}}: tensor<4xf32> {kiln.state = "v:ln.bias"}, %[[VW:[a-z0-9]+]]: tensor<3x4xf32> {kiln.state = "v:lin.weight"}, %[[VB:[a-z0-9]+]]: tensor<3xf32> {kiln.state = "v:lin.bias"},
// CHECK-SAME: %[[TOK:[a-z0-9]+]]: tensor<2x5xi32> {kiln.input = "tokens"}, %[[TGT:[a-z0-9]+]]: tensor<2x5xi32> {kiln.input = "targets"}, %[[STEP:[a-z0-9]+]]: tensor<i64> {kiln.input = "step"})
// CHECK-SAME: -> (tensor<6x4xf32> {kiln.output = "wte"}, tensor<4xf32> {kiln.output = "ln.weight"}, tensor<4xf32> {kiln.output = "ln.bias"}, tensor<3x4xf32> {kiln.output = "lin.weight"}, tensor<3xf32> {kiln.output = "lin.bias"},
// CHECK-SAME: tensor<6x4xf32> {kiln.output = "m:wte"}, {{.*}}, tensor<3xf32> {kiln.output = "v:lin.bias"}, tensor<f32> {kiln.output = "loss"}, tensor<f32> {kiln.output = "grad_norm"}, tensor<f32> {kiln.output = "lr"})
//
// The dropout seed is seed * 1000003 + step * grad_accum + k = 7000021 + step;
// forward and backward dropout use it.
// CHECK-DAG: %[[BASE:[0-9]+]] = kiln.constant dense<7000021> : tensor<i64>
// CHECK-DAG: %[[K:[0-9]+]] = kiln.constant dense<1> : tensor<i64>
// CHECK-DAG: %[[SK:[0-9]+]] = kiln.mul %[[STEP]], %[[K]] : tensor<i64>
// CHECK-DAG: %[[DSEED:[0-9]+]] = kiln.add %[[SK]], %[[BASE]] : tensor<i64>
// CHECK: kiln.dropout %{{[0-9]+}}, %[[DSEED]] rate = 1.000000e-01 salt = 1 : tensor<2x5x4xf32>, tensor<i64>
// CHECK: %[[LOSS:[0-9]+]] = kiln.cross_entropy %{{[0-9]+}}, %[[TGT]] reduction = mean
// CHECK: %[[GW:[0-9]+]] = kiln.matmul %{{[0-9]+}}, %{{[0-9]+}} transpose_lhs : tensor<10x3xf32>, tensor<10x4xf32> -> tensor<3x4xf32>
// CHECK-NEXT: kiln.dropout %{{[0-9]+}}, %[[DSEED]] rate = 1.000000e-01 salt = 1 : tensor<2x5x4xf32>, tensor<i64>
// CHECK: kiln.scatter_add %{{[0-9]+}}[%[[TOK]]] axis = 0 : tensor<2x5x4xf32>, tensor<2x5xi32> -> tensor<6x4xf32>
//
// grad_norm = sqrt(sum of squares), returned unclipped; lr is the constant.
// CHECK: kiln.mul %[[GW]], %[[GW]] : tensor<3x4xf32>
// CHECK: %[[NORM:[0-9]+]] = kiln.sqrt %{{[0-9]+}} : tensor<f32>
// CHECK-NEXT: %[[IT:[0-9]+]] = kiln.cast %[[STEP]] : tensor<i64> -> tensor<f32>
// CHECK-NEXT: %[[LR:[0-9]+]] = kiln.constant dense<3.750000e-01> : tensor<f32>
//
// Bias corrections 1 - beta^(step + 1).
// CHECK-DAG: %[[P1:[0-9]+]] = kiln.pow %[[B1C:[0-9]+]], %[[T1:[0-9]+]] : tensor<f32>
// CHECK-DAG: %[[B1C]] = kiln.constant dense<7.500000e-01> : tensor<f32>
// CHECK-DAG: %[[T1]] = kiln.add %[[IT]], %{{[0-9]+}} : tensor<f32>
// CHECK-DAG: %[[BC1:[0-9]+]] = kiln.sub %{{[0-9]+}}, %[[P1]] : tensor<f32>
// CHECK-DAG: %[[P2:[0-9]+]] = kiln.pow %[[B2C:[0-9]+]], %[[T1]] : tensor<f32>
// CHECK-DAG: %[[B2C]] = kiln.constant dense<8.750000e-01> : tensor<f32>
// CHECK-DAG: %[[BC2:[0-9]+]] = kiln.sub %{{[0-9]+}}, %[[P2]] : tensor<f32>
//
// lin.weight (a linear weight matrix: decays), AdamW:
//   p - lr * (m^ / (sqrt(v^) + eps) + wd * p)
// CHECK-DAG: %[[NW:[0-9]+]] = kiln.sub %[[W]], %[[STW:[0-9]+]] : tensor<3x4xf32>
// CHECK-DAG: %[[STW]] = kiln.mul %[[LRW:[0-9]+]], %[[U2W:[0-9]+]] : tensor<3x4xf32>
// CHECK-DAG: %[[LRW]] = kiln.broadcast_in_dim %[[LR]], dims = [] : tensor<f32> -> tensor<3x4xf32>
// CHECK-DAG: %[[U2W]] = kiln.add %[[UW:[0-9]+]], %[[DECW:[0-9]+]] : tensor<3x4xf32>
// CHECK-DAG: %[[DECW]] = kiln.mul %[[WDW:[0-9]+]], %[[W]] : tensor<3x4xf32>
// CHECK-DAG: %[[WDW]] = kiln.broadcast_in_dim %[[WDC:[0-9]+]], dims = [] : tensor<f32> -> tensor<3x4xf32>
// CHECK-DAG: %[[WDC]] = kiln.constant dense<5.000000e-01> : tensor<f32>
// CHECK-DAG: %[[UW]] = kiln.div %[[MHW:[0-9]+]], %[[DENW:[0-9]+]] : tensor<3x4xf32>
// CHECK-DAG: %[[DENW]] = kiln.add %[[SQW:[0-9]+]], %[[EPSW:[0-9]+]] : tensor<3x4xf32>
// CHECK-DAG: %[[EPSW]] = kiln.broadcast_in_dim %[[EPSC:[0-9]+]], dims = [] : tensor<f32> -> tensor<3x4xf32>
// CHECK-DAG: %[[EPSC]] = kiln.constant dense<6.250000e-02> : tensor<f32>
// CHECK-DAG: %[[SQW]] = kiln.sqrt %[[VHW:[0-9]+]] : tensor<3x4xf32>
// CHECK-DAG: %[[VHW]] = kiln.div %[[NVW:[0-9]+]], %[[BC2W:[0-9]+]] : tensor<3x4xf32>
// CHECK-DAG: %[[BC2W]] = kiln.broadcast_in_dim %[[BC2]], dims = [] : tensor<f32> -> tensor<3x4xf32>
// CHECK-DAG: %[[MHW]] = kiln.div %[[NMW:[0-9]+]], %[[BC1W:[0-9]+]] : tensor<3x4xf32>
// CHECK-DAG: %[[BC1W]] = kiln.broadcast_in_dim %[[BC1]], dims = [] : tensor<f32> -> tensor<3x4xf32>
//   m' = beta1 m + (1 - beta1) g,  v' = beta2 v + (1 - beta2) g^2
// CHECK-DAG: %[[NMW]] = kiln.add %[[BMW:[0-9]+]], %[[GMW:[0-9]+]] : tensor<3x4xf32>
// CHECK-DAG: %[[BMW]] = kiln.mul %[[B1W:[0-9]+]], %[[MW]] : tensor<3x4xf32>
// CHECK-DAG: %[[B1W]] = kiln.broadcast_in_dim %[[B1WC:[0-9]+]], dims = [] : tensor<f32> -> tensor<3x4xf32>
// CHECK-DAG: %[[B1WC]] = kiln.constant dense<7.500000e-01> : tensor<f32>
// CHECK-DAG: %[[GMW]] = kiln.mul %[[OB1W:[0-9]+]], %[[GW]] : tensor<3x4xf32>
// CHECK-DAG: %[[OB1W]] = kiln.broadcast_in_dim %[[OB1WC:[0-9]+]], dims = [] : tensor<f32> -> tensor<3x4xf32>
// CHECK-DAG: %[[OB1WC]] = kiln.constant dense<2.500000e-01> : tensor<f32>
// CHECK-DAG: %[[NVW]] = kiln.add %[[BVW:[0-9]+]], %[[GVW:[0-9]+]] : tensor<3x4xf32>
// CHECK-DAG: %[[BVW]] = kiln.mul %[[B2W:[0-9]+]], %[[VW]] : tensor<3x4xf32>
// CHECK-DAG: %[[B2W]] = kiln.broadcast_in_dim %[[B2WC:[0-9]+]], dims = [] : tensor<f32> -> tensor<3x4xf32>
// CHECK-DAG: %[[B2WC]] = kiln.constant dense<8.750000e-01> : tensor<f32>
// CHECK-DAG: %[[GVW]] = kiln.mul %[[OB2W:[0-9]+]], %[[GSQW:[0-9]+]] : tensor<3x4xf32>
// CHECK-DAG: %[[GSQW]] = kiln.mul %[[GW]], %[[GW]] : tensor<3x4xf32>
// CHECK-DAG: %[[OB2W]] = kiln.broadcast_in_dim %[[OB2WC:[0-9]+]], dims = [] : tensor<f32> -> tensor<3x4xf32>
// CHECK-DAG: %[[OB2WC]] = kiln.constant dense<1.250000e-01> : tensor<f32>
//
// The no-decay group: the embedding (rank 2, but not a linear layer), the
// layer-norm weight and bias and the linear bias are updated with the plain
// Adam step p - lr * m^ / (sqrt(v^) + eps): the update is the div itself.
// CHECK-DAG: %[[NWTE:[0-9]+]] = kiln.sub %[[WTE]], %[[STWTE:[0-9]+]] : tensor<6x4xf32>
// CHECK-DAG: %[[STWTE]] = kiln.mul %{{[0-9]+}}, %[[UWTE:[0-9]+]] : tensor<6x4xf32>
// CHECK-DAG: %[[UWTE]] = kiln.div %{{[0-9]+}}, %{{[0-9]+}} : tensor<6x4xf32>
// CHECK-DAG: %[[NG:[0-9]+]] = kiln.sub %[[G]], %[[STG:[0-9]+]] : tensor<4xf32>
// CHECK-DAG: %[[STG]] = kiln.mul %{{[0-9]+}}, %[[UG:[0-9]+]] : tensor<4xf32>
// CHECK-DAG: %[[UG]] = kiln.div %{{[0-9]+}}, %{{[0-9]+}} : tensor<4xf32>
// CHECK-DAG: %[[NBLN:[0-9]+]] = kiln.sub %[[BLN]], %[[STBLN:[0-9]+]] : tensor<4xf32>
// CHECK-DAG: %[[STBLN]] = kiln.mul %{{[0-9]+}}, %[[UBLN:[0-9]+]] : tensor<4xf32>
// CHECK-DAG: %[[UBLN]] = kiln.div %{{[0-9]+}}, %{{[0-9]+}} : tensor<4xf32>
// CHECK-DAG: %[[NB:[0-9]+]] = kiln.sub %[[B]], %[[STB:[0-9]+]] : tensor<3xf32>
// CHECK-DAG: %[[STB]] = kiln.mul %{{[0-9]+}}, %[[UB:[0-9]+]] : tensor<3xf32>
// CHECK-DAG: %[[UB]] = kiln.div %{{[0-9]+}}, %{{[0-9]+}} : tensor<3xf32>
// CHECK-DAG: %[[NMB:[0-9]+]] = kiln.add %[[BMB:[0-9]+]], %{{[0-9]+}} : tensor<3xf32>
// CHECK-DAG: %[[BMB]] = kiln.mul %{{[0-9]+}}, %[[MB]] : tensor<3xf32>
// CHECK-DAG: %[[NVB:[0-9]+]] = kiln.add %[[BVB:[0-9]+]], %{{[0-9]+}} : tensor<3xf32>
// CHECK-DAG: %[[BVB]] = kiln.mul %{{[0-9]+}}, %[[VB]] : tensor<3xf32>
// CHECK: return %[[NWTE]], %[[NG]], %[[NBLN]], %[[NW]], %[[NB]], %{{[0-9]+}}, %{{[0-9]+}}, %{{[0-9]+}}, %[[NMW]], %[[NMB]], %{{[0-9]+}}, %{{[0-9]+}}, %{{[0-9]+}}, %[[NVW]], %[[NVB]], %[[LOSS]], %[[NORM]], %[[LR]] :
//
// Only lin.weight decays: the weight-decay constant is used once.
// CHECK-NOT: kiln.constant dense<5.000000e-01> : tensor<f32>

// @eval_step: no dropout (and no dropout_seed argument), returns the loss.
// CHECK-LABEL: func.func @eval_step(
// CHECK-SAME: %{{[a-z0-9]+}}: tensor<3xf32> {kiln.param = "lin.bias"}, %[[ETOK:[a-z0-9]+]]: tensor<2x5xi32> {kiln.input = "tokens"}, %[[ETGT:[a-z0-9]+]]: tensor<2x5xi32> {kiln.input = "targets"})
// CHECK-SAME: -> (tensor<f32> {kiln.output = "loss"})
// CHECK-NOT: kiln.dropout
// CHECK: %[[ELN:[0-9]+]] = kiln.layer_norm
// CHECK-NEXT: kiln.matmul %[[ELN]], %{{[a-z0-9]+}} transpose_rhs
// CHECK-NOT: kiln.dropout
// CHECK: %[[EL:[0-9]+]] = kiln.cross_entropy %{{[0-9]+}}, %[[ETGT]] reduction = mean
// CHECK-NEXT: return %[[EL]] : tensor<f32>

// @predict: the logits at every position ([B, T, V]; a sampler reads the
// position it needs), no dropout, and the targets argument is dropped.
// CHECK-LABEL: func.func @predict(
// CHECK-SAME: %{{[a-z0-9]+}}: tensor<3xf32> {kiln.param = "lin.bias"}, %{{[a-z0-9]+}}: tensor<2x5xi32> {kiln.input = "tokens"})
// CHECK-SAME: -> (tensor<2x5x3xf32> {kiln.output = "logits"})
// CHECK-NOT: kiln.dropout
// CHECK-NOT: kiln.cross_entropy
// CHECK: %[[PL:[0-9]+]] = kiln.add
// CHECK-NEXT: return %[[PL]] : tensor<2x5x3xf32>
module attributes {kiln.train = {optimizer = {name = "adamw", lr = 3.750000e-01 : f64, beta1 = 7.500000e-01 : f64, beta2 = 8.750000e-01 : f64, eps = 6.250000e-02 : f64, weight_decay = 5.000000e-01 : f64}, schedule = {name = "constant"}, seed = 7 : i64, steps = 10 : i64}} {
  func.func @forward(%wte: tensor<6x4xf32> {kiln.param = "wte", kiln.layer = "embedding", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 5.000000e-01 : f64}},
                     %g: tensor<4xf32> {kiln.param = "ln.weight", kiln.layer = "layer_norm", kiln.init = {kind = "ones"}},
                     %bln: tensor<4xf32> {kiln.param = "ln.bias", kiln.layer = "layer_norm", kiln.init = {kind = "zeros"}},
                     %w: tensor<3x4xf32> {kiln.param = "lin.weight", kiln.layer = "linear", kiln.init = {kind = "uniform", low = -5.000000e-01 : f64, high = 2.500000e-01 : f64}},
                     %b: tensor<3xf32> {kiln.param = "lin.bias", kiln.layer = "linear", kiln.init = {kind = "zeros"}},
                     %tok: tensor<2x5xi32> {kiln.input = "tokens"},
                     %t: tensor<2x5xi32> {kiln.input = "targets"},
                     %seed: tensor<i64> {kiln.input = "dropout_seed"})
      -> (tensor<f32> {kiln.output = "loss"}, tensor<2x5x3xf32> {kiln.output = "logits"}) {
    %e = kiln.gather %wte[%tok] axis = 0 : tensor<6x4xf32>, tensor<2x5xi32> -> tensor<2x5x4xf32>
    %0 = kiln.layer_norm %e scale(%g : tensor<4xf32>) bias(%bln : tensor<4xf32>) : tensor<2x5x4xf32>
    %1 = kiln.dropout %0, %seed rate = 1.000000e-01 salt = 1 : tensor<2x5x4xf32>, tensor<i64>
    %2 = kiln.matmul %1, %w transpose_rhs : tensor<2x5x4xf32>, tensor<3x4xf32> -> tensor<2x5x3xf32>
    %3 = kiln.broadcast_in_dim %b, dims = [2] : tensor<3xf32> -> tensor<2x5x3xf32>
    %4 = kiln.add %2, %3 : tensor<2x5x3xf32>
    %5 = kiln.cross_entropy %4, %t reduction = mean : tensor<2x5x3xf32>, tensor<2x5xi32> -> tensor<f32>
    return %5, %4 : tensor<f32>, tensor<2x5x3xf32>
  }
}

// -----

//===----------------------------------------------------------------------===//
// Adam (L2 weight decay added to the gradient), linear warmup
//===----------------------------------------------------------------------===//

// CHECK-LABEL: func.func @init(
// CHECK-SAME: -> (tensor<3x4xf32> {kiln.output = "lin.weight"}, tensor<3xf32> {kiln.output = "lin.bias"}, tensor<3x4xf32> {kiln.output = "m:lin.weight"}, tensor<3xf32> {kiln.output = "m:lin.bias"}, tensor<3x4xf32> {kiln.output = "v:lin.weight"}, tensor<3xf32> {kiln.output = "v:lin.bias"})
// CHECK-LABEL: func.func @train_step(
// CHECK-SAME: %[[W:[a-z0-9]+]]: tensor<3x4xf32> {kiln.param = "lin.weight"}, %[[B:[a-z0-9]+]]: tensor<3xf32> {kiln.param = "lin.bias"}, %[[MW:[a-z0-9]+]]: tensor<3x4xf32> {kiln.state = "m:lin.weight"}, %[[MB:[a-z0-9]+]]: tensor<3xf32> {kiln.state = "m:lin.bias"}, %[[VW:[a-z0-9]+]]: tensor<3x4xf32> {kiln.state = "v:lin.weight"}, %[[VB:[a-z0-9]+]]: tensor<3xf32> {kiln.state = "v:lin.bias"}, %{{[a-z0-9]+}}: tensor<2x4xf32> {kiln.input = "x"}, %[[STEP:[a-z0-9]+]]: tensor<i64> {kiln.input = "step"})
// CHECK: %[[GB:[0-9]+]] = kiln.reduce_sum %{{[0-9]+}} axes = [0] : tensor<2x3xf32> -> tensor<3xf32>
// CHECK-NEXT: %[[GW:[0-9]+]] = kiln.matmul %{{[0-9]+}}, %{{[a-z0-9]+}} transpose_lhs : tensor<2x3xf32>, tensor<2x4xf32> -> tensor<3x4xf32>
// CHECK: %[[NORM:[0-9]+]] = kiln.sqrt %{{[0-9]+}} : tensor<f32>
//
// linear_warmup(4): lr * min(1, (step + 1) / 4).
// CHECK-NEXT: %[[IT:[0-9]+]] = kiln.cast %[[STEP]] : tensor<i64> -> tensor<f32>
// CHECK-DAG: %[[LRC:[0-9]+]] = kiln.constant dense<3.750000e-01> : tensor<f32>
// CHECK-DAG: %[[WU:[0-9]+]] = kiln.constant dense<4.000000e+00> : tensor<f32>
// CHECK-DAG: %[[S1:[0-9]+]] = kiln.add %[[IT]], %[[ONE:[0-9]+]] : tensor<f32>
// CHECK-DAG: %[[ONE]] = kiln.constant dense<1.000000e+00> : tensor<f32>
// CHECK-DAG: %[[FRAC:[0-9]+]] = kiln.div %[[S1]], %[[WU]] : tensor<f32>
// CHECK-DAG: %[[MIN:[0-9]+]] = kiln.min %{{[0-9]+}}, %[[FRAC]] : tensor<f32>
// CHECK-DAG: %[[LR:[0-9]+]] = kiln.mul %[[LRC]], %[[MIN]] : tensor<f32>
//
// lin.weight: g' = g + wd * p enters both moments; the update has no
// decoupled term.
// CHECK-DAG: %[[NW:[0-9]+]] = kiln.sub %[[W]], %[[STW:[0-9]+]] : tensor<3x4xf32>
// CHECK-DAG: %[[STW]] = kiln.mul %[[LRW:[0-9]+]], %[[UW:[0-9]+]] : tensor<3x4xf32>
// CHECK-DAG: %[[LRW]] = kiln.broadcast_in_dim %[[LR]], dims = [] : tensor<f32> -> tensor<3x4xf32>
// CHECK-DAG: %[[UW]] = kiln.div %[[MHW:[0-9]+]], %{{[0-9]+}} : tensor<3x4xf32>
// CHECK-DAG: %[[MHW]] = kiln.div %[[NMW:[0-9]+]], %{{[0-9]+}} : tensor<3x4xf32>
// CHECK-DAG: %[[NMW]] = kiln.add %{{[0-9]+}}, %[[GMW:[0-9]+]] : tensor<3x4xf32>
// CHECK-DAG: %[[GMW]] = kiln.mul %{{[0-9]+}}, %[[GL2:[0-9]+]] : tensor<3x4xf32>
// CHECK-DAG: %[[GL2]] = kiln.add %[[GW]], %[[L2:[0-9]+]] : tensor<3x4xf32>
// CHECK-DAG: %[[L2]] = kiln.mul %[[WDB:[0-9]+]], %[[W]] : tensor<3x4xf32>
// CHECK-DAG: %[[WDB]] = kiln.broadcast_in_dim %[[WDC:[0-9]+]], dims = [] : tensor<f32> -> tensor<3x4xf32>
// CHECK-DAG: %[[WDC]] = kiln.constant dense<5.000000e-01> : tensor<f32>
// CHECK-DAG: %[[NVW:[0-9]+]] = kiln.add %{{[0-9]+}}, %[[GVW:[0-9]+]] : tensor<3x4xf32>
// CHECK-DAG: %[[GVW]] = kiln.mul %{{[0-9]+}}, %[[GSQ:[0-9]+]] : tensor<3x4xf32>
// CHECK-DAG: %[[GSQ]] = kiln.mul %[[GL2]], %[[GL2]] : tensor<3x4xf32>
// lin.bias: the raw gradient.
// CHECK-DAG: %[[NB:[0-9]+]] = kiln.sub %[[B]], %{{[0-9]+}} : tensor<3xf32>
// CHECK-DAG: %[[NMB:[0-9]+]] = kiln.add %{{[0-9]+}}, %[[GMB:[0-9]+]] : tensor<3xf32>
// CHECK-DAG: %[[GMB]] = kiln.mul %{{[0-9]+}}, %[[GB]] : tensor<3xf32>
// CHECK-DAG: %[[GSQB:[0-9]+]] = kiln.mul %[[GB]], %[[GB]] : tensor<3xf32>
// CHECK-DAG: %[[NVB:[0-9]+]] = kiln.add %{{[0-9]+}}, %[[GVB:[0-9]+]] : tensor<3xf32>
// CHECK-DAG: %[[GVB]] = kiln.mul %{{[0-9]+}}, %[[GSQB]] : tensor<3xf32>
// CHECK: return %[[NW]], %[[NB]], %[[NMW]], %[[NMB]], %[[NVW]], %[[NVB]], %{{[0-9]+}}, %[[NORM]], %[[LR]] :
// CHECK-NOT: kiln.constant dense<5.000000e-01> : tensor<f32>
// No logits: no @predict.
// CHECK-LABEL: func.func @eval_step(
// CHECK-NOT: func.func @predict
module attributes {kiln.train = {optimizer = {name = "adam", lr = 3.750000e-01 : f64, beta1 = 7.500000e-01 : f64, beta2 = 8.750000e-01 : f64, eps = 6.250000e-02 : f64, weight_decay = 5.000000e-01 : f64}, schedule = {name = "linear_warmup", warmup = 4 : i64}}} {
  func.func @forward(%w: tensor<3x4xf32> {kiln.param = "lin.weight", kiln.layer = "linear", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 2.000000e-02 : f64}},
                     %b: tensor<3xf32> {kiln.param = "lin.bias", kiln.layer = "linear", kiln.init = {kind = "zeros"}},
                     %x: tensor<2x4xf32> {kiln.input = "x"}) -> (tensor<f32> {kiln.output = "loss"}) {
    %0 = kiln.matmul %x, %w transpose_rhs : tensor<2x4xf32>, tensor<3x4xf32> -> tensor<2x3xf32>
    %1 = kiln.broadcast_in_dim %b, dims = [1] : tensor<3xf32> -> tensor<2x3xf32>
    %2 = kiln.add %0, %1 : tensor<2x3xf32>
    %3 = kiln.reduce_sum %2 axes = [0, 1] : tensor<2x3xf32> -> tensor<f32>
    return %3 : tensor<f32>
  }
}

// -----

//===----------------------------------------------------------------------===//
// SGD with Nesterov momentum and weight decay, gradient clipping
//===----------------------------------------------------------------------===//

// @init: one "momentum:" slot per parameter, zero.
// CHECK-LABEL: func.func @init(
// CHECK-SAME: -> (tensor<3x4xf32> {kiln.output = "lin.weight"}, tensor<3xf32> {kiln.output = "lin.bias"}, tensor<3x4xf32> {kiln.output = "momentum:lin.weight"}, tensor<3xf32> {kiln.output = "momentum:lin.bias"})
// CHECK-LABEL: func.func @train_step(
// CHECK-SAME: %[[W:[a-z0-9]+]]: tensor<3x4xf32> {kiln.param = "lin.weight"}, %[[B:[a-z0-9]+]]: tensor<3xf32> {kiln.param = "lin.bias"}, %[[BUFW:[a-z0-9]+]]: tensor<3x4xf32> {kiln.state = "momentum:lin.weight"}, %[[BUFB:[a-z0-9]+]]: tensor<3xf32> {kiln.state = "momentum:lin.bias"}, %{{[a-z0-9]+}}: tensor<2x4xf32> {kiln.input = "x"}, %[[STEP:[a-z0-9]+]]: tensor<i64> {kiln.input = "step"})
// CHECK-SAME: -> (tensor<3x4xf32> {kiln.output = "lin.weight"}, tensor<3xf32> {kiln.output = "lin.bias"}, tensor<3x4xf32> {kiln.output = "momentum:lin.weight"}, tensor<3xf32> {kiln.output = "momentum:lin.bias"}, tensor<f32> {kiln.output = "loss"}, tensor<f32> {kiln.output = "grad_norm"}, tensor<f32> {kiln.output = "lr"})
// CHECK: %[[GB:[0-9]+]] = kiln.reduce_sum %{{[0-9]+}} axes = [0] : tensor<2x3xf32> -> tensor<3xf32>
// CHECK-NEXT: %[[GW:[0-9]+]] = kiln.matmul %{{[0-9]+}}, %{{[a-z0-9]+}} transpose_lhs : tensor<2x3xf32>, tensor<2x4xf32> -> tensor<3x4xf32>
//
// grad_norm from the unclipped gradients; factor = min(1, clip / (norm + 1e-6)).
// CHECK-DAG: %[[SQW:[0-9]+]] = kiln.mul %[[GW]], %[[GW]] : tensor<3x4xf32>
// CHECK-DAG: %[[SSW:[0-9]+]] = kiln.reduce_sum %[[SQW]] axes = [0, 1] : tensor<3x4xf32> -> tensor<f32>
// CHECK-DAG: %[[SQB:[0-9]+]] = kiln.mul %[[GB]], %[[GB]] : tensor<3xf32>
// CHECK-DAG: %[[SSB:[0-9]+]] = kiln.reduce_sum %[[SQB]] axes = [0] : tensor<3xf32> -> tensor<f32>
// CHECK-DAG: %[[SS:[0-9]+]] = kiln.add %[[SSW]], %[[SSB]] : tensor<f32>
// CHECK-DAG: %[[NORM:[0-9]+]] = kiln.sqrt %[[SS]] : tensor<f32>
// CHECK-DAG: %[[EPS:[0-9]+]] = kiln.constant dense<9.99999997E-7> : tensor<f32>
// CHECK-DAG: %[[NE:[0-9]+]] = kiln.add %[[NORM]], %[[EPS]] : tensor<f32>
// CHECK-DAG: %[[CLIP:[0-9]+]] = kiln.constant dense<2.500000e-01> : tensor<f32>
// CHECK-DAG: %[[RATIO:[0-9]+]] = kiln.div %[[CLIP]], %[[NE]] : tensor<f32>
// CHECK-DAG: %[[FACTOR:[0-9]+]] = kiln.min %{{[0-9]+}}, %[[RATIO]] : tensor<f32>
// CHECK-DAG: %[[FW:[0-9]+]] = kiln.broadcast_in_dim %[[FACTOR]], dims = [] : tensor<f32> -> tensor<3x4xf32>
// CHECK-DAG: %[[CGW:[0-9]+]] = kiln.mul %[[GW]], %[[FW]] : tensor<3x4xf32>
// CHECK-DAG: %[[FB:[0-9]+]] = kiln.broadcast_in_dim %[[FACTOR]], dims = [] : tensor<f32> -> tensor<3xf32>
// CHECK-DAG: %[[CGB:[0-9]+]] = kiln.mul %[[GB]], %[[FB]] : tensor<3xf32>
//
// lin.weight: g' = clipped g + wd p; buf' = mu buf + g'; u = g' + mu buf'
// (Nesterov); p - lr u. (A constant lr does not read the step: no cast.)
// CHECK-DAG: %[[NW:[0-9]+]] = kiln.sub %[[W]], %[[STW:[0-9]+]] : tensor<3x4xf32>
// CHECK-DAG: %[[STW]] = kiln.mul %{{[0-9]+}}, %[[UW:[0-9]+]] : tensor<3x4xf32>
// CHECK-DAG: %[[UW]] = kiln.add %[[G2W:[0-9]+]], %[[MBW:[0-9]+]] : tensor<3x4xf32>
// CHECK-DAG: %[[MBW]] = kiln.mul %[[MUW:[0-9]+]], %[[NBUFW:[0-9]+]] : tensor<3x4xf32>
// CHECK-DAG: %[[MUW]] = kiln.broadcast_in_dim %[[MUC:[0-9]+]], dims = [] : tensor<f32> -> tensor<3x4xf32>
// CHECK-DAG: %[[MUC]] = kiln.constant dense<7.500000e-01> : tensor<f32>
// CHECK-DAG: %[[NBUFW]] = kiln.add %[[OLDW:[0-9]+]], %[[G2W]] : tensor<3x4xf32>
// CHECK-DAG: %[[OLDW]] = kiln.mul %{{[0-9]+}}, %[[BUFW]] : tensor<3x4xf32>
// CHECK-DAG: %[[G2W]] = kiln.add %[[CGW]], %[[L2:[0-9]+]] : tensor<3x4xf32>
// CHECK-DAG: %[[L2]] = kiln.mul %[[WDB:[0-9]+]], %[[W]] : tensor<3x4xf32>
// CHECK-DAG: %[[WDB]] = kiln.broadcast_in_dim %[[WDC:[0-9]+]], dims = [] : tensor<f32> -> tensor<3x4xf32>
// CHECK-DAG: %[[WDC]] = kiln.constant dense<5.000000e-01> : tensor<f32>
// lin.bias: no decay, the clipped gradient directly.
// CHECK-DAG: %[[NB:[0-9]+]] = kiln.sub %[[B]], %[[STB:[0-9]+]] : tensor<3xf32>
// CHECK-DAG: %[[STB]] = kiln.mul %{{[0-9]+}}, %[[UB:[0-9]+]] : tensor<3xf32>
// CHECK-DAG: %[[UB]] = kiln.add %[[CGB]], %[[MBB:[0-9]+]] : tensor<3xf32>
// CHECK-DAG: %[[MBB]] = kiln.mul %{{[0-9]+}}, %[[NBUFB:[0-9]+]] : tensor<3xf32>
// CHECK-DAG: %[[NBUFB]] = kiln.add %[[OLDB:[0-9]+]], %[[CGB]] : tensor<3xf32>
// CHECK-DAG: %[[OLDB]] = kiln.mul %{{[0-9]+}}, %[[BUFB]] : tensor<3xf32>
// CHECK: return %[[NW]], %[[NB]], %[[NBUFW]], %[[NBUFB]], %{{[0-9]+}}, %[[NORM]], %{{[0-9]+}} :
module attributes {kiln.train = {optimizer = {name = "sgd", lr = 3.750000e-01 : f64, momentum = 7.500000e-01 : f64, nesterov = true, weight_decay = 5.000000e-01 : f64}, schedule = {name = "constant"}, grad_clip = 2.500000e-01 : f64}} {
  func.func @forward(%w: tensor<3x4xf32> {kiln.param = "lin.weight", kiln.layer = "linear", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 2.000000e-02 : f64}},
                     %b: tensor<3xf32> {kiln.param = "lin.bias", kiln.layer = "linear", kiln.init = {kind = "zeros"}},
                     %x: tensor<2x4xf32> {kiln.input = "x"}) -> (tensor<f32> {kiln.output = "loss"}) {
    %0 = kiln.matmul %x, %w transpose_rhs : tensor<2x4xf32>, tensor<3x4xf32> -> tensor<2x3xf32>
    %1 = kiln.broadcast_in_dim %b, dims = [1] : tensor<3xf32> -> tensor<2x3xf32>
    %2 = kiln.add %0, %1 : tensor<2x3xf32>
    %3 = kiln.reduce_sum %2 axes = [0, 1] : tensor<2x3xf32> -> tensor<f32>
    return %3 : tensor<f32>
  }
}

// -----

// SGD with (heavy-ball) momentum, no Nesterov, no decay: u = buf'.
// CHECK-LABEL: func.func @train_step(
// CHECK-SAME: %[[W:[a-z0-9]+]]: tensor<3x4xf32> {kiln.param = "w"}, %[[BUF:[a-z0-9]+]]: tensor<3x4xf32> {kiln.state = "momentum:w"}
// CHECK: %[[GW:[0-9]+]] = kiln.matmul %{{[0-9]+}}, %{{[a-z0-9]+}} transpose_lhs
// CHECK: kiln.sqrt
// CHECK-DAG: %[[NW:[0-9]+]] = kiln.sub %[[W]], %[[STW:[0-9]+]] : tensor<3x4xf32>
// CHECK-DAG: %[[STW]] = kiln.mul %{{[0-9]+}}, %[[NBUF:[0-9]+]] : tensor<3x4xf32>
// CHECK-DAG: %[[NBUF]] = kiln.add %[[OLD:[0-9]+]], %[[GW]] : tensor<3x4xf32>
// CHECK-DAG: %[[OLD]] = kiln.mul %[[MUB:[0-9]+]], %[[BUF]] : tensor<3x4xf32>
// CHECK-DAG: %[[MUB]] = kiln.broadcast_in_dim %[[MU:[0-9]+]], dims = [] : tensor<f32> -> tensor<3x4xf32>
// CHECK-DAG: %[[MU]] = kiln.constant dense<5.000000e-01> : tensor<f32>
// CHECK: return %[[NW]], %[[NBUF]], %{{[0-9]+}}, %{{[0-9]+}}, %{{[0-9]+}} :
module attributes {kiln.train = {optimizer = {name = "sgd", lr = 3.750000e-01 : f64, momentum = 5.000000e-01 : f64, nesterov = false, weight_decay = 0.000000e+00 : f64}, schedule = {name = "constant"}}} {
  func.func @forward(%w: tensor<3x4xf32> {kiln.param = "w", kiln.layer = "linear", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 2.000000e-02 : f64}},
                     %x: tensor<2x4xf32> {kiln.input = "x"}) -> (tensor<f32> {kiln.output = "loss"}) {
    %0 = kiln.matmul %x, %w transpose_rhs : tensor<2x4xf32>, tensor<3x4xf32> -> tensor<2x3xf32>
    %1 = kiln.reduce_sum %0 axes = [0, 1] : tensor<2x3xf32> -> tensor<f32>
    return %1 : tensor<f32>
  }
}

// -----

// Plain SGD (momentum 0): no optimizer state at all; p - lr g.
// CHECK-LABEL: func.func @init(
// CHECK-SAME: -> (tensor<3x4xf32> {kiln.output = "w"})
// CHECK-LABEL: func.func @train_step(
// CHECK-SAME: %[[W:[a-z0-9]+]]: tensor<3x4xf32> {kiln.param = "w"}, %{{[a-z0-9]+}}: tensor<2x4xf32> {kiln.input = "x"}, %{{[a-z0-9]+}}: tensor<i64> {kiln.input = "step"})
// CHECK-SAME: -> (tensor<3x4xf32> {kiln.output = "w"}, tensor<f32> {kiln.output = "loss"}, tensor<f32> {kiln.output = "grad_norm"}, tensor<f32> {kiln.output = "lr"})
// CHECK-NOT: kiln.state
// CHECK: %[[GW:[0-9]+]] = kiln.matmul %{{[0-9]+}}, %{{[a-z0-9]+}} transpose_lhs
// CHECK: %[[LR:[0-9]+]] = kiln.constant dense<3.750000e-01> : tensor<f32>
// CHECK-NEXT: %[[LRB:[0-9]+]] = kiln.broadcast_in_dim %[[LR]], dims = [] : tensor<f32> -> tensor<3x4xf32>
// CHECK-NEXT: %[[ST:[0-9]+]] = kiln.mul %[[LRB]], %[[GW]] : tensor<3x4xf32>
// CHECK-NEXT: %[[NW:[0-9]+]] = kiln.sub %[[W]], %[[ST]] : tensor<3x4xf32>
// CHECK-NEXT: return %[[NW]], %{{[0-9]+}}, %{{[0-9]+}}, %[[LR]] :
module attributes {kiln.train = {optimizer = {name = "sgd", lr = 3.750000e-01 : f64, momentum = 0.000000e+00 : f64, nesterov = false, weight_decay = 0.000000e+00 : f64}, schedule = {name = "constant"}}} {
  func.func @forward(%w: tensor<3x4xf32> {kiln.param = "w", kiln.layer = "linear", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 2.000000e-02 : f64}},
                     %x: tensor<2x4xf32> {kiln.input = "x"}) -> (tensor<f32> {kiln.output = "loss"}) {
    %0 = kiln.matmul %x, %w transpose_rhs : tensor<2x4xf32>, tensor<3x4xf32> -> tensor<2x3xf32>
    %1 = kiln.reduce_sum %0 axes = [0, 1] : tensor<2x3xf32> -> tensor<f32>
    return %1 : tensor<f32>
  }
}

// -----

//===----------------------------------------------------------------------===//
// Cosine schedule, grad_accum = 2
//===----------------------------------------------------------------------===//

// Inputs get a leading dim K * B = 4; micro-batch k is rows [2k, 2k + 2)
// of every data input; dropout in micro-batch k uses seed 5 * 1000003 +
// step * 2 + k. loss = (loss_0 + loss_1) / 2, g = (g_0 + g_1) / 2.
// CHECK-LABEL: func.func @train_step(
// CHECK-SAME: %[[W:[a-z0-9]+]]: tensor<3x4xf32> {kiln.param = "w"}, %{{[a-z0-9]+}}: tensor<3x4xf32> {kiln.state = "m:w"}, %{{[a-z0-9]+}}: tensor<3x4xf32> {kiln.state = "v:w"}, %[[X:[a-z0-9]+]]: tensor<4x4xf32> {kiln.input = "x"}, %[[T:[a-z0-9]+]]: tensor<4xi32> {kiln.input = "targets"}, %[[STEP:[a-z0-9]+]]: tensor<i64> {kiln.input = "step"})
// CHECK: %[[X0:[0-9]+]] = kiln.slice %[[X]] start = [0, 0] limit = [2, 4] stride = [1, 1] : tensor<4x4xf32> -> tensor<2x4xf32>
// CHECK-NEXT: %[[T0:[0-9]+]] = kiln.slice %[[T]] start = [0] limit = [2] stride = [1] : tensor<4xi32> -> tensor<2xi32>
// CHECK-DAG: %[[BASE0:[0-9]+]] = kiln.constant dense<5000015> : tensor<i64>
// CHECK-DAG: %[[K0:[0-9]+]] = kiln.constant dense<2> : tensor<i64>
// CHECK-DAG: %[[SK0:[0-9]+]] = kiln.mul %[[STEP]], %[[K0]] : tensor<i64>
// CHECK-DAG: %[[SEED0:[0-9]+]] = kiln.add %[[SK0]], %[[BASE0]] : tensor<i64>
// CHECK: kiln.dropout %[[X0]], %[[SEED0]] rate = 2.500000e-01 salt = 3
// CHECK: %[[L0:[0-9]+]] = kiln.cross_entropy %{{[0-9]+}}, %[[T0]] reduction = mean : tensor<2x3xf32>, tensor<2xi32> -> tensor<f32>
// CHECK: %[[G0:[0-9]+]] = kiln.matmul %{{[0-9]+}}, %{{[0-9]+}} transpose_lhs : tensor<2x3xf32>, tensor<2x4xf32> -> tensor<3x4xf32>
// CHECK-NEXT: %[[X1:[0-9]+]] = kiln.slice %[[X]] start = [2, 0] limit = [4, 4] stride = [1, 1] : tensor<4x4xf32> -> tensor<2x4xf32>
// CHECK-NEXT: %[[T1:[0-9]+]] = kiln.slice %[[T]] start = [2] limit = [4] stride = [1] : tensor<4xi32> -> tensor<2xi32>
// CHECK-DAG: %[[BASE1:[0-9]+]] = kiln.constant dense<5000016> : tensor<i64>
// CHECK-DAG: %[[K1:[0-9]+]] = kiln.constant dense<2> : tensor<i64>
// CHECK-DAG: %[[SK1:[0-9]+]] = kiln.mul %[[STEP]], %[[K1]] : tensor<i64>
// CHECK-DAG: %[[SEED1:[0-9]+]] = kiln.add %[[SK1]], %[[BASE1]] : tensor<i64>
// CHECK: kiln.dropout %[[X1]], %[[SEED1]] rate = 2.500000e-01 salt = 3
// CHECK: %[[L1:[0-9]+]] = kiln.cross_entropy %{{[0-9]+}}, %[[T1]] reduction = mean : tensor<2x3xf32>, tensor<2xi32> -> tensor<f32>
// CHECK: %[[G1:[0-9]+]] = kiln.matmul %{{[0-9]+}}, %{{[0-9]+}} transpose_lhs : tensor<2x3xf32>, tensor<2x4xf32> -> tensor<3x4xf32>
// CHECK-NEXT: %[[LS:[0-9]+]] = kiln.add %[[L0]], %[[L1]] : tensor<f32>
// CHECK-NEXT: %[[GS:[0-9]+]] = kiln.add %[[G0]], %[[G1]] : tensor<3x4xf32>
// CHECK-DAG: %[[HALF:[0-9]+]] = kiln.constant dense<5.000000e-01> : tensor<f32>
// CHECK-DAG: %[[LOSS:[0-9]+]] = kiln.mul %[[LS]], %[[HALF]] : tensor<f32>
// CHECK-DAG: %[[HALFW:[0-9]+]] = kiln.broadcast_in_dim %{{[0-9]+}}, dims = [] : tensor<f32> -> tensor<3x4xf32>
// CHECK-DAG: %[[G:[0-9]+]] = kiln.mul %[[GS]], %[[HALFW]] : tensor<3x4xf32>
// CHECK-DAG: %[[SQ:[0-9]+]] = kiln.mul %[[G]], %[[G]] : tensor<3x4xf32>
// CHECK: %[[NORM:[0-9]+]] = kiln.sqrt %{{[0-9]+}} : tensor<f32>
//
// cosine(warmup = 3, min_lr = 0.125, decay_steps = 11), lr = 0.375:
//   s < 3:  lr (s + 1) / 4;  s > 11: min_lr;
//   else:   min_lr + 0.5 (1 + cos(pi (s - 3) / 8)) (lr - min_lr)
// CHECK-NEXT: %[[IT:[0-9]+]] = kiln.cast %[[STEP]] : tensor<i64> -> tensor<f32>
// CHECK-DAG: %[[WARM:[0-9]+]] = kiln.mul %[[LRC:[0-9]+]], %[[WFRAC:[0-9]+]] : tensor<f32>
// CHECK-DAG: %[[LRC]] = kiln.constant dense<3.750000e-01> : tensor<f32>
// CHECK-DAG: %[[WFRAC]] = kiln.div %[[S1:[0-9]+]], %[[WP1:[0-9]+]] : tensor<f32>
// CHECK-DAG: %[[S1]] = kiln.add %[[IT]], %{{[0-9]+}} : tensor<f32>
// CHECK-DAG: %[[WP1]] = kiln.constant dense<4.000000e+00> : tensor<f32>
// CHECK-DAG: %[[SW:[0-9]+]] = kiln.sub %[[IT]], %[[WC:[0-9]+]] : tensor<f32>
// CHECK-DAG: %[[WC]] = kiln.constant dense<3.000000e+00> : tensor<f32>
// CHECK-DAG: %[[RATIO:[0-9]+]] = kiln.div %[[SW]], %[[SPAN:[0-9]+]] : tensor<f32>
// CHECK-DAG: %[[SPAN]] = kiln.constant dense<8.000000e+00> : tensor<f32>
// CHECK-DAG: %[[ANGLE:[0-9]+]] = kiln.mul %[[PI:[0-9]+]], %[[RATIO]] : tensor<f32>
// CHECK-DAG: %[[PI]] = kiln.constant dense<3.14159274> : tensor<f32>
// CHECK-DAG: %[[COS:[0-9]+]] = kiln.cos %[[ANGLE]] : tensor<f32>
// CHECK-DAG: %[[OPC:[0-9]+]] = kiln.add %{{[0-9]+}}, %[[COS]] : tensor<f32>
// CHECK-DAG: %[[COEF:[0-9]+]] = kiln.mul %{{[0-9]+}}, %[[OPC]] : tensor<f32>
// CHECK-DAG: %[[SCALED:[0-9]+]] = kiln.mul %[[COEF]], %[[DIFF:[0-9]+]] : tensor<f32>
// CHECK-DAG: %[[DIFF]] = kiln.constant dense<2.500000e-01> : tensor<f32>
// CHECK-DAG: %[[DECAY:[0-9]+]] = kiln.add %[[MINLR:[0-9]+]], %[[SCALED]] : tensor<f32>
// CHECK-DAG: %[[MINLR]] = kiln.constant dense<1.250000e-01> : tensor<f32>
// CHECK-DAG: %[[PAST:[0-9]+]] = kiln.compare gt, %[[IT]], %[[DC:[0-9]+]] : tensor<f32>
// CHECK-DAG: %[[DC]] = kiln.constant dense<1.100000e+01> : tensor<f32>
// CHECK-DAG: %[[AFTER:[0-9]+]] = kiln.select %[[PAST]], %{{[0-9]+}}, %[[DECAY]] : tensor<i1>, tensor<f32>
// CHECK-DAG: %[[EARLY:[0-9]+]] = kiln.compare lt, %[[IT]], %{{[0-9]+}} : tensor<f32>
// CHECK-DAG: %[[LR:[0-9]+]] = kiln.select %[[EARLY]], %[[WARM]], %[[AFTER]] : tensor<i1>, tensor<f32>
// CHECK: return %{{[0-9]+}}, %{{[0-9]+}}, %{{[0-9]+}}, %[[LOSS]], %[[NORM]], %[[LR]] :
//
// @eval_step takes one micro-batch and no dropout.
// CHECK-LABEL: func.func @eval_step(
// CHECK-SAME: %{{[a-z0-9]+}}: tensor<2x4xf32> {kiln.input = "x"}, %{{[a-z0-9]+}}: tensor<2xi32> {kiln.input = "targets"})
// CHECK-NOT: kiln.dropout
// CHECK: return
module attributes {kiln.train = {optimizer = {name = "adam", lr = 3.750000e-01 : f64, beta1 = 7.500000e-01 : f64, beta2 = 8.750000e-01 : f64, eps = 6.250000e-02 : f64, weight_decay = 0.000000e+00 : f64}, schedule = {name = "cosine", warmup = 3 : i64, min_lr = 1.250000e-01 : f64, decay_steps = 11 : i64}, grad_accum = 2 : i64, seed = 5 : i64, steps = 20 : i64}} {
  func.func @forward(%w: tensor<3x4xf32> {kiln.param = "w", kiln.layer = "linear", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 2.000000e-02 : f64}},
                     %x: tensor<2x4xf32> {kiln.input = "x"},
                     %t: tensor<2xi32> {kiln.input = "targets"},
                     %seed: tensor<i64> {kiln.input = "dropout_seed"}) -> (tensor<f32> {kiln.output = "loss"}) {
    %0 = kiln.dropout %x, %seed rate = 2.500000e-01 salt = 3 : tensor<2x4xf32>, tensor<i64>
    %1 = kiln.matmul %0, %w transpose_rhs : tensor<2x4xf32>, tensor<3x4xf32> -> tensor<2x3xf32>
    %2 = kiln.cross_entropy %1, %t reduction = mean : tensor<2x3xf32>, tensor<2xi32> -> tensor<f32>
    return %2 : tensor<f32>
  }
}

// -----

// cosine without decay_steps uses `steps` (here 20; span 20 - 0 = 20) and
// warmup 0 (s < 0 never holds).
// CHECK-LABEL: func.func @train_step(
// CHECK: %[[IT:[0-9]+]] = kiln.cast
// CHECK-DAG: kiln.constant dense<2.000000e+01> : tensor<f32>
// CHECK-DAG: kiln.compare gt, %[[IT]], %{{[0-9]+}} : tensor<f32>
// CHECK-DAG: kiln.compare lt, %[[IT]], %{{[0-9]+}} : tensor<f32>
// CHECK-DAG: kiln.cos
// CHECK: return
module attributes {kiln.train = {optimizer = {name = "adamw", lr = 1.000000e-03 : f64, beta1 = 9.000000e-01 : f64, beta2 = 9.990000e-01 : f64, eps = 1.000000e-08 : f64, weight_decay = 1.000000e-02 : f64}, schedule = {name = "cosine", warmup = 0 : i64, min_lr = 0.000000e+00 : f64}, steps = 20 : i64}} {
  func.func @forward(%w: tensor<3xf32> {kiln.param = "w", kiln.init = {kind = "normal", mean = 0.0 : f64, std = 2.000000e-02 : f64}}) -> (tensor<f32> {kiln.output = "loss"}) {
    %0 = kiln.reduce_sum %w axes = [0] : tensor<3xf32> -> tensor<f32>
    return %0 : tensor<f32>
  }
}
