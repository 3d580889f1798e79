//===- kiln-opt.cpp - The mlir-opt of Kiln --------------------------------===//
//
// Parses, verifies, transforms and prints IR with the kiln dialect and the
// upstream dialects Kiln uses. Every Kiln pass and pipeline is registered here
// so that lit tests can reach it.
//
//===----------------------------------------------------------------------===//
#include "dialects/kiln/KilnDialect.h"
#include "passes/Passes.h"
#include "passes/Pipelines.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Bufferization/IR/Bufferization.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  // The kiln dialect and the upstream dialects its lowering produces (and
  // that tests use to run lowered code: bufferization, memref).
  registry.insert<kiln::KilnDialect, mlir::func::FuncDialect,
                  mlir::arith::ArithDialect, mlir::math::MathDialect,
                  mlir::linalg::LinalgDialect, mlir::tensor::TensorDialect,
                  mlir::bufferization::BufferizationDialect,
                  mlir::memref::MemRefDialect, mlir::scf::SCFDialect>();
  kiln::registerCpuKernelLoweringInterfaces(registry);
  mlir::registerCanonicalizerPass();
  mlir::registerCSEPass();
  mlir::registerInlinerPass();
  mlir::registerSymbolDCEPass();
  kiln::registerKilnPasses();
  kiln::registerKilnPipelines();
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "Kiln optimizer driver\n", registry));
}
