//===- FuzzFrontend.cpp - libFuzzer target: a model file through the frontend ===//
//
// Lex, parse, elaborate and verify. An input must end in a module that
// verifies or in an error with file:line:col; IR that fails verification
// (the frontend built something invalid: a Kiln bug), a failure without a
// diagnostic, or a diagnostic without a location aborts, so libFuzzer keeps
// the input. Crashes, leaks and undefined behaviour are ASan's and UBSan's.
// Seeds: examples/*.kiln and the frontend tests' models (test/fuzz/run.sh).
// The op and statement limits are lowered (20000 ops, 200000 statements) so
// that inputs that unroll huge repeats end fast and the fuzzer spends its
// time on the language.
//
//===----------------------------------------------------------------------===//
#include "frontend/Frontend.h"

#include "dialects/kiln/KilnDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"

#include <cstdio>
#include <cstdlib>
#include <string>

using namespace kiln::frontend;

namespace {

[[noreturn]] void bug(const std::string &what, const std::string &detail) {
  std::fprintf(stderr, "kiln frontend bug: %s\n%s\n", what.c_str(), detail.c_str());
  std::abort();
}

mlir::MLIRContext &context(std::string *&mlirDiags) {
  static std::string diags;
  static mlir::MLIRContext *ctx = [] {
    auto *c = new mlir::MLIRContext();
    c->loadDialect<kiln::KilnDialect, mlir::func::FuncDialect>();
    c->getDiagEngine().registerHandler([](mlir::Diagnostic &d) {
      diags += d.str() + "\n";
      return mlir::success();
    });
    return c;
  }();
  mlirDiags = &diags;
  return *ctx;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string *mlirDiags = nullptr;
  mlir::MLIRContext &ctx = context(mlirDiags);
  mlirDiags->clear();
  SourceFile file("fuzz.kiln", std::string(reinterpret_cast<const char *>(data), size));
  DiagEngine diags(file);
  FrontendOptions options;
  // The limits' own behaviour is tested in errors-limits.kiln and
  // errors-robustness.kiln; here they only keep inputs fast.
  options.maxOps = 20'000;
  options.maxSteps = 200'000;
  mlir::OwningOpRef<mlir::ModuleOp> module = buildModule(ctx, file, options, diags);
  if (module) {
    if (mlir::failed(mlir::verify(*module)))
      bug("built IR that fails verification", *mlirDiags);
    return 0;
  }
  if (!diags.hasErrors())
    bug("failed without a diagnostic", file.text());
  const Diagnostic &first = diags.diagnostics().front();
  std::string rendered = diags.render();
  if (first.loc.line == 0 || rendered.rfind("fuzz.kiln:", 0) != 0)
    bug("a diagnostic without file:line:col", rendered);
  return 0;
}
