//===- Jit.cpp - CPU kernels through LLVM ORC -----------------------------===//
#include "runtime/cpu/Jit.h"

#include "runtime/core/Checkpoint.h" // crc32

#include "llvm/Bitcode/BitcodeReader.h"
#include "llvm/ExecutionEngine/Orc/ExecutionUtils.h"
#include "llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h"
#include "llvm/ExecutionEngine/Orc/LLJIT.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/LegacyPassManager.h"
#include "llvm/IR/Module.h"
#include "llvm/IR/Verifier.h"
#include "llvm/Passes/PassBuilder.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SHA256.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/Target/TargetMachine.h"
#include "llvm/TargetParser/Host.h"

#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <unistd.h>

namespace kiln::cpu {

struct KernelLibrary::Impl {
  std::unique_ptr<llvm::orc::LLJIT> jit;
};

KernelLibrary::KernelLibrary() : impl_(std::make_unique<Impl>()) {}
KernelLibrary::~KernelLibrary() = default;

std::string defaultCacheDir() {
  if (const char *d = std::getenv("KILN_CACHE_DIR"))
    return d;
  if (const char *x = std::getenv("XDG_CACHE_HOME"); x && *x)
    return std::string(x) + "/kiln";
  if (const char *h = std::getenv("HOME"); h && *h)
    return std::string(h) + "/.cache/kiln";
  return "";
}

namespace {

std::string errorText(llvm::Error e) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << e;
  return s;
}

std::string readFile(const std::string &path, bool &ok) {
  std::ifstream in(path, std::ios::binary);
  ok = bool(in);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// Writes `bytes` then a CRC-32 trailer, atomically (temp file + rename).
void writeCache(const std::string &path, const std::string &bytes) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary);
    uint32_t crc = ckpt::crc32(bytes.data(), bytes.size());
    out.write(bytes.data(), std::streamsize(bytes.size()));
    out.write(reinterpret_cast<const char *>(&crc), 4);
    if (!out)
      return (void)std::remove(tmp.c_str());
  }
  std::rename(tmp.c_str(), path.c_str());
}

} // namespace

Expected<std::unique_ptr<KernelLibrary>>
KernelLibrary::load(const std::string &bitcode, const std::string &origin,
                    const JitOptions &options, JitStats *stats) {
  static bool initialized = [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    return true;
  }();
  (void)initialized;
  JitStats local;
  JitStats &st = stats ? *stats : local;

  auto jtmb = llvm::orc::JITTargetMachineBuilder::detectHost();
  if (!jtmb)
    return Status::error("cannot target this CPU: " + errorText(jtmb.takeError()));
  jtmb->setCodeGenOptLevel(llvm::CodeGenOptLevel::Aggressive);
  st.cpu = jtmb->getCPU();
  std::string features = jtmb->getFeatures().getString();

  // The cache key covers everything that changes the object code.
  llvm::SHA256 sha;
  sha.update(bitcode);
  sha.update(jtmb->getTargetTriple().str());
  sha.update(st.cpu);
  sha.update(features);
  sha.update(LLVM_VERSION_STRING "-O3-kiln1");
  std::string key;
  for (uint8_t b : sha.final())
    key += fmt::format("{:02x}", b);

  std::string object;
  if (!options.cacheDir.empty()) {
    st.cachePath = options.cacheDir + "/cpu-" + key + ".o";
    bool ok = false;
    std::string cached = readFile(st.cachePath, ok);
    if (ok && cached.size() > 4) {
      uint32_t crc;
      std::memcpy(&crc, cached.data() + cached.size() - 4, 4);
      cached.resize(cached.size() - 4);
      if (crc == ckpt::crc32(cached.data(), cached.size())) {
        object = std::move(cached);
        st.cacheHit = true;
      }
    }
  }

  if (object.empty()) {
    auto t0 = std::chrono::steady_clock::now();
    llvm::LLVMContext ctx;
    auto module = llvm::parseBitcodeFile(
        llvm::MemoryBufferRef(bitcode, origin), ctx);
    if (!module)
      return Status::error(fmt::format(
          "{}: the CPU kernels are not valid LLVM bitcode ({}); recompile the "
          "model with kilnc", origin, errorText(module.takeError())));
    llvm::Module &m = **module;
    if (llvm::verifyModule(m, &llvm::errs()))
      return Status::error(origin + ": the CPU kernels fail LLVM verification; "
                           "recompile the model with kilnc");
    auto tm = jtmb->createTargetMachine();
    if (!tm)
      return Status::error("cannot create a target machine: " + errorText(tm.takeError()));
    m.setTargetTriple((*tm)->getTargetTriple().str());
    m.setDataLayout((*tm)->createDataLayout());
    for (llvm::Function &f : m) {
      if (f.isDeclaration())
        continue;
      f.addFnAttr("target-cpu", st.cpu);
      f.addFnAttr("target-features", features);
    }
    {
      llvm::LoopAnalysisManager lam;
      llvm::FunctionAnalysisManager fam;
      llvm::CGSCCAnalysisManager cgam;
      llvm::ModuleAnalysisManager mam;
      llvm::PassBuilder pb(tm->get());
      pb.registerModuleAnalyses(mam);
      pb.registerCGSCCAnalyses(cgam);
      pb.registerFunctionAnalyses(fam);
      pb.registerLoopAnalyses(lam);
      pb.crossRegisterProxies(lam, fam, cgam, mam);
      llvm::ModulePassManager mpm =
          pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O3);
      mpm.run(m, mam);
    }
    llvm::SmallVector<char, 0> buffer;
    {
      llvm::raw_svector_ostream os(buffer);
      llvm::legacy::PassManager pm;
      if ((*tm)->addPassesToEmitFile(pm, os, nullptr, llvm::CodeGenFileType::ObjectFile))
        return Status::internal("this LLVM cannot emit object files for the host");
      pm.run(m);
    }
    object.assign(buffer.begin(), buffer.end());
    st.compileSeconds = std::chrono::duration<double>(
        std::chrono::steady_clock::now() - t0).count();
    if (!st.cachePath.empty() &&
        !llvm::sys::fs::create_directories(options.cacheDir))
      writeCache(st.cachePath, object);
  }

  auto jit = llvm::orc::LLJITBuilder().setJITTargetMachineBuilder(*jtmb).create();
  if (!jit)
    return Status::internal("cannot start the JIT: " + errorText(jit.takeError()));
  // Kernels call libm (expf, erff, ...) and malloc/free from the process.
  auto gen = llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(
      (*jit)->getDataLayout().getGlobalPrefix());
  if (!gen)
    return Status::internal("cannot resolve process symbols: " + errorText(gen.takeError()));
  (*jit)->getMainJITDylib().addGenerator(std::move(*gen));
  if (llvm::Error e = (*jit)->addObjectFile(
          llvm::MemoryBuffer::getMemBufferCopy(object, origin + ".o")))
    return Status::error(origin + ": cannot load the kernel object: " + errorText(std::move(e)));
  std::unique_ptr<KernelLibrary> lib(new KernelLibrary());
  lib->impl_->jit = std::move(*jit);
  return lib;
}

KernelFn KernelLibrary::lookup(const std::string &symbol, std::string *error) {
  auto addr = impl_->jit->lookup(symbol);
  if (!addr) {
    std::string text = errorText(addr.takeError());
    if (error)
      *error = text;
    return nullptr;
  }
  return addr->toPtr<KernelFn>();
}

} // namespace kiln::cpu
