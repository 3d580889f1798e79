//===- KilnDialect.td - The kiln graph dialect -------------*- tablegen -*-===//
#ifndef KILN_DIALECT_TD
#define KILN_DIALECT_TD

include "mlir/IR/OpBase.td"

def Kiln_Dialect : Dialect {
  let name = "kiln";
  let cppNamespace = "::kiln";
  let summary = "Kiln's graph dialect: ranked, statically shaped tensor ops for training";
  let description = [{
    The kiln dialect holds a model's forward graph (and, after autodiff, its
    train step) on ranked, statically shaped tensors of f64, f32, f16, bf16,
    i64, i32 and i1. Broadcasting is explicit (`kiln.broadcast_in_dim`);
    elementwise ops take operands of identical type.

    Function arguments and results carry the model's interface:
    `kiln.param` (parameter name), `kiln.layer` (the layer that created it),
    `kiln.init` (initialiser), `kiln.input` (batch input name) and
    `kiln.output` (result name, e.g. "loss"). The module carries `kiln.model`
    and, when the model file has one, the `kiln.train` configuration.
  }];
  let hasConstantMaterializer = 1;
  let hasRegionArgAttrVerify = 1;
  let hasRegionResultAttrVerify = 1;
  let hasOperationAttrVerify = 1;
  let extraClassDeclaration = [{
    // Attribute names used on functions and modules.
    static constexpr ::llvm::StringLiteral kParamAttr = "kiln.param";
    static constexpr ::llvm::StringLiteral kLayerAttr = "kiln.layer";
    static constexpr ::llvm::StringLiteral kInitAttr = "kiln.init";
    static constexpr ::llvm::StringLiteral kInputAttr = "kiln.input";
    static constexpr ::llvm::StringLiteral kStateAttr = "kiln.state";
    static constexpr ::llvm::StringLiteral kOutputAttr = "kiln.output";
    static constexpr ::llvm::StringLiteral kModelAttr = "kiln.model";
    static constexpr ::llvm::StringLiteral kTrainAttr = "kiln.train";
    static constexpr ::llvm::StringLiteral kSourceAttr = "kiln.source";
    static constexpr ::llvm::StringLiteral kDimsAttr = "kiln.dims";
    /// On ops: the repeat iteration that built them ("h.3"); recomputation
    /// works block by block.
    static constexpr ::llvm::StringLiteral kBlockAttr = "kiln.block";
    /// On the module: the device mesh, {axes = ["dp", ...], shape =
    /// array<i64: 4, ...>}, outermost axis first (docs/parallel.md). No
    /// attribute means one device.
    static constexpr ::llvm::StringLiteral kMeshAttr = "kiln.mesh";
    /// On a collective: a unit attribute; the collective is a gradient
    /// bucket's and runs on the communication queue (queue 1), overlapping
    /// the rest of backward (docs/parallel.md).
    static constexpr ::llvm::StringLiteral kOverlapAttr = "kiln.overlap";
    /// On the module: kiln-raise-attention's remarks, one string each (the
    /// fusion report prints them).
    static constexpr ::llvm::StringLiteral kAttentionRemarksAttr = "kiln.attention_remarks";
  }];
}

class Kiln_Op<string mnemonic, list<Trait> traits = []>
    : Op<Kiln_Dialect, mnemonic, traits>;

#endif // KILN_DIALECT_TD
