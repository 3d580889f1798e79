// Every rule kiln-fuse refuses a fusion by, as a remark at the consumer.
// RUN: kiln-opt %s --kiln-fuse=remarks --split-input-file --verify-diagnostics -o /dev/null

func.func @consumer_is_gemm(%x: tensor<8x16xf32>, %w: tensor<16x4xf32>) -> tensor<8x4xf32> {
  %0 = kiln.relu %x : tensor<8x16xf32>
  // expected-remark @below {{not fused with kiln.relu: consumer-is-gemm: a library GEMM reads whole buffers}}
  %1 = kiln.matmul %0, %w : tensor<8x16xf32>, tensor<16x4xf32> -> tensor<8x4xf32>
  // expected-remark @below {{not fused with kiln.matmul: result: the value leaves the function}}
  return %1 : tensor<8x4xf32>
}

// -----

func.func @producer_is_gemm(%x: tensor<8x16xf32>, %w: tensor<16x4xf32>) -> tensor<8xf32> {
  %0 = kiln.matmul %x, %w : tensor<8x16xf32>, tensor<16x4xf32> -> tensor<8x4xf32>
  // expected-remark @below {{not fused with kiln.matmul: producer-is-gemm: only elementwise ops join a GEMM as its epilogue (kiln.reduce_sum is not elementwise)}}
  %1 = kiln.reduce_sum %0 axes = [1] : tensor<8x4xf32> -> tensor<8xf32>
  // expected-remark @below {{result}}
  return %1 : tensor<8xf32>
}

// -----

func.func @two_gemms(%x: tensor<8x16xf32>, %w: tensor<16x4xf32>, %v: tensor<16x4xf32>) -> tensor<8x4xf32> {
  %0 = kiln.matmul %x, %w : tensor<8x16xf32>, tensor<16x4xf32> -> tensor<8x4xf32>
  %1 = kiln.matmul %x, %v : tensor<8x16xf32>, tensor<16x4xf32> -> tensor<8x4xf32>
  // expected-remark @below {{not fused with kiln.matmul: merge: the op joined the kernel of kiln.matmul}}
  %2 = kiln.add %0, %1 : tensor<8x4xf32>
  // expected-remark @below {{result}}
  return %2 : tensor<8x4xf32>
}

// -----

func.func @kinds(%u: tensor<64x16xf32>, %i: tensor<64xi32>) -> tensor<16x16xf32> {
  %0 = kiln.exp %u : tensor<64x16xf32>
  // expected-remark @below {{not fused with kiln.exp: consumer-kind: kiln.scatter_add has no fused kernel form}}
  %1 = kiln.scatter_add %0[%i] axis = 0 : tensor<64x16xf32>, tensor<64xi32> -> tensor<16x16xf32>
  // expected-remark @below {{not fused with kiln.scatter_add: producer-kind: kiln.scatter_add has no fused kernel form}}
  %2 = kiln.neg %1 : tensor<16x16xf32>
  // expected-remark @below {{result}}
  return %2 : tensor<16x16xf32>
}

// -----

// A transpose of dimension 0 mixes rows.
func.func @rows(%x: tensor<8x16xf32>) -> tensor<16x8xf32> {
  %0 = kiln.exp %x : tensor<8x16xf32>
  // expected-remark @below {{not fused with kiln.exp: rows: the ops share no leading row dimension ([16x8] vs rows [8x16])}}
  %1 = kiln.transpose %0 perm = [1, 0] : tensor<8x16xf32> -> tensor<16x8xf32>
  // expected-remark @below {{result}}
  return %1 : tensor<16x8xf32>
}

// -----

// %0's kernel runs before the GEMM that reads it; the adds come later.
func.func @schedule(%x: tensor<8x16xf32>, %w: tensor<16x16xf32>) -> tensor<8x16xf32> {
  %0 = kiln.exp %x : tensor<8x16xf32>
  // expected-remark @below {{not fused with kiln.exp: consumer-is-gemm}}
  %1 = kiln.matmul %0, %w : tensor<8x16xf32>, tensor<16x16xf32> -> tensor<8x16xf32>
  %2 = kiln.neg %x : tensor<8x16xf32>
  // expected-remark @below {{not fused with kiln.exp: schedule: kiln.matmul}}
  %3 = kiln.add %0, %2 : tensor<8x16xf32>
  // expected-remark @below {{not fused with kiln.matmul: merge: the op joined the kernel of kiln.neg}}
  %4 = kiln.add %3, %1 : tensor<8x16xf32>
  // expected-remark @below {{result}}
  return %4 : tensor<8x16xf32>
}

// -----

func.func @reduces_rows(%x: tensor<8x16xf32>) -> tensor<16xf32> {
  %0 = kiln.softmax %x axis = 1 : tensor<8x16xf32>
  // expected-remark @below {{not fused with kiln.softmax: reduces-rows: the producer's kernel is a row reduction; a reduction over its rows starts a new kernel}}
  %1 = kiln.reduce_sum %0 axes = [0] : tensor<8x16xf32> -> tensor<16xf32>
  // expected-remark @below {{result}}
  return %1 : tensor<16xf32>
}

// -----

// An optimizer-style epilogue (reading an argument) stays out of a column
// reduction, and so does an epilogue of another shape.
func.func @column_epilogue(%x: tensor<8x16xf32>, %m: tensor<16xf32>) -> tensor<16xf32> {
  %0 = kiln.reduce_sum %x axes = [0] : tensor<8x16xf32> -> tensor<16xf32>
  // expected-remark @below {{not fused with kiln.reduce_sum: column-epilogue: an epilogue after a column reduction reads no function argument}}
  %1 = kiln.mul %0, %m : tensor<16xf32>
  // expected-remark @below {{result}}
  return %1 : tensor<16xf32>
}

// -----

func.func @column_epilogue_shape(%x: tensor<8x16xf32>) -> tensor<4xf32> {
  %0 = kiln.reduce_sum %x axes = [0] : tensor<8x16xf32> -> tensor<16xf32>
  // expected-remark @below {{not fused with kiln.reduce_sum: column-epilogue: an epilogue after a column reduction works on values of the reduced shape only ([4])}}
  %1 = kiln.slice %0 start = [0] limit = [4] stride = [1] : tensor<16xf32> -> tensor<4xf32>
  // expected-remark @below {{result}}
  return %1 : tensor<4xf32>
}

// -----

func.func @column_sibling(%x: tensor<8x16xf32>) -> tensor<f32> {
  %0 = kiln.reduce_sum %x axes = [0] : tensor<8x16xf32> -> tensor<16xf32>
  // expected-remark @below {{not fused with kiln.reduce_sum: column-sibling: sibling reductions share a kernel only with the same shape and axes}}
  %1 = kiln.reduce_sum %0 axes = [0] : tensor<16xf32> -> tensor<f32>
  // expected-remark @below {{result}}
  return %1 : tensor<f32>
}

// -----

func.func @reduction_epilogue(%x: tensor<8x16x4xf32>) -> tensor<16x4xf32> {
  %0 = kiln.reduce_sum %x axes = [0] : tensor<8x16x4xf32> -> tensor<16x4xf32>
  // expected-remark @below {{not fused with kiln.reduce_sum: reduction-epilogue: after a column reduction only elementwise ops on the reduced values join its kernel}}
  %1 = kiln.softmax %0 axis = 1 : tensor<16x4xf32>
  // expected-remark @below {{result}}
  return %1 : tensor<16x4xf32>
}

// -----

func.func @barrier(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = kiln.exp %x : tensor<8x16xf32>
  %1 = kiln.optimization_barrier %0 : tensor<8x16xf32>
  // expected-remark @below {{not fused with kiln.optimization_barrier: alias: an optimization barrier shares its operand's buffer}}
  %2 = kiln.neg %1 : tensor<8x16xf32>
  // expected-remark @below {{result}}
  return %2 : tensor<8x16xf32>
}

// -----

// Attention's head split is read in place by the batched GEMM.
func.func @head_transpose(%q: tensor<2x8x4x16xf32>, %k: tensor<2x4x8x16xf32>) -> tensor<2x4x8x8xf32> {
  %0 = kiln.neg %q : tensor<2x8x4x16xf32>
  %1 = kiln.transpose %0 perm = [0, 2, 1, 3] : tensor<2x8x4x16xf32> -> tensor<2x4x8x16xf32>
  // expected-remark @below {{not fused with kiln.transpose: transpose-folded: a GEMM reads or writes this head transpose in place (strided layout), so it is no kernel of its own}}
  %2 = kiln.matmul %1, %k transpose_rhs : tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32> -> tensor<2x4x8x8xf32>
  // expected-remark @below {{result}}
  return %2 : tensor<2x4x8x8xf32>
}

// -----

// The bias add feeds a softmax: it fuses with the softmax, not the GEMM.
func.func @epilogue_feeds_reduction(%x: tensor<8x16xf32>, %w: tensor<16x4xf32>, %b: tensor<8x4xf32>) -> tensor<8x4xf32> {
  %0 = kiln.matmul %x, %w : tensor<8x16xf32>, tensor<16x4xf32> -> tensor<8x4xf32>
  // expected-remark @below {{not fused with kiln.matmul: producer-is-gemm: the value feeds a reduction, which fuses with it instead of the GEMM}}
  %1 = kiln.add %0, %b : tensor<8x4xf32>
  %2 = kiln.softmax %1 axis = 1 : tensor<8x4xf32>
  // expected-remark @below {{result}}
  return %2 : tensor<8x4xf32>
}

// -----

// Sibling column reductions of one input share a kernel, except when one
// needs the other's result: they cannot be one pass.
func.func @sibling_cycle(%x: tensor<8x16xf32>) -> (tensor<16xf32>, tensor<16xf32>) {
  %a = kiln.reduce_sum %x axes = [0] : tensor<8x16xf32> -> tensor<16xf32>
  %e = kiln.exp %a : tensor<16xf32>
  // expected-remark @below {{not fused with kiln.exp: column-epilogue}}
  %b1 = kiln.broadcast_in_dim %e, dims = [1] : tensor<16xf32> -> tensor<8x16xf32>
  %m = kiln.mul %x, %b1 : tensor<8x16xf32>
  // expected-remark @below {{not fused with kiln.reduce_sum: cycle: one kernel needs the other's results (directly or through other kernels), so they cannot be one pass}}
  %b = kiln.reduce_sum %m axes = [0] : tensor<8x16xf32> -> tensor<16xf32>
  // expected-remark @below {{result}}
  return %a, %b : tensor<16xf32>, tensor<16xf32>
}

// -----

// A column reduction's kernel writes values of the reduction's input shape
// or of its reduced shape: a member of another shape that another kernel
// reads would be an output without a CUDA form, so the reduction starts a
// kernel of its own.
func.func @column_outputs(%x: tensor<4x4x4xf32>) -> (tensor<4x8x4xf32>, tensor<f32>) {
  %0 = kiln.add %x, %x : tensor<4x4x4xf32>
  %1 = kiln.concat %x, %0 dim = 1 : tensor<4x4x4xf32>, tensor<4x4x4xf32> -> tensor<4x8x4xf32>
  %2 = kiln.abs %0 : tensor<4x4x4xf32>
  // expected-remark @below {{not fused with kiln.abs: column-outputs: kiln.concat's [4x8x4] result is read by other kernels, and a column reduction's kernel writes only values of its input shape [4x4x4] or reduced shape}}
  %3 = kiln.reduce_sum %2 axes = [0, 1, 2] : tensor<4x4x4xf32> -> tensor<f32>
  // expected-remark @below {{not fused with kiln.concat: result}}
  // expected-remark @below {{not fused with kiln.reduce_sum: result}}
  return %1, %3 : tensor<4x8x4xf32>, tensor<f32>
}
