//===- kilnc.cpp - The Kiln compiler driver -------------------------------===//
//
//   kilnc MODEL.kiln                 summary: ops, parameters, counts
//   kilnc MODEL.kiln --emit=mlir     the verified kiln module
//
// Exit codes: 0 success, 1 user error (bad model file or flags), 2 internal
// error (a bug in Kiln).
//
//===----------------------------------------------------------------------===//
#include "compiler/Summary.h"
#include "frontend/Frontend.h"
#include "runtime/core/Log.h"

#include "dialects/kiln/KilnDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OperationSupport.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Signals.h"
#include "llvm/Support/ToolOutputFile.h"

#include <cstdio>

using namespace llvm;

namespace {
cl::OptionCategory kilncCategory("kilnc options");

cl::opt<std::string> inputFile(cl::Positional, cl::desc("<model.kiln>"),
                               cl::Required, cl::cat(kilncCategory));

enum class Emit { Summary, Mlir };
cl::opt<Emit> emit(
    "emit", cl::desc("What to print"), cl::init(Emit::Summary),
    cl::values(clEnumValN(Emit::Summary, "summary",
                          "ops, parameters, parameter count (default)"),
               clEnumValN(Emit::Mlir, "mlir",
                          "the verified kiln-dialect module (@forward)")),
    cl::cat(kilncCategory));

cl::opt<std::string> outputFile("o", cl::desc("Write output to <file>"),
                                cl::value_desc("file"), cl::init("-"),
                                cl::cat(kilncCategory));

cl::list<std::string> dims("dim",
                           cl::desc("Size of a free dimension, e.g. --dim B=12"),
                           cl::value_desc("NAME=SIZE"), cl::cat(kilncCategory));

cl::opt<int64_t> batch("batch",
                       cl::desc("Batch size (overrides the train section)"),
                       cl::init(0), cl::cat(kilncCategory));

cl::list<std::string> params(
    "param", cl::desc("Override a model parameter, e.g. --param layers=2"),
    cl::value_desc("NAME=VALUE"), cl::cat(kilncCategory));

cl::opt<bool> debugInfo("debuginfo",
                        cl::desc("Print source locations (file:line:col) on "
                                 "every op with --emit=mlir"),
                        cl::init(false), cl::cat(kilncCategory));

cl::opt<std::string> logLevel("log-level",
                              cl::desc("error, warn, info or debug "
                                       "(default: $KILN_LOG or info)"),
                              cl::init(""), cl::cat(kilncCategory));

int userError(const std::string &message) {
  std::fprintf(stderr, "kilnc: error: %s\n", message.c_str());
  return 1;
}

bool splitAssign(const std::string &s, std::string &name, std::string &value) {
  size_t eq = s.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == s.size())
    return false;
  name = s.substr(0, eq);
  value = s.substr(eq + 1);
  return true;
}
} // namespace

int main(int argc, char **argv) {
  sys::PrintStackTraceOnErrorSignal(argv[0]);
  cl::HideUnrelatedOptions(kilncCategory);
  cl::SetVersionPrinter([](raw_ostream &os) {
    os << "kilnc (Kiln) 0.1.0, MLIR " << LLVM_VERSION_STRING << "\n";
  });
  cl::ParseCommandLineOptions(
      argc, argv,
      "kilnc: compile a Kiln model file (.kiln)\n\n"
      "  kilnc MODEL.kiln                 print a summary (ops, parameters)\n"
      "  kilnc MODEL.kiln --emit=mlir     print the verified kiln module\n\n"
      "Exit codes: 0 success, 1 user error, 2 internal error.\n");

  if (!logLevel.empty()) {
    kiln::log::Level level;
    if (!kiln::log::parseLevel(logLevel, level))
      return userError("--log-level must be error, warn, info or debug");
    kiln::log::setLevel(level);
  }

  kiln::frontend::FrontendOptions opts;
  for (const std::string &d : dims) {
    std::string name, value;
    char *end = nullptr;
    if (!splitAssign(d, name, value))
      return userError("--dim expects NAME=SIZE, got '" + d + "'");
    long long v = std::strtoll(value.c_str(), &end, 10);
    if (*end != '\0' || v < 1 || v > kiln::frontend::kMaxDimSize)
      return userError("--dim " + d + ": the size must be a positive integer");
    opts.dims[name] = v;
  }
  for (const std::string &p : params) {
    std::string name, value;
    if (!splitAssign(p, name, value))
      return userError("--param expects NAME=VALUE, got '" + p + "'");
    opts.params[name] = value;
  }
  if (batch.getNumOccurrences()) {
    if (batch < 1 || batch > kiln::frontend::kMaxDimSize)
      return userError("--batch must be a positive integer");
    opts.batch = batch;
  }

  auto buffer = MemoryBuffer::getFileOrSTDIN(inputFile, /*IsText=*/false,
                                             /*RequiresNullTerminator=*/false);
  if (std::error_code ec = buffer.getError())
    return userError("cannot read '" + inputFile + "': " + ec.message());
  if (sys::fs::is_directory(inputFile))
    return userError("'" + inputFile + "' is a directory, not a model file");

  kiln::frontend::SourceFile source(inputFile, (*buffer)->getBuffer().str());
  kiln::frontend::DiagEngine diags(source);

  mlir::MLIRContext context;
  context.loadDialect<kiln::KilnDialect, mlir::func::FuncDialect>();
  std::string mlirDiags;
  mlir::ScopedDiagnosticHandler handler(&context, [&](mlir::Diagnostic &d) {
    llvm::raw_string_ostream os(mlirDiags);
    os << d.getLocation() << ": " << d << "\n";
    return mlir::success();
  });

  mlir::OwningOpRef<mlir::ModuleOp> module =
      kiln::frontend::buildModule(context, source, opts, diags);
  if (!module) {
    std::fputs(diags.render().c_str(), stderr);
    if (!diags.hasErrors()) {
      std::fprintf(stderr, "kilnc: internal error: no module and no "
                           "diagnostic for '%s'\n", inputFile.c_str());
      return 2;
    }
    return 1;
  }
  if (mlir::failed(mlir::verify(*module))) {
    std::fprintf(stderr,
                 "kilnc: internal error: the frontend built invalid IR for "
                 "'%s'; please report this with the model file.\n%s",
                 inputFile.c_str(), mlirDiags.c_str());
    return 2;
  }

  std::string error;
  auto output = mlir::openOutputFile(outputFile, &error);
  if (!output)
    return userError(error);
  if (emit == Emit::Mlir) {
    mlir::OpPrintingFlags flags;
    if (debugInfo)
      flags.enableDebugInfo(/*enable=*/true, /*prettyForm=*/false);
    module->print(output->os(), flags);
    output->os() << "\n";
  } else {
    kiln::print(kiln::summarize(*module), output->os());
  }
  output->keep();
  return 0;
}
