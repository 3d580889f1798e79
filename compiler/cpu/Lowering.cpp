//===- Lowering.cpp - Kernels to LLVM bitcode for the CPU ----------------===//
//
// The kernel module (kiln on memrefs) through the CPU kernel lowering
// pipeline (passes/Pipelines.cpp) to the LLVM dialect, then LLVM IR; packed
// entry points `void <symbol>(void **buffers, i64 piece)`; 512-bit vectors
// for compute-bound kernels; bitcode, which the runtime compiles for the
// host.
//
//===----------------------------------------------------------------------===//
#include "compiler/cpu/Lowering.h"

#include "dialects/kiln/KilnTraits.h"
#include "passes/Pipelines.h"

#include "mlir/IR/OperationSupport.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Export.h"

#include "llvm/ADT/StringSet.h"
#include "llvm/Bitcode/BitcodeWriter.h"
#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/Module.h"

using namespace mlir;

namespace kiln::cpu {

namespace {

/// Lowers the kernel module (kiln on memrefs) to the LLVM dialect.
LogicalResult lowerKernels(ModuleOp kernels, bool printAfterAll, std::string &error) {
  MLIRContext *ctx = kernels.getContext();
  std::string diags;
  ScopedDiagnosticHandler handler(ctx, [&](Diagnostic &d) {
    llvm::raw_string_ostream os(diags);
    os << d << "\n";
    return success();
  });
  PassManager pm(ctx);
  if (printAfterAll)
    printAfterEveryPass(pm);
  buildCpuKernelLoweringPipeline(pm);
  if (failed(pm.run(kernels))) {
    error = "lowering the kernels to LLVM failed:\n" + diags;
    return failure();
  }
  return success();
}

/// Adds `void <symbol>(ptr %buffers, i64 %piece)` around each
/// `<symbol>_body` (which takes the piece index only when it is split).
void addPackedEntryPoints(llvm::Module &m, const program::Program &p) {
  llvm::LLVMContext &c = m.getContext();
  llvm::Type *ptr = llvm::PointerType::get(c, 0);
  for (const program::Kernel &k : p.kernels) {
    llvm::Function *body = m.getFunction(k.symbol + "_body");
    body->setLinkage(llvm::GlobalValue::InternalLinkage);
    auto *fty = llvm::FunctionType::get(llvm::Type::getVoidTy(c),
                                        {ptr, llvm::Type::getInt64Ty(c)}, false);
    auto *f = llvm::Function::Create(fty, llvm::GlobalValue::ExternalLinkage,
                                     k.symbol, m);
    llvm::IRBuilder<> b(llvm::BasicBlock::Create(c, "entry", f));
    std::vector<llvm::Value *> args;
    for (int i = 0; i < k.numArgs; ++i) {
      llvm::Value *slot = b.CreateConstInBoundsGEP1_64(ptr, f->getArg(0), i);
      args.push_back(b.CreateLoad(ptr, slot));
    }
    if (k.chunks > 1)
      args.push_back(f->getArg(1));
    b.CreateCall(body, args);
    b.CreateRetVoid();
  }
}

} // namespace

LogicalResult emitBitcode(CompiledProgram &out, const CodegenOptions &options,
                          std::string &error) {
  MLIRContext *ctx = out.kernels->getContext();
  OwningOpRef<ModuleOp> lowered = cast<ModuleOp>(out.kernels->getOperation()->clone());
  if (failed(lowerKernels(*lowered, options.printKernelIRAfterAll, error)))
    return failure();
  registerBuiltinDialectTranslation(*ctx);
  registerLLVMDialectTranslation(*ctx);
  llvm::LLVMContext llvmCtx;
  std::unique_ptr<llvm::Module> m = translateModuleToLLVMIR(*lowered, llvmCtx, "kiln_kernels");
  if (!m) {
    error = "translating the kernels to LLVM IR failed";
    return failure();
  }
  addPackedEntryPoints(*m, out.program);
  // Kernels that evaluate transcendental functions (polynomial exp, erf,
  // tanh, log: many FMAs per element) are compute-bound: they may use
  // 512-bit vectors where the CPU has them (LLVM prefers 256 bits on recent
  // Intel cores). Measured on Sapphire Rapids, one thread: GELU 364 -> 278
  // us, softmax -10%. Memory-bound kernels stay at the default (row
  // reductions over 128 features got slower with 512 bits). A preference
  // only: CPUs without AVX-512 ignore it.
  // The ops that do: those KilnOps.td marks Kiln_Transcendental.
  llvm::StringSet<> wide;
  for (const program::Kernel &k : out.program.kernels)
    for (const std::string &op : k.ops) {
      std::optional<RegisteredOperationName> name = RegisteredOperationName::lookup(op, ctx);
      if (name && name->hasTrait<trait::Transcendental>()) {
        wide.insert(k.symbol);
        break;
      }
    }
  for (llvm::Function &f : *m) {
    llvm::StringRef name = f.getName();
    name.consume_back("_body");
    if (!f.isDeclaration() && wide.contains(name))
      f.addFnAttr("prefer-vector-width", "512");
  }
  if (options.keepLLVMText) {
    llvm::raw_string_ostream os(out.llvmIR);
    m->print(os, nullptr);
  }
  llvm::raw_string_ostream bc(out.bitcode);
  llvm::WriteBitcodeToFile(*m, bc);
  return success();
}

} // namespace kiln::cpu
