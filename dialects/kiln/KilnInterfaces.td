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

#endif // KILN_INTERFACES_TD
