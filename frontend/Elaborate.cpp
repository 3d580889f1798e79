//===- Elaborate.cpp - Semantic checks and IR building for .kiln ----------===//
//
// The driver: model parameters, the train section, the model body, and
// the @forward function with its argument and result attributes.
// frontend/elaborate/Elaborator.h says where each part of the elaborator
// lives.
//
//===----------------------------------------------------------------------===//
#include "frontend/Frontend.h"
#include "frontend/Parser.h"
#include "frontend/elaborate/Elaborator.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace kiln::frontend {
namespace elab {

//===----------------------------------------------------------------------===//
// Model parameters and the driver
//===----------------------------------------------------------------------===//

void Elaborator::registerBuiltins() {
  registerTensorBuiltins();
  registerLayerBuiltins();
}

void Elaborator::evalModelParams(const ModelDecl &m) {
  for (const Param &p : m.params) {
    Val v;
    auto over = opts_.params.find(p.name);
    if (over != opts_.params.end()) {
      const std::string &text = over->second;
      char *end = nullptr;
      errno = 0;
      long long iv = std::strtoll(text.c_str(), &end, 10);
      if (!text.empty() && *end == '\0' && errno == 0) {
        v = scalarInt(iv, p.loc);
      } else {
        double dv = std::strtod(text.c_str(), &end);
        if (text == "true" || text == "false") {
          v.kind = Val::Kind::Bool;
          v.b = text == "true";
          v.loc = p.loc;
        } else if (!text.empty() && *end == '\0' && std::isfinite(dv)) {
          v = scalarFloat(dv, p.loc);
        } else {
          fail(p.loc, "--param " + p.name + "=" + text +
                          " is not a number or true/false");
        }
      }
    } else {
      v = eval(*p.defaultValue, paramEnv_);
    }
    if (v.isTensor())
      fail(p.loc, "model parameter '" + p.name + "' must be a constant");
    if (v.kind == Val::Kind::Int)
      v.s = p.name;
    paramEnv_.vars[p.name] = v;
  }
  for (const auto &kv : opts_.params)
    if (!paramEnv_.vars.count(kv.first))
      fail(m.loc, "--param " + kv.first + ": model '" + m.name +
                      "' has no parameter '" + kv.first + "'");
}

OwningOpRef<ModuleOp> Elaborator::run() {
  const ModelDecl &m = *ast_.model;
  registerBuiltins();
  Location mloc = loc(m.loc);
  module_ = ModuleOp::create(mloc);
  b_.setInsertionPointToEnd(module_->getBody());
  func_ = b_.create<func::FuncOp>(mloc, "forward", b_.getFunctionType({}, {}));
  entry_ = func_.addEntryBlock();
  b_.setInsertionPointToEnd(entry_);

  for (const DefDecl &d : ast_.defs)
    if (builtins_.count(d.name)) {
      SourceLoc l = d.loc;
      l.length = d.name.size();
      fail(l, "def '" + d.name + "' would hide the builtin '" + d.name +
                  "'; pick another name");
    }
  evalModelParams(m);
  evalTrain();

  Env modelEnv;
  modelEnv.parent = &paramEnv_;
  std::optional<Val> ret;
  execBlock(m.body, modelEnv, /*inDef=*/false, /*topLevel=*/true, ret);

  for (const auto &kv : opts_.dims) {
    if (paramEnv_.vars.count(kv.first))
      fail(m.loc, "--dim " + kv.first + ": '" + kv.first + "' is a model "
                  "parameter; use --param " + kv.first + "=" +
                  std::to_string(kv.second));
    if (!usedDims_.count(kv.first))
      fail(m.loc, "--dim " + kv.first + ": model '" + m.name +
                  "' has no free dimension '" + kv.first + "'");
  }
  auto lossIt = modelEnv.vars.find("loss");
  if (lossIt == modelEnv.vars.end()) {
    SourceLoc l = m.loc;
    l.length = m.name.size();
    fail(l, "model '" + m.name + "' defines no 'loss'; assign the training "
            "objective to a variable named loss (e.g. loss = "
            "cross_entropy(logits, targets))");
  }
  const Val &loss = lossIt->second;
  if (!loss.isTensor() || !loss.shape.empty() || !isFloat(loss.dtype))
    fail(loss.loc, "'loss' must be a floating-point scalar tensor, got " +
                       describe(loss) + "; reduce it with mean() or sum()");
  SmallVector<mlir::Value> results{loss.value};
  SmallVector<StringRef> resultNames{"loss"};
  auto logitsIt = modelEnv.vars.find("logits");
  if (logitsIt != modelEnv.vars.end()) {
    const Val &logits = logitsIt->second;
    if (!logits.isTensor() || !isFloat(logits.dtype))
      fail(logits.loc, "'logits' must be a floating-point tensor, got " +
                           describe(logits));
    results.push_back(logits.value);
    resultNames.push_back("logits");
  }
  b_.create<func::ReturnOp>(mloc, results);

  SmallVector<Type> argTypes(entry_->getArgumentTypes());
  SmallVector<Type> resultTypes;
  for (mlir::Value v : results)
    resultTypes.push_back(v.getType());
  func_.setFunctionType(b_.getFunctionType(argTypes, resultTypes));
  SmallVector<DictionaryAttr> argAttrs;
  for (NamedAttrList &a : paramAttrs_)
    argAttrs.push_back(a.getDictionary(&ctx_));
  for (NamedAttrList &a : inputAttrs_)
    argAttrs.push_back(a.getDictionary(&ctx_));
  func_.setAllArgAttrs(argAttrs);
  for (size_t i = 0; i < resultNames.size(); ++i)
    func_.setResultAttr(i, KilnDialect::kOutputAttr,
                        b_.getStringAttr(resultNames[i]));

  ModuleOp mod = *module_;
  mod->setAttr(KilnDialect::kModelAttr, b_.getStringAttr(m.name));
  mod->setAttr(KilnDialect::kSourceAttr, b_.getStringAttr(file_.name()));
  mod->setAttr(KilnDialect::kDimsAttr, dimBindings_.getDictionary(&ctx_));
  if (ast_.hasTrain)
    mod->setAttr(KilnDialect::kTrainAttr, trainAttrs_.getDictionary(&ctx_));
  return std::move(module_);
}

} // namespace elab

using namespace mlir;
using elab::Abort;
using elab::Elaborator;

OwningOpRef<ModuleOp> elaborate(MLIRContext &ctx, const SourceFile &file,
                                const FileAST &ast,
                                const FrontendOptions &options,
                                DiagEngine &diags) {
  ctx.loadDialect<KilnDialect, func::FuncDialect>();
  Elaborator e(ctx, file, ast, options, diags);
  try {
    return e.run();
  } catch (const Abort &) {
    return nullptr;
  }
}

OwningOpRef<ModuleOp> buildModule(MLIRContext &ctx, const SourceFile &file,
                                  const FrontendOptions &options,
                                  DiagEngine &diags) {
  std::optional<FileAST> ast = parse(file, diags);
  if (!ast)
    return nullptr;
  return elaborate(ctx, file, *ast, options, diags);
}

} // namespace kiln::frontend
