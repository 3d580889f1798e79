// A hand-written train step with tensor-parallel parameters on a mesh
// dp x tp = 2 x 2: w [4, 4] split on dim 1 (local [4, 2]) and a fused q/k/v
// weight [12, 2] split on dim 0 in 3 parts (local [6, 2]); the bias is
// replicated. The update is a stand-in: the plan's buffers are the point.
// @init returns the logical tensors (the artifact stores them whole).
module attributes {kiln.mesh = {axes = ["dp", "tp"], shape = array<i64: 2, 2>}} {
func.func @init(%seed: tensor<i64>) -> (tensor<4x4xf32> {kiln.output = "w"}, tensor<12x2xf32> {kiln.output = "qkv"},
                      tensor<2xf32> {kiln.output = "b"}) {
  %w = kiln.constant dense<1.0> : tensor<4x4xf32>
  %qkv = kiln.constant dense<2.0> : tensor<12x2xf32>
  %b = kiln.constant dense<3.0> : tensor<2xf32>
  return %w, %qkv, %b : tensor<4x4xf32>, tensor<12x2xf32>, tensor<2xf32>
}
func.func @train_step(
    %w: tensor<4x2xf32> {kiln.param = "w",
                         kiln.shard = {axis = "tp", shape = array<i64: 4, 4>, dim = 1 : i64}},
    %qkv: tensor<6x2xf32> {kiln.param = "qkv",
                           kiln.shard = {axis = "tp", shape = array<i64: 12, 2>, dim = 0 : i64,
                                         outer = 3 : i64}},
    %b: tensor<2xf32> {kiln.param = "b"})
    -> (tensor<4x2xf32> {kiln.output = "w"}, tensor<6x2xf32> {kiln.output = "qkv"},
        tensor<2xf32> {kiln.output = "b"}) {
  %h = kiln.constant dense<0.5> : tensor<4x2xf32>
  %w2 = kiln.mul %w, %h : tensor<4x2xf32>
  %q = kiln.constant dense<0.25> : tensor<6x2xf32>
  %qkv2 = kiln.sub %qkv, %q : tensor<6x2xf32>
  %c = kiln.constant dense<0.125> : tensor<2xf32>
  %b2 = kiln.sub %b, %c : tensor<2xf32>
  return %w2, %qkv2, %b2 : tensor<4x2xf32>, tensor<6x2xf32>, tensor<2xf32>
}
}
