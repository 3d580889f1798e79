//===- Elementwise.h - Scalar semantics of the elementwise ops --*- C++ -*-===//
//
// One table entry per elementwise kiln op (and gelu per approximation): what
// it computes for one element, written once per form that needs it:
//   reference  the value in double (float operands): the semantics the
//              reference interpreter is checked against
//              (test/unit/compiler/ElementwiseTableTest.cpp);
//   cuda       the CUDA C++ expression (float or double, or integer
//              operands), used by compiler/cuda/Values.cpp;
//   build      the arith/math body of its linalg.generic, used by
//              passes/LowerToLinalg.cpp (buildScalarOp).
// compare, select and cast convert between element types and are written
// by each consumer; everything else elementwise is here.
//
// Adding an elementwise op: its ODS def, one entry in Elementwise.cpp, its
// gradient rule; the CPU and CUDA code follow.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_DIALECTS_KILN_ELEMENTWISE_H
#define KILN_DIALECTS_KILN_ELEMENTWISE_H

#include "mlir/IR/Builders.h"
#include "mlir/IR/Operation.h"
#include "llvm/ADT/ArrayRef.h"

#include <string>

namespace kiln::elementwise_table {

/// A CUDA C++ literal for `v`: `1.0f` / `1.0`, NaN and infinities by their
/// bits.
std::string cudaFloatLiteral(double v, bool isDouble);

/// What a CUDA expression is written from.
struct CudaOperands {
  llvm::ArrayRef<std::string> a; ///< the operands' C++ expressions
  bool isFloat = true;           ///< float operands (else integer)
  bool isDouble = false;         ///< double operands (else float)
  /// A float literal of the operand type.
  std::string lit(double v) const { return cudaFloatLiteral(v, isDouble); }
  /// A one-argument math function of a[0] (`expf(x)` / `exp(x)`).
  std::string fn(const char *name) const;
  /// The float/double suffix of CUDA's math functions ("f" or "").
  const char *suffix() const { return isDouble ? "" : "f"; }
};

/// What an arith/math body is built from.
struct ScalarOperands {
  mlir::OpBuilder &b;
  mlir::Location loc;
  mlir::ValueRange a; ///< the operands' scalar values
  mlir::Type t;       ///< a[0]'s type
  bool isFloat;       ///< t is a float type
  /// A float constant of type t.
  mlir::Value f(double v) const;
  /// An integer constant of type t.
  mlir::Value i(int64_t v) const;
};

struct Entry {
  const char *name; ///< "kiln.add", "kiln.gelu(erf)"
  int arity;        ///< 1 or 2
  /// The value for float operands, in double (b unused by unary ops).
  double (*reference)(double a, double b);
  /// The CUDA C++ expression.
  std::string (*cuda)(const CudaOperands &);
  /// The arith/math computation (inside a linalg.generic body).
  mlir::Value (*build)(const ScalarOperands &);
};

/// Every entry, in a fixed order.
llvm::ArrayRef<Entry> entries();

/// The entry for `op` (gelu by its approximation), or null.
const Entry *lookup(mlir::Operation *op);

} // namespace kiln::elementwise_table

#endif // KILN_DIALECTS_KILN_ELEMENTWISE_H
