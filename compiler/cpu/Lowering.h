//===- Lowering.h - Kernels to LLVM bitcode for the CPU ----------*- C++ -*-===//
#ifndef KILN_COMPILER_CPU_LOWERING_H
#define KILN_COMPILER_CPU_LOWERING_H

#include "compiler/Codegen.h"

#include <string>

namespace kiln::cpu {

/// Lowers `out.kernels` (a copy of it) to LLVM IR with a packed entry point
/// per program kernel and writes `out.bitcode` (and `out.llvmIR` when
/// `options.keepLLVMText`). Fails with `error` set.
mlir::LogicalResult emitBitcode(CompiledProgram &out, const CodegenOptions &options,
                                std::string &error);

} // namespace kiln::cpu

#endif // KILN_COMPILER_CPU_LOWERING_H
