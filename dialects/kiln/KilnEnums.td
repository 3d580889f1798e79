//===- KilnEnums.td - Enumerations of the kiln dialect -----*- tablegen -*-===//
#ifndef KILN_ENUMS_TD
#define KILN_ENUMS_TD

include "mlir/IR/EnumAttr.td"

def Kiln_CmpEQ : I32EnumAttrCase<"eq", 0>;
def Kiln_CmpNE : I32EnumAttrCase<"ne", 1>;
def Kiln_CmpLT : I32EnumAttrCase<"lt", 2>;
def Kiln_CmpLE : I32EnumAttrCase<"le", 3>;
def Kiln_CmpGT : I32EnumAttrCase<"gt", 4>;
def Kiln_CmpGE : I32EnumAttrCase<"ge", 5>;
def Kiln_CompareDirectionAttr : I32EnumAttr<"CompareDirection",
    "comparison direction",
    [Kiln_CmpEQ, Kiln_CmpNE, Kiln_CmpLT, Kiln_CmpLE, Kiln_CmpGT, Kiln_CmpGE]> {
  let cppNamespace = "::kiln";
}

def Kiln_GeluErf : I32EnumAttrCase<"erf", 0>;
def Kiln_GeluTanh : I32EnumAttrCase<"tanh", 1>;
def Kiln_GeluApproximationAttr : I32EnumAttr<"GeluApproximation",
    "gelu formula: exact (erf) or the tanh approximation",
    [Kiln_GeluErf, Kiln_GeluTanh]> {
  let cppNamespace = "::kiln";
}

def Kiln_ReduceMean : I32EnumAttrCase<"mean", 0>;
def Kiln_ReduceSum : I32EnumAttrCase<"sum", 1>;
def Kiln_ReduceNone : I32EnumAttrCase<"none", 2>;
def Kiln_LossReductionAttr : I32EnumAttr<"LossReduction",
    "how a per-position loss is reduced",
    [Kiln_ReduceMean, Kiln_ReduceSum, Kiln_ReduceNone]> {
  let cppNamespace = "::kiln";
}

def Kiln_RandomUniform : I32EnumAttrCase<"uniform", 0>;
def Kiln_RandomNormal : I32EnumAttrCase<"normal", 1>;
def Kiln_RandomDistributionAttr : I32EnumAttr<"RandomDistribution",
    "distribution of kiln.random", [Kiln_RandomUniform, Kiln_RandomNormal]> {
  let cppNamespace = "::kiln";
}

def Kiln_CollSum : I32EnumAttrCase<"sum", 0>;
def Kiln_CollMean : I32EnumAttrCase<"mean", 1>;
def Kiln_CollMax : I32EnumAttrCase<"max", 2>;
def Kiln_CollMin : I32EnumAttrCase<"min", 3>;
def Kiln_CollectiveReductionAttr : I32EnumAttr<"CollectiveReduction",
    "how a collective combines the group's values",
    [Kiln_CollSum, Kiln_CollMean, Kiln_CollMax, Kiln_CollMin]> {
  let cppNamespace = "::kiln";
}

#endif // KILN_ENUMS_TD
