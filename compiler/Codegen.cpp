//===- Codegen.cpp - From the training program to kernels, a plan, code --===//
//
// The driver of compiler/Codegen.h: kernel formation (Kernels.cpp), steps
// and the buffer plan (plan/), CPU lowering (cpu/Lowering.cpp).
//
//===----------------------------------------------------------------------===//
#include "compiler/Codegen.h"

#include "compiler/Generator.h"
#include "compiler/cpu/Lowering.h"

#include "passes/Pipelines.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Bufferization/IR/Bufferization.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"

using namespace mlir;

namespace kiln {


FailureOr<CompiledProgram> compileProgram(ModuleOp module,
                                          const CodegenOptions &options,
                                          std::string &error) {
  MLIRContext *ctx = module.getContext();
  DialectRegistry registry;
  registerCpuKernelLoweringInterfaces(registry);
  ctx->appendDialectRegistry(registry);
  ctx->loadDialect<bufferization::BufferizationDialect, memref::MemRefDialect,
                   arith::ArithDialect>();
  codegen::Generator gen(module, options.fusion, error, options.printIRAfterAll);
  if (failed(gen.run()))
    return failure();
  CompiledProgram out;
  out.program = gen.takeProgram();
  out.kernels = gen.takeKernels();
  out.neutralKernels = gen.takeNeutralKernels();
  out.refusals = gen.takeRefusals();
  if (auto remarks = module->getAttrOfType<ArrayAttr>(KilnDialect::kAttentionRemarksAttr))
    for (Attribute r : remarks)
      out.attentionRemarks.push_back(cast<StringAttr>(r).str());
  out.activations = gen.takeActivations();
  if (!options.emitLLVM)
    return out;
  if (failed(cpu::emitBitcode(out, options, error)))
    return failure();
  return out;
}

} // namespace kiln
