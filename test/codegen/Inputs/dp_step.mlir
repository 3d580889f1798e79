// A hand-written data-parallel train step over a mesh of 4 devices (what
// the data-parallel pass will produce): least squares with momentum SGD.
// The loss is averaged over dp; the bias gradient (produced first by
// backward) and the weight gradient are each one bucket (kiln.overlap),
// all-reduced as a mean on the communication queue.
module attributes {kiln.mesh = {axes = ["dp"], shape = array<i64: 4>}} {
func.func @train_step(%w: tensor<64x32xf32> {kiln.param = "w"}, %b: tensor<32xf32> {kiln.param = "b"},
                      %mw: tensor<64x32xf32> {kiln.state = "m:w"}, %mb: tensor<32xf32> {kiln.state = "m:b"},
                      %x: tensor<16x64xf32> {kiln.input = "x"}, %y: tensor<16x32xf32> {kiln.input = "y"})
    -> (tensor<64x32xf32> {kiln.output = "w"}, tensor<32xf32> {kiln.output = "b"},
        tensor<64x32xf32> {kiln.output = "m:w"}, tensor<32xf32> {kiln.output = "m:b"},
        tensor<f32> {kiln.output = "loss"}) {
  %p = kiln.matmul %x, %w : tensor<16x64xf32>, tensor<64x32xf32> -> tensor<16x32xf32> loc("dp.kiln":3:7)
  %bb = kiln.broadcast_in_dim %b, dims = [1] : tensor<32xf32> -> tensor<16x32xf32>
  %q = kiln.add %p, %bb : tensor<16x32xf32>
  %d = kiln.sub %q, %y : tensor<16x32xf32>
  %sq = kiln.mul %d, %d : tensor<16x32xf32>
  %l = kiln.reduce_mean %sq axes = [0, 1] : tensor<16x32xf32> -> tensor<f32>
  %loss = kiln.all_reduce %l axis = "dp" reduction = mean : tensor<f32> loc("dp.kiln":4:3)
  %c = kiln.constant dense<0.00390625> : tensor<16x32xf32>
  %gq = kiln.mul %d, %c : tensor<16x32xf32>
  %gb = kiln.reduce_sum %gq axes = [0] : tensor<16x32xf32> -> tensor<32xf32>
  %gbr = kiln.all_reduce %gb axis = "dp" reduction = mean {kiln.overlap} : tensor<32xf32> loc("dp.kiln":5:3)
  %gw = kiln.matmul %x, %gq transpose_lhs : tensor<16x64xf32>, tensor<16x32xf32> -> tensor<64x32xf32>
  %gwr = kiln.all_reduce %gw axis = "dp" reduction = mean {kiln.overlap} : tensor<64x32xf32> loc("dp.kiln":6:3)
  %mu = kiln.constant dense<0.9> : tensor<64x32xf32>
  %lr = kiln.constant dense<0.1> : tensor<64x32xf32>
  %mw1 = kiln.mul %mw, %mu : tensor<64x32xf32>
  %mw2 = kiln.add %mw1, %gwr : tensor<64x32xf32>
  %uw = kiln.mul %mw2, %lr : tensor<64x32xf32>
  %w2 = kiln.sub %w, %uw : tensor<64x32xf32>
  %mub = kiln.constant dense<0.9> : tensor<32xf32>
  %lrb = kiln.constant dense<0.1> : tensor<32xf32>
  %mb1 = kiln.mul %mb, %mub : tensor<32xf32>
  %mb2 = kiln.add %mb1, %gbr : tensor<32xf32>
  %ub = kiln.mul %mb2, %lrb : tensor<32xf32>
  %b2 = kiln.sub %b, %ub : tensor<32xf32>
  return %w2, %b2, %mw2, %mb2, %loss : tensor<64x32xf32>, tensor<32xf32>, tensor<64x32xf32>, tensor<32xf32>, tensor<f32>
}
}
