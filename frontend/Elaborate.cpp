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

#include "dialects/kiln/Sharding.h"
#include "dialects/kiln/TrainSettings.h"

#include "llvm/ADT/DenseSet.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <map>

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
    // A misspelt loss (`los`, `Loss`, `losss`): the nearest variable, with
    // the line that defines it.
    std::vector<std::string> names;
    for (const auto &kv : modelEnv.vars)
      if (kv.second.isTensor())
        names.push_back(kv.first);
    std::sort(names.begin(), names.end());
    std::string near;
    unsigned best = 3;
    for (const std::string &name : names) {
      unsigned d = llvm::StringRef(name).lower() == "loss"
                       ? 0
                       : llvm::StringRef(name).edit_distance("loss", true, best);
      if (d < best) {
        best = d;
        near = "; did you mean '" + name + "' (line " +
               std::to_string(modelEnv.vars.at(name).loc.line) + ")?";
      }
    }
    fail(l, "model '" + m.name + "' defines no 'loss'" +
                (near.empty() ? std::string("; assign") : near + " Assign") +
                " the training objective to a variable named loss (e.g. loss = "
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
  // --batch overrides the train section's batch: the settings say the
  // batch the model was compiled for.
  if (ast_.hasTrain && opts_.batch)
    trainAttrs_.set("batch", b_.getI64IntegerAttr(*opts_.batch));
  if (ast_.hasTrain) {
    mod->setAttr(KilnDialect::kTrainAttr, trainAttrs_.getDictionary(&ctx_));
    // Where the train section and each setting were written, for the ops
    // kiln-train-step builds for them (passes/TrainStep.cpp): the module's
    // location, the header's fused with a NameLoc per setting (not printed
    // without debug info, so the IR listings stay as they were).
    SmallVector<Location> locs{mod.getLoc()};
    locs.append(trainLocs_.begin(), trainLocs_.end());
    mod->setLoc(FusedLoc::get(&ctx_, locs, b_.getStringAttr("kiln.train_locs")));
  }
  // devices = N > 1: a data-parallel mesh; with tp = T > 1, dp x tp =
  // (N / T) x T (docs/parallel.md).
  auto intSetting = [&](llvm::StringRef k) {
    auto a = trainAttrs_.get(k);
    return a ? cast<IntegerAttr>(a).getInt() : int64_t(1);
  };
  // Pipeline stages: `pp = P` in the train section, or the stages that
  // `stage N { ... }` blocks name (layers placed by hand); devices then
  // defaults to pp x tp.
  int64_t tp = intSetting("tp"), pp = intSetting("pp");
  if (maxStage_ >= 0) {
    // With the interleaved schedule the blocks number model chunks, chunk
    // c on device c mod pp: pp x V of them (the train section, set on the
    // module above, gives V).
    int64_t V = virtualStages(mod);
    int64_t chunks = maxStage_ + 1;
    if (trainAttrs_.get("pp") && chunks > pp * V)
      fail(maxStageLoc_,
           V > 1 ? "stage " + std::to_string(maxStage_) + " is not one of the " +
                       std::to_string(pp * V) + " model chunks of the interleaved schedule (pp = " +
                       std::to_string(pp) + " x virtual_stages = " + std::to_string(V) +
                       "); chunks are 0.." + std::to_string(pp * V - 1)
                 : "stage " + std::to_string(maxStage_) + " is not one of the " +
                       std::to_string(pp) + " pipeline stages (pp = " + std::to_string(pp) +
                       " in the train section); stages are 0.." + std::to_string(pp - 1));
    if (V > 1) {
      if (!trainAttrs_.get("pp")) {
        if (chunks % V != 0)
          fail(maxStageLoc_, "the interleaved schedule's stage blocks number model chunks, "
                             "virtual_stages = " + std::to_string(V) +
                                 " per device, but they name " + std::to_string(chunks) +
                                 " (0.." + std::to_string(maxStage_) +
                                 "); name a multiple of " + std::to_string(V) +
                                 " chunks, or set pp");
        pp = chunks / V;
      }
      chunks = pp * V;
    } else {
      pp = std::max(pp, chunks);
      chunks = pp;
    }
    mod->setAttr("kiln.stages_placed", b_.getI64IntegerAttr(chunks));
  }
  int64_t devices = trainAttrs_.get("devices") ? intSetting("devices") : tp * pp;
  if (pp > 1 && !train_rules::ppTpDivideDevices(devices, pp, tp))
    fail(devicesLoc_ ? *devicesLoc_ : ast_.model->loc,
         "devices = " + std::to_string(devices) + " is not a multiple of pp x tp = " +
                              std::to_string(pp) + " x " + std::to_string(tp) +
                              " (devices counts every device: dp x pp x tp)");
  if (pp > 1) {
    trainAttrs_.set("pp", b_.getI64IntegerAttr(pp));
    trainAttrs_.set("devices", b_.getI64IntegerAttr(devices));
    if (ast_.hasTrain)
      mod->setAttr(KilnDialect::kTrainAttr, trainAttrs_.getDictionary(&ctx_));
  }
  setMesh(mod, meshFor(devices, tp, pp));
  checkFp32Layers();
  warnUnusedLayers();
  return std::move(module_);
}

void Elaborator::warnUnusedLayers() {
  // Walk back from the results: an op is live when a live op or the return
  // reads it, a parameter when a live op reads it.
  std::vector<bool> paramUsed(numParams_, false);
  llvm::DenseSet<Operation *> live;
  SmallVector<Operation *> work{entry_->getTerminator()};
  while (!work.empty()) {
    Operation *op = work.pop_back_val();
    for (mlir::Value v : op->getOperands()) {
      if (auto arg = dyn_cast<BlockArgument>(v)) {
        if (arg.getArgNumber() < numParams_)
          paramUsed[arg.getArgNumber()] = true;
      } else if (Operation *def = v.getDefiningOp();
                 def && live.insert(def).second) {
        work.push_back(def);
      }
    }
  }
  // Group the unused parameters by the layer call that made them, and the
  // layer calls by their place in the source (a call in a repeat or a def
  // makes one layer per iteration or use).
  struct Unused {
    LayerCall call;
    std::vector<std::string> params;
  };
  std::vector<Unused> layers;
  std::unordered_map<std::string, size_t> layerIndex;
  for (unsigned i = 0; i < numParams_; ++i) {
    if (paramUsed[i])
      continue;
    const LayerCall &owner = paramOwners_[i];
    auto [it, added] = layerIndex.try_emplace(owner.name, layers.size());
    if (added)
      layers.push_back({owner, {}});
    auto name = func_.getArgAttrOfType<StringAttr>(i, KilnDialect::kParamAttr);
    layers[it->second].params.push_back(name ? name.getValue().str() : "?");
  }
  std::string outputs = func_.getNumResults() > 1 ? "loss or logits" : "loss";
  std::map<std::pair<uint32_t, uint32_t>, std::vector<const Unused *>> bySite;
  for (const Unused &u : layers)
    bySite[{u.call.loc.line, u.call.loc.col}].push_back(&u);
  for (const auto &[site, us] : bySite) {
    const Unused &first = *us.front();
    size_t shown = std::min<size_t>(first.params.size(), 3);
    std::string params;
    for (size_t k = 0; k < shown; ++k)
      params += (k ? ", " : "") + first.params[k];
    if (first.params.size() > shown)
      params += ", ...";
    bool one = first.params.size() == 1;
    std::string message =
        first.call.kind + " layer '" + first.call.name + "' is unused: its "
        "output never reaches " + outputs + ", so its " +
        (one ? "parameter " + params + " gets"
             : std::to_string(first.params.size()) + " parameters (" + params +
                   ") get") +
        " no gradient; use the result or remove the call";
    if (us.size() > 1)
      message += " (likewise the " + std::to_string(us.size() - 1) +
                 " other layer(s) this call makes, up to '" +
                 us.back()->call.name + "')";
    diags_.warning(first.call.loc, message);
  }
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
