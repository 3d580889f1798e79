// A two-layer classifier as kiln-mixed-precision leaves it in bf16 ("kiln"
// mode), written by hand for test/tools/precision-report.test: three
// master-weight copies and a GEMM operand cast (rule attributes), a user's
// own cast (no rule), the loss kept in fp32.
module attributes {kiln.precision = "bf16", kiln.precision.mode = "kiln", kiln.train = {optimizer = {name = "adam", lr = 1.000000e-02 : f64}, schedule = {name = "constant"}}} {
  func.func @forward(%w1: tensor<16x8xf32> {kiln.param = "w1", kiln.layer = "linear", kiln.init = {kind = "zeros"}},
                     %w2: tensor<4x16xf32> {kiln.param = "w2", kiln.layer = "linear", kiln.init = {kind = "zeros"}},
                     %b2: tensor<4xf32> {kiln.param = "b2", kiln.layer = "linear", kiln.init = {kind = "zeros"}},
                     %x: tensor<32x8xf32> {kiln.input = "x"},
                     %y: tensor<32xi32> {kiln.input = "y"}) -> (tensor<f32> {kiln.output = "loss"}) {
    %w1b = kiln.cast %w1 {kiln.precision.rule = "master-weight-copy"} : tensor<16x8xf32> -> tensor<16x8xbf16> loc("mixed.kiln":3:5)
    %w2b = kiln.cast %w2 {kiln.precision.rule = "master-weight-copy"} : tensor<4x16xf32> -> tensor<4x16xbf16> loc("mixed.kiln":4:5)
    %b2b = kiln.cast %b2 {kiln.precision.rule = "master-weight-copy"} : tensor<4xf32> -> tensor<4xbf16> loc("mixed.kiln":4:5)
    %xb = kiln.cast %x : tensor<32x8xf32> -> tensor<32x8xbf16> loc("mixed.kiln":6:7)
    %h = kiln.matmul %xb, %w1b transpose_rhs : tensor<32x8xbf16>, tensor<16x8xbf16> -> tensor<32x16xbf16> loc("mixed.kiln":7:7)
    %r = kiln.relu %h : tensor<32x16xbf16> loc("mixed.kiln":7:7)
    %o = kiln.matmul %r, %w2b transpose_rhs : tensor<32x16xbf16>, tensor<4x16xbf16> -> tensor<32x4xbf16> loc("mixed.kiln":8:12)
    %bb = kiln.broadcast_in_dim %b2b, dims = [1] : tensor<4xbf16> -> tensor<32x4xbf16> loc("mixed.kiln":8:12)
    %a = kiln.add %o, %bb : tensor<32x4xbf16> loc("mixed.kiln":8:12)
    %af = kiln.cast %a {kiln.precision.rule = "loss-fp32"} : tensor<32x4xbf16> -> tensor<32x4xf32> loc("mixed.kiln":9:10)
    %l = kiln.cross_entropy %af, %y reduction = mean {kiln.precision.rule = "loss-fp32"} : tensor<32x4xf32>, tensor<32xi32> -> tensor<f32> loc("mixed.kiln":9:10)
    return %l : tensor<f32>
  }
}
