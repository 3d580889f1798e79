//===- KilnInterfaces.td - Op interfaces of the kiln dialect -*- tablegen -*-===//
#ifndef KILN_INTERFACES_TD
#define KILN_INTERFACES_TD

include "mlir/IR/OpBase.td"

def Kiln_GradientOpInterface : OpInterface<"GradientOpInterface"> {
  let cppNamespace = "::kiln";
  let description = [{
    The reverse-mode derivative of an op: given the gradient of the loss with
    respect to each result (`resultGrads`, null where a result does not
    reach the loss), build the gradient with respect to each operand.
    `operandGrads` gets one entry per operand: a value of the operand's type,
    or null for an operand that is not differentiable (integer indices,
    predicates, seeds). The autodiff pass (passes/Autodiff.cpp) calls it once
    per op, in reverse order, and sums the contributions. Each rule is one
    short function in dialects/kiln/Gradients.cpp.
  }];
  let methods = [
    InterfaceMethod<"Builds the operand gradients at the builder's point.",
      "::llvm::LogicalResult", "buildGradients",
      (ins "::mlir::OpBuilder &":$builder,
           "::mlir::ArrayRef<::mlir::Value>":$resultGrads,
           "::llvm::SmallVectorImpl<::mlir::Value> &":$operandGrads)>,
  ];
}

//===----------------------------------------------------------------------===//
// Cost: one truth per op, declared in KilnOps.td
//===----------------------------------------------------------------------===//

def Kiln_CostOpInterface : OpInterface<"CostOpInterface"> {
  let cppNamespace = "::kiln";
  let description = [{
    What an op costs, declared once per op in KilnOps.td with
    `Kiln_FlopsPerElement<n>`: floating-point operations per element of its
    result (1 for arithmetic, 10 for a transcendental function or a square
    root, a few for the composites). `estimateFlops` counts one execution;
    ops that count another element (a reduction's or cross_entropy's input,
    matmul's 2 k per result element) define it in dialects/kiln/Cost.cpp.
    The compiler's FLOP estimates (kernel flops, kilnc --fusion-report) read
    it; ops without it move data and count 0.
  }];
  let methods = [
    InterfaceMethod<"Floating-point operations per counted element (the "
      "op's Kiln_FlopsPerElement).",
      "int64_t", "getFlopsPerElement", (ins), [{}], [{
        return ConcreteOp::kFlopsPerElement;
      }]>,
    InterfaceMethod<"Estimated floating-point operations of one execution.",
      "int64_t", "estimateFlops", (ins), [{}], [{
        return $_op.getFlopsPerElement() *
               ::llvm::cast<::mlir::ShapedType>($_op->getResult(0).getType())
                   .getNumElements();
      }]>,
  ];
}

// The flops of Kiln_CostOpInterface (kiln::trait::FlopsPerElement<n>).
class Kiln_FlopsPerElement<int n>
    : ParamNativeOpTrait<"FlopsPerElement", !cast<string>(n)> {
  let cppNamespace = "::kiln::trait";
}

// The op evaluates a transcendental function per element (exp, log, tanh,
// erf, sin, pow, ...; polynomials on the CPU): expensive to recompute, so
// kiln-fuse duplicates it only on scalars, and compute-bound, so the CPU
// kernels that contain it prefer 512-bit vectors. Square roots are not:
// they are one instruction.
def Kiln_Transcendental : NativeOpTrait<"Transcendental"> {
  let cppNamespace = "::kiln::trait";
}

//===----------------------------------------------------------------------===//
// Per-op rules the generic passes read (dialects/kiln/OpRules.h). Every
// kiln op but kiln.fusion and kiln.yield answers each (Kiln_ComputeOp in
// KilnOps.td declares them); the answers are in the op's family file,
// dialects/kiln/ops/<Family>.cpp. test/unit/dialect/OpRulesTest.cpp checks
// that every op answers.
//===----------------------------------------------------------------------===//

def Kiln_ShardingOpInterface : OpInterface<"ShardingOpInterface"> {
  let cppNamespace = "::kiln";
  let description = [{
    Sharding propagation (GSPMD's rule per op): the shardings of the op's
    results given its operands' (`none` where an operand's is unknown).
    Returns none when the op cannot take those shardings without
    resharding. kiln-data-parallel and kiln-tensor-parallel propagate with
    it (propagateShardings, dialects/kiln/Sharding.h).
  }];
  let methods = [
    InterfaceMethod<"The results' shardings given the operands'.",
      "::kiln::ShardingResult", "inferResultShardings",
      (ins "::llvm::ArrayRef<::kiln::OperandSharding>":$operands)>,
  ];
}

def Kiln_PrecisionOpInterface : OpInterface<"PrecisionOpInterface"> {
  let cppNamespace = "::kiln";
  let description = [{
    The mixed-precision policy of the op (kiln-mixed-precision): its class
    and rule name in Kiln's own mode and under autocast.
  }];
  let methods = [
    StaticInterfaceMethod<"The op's policy.",
      "::kiln::PrecisionPolicy", "getPrecisionPolicy", (ins)>,
  ];
}

def Kiln_RowLocalityOpInterface : OpInterface<"RowLocalityOpInterface"> {
  let cppNamespace = "::kiln";
  let description = [{
    Over how many leading dimensions of its result the op is row-local, and
    which operands it reads by rows: what kiln-fuse needs to put it in a row
    kernel with its neighbours.
  }];
  let methods = [
    InterfaceMethod<"The op's row locality.",
      "::kiln::RowLocality", "getRowLocality", (ins)>,
  ];
}

def Kiln_IndexUseOpInterface : OpInterface<"IndexUseOpInterface"> {
  let cppNamespace = "::kiln";
  let description = [{
    How the op uses operand `operand` as an integer index: not at all, as an
    index into a dimension of known size, or moved unchanged into its result
    (compiler/IndexRanges: the range the manifest states for an input).
  }];
  let methods = [
    InterfaceMethod<"How operand `operand` is used as an index.",
      "::kiln::IndexUse", "getIndexUse", (ins "unsigned":$operand)>,
  ];
}

#endif // KILN_INTERFACES_TD
