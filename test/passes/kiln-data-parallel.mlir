// RUN: kiln-opt %s --kiln-train-step=emit-grad=false --kiln-data-parallel | FileCheck %s --check-prefix=DP
// RUN: kiln-opt %s --kiln-train-step=emit-grad=false --kiln-data-parallel="first-bucket-mb=0.00001 bucket-mb=0.00001" | FileCheck %s --check-prefix=BUCKETS
// RUN: kiln-opt %s --kiln-train-step=emit-grad=false --kiln-data-parallel=zero=1 | FileCheck %s --check-prefix=ZERO1
// RUN: kiln-opt %s --kiln-train-step=emit-grad=false --kiln-data-parallel=zero=2 | FileCheck %s --check-prefix=ZERO2
// RUN: kiln-opt %s --kiln-train-step=emit-grad=false --kiln-data-parallel=annotate-sharding=true | FileCheck %s --check-prefix=SHARDING
// RUN: kiln-opt %s --kiln-train-step=emit-grad=false --kiln-data-parallel=grad-reduce=bf16 | FileCheck %s --check-prefix=BF16
// RUN: kiln-opt %s --kiln-train-step=emit-grad=false --kiln-data-parallel="zero=2 grad-reduce=bf16" | FileCheck %s --check-prefix=BF16Z2
// The annotated module re-parses (kiln.sharding and kiln.shard verify).
// RUN: kiln-opt %s --kiln-train-step=emit-grad=false --kiln-data-parallel="zero=2 annotate-sharding=true" | kiln-opt | FileCheck %s --check-prefix=ZERO2

// kiln-data-parallel (passes/parallel/DataParallel.cpp) on a linear classifier,
// dp = 2, Adam: w [3x4] (48 bytes of gradient), b [3] (12 bytes).
// Backward produces b's gradient first, then w's.

// DP-LABEL: func.func @train_step(
// DP-SAME: %[[W:[a-z0-9]+]]: tensor<3x4xf32> {kiln.param = "w"}
// DP-SAME: %[[X:[a-z0-9]+]]: tensor<2x4xf32> {kiln.input = "x"}
// DP-SAME: %[[STEP:[a-z0-9]+]]: tensor<i64> {kiln.input = "step"}, %[[R:[a-z0-9]+]]: tensor<i64> {kiln.input = "replica"}, %[[STOP:[a-z0-9]+]]: tensor<f32> {kiln.input = "stop"}
// One bucket (60 bytes < 1 MiB), right after the last gradient, in
// backward order (b, then w flattened), on the communication queue.
// DP: %[[WF:[0-9]+]] = kiln.reshape %{{[0-9]+}} : tensor<3x4xf32> -> tensor<12xf32>
// DP-NEXT: %[[FLAT:[0-9]+]] = kiln.concat %[[GB:[0-9]+]], %[[WF]] dim = 0 : tensor<3xf32>, tensor<12xf32> -> tensor<15xf32>
// DP-NEXT: %[[RED:[0-9]+]] = kiln.all_reduce %[[FLAT]] axis = "dp" reduction = mean {kiln.bucket = 0 : i64, kiln.overlap} : tensor<15xf32>
// This device's loss, kept for the step's scalar exchange below.
// DP: %[[L1:[0-9]+]] = kiln.reshape %{{[0-9]+}} : tensor<f32> -> tensor<1xf32>
// The bucket is unpacked where its values are first used, so nothing on
// the compute queue waits for the collective before it must.
// DP-NEXT: %[[RWF:[0-9]+]] = kiln.slice %[[RED]] start = [3] limit = [15]
// DP-NEXT: %[[RW:[0-9]+]] = kiln.reshape %[[RWF]] : tensor<12xf32> -> tensor<3x4xf32>
// The norm: this device's block of each reduced gradient (parameter order:
// w's 6 elements, then b padded to 4); its sum of squares joins the loss
// and the stop flag in one all_reduce(sum) of 3 floats (docs/parallel.md
// "Scalars in one exchange"): the loss is its sum / 2, the norm the square
// root of the second, the third the stop output.
// DP: kiln.gather %{{[0-9]+}}[%{{[0-9]+}}] axis = 0 : tensor<2x6xf32>, tensor<1xi64> -> tensor<1x6xf32>
// DP: %[[RB:[0-9]+]] = kiln.slice %[[RED]] start = [0] limit = [3]
// DP-NEXT: kiln.pad %[[RB]] low = [0] high = [1]
// DP: kiln.gather %{{[0-9]+}}[%{{[0-9]+}}] axis = 0 : tensor<2x2xf32>, tensor<1xi64> -> tensor<1x2xf32>
// DP: %[[SQ1:[0-9]+]] = kiln.reshape %{{[0-9]+}} : tensor<f32> -> tensor<1xf32>
// DP-NEXT: %[[STOP1:[0-9]+]] = kiln.reshape %[[STOP]] : tensor<f32> -> tensor<1xf32>
// DP-NEXT: %[[SC:[0-9]+]] = kiln.concat %[[L1]], %[[SQ1]], %[[STOP1]] dim = 0 : tensor<1xf32>, tensor<1xf32>, tensor<1xf32> -> tensor<3xf32>
// DP-NEXT: %[[AR:[0-9]+]] = kiln.all_reduce %[[SC]] axis = "dp" reduction = sum : tensor<3xf32>
// DP-NEXT: %[[S0:[0-9]+]] = kiln.slice %[[AR]] start = [0] limit = [1]
// DP-NEXT: %[[LS:[0-9]+]] = kiln.reshape %[[S0]] : tensor<1xf32> -> tensor<f32>
// DP-NEXT: %[[TWO:[0-9]+]] = kiln.constant dense<2.000000e+00> : tensor<f32>
// DP-NEXT: %[[LOSS:[0-9]+]] = kiln.div %[[LS]], %[[TWO]] : tensor<f32>
// DP-NEXT: %[[S1:[0-9]+]] = kiln.slice %[[AR]] start = [1] limit = [2]
// DP-NEXT: %[[SQ:[0-9]+]] = kiln.reshape %[[S1]] : tensor<1xf32> -> tensor<f32>
// DP-NEXT: %[[NORM:[0-9]+]] = kiln.sqrt %[[SQ]] : tensor<f32>
// DP-NEXT: %[[S2:[0-9]+]] = kiln.slice %[[AR]] start = [2] limit = [3]
// DP-NEXT: %[[STOPS:[0-9]+]] = kiln.reshape %[[S2]] : tensor<1xf32> -> tensor<f32>
// The optimizer reads the reduced gradients; 2 collectives in all.
// DP-NOT: kiln.all_reduce
// DP: kiln.mul %{{[0-9]+}}, %[[RW]] : tensor<3x4xf32>
// DP-NOT: kiln.all_reduce
// DP: return {{.*}}%[[LOSS]], %[[NORM]], %{{[0-9]+}}, %[[STOPS]] :
// DP-NOT: kiln.dp.

// A tiny bucket size: one bucket per gradient.
// BUCKETS-LABEL: func.func @train_step(
// BUCKETS: kiln.all_reduce %{{[0-9]+}} axis = "dp" reduction = mean {kiln.bucket = 0 : i64, kiln.overlap} : tensor<3xf32>
// BUCKETS: kiln.all_reduce %{{[0-9]+}} axis = "dp" reduction = mean {kiln.bucket = 1 : i64, kiln.overlap} : tensor<12xf32>
// BUCKETS-NOT: kiln.bucket = 2

// ZeRO-1: the same all-reduce, then Adam on this device's block (state
// arguments and results are blocks: ceil(12/2) = 6, ceil(3/2) = 2), one
// all-gather of the updated blocks per bucket.
// ZERO1-LABEL: func.func @train_step(
// ZERO1-SAME: tensor<6xf32> {kiln.shard = {axis = "dp", shape = array<i64: 3, 4>}, kiln.state = "m:w"}
// ZERO1-SAME: tensor<2xf32> {kiln.shard = {axis = "dp", shape = array<i64: 3>}, kiln.state = "m:b"}
// ZERO1-SAME: tensor<6xf32> {kiln.shard = {axis = "dp", shape = array<i64: 3, 4>}, kiln.state = "v:w"}
// ZERO1-SAME: -> (tensor<3x4xf32> {kiln.output = "w"}, tensor<3xf32> {kiln.output = "b"}, tensor<6xf32> {kiln.output = "m:w", kiln.shard
// ZERO1: kiln.all_reduce %{{[0-9]+}} axis = "dp" reduction = mean {kiln.bucket = 0 : i64, kiln.overlap} : tensor<15xf32>
// ZERO1-NOT: reduce_scatter
// ZERO1: kiln.all_gather %{{[0-9]+}} axis = "dp" dim = 0 {kiln.bucket = 0 : i64} : tensor<8xf32> -> tensor<16xf32>

// ZeRO-2: the bucket is laid out as [N, blocks] and reduce-scattered.
// ZERO2-LABEL: func.func @train_step(
// ZERO2-SAME: tensor<6xf32> {kiln.shard = {axis = "dp", shape = array<i64: 3, 4>}, kiln.state = "m:w"}
// ZERO2: kiln.concat %{{[0-9]+}}, %{{[0-9]+}} dim = 1 {{.*}}: tensor<2x2xf32>, tensor<2x6xf32> -> tensor<2x8xf32>
// ZERO2: kiln.reduce_scatter %{{[0-9]+}} axis = "dp" reduction = mean dim = 0 {kiln.bucket = 0 : i64, kiln.overlap{{.*}}} : tensor<16xf32> -> tensor<8xf32>
// ZERO2-NOT: kiln.all_reduce {{.*}} tensor<15xf32>
// ZERO2: kiln.all_gather %{{[0-9]+}} axis = "dp" dim = 0 {kiln.bucket = 0 : i64{{.*}}} : tensor<8xf32> -> tensor<16xf32>

// grad-reduce=bf16: the bucket travels in bf16 (cast before, back to f32
// after, where the slices read it); the scalars stay f32.
// BF16-LABEL: func.func @train_step(
// BF16: %[[N:[0-9]+]] = kiln.cast %{{[0-9]+}} : tensor<15xf32> -> tensor<15xbf16>
// BF16-NEXT: %[[R:[0-9]+]] = kiln.all_reduce %[[N]] axis = "dp" reduction = mean {kiln.bucket = 0 : i64, kiln.overlap} : tensor<15xbf16>
// BF16: %[[W:[0-9]+]] = kiln.cast %[[R]] : tensor<15xbf16> -> tensor<15xf32>
// BF16-NEXT: kiln.slice %[[W]] start = [3] limit = [15]
// BF16: kiln.all_reduce %{{[0-9]+}} axis = "dp" reduction = sum : tensor<3xf32>
// BF16Z2-LABEL: func.func @train_step(
// BF16Z2: %[[N:[0-9]+]] = kiln.cast %{{[0-9]+}} : tensor<16xf32> -> tensor<16xbf16>
// BF16Z2-NEXT: %[[RS:[0-9]+]] = kiln.reduce_scatter %[[N]] axis = "dp" reduction = mean dim = 0 {kiln.bucket = 0 : i64, kiln.overlap} : tensor<16xbf16> -> tensor<8xbf16>
// BF16Z2: kiln.cast %[[RS]] : tensor<8xbf16> -> tensor<8xf32>
// BF16Z2: kiln.all_gather %{{[0-9]+}} axis = "dp" dim = 0 {kiln.bucket = 0 : i64{{.*}}} : tensor<8xf32> -> tensor<16xf32>

// The sharding rule table: the batch split propagates, the loss and the
// weight gradient come out partial over dp, the all-reduce makes them
// replicated.
// SHARDING-LABEL: func.func @train_step(
// SHARDING: kiln.matmul %{{[a-z0-9]+}}, %{{[a-z0-9]+}} transpose_rhs {kiln.sharding = [{partial = [], split = {{\[\["dp"\], \[\]\]}}}]}
// SHARDING: kiln.cross_entropy {{.*}} {kiln.sharding = [{partial = ["dp"], split = []}]}
// SHARDING: kiln.matmul {{.*}} transpose_lhs {kiln.sharding = [{partial = ["dp"], split = {{\[\[\], \[\]\]}}}]}
// SHARDING: kiln.all_reduce {{.*}}kiln.sharding = [{partial = [], split = {{\[\[\]\]}}}]

module attributes {kiln.mesh = {axes = ["dp"], shape = array<i64: 2>}, kiln.train = {optimizer = {name = "adam", lr = 1.000000e-02 : f64}, schedule = {name = "constant"}}} {
  func.func @forward(%w: tensor<3x4xf32> {kiln.param = "w", kiln.layer = "linear", kiln.init = {kind = "zeros"}},
                     %b: tensor<3xf32> {kiln.param = "b", kiln.layer = "linear", kiln.init = {kind = "zeros"}},
                     %x: tensor<2x4xf32> {kiln.input = "x"},
                     %y: tensor<2xi32> {kiln.input = "y"}) -> (tensor<f32> {kiln.output = "loss"}) {
    %0 = kiln.matmul %x, %w transpose_rhs : tensor<2x4xf32>, tensor<3x4xf32> -> tensor<2x3xf32>
    %1 = kiln.broadcast_in_dim %b, dims = [1] : tensor<3xf32> -> tensor<2x3xf32>
    %2 = kiln.add %0, %1 : tensor<2x3xf32>
    %3 = kiln.cross_entropy %2, %y reduction = mean : tensor<2x3xf32>, tensor<2xi32> -> tensor<f32>
    return %3 : tensor<f32>
  }
}
