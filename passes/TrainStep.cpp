//===- TrainStep.cpp - The whole training program from @forward -----------===//
//
// Builds @init, @grad, @train_step, @eval_step and @predict. Every formula
// (schedules, clipping, optimizers, the no-decay rule, dropout seeds) is
// written down in docs/training.md; keep the two in step.
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"
#include "passes/Precision.h"

#include "dialects/kiln/KilnDialect.h"
#include "dialects/kiln/KilnOps.h"
#include "dialects/kiln/Sharding.h"
#include "dialects/kiln/Precision.h"
#include "dialects/kiln/TrainSettings.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/IRMapping.h"

#include <cmath>
#include <limits>

using namespace mlir;

namespace kiln {
#define GEN_PASS_DEF_KILNTRAINSTEPPASS
#include "passes/Passes.h.inc"

namespace {

struct Param {
  unsigned arg;
  std::string name, layer;
  RankedTensorType type;
  DictionaryAttr init;
  bool decay;
};

struct Input {
  unsigned arg;
  std::string name;
  RankedTensorType type;
};

struct Config {
  std::string optimizer = "adamw";
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weightDecay = 0.0;
  double momentum = 0.0;
  bool nesterov = false;
  std::string schedule = "constant";
  int64_t warmup = 0, decaySteps = -1, steps = 1, gradAccum = 1, seed = 0;
  double minLr = 0.0, gradClip = 0.0;
  bool recompute = false;
  int64_t zero = 0;
  /// Loss scaling: "" (the precision's default: dynamic for fp16, none
  /// otherwise), "dynamic", "static" or "none"; GradScaler's defaults.
  std::string lossScale;
  double scaleInit = 65536.0, growthFactor = 2.0, backoffFactor = 0.5;
  int64_t growthInterval = 2000;
  /// deterministic = "devices" (docs/parallel.md "The same bits on any
  /// device count"): each micro-step is one chunk of the global batch; the
  /// chunks' gradients and losses are added in a pairwise tree and scaled
  /// by 1 / chunks, and the data-parallel reductions are tree-ordered sums.
  bool deterministic = false;
  int64_t chunks = 0;
};

/// The rule kiln-mixed-precision gives the one cast per parameter that low
/// ops read (dialects/kiln/Precision.h); the train step turns it into state.
constexpr StringLiteral kMasterWeightCopyRule = kRuleMasterWeightCopy;
/// On the cast of that copy's gradient back to fp32 in @train_step.
constexpr StringLiteral kMasterWeightGradRule = "master-weight-grad";

Config readConfig(ModuleOp m) {
  Config c;
  TrainSettings t(m);
  if (!t)
    return c;
  if (TrainSettings o{t.section("optimizer")}) {
    c.optimizer = o.string("name", c.optimizer);
    c.lr = o.number("lr", c.lr);
    c.beta1 = o.number("beta1", c.beta1);
    c.beta2 = o.number("beta2", c.beta2);
    c.eps = o.number("eps", c.eps);
    c.weightDecay = o.number("weight_decay", c.weightDecay);
    c.momentum = o.number("momentum", c.momentum);
    c.nesterov = o.boolean("nesterov", c.nesterov);
  }
  if (TrainSettings s{t.section("schedule")}) {
    c.schedule = s.string("name", c.schedule);
    c.warmup = s.integer("warmup", 0);
    c.minLr = s.number("min_lr", 0.0);
    c.decaySteps = s.integer("decay_steps", -1);
  }
  c.steps = t.integer("steps", 1);
  c.gradAccum = t.integer("grad_accum", 1);
  c.seed = t.integer("seed", 0);
  c.gradClip = t.number("grad_clip", 0.0);
  c.recompute = t.boolean("recompute", c.recompute);
  c.zero = t.zero();
  c.deterministic = t.deterministicDevices();
  c.chunks = t.integer("deterministic_chunks", 0);
  if (TrainSettings ls{t.section("loss_scale")}) {
    c.lossScale = ls.string("name", c.lossScale);
    c.scaleInit = ls.number("init", c.scaleInit);
    c.growthFactor = ls.number("growth_factor", c.growthFactor);
    c.backoffFactor = ls.number("backoff_factor", c.backoffFactor);
    c.growthInterval = int64_t(ls.number("growth_interval", double(c.growthInterval)));
    if (c.lossScale == "static")
      c.growthFactor = c.backoffFactor = 1.0;
  }
  if (c.decaySteps < 0)
    c.decaySteps = c.steps;
  return c;
}

/// Scalar (rank-0 f32) and broadcasting helpers.
struct S {
  OpBuilder &b;
  Location loc;
  RankedTensorType f32() { return RankedTensorType::get({}, b.getF32Type()); }
  /// An exact integer constant (no trip through double).
  Value icst(uint64_t v, RankedTensorType t) {
    return b.create<ConstantOp>(
        loc, DenseElementsAttr::get(
                 t, IntegerAttr::get(t.getElementType(), APInt(64, v))));
  }
  Value cst(double v, RankedTensorType t = {}) {
    if (!t)
      t = f32();
    Attribute a = isa<FloatType>(t.getElementType())
                      ? Attribute(FloatAttr::get(t.getElementType(), v))
                      : Attribute(IntegerAttr::get(t.getElementType(), int64_t(v)));
    return b.create<ConstantOp>(loc, DenseElementsAttr::get(t, a));
  }
  Value add(Value x, Value y) { return b.create<AddOp>(loc, x, y); }
  Value sub(Value x, Value y) { return b.create<SubOp>(loc, x, y); }
  Value mul(Value x, Value y) { return b.create<MulOp>(loc, x, y); }
  Value div(Value x, Value y) { return b.create<DivOp>(loc, x, y); }
  Value sqrt(Value x) { return b.create<SqrtOp>(loc, x); }
  Value min(Value x, Value y) { return b.create<MinOp>(loc, x, y); }
  Value pow(Value x, Value y) { return b.create<PowOp>(loc, x, y); }
  Value select(Value p, Value x, Value y) { return b.create<SelectOp>(loc, p, x, y); }
  Value lt(Value x, Value y) { return b.create<CompareOp>(loc, CompareDirection::lt, x, y); }
  Value gt(Value x, Value y) { return b.create<CompareOp>(loc, CompareDirection::gt, x, y); }
  /// Broadcasts a rank-0 value to `t`.
  Value splat(Value scalar, RankedTensorType t) {
    if (t.getRank() == 0)
      return scalar;
    return b.create<BroadcastInDimOp>(loc, t, scalar, ArrayRef<int64_t>{});
  }
  Value sumAll(Value x) {
    auto t = cast<RankedTensorType>(x.getType());
    if (t.getRank() == 0)
      return x;
    SmallVector<int64_t> axes;
    for (int64_t d = 0; d < t.getRank(); ++d)
      axes.push_back(d);
    return b.create<ReduceSumOp>(loc, t.clone(ArrayRef<int64_t>{}), x,
                                 b.getDenseI64ArrayAttr(axes), UnitAttr());
  }
};

class Builder {
public:
  Builder(ModuleOp m, func::FuncOp fwd) : m_(m), fwd_(fwd), b_(m.getContext()) {
    for (auto [i, arg] : llvm::enumerate(fwd.getArguments())) {
      auto type = cast<RankedTensorType>(arg.getType());
      if (auto p = fwd.getArgAttrOfType<StringAttr>(i, KilnDialect::kParamAttr)) {
        Param info{unsigned(i), p.getValue().str(), "", type,
                   fwd.getArgAttrOfType<DictionaryAttr>(i, KilnDialect::kInitAttr),
                   false};
        if (auto l = fwd.getArgAttrOfType<StringAttr>(i, KilnDialect::kLayerAttr))
          info.layer = l.getValue().str();
        // The no-decay rule: only weight matrices of linear layers and of
        // free parameters (param) decay.
        info.decay = (info.layer == "linear" || info.layer == "param") &&
                     type.getRank() >= 2;
        params_.push_back(info);
      } else if (auto in = fwd.getArgAttrOfType<StringAttr>(i, KilnDialect::kInputAttr)) {
        if (in.getValue() == "dropout_seed")
          dropoutSeedArg_ = int(i);
        else
          inputs_.push_back({unsigned(i), in.getValue().str(), type});
      }
    }
    cfg_ = readConfig(m);
    auto ret = cast<func::ReturnOp>(fwd.getBody().front().getTerminator());
    hasLogits_ = ret.getNumOperands() > 1;
    if (auto p = m->getAttrOfType<StringAttr>(kPrecisionAttr))
      precision_ = p.getValue().str();
    scaler_ = cfg_.lossScale == "dynamic" || cfg_.lossScale == "static" ||
              (cfg_.lossScale.empty() && precision_ == "fp16");
    collectMasterCopies();
  }

  /// The master-weight-copy casts of @forward, per parameter. Under ZeRO
  /// (the update runs on this device's block) they stay plain casts.
  void collectMasterCopies() {
    lowCasts_.resize(params_.size());
    lowType_.resize(params_.size());
    direct_.assign(params_.size(), true);
    if (getMesh(m_).axisSize("dp") > 1 && cfg_.zero > 0)
      return;
    llvm::DenseMap<unsigned, size_t> paramOf;
    for (auto [i, p] : llvm::enumerate(params_))
      paramOf[p.arg] = i;
    for (Operation &op : fwd_.getBody().front()) {
      auto c = dyn_cast<CastOp>(op);
      auto rule =
          c ? c->getAttrOfType<StringAttr>(kPrecisionRuleAttr) : StringAttr();
      if (!rule || rule.getValue() != kMasterWeightCopyRule)
        continue;
      auto a = dyn_cast<BlockArgument>(c.getOperand());
      auto it = a ? paramOf.find(a.getArgNumber()) : paramOf.end();
      if (it == paramOf.end()) {
        badCopy_ = c;
        continue;
      }
      auto t = cast<RankedTensorType>(c.getType());
      if (lowType_[it->second] && lowType_[it->second] != t)
        badCopy_ = c;
      lowType_[it->second] = t;
      lowCasts_[it->second].push_back(c);
    }
    for (auto [i, p] : llvm::enumerate(params_))
      if (lowType_[i])
        direct_[i] =
            llvm::any_of(fwd_.getArgument(p.arg).getUsers(), [&](Operation *u) {
              return !llvm::is_contained(lowCasts_[i], u);
            });
  }

  /// Rejects a kiln.train the builder cannot honour (the frontend checks the
  /// same things; this protects hand-written or transformed modules).
  LogicalResult validate() {
    auto bad = [&](const Twine &why) {
      return m_.emitError() << "kiln.train: " << why;
    };
    if (cfg_.optimizer != "sgd" && cfg_.optimizer != "adam" && cfg_.optimizer != "adamw")
      return bad("unknown optimizer '" + cfg_.optimizer + "' (expected sgd, adam or adamw)");
    if (cfg_.schedule != "constant" && cfg_.schedule != "linear_warmup" &&
        cfg_.schedule != "cosine")
      return bad("unknown schedule '" + cfg_.schedule +
                 "' (expected constant, linear_warmup or cosine)");
    if (cfg_.gradAccum < 1 || cfg_.steps < 1 || cfg_.warmup < 0)
      return bad("grad_accum and steps must be >= 1 and warmup >= 0");
    if (!cfg_.lossScale.empty() && cfg_.lossScale != "dynamic" &&
        cfg_.lossScale != "static" && cfg_.lossScale != "none")
      return bad("unknown loss_scale '" + cfg_.lossScale +
                 "' (expected dynamic, static or none)");
    if (scaler_ && (!(cfg_.scaleInit > 0) || !std::isfinite(cfg_.scaleInit) ||
                    cfg_.scaleInit > 3.4e38 || cfg_.growthInterval < 1 ||
                    !(cfg_.growthFactor >= 1) || !(cfg_.backoffFactor > 0) ||
                    !(cfg_.backoffFactor <= 1)))
      return bad("loss_scale needs 0 < init <= 3.4e38, growth_interval >= 1, "
                 "growth_factor >= 1 and 0 < backoff_factor <= 1");
    if (cfg_.deterministic) {
      int64_t dp = std::max<int64_t>(1, getMesh(m_).axisSize("dp"));
      auto pow2 = [](int64_t v) { return v >= 1 && (v & (v - 1)) == 0; };
      if (!pow2(dp) || !pow2(cfg_.gradAccum) || cfg_.chunks != dp * cfg_.gradAccum)
        return bad("deterministic = \"devices\" needs power-of-two dp devices and "
                   "grad_accum with dp x grad_accum = deterministic_chunks (one chunk per "
                   "micro-step; kilnc sets this up), got " +
                   Twine(dp) + " x " + Twine(cfg_.gradAccum) + " and " + Twine(cfg_.chunks));
      if (getMesh(m_).axisSize("tp") > 1 || getMesh(m_).axisSize("pp") > 1 || cfg_.zero > 1)
        return bad("deterministic = \"devices\" covers data parallelism with zero <= 1 only");
    }
    if (badCopy_)
      return badCopy_.emitOpError()
             << "has " << kPrecisionRuleAttr << " = \"" << kMasterWeightCopyRule
             << "\" but does not read a parameter argument of @forward (or "
                "casts it to a second type); kiln-mixed-precision leaves one "
                "such cast per parameter";
    return success();
  }

  LogicalResult buildInit();
  LogicalResult buildGrad();
  LogicalResult buildTrainStep(int64_t &numOps);
  LogicalResult buildEvalStep();
  LogicalResult buildPredict();
  SmallVector<Value> inferenceFunction(StringRef name);

private:
  ModuleOp m_;
  func::FuncOp fwd_;
  OpBuilder b_;
  std::vector<Param> params_;
  std::vector<Input> inputs_;
  int dropoutSeedArg_ = -1;
  Config cfg_;
  bool hasLogits_ = false;
  func::FuncOp current_; ///< set by inferenceFunction()
  std::string precision_; ///< the module's kiln.precision ("" for fp32)
  bool scaler_ = false;   ///< loss scaling compiled into @train_step
  /// Per parameter: @forward's master-weight-copy casts of it, their type
  /// (null: none) and whether @forward also reads it directly.
  std::vector<SmallVector<CastOp>> lowCasts_;
  std::vector<RankedTensorType> lowType_;
  std::vector<bool> direct_;
  CastOp badCopy_;

  /// The low copy of a parameter value, tagged as the pass tags its casts.
  Value lowCopy(Value w, size_t i, StringRef rule = kMasterWeightCopyRule) {
    return lowCopy(w, i, loc(), rule);
  }
  Value lowCopy(Value w, size_t i, Location at, StringRef rule = kMasterWeightCopyRule) {
    auto c = b_.create<CastOp>(at, lowType_[i], w);
    c->setAttr(kPrecisionRuleAttr, b_.getStringAttr(rule));
    return c;
  }

  Location loc() { return fwd_.getLoc(); }

  /// Where the ops built for a train setting come from: named `what`
  /// ("optimizer (adamw)"), at the first of `keys` the train section
  /// wrote, else at the train section, else at the model's header (the
  /// frontend fuses a NameLoc per setting into the module's location,
  /// tagged "kiln.train_locs"). So a profile and the fusion report show
  /// the optimizer's kernels at the optimizer's line, not the model's first.
  Location settingLoc(const std::string &what, ArrayRef<StringRef> keys) {
    Location at = loc();
    auto fused = dyn_cast<FusedLoc>(m_.getLoc());
    auto tag = fused ? dyn_cast_or_null<StringAttr>(fused.getMetadata()) : StringAttr();
    if (tag && tag.getValue() == "kiln.train_locs") {
      auto find = [&](StringRef key) -> std::optional<Location> {
        for (Location l : fused.getLocations())
          if (auto n = dyn_cast<NameLoc>(l); n && n.getName().getValue() == key)
            return n.getChildLoc();
        return std::nullopt;
      };
      std::optional<Location> found;
      for (StringRef k : keys)
        if (!found)
          found = find(k);
      if (!found)
        found = find("train");
      if (found)
        at = *found;
    }
    return NameLoc::get(b_.getStringAttr(what), at);
  }

  /// Optimizer state slots per parameter.
  std::vector<std::string> slots() const {
    if (cfg_.optimizer == "adam" || cfg_.optimizer == "adamw")
      return {"m", "v"};
    if (cfg_.optimizer == "sgd" && cfg_.momentum != 0.0)
      return {"momentum"};
    return {};
  }

  func::FuncOp newFunc(StringRef name) {
    b_.setInsertionPointToEnd(m_.getBody());
    auto f = b_.create<func::FuncOp>(loc(), name, b_.getFunctionType({}, {}));
    b_.setInsertionPointToEnd(f.addEntryBlock());
    return f;
  }

  /// Argument attributes waiting for finish() (the function type is only
  /// final once every argument exists).
  std::vector<NamedAttrList> pendingArgAttrs_;

  BlockArgument addArg(func::FuncOp f, Type t, Location l, StringRef attr,
                       StringRef value) {
    BlockArgument a = f.getBody().front().addArgument(t, l);
    pendingArgAttrs_.resize(a.getArgNumber() + 1);
    pendingArgAttrs_[a.getArgNumber()].set(attr, b_.getStringAttr(value));
    return a;
  }

  void finish(func::FuncOp f, ArrayRef<Value> results,
              ArrayRef<std::string> names) {
    b_.create<func::ReturnOp>(loc(), results);
    SmallVector<Type> types;
    for (Value v : results)
      types.push_back(v.getType());
    f.setFunctionType(b_.getFunctionType(f.getBody().front().getArgumentTypes(), types));
    pendingArgAttrs_.resize(f.getNumArguments());
    for (unsigned i = 0; i < f.getNumArguments(); ++i)
      if (!pendingArgAttrs_[i].empty())
        f.setArgAttrs(i, pendingArgAttrs_[i].getDictionary(f.getContext()));
    pendingArgAttrs_.clear();
    for (auto [i, n] : llvm::enumerate(names))
      f.setResultAttr(i, KilnDialect::kOutputAttr, b_.getStringAttr(n));
    eraseDeadOps(f.getBody().front());
  }

  /// Clones @forward's ops at the insertion point with `map` giving the
  /// arguments; with `noDropout`, dropout ops become the identity. Returns
  /// the mapped results (loss first).
  SmallVector<Value> cloneForward(IRMapping &map, bool noDropout) {
    for (Operation &op : fwd_.getBody().front()) {
      if (auto ret = dyn_cast<func::ReturnOp>(op)) {
        SmallVector<Value> out;
        for (Value v : ret.getOperands())
          out.push_back(map.lookup(v));
        return out;
      }
      // Results mapped beforehand (master-weight copies read from state).
      if (op.getNumResults() == 1 && map.contains(op.getResult(0)))
        continue;
      if (noDropout)
        if (auto d = dyn_cast<DropoutOp>(op)) {
          map.map(d.getResult(), map.lookup(d.getOperand()));
          continue;
        }
      // Fused attention's dropout off as well (and its seed no operand).
      if (noDropout)
        if (auto a = dyn_cast<AttentionOp>(op); a && a.getSeed()) {
          auto c = b_.create<AttentionOp>(
              a.getLoc(), map.lookup(a.getQuery()), map.lookup(a.getKey()),
              map.lookup(a.getValue()), a.getMask() ? map.lookup(a.getMask()) : Value(),
              Value(), a.getScaleAttr(), a.getCausalAttr(), b_.getF64FloatAttr(0.0),
              a.getSaltAttr());
          for (NamedAttribute attr : a->getDiscardableAttrs())
            c->setAttr(attr.getName(), attr.getValue());
          map.map(a.getResult(), c.getResult());
          map.map(a.getLse(), c.getLse());
          continue;
        }
      b_.clone(op, map);
    }
    return {};
  }

  /// Adds params (and, if asked, data inputs) as arguments of f.
  void addParamArgs(func::FuncOp f, SmallVectorImpl<Value> &out) {
    for (const Param &p : params_)
      out.push_back(addArg(f, p.type, loc(), KilnDialect::kParamAttr, p.name));
  }
};

LogicalResult Builder::buildInit() {
  func::FuncOp f = newFunc("init");
  S s{b_, loc()};
  auto seedType = RankedTensorType::get({}, b_.getI64Type());
  Value seed = addArg(f, seedType, loc(), KilnDialect::kInputAttr, "seed");
  SmallVector<Value> results;
  std::vector<std::string> names;
  for (auto [i, p] : llvm::enumerate(params_)) {
    StringRef kind = p.init ? p.init.getAs<StringAttr>("kind").getValue() : "zeros";
    Value v;
    if (kind == "normal" || kind == "uniform") {
      bool normal = kind == "normal";
      Value r = b_.create<RandomOp>(loc(), p.type,
                                    normal ? RandomDistribution::normal
                                           : RandomDistribution::uniform,
                                    seed, int64_t(i));
      TrainSettings init(p.init); // the initializer's settings
      double a = normal ? init.number("std", 0.02)
                        : init.number("high", 0) - init.number("low", 0);
      double c = normal ? init.number("mean", 0) : init.number("low", 0);
      v = s.add(s.mul(r, s.cst(a, p.type)), s.cst(c, p.type));
    } else {
      v = s.cst(kind == "ones" ? 1.0 : 0.0, p.type);
    }
    results.push_back(v);
    names.push_back(p.name);
  }
  for (const std::string &slot : slots())
    for (const Param &p : params_) {
      results.push_back(s.cst(0.0, p.type));
      names.push_back(slot + ":" + p.name);
    }
  for (auto [i, p] : llvm::enumerate(params_))
    if (lowType_[i]) {
      results.push_back(lowCopy(results[i], i));
      names.push_back("lowp:" + p.name);
    }
  if (scaler_) {
    results.append({s.cst(cfg_.scaleInit), s.cst(0.0), s.cst(0.0)});
    names.insert(names.end(),
                 {"loss_scale", "scale_good_steps", "skipped_steps"});
  }
  finish(f, results, names);
  return success();
}

LogicalResult Builder::buildGrad() {
  func::FuncOp f = newFunc("grad");
  IRMapping map;
  SmallVector<Value> ps;
  for (auto [i, arg] : llvm::enumerate(fwd_.getArguments())) {
    BlockArgument a = f.getBody().front().addArgument(arg.getType(), arg.getLoc());
    map.map(arg, a);
    if (fwd_.getArgAttr(i, KilnDialect::kParamAttr))
      ps.push_back(a);
  }
  pendingArgAttrs_.clear();
  for (unsigned i = 0; i < fwd_.getNumArguments(); ++i)
    pendingArgAttrs_.emplace_back(fwd_.getArgAttrDict(i));
  SmallVector<Value> outs = cloneForward(map, /*noDropout=*/false);
  FailureOr<SmallVector<Value>> grads = buildReverseSweep(b_, outs[0], ps);
  if (failed(grads))
    return failure();
  SmallVector<Value> results{outs[0]};
  std::vector<std::string> names{"loss"};
  results.append(grads->begin(), grads->end());
  for (const Param &p : params_)
    names.push_back("grad:" + p.name);
  finish(f, results, names);
  return success();
}

LogicalResult Builder::buildTrainStep(int64_t &numOps) {
  func::FuncOp f = newFunc("train_step");
  S s{b_, loc()};
  SmallVector<Value> ps;
  addParamArgs(f, ps);
  std::vector<std::string> slotNames = slots();
  std::vector<SmallVector<Value>> state(slotNames.size());
  for (auto [k, slot] : llvm::enumerate(slotNames))
    for (const Param &p : params_)
      state[k].push_back(addArg(f, p.type, loc(), KilnDialect::kStateAttr, slot + ":" + p.name));
  // Mixed precision: the low copy of each parameter low ops read is state
  // (written by the update below), and the loss scaler's state.
  SmallVector<Value> lowps(params_.size());
  for (auto [i, p] : llvm::enumerate(params_))
    if (lowType_[i])
      lowps[i] = addArg(f, lowType_[i], loc(), KilnDialect::kStateAttr,
                        "lowp:" + p.name);
  Value scale, goodSteps, skipped, invScale;
  if (scaler_) {
    scale = addArg(f, s.f32(), loc(), KilnDialect::kStateAttr, "loss_scale");
    goodSteps =
        addArg(f, s.f32(), loc(), KilnDialect::kStateAttr, "scale_good_steps");
    skipped =
        addArg(f, s.f32(), loc(), KilnDialect::kStateAttr, "skipped_steps");
  }
  int64_t K = cfg_.gradAccum;
  SmallVector<Value> ins;
  for (const Input &in : inputs_) {
    RankedTensorType t = in.type;
    if (K > 1) {
      SmallVector<int64_t> shape(t.getShape());
      if (shape.empty())
        return fwd_.emitError() << "grad_accum needs batched inputs; '"
                                << in.name << "' is a scalar";
      shape[0] *= K;
      t = t.clone(shape);
    }
    ins.push_back(addArg(f, t, loc(), KilnDialect::kInputAttr, in.name));
  }
  auto i64 = RankedTensorType::get({}, b_.getI64Type());
  Value step = addArg(f, i64, loc(), KilnDialect::kInputAttr, "step");
  // Data parallelism (a mesh with dp > 1; docs/parallel.md): the device's
  // coordinate on dp is one more input, dropout seeds mix it in, and the
  // values kiln-data-parallel rewrites are tagged. Without a mesh nothing
  // here changes, so single-device programs stay byte-identical.
  int64_t dp = getMesh(m_).axisSize("dp");
  bool mesh = dp > 1;
  Value replica;
  if (mesh)
    replica = addArg(f, i64, loc(), KilnDialect::kInputAttr, "replica");
  Block *body = &f.getBody().front();
  if (scaler_)
    invScale = s.div(s.cst(1.0), scale);

  // Pipeline parallelism: every op built below is tagged with its
  // micro-batch and phase (kiln.pp.mb, kiln.pp.phase: -1 before the
  // micro-batches, 0 forward, 1 backward), which kiln-pipeline orders
  // into the schedule and then drops.
  bool pipeline = getMesh(m_).axisSize("pp") > 1;
  auto tagNew = [&](int64_t k, int64_t phase) {
    if (!pipeline)
      return;
    for (Operation &op : *body)
      if (!op.hasAttr("kiln.pp.phase")) {
        op.setAttr("kiln.pp.mb", b_.getI64IntegerAttr(k));
        op.setAttr("kiln.pp.phase", b_.getI64IntegerAttr(phase));
      }
  };
  tagNew(0, -1);
  // Forward and backward per micro-batch.
  Value lossSum;
  SmallVector<Value> gradSum(params_.size());
  // deterministic = "devices": per parameter (and for the loss), the
  // partial sums not yet paired, as (tree level, value); adding micro-step
  // k's value pairs equal levels like a binary counter, so K = 2^j steps
  // end in the pairwise tree ((c0 + c1) + (c2 + c3)) + ... that the
  // communicator's tree order continues over devices.
  std::vector<SmallVector<std::pair<int, Value>>> treeOf(params_.size());
  SmallVector<std::pair<int, Value>> lossTree;
  auto laterOf = [](Value a, Value b) {
    Operation *da = a.getDefiningOp(), *db = b.getDefiningOp();
    if (!da)
      return b;
    if (!db)
      return a;
    return da->isBeforeInBlock(db) ? b : a;
  };
  auto addToTree = [&](SmallVector<std::pair<int, Value>> &tree, Value v, bool place) {
    int level = 0;
    while (!tree.empty() && tree.back().first == level) {
      Value left = tree.back().second;
      tree.pop_back();
      if (place)
        b_.setInsertionPointAfterValue(laterOf(left, v));
      v = s.add(left, v);
      ++level;
    }
    tree.push_back({level, v});
    return v;
  };
  for (int64_t k = 0; k < K; ++k) {
    IRMapping map;
    for (auto [p, v] : llvm::zip(params_, ps))
      map.map(fwd_.getArgument(p.arg), v);
    for (auto [casts, v] : llvm::zip(lowCasts_, lowps))
      for (CastOp c : casts)
        map.map(c.getResult(), v);
    for (auto [in, v] : llvm::zip(inputs_, ins)) {
      Value x = v;
      if (K > 1) {
        RankedTensorType full = cast<RankedTensorType>(v.getType());
        SmallVector<int64_t> start(full.getRank(), 0), limit(full.getShape()),
            stride(full.getRank(), 1);
        int64_t rows = in.type.getDimSize(0);
        start[0] = k * rows;
        limit[0] = (k + 1) * rows;
        x = b_.create<SliceOp>(loc(), v, start, limit, stride);
      }
      map.map(fwd_.getArgument(in.arg), x);
    }
    if (dropoutSeedArg_ >= 0) {
      // seed = train.seed * 1000003 + step * grad_accum + k (wrapping u64)
      uint64_t base = uint64_t(cfg_.seed) * 1000003ull + uint64_t(k);
      // With dp = N: ... + (step * N + replica) * grad_accum + k.
      Value round = mesh ? s.add(s.mul(step, s.icst(uint64_t(dp), i64)), replica)
                         : step;
      Value seed = s.add(s.mul(round, s.icst(uint64_t(K), i64)), s.icst(base, i64));
      map.map(fwd_.getArgument(dropoutSeedArg_), seed);
    }
    SmallVector<Value> outs = cloneForward(map, /*noDropout=*/false);
    tagNew(k, 0);
    // Gradients with respect to the parameters and their low copies; the
    // loss scaler seeds the sweep with the scale.
    SmallVector<Value> wrt(ps.begin(), ps.end());
    for (Value v : lowps)
      if (v)
        wrt.push_back(v);
    Value seed;
    if (scaler_) {
      auto lt = cast<RankedTensorType>(outs[0].getType());
      seed = scale;
      if (lt != s.f32())
        seed = b_.create<CastOp>(loc(), lt, scale);
    }
    FailureOr<SmallVector<Value>> grads =
        buildReverseSweep(b_, outs[0], wrt, nullptr, cfg_.recompute, seed);
    if (failed(grads))
      return failure();
    // A parameter's gradient: through its direct uses plus its low copy's
    // gradient cast back to fp32 (the cast's own gradient rule), so the
    // accumulation over micro-batches and everything after it is fp32.
    for (size_t i = 0, j = params_.size(); i < params_.size(); ++i) {
      if (!lowps[i])
        continue;
      OpBuilder::InsertionGuard guard(b_);
      Value low = (*grads)[j++];
      b_.setInsertionPointAfterValue(low);
      auto c = b_.create<CastOp>(loc(), params_[i].type, low);
      c->setAttr(kPrecisionRuleAttr, b_.getStringAttr(kMasterWeightGradRule));
      Value g = c;
      if (direct_[i]) {
        Value d = (*grads)[i];
        Operation *dd = d.getDefiningOp(), *gd = g.getDefiningOp();
        if (dd && gd->isBeforeInBlock(dd))
          b_.setInsertionPointAfter(dd);
        g = s.add(d, g);
      }
      (*grads)[i] = g;
    }
    grads->resize(params_.size());
    if (cfg_.deterministic) {
      // The tree adds float32 losses (a bf16 loss would round at each level).
      Value l = outs[0];
      if (cast<RankedTensorType>(l.getType()) != s.f32())
        l = b_.create<CastOp>(loc(), s.f32(), l);
      lossSum = addToTree(lossTree, l, false);
    } else {
      lossSum = lossSum ? s.add(lossSum, outs[0]) : outs[0];
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      // With a mesh, each accumulated gradient is built as soon as backward
      // has produced its last contribution, so its all-reduce can start
      // while the rest of backward runs; kiln.dp.grad marks it.
      if (mesh) {
        Value after = (*grads)[i];
        Operation *g = after.getDefiningOp();
        Operation *prev = gradSum[i] ? gradSum[i].getDefiningOp() : nullptr;
        if (prev && (!g || g->isBeforeInBlock(prev)))
          after = gradSum[i];
        b_.setInsertionPointAfterValue(after);
      }
      if (cfg_.deterministic)
        gradSum[i] = addToTree(treeOf[i], (*grads)[i], mesh);
      else
        gradSum[i] = gradSum[i] ? s.add(gradSum[i], (*grads)[i]) : (*grads)[i];
      if (mesh && k == K - 1) {
        // With loss scaling the mean also unscales: the reduced gradients
        // (and the norm kiln-data-parallel computes from them) are unscaled.
        // deterministic = "devices": 1 / chunks here (a power of two:
        // exact, so scaling each device's subtree scales the whole tree;
        // kiln-data-parallel then sums) and the unscale after the
        // tree-ordered sum, as on one device.
        Value factor = s.cst(1.0 / double(K * (cfg_.deterministic ? dp : 1)));
        if (scaler_ && !cfg_.deterministic)
          factor = s.mul(factor, invScale);
        gradSum[i] = s.mul(gradSum[i], s.splat(factor, params_[i].type));
        gradSum[i].getDefiningOp()->setAttr(kDpGradAttr, b_.getStringAttr(params_[i].name));
      }
      if (mesh)
        b_.setInsertionPointToEnd(body);
    }
    tagNew(k, 1);
  }
  Value loss = lossSum;
  SmallVector<Value> grads = gradSum;
  if (mesh) {
    // deterministic = "devices": K = chunks / dp, so each device's 1 / K
    // becomes the tree sum's 1 / chunks over dp (the pass sums, not means).
    loss = s.mul(loss, s.cst(1.0 / double(K * (cfg_.deterministic ? dp : 1)),
                             cast<RankedTensorType>(loss.getType())));
    loss.getDefiningOp()->setAttr(kDpLossAttr, b_.getUnitAttr());
  } else if (K > 1) {
    loss = s.mul(loss, s.cst(1.0 / double(K), cast<RankedTensorType>(loss.getType())));
    for (auto [g, p] : llvm::zip(grads, params_))
      g = s.mul(g, s.splat(s.cst(1.0 / double(K)), p.type));
  }
  if (scaler_ && (!mesh || cfg_.deterministic))
    for (auto [g, p] : llvm::zip(grads, params_))
      g = s.mul(g, s.splat(invScale, p.type));

  // Global gradient norm and clipping (PyTorch's clip_grad_norm_). Under
  // tensor parallelism the parameters split over tp come first: their sum
  // of squares is one partial sum over tp, which kiln-tensor-parallel then
  // all-reduces once (a single-device program keeps parameter order).
  s.loc = settingLoc(cfg_.gradClip > 0 ? "gradient norm and clipping" : "gradient norm",
                     {"grad_clip", "optimizer"});
  Value sq;
  int64_t tpSize = getMesh(m_).axisSize("tp");
  bool tp = tpSize > 1;
  for (int pass = tp ? 0 : 1; pass < 2; ++pass)
    for (auto [g, p] : llvm::zip(grads, params_)) {
      bool split = tp && tpSplits(fwd_.getArgAttrDict(p.arg), p.type, tpSize);
      if (tp && split != (pass == 0))
        continue;
      Value x = g;
      if (cfg_.deterministic && p.type.getRank() != 1) {
        // One order for every device count: a sum over the flat gradient,
        // as kiln-data-parallel's buckets hand it back on several devices
        // (a [R, C] sum adds in another order).
        auto flat = RankedTensorType::get({p.type.getNumElements()}, p.type.getElementType());
        x = b_.create<ReshapeOp>(s.loc, flat, g);
      }
      Value t = s.sumAll(s.mul(x, x));
      sq = sq ? s.add(sq, t) : t;
    }
  Value norm = s.sqrt(sq ? sq : s.cst(0.0));
  // deterministic = "devices": every device has the whole reduced
  // gradient, and computes the norm from it as one device does.
  if (mesh && !cfg_.deterministic)
    norm.getDefiningOp()->setAttr(kDpGradNormAttr, b_.getUnitAttr());
  if (cfg_.gradClip > 0) {
    Value factor = s.min(s.cst(1.0), s.div(s.cst(cfg_.gradClip),
                                           s.add(norm, s.cst(1e-6))));
    for (auto [g, p] : llvm::zip(grads, params_))
      g = s.mul(g, s.splat(factor, p.type));
  }

  // Learning rate at this step.
  // The step as a float: Adam's t, and the schedule's input.
  Location optimizerLoc = settingLoc("optimizer (" + cfg_.optimizer + ")", {"optimizer"});
  Value it = b_.create<CastOp>(optimizerLoc, s.f32(), step);
  s.loc = settingLoc("learning rate (" + cfg_.schedule + ")", {"schedule", "optimizer"});
  Value lr = s.cst(cfg_.lr);
  if (cfg_.schedule == "linear_warmup" && cfg_.warmup > 0) {
    lr = s.mul(lr, s.min(s.cst(1.0), s.div(s.add(it, s.cst(1.0)),
                                           s.cst(double(cfg_.warmup)))));
  } else if (cfg_.schedule == "cosine") {
    double w = double(cfg_.warmup), d = double(cfg_.decaySteps);
    Value warm = s.mul(s.cst(cfg_.lr), s.div(s.add(it, s.cst(1.0)), s.cst(w + 1.0)));
    Value ratio = s.div(s.sub(it, s.cst(w)), s.cst(std::max(1.0, d - w)));
    Value coeff = s.mul(s.cst(0.5), s.add(s.cst(1.0),
                                          b_.create<CosOp>(s.loc, s.mul(s.cst(M_PI), ratio))));
    Value decay = s.add(s.cst(cfg_.minLr), s.mul(coeff, s.cst(cfg_.lr - cfg_.minLr)));
    Value after = s.select(s.gt(it, s.cst(d)), s.cst(cfg_.minLr), decay);
    lr = s.select(s.lt(it, s.cst(w)), warm, after);
  }

  // Optimizer.
  s.loc = optimizerLoc;
  SmallVector<Value> newParams;
  std::vector<SmallVector<Value>> newState(slotNames.size());
  // Adam's t counts applied steps: a step the loss scaler skipped does not
  // advance it (as torch.optim.Adam under GradScaler).
  Value t1 = s.add(scaler_ ? s.sub(it, skipped) : it, s.cst(1.0));
  Value bc1 = s.sub(s.cst(1.0), s.pow(s.cst(cfg_.beta1), t1));
  Value bc2 = s.sub(s.cst(1.0), s.pow(s.cst(cfg_.beta2), t1));
  for (auto [i, p] : llvm::enumerate(params_)) {
    RankedTensorType t = p.type;
    Value w = ps[i], g = grads[i];
    auto c = [&](double v) { return s.splat(s.cst(v), t); };
    Value lrT = s.splat(lr, t);
    double wd = p.decay ? cfg_.weightDecay : 0.0;
    if (cfg_.optimizer == "sgd") {
      if (wd != 0)
        g = s.add(g, s.mul(c(wd), w));
      Value update = g;
      if (cfg_.momentum != 0) {
        Value buf = s.add(s.mul(c(cfg_.momentum), state[0][i]), g);
        newState[0].push_back(buf);
        update = cfg_.nesterov ? s.add(g, s.mul(c(cfg_.momentum), buf)) : buf;
      }
      newParams.push_back(s.sub(w, s.mul(lrT, update)));
      continue;
    }
    bool adamw = cfg_.optimizer == "adamw";
    if (!adamw && wd != 0)
      g = s.add(g, s.mul(c(wd), w)); // Adam: L2 added to the gradient
    Value m = s.add(s.mul(c(cfg_.beta1), state[0][i]), s.mul(c(1 - cfg_.beta1), g));
    Value v = s.add(s.mul(c(cfg_.beta2), state[1][i]),
                    s.mul(c(1 - cfg_.beta2), s.mul(g, g)));
    Value mhat = s.div(m, s.splat(bc1, t));
    Value vhat = s.div(v, s.splat(bc2, t));
    Value update = s.div(mhat, s.add(s.sqrt(vhat), c(cfg_.eps)));
    if (adamw && wd != 0)
      update = s.add(update, s.mul(c(wd), w)); // decoupled weight decay
    newParams.push_back(s.sub(w, s.mul(lrT, update)));
    newState[0].push_back(m);
    newState[1].push_back(v);
  }

  // Loss scaling: a step whose gradients are not all finite (found by the
  // global norm, the same on every data-parallel device) changes nothing
  // but the scaler; GradScaler's update of the scale.
  SmallVector<Value> scalerOut;
  if (scaler_) {
    s.loc = settingLoc("loss scaling", {"loss_scale", "precision"});
    Value inf = s.cst(std::numeric_limits<double>::infinity());
    for (auto [i, p] : llvm::enumerate(params_)) {
      Value ok = s.lt(s.splat(norm, p.type), s.splat(inf, p.type));
      newParams[i] = s.select(ok, newParams[i], ps[i]);
      for (size_t k = 0; k < slotNames.size(); ++k)
        newState[k][i] = s.select(ok, newState[k][i], state[k][i]);
    }
    Value ok = s.lt(norm, inf);
    Value good1 = s.add(goodSteps, s.cst(1.0));
    Value grow = b_.create<CompareOp>(s.loc, CompareDirection::ge, good1,
                                      s.cst(double(cfg_.growthInterval)));
    Value grown = s.mul(scale, s.cst(cfg_.growthFactor));
    grown = s.select(s.lt(grown, inf), grown, scale); // never to infinity
    Value cleanScale = s.select(grow, grown, scale);
    Value cleanGood = s.select(grow, s.cst(0.0), good1);
    scalerOut = {
        s.select(ok, cleanScale, s.mul(scale, s.cst(cfg_.backoffFactor))),
        s.select(ok, cleanGood, s.cst(0.0)),
        s.select(ok, skipped, s.add(skipped, s.cst(1.0)))};
  }

  SmallVector<Value> results(newParams.begin(), newParams.end());
  std::vector<std::string> names;
  for (const Param &p : params_)
    names.push_back(p.name);
  for (auto [k, slot] : llvm::enumerate(slotNames))
    for (auto [i, p] : llvm::enumerate(params_)) {
      results.push_back(newState[k][i]);
      names.push_back(slot + ":" + p.name);
    }
  // The new low copies, computed from the new parameters: the fusion pass
  // puts each in its parameter's update kernel.
  for (auto [i, p] : llvm::enumerate(params_))
    if (lowps[i]) {
      results.push_back(lowCopy(newParams[i], i, optimizerLoc));
      names.push_back("lowp:" + p.name);
    }
  if (scaler_) {
    results.append(scalerOut);
    names.insert(names.end(),
                 {"loss_scale", "scale_good_steps", "skipped_steps"});
  }
  results.append({loss, norm, lr});
  names.insert(names.end(), {"loss", "grad_norm", "lr"});
  finish(f, results, names);
  numOps = 0;
  f.walk([&](Operation *) { ++numOps; });
  numOps -= 1; // the function itself
  return success();
}

/// A function taking (params..., inputs...) with @forward cloned into it,
/// dropout off; returns @forward's mapped results.
SmallVector<Value> Builder::inferenceFunction(StringRef name) {
  func::FuncOp f = newFunc(name);
  SmallVector<Value> ps;
  addParamArgs(f, ps);
  IRMapping map;
  for (auto [p, v] : llvm::zip(params_, ps))
    map.map(fwd_.getArgument(p.arg), v);
  for (const Input &in : inputs_)
    map.map(fwd_.getArgument(in.arg),
            addArg(f, in.type, loc(), KilnDialect::kInputAttr, in.name));
  current_ = f;
  return cloneForward(map, /*noDropout=*/true);
}

LogicalResult Builder::buildEvalStep() {
  SmallVector<Value> outs = inferenceFunction("eval_step");
  finish(current_, {outs[0]}, {"loss"});
  return success();
}

LogicalResult Builder::buildPredict() {
  if (!hasLogits_)
    return success();
  SmallVector<Value> outs = inferenceFunction("predict");
  func::FuncOp f = current_;
  // Every position's logits ([B, T, V] for a language model): a sampler
  // reads position len-1 of a causal model fed a shorter prompt.
  Value logits = outs[1];
  finish(f, {logits}, {"logits"});
  // Drop inputs that prediction does not read (the targets).
  Block &body = f.getBody().front();
  llvm::BitVector unused(body.getNumArguments());
  for (unsigned i = params_.size(); i < body.getNumArguments(); ++i)
    if (body.getArgument(i).use_empty())
      unused.set(i);
  (void)f.eraseArguments(unused);
  return success();
}

struct KilnTrainStepPass : impl::KilnTrainStepPassBase<KilnTrainStepPass> {
  using KilnTrainStepPassBase::KilnTrainStepPassBase;
  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto fwd = module.lookupSymbol<func::FuncOp>("forward");
    if (!fwd) {
      module.emitError() << "kiln-train-step needs a func.func @forward";
      return signalPassFailure();
    }
    for (StringRef name : {"init", "grad", "train_step", "eval_step", "predict"})
      if (module.lookupSymbol(name)) {
        module.emitError() << "@" << name << " already exists";
        return signalPassFailure();
      }
    Builder b(module, fwd);
    if (failed(b.validate()))
      return signalPassFailure();
    int64_t n = 0;
    if (failed(b.buildInit()) || ((emitGrad || gradOnly) && failed(b.buildGrad())))
      return signalPassFailure();
    if (gradOnly)
      return;
    if (failed(b.buildTrainStep(n)) || failed(b.buildEvalStep()) ||
        failed(b.buildPredict()))
      return signalPassFailure();
    numTrainStepOps = n;
  }
};

} // namespace
} // namespace kiln
