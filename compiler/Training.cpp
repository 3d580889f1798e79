//===- Training.cpp - Train-program pipeline and numeric checks -----------===//
#include "compiler/Training.h"

#include "compiler/IndexRanges.h"

#include "dialects/kiln/KilnOps.h"
#include "dialects/kiln/Sharding.h"
#include "passes/Passes.h"
#include "passes/Pipelines.h"
#include "runtime/core/Data.h"
#include "runtime/core/Random.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"

#include <algorithm>
#include <cmath>
#include <fstream>

using namespace mlir;

namespace kiln {

LogicalResult buildTrainProgram(ModuleOp module, bool gradOnly, bool printAfterAll) {
  PassManager pm(module.getContext());
  if (printAfterAll)
    printAfterEveryPass(pm);
  buildTrainProgramPipeline(pm, gradOnly);
  return pm.run(module);
}

void convertToF64(func::FuncOp fn) {
  Type f64 = Float64Type::get(fn.getContext());
  auto conv = [&](Type t) -> Type {
    if (auto rt = dyn_cast<RankedTensorType>(t))
      if (rt.getElementType().isF32())
        return rt.clone(f64);
    return t;
  };
  Block &body = fn.getBody().front();
  for (BlockArgument a : body.getArguments())
    a.setType(conv(a.getType()));
  fn.walk([&](Operation *op) {
    for (Value r : op->getResults())
      r.setType(conv(r.getType()));
    if (auto c = dyn_cast<ConstantOp>(op)) {
      auto dense = dyn_cast<DenseElementsAttr>(c.getValue());
      if (!dense || !dense.getElementType().isF32())
        return;
      auto type = cast<RankedTensorType>(conv(dense.getType()));
      if (dense.isSplat()) {
        c.setValueAttr(DenseElementsAttr::get(
            type, FloatAttr::get(f64, dense.getSplatValue<APFloat>().convertToDouble())));
      } else {
        SmallVector<double> values;
        for (APFloat v : dense.getValues<APFloat>())
          values.push_back(v.convertToDouble());
        c.setValueAttr(DenseElementsAttr::get(type, ArrayRef<double>(values)));
      }
    }
  });
  SmallVector<Type> results;
  for (Type t : fn.getResultTypes())
    results.push_back(conv(t));
  fn.setFunctionType(FunctionType::get(fn.getContext(), body.getArgumentTypes(), results));
}

namespace {

using interp::Elem;
using interp::Tensor;

bool isParam(func::FuncOp fn, unsigned i) {
  return bool(fn.getArgAttr(i, KilnDialect::kParamAttr));
}

/// Bound for a random integer input: the range its uses give it
/// (IndexRanges.h, the rule the artifact's manifest states), else [0, 2).
int64_t indexBound(Value v) {
  std::optional<IndexRange> r = indexRangeOf(v);
  return r ? r->hi : 2;
}

bool runFn(ModuleOp m, StringRef name, const std::vector<Tensor> &args,
           std::vector<Tensor> &out, std::string &error, bool exact) {
  auto fn = m.lookupSymbol<func::FuncOp>(name);
  if (!fn) {
    error = "no @" + name.str() + " in the module";
    return false;
  }
  out.clear();
  interp::Options o;
  o.exactF64 = exact;
  return interp::run(fn, args, out, error, o);
}

} // namespace

namespace {
/// One random input, a function of (seed, input name, element index): the
/// same name gives the same values in @forward, @grad and @train_step, and a
/// batch K times larger starts with the smaller batch's rows.
Tensor randomInput(Value arg, StringRef name, uint64_t seed) {
  Tensor t = interp::fromType(arg.getType());
  uint64_t salt = 1469598103934665603ull; // FNV-1a of the name
  for (char c : name)
    salt = (salt ^ uint64_t(static_cast<unsigned char>(c))) * 1099511628211ull;
  if (name == "dropout_seed") {
    t.i[0] = 12345;
  } else if (interp::isFloat(t.elem)) {
    for (int64_t k = 0; k < t.numel(); ++k)
      t.f[k] = interp::roundTo(t.elem, random::normal(seed, salt, k));
  } else {
    int64_t bound = t.elem == Elem::I1 ? 2 : indexBound(arg);
    for (int64_t k = 0; k < t.numel(); ++k)
      t.i[k] = int64_t(random::bits(seed, salt, k) % uint64_t(bound));
  }
  return t;
}
} // namespace

std::vector<Tensor> randomInputs(func::FuncOp fn, uint64_t seed,
                                 bool skipParams) {
  std::vector<Tensor> out;
  for (unsigned i = 0; i < fn.getNumArguments(); ++i) {
    if (skipParams && isParam(fn, i))
      continue;
    auto name = fn.getArgAttrOfType<StringAttr>(i, KilnDialect::kInputAttr);
    out.push_back(randomInput(fn.getArgument(i), name ? name.getValue() : "", seed));
  }
  return out;
}

double gradCheck(ModuleOp module, const GradCheckOptions &opts,
                 llvm::raw_ostream &report, std::string &error) {
  auto fwd = module.lookupSymbol<func::FuncOp>("forward");
  if (!fwd) {
    error = "no @forward";
    return -1;
  }
  // Parameters: the model's own initialisers (float64), with noise on
  // constant-initialised ones (biases, norm weights) so nothing sits at a
  // special point.
  Tensor seedT = Tensor::zeros(Elem::I64, {});
  seedT.i[0] = int64_t(opts.seed);
  std::vector<Tensor> init;
  if (!runFn(module, "init", {seedT}, init, error, true))
    return -1;
  std::vector<Tensor> args;
  std::vector<std::string> names;
  std::vector<Tensor> data = randomInputs(fwd, opts.seed, /*skipParams=*/true);
  size_t p = 0, d = 0;
  for (unsigned i = 0; i < fwd.getNumArguments(); ++i) {
    if (isParam(fwd, i)) {
      Tensor t = init[p];
      auto attr = fwd.getArgAttrOfType<DictionaryAttr>(i, KilnDialect::kInitAttr);
      StringRef kind = attr ? attr.getAs<StringAttr>("kind").getValue() : "zeros";
      if (kind == "zeros" || kind == "ones")
        for (int64_t k = 0; k < t.numel(); ++k)
          t.f[k] += 0.1 * random::normal(opts.seed, 5000 + p, k);
      names.push_back(fwd.getArgAttrOfType<StringAttr>(i, KilnDialect::kParamAttr).getValue().str());
      args.push_back(std::move(t));
      ++p;
    } else {
      args.push_back(data[d++]);
    }
  }
  std::vector<Tensor> gradOut;
  if (!runFn(module, "grad", args, gradOut, error, true))
    return -1;
  if (opts.injectError != 0.0 && gradOut.size() > 1)
    for (double &v : gradOut[1].f)
      v *= 1.0 + opts.injectError;
  auto loss = [&](const std::vector<Tensor> &a) {
    std::vector<Tensor> out;
    std::string err;
    if (!runFn(module, "forward", a, out, err, true))
      return std::nan("");
    return out[0].f[0];
  };
  // 5-point central difference: error O(h^4) + O(eps_f64 |f| / h).
  const double h = 1e-4;
  auto fd = [&](std::vector<Tensor> &a, size_t arg, const std::vector<double> &dir) {
    Tensor base = a[arg];
    auto at = [&](double s) {
      for (int64_t k = 0; k < base.numel(); ++k)
        a[arg].f[k] = base.f[k] + s * dir[k];
      return loss(a);
    };
    // Differences first, so equal values give exactly zero.
    double m2 = at(-2 * h), m1 = at(-h), p1 = at(h), p2 = at(2 * h);
    double v = (8 * (p1 - m1) - (p2 - m2)) / (12 * h);
    a[arg] = base;
    return v;
  };
  auto rel = [](double a, double n) {
    return std::fabs(a - n) / std::max({std::fabs(a), std::fabs(n), 1e-5});
  };
  report << llvm::format("gradcheck: loss %.6f (float64), 5-point finite differences, h = 1e-4\n",
                         gradOut[0].f[0]);
  report << llvm::format("  %-34s %10s %8s %14s\n", (const char *)"parameter",
                         (const char *)"elements", (const char *)"checks",
                         (const char *)"worst rel err");
  double worst = 0;
  std::string worstName;
  size_t argIdx = 0;
  p = 0;
  for (unsigned i = 0; i < fwd.getNumArguments(); ++i, ++argIdx) {
    if (!isParam(fwd, i))
      continue;
    const Tensor &g = gradOut[1 + p];
    int64_t n = g.numel();
    std::vector<int64_t> coords;
    if (n <= 16) {
      for (int64_t k = 0; k < n; ++k)
        coords.push_back(k);
    } else {
      int64_t best = 0;
      for (int64_t k = 1; k < n; ++k)
        if (std::fabs(g.f[k]) > std::fabs(g.f[best]))
          best = k;
      coords.push_back(best);
      for (int s = 1; s < opts.samples; ++s)
        coords.push_back(int64_t(random::bits(opts.seed, 9000 + p, s) % uint64_t(n)));
    }
    double w = 0;
    int checks = 0;
    std::vector<double> dir(n, 0.0);
    for (int64_t k : coords) {
      dir[k] = 1.0;
      w = std::max(w, rel(g.f[k], fd(args, argIdx, dir)));
      dir[k] = 0.0;
      ++checks;
    }
    if (n > 16) { // one random direction through every coordinate
      double norm = 0, analytic = 0;
      for (int64_t k = 0; k < n; ++k) {
        dir[k] = random::normal(opts.seed, 7000 + p, k);
        norm += dir[k] * dir[k];
      }
      norm = std::sqrt(norm);
      for (int64_t k = 0; k < n; ++k) {
        dir[k] /= norm;
        analytic += g.f[k] * dir[k];
      }
      w = std::max(w, rel(analytic, fd(args, argIdx, dir)));
      ++checks;
    }
    if (std::isnan(w))
      w = INFINITY;
    report << llvm::format("  %-34s %10lld %8d %14.3e%s\n", names[p].c_str(),
                           (long long)n, checks, w,
                           w > opts.tolerance ? (const char *)"  FAIL" : (const char *)"");
    report.flush();
    if (w > worst || std::isinf(w)) {
      worst = w;
      worstName = names[p];
    }
    ++p;
  }
  report << llvm::format("gradcheck: worst relative error %.3e (%s), tolerance %.0e: %s\n",
                         worst, worstName.c_str(), opts.tolerance,
                         worst <= opts.tolerance ? (const char *)"PASS" : (const char *)"FAIL");
  return worst;
}

namespace {
/// Saves an interpreter tensor with the runtime's .npy writer (f32/f64/i32/i64).
bool writeNpy(const std::string &path, const Tensor &t, std::string &error) {
  data::NpyArray a;
  a.descr = interp::isFloat(t.elem) ? (t.elem == Elem::F64 ? "<f8" : "<f4")
                                    : (t.elem == Elem::I64 ? "<i8" : "<i4");
  a.shape = t.shape;
  a.f = t.f;
  a.i = t.i;
  if (Status s = data::writeNpy(path, a); !s) {
    error = s.message();
    return false;
  }
  return true;
}
} // namespace

namespace {
bool writeReference(ModuleOp module, const std::string &dir, int steps, uint64_t seed,
                    llvm::raw_ostream &log, std::vector<std::string> &written,
                    std::string &error) {
  auto fwd = module.lookupSymbol<func::FuncOp>("forward");
  auto step = module.lookupSymbol<func::FuncOp>("train_step");
  if (!fwd || !step) {
    error = "the module needs @forward and @train_step";
    return false;
  }
  Tensor seedT = Tensor::zeros(Elem::I64, {});
  seedT.i[0] = int64_t(seed);
  std::vector<Tensor> init;
  if (!runFn(module, "init", {seedT}, init, error, false))
    return false;
  std::vector<Tensor> data = randomInputs(fwd, seed, /*skipParams=*/true);
  std::string manifest = "{\n  \"params\": [";
  std::vector<Tensor> gradArgs;
  size_t p = 0, d = 0;
  std::vector<std::string> paramNames, inputNames;
  for (unsigned i = 0; i < fwd.getNumArguments(); ++i) {
    if (isParam(fwd, i)) {
      paramNames.push_back(fwd.getArgAttrOfType<StringAttr>(i, KilnDialect::kParamAttr).getValue().str());
      gradArgs.push_back(init[p++]);
    } else {
      inputNames.push_back(fwd.getArgAttrOfType<StringAttr>(i, KilnDialect::kInputAttr).getValue().str());
      gradArgs.push_back(data[d++]);
    }
  }
  auto file = [&](const std::string &kind, const std::string &name) {
    return kind + "." + name + ".npy";
  };
  auto save = [&](const std::string &f, const Tensor &t) {
    written.push_back(f);
    return writeNpy(dir + "/" + f, t, error);
  };
  for (size_t k = 0; k < paramNames.size(); ++k) {
    manifest += (k ? ", " : "") + std::string("\"") + paramNames[k] + "\"";
    if (!save(file("init", paramNames[k]), init[k]))
      return false;
  }
  manifest += "],\n  \"inputs\": [";
  for (size_t k = 0; k < inputNames.size(); ++k) {
    manifest += (k ? ", " : "") + std::string("\"") + inputNames[k] + "\"";
    if (!save(file("input", inputNames[k]), data[k]))
      return false;
  }
  std::vector<Tensor> gradOut;
  if (!runFn(module, "grad", gradArgs, gradOut, error, false))
    return false;
  if (!save("loss.npy", gradOut[0]))
    return false;
  for (size_t k = 0; k < paramNames.size(); ++k)
    if (!save(file("grad", paramNames[k]), gradOut[1 + k]))
      return false;
  // Train steps: (params, state, inputs minus dropout_seed, step).
  std::vector<Tensor> params(init.begin(), init.begin() + paramNames.size());
  std::vector<Tensor> state(init.begin() + paramNames.size(), init.end());
  // The train step's own batch (K times larger with grad_accum = K; its
  // first rows are the batch @grad saw).
  std::vector<Tensor> stepInputs;
  for (unsigned i = 0; i < step.getNumArguments(); ++i) {
    auto name = step.getArgAttrOfType<StringAttr>(i, KilnDialect::kInputAttr);
    if (name && name.getValue() != "step") {
      stepInputs.push_back(randomInput(step.getArgument(i), name.getValue(), seed));
      // What a runtime needs to repeat these steps (kiln-run's .npy data).
      if (!save(file("step_input", name.getValue().str()), stepInputs.back()))
        return false;
    }
  }
  manifest += "],\n  \"steps\": [";
  for (int s = 0; s < steps; ++s) {
    std::vector<Tensor> args = params;
    args.insert(args.end(), state.begin(), state.end());
    args.insert(args.end(), stepInputs.begin(), stepInputs.end());
    Tensor st = Tensor::zeros(Elem::I64, {});
    st.i[0] = s;
    args.push_back(st);
    std::vector<Tensor> out;
    if (!runFn(module, "train_step", args, out, error, false))
      return false;
    params.assign(out.begin(), out.begin() + params.size());
    state.assign(out.begin() + params.size(), out.begin() + params.size() + state.size());
    size_t base = params.size() + state.size();
    double l = out[base].f[0], gn = out[base + 1].f[0], lr = out[base + 2].f[0];
    // JSON has no inf or NaN: a non-finite value (an fp16 step whose scaled
    // gradients overflowed, which the loss scaler skips) is written as null.
    auto num = [](double v) {
      if (!std::isfinite(v))
        return std::string("null");
      char b[40];
      std::snprintf(b, sizeof b, "%.9g", v);
      return std::string(b);
    };
    manifest += std::string(s ? ", " : "") + "{\"loss\": " + num(l) +
                ", \"grad_norm\": " + num(gn) + ", \"lr\": " + num(lr) + "}";
    log << llvm::format("step %d: loss %.6f grad_norm %.6f lr %.3e\n", s, l, gn, lr);
  }
  for (size_t k = 0; k < paramNames.size(); ++k)
    if (!save(file("final", paramNames[k]), params[k]))
      return false;
  manifest += "],\n  \"seed\": " + std::to_string(seed) + "\n}\n";
  std::ofstream out(dir + "/manifest.json");
  out << manifest;
  out.close();
  if (!out) {
    error = "cannot write " + dir + "/manifest.json";
    return false;
  }
  written.push_back("manifest.json");
  return true;
}
} // namespace

std::string setOneDeviceLayout(ModuleOp module) {
  std::string setAside;
  auto note = [&](const std::string &what) {
    setAside += (setAside.empty() ? "" : ", ") + what;
  };
  if (auto train = module->getAttrOfType<DictionaryAttr>(KilnDialect::kTrainAttr)) {
    NamedAttrList t(train.getValue());
    Builder b(module.getContext());
    for (llvm::StringRef k : {"devices", "tp", "pp", "zero", "virtual_stages"}) {
      auto a = t.get(k);
      auto i = a ? dyn_cast<IntegerAttr>(a) : nullptr;
      if (!i)
        continue;
      if (i.getInt() > (k == "zero" ? 0 : 1))
        note(k.str() + " = " + std::to_string(i.getInt()));
      t.erase(k);
    }
    if (auto p = t.get("pipeline")) {
      note("pipeline = \"" + cast<StringAttr>(p).getValue().str() + "\"");
      t.erase("pipeline");
    }
    // A pipeline's micro-batches are its gradient accumulation.
    if (auto m = t.get("micro_batches")) {
      t.set("grad_accum", m);
      t.erase("micro_batches");
    }
    for (llvm::StringRef k : {"bucket_mb", "first_bucket_mb", "grad_reduce"})
      t.erase(k);
    module->setAttr(KilnDialect::kTrainAttr, t.getDictionary(module.getContext()));
  }
  if (module->hasAttr("kiln.stages_placed")) {
    note("the model's stage blocks");
    module->removeAttr("kiln.stages_placed");
  }
  module->walk([](Operation *op) { op->removeAttr(kStageAttr); });
  setMesh(module, MeshShape{});
  return setAside;
}

bool exportReference(ModuleOp module, const std::string &dir, int steps,
                     uint64_t seed, llvm::raw_ostream &log, std::string &error) {
  // Everything is written into `tmp` and moved into `dir` at the end.
  std::string tmp = dir;
  while (!tmp.empty() && llvm::sys::path::is_separator(tmp.back()))
    tmp.pop_back();
  tmp += ".partial-" + std::to_string(llvm::sys::Process::getProcessId());
  llvm::sys::fs::remove_directories(tmp);
  if (std::error_code ec = llvm::sys::fs::create_directories(tmp)) {
    error = "cannot create " + tmp + ": " + ec.message();
    return false;
  }
  std::vector<std::string> written;
  bool ok = writeReference(module, tmp, steps, seed, log, written, error);
  if (ok)
    if (std::error_code ec = llvm::sys::fs::create_directories(dir)) {
      error = "cannot create " + dir + ": " + ec.message();
      ok = false;
    }
  for (size_t k = 0; ok && k < written.size(); ++k)
    if (std::error_code ec = llvm::sys::fs::rename(tmp + "/" + written[k], dir + "/" + written[k])) {
      error = "cannot move " + written[k] + " into " + dir + ": " + ec.message();
      ok = false;
    }
  llvm::sys::fs::remove_directories(tmp);
  return ok;
}

} // namespace kiln
