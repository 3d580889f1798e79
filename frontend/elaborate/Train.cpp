//===- Train.cpp - The train section --------------------------------------===//
//
// Optimizer and schedule calls (adamw(lr = 1e-3), cosine(warmup = 100))
// and the plain settings (batch, steps, precision, data, ...), checked and
// turned into the module's kiln.train attribute.
//
//===----------------------------------------------------------------------===//
#include "frontend/elaborate/Elaborator.h"
#include "dialects/kiln/Precision.h"
#include "dialects/kiln/TrainSettings.h"

#include <cmath>
#include <optional>

namespace kiln::frontend::elab {

void Elaborator::evalTrain() {
  auto num = [&](const Val &v, const std::string &key) {
    if (!v.isNumber())
      fail(v.loc, "train setting '" + key + "' must be a number, got " +
                      describe(v));
    return v.num();
  };
  auto posInt = [&](const Val &v, const std::string &key, int64_t min) {
    if (v.kind != Val::Kind::Int || v.i < min)
      fail(v.loc, "train setting '" + key + "' must be an integer >= " +
                      std::to_string(min) + ", got " +
                      (v.kind == Val::Kind::Int ? std::to_string(v.i)
                                                : describe(v)));
    return v.i;
  };
  // Calls such as adamw(lr = 1e-3) are evaluated here, not as builtins.
  struct Call {
    std::string name;
    SourceLoc loc;
    std::vector<std::pair<std::string, const Expr *>> kwargs;
    std::vector<const Expr *> positional;
  };
  auto asCall = [&](const Expr &e, const std::string &key) {
    Call c;
    c.loc = e.loc;
    if (e.kind == Expr::Kind::Name) {
      c.name = e.text;
      return c;
    }
    if (e.kind != Expr::Kind::Call)
      fail(e.loc, "train setting '" + key + "' expects a name or a call "
                  "such as adamw(lr = 1e-3)");
    c.name = e.text;
    for (size_t i = 0; i < e.args.size(); ++i) {
      if (e.argNames[i].empty())
        c.positional.push_back(e.args[i].get());
      else
        c.kwargs.push_back({e.argNames[i], e.args[i].get()});
    }
    return c;
  };
  auto bindCall = [&](const Call &c,
                      const std::vector<std::pair<const char *, double>> &spec,
                      NamedAttrList &out) {
    std::vector<bool> seen(spec.size(), false);
    auto put = [&](size_t i, const Expr &x) {
      Val v = eval(x, paramEnv_);
      std::string n = spec[i].first;
      if (n == "betas") {
        if (v.kind != Val::Kind::List || v.items.size() != 2 ||
            !v.items[0].isNumber() || !v.items[1].isNumber())
          fail(x.loc, "betas must be a pair such as (0.9, 0.99)");
        double b1 = v.items[0].num(), b2 = v.items[1].num();
        if (!(b1 >= 0 && b1 < 1 && b2 >= 0 && b2 < 1))
          fail(x.loc, "betas must be in [0, 1)");
        out.set("beta1", b_.getF64FloatAttr(b1));
        out.set("beta2", b_.getF64FloatAttr(b2));
      } else if (n == "nesterov") {
        if (v.kind != Val::Kind::Bool)
          fail(x.loc, "nesterov must be true or false");
        out.set(n, b_.getBoolAttr(v.b));
      } else if (n == "warmup" || n == "decay_steps") {
        if (v.kind != Val::Kind::Int || v.i < 0)
          fail(x.loc, "'" + n + "' of " + c.name + "() must be an integer >= 0");
        out.set(n, b_.getI64IntegerAttr(v.i));
      } else {
        if (!v.isNumber())
          fail(x.loc, "'" + n + "' of " + c.name + "() must be a number, got " +
                          describe(v));
        double d = v.num();
        if (!(d >= 0) || !std::isfinite(d))
          fail(x.loc, "'" + n + "' of " + c.name + "() must be a non-negative number");
        out.set(n, b_.getF64FloatAttr(d));
      }
      seen[i] = true;
    };
    if (c.positional.size() > spec.size())
      fail(c.loc, c.name + "() takes at most " + std::to_string(spec.size()) +
                      " arguments");
    for (size_t i = 0; i < c.positional.size(); ++i)
      put(i, *c.positional[i]);
    for (const auto &[k, x] : c.kwargs) {
      size_t i = 0;
      while (i < spec.size() && k != spec[i].first)
        ++i;
      if (i == spec.size()) {
        std::string names;
        for (const auto &s : spec)
          names += (names.empty() ? "" : ", ") + std::string(s.first);
        fail(x->loc, c.name + "() has no setting '" + k + "'; it takes " +
                         names);
      }
      if (seen[i])
        fail(x->loc, "'" + k + "' is given twice");
      put(i, *x);
    }
    for (size_t i = 0; i < spec.size(); ++i) {
      if (seen[i])
        continue;
      std::string n = spec[i].first;
      if (std::isnan(spec[i].second))
        fail(c.loc, c.name + "() needs '" + n + "'");
      if (n == "betas") {
        out.set("beta1", b_.getF64FloatAttr(0.9));
        out.set("beta2", b_.getF64FloatAttr(0.999));
      } else if (n == "nesterov") {
        out.set(n, b_.getBoolAttr(false));
      } else if (n == "warmup" || n == "decay_steps") {
        if (spec[i].second >= 0)
          out.set(n, b_.getI64IntegerAttr(int64_t(spec[i].second)));
      } else {
        out.set(n, b_.getF64FloatAttr(spec[i].second));
      }
    }
  };
  const double req = std::nan("");
  static const char *known =
      "batch, steps, epochs, last_batch, optimizer, schedule, precision, "
      "precision_mode, attention, fp32_layers, loss_scale, seed, grad_clip, "
      "grad_accum, recompute, eval_interval, eval_steps, log_interval, "
      "checkpoint_interval, data, val_data, devices, tp, pp, micro_batches, "
      "pipeline, virtual_stages, zero, bucket_mb, first_bucket_mb, grad_reduce, "
      "deterministic, deterministic_chunks";
  int64_t devices = 1;
  std::optional<std::pair<int64_t, SourceLoc>> zero, tp, pp, micro, accum, vstages;
  std::optional<std::pair<std::string, SourceLoc>> pipeline;
  std::optional<std::pair<int64_t, SourceLoc>> steps, epochs;
  // The train section's precision and the loss scale's init, where it was
  // set: an init beyond the low type's range is refused after the loop.
  std::string precision;
  std::optional<std::pair<double, SourceLoc>> scaleInit;
  // A positive integer setting up to `max`, recorded as its train attribute.
  auto bounded = [&](const TrainEntry &t, int64_t max) -> std::pair<int64_t, SourceLoc> {
    Val v = eval(*t.value, paramEnv_);
    int64_t n = posInt(v, t.key, 1);
    if (n > max)
      fail(v.loc, t.key + " must be at most " + std::to_string(max));
    trainAttrs_.set(t.key, b_.getI64IntegerAttr(n));
    return {n, v.loc};
  };
  if (ast_.hasTrain)
    trainLocs_.push_back(NameLoc::get(
        b_.getStringAttr("train"),
        FileLineColLoc::get(&ctx_, file_.name(), ast_.trainLoc.line, ast_.trainLoc.col)));
  for (const TrainEntry &t : ast_.train) {
    const std::string &k = t.key;
    // Where each setting was written: kiln-train-step gives the ops it
    // builds for a setting (the optimizer's update, the schedule) its line.
    trainLocs_.push_back(NameLoc::get(
        b_.getStringAttr(k), FileLineColLoc::get(&ctx_, file_.name(), t.loc.line, t.loc.col)));
    if (k == "pp" || k == "micro_batches") {
      // Pipeline parallelism (docs/parallel.md): pp stages, each step's
      // batch cut into micro_batches micro-batches of `batch` rows (the
      // pipeline's name for grad_accum).
      (k == "pp" ? pp : micro) = bounded(t, k == "pp" ? kMaxStages : int64_t(4096));
      if (k == "micro_batches")
        trainAttrs_.set("grad_accum", b_.getI64IntegerAttr(micro->first));
    } else if (k == "pipeline") {
      const Expr &e = *t.value;
      std::string p = e.kind == Expr::Kind::Name || e.kind == Expr::Kind::String
                          ? e.text : "";
      if (!train_rules::isPipeline(p))
        fail(e.loc, "pipeline must be \"1f1b\", \"gpipe\" or \"interleaved\" (the "
                    "micro-batch schedule of each stage; interleaved: 1F1B over "
                    "virtual_stages model chunks per device)");
      pipeline = {p, e.loc};
      trainAttrs_.set(k, b_.getStringAttr(p));
    } else if (k == "virtual_stages") {
      vstages = bounded(t, 64);
    } else if (k == "tp") {
      // Tensor parallelism (docs/parallel.md): tp of the devices split each
      // layer; devices / tp replicas of that split train data-parallel.
      tp = bounded(t, 65536);
    } else if (k == "devices" || k == "zero") {
      // Parallelism (docs/parallel.md): devices = all devices (the dp size
      // times tp).
      Val v = eval(*t.value, paramEnv_);
      int64_t n = posInt(v, k, k == "zero" ? 0 : 1);
      if (k == "zero" && n > 2)
        fail(v.loc, "zero must be 0, 1 or 2 (ZeRO stage), got " + std::to_string(n));
      if (k == "devices" && n > 65536)
        fail(v.loc, "devices must be at most 65536");
      if (k == "devices") {
        devices = n;
        devicesLoc_ = v.loc;
      }
      else
        zero = {n, v.loc};
      trainAttrs_.set(k, b_.getI64IntegerAttr(n));
    } else if (k == "bucket_mb" || k == "first_bucket_mb") {
      Val v = eval(*t.value, paramEnv_);
      double d = num(v, k);
      if (!(d > 0) || !std::isfinite(d))
        fail(v.loc, k + " must be a number of MiB > 0");
      trainAttrs_.set(k, b_.getF64FloatAttr(d));
    } else if (k == "optimizer") {
      Call c = asCall(*t.value, k);
      NamedAttrList o;
      o.set("name", b_.getStringAttr(c.name));
      if (c.name == "sgd")
        bindCall(c, {{"lr", req}, {"momentum", 0}, {"nesterov", 0},
                     {"weight_decay", 0}}, o);
      else if (c.name == "adam")
        bindCall(c, {{"lr", req}, {"betas", 0}, {"eps", 1e-8},
                     {"weight_decay", 0}}, o);
      else if (c.name == "adamw")
        bindCall(c, {{"lr", req}, {"betas", 0}, {"eps", 1e-8},
                     {"weight_decay", 0.01}}, o);
      else
        fail(t.value->loc, "unknown optimizer '" + c.name +
                               "'; expected sgd, adam or adamw");
      trainAttrs_.set(k, o.getDictionary(&ctx_));
    } else if (k == "schedule") {
      Call c = asCall(*t.value, k);
      NamedAttrList o;
      o.set("name", b_.getStringAttr(c.name));
      if (c.name == "constant")
        bindCall(c, {}, o);
      else if (c.name == "linear_warmup")
        bindCall(c, {{"warmup", req}}, o);
      else if (c.name == "cosine")
        bindCall(c, {{"warmup", 0}, {"min_lr", 0}, {"decay_steps", -1}}, o);
      else
        fail(t.value->loc, "unknown schedule '" + c.name +
                               "'; expected constant, linear_warmup or cosine");
      trainAttrs_.set(k, o.getDictionary(&ctx_));
    } else if (k == "precision") {
      const Expr &e = *t.value;
      std::string p = e.kind == Expr::Kind::Name || e.kind == Expr::Kind::String
                          ? e.text : "";
      if (!train_rules::isPrecision(p))
        fail(e.loc, "precision must be fp32, tf32, bf16 or fp16");
      precision = p;
      trainAttrs_.set(k, b_.getStringAttr(p));
    } else if (k == "deterministic") {
      // Bits that do not depend on the device count (docs/parallel.md
      // "Deterministic across device counts").
      const Expr &e = *t.value;
      std::string p = e.kind == Expr::Kind::Name || e.kind == Expr::Kind::String
                          ? e.text : "";
      if (p != "none" && p != "devices")
        fail(e.loc, "deterministic must be \"none\" (the default) or \"devices\" (the same "
                    "bits on 1, 2, 4, ... data-parallel devices for the same global batch)");
      trainAttrs_.set(k, b_.getStringAttr(p));
    } else if (k == "deterministic_chunks") {
      Val v = eval(*t.value, paramEnv_);
      int64_t n = posInt(v, k, 1);
      if (n > 4096 || (n & (n - 1)) != 0)
        fail(v.loc, "deterministic_chunks must be a power of two from 1 to 4096 (the "
                    "global batch is cut into that many chunks, summed in a pairwise tree)");
      trainAttrs_.set(k, b_.getI64IntegerAttr(n));
    } else if (k == "grad_reduce") {
      // The element type of the gradient all-reduce (docs/parallel.md).
      const Expr &e = *t.value;
      std::string p = e.kind == Expr::Kind::Name || e.kind == Expr::Kind::String
                          ? e.text : "";
      if (p != "fp32" && p != "bf16")
        fail(e.loc, "grad_reduce must be fp32 or bf16");
      trainAttrs_.set(k, b_.getStringAttr(p));
    } else if (k == "loss_scale") {
      // Loss scaling (docs/training.md "Master weights and loss scaling"):
      // dynamic(init, growth_factor, backoff_factor, growth_interval), a
      // number (a static scale) or none; fp16 defaults to dynamic().
      const Expr &e = *t.value;
      NamedAttrList o;
      if (e.kind == Expr::Kind::Name || e.kind == Expr::Kind::Call) {
        Call c = asCall(e, k);
        o.set("name", b_.getStringAttr(c.name));
        if (c.name == "dynamic")
          bindCall(c, {{"init", 65536}, {"growth_factor", 2}, {"backoff_factor", 0.5},
                       {"growth_interval", 2000}}, o);
        else if (c.name == "static")
          bindCall(c, {{"init", req}}, o);
        else if (c.name == "none")
          bindCall(c, {}, o);
        else
          fail(e.loc, "unknown loss_scale '" + c.name +
                          "'; expected dynamic(...), static(init = S), a number or none");
      } else {
        Val v = eval(e, paramEnv_);
        o.set("name", b_.getStringAttr("static"));
        o.set("init", b_.getF64FloatAttr(num(v, k)));
      }
      auto f = [&](StringRef n) {
        auto a = o.getDictionary(&ctx_).getAs<FloatAttr>(n);
        return a ? a.getValueAsDouble() : 1.0;
      };
      double init = f("init"), interval = f("growth_interval");
      if (!(init > 0) || !(init <= 3.4e38))
        fail(e.loc, "loss_scale init must be > 0 and at most 3.4e38 (float32's largest)");
      if (!(interval >= 1) || interval != std::floor(interval) || interval > 1e9)
        fail(e.loc, "growth_interval of loss_scale must be a whole number of steps >= 1");
      if (!(f("growth_factor") >= 1))
        fail(e.loc, "growth_factor of loss_scale must be >= 1");
      if (!(f("backoff_factor") > 0 && f("backoff_factor") <= 1))
        fail(e.loc, "backoff_factor of loss_scale must be in (0, 1]");
      if (o.get("init")) {
        scaleInit = {init, e.loc};
        // Where it was set, for kilnc --precision fp16 (tools/kilnc).
        o.set("line", b_.getI64IntegerAttr(e.loc.line));
        o.set("col", b_.getI64IntegerAttr(e.loc.col));
      }
      trainAttrs_.set(k, o.getDictionary(&ctx_));
    } else if (k == "fp32_layers") {
      // Layer names, repeat iterations ("h.3") or def scopes kept in fp32
      // under mixed precision; `*` matches any characters.
      const Expr &e = *t.value;
      if (e.kind != Expr::Kind::List)
        fail(e.loc, "fp32_layers must be a list of layer-name patterns, e.g. "
                    "[\"lm_head\", \"h.3.*\"]");
      for (const ExprPtr &item : e.args) {
        if (item->kind != Expr::Kind::String || item->text.empty())
          fail(item->loc, "fp32_layers: each entry must be a non-empty string "
                          "(a layer name; * matches any characters)");
        fp32Layers_.push_back({item->text, item->loc});
      }
    } else if (k == "precision_mode") {
      const Expr &e = *t.value;
      std::string p = e.kind == Expr::Kind::Name || e.kind == Expr::Kind::String
                          ? e.text : "";
      if (p != "kiln" && p != "autocast")
        fail(e.loc, "precision_mode must be kiln or autocast");
      trainAttrs_.set(k, b_.getStringAttr(p));
    } else if (k == "attention") {
      const Expr &e = *t.value;
      std::string p = e.kind == Expr::Kind::Name || e.kind == Expr::Kind::String
                          ? e.text : "";
      if (!train_rules::isAttentionMode(p))
        fail(e.loc, "attention must be auto, fused or unfused");
      trainAttrs_.set(k, b_.getStringAttr(p));
    } else if (k == "data" || k == "val_data") {
      Val v = eval(*t.value, paramEnv_);
      if (v.kind != Val::Kind::Str || v.s.empty())
        fail(v.loc, "train setting '" + k + "' must be a path string");
      trainAttrs_.set(k, b_.getStringAttr(v.s));
    } else if (k == "last_batch") {
      // Where an epoch's batches end (docs/runtime.md "Epochs").
      const Expr &e = *t.value;
      std::string p = e.kind == Expr::Kind::Name || e.kind == Expr::Kind::String
                          ? e.text : "";
      if (p != "drop" && p != "wrap")
        fail(e.loc, "last_batch must be \"drop\" (an epoch is its whole global batches; "
                    "the rows left over are not read) or \"wrap\" (batches run on into the "
                    "next epoch); a smaller last batch is not possible, the step's batch "
                    "is fixed");
      trainAttrs_.set(k, b_.getStringAttr(p));
    } else if (k == "recompute") {
      Val v = eval(*t.value, paramEnv_);
      if (v.kind != Val::Kind::Bool)
        fail(v.loc, "recompute must be true or false");
      trainAttrs_.set(k, b_.getBoolAttr(v.b));
    } else if (k == "grad_clip") {
      Val v = eval(*t.value, paramEnv_);
      double d = num(v, k);
      if (!(d >= 0))
        fail(v.loc, "grad_clip must be >= 0 (0 disables clipping)");
      trainAttrs_.set(k, b_.getF64FloatAttr(d));
    } else if (k == "batch" || k == "steps" || k == "epochs" || k == "seed" ||
               k == "grad_accum" || k == "eval_interval" ||
               k == "eval_steps" || k == "log_interval" ||
               k == "checkpoint_interval") {
      Val v = eval(*t.value, paramEnv_);
      // 0: no seed offset, no periodic checkpoints, no evaluation during
      // training (as --eval-interval 0).
      int64_t min = k == "seed" || k == "checkpoint_interval" || k == "eval_interval" ? 0 : 1;
      int64_t n = posInt(v, k, min);
      if (k == "grad_accum")
        accum = {n, v.loc};
      if (k == "steps" || k == "epochs")
        (k == "steps" ? steps : epochs) = {n, v.loc};
      if (k == "batch") {
        if (n > kMaxDimSize)
          fail(v.loc, "batch is too large");
        trainBatch_ = n;
      }
      trainAttrs_.set(k, b_.getI64IntegerAttr(n));
    } else {
      SourceLoc l = t.loc;
      l.length = k.size();
      std::string best;
      unsigned bestDist = 3;
      llvm::SmallVector<llvm::StringRef> names;
      llvm::StringRef(known).split(names, ", ");
      for (llvm::StringRef n : names) {
        unsigned d = llvm::StringRef(k).edit_distance(n, true, bestDist);
        if (d < bestDist)
          bestDist = d, best = n.str();
      }
      fail(l, "unknown train setting '" + k + "'" +
                  (best.empty() ? "" : "; did you mean '" + best + "'?") +
                  " (known: " + known + ")");
    }
  }
  if (steps && epochs) {
    const auto &later = steps->second.line > epochs->second.line ? steps : epochs;
    const auto &first = &later == &steps ? epochs : steps;
    fail(later->second,
         "steps = " + std::to_string(steps->first) + " and epochs = " +
             std::to_string(epochs->first) + " (line " + std::to_string(first->second.line) +
             ") both set the run's length; give one of them (kiln-run train prints the "
             "steps per epoch of the data)");
  }
  // cosine() decays over `steps` unless told otherwise; the frontend does
  // not know the rows, so epochs cannot stand in for them.
  if (epochs)
    if (auto sched = dyn_cast_or_null<DictionaryAttr>(trainAttrs_.get("schedule")))
      if (auto n = sched.getAs<StringAttr>("name");
          n && n.getValue() == "cosine" && !sched.get("decay_steps"))
        fail(epochs->second, "with epochs = " + std::to_string(epochs->first) +
                                 ", cosine() needs decay_steps (it defaults to steps, which "
                                 "epochs replaces): give decay_steps = the run's steps, "
                                 "epochs x the steps per epoch kiln-run train prints");
  if (micro && accum && micro->first != accum->first)
    fail(accum->second, "grad_accum = " + std::to_string(accum->first) +
                            " and micro_batches = " + std::to_string(micro->first) +
                            " disagree; micro_batches is the pipeline's name for "
                            "grad_accum, give one of them");
  if (micro && accum)
    trainAttrs_.set("grad_accum", b_.getI64IntegerAttr(micro->first));
  int64_t t = tp ? tp->first : 1;
  if (tp && !train_rules::tpDividesDevices(devices, t))
    fail(tp->second, "tp = " + std::to_string(t) + " must divide devices = " +
                         std::to_string(devices) + " (devices / tp replicas train "
                         "data-parallel; set devices = " + std::to_string(t) +
                         " for tensor parallelism alone)");
  int64_t stages = pp ? pp->first : 1;
  if (zero && !train_rules::zeroHasReplicas(zero->first, devices, stages, t))
    fail(zero->second, "zero = " + std::to_string(zero->first) +
                           " shards optimizer state over data-parallel devices; "
                           "it needs devices = N with N > 1" +
                           (t * stages > 1
                                ? std::string(" data-parallel replicas (N / (pp x tp) > 1)")
                                : ""));
  // A scale so large that fp16 gradients overflow at once (docs/training.md
  // "The largest initial scale"); kilnc --precision fp16 checks it again.
  if (scaleInit)
    if (std::string why = lossScaleInitError(precision, scaleInit->first); !why.empty())
      fail(scaleInit->second, why);
  if (vstages && !train_rules::virtualStagesFitSchedule(true, pipeline ? pipeline->first : ""))
    fail(vstages->second, "virtual_stages is the interleaved schedule's model chunks per "
                          "device; set pipeline = \"interleaved\" too (or drop it)");
}

} // namespace kiln::frontend::elab
