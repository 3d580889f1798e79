//===- KilnOps.td - Operations of the kiln dialect ---------*- tablegen -*-===//
//
// One def per op. Shape rules live in ShapeRules.cpp as free functions shared
// by the verifiers and result-type inference.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_OPS_TD
#define KILN_OPS_TD

include "dialects/kiln/KilnDialect.td"
include "dialects/kiln/KilnEnums.td"
include "dialects/kiln/KilnInterfaces.td"
include "mlir/IR/BuiltinAttributeInterfaces.td"
include "mlir/Interfaces/InferTypeOpInterface.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

//===----------------------------------------------------------------------===//
// Every op but the kernel-level kiln.fusion and kiln.yield answers the rule
// interfaces (dialects/kiln/OpRules.h); its family file in
// dialects/kiln/ops/ defines the answers.
//===----------------------------------------------------------------------===//

class Kiln_ComputeOp<string mnemonic, list<Trait> traits = []>
    : Kiln_Op<mnemonic, !listconcat(traits,
        [DeclareOpInterfaceMethods<Kiln_ShardingOpInterface>,
         DeclareOpInterfaceMethods<Kiln_PrecisionOpInterface>,
         DeclareOpInterfaceMethods<Kiln_RowLocalityOpInterface>,
         DeclareOpInterfaceMethods<Kiln_IndexUseOpInterface>])>;

//===----------------------------------------------------------------------===//
// Types
//===----------------------------------------------------------------------===//

def Kiln_Tensor : StaticShapeTensorOf<[F64, F32, F16, BF16, I64, I32, I1]>;
def Kiln_FloatTensor : StaticShapeTensorOf<[F64, F32, F16, BF16]>;
def Kiln_IntTensor : StaticShapeTensorOf<[I64, I32]>;
def Kiln_NumTensor : StaticShapeTensorOf<[F64, F32, F16, BF16, I64, I32]>;
def Kiln_BoolTensor : StaticShapeTensorOf<[I1]>;
def Kiln_SeedTensor : 0DTensorOf<[I64]>;

//===----------------------------------------------------------------------===//
// Constants
//===----------------------------------------------------------------------===//

def Kiln_ConstantOp : Kiln_ComputeOp<"constant",
    [ConstantLike, Pure, InferTypeOpAdaptor]> {
  let summary = "tensor constant";
  let description = [{
    A constant tensor given by a dense or splat elements attribute.

    ```mlir
    %c = kiln.constant dense<1.0> : tensor<4x8xf32>
    ```
  }];
  let arguments = (ins ElementsAttr:$value);
  let results = (outs Kiln_Tensor:$result);
  let assemblyFormat = "$value attr-dict";
  let hasFolder = 1;
  let hasVerifier = 1;
}

def Kiln_IotaOp : Kiln_ComputeOp<"iota", [Pure]> {
  let summary = "index along one dimension";
  let description = [{
    Each element holds its index along `dim`.

    ```mlir
    // [[0, 0, 0], [1, 1, 1]]
    %i = kiln.iota dim = 0 : tensor<2x3xi32>
    ```
  }];
  let arguments = (ins I64Attr:$dim);
  let results = (outs Kiln_NumTensor:$result);
  let assemblyFormat = "`dim` `=` $dim attr-dict `:` type($result)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Unary elementwise
//===----------------------------------------------------------------------===//

class Kiln_UnaryOp<string mnemonic, Type type, string expr,
                   list<Trait> traits = []>
    : Kiln_ComputeOp<mnemonic, !listconcat(traits,
        [Pure, Elementwise, SameOperandsAndResultType, InferTypeOpInterface, DeclareOpInterfaceMethods<Kiln_GradientOpInterface>,
         Kiln_CostOpInterface])> {
  let summary = "elementwise " # expr;
  let description = [{
    Computes `}] # expr # [{` for every element; the result has the operand's
    type.

    ```mlir
    %y = kiln.}] # mnemonic # [{ %x : tensor<4x8xf32>
    ```
  }];
  let arguments = (ins type:$operand);
  let results = (outs type:$result);
  let assemblyFormat = "$operand attr-dict `:` type($result)";
}

def Kiln_NegOp : Kiln_UnaryOp<"neg", Kiln_NumTensor, "-x", [Kiln_FlopsPerElement<1>]> { let hasFolder = 1; }
def Kiln_AbsOp : Kiln_UnaryOp<"abs", Kiln_NumTensor, "|x|", [Kiln_FlopsPerElement<1>]>;
def Kiln_ExpOp : Kiln_UnaryOp<"exp", Kiln_FloatTensor, "e^x", [Kiln_FlopsPerElement<10>, Kiln_Transcendental]>;
def Kiln_LogOp : Kiln_UnaryOp<"log", Kiln_FloatTensor, "ln(x)", [Kiln_FlopsPerElement<10>, Kiln_Transcendental]>;
def Kiln_SqrtOp : Kiln_UnaryOp<"sqrt", Kiln_FloatTensor, "sqrt(x)", [Kiln_FlopsPerElement<10>]>;
def Kiln_RsqrtOp : Kiln_UnaryOp<"rsqrt", Kiln_FloatTensor, "1/sqrt(x)", [Kiln_FlopsPerElement<10>]>;
def Kiln_TanhOp : Kiln_UnaryOp<"tanh", Kiln_FloatTensor, "tanh(x)", [Kiln_FlopsPerElement<10>, Kiln_Transcendental]>;
def Kiln_SigmoidOp : Kiln_UnaryOp<"sigmoid", Kiln_FloatTensor, "1/(1+e^-x)", [Kiln_FlopsPerElement<10>, Kiln_Transcendental]>;
def Kiln_SiluOp : Kiln_UnaryOp<"silu", Kiln_FloatTensor, "x/(1+e^-x) (SiLU, swish)", [Kiln_FlopsPerElement<11>, Kiln_Transcendental]>;
def Kiln_ReluOp : Kiln_UnaryOp<"relu", Kiln_NumTensor, "max(x, 0)", [Kiln_FlopsPerElement<1>]>;
def Kiln_ErfOp : Kiln_UnaryOp<"erf", Kiln_FloatTensor, "erf(x)", [Kiln_FlopsPerElement<10>, Kiln_Transcendental]>;
def Kiln_CosOp : Kiln_UnaryOp<"cos", Kiln_FloatTensor, "cos(x)", [Kiln_FlopsPerElement<10>, Kiln_Transcendental]>;
def Kiln_SinOp : Kiln_UnaryOp<"sin", Kiln_FloatTensor, "sin(x)", [Kiln_FlopsPerElement<10>, Kiln_Transcendental]>;
def Kiln_SoftplusOp : Kiln_UnaryOp<"softplus", Kiln_FloatTensor, "log(1 + e^x) (softplus)", [Kiln_FlopsPerElement<20>, Kiln_Transcendental]>;

def Kiln_GeluOp : Kiln_ComputeOp<"gelu",
    [Pure, Elementwise, SameOperandsAndResultType, InferTypeOpInterface,
     DeclareOpInterfaceMethods<Kiln_GradientOpInterface>,
     Kiln_CostOpInterface, Kiln_FlopsPerElement<10>, Kiln_Transcendental]> {
  let summary = "elementwise GELU, exact (erf) or tanh-approximated";
  let description = [{
    `erf`: x * 0.5 * (1 + erf(x / sqrt(2))).
    `tanh`: x * 0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))).

    ```mlir
    %y = kiln.gelu erf, %x : tensor<4x8xf32>
    %z = kiln.gelu tanh, %x : tensor<4x8xf32>
    ```
  }];
  let arguments = (ins Kiln_GeluApproximationAttr:$approximation,
                       Kiln_FloatTensor:$operand);
  let results = (outs Kiln_FloatTensor:$result);
  let assemblyFormat = "$approximation `,` $operand attr-dict `:` type($result)";
}

def Kiln_CastOp : Kiln_ComputeOp<"cast", [Pure, DeclareOpInterfaceMethods<Kiln_GradientOpInterface>,
                                   Kiln_CostOpInterface, Kiln_FlopsPerElement<1>]> {
  let summary = "elementwise conversion to another element type";
  let description = [{
    Converts each element; the shape is unchanged. Float to integer rounds
    toward zero; to i1 tests for non-zero.

    ```mlir
    %h = kiln.cast %x : tensor<4x8xf32> -> tensor<4x8xbf16>
    ```
  }];
  let arguments = (ins Kiln_Tensor:$operand);
  let results = (outs Kiln_Tensor:$result);
  let assemblyFormat = "$operand attr-dict `:` type($operand) `->` type($result)";
  let hasVerifier = 1;
  let hasFolder = 1;
}

//===----------------------------------------------------------------------===//
// Binary elementwise
//===----------------------------------------------------------------------===//

class Kiln_BinaryOp<string mnemonic, Type type, string expr,
                    list<Trait> traits = []>
    : Kiln_ComputeOp<mnemonic, !listconcat(traits,
        [Pure, Elementwise, SameOperandsAndResultType, InferTypeOpInterface, DeclareOpInterfaceMethods<Kiln_GradientOpInterface>,
         Kiln_CostOpInterface])> {
  let summary = "elementwise " # expr;
  let description = [{
    Computes `}] # expr # [{` elementwise. Operands and result have one type:
    broadcast first with `kiln.broadcast_in_dim`.

    ```mlir
    %z = kiln.}] # mnemonic # [{ %x, %y : tensor<4x8xf32>
    ```
  }];
  let arguments = (ins type:$lhs, type:$rhs);
  let results = (outs type:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` type($result)";
}

def Kiln_AddOp : Kiln_BinaryOp<"add", Kiln_NumTensor, "lhs + rhs", [Commutative, Kiln_FlopsPerElement<1>]> {
  let hasFolder = 1;
  let hasCanonicalizer = 1;
}
def Kiln_SubOp : Kiln_BinaryOp<"sub", Kiln_NumTensor, "lhs - rhs", [Kiln_FlopsPerElement<1>]> {
  let hasFolder = 1;
}
def Kiln_MulOp : Kiln_BinaryOp<"mul", Kiln_NumTensor, "lhs * rhs", [Commutative, Kiln_FlopsPerElement<1>]> {
  let hasFolder = 1;
}
def Kiln_DivOp : Kiln_BinaryOp<"div", Kiln_NumTensor, "lhs / rhs", [Kiln_FlopsPerElement<1>]> {
  let hasFolder = 1;
}
def Kiln_PowOp : Kiln_BinaryOp<"pow", Kiln_FloatTensor, "lhs ^ rhs", [Kiln_FlopsPerElement<10>, Kiln_Transcendental]> {
  let hasFolder = 1;
}
def Kiln_MaxOp : Kiln_BinaryOp<"max", Kiln_NumTensor, "max(lhs, rhs)", [Commutative, Kiln_FlopsPerElement<1>]>;
def Kiln_MinOp : Kiln_BinaryOp<"min", Kiln_NumTensor, "min(lhs, rhs)", [Commutative, Kiln_FlopsPerElement<1>]>;

def Kiln_CompareOp : Kiln_ComputeOp<"compare",
    [Pure, Elementwise, SameTypeOperands, InferTypeOpAdaptor,
     Kiln_CostOpInterface, Kiln_FlopsPerElement<1>]> {
  let summary = "elementwise comparison producing i1";
  let description = [{
    ```mlir
    %m = kiln.compare ge, %rows, %cols : tensor<64x64xi32>
    ```
  }];
  let arguments = (ins Kiln_CompareDirectionAttr:$direction,
                       Kiln_NumTensor:$lhs, Kiln_NumTensor:$rhs);
  let results = (outs Kiln_BoolTensor:$result);
  let assemblyFormat = "$direction `,` $lhs `,` $rhs attr-dict `:` type($lhs)";
}

def Kiln_SelectOp : Kiln_ComputeOp<"select",
    [Pure, DeclareOpInterfaceMethods<InferTypeOpInterface>, DeclareOpInterfaceMethods<Kiln_GradientOpInterface>,
     AllTypesMatch<["on_true", "on_false", "result"]>,
     Kiln_CostOpInterface, Kiln_FlopsPerElement<1>]> {
  let summary = "elementwise choice: pred ? on_true : on_false";
  let description = [{
    `pred` has the shape of the result and element type i1.

    ```mlir
    %y = kiln.select %mask, %scores, %neg_inf : tensor<64x64xi1>, tensor<64x64xf32>
    ```
  }];
  let arguments = (ins Kiln_BoolTensor:$pred, Kiln_Tensor:$on_true,
                       Kiln_Tensor:$on_false);
  let results = (outs Kiln_Tensor:$result);
  let assemblyFormat =
      "$pred `,` $on_true `,` $on_false attr-dict `:` type($pred) `,` type($result)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Broadcasting and reductions
//===----------------------------------------------------------------------===//

def Kiln_BroadcastInDimOp : Kiln_ComputeOp<"broadcast_in_dim", [Pure, DeclareOpInterfaceMethods<Kiln_GradientOpInterface>]> {
  let summary = "explicit broadcast to a larger shape";
  let description = [{
    Operand dimension `i` becomes result dimension `dims[i]`; its size must be
    1 (it is repeated) or equal to the result's. `dims` is strictly increasing.

    ```mlir
    // bias[384] added to every row of x[12x64x384]
    %b = kiln.broadcast_in_dim %bias, dims = [2] : tensor<384xf32> -> tensor<12x64x384xf32>
    ```
  }];
  let arguments = (ins Kiln_Tensor:$operand, DenseI64ArrayAttr:$dims);
  let results = (outs Kiln_Tensor:$result);
  let assemblyFormat =
      "$operand `,` `dims` `=` $dims attr-dict `:` type($operand) `->` type($result)";
  let hasVerifier = 1;
  let hasFolder = 1;
  let hasCanonicalizer = 1;
}

class Kiln_ReduceOp<string mnemonic, Type type, string what>
    : Kiln_ComputeOp<mnemonic, [Pure, InferTypeOpAdaptor, DeclareOpInterfaceMethods<Kiln_GradientOpInterface>,
                         // one per input element
                         DeclareOpInterfaceMethods<Kiln_CostOpInterface, ["estimateFlops"]>,
                         Kiln_FlopsPerElement<1>]> {
  let summary = what # " over axes";
  let description = [{
    Reduces `axes` (sorted, unique, in range) by }] # what # [{. Reduced
    dimensions are removed, or kept with size 1 with `keepdims`. Float sums
    accumulate in at least f32.

    ```mlir
    %s = kiln.}] # mnemonic # [{ %x axes = [1] : tensor<4x8xf32> -> tensor<4xf32>
    %k = kiln.}] # mnemonic # [{ %x axes = [1] keepdims : tensor<4x8xf32> -> tensor<4x1xf32>
    ```
  }];
  let arguments = (ins type:$operand, DenseI64ArrayAttr:$axes,
                       UnitAttr:$keepdims);
  let results = (outs type:$result);
  let assemblyFormat =
      "$operand `axes` `=` $axes (`keepdims` $keepdims^)? attr-dict `:` type($operand) `->` type($result)";
}

def Kiln_ReduceSumOp : Kiln_ReduceOp<"reduce_sum", Kiln_NumTensor, "sum">;
def Kiln_ReduceMeanOp : Kiln_ReduceOp<"reduce_mean", Kiln_FloatTensor, "mean">;
def Kiln_ReduceMaxOp : Kiln_ReduceOp<"reduce_max", Kiln_NumTensor, "maximum">;

//===----------------------------------------------------------------------===//
// Linear algebra
//===----------------------------------------------------------------------===//

def Kiln_MatmulOp : Kiln_ComputeOp<"matmul", [Pure, InferTypeOpAdaptor, DeclareOpInterfaceMethods<Kiln_GradientOpInterface>,
                                      // 2 k per result element
                                      DeclareOpInterfaceMethods<Kiln_CostOpInterface, ["estimateFlops"]>,
                                      Kiln_FlopsPerElement<2>]> {
  let summary = "batched matrix product with optional transposes";
  let description = [{
    `lhs` is `[batch..., M, K]` (`[batch..., K, M]` with `transpose_lhs`),
    `rhs` is `[batch..., K, N]` (`[batch..., N, K]` with `transpose_rhs`). The
    batch dimensions of both are equal, or one side has none (a weight shared
    across the batch). The result is `[batch..., M, N]`. Both operands have the
    same element type.

    ```mlir
    // x[12x64x128] times W[512x128]^T, as a linear layer does
    %y = kiln.matmul %x, %w transpose_rhs : tensor<12x64x128xf32>, tensor<512x128xf32> -> tensor<12x64x512xf32>
    ```
  }];
  let arguments = (ins Kiln_NumTensor:$lhs, Kiln_NumTensor:$rhs,
                       UnitAttr:$transpose_lhs, UnitAttr:$transpose_rhs);
  let results = (outs Kiln_NumTensor:$result);
  let assemblyFormat = [{
    $lhs `,` $rhs (`transpose_lhs` $transpose_lhs^)? (`transpose_rhs` $transpose_rhs^)?
    attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)
  }];
}

//===----------------------------------------------------------------------===//
// Shape manipulation
//===----------------------------------------------------------------------===//

def Kiln_ReshapeOp : Kiln_ComputeOp<"reshape", [Pure, DeclareOpInterfaceMethods<Kiln_GradientOpInterface>]> {
  let summary = "same elements, new shape (row-major)";
  let description = [{
    ```mlir
    %y = kiln.reshape %x : tensor<12x64x384xf32> -> tensor<12x64x6x64xf32>
    ```
  }];
  let arguments = (ins Kiln_Tensor:$operand);
  let results = (outs Kiln_Tensor:$result);
  let assemblyFormat = "$operand attr-dict `:` type($operand) `->` type($result)";
  let hasVerifier = 1;
  let hasFolder = 1;
  let hasCanonicalizer = 1;
}

def Kiln_TransposeOp : Kiln_ComputeOp<"transpose", [Pure, InferTypeOpAdaptor, DeclareOpInterfaceMethods<Kiln_GradientOpInterface>]> {
  let summary = "permute dimensions";
  let description = [{
    Result dimension `i` is operand dimension `permutation[i]`.

    ```mlir
    %y = kiln.transpose %x perm = [0, 2, 1, 3] : tensor<12x64x6x64xf32> -> tensor<12x6x64x64xf32>
    ```
  }];
  let arguments = (ins Kiln_Tensor:$operand, DenseI64ArrayAttr:$permutation);
  let results = (outs Kiln_Tensor:$result);
  let assemblyFormat =
      "$operand `perm` `=` $permutation attr-dict `:` type($operand) `->` type($result)";
  let hasFolder = 1;
  let hasCanonicalizer = 1;
}

def Kiln_SliceOp : Kiln_ComputeOp<"slice", [Pure, InferTypeOpAdaptor, DeclareOpInterfaceMethods<Kiln_GradientOpInterface>]> {
  let summary = "strided static slice";
  let description = [{
    For every dimension, takes indices `start, start+stride, ...` below
    `limit`. `0 <= start <= limit <= size`, `stride >= 1`.

    ```mlir
    %q = kiln.slice %qkv start = [0, 0, 0] limit = [12, 64, 384] stride = [1, 1, 1] : tensor<12x64x1152xf32> -> tensor<12x64x384xf32>
    ```
  }];
  let arguments = (ins Kiln_Tensor:$operand, DenseI64ArrayAttr:$start,
                       DenseI64ArrayAttr:$limit, DenseI64ArrayAttr:$stride);
  let results = (outs Kiln_Tensor:$result);
  let assemblyFormat = [{
    $operand `start` `=` $start `limit` `=` $limit `stride` `=` $stride
    attr-dict `:` type($operand) `->` type($result)
  }];
  let hasFolder = 1;
}

def Kiln_ConcatOp : Kiln_ComputeOp<"concat", [Pure, InferTypeOpAdaptor, DeclareOpInterfaceMethods<Kiln_GradientOpInterface>]> {
  let summary = "join tensors along one dimension";
  let description = [{
    All inputs have the same element type and the same sizes except along
    `dim`.

    ```mlir
    %y = kiln.concat %a, %b dim = 1 : tensor<4x3xf32>, tensor<4x5xf32> -> tensor<4x8xf32>
    ```
  }];
  let arguments = (ins Variadic<Kiln_Tensor>:$inputs, I64Attr:$dim);
  let results = (outs Kiln_Tensor:$result);
  let assemblyFormat =
      "$inputs `dim` `=` $dim attr-dict `:` type($inputs) `->` type($result)";
  let hasFolder = 1;
}

def Kiln_GatherOp : Kiln_ComputeOp<"gather", [Pure, InferTypeOpAdaptor, DeclareOpInterfaceMethods<Kiln_GradientOpInterface>]> {
  let summary = "take slices along an axis by integer indices (embedding lookup)";
  let description = [{
    The result shape is `operand[:axis] + indices + operand[axis+1:]`, as
    numpy's `take`. Indices outside `[0, size)` are clamped by backends.

    ```mlir
    %e = kiln.gather %wte[%tokens] axis = 0 : tensor<65x384xf32>, tensor<12x64xi32> -> tensor<12x64x384xf32>
    ```
  }];
  let arguments = (ins Kiln_Tensor:$operand, Kiln_IntTensor:$indices,
                       I64Attr:$axis);
  let results = (outs Kiln_Tensor:$result);
  let assemblyFormat = [{
    $operand `[` $indices `]` `axis` `=` $axis attr-dict `:` type($operand) `,`
    type($indices) `->` type($result)
  }];
}

def Kiln_PadOp : Kiln_ComputeOp<"pad", [Pure, InferTypeOpAdaptor, DeclareOpInterfaceMethods<Kiln_GradientOpInterface>]> {
  let summary = "pad with a constant: low, high and interior padding";
  let description = [{
    Result dimension d has size `low[d] + size[d] + (size[d] - 1) * interior[d]
    + high[d]`; operand element i lands at `low[d] + i * (interior[d] + 1)`,
    every other element is `value`. All amounts are >= 0. It is the gradient
    of `kiln.slice`.

    ```mlir
    %p = kiln.pad %x low = [0, 2] high = [0, 1] interior = [0, 0] value = 0.0 : tensor<4x8xf32> -> tensor<4x11xf32>
    ```
  }];
  let arguments = (ins Kiln_Tensor:$operand, DenseI64ArrayAttr:$low,
                       DenseI64ArrayAttr:$high, DenseI64ArrayAttr:$interior,
                       F64Attr:$value);
  let results = (outs Kiln_Tensor:$result);
  let assemblyFormat = [{
    $operand `low` `=` $low `high` `=` $high `interior` `=` $interior `value`
    `=` $value attr-dict `:` type($operand) `->` type($result)
  }];  let hasFolder = 1;
}

def Kiln_ScatterAddOp : Kiln_ComputeOp<"scatter_add", [Pure, DeclareOpInterfaceMethods<Kiln_GradientOpInterface>]> {
  let summary = "sum slices into a zero tensor by integer indices (the gradient of gather)";
  let description = [{
    The inverse of `kiln.gather` with the same `axis`: the result has
    `result_type`'s shape `operand[:axis] + [N] + operand[axis+1:]` and starts
    at zero; for every index position j, `updates[..., j, ...]` is added to
    `result[..., indices[j], ...]`. Out-of-range indices are clamped.

    ```mlir
    %g = kiln.scatter_add %dy[%tokens] axis = 0 : tensor<12x64x384xf32>, tensor<12x64xi32> -> tensor<65x384xf32>
    ```
  }];
  let arguments = (ins Kiln_NumTensor:$updates, Kiln_IntTensor:$indices,
                       I64Attr:$axis);
  let results = (outs Kiln_NumTensor:$result);
  let assemblyFormat = [{
    $updates `[` $indices `]` `axis` `=` $axis attr-dict `:` type($updates) `,`
    type($indices) `->` type($result)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Collectives (docs/parallel.md)
//===----------------------------------------------------------------------===//
//
// A collective runs on every device of the module's mesh (`kiln.mesh`) at
// once; `axis` names the mesh axis whose devices form each group (the
// devices that differ from this one only along that axis, in axis order:
// GSPMD's replica groups). Every device runs the same program, so the ops
// have value semantics and are Pure: CSE and dead-code elimination act
// alike on every device.

def Kiln_AllReduceOp : Kiln_ComputeOp<"all_reduce", [Pure, SameOperandsAndResultType,
    DeclareOpInterfaceMethods<Kiln_GradientOpInterface>]> {
  let summary = "combine a tensor over the devices of a mesh axis";
  let description = [{
    Every device of the group receives the elementwise `reduction` (sum,
    mean, max or min) of the group's operands, combined in a fixed order
    (group member 0 first), so every device gets the same bits.

    ```mlir
    %g = kiln.all_reduce %partial axis = "dp" reduction = mean : tensor<384x384xf32>
    ```
  }];
  let arguments = (ins Kiln_NumTensor:$operand, StrAttr:$axis,
                       Kiln_CollectiveReductionAttr:$reduction);
  let results = (outs Kiln_NumTensor:$result);
  let assemblyFormat = [{
    $operand `axis` `=` $axis `reduction` `=` $reduction attr-dict `:` type($result)
  }];
  let hasVerifier = 1;
}

def Kiln_ReduceScatterOp : Kiln_ComputeOp<"reduce_scatter", [Pure,
    DeclareOpInterfaceMethods<Kiln_GradientOpInterface>]> {
  let summary = "combine over a mesh axis and keep this device's block";
  let description = [{
    The group's operands are combined as `kiln.all_reduce` does; member i
    keeps block i of `dim`, split into group-size equal blocks. The result
    has the operand's shape with `dim` divided by the group size. Its
    gradient is `kiln.all_gather` along the same dim.

    ```mlir
    %s = kiln.reduce_scatter %g axis = "dp" reduction = sum dim = 0 : tensor<1024xf32> -> tensor<256xf32>
    ```
  }];
  let arguments = (ins Kiln_NumTensor:$operand, StrAttr:$axis,
                       Kiln_CollectiveReductionAttr:$reduction, I64Attr:$dim);
  let results = (outs Kiln_NumTensor:$result);
  let assemblyFormat = [{
    $operand `axis` `=` $axis `reduction` `=` $reduction `dim` `=` $dim attr-dict
    `:` type($operand) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Kiln_AllGatherOp : Kiln_ComputeOp<"all_gather", [Pure,
    DeclareOpInterfaceMethods<Kiln_GradientOpInterface>]> {
  let summary = "concatenate the group's tensors along a dimension";
  let description = [{
    Every member receives the group's operands concatenated along `dim` in
    member order; the result has `dim` multiplied by the group size. Its
    gradient is `kiln.reduce_scatter` (sum) along the same dim.

    ```mlir
    %w = kiln.all_gather %shard axis = "dp" dim = 0 : tensor<256xf32> -> tensor<1024xf32>
    ```
  }];
  let arguments = (ins Kiln_Tensor:$operand, StrAttr:$axis, I64Attr:$dim);
  let results = (outs Kiln_Tensor:$result);
  let assemblyFormat = [{
    $operand `axis` `=` $axis `dim` `=` $dim attr-dict `:` type($operand) `->` type($result)
  }];
  let hasVerifier = 1;
}

// Pipeline parallelism (docs/parallel.md "Pipeline parallelism"): devices
// run only the ops of their stage (their coordinate on the "pp" axis; an op
// with `kiln.stage = s` runs there, an op without one everywhere). Values
// cross stages through these two ops.

def Kiln_TransferOp : Kiln_ComputeOp<"transfer", [Pure, SameOperandsAndResultType]> {
  let summary = "move a value from one stage of a mesh axis to another";
  let description = [{
    The devices at coordinate `from` on `axis` send the operand to the
    device at coordinate `to` whose other coordinates are theirs; the
    result exists on the `to` devices only (a send/recv pair in the plan).

    ```mlir
    %h1 = kiln.transfer %h0 axis = "pp" from = 0 to = 1 : tensor<32x1000xf32>
    ```
  }];
  let arguments = (ins Kiln_Tensor:$operand, StrAttr:$axis, I64Attr:$from,
                       I64Attr:$to);
  let results = (outs Kiln_Tensor:$result);
  let assemblyFormat = [{
    $operand `axis` `=` $axis `from` `=` $from `to` `=` $to attr-dict `:` type($result)
  }];
  let hasVerifier = 1;
}

def Kiln_CollectiveBroadcastOp : Kiln_ComputeOp<"collective_broadcast", [Pure,
    SameOperandsAndResultType]> {
  let summary = "copy one stage's value to every device of its axis group";
  let description = [{
    The device at coordinate `root` on `axis` sends its operand to the
    devices that differ from it only along `axis`; every one of them holds
    the result (the operand needs to exist on the root only). Pipeline
    parallelism uses it for the loss and the other results of the step.

    ```mlir
    %l = kiln.collective_broadcast %loss axis = "pp" root = 1 : tensor<f32>
    ```
  }];
  let arguments = (ins Kiln_Tensor:$operand, StrAttr:$axis, I64Attr:$root);
  let results = (outs Kiln_Tensor:$result);
  let assemblyFormat = [{
    $operand `axis` `=` $axis `root` `=` $root attr-dict `:` type($result)
  }];
  let hasVerifier = 1;
}

def Kiln_RandomOp : Kiln_ComputeOp<"random", [Pure]> {
  let summary = "counter-based pseudo-random tensor";
  let description = [{
    A pure function of `seed`, `salt` and each element's linear index, so
    every backend and the interpreter produce the same bits (the hash is
    specified in docs/design.md). `uniform` is in [0, 1); `normal` has mean 0
    and standard deviation 1 (Box-Muller).

    ```mlir
    %w = kiln.random normal, %seed salt = 7 : tensor<i64> -> tensor<384x384xf32>
    ```
  }];
  let arguments = (ins Kiln_RandomDistributionAttr:$distribution,
                       Kiln_SeedTensor:$seed, I64Attr:$salt);
  let results = (outs Kiln_FloatTensor:$result);
  let assemblyFormat = [{
    $distribution `,` $seed `salt` `=` $salt attr-dict `:` type($seed) `->` type($result)
  }];
}

def Kiln_OptimizationBarrierOp : Kiln_ComputeOp<"optimization_barrier",
    [Pure, SameOperandsAndResultType, InferTypeOpInterface,
     DeclareOpInterfaceMethods<Kiln_GradientOpInterface>]> {
  let summary = "identity that no rewrite looks through";
  let description = [{
    Returns its operand unchanged. Canonicalization and CSE treat the result
    as a new value, so ops recomputed from it are not merged with the
    originals: activation recomputation (`recompute = true`) clones a block's
    forward ops onto barriers of the block's inputs.

    ```mlir
    %r = kiln.optimization_barrier %x : tensor<12x64x128xf32>
    ```
  }];
  let arguments = (ins Kiln_Tensor:$operand);
  let results = (outs Kiln_Tensor:$result);
  let assemblyFormat = "$operand attr-dict `:` type($result)";
}

//===----------------------------------------------------------------------===//
// Neural-network composites
//===----------------------------------------------------------------------===//

class Kiln_SoftmaxLikeOp<string mnemonic, string what>
    : Kiln_ComputeOp<mnemonic, [Pure, SameOperandsAndResultType, InferTypeOpInterface,
                         DeclareOpInterfaceMethods<Kiln_GradientOpInterface>,
                         Kiln_CostOpInterface, Kiln_FlopsPerElement<14>, Kiln_Transcendental]> {
  let summary = what # " along one axis";
  let description = [{
    Numerically stable }] # what # [{ (the maximum is subtracted first).

    ```mlir
    %p = kiln.}] # mnemonic # [{ %scores axis = 3 : tensor<12x4x64x64xf32>
    ```
  }];
  let arguments = (ins Kiln_FloatTensor:$operand, I64Attr:$axis);
  let results = (outs Kiln_FloatTensor:$result);
  let assemblyFormat = "$operand `axis` `=` $axis attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Kiln_SoftmaxOp : Kiln_SoftmaxLikeOp<"softmax", "softmax">;
def Kiln_LogSoftmaxOp : Kiln_SoftmaxLikeOp<"log_softmax", "log-softmax">;

def Kiln_LayerNormOp : Kiln_ComputeOp<"layer_norm",
    [Pure, AttrSizedOperandSegments, InferTypeOpAdaptor, DeclareOpInterfaceMethods<Kiln_GradientOpInterface>,
     Kiln_CostOpInterface, Kiln_FlopsPerElement<8>]> {
  let summary = "layer normalisation over the last axis";
  let description = [{
    `(x - mean) / sqrt(var + epsilon) * scale + bias` over the last axis, with
    the biased variance. `scale` and `bias` are optional and have the shape of
    the last axis.

    ```mlir
    %y = kiln.layer_norm %x scale(%g : tensor<384xf32>) {epsilon = 1.0e-05 : f64} : tensor<12x64x384xf32>
    ```
  }];
  let arguments = (ins Kiln_FloatTensor:$operand,
                       Optional<Kiln_FloatTensor>:$scale,
                       Optional<Kiln_FloatTensor>:$bias,
                       DefaultValuedAttr<F64Attr, "1e-5">:$epsilon);
  let results = (outs Kiln_FloatTensor:$result);
  let assemblyFormat = [{
    $operand (`scale` `(` $scale^ `:` type($scale) `)`)?
    (`bias` `(` $bias^ `:` type($bias) `)`)? attr-dict `:` type($operand)
  }];
}

def Kiln_CrossEntropyOp : Kiln_ComputeOp<"cross_entropy", [Pure, InferTypeOpAdaptor,
    DeclareOpInterfaceMethods<Kiln_GradientOpInterface>,
    // 14 per logit (input element)
    DeclareOpInterfaceMethods<Kiln_CostOpInterface, ["estimateFlops"]>,
    Kiln_FlopsPerElement<14>, Kiln_Transcendental]> {
  let summary = "softmax cross-entropy with integer class targets";
  let description = [{
    `logits` is `[..., C]`, `targets` is `[...]` with values in `[0, C)`.
    The per-position loss `logsumexp(logits) - logits[target]` is averaged
    (`mean`, a scalar), summed (`sum`, a scalar) or returned (`none`).

    ```mlir
    %loss = kiln.cross_entropy %logits, %targets reduction = mean : tensor<12x64x65xf32>, tensor<12x64xi32> -> tensor<f32>
    ```
  }];
  let arguments = (ins Kiln_FloatTensor:$logits, Kiln_IntTensor:$targets,
                       Kiln_LossReductionAttr:$reduction);
  let results = (outs Kiln_FloatTensor:$result);
  let assemblyFormat = [{
    $logits `,` $targets `reduction` `=` $reduction attr-dict `:` type($logits)
    `,` type($targets) `->` type($result)
  }];
}

def Kiln_DropoutOp : Kiln_ComputeOp<"dropout", [Pure, InferTypeOpAdaptor, DeclareOpInterfaceMethods<Kiln_GradientOpInterface>]> {
  let summary = "inverted dropout driven by an explicit seed";
  let description = [{
    Zeroes each element with probability `rate` and scales the others by
    `1 / (1 - rate)`. The mask is a pure function of `seed`, `salt` (one per
    dropout site) and the element index, so a step can be replayed exactly.
    `rate = 0` folds away.

    ```mlir
    %y = kiln.dropout %x, %seed rate = 1.0e-01 salt = 3 : tensor<12x64x384xf32>, tensor<i64>
    ```
  }];
  let arguments = (ins Kiln_FloatTensor:$operand, Kiln_SeedTensor:$seed,
                       F64Attr:$rate, I64Attr:$salt);
  let results = (outs Kiln_FloatTensor:$result);
  let assemblyFormat = [{
    $operand `,` $seed `rate` `=` $rate `salt` `=` $salt attr-dict `:`
    type($operand) `,` type($seed)
  }];
  let hasVerifier = 1;
  let hasFolder = 1;
}

//===----------------------------------------------------------------------===//
// Fused attention (rules: dialects/kiln/ops/Attention.cpp)
//===----------------------------------------------------------------------===//

class Kiln_AttentionLikeOp<string mnemonic, list<Trait> traits = []>
    : Kiln_ComputeOp<mnemonic, !listconcat(traits, [Pure, AttrSizedOperandSegments,
        InferTypeOpAdaptor, DeclareOpInterfaceMethods<Kiln_CostOpInterface, ["estimateFlops"]>,
        Kiln_FlopsPerElement<1>])> {
  let hasVerifier = 1;
}

def Kiln_AttentionOp : Kiln_AttentionLikeOp<"attention",
    [DeclareOpInterfaceMethods<Kiln_GradientOpInterface>]> {
  let summary = "scaled dot-product attention without the T x S tensors";
  let description = [{
    `query` is `[B, H, T, D]`, `key` and `value` are `[B, Hk, S, D]` with `Hk`
    dividing `H` (grouped-query attention: query head `h` reads key/value
    head `h / (H / Hk)`). Per batch and head, with `s = scale * q kᵀ`:

    - `causal`: positions `j > i` are dropped (`s = -inf`);
    - `mask` (optional, `[T, S]` or `[B|1, H|1, T, S]`): `i1` keeps where
      true (`-inf` elsewhere); a float mask is added to `s`;
    - `p = softmax(s)` over `S`; `lse = logsumexp(s)` (the saved statistic);
    - `dropout > 0` (with `seed`): `p` is dropped exactly as `kiln.dropout`
      with the same `salt` drops a `[B, H, T, S]` tensor (element
      `((b H + h) T + i) S + j`), so a raised model keeps its masks;
    - `result = p v`, `[B, H, T, D]`.

    A row with every position dropped gives 0 (and `lse = -inf`). `lse` is
    `[B, H, T]` in the query's type, f32 when that is bf16 or f16. The
    backward (`kiln.attention_grad`) recomputes `p` from `lse`: no `T x S`
    tensor is kept between them. kiln-raise-attention forms it from
    `softmax(q kᵀ * scale [+ mask]) v` written from primitives.

    ```mlir
    %o, %lse = kiln.attention %q, %k, %v scale = 1.250000e-01 causal : tensor<4x6x64x64xf32>, tensor<4x6x64x64xf32>, tensor<4x6x64x64xf32>
    ```
  }];
  let arguments = (ins Kiln_FloatTensor:$query, Kiln_FloatTensor:$key, Kiln_FloatTensor:$value,
                       Optional<Kiln_Tensor>:$mask, Optional<Kiln_SeedTensor>:$seed,
                       F64Attr:$scale, UnitAttr:$causal,
                       DefaultValuedAttr<F64Attr, "0.0">:$dropout,
                       DefaultValuedAttr<I64Attr, "0">:$salt);
  let results = (outs Kiln_FloatTensor:$result, Kiln_FloatTensor:$lse);
  let assemblyFormat = [{
    $query `,` $key `,` $value (`mask` `(` $mask^ `:` type($mask) `)`)?
    (`seed` `(` $seed^ `:` type($seed) `)`)? `scale` `=` $scale (`causal` $causal^)?
    attr-dict `:` type($query) `,` type($key) `,` type($value)
  }];
}

def Kiln_AttentionGradOp : Kiln_AttentionLikeOp<"attention_grad"> {
  let summary = "the gradient of kiln.attention, recomputing its probabilities";
  let description = [{
    Given the forward's operands and attributes, its `result` and `lse`, and
    the result's gradient `grad`, the gradients of query, key and value
    (FlashAttention-2's backward: `Δ = rowsum(grad ∘ result)`, then per
    tile `p = exp(s - lse)`, `dp = grad vᵀ` (dropped as the forward
    dropped), `ds = p ∘ (dp - Δ)`, `dq = scale ds k`, `dk = scale dsᵀ q`,
    `dv = pᵀ grad`; key and value gradients summed over the query heads of
    a group). No float atomics: the result does not depend on how the work
    is split.

    ```mlir
    %dq, %dk, %dv = kiln.attention_grad %q, %k, %v, %o, %lse, %g scale = 1.250000e-01 causal : tensor<4x6x64x64xf32>, tensor<4x6x64x64xf32>, tensor<4x6x64x64xf32>, tensor<4x6x64x64xf32>, tensor<4x6x64xf32>, tensor<4x6x64x64xf32>
    ```
  }];
  let arguments = (ins Kiln_FloatTensor:$query, Kiln_FloatTensor:$key, Kiln_FloatTensor:$value,
                       Kiln_FloatTensor:$out, Kiln_FloatTensor:$lse, Kiln_FloatTensor:$grad,
                       Optional<Kiln_Tensor>:$mask, Optional<Kiln_SeedTensor>:$seed,
                       F64Attr:$scale, UnitAttr:$causal,
                       DefaultValuedAttr<F64Attr, "0.0">:$dropout,
                       DefaultValuedAttr<I64Attr, "0">:$salt);
  let results = (outs Kiln_FloatTensor:$query_grad, Kiln_FloatTensor:$key_grad,
                      Kiln_FloatTensor:$value_grad);
  let assemblyFormat = [{
    $query `,` $key `,` $value `,` $out `,` $lse `,` $grad
    (`mask` `(` $mask^ `:` type($mask) `)`)? (`seed` `(` $seed^ `:` type($seed) `)`)?
    `scale` `=` $scale (`causal` $causal^)? attr-dict `:` type($query) `,` type($key) `,`
    type($value) `,` type($out) `,` type($lse) `,` type($grad)
  }];
}

//===----------------------------------------------------------------------===//
// Kernel level: fusion groups
//===----------------------------------------------------------------------===//

def Kiln_FusionOp : Kiln_Op<"fusion",
    [IsolatedFromAbove, RecursiveMemoryEffects]> {
  let summary = "ops that run as one kernel";
  let description = [{
    The unit of code generation, made by `kiln-fuse`: the ops of the body
    run as one kernel (or one library GEMM with its epilogue). The region is
    isolated from above: the block arguments are the kernel's inputs, in
    operand order, and `kiln.yield` gives its outputs (every member value
    read outside). Constants are cloned into the body.

    `kind` names the kernel form (docs/codegen.md "Kernel forms"):
    `elementwise` (one iteration space, every point independent; data
    movement such as slices, pads, transposes and gathers is an index map),
    `row_reduction` (the leading `rows` dimensions are independent rows;
    each row is reduced once or several times, with prologue and epilogue
    ops), `column_reduction` (reductions over leading dimensions, with
    sibling reductions of the same shape sharing the kernel),
    `gemm` (one `kiln.matmul`, a library call), `gemm_epilogue` (a GEMM
    followed by elementwise ops on its result) and `single` (one op that has no fused form).

    ```mlir
    %r = kiln.fusion "elementwise" rows = 2 ins(%a, %b) : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32> {
    ^bb0(%x: tensor<4x8xf32>, %y: tensor<8xf32>):
      %0 = kiln.broadcast_in_dim %y, dims = [1] : tensor<8xf32> -> tensor<4x8xf32>
      %1 = kiln.add %x, %0 : tensor<4x8xf32>
      %2 = kiln.relu %1 : tensor<4x8xf32>
      kiln.yield %2 : tensor<4x8xf32>
    }
    ```
  }];
  let arguments = (ins Variadic<Kiln_Tensor>:$inputs, StrAttr:$kind,
                       I64Attr:$rows);
  let results = (outs Variadic<Kiln_Tensor>:$results);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    $kind `rows` `=` $rows (`ins` `(` $inputs^ `)`)? attr-dict `:` functional-type($inputs, $results) $body
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    ::mlir::Block &getBlock() { return getBody().front(); }
    /// The member ops, in order (without the terminator).
    auto getMembers() { return getBlock().without_terminator(); }
  }];
}

def Kiln_YieldOp : Kiln_Op<"yield", [Pure, Terminator, HasParent<"FusionOp">]> {
  let summary = "the outputs of a kiln.fusion";
  let description = [{
    Ends a `kiln.fusion` body; its operands are the fusion's results.

    ```mlir
    kiln.yield %2, %3 : tensor<4x8xf32>, tensor<4xf32>
    ```
  }];
  let arguments = (ins Variadic<Kiln_Tensor>:$values);
  let assemblyFormat = "($values^ `:` type($values))? attr-dict";
}

#endif // KILN_OPS_TD
