// RUN: kiln-opt %s --split-input-file --verify-diagnostics

// One case per verifier / shape-rule error of the kiln dialect.
//
// Ops that implement InferTypeOpAdaptor and spell their result type out
// (reduce_*, matmul, transpose, slice, concat, gather, cross_entropy) report a
// shape-rule error twice: the rule's own message, then "failed to infer
// returned types" from the InferTypeOpInterface verifier. Ops whose result type
// is inferred while parsing (constant, compare, layer_norm, dropout) report the
// rule's message once, as a parse error.

//===----------------------------------------------------------------------===//
// Type constraints
//===----------------------------------------------------------------------===//

func.func @exp_of_integer(%x: tensor<4x8xi32>) {
  // expected-error @+1 {{'kiln.exp' op operand #0 must be statically shaped tensor of 64-bit float or 32-bit float or 16-bit float or bfloat16 type values, but got 'tensor<4x8xi32>'}}
  %0 = kiln.exp %x : tensor<4x8xi32>
  return
}

// -----

func.func @neg_of_bool(%x: tensor<4xi1>) {
  // expected-error @+1 {{'kiln.neg' op operand #0 must be statically shaped tensor of 64-bit float or 32-bit float or 16-bit float or bfloat16 type or 64-bit signless integer or 32-bit signless integer values, but got 'tensor<4xi1>'}}
  %0 = kiln.neg %x : tensor<4xi1>
  return
}

// -----

func.func @dynamic_operand(%x: tensor<?x8xf32>) {
  // expected-error @+1 {{'kiln.tanh' op operand #0 must be statically shaped tensor of 64-bit float or 32-bit float or 16-bit float or bfloat16 type values, but got 'tensor<?x8xf32>'}}
  %0 = kiln.tanh %x : tensor<?x8xf32>
  return
}

// -----

// The verifier rejects a dynamic operand before type inference runs.
func.func @dynamic_transpose_operand(%x: tensor<?x8xf32>) {
  // expected-error @+1 {{'kiln.transpose' op operand #0 must be statically shaped tensor of 64-bit float or 32-bit float or 16-bit float or bfloat16 type or 64-bit signless integer or 32-bit signless integer or 1-bit signless integer values, but got 'tensor<?x8xf32>'}}
  %0 = kiln.transpose %x perm = [1, 0] : tensor<?x8xf32> -> tensor<8x?xf32>
  return
}

// -----

// compare infers its result type while parsing, so the inference sees the
// dynamic operand first.
func.func @dynamic_compare_operand(%x: tensor<?x4xf32>) {
  // expected-error @+1 {{lhs must be a statically shaped tensor}}
  %0 = kiln.compare eq, %x, %x : tensor<?x4xf32>
  return
}

// -----

func.func @unsupported_element_type() {
  // expected-error @+1 {{'kiln.constant' op result #0 must be statically shaped tensor of 64-bit float or 32-bit float or 16-bit float or bfloat16 type or 64-bit signless integer or 32-bit signless integer or 1-bit signless integer values, but got 'tensor<2xi8>'}}
  %0 = kiln.constant dense<1> : tensor<2xi8>
  return
}

// -----

func.func @iota_of_bool() {
  // expected-error @+1 {{'kiln.iota' op result #0 must be statically shaped tensor of 64-bit float or 32-bit float or 16-bit float or bfloat16 type or 64-bit signless integer or 32-bit signless integer values, but got 'tensor<4xi1>'}}
  %0 = kiln.iota dim = 0 : tensor<4xi1>
  return
}

// -----

func.func @reduce_mean_of_integer(%x: tensor<4x8xi32>) {
  // expected-error @+1 {{'kiln.reduce_mean' op operand #0 must be statically shaped tensor of 64-bit float or 32-bit float or 16-bit float or bfloat16 type values, but got 'tensor<4x8xi32>'}}
  %0 = kiln.reduce_mean %x axes = [0] : tensor<4x8xi32> -> tensor<8xi32>
  return
}

// -----

func.func @add_type_mismatch(%x: tensor<4x8xf32>, %y: tensor<4x8xf16>) {
  // expected-error @+1 {{'kiln.add' op requires the same type for all operands and results}}
  %0 = "kiln.add"(%x, %y) : (tensor<4x8xf32>, tensor<4x8xf16>) -> tensor<4x8xf32>
  return
}

// -----

func.func @compare_operand_mismatch(%x: tensor<4x8xf32>, %y: tensor<4x8xi32>) {
  // expected-error @+1 {{'kiln.compare' op requires all operands to have the same type}}
  %0 = "kiln.compare"(%x, %y) {direction = 0 : i32} : (tensor<4x8xf32>, tensor<4x8xi32>) -> tensor<4x8xi1>
  return
}

// -----

func.func @compare_unknown_direction(%x: tensor<4x8xf32>) {
  // expected-error @+1 {{expected string or keyword containing one of the following enum values for attribute 'direction' [eq, ne, lt, le, gt, ge]}}
  %0 = kiln.compare foo, %x, %x : tensor<4x8xf32>
  return
}

// -----

func.func @select_non_bool_predicate(%p: tensor<4x8xf32>, %x: tensor<4x8xf32>) {
  // expected-error @+1 {{'kiln.select' op operand #0 must be statically shaped tensor of 1-bit signless integer values, but got 'tensor<4x8xf32>'}}
  %0 = kiln.select %p, %x, %x : tensor<4x8xf32>, tensor<4x8xf32>
  return
}

// -----

func.func @select_value_mismatch(%p: tensor<4x8xi1>, %x: tensor<4x8xf32>, %y: tensor<4x8xf16>) {
  // expected-error @+1 {{'kiln.select' op failed to verify that all of {on_true, on_false, result} have same type}}
  %0 = "kiln.select"(%p, %x, %y) : (tensor<4x8xi1>, tensor<4x8xf32>, tensor<4x8xf16>) -> tensor<4x8xf32>
  return
}

// -----

func.func @gather_float_indices(%x: tensor<4x8xf32>, %i: tensor<4xf32>) {
  // expected-error @+1 {{'kiln.gather' op operand #1 must be statically shaped tensor of 64-bit signless integer or 32-bit signless integer values, but got 'tensor<4xf32>'}}
  %0 = kiln.gather %x[%i] axis = 0 : tensor<4x8xf32>, tensor<4xf32> -> tensor<4x8xf32>
  return
}

// -----

func.func @dropout_seed_type(%x: tensor<4xf32>, %s: tensor<i32>) {
  // expected-error @+1 {{'kiln.dropout' op operand #1 must be 0D tensor of 64-bit signless integer values, but got 'tensor<i32>'}}
  %0 = kiln.dropout %x, %s rate = 0.1 salt = 0 : tensor<4xf32>, tensor<i32>
  return
}

// -----

func.func @reduce_wrong_result_type(%x: tensor<4x8xf32>) {
  // expected-error @+2 {{'kiln.reduce_sum' op inferred type(s) 'tensor<8xf32>' are incompatible with return type(s) of operation 'tensor<4xf32>'}}
  // expected-error @+1 {{'kiln.reduce_sum' op failed to infer returned types}}
  %0 = kiln.reduce_sum %x axes = [0] : tensor<4x8xf32> -> tensor<4xf32>
  return
}

//===----------------------------------------------------------------------===//
// Constants
//===----------------------------------------------------------------------===//

// -----

// Only reachable in the generic form: the custom form infers the result type
// from the value.
func.func @constant_type_mismatch() {
  // expected-error @+1 {{'kiln.constant' op value has type 'tensor<2xf32>' but the result is 'tensor<3xf32>'}}
  %0 = "kiln.constant"() {value = dense<1.0> : tensor<2xf32>} : () -> tensor<3xf32>
  return
}

// -----

func.func @constant_not_elements() {
  // expected-error @+1 {{'kiln.constant' op attribute 'value' failed to satisfy constraint: constant vector/tensor attribute}}
  %0 = "kiln.constant"() {value = 1.0 : f32} : () -> tensor<f32>
  return
}

// -----

func.func @iota_dim_out_of_range() {
  // expected-error @+1 {{dim 2 is out of range for a tensor of rank 2 (expected 0 <= dim < 2)}}
  %0 = kiln.iota dim = 2 : tensor<2x3xi32>
  return
}

// -----

func.func @iota_dim_negative() {
  // expected-error @+1 {{dim -1 is out of range for a tensor of rank 1 (expected 0 <= dim < 1)}}
  %0 = kiln.iota dim = -1 : tensor<3xi32>
  return
}

//===----------------------------------------------------------------------===//
// Elementwise
//===----------------------------------------------------------------------===//

// -----

func.func @cast_changes_shape(%x: tensor<4x8xf32>) {
  // expected-error @+1 {{'kiln.cast' op changes the shape from [4, 8] to [8, 4]; a cast only changes the element type}}
  %0 = kiln.cast %x : tensor<4x8xf32> -> tensor<8x4xbf16>
  return
}

// -----

func.func @select_predicate_shape(%p: tensor<4x1xi1>, %x: tensor<4x8xf32>) {
  // expected-error @+1 {{'kiln.select' op predicate has shape [4, 1] but the values have shape [4, 8]; broadcast the predicate first}}
  %0 = kiln.select %p, %x, %x : tensor<4x1xi1>, tensor<4x8xf32>
  return
}

//===----------------------------------------------------------------------===//
// broadcast_in_dim
//===----------------------------------------------------------------------===//

// -----

func.func @broadcast_dims_count(%x: tensor<4x8xf32>) {
  // expected-error @+1 {{dims has 1 entries but the operand has rank 2 (one result dim per operand dim)}}
  %0 = kiln.broadcast_in_dim %x, dims = [1] : tensor<4x8xf32> -> tensor<2x4x8xf32>
  return
}

// -----

func.func @broadcast_dim_out_of_range(%x: tensor<8xf32>) {
  // expected-error @+1 {{dims[0] = 2 is out of range for a result of rank 2}}
  %0 = kiln.broadcast_in_dim %x, dims = [2] : tensor<8xf32> -> tensor<4x8xf32>
  return
}

// -----

func.func @broadcast_dims_not_increasing(%x: tensor<4x8xf32>) {
  // expected-error @+1 {{dims must be strictly increasing, got [2, 1]}}
  %0 = kiln.broadcast_in_dim %x, dims = [2, 1] : tensor<4x8xf32> -> tensor<3x8x4xf32>
  return
}

// -----

func.func @broadcast_size_mismatch(%x: tensor<3xf32>) {
  // expected-error @+1 {{operand dim 0 has size 3 but result dim 1 has size 8 (a broadcast dim must have size 1 or match)}}
  %0 = kiln.broadcast_in_dim %x, dims = [1] : tensor<3xf32> -> tensor<4x8xf32>
  return
}

// -----

func.func @broadcast_element_type(%x: tensor<8xf32>) {
  // expected-error @+1 {{'kiln.broadcast_in_dim' op changes the element type from 'f32' to 'f16'}}
  %0 = kiln.broadcast_in_dim %x, dims = [1] : tensor<8xf32> -> tensor<4x8xf16>
  return
}

//===----------------------------------------------------------------------===//
// Reductions
//===----------------------------------------------------------------------===//

// -----

func.func @reduce_axis_out_of_range(%x: tensor<4x8xf32>) {
  // expected-error @+2 {{axis 2 is out of range for a tensor of rank 2 (expected 0 <= axis < 2)}}
  // expected-error @+1 {{'kiln.reduce_sum' op failed to infer returned types}}
  %0 = kiln.reduce_sum %x axes = [2] : tensor<4x8xf32> -> tensor<4xf32>
  return
}

// -----

func.func @reduce_axes_unsorted(%x: tensor<2x3x4xf32>) {
  // expected-error @+2 {{axes must be sorted and unique, got [2, 0]}}
  // expected-error @+1 {{'kiln.reduce_max' op failed to infer returned types}}
  %0 = kiln.reduce_max %x axes = [2, 0] : tensor<2x3x4xf32> -> tensor<3xf32>
  return
}

// -----

func.func @reduce_axes_duplicate(%x: tensor<2x3x4xf32>) {
  // expected-error @+2 {{axes must be sorted and unique, got [1, 1]}}
  // expected-error @+1 {{'kiln.reduce_mean' op failed to infer returned types}}
  %0 = kiln.reduce_mean %x axes = [1, 1] : tensor<2x3x4xf32> -> tensor<2x4xf32>
  return
}

//===----------------------------------------------------------------------===//
// matmul
//===----------------------------------------------------------------------===//

// -----

func.func @matmul_rank(%x: tensor<8xf32>, %w: tensor<8x4xf32>) {
  // expected-error @+2 {{operands must have rank >= 2, got lhs [8] and rhs [8, 4]}}
  // expected-error @+1 {{'kiln.matmul' op failed to infer returned types}}
  %0 = kiln.matmul %x, %w : tensor<8xf32>, tensor<8x4xf32> -> tensor<4xf32>
  return
}

// -----

func.func @matmul_contracting(%x: tensor<2x3xf32>, %w: tensor<4x5xf32>) {
  // expected-error @+2 {{contracting dimensions differ: lhs [2, 3] has K = 3 but rhs [4, 5] has K = 4}}
  // expected-error @+1 {{'kiln.matmul' op failed to infer returned types}}
  %0 = kiln.matmul %x, %w : tensor<2x3xf32>, tensor<4x5xf32> -> tensor<2x5xf32>
  return
}

// -----

func.func @matmul_contracting_transposed(%x: tensor<3x2xf32>, %w: tensor<3x5xf32>) {
  // expected-error @+2 {{contracting dimensions differ: lhs [3, 2] (transposed) has K = 3 but rhs [3, 5] (transposed) has K = 5}}
  // expected-error @+1 {{'kiln.matmul' op failed to infer returned types}}
  %0 = kiln.matmul %x, %w transpose_lhs transpose_rhs : tensor<3x2xf32>, tensor<3x5xf32> -> tensor<2x3xf32>
  return
}

// -----

func.func @matmul_batch(%x: tensor<2x4x8xf32>, %w: tensor<3x8x4xf32>) {
  // expected-error @+2 {{batch dimensions differ: lhs [2] vs rhs [3] (they must be equal, or one side has none)}}
  // expected-error @+1 {{'kiln.matmul' op failed to infer returned types}}
  %0 = kiln.matmul %x, %w : tensor<2x4x8xf32>, tensor<3x8x4xf32> -> tensor<2x4x4xf32>
  return
}

// -----

func.func @matmul_element_type(%x: tensor<4x8xf32>, %w: tensor<8x4xf16>) {
  // expected-error @+2 {{operands have different element types ('f32' and 'f16'); cast one first}}
  // expected-error @+1 {{'kiln.matmul' op failed to infer returned types}}
  %0 = kiln.matmul %x, %w : tensor<4x8xf32>, tensor<8x4xf16> -> tensor<4x4xf32>
  return
}

//===----------------------------------------------------------------------===//
// reshape
//===----------------------------------------------------------------------===//

// -----

func.func @reshape_element_count(%x: tensor<4x8xf32>) {
  // expected-error @+1 {{'kiln.reshape' op cannot reshape [4, 8] (32 elements) to [4, 4] (16 elements)}}
  %0 = kiln.reshape %x : tensor<4x8xf32> -> tensor<4x4xf32>
  return
}

// -----

// An element count that overflows int64 is rejected.
func.func @reshape_element_count_overflow(%x: tensor<4611686018427387904x4xf32>) {
  // expected-error @+1 {{'kiln.reshape' op has a shape whose element count overflows}}
  %0 = kiln.reshape %x : tensor<4611686018427387904x4xf32> -> tensor<2xf32>
  return
}

// -----

func.func @reshape_element_type(%x: tensor<4x8xf32>) {
  // expected-error @+1 {{'kiln.reshape' op changes the element type from 'f32' to 'i32'}}
  %0 = kiln.reshape %x : tensor<4x8xf32> -> tensor<32xi32>
  return
}

//===----------------------------------------------------------------------===//
// transpose
//===----------------------------------------------------------------------===//

// -----

func.func @transpose_wrong_length(%x: tensor<4x8xf32>) {
  // expected-error @+2 {{permutation [0] has 1 entries but the operand has rank 2}}
  // expected-error @+1 {{'kiln.transpose' op failed to infer returned types}}
  %0 = kiln.transpose %x perm = [0] : tensor<4x8xf32> -> tensor<4xf32>
  return
}

// -----

func.func @transpose_duplicate(%x: tensor<4x8xf32>) {
  // expected-error @+2 {{permutation [1, 1] is not a permutation of 0..1}}
  // expected-error @+1 {{'kiln.transpose' op failed to infer returned types}}
  %0 = kiln.transpose %x perm = [1, 1] : tensor<4x8xf32> -> tensor<8x8xf32>
  return
}

// -----

func.func @transpose_out_of_range(%x: tensor<4x8xf32>) {
  // expected-error @+2 {{permutation [0, 2] is not a permutation of 0..1}}
  // expected-error @+1 {{'kiln.transpose' op failed to infer returned types}}
  %0 = kiln.transpose %x perm = [0, 2] : tensor<4x8xf32> -> tensor<4x8xf32>
  return
}

//===----------------------------------------------------------------------===//
// slice
//===----------------------------------------------------------------------===//

// -----

func.func @slice_wrong_counts(%x: tensor<4x8xf32>) {
  // expected-error @+2 {{start, limit and stride need 2 entries each (the operand's rank), got 2, 1 and 2}}
  // expected-error @+1 {{'kiln.slice' op failed to infer returned types}}
  %0 = kiln.slice %x start = [0, 0] limit = [4] stride = [1, 1] : tensor<4x8xf32> -> tensor<4x8xf32>
  return
}

// -----

func.func @slice_stride(%x: tensor<4x8xf32>) {
  // expected-error @+2 {{stride in dim 1 is 0 (expected >= 1)}}
  // expected-error @+1 {{'kiln.slice' op failed to infer returned types}}
  %0 = kiln.slice %x start = [0, 0] limit = [4, 8] stride = [1, 0] : tensor<4x8xf32> -> tensor<4x8xf32>
  return
}

// -----

func.func @slice_limit_past_size(%x: tensor<4x8xf32>) {
  // expected-error @+2 {{dim 1: need 0 <= start (0) <= limit (9) <= size (8)}}
  // expected-error @+1 {{'kiln.slice' op failed to infer returned types}}
  %0 = kiln.slice %x start = [0, 0] limit = [4, 9] stride = [1, 1] : tensor<4x8xf32> -> tensor<4x9xf32>
  return
}

// -----

func.func @slice_start_past_limit(%x: tensor<4x8xf32>) {
  // expected-error @+2 {{dim 0: need 0 <= start (3) <= limit (2) <= size (4)}}
  // expected-error @+1 {{'kiln.slice' op failed to infer returned types}}
  %0 = kiln.slice %x start = [3, 0] limit = [2, 8] stride = [1, 1] : tensor<4x8xf32> -> tensor<0x8xf32>
  return
}

// -----

func.func @slice_negative_start(%x: tensor<4x8xf32>) {
  // expected-error @+2 {{dim 0: need 0 <= start (-1) <= limit (4) <= size (4)}}
  // expected-error @+1 {{'kiln.slice' op failed to infer returned types}}
  %0 = kiln.slice %x start = [-1, 0] limit = [4, 8] stride = [1, 1] : tensor<4x8xf32> -> tensor<5x8xf32>
  return
}

//===----------------------------------------------------------------------===//
// concat
//===----------------------------------------------------------------------===//

// -----

// Only reachable in the generic form: the custom form needs an input type.
func.func @concat_no_inputs() {
  // expected-error @+2 {{needs at least one input}}
  // expected-error @+1 {{'kiln.concat' op failed to infer returned types}}
  %0 = "kiln.concat"() {dim = 0 : i64} : () -> tensor<4xf32>
  return
}

// -----

func.func @concat_rank(%a: tensor<4x3xf32>, %b: tensor<4x3x1xf32>) {
  // expected-error @+2 {{input 1 has rank 3 but input 0 has rank 2}}
  // expected-error @+1 {{'kiln.concat' op failed to infer returned types}}
  %0 = kiln.concat %a, %b dim = 1 : tensor<4x3xf32>, tensor<4x3x1xf32> -> tensor<4x6xf32>
  return
}

// -----

func.func @concat_shape(%a: tensor<4x3xf32>, %b: tensor<5x3xf32>) {
  // expected-error @+2 {{input 1 has shape [5, 3] but input 0 has [4, 3]; only dim 1 may differ}}
  // expected-error @+1 {{'kiln.concat' op failed to infer returned types}}
  %0 = kiln.concat %a, %b dim = 1 : tensor<4x3xf32>, tensor<5x3xf32> -> tensor<4x6xf32>
  return
}

// -----

func.func @concat_dim_out_of_range(%a: tensor<4x3xf32>) {
  // expected-error @+2 {{dim 2 is out of range for a tensor of rank 2 (expected 0 <= dim < 2)}}
  // expected-error @+1 {{'kiln.concat' op failed to infer returned types}}
  %0 = kiln.concat %a, %a dim = 2 : tensor<4x3xf32>, tensor<4x3xf32> -> tensor<4x3xf32>
  return
}

// -----

func.func @concat_element_type(%a: tensor<4x3xf32>, %b: tensor<4x3xf16>) {
  // expected-error @+2 {{inputs have different element types ('f32' and 'f16')}}
  // expected-error @+1 {{'kiln.concat' op failed to infer returned types}}
  %0 = kiln.concat %a, %b dim = 0 : tensor<4x3xf32>, tensor<4x3xf16> -> tensor<8x3xf32>
  return
}

// -----

func.func @concat_size_overflow(%a: tensor<4611686018427387904xf32>) {
  // expected-error @+2 {{concatenated size overflows}}
  // expected-error @+1 {{'kiln.concat' op failed to infer returned types}}
  %0 = kiln.concat %a, %a dim = 0 : tensor<4611686018427387904xf32>, tensor<4611686018427387904xf32> -> tensor<4xf32>
  return
}

//===----------------------------------------------------------------------===//
// gather
//===----------------------------------------------------------------------===//

// -----

func.func @gather_axis(%x: tensor<65x384xf32>, %i: tensor<12xi32>) {
  // expected-error @+2 {{axis 2 is out of range for a tensor of rank 2 (expected 0 <= axis < 2)}}
  // expected-error @+1 {{'kiln.gather' op failed to infer returned types}}
  %0 = kiln.gather %x[%i] axis = 2 : tensor<65x384xf32>, tensor<12xi32> -> tensor<12x384xf32>
  return
}

//===----------------------------------------------------------------------===//
// softmax / log_softmax
//===----------------------------------------------------------------------===//

// -----

func.func @softmax_axis(%x: tensor<4x8xf32>) {
  // expected-error @+1 {{axis 2 is out of range for a tensor of rank 2 (expected 0 <= axis < 2)}}
  %0 = kiln.softmax %x axis = 2 : tensor<4x8xf32>
  return
}

// -----

func.func @log_softmax_axis(%x: tensor<4x8xf32>) {
  // expected-error @+1 {{axis -1 is out of range for a tensor of rank 2 (expected 0 <= axis < 2)}}
  %0 = kiln.log_softmax %x axis = -1 : tensor<4x8xf32>
  return
}

//===----------------------------------------------------------------------===//
// layer_norm (the result type is inferred while parsing)
//===----------------------------------------------------------------------===//

// -----

func.func @layer_norm_rank0(%x: tensor<f32>) {
  // expected-error @+1 {{operand must have rank >= 1}}
  %0 = kiln.layer_norm %x : tensor<f32>
  return
}

// -----

func.func @layer_norm_scale_shape(%x: tensor<4x8xf32>, %g: tensor<4xf32>) {
  // expected-error @+1 {{scale has shape [4] but must be [8] (the normalised last dim)}}
  %0 = kiln.layer_norm %x scale(%g : tensor<4xf32>) : tensor<4x8xf32>
  return
}

// -----

func.func @layer_norm_bias_shape(%x: tensor<4x8xf32>, %g: tensor<8xf32>, %b: tensor<1x8xf32>) {
  // expected-error @+1 {{bias has shape [1, 8] but must be [8] (the normalised last dim)}}
  %0 = kiln.layer_norm %x scale(%g : tensor<8xf32>) bias(%b : tensor<1x8xf32>) : tensor<4x8xf32>
  return
}

// -----

func.func @layer_norm_scale_element_type(%x: tensor<4x8xf32>, %g: tensor<8xf16>) {
  // expected-error @+1 {{scale and bias must have the operand's element type 'f32', got 'f16'}}
  %0 = kiln.layer_norm %x scale(%g : tensor<8xf16>) : tensor<4x8xf32>
  return
}

// -----

func.func @layer_norm_bias_element_type(%x: tensor<4x8xbf16>, %b: tensor<8xf32>) {
  // expected-error @+1 {{scale and bias must have the operand's element type 'bf16', got 'f32'}}
  %0 = kiln.layer_norm %x bias(%b : tensor<8xf32>) : tensor<4x8xbf16>
  return
}

// -----

func.func @layer_norm_dynamic_scale(%x: tensor<4x8xf32>, %g: tensor<?xf32>) {
  // expected-error @+1 {{scale must be a statically shaped tensor}}
  %0 = kiln.layer_norm %x scale(%g : tensor<?xf32>) : tensor<4x8xf32>
  return
}

// -----

func.func @layer_norm_wrong_result(%x: tensor<4x8xf32>) {
  // expected-error @+2 {{'kiln.layer_norm' op inferred type(s) 'tensor<4x8xf32>' are incompatible with return type(s) of operation 'tensor<4x4xf32>'}}
  // expected-error @+1 {{'kiln.layer_norm' op failed to infer returned types}}
  %0 = "kiln.layer_norm"(%x) {operandSegmentSizes = array<i32: 1, 0, 0>} : (tensor<4x8xf32>) -> tensor<4x4xf32>
  return
}

//===----------------------------------------------------------------------===//
// cross_entropy
//===----------------------------------------------------------------------===//

// -----

func.func @cross_entropy_targets_shape(%l: tensor<12x64x65xf32>, %t: tensor<12x65xi32>) {
  // expected-error @+2 {{targets have shape [12, 65] but logits [12, 64, 65] need targets of shape [12, 64] (logits without the class dim)}}
  // expected-error @+1 {{'kiln.cross_entropy' op failed to infer returned types}}
  %0 = kiln.cross_entropy %l, %t reduction = mean : tensor<12x64x65xf32>, tensor<12x65xi32> -> tensor<f32>
  return
}

// -----

func.func @cross_entropy_logits_rank0(%l: tensor<f32>, %t: tensor<i32>) {
  // expected-error @+2 {{logits must have rank >= 1 (classes last)}}
  // expected-error @+1 {{'kiln.cross_entropy' op failed to infer returned types}}
  %0 = kiln.cross_entropy %l, %t reduction = sum : tensor<f32>, tensor<i32> -> tensor<f32>
  return
}

// -----

func.func @cross_entropy_none_is_not_scalar(%l: tensor<4x10xf32>, %t: tensor<4xi32>) {
  // expected-error @+2 {{'kiln.cross_entropy' op inferred type(s) 'tensor<4xf32>' are incompatible with return type(s) of operation 'tensor<f32>'}}
  // expected-error @+1 {{'kiln.cross_entropy' op failed to infer returned types}}
  %0 = kiln.cross_entropy %l, %t reduction = none : tensor<4x10xf32>, tensor<4xi32> -> tensor<f32>
  return
}

//===----------------------------------------------------------------------===//
// dropout
//===----------------------------------------------------------------------===//

// -----

func.func @dropout_negative_rate(%x: tensor<4xf32>, %s: tensor<i64>) {
  // expected-error @+1 {{'kiln.dropout' op rate -5.000000e-01 must be in [0, 1)}}
  %0 = kiln.dropout %x, %s rate = -0.5 salt = 0 : tensor<4xf32>, tensor<i64>
  return
}

// -----

func.func @dropout_rate_one(%x: tensor<4xf32>, %s: tensor<i64>) {
  // expected-error @+1 {{'kiln.dropout' op rate 1.000000e+00 must be in [0, 1)}}
  %0 = kiln.dropout %x, %s rate = 1.0 salt = 0 : tensor<4xf32>, tensor<i64>
  return
}

// -----

func.func @dropout_rate_above_one(%x: tensor<4xf32>, %s: tensor<i64>) {
  // expected-error @+1 {{'kiln.dropout' op rate 1.500000e+00 must be in [0, 1)}}
  %0 = kiln.dropout %x, %s rate = 1.5 salt = 0 : tensor<4xf32>, tensor<i64>
  return
}

//===----------------------------------------------------------------------===//
// Function argument attributes
//===----------------------------------------------------------------------===//

// -----

// expected-error @+1 {{'kiln.param' must be a non-empty string}}
func.func @param_not_string(%w: tensor<4xf32> {kiln.param = 3 : i64}) {
  return
}

// -----

// expected-error @+1 {{'kiln.param' must be a non-empty string}}
func.func @param_empty(%w: tensor<4xf32> {kiln.param = ""}) {
  return
}

// -----

// expected-error @+1 {{'kiln.layer' must be a non-empty string}}
func.func @layer_empty(%w: tensor<4xf32> {kiln.param = "w", kiln.layer = ""}) {
  return
}

// -----

// expected-error @+1 {{'kiln.input' must be a non-empty string}}
func.func @input_not_string(%x: tensor<4xi32> {kiln.input = ["tokens"]}) {
  return
}

// -----

// expected-error @+1 {{'kiln.init' must be a dictionary like {kind = "normal", std = 0.02 : f64}}}
func.func @init_not_dict(%w: tensor<4xf32> {kiln.init = "normal"}) {
  return
}

// -----

// expected-error @+1 {{'kiln.init' needs a string 'kind'}}
func.func @init_missing_kind(%w: tensor<4xf32> {kiln.init = {std = 0.02 : f64}}) {
  return
}

// -----

// expected-error @+1 {{'kiln.init' needs a string 'kind'}}
func.func @init_kind_not_string(%w: tensor<4xf32> {kiln.init = {kind = 1 : i64}}) {
  return
}

// -----

// expected-error @+1 {{'kiln.init' kind 'xavier' is unknown (expected normal, uniform, zeros or ones)}}
func.func @init_unknown_kind(%w: tensor<4xf32> {kiln.init = {kind = "xavier"}}) {
  return
}

// -----

// expected-error @+1 {{'kiln.init' of kind 'normal' has unexpected field 'low'}}
func.func @init_unexpected_field(%w: tensor<4xf32> {kiln.init = {kind = "normal", mean = 0.0 : f64, std = 0.02 : f64, low = 0.0 : f64}}) {
  return
}

// -----

// expected-error @+1 {{'kiln.init' of kind 'zeros' has unexpected field 'std'}}
func.func @init_zeros_with_field(%w: tensor<4xf32> {kiln.init = {kind = "zeros", std = 0.02 : f64}}) {
  return
}

// -----

// expected-error @+1 {{'kiln.init' field 'std' must be a float}}
func.func @init_non_float_field(%w: tensor<4xf32> {kiln.init = {kind = "normal", mean = 0.0 : f64, std = 1 : i64}}) {
  return
}

// -----

// expected-error @+1 {{'kiln.init' of kind 'normal' needs field 'mean'}}
func.func @init_missing_field(%w: tensor<4xf32> {kiln.init = {kind = "normal", std = 0.02 : f64}}) {
  return
}

// -----

// expected-error @+1 {{'kiln.init' of kind 'uniform' needs field 'high'}}
func.func @init_missing_high(%w: tensor<4xf32> {kiln.init = {kind = "uniform", low = -0.1 : f64}}) {
  return
}

// -----

// expected-error @+1 {{unknown kiln argument attribute 'kiln.bogus' (expected kiln.param, kiln.layer, kiln.init, kiln.input, kiln.state, kiln.shard, kiln.tp or kiln.stage)}}
func.func @unknown_arg_attr(%w: tensor<4xf32> {kiln.bogus = "w"}) {
  return
}

// -----

// kiln.output belongs on results, not arguments.
// expected-error @+1 {{unknown kiln argument attribute 'kiln.output' (expected kiln.param, kiln.layer, kiln.init, kiln.input, kiln.state, kiln.shard, kiln.tp or kiln.stage)}}
func.func @output_on_arg(%w: tensor<4xf32> {kiln.output = "loss"}) {
  return
}

//===----------------------------------------------------------------------===//
// Function result attributes
//===----------------------------------------------------------------------===//

// -----

// expected-error @+1 {{'kiln.output' must be a non-empty string}}
func.func @output_not_string(%x: tensor<f32>) -> (tensor<f32> {kiln.output = 1 : i64}) {
  return %x : tensor<f32>
}

// -----

// expected-error @+1 {{'kiln.output' must be a non-empty string}}
func.func @output_empty(%x: tensor<f32>) -> (tensor<f32> {kiln.output = ""}) {
  return %x : tensor<f32>
}

// -----

// expected-error @+1 {{unknown kiln result attribute 'kiln.param' (expected kiln.output or kiln.shard)}}
func.func @unknown_result_attr(%x: tensor<f32>) -> (tensor<f32> {kiln.param = "x"}) {
  return %x : tensor<f32>
}

//===----------------------------------------------------------------------===//
// Module (operation) attributes
//===----------------------------------------------------------------------===//

// -----

// expected-error @+1 {{'kiln.train' must be a dictionary}}
module attributes {kiln.train = "adamw"} {
}

// -----

// expected-error @+1 {{'kiln.dims' must be a dictionary}}
module attributes {kiln.dims = [384, 64]} {
}

// -----

// expected-error @+1 {{'kiln.model' must be a non-empty string}}
module attributes {kiln.model = ""} {
}

// -----

// expected-error @+1 {{'kiln.source' must be a non-empty string}}
module attributes {kiln.source = 7 : i64} {
}

// -----

// expected-error @+1 {{unknown kiln attribute 'kiln.seed'}}
module attributes {kiln.seed = 0 : i64} {
}

// -----

// The operation attribute verifier runs on any op, not only modules.
func.func @unknown_op_attr(%x: tensor<4xf32>) {
  // expected-error @+1 {{unknown kiln attribute 'kiln.param'}}
  %0 = kiln.neg %x {kiln.param = "x"} : tensor<4xf32>
  return
}

// -----

// kiln.shard's tensor-parallel form: dim (and outer) must be integers.
// expected-error @+1 {{a tensor-parallel 'kiln.shard' must be {axis = "tp", shape = array<i64: ...>, dim = D : i64, outer = K : i64} (outer optional)}}
func.func @shard_dim_not_integer(%w: tensor<4x2xf32> {kiln.shard = {axis = "tp", shape = array<i64: 4, 4>, dim = "1"}}) {
  return
}

// -----

// expected-error @+1 {{a tensor-parallel 'kiln.shard' must be}}
func.func @shard_outer_without_dim(%w: tensor<4x2xf32> {kiln.shard = {axis = "tp", shape = array<i64: 4, 4>, outer = 3 : i64}}) {
  return
}

// -----

// expected-error @+1 {{'kiln.shard' must be {axis = "dp", shape = array<i64: ...>}}}
func.func @shard_unknown_key(%w: tensor<4x2xf32> {kiln.shard = {axis = "tp", shape = array<i64: 4, 4>, dim = 1 : i64, stride = 2 : i64}}) {
  return
}
