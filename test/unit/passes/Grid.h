//===- Grid.h - The parallel step on the reference grid, vs one device -*- C++ -*-===//
//
// The harness of the parallel-step tests (TensorParallelTest.cpp,
// PipelineTest.cpp): compile a model for a pp x dp x tp mesh, run @init,
// 5 train steps, an @eval_step after each and @predict at the end on the
// reference interpreter's process grid (collectives and stage transfers in
// program order), every device given its blocks of the split parameters,
// and join the logical parameters back from their owners; the same on one
// device; then compare with stated tolerances.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_TEST_UNIT_PASSES_GRID_H
#define KILN_TEST_UNIT_PASSES_GRID_H

#include "dialects/kiln/KilnDialect.h"
#include "dialects/kiln/KilnOps.h"
#include "dialects/kiln/Sharding.h"
#include "frontend/Frontend.h"
#include "passes/Pipelines.h"
#include "reference/Interpreter.h"
#include "reference/ProcessGrid.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace kiln::testgrid {

using namespace mlir;
using kiln::interp::Elem;
using kiln::interp::Tensor;

struct Model {
  std::string path;                           ///< the .kiln file
  std::map<std::string, std::string> params;  ///< --param overrides
  int64_t batch;                              ///< per data-parallel replica
  double gradClip;
  int64_t classes; ///< integer inputs are drawn from [0, classes)
};

inline std::string readFile(const std::string &path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// The training program of `s` on dp x tp devices, times pp pipeline stages
/// over `micro` micro-batches (grad_accum; 0: the model's) in `schedule`
/// ("": the model's). With pp = 1 a model's `stage N { ... }` placement is
/// dropped: the one-device program to compare with.
inline OwningOpRef<ModuleOp> compile(MLIRContext &ctx, const Model &s, int64_t dp, int64_t tp,
                                     int64_t batch, int64_t pp = 1, int64_t micro = 0,
                                     const std::string &schedule = "", int64_t zero = 0) {
  kiln::frontend::SourceFile source(s.path, readFile(s.path));
  kiln::frontend::DiagEngine diags(source);
  kiln::frontend::FrontendOptions opts;
  opts.batch = batch;
  opts.params = s.params;
  OwningOpRef<ModuleOp> m = kiln::frontend::buildModule(ctx, source, opts, diags);
  EXPECT_TRUE(m) << diags.render();
  if (!m)
    return m;
  Builder b(&ctx);
  NamedAttrList t((*m)->getAttrOfType<DictionaryAttr>(kiln::KilnDialect::kTrainAttr).getValue());
  t.set("grad_clip", b.getF64FloatAttr(s.gradClip));
  t.set("devices", b.getI64IntegerAttr(dp * tp * pp));
  t.set("tp", b.getI64IntegerAttr(tp));
  t.set("pp", b.getI64IntegerAttr(pp));
  if (zero > 0)
    t.set("zero", b.getI64IntegerAttr(zero));
  if (micro > 0)
    t.set("grad_accum", b.getI64IntegerAttr(micro));
  if (!schedule.empty())
    t.set("pipeline", b.getStringAttr(schedule));
  (*m)->setAttr(kiln::KilnDialect::kTrainAttr, t.getDictionary(&ctx));
  if (pp <= 1) {
    (*m)->removeAttr("kiln.stages_placed");
    m->walk([](Operation *op) { op->removeAttr(kiln::kStageAttr); });
  }
  kiln::setMesh(*m, kiln::meshFor(dp * tp * pp, tp, pp));
  PassManager pm(&ctx);
  kiln::buildTrainProgramPipeline(pm);
  EXPECT_TRUE(succeeded(pm.run(*m)));
  return m;
}

inline std::string attr(func::FuncOp f, unsigned i, StringRef name) {
  if (auto a = f.getArgAttrOfType<StringAttr>(i, name))
    return a.getValue().str();
  return "";
}

/// The axis ZeRO blocks an argument over ("": none): a whole tensor's
/// (axis = "dp") or a tensor-parallel block's (zero = "dp").
inline std::string zeroOf(func::FuncOp f, unsigned i) {
  auto s = f.getArgAttrOfType<DictionaryAttr>(i, kiln::kShardAttr);
  if (!s)
    return "";
  if (auto z = s.getAs<StringAttr>("zero"))
    return z.str();
  return s.get("dim") ? "" : s.getAs<StringAttr>("axis").str();
}

/// ZeRO's block c of n of `t`: its row-major flattening zero-padded to a
/// multiple of n, elements [c*b, (c+1)*b), b = ceil(numel / n).
inline Tensor zeroBlock(const Tensor &t, int64_t n, int64_t c) {
  int64_t numel = t.numel(), b = (numel + n - 1) / n;
  Tensor out = t;
  out.shape = {b};
  out.f.assign(size_t(b), 0.0);
  for (int64_t k = 0; k < b && c * b + k < numel; ++k)
    out.f[size_t(k)] = t.f[size_t(c * b + k)];
  return out;
}

/// How an argument is split over tp: {dim, outer}, or dim -1.
inline std::pair<int64_t, int64_t> splitOf(func::FuncOp f, unsigned i) {
  auto s = f.getArgAttrOfType<DictionaryAttr>(i, kiln::kShardAttr);
  if (!s || !s.get("dim"))
    return {-1, 1};
  return {s.getAs<IntegerAttr>("dim").getInt(), s.getAs<IntegerAttr>("outer").getInt()};
}

/// @train_step of `m` has state that ZeRO blocks over dp inside its tp
/// split (kiln.shard with both dim and zero = "dp").
inline bool hasZeroInsideTp(ModuleOp m) {
  auto step = m.lookupSymbol<func::FuncOp>("train_step");
  for (unsigned i = 0; i < step.getNumArguments(); ++i)
    if (zeroOf(step, i) == "dp" && splitOf(step, i).first >= 0)
      return true;
  return false;
}

/// Coordinates: element index <-> (pre, d, post) around dimension `dim`.
struct Around {
  int64_t pre = 1, size = 1, post = 1;
  Around(const std::vector<int64_t> &shape, int64_t dim) {
    for (int64_t i = 0; i < int64_t(shape.size()); ++i)
      (i < dim ? pre : i == dim ? size : post) *= shape[size_t(i)];
  }
};

/// Device c's block of `t` split on `dim` in `outer` parts over n devices,
/// written here independently of the runtime's cutting code.
inline Tensor cut(const Tensor &t, int64_t dim, int64_t outer, int64_t n, int64_t c) {
  Around a(t.shape, dim);
  int64_t part = a.size / outer, local = part / n;
  Tensor out = t;
  out.shape[size_t(dim)] = a.size / n;
  out.f.clear();
  for (int64_t p = 0; p < a.pre; ++p)
    for (int64_t k = 0; k < outer; ++k)
      for (int64_t j = 0; j < local; ++j)
        for (int64_t q = 0; q < a.post; ++q)
          out.f.push_back(t.f[size_t((p * a.size + k * part + c * local + j) * a.post + q)]);
  return out;
}

/// The inverse of cut(): the logical tensor from every device's block.
inline Tensor join(const std::vector<Tensor> &blocks, int64_t dim, int64_t outer) {
  int64_t n = int64_t(blocks.size());
  Tensor out = blocks[0];
  out.shape[size_t(dim)] *= n;
  Around a(out.shape, dim);
  out.f.assign(size_t(a.pre * a.size * a.post), 0.0);
  int64_t part = a.size / outer, local = part / n;
  for (int64_t c = 0; c < n; ++c) {
    size_t i = 0;
    for (int64_t p = 0; p < a.pre; ++p)
      for (int64_t k = 0; k < outer; ++k)
        for (int64_t j = 0; j < local; ++j)
          for (int64_t q = 0; q < a.post; ++q)
            out.f[size_t((p * a.size + k * part + c * local + j) * a.post + q)] =
                blocks[size_t(c)].f[i++];
  }
  return out;
}

/// Rows [begin, end) of `t` along dimension 0.
inline Tensor rows(const Tensor &t, int64_t begin, int64_t end) {
  Tensor out = t;
  int64_t inner = t.numel() / t.shape[0];
  out.shape[0] = end - begin;
  if (kiln::isFloat(t.elem))
    out.f.assign(t.f.begin() + begin * inner, t.f.begin() + end * inner);
  else
    out.i.assign(t.i.begin() + begin * inner, t.i.begin() + end * inner);
  return out;
}

struct Trace {
  std::vector<double> loss, norm, evalLoss;
  std::vector<double> logits; ///< @predict's first result on the last batch, device 0
  std::map<std::string, Tensor> params; ///< logical
};

inline constexpr int kSteps = 5;

/// @init, then kSteps train steps (and an @eval_step after each) on the
/// pp x dp x tp grid; device d = (stage * dp + dp coordinate) * tp + tp
/// coordinate. Pipeline stages: a device holds (and returns) only its own
/// stage's parameters; the logical ones come from their owner stage.
inline Trace train(ModuleOp m, int64_t dp, int64_t tp,
                   const std::vector<std::map<std::string, Tensor>> &data,
                   bool checkReplicas = true, bool sameTpRank = false, int64_t pp = 1) {
  Trace tr;
  int64_t n = dp * tp * pp;
  auto init = m.lookupSymbol<func::FuncOp>("init");
  auto step = m.lookupSymbol<func::FuncOp>("train_step");
  auto eval = m.lookupSymbol<func::FuncOp>("eval_step");
  std::vector<Tensor> initOut;
  std::string error;
  Tensor seed = Tensor::zeros(Elem::I64, {});
  seed.i[0] = 7;
  EXPECT_TRUE(kiln::interp::run(init, {seed}, initOut, error)) << error;
  std::map<std::string, Tensor> logical;
  for (unsigned i = 0; i < init.getNumResults(); ++i)
    logical[init.getResultAttrOfType<StringAttr>(i, kiln::KilnDialect::kOutputAttr).str()] =
        initOut[i];
  std::vector<std::vector<Tensor>> args(static_cast<size_t>(n));
  for (int64_t d = 0; d < n; ++d)
    for (unsigned i = 0; i < step.getNumArguments(); ++i) {
      std::string p = attr(step, i, kiln::KilnDialect::kParamAttr);
      std::string s = attr(step, i, kiln::KilnDialect::kStateAttr);
      auto [dim, outer] = splitOf(step, i);
      if (!p.empty() || !s.empty()) {
        const Tensor &t = logical.at(p.empty() ? s : p);
        Tensor mine = dim < 0 ? t : cut(t, dim, outer, tp, d % tp);
        if (zeroOf(step, i) == "dp") // the dp coordinate's block of that
          mine = zeroBlock(mine, dp, (d / tp) % dp);
        args[size_t(d)].push_back(mine);
      } else {
        args[size_t(d)].push_back(Tensor::zeros(Elem::I64, {}));
      }
    }
  kiln::interp::ProcessGrid grid;
  std::vector<kiln::interp::GridAxis> axes;
  if (pp > 1)
    axes.push_back({"pp", pp});
  if (pp > 1 || tp > 1 || dp > 1)
    axes.push_back({"dp", dp});
  if (tp > 1)
    axes.push_back({"tp", tp});
  if (n > 1) {
    EXPECT_TRUE(kiln::interp::ProcessGrid::create(axes, grid, error)) << error;
  }
  std::map<std::string, unsigned> out;
  for (unsigned i = 0; i < step.getNumResults(); ++i)
    out[step.getResultAttrOfType<StringAttr>(i, kiln::KilnDialect::kOutputAttr).str()] = i;
  auto inputFor = [&](func::FuncOp f, unsigned i, int64_t d, int s,
                      const std::map<std::string, Tensor> &batch) -> std::optional<Tensor> {
    std::string in = attr(f, i, kiln::KilnDialect::kInputAttr);
    if (in.empty())
      return std::nullopt;
    int64_t r = (d / tp) % dp; // the dp coordinate
    if (in == "step" || in == "replica" || in == "tp_rank") {
      Tensor t = Tensor::zeros(Elem::I64, {});
      t.i[0] = in == "step" ? s : in == "replica" ? r : sameTpRank ? 0 : d % tp;
      return t;
    }
    const Tensor &global = batch.at(in);
    int64_t per = global.shape[0] / dp;
    // @eval_step and @predict take one micro-batch (grad_accum = K makes
    // the step's K times larger): replica r's rows of the first dp of them.
    auto type = cast<RankedTensorType>(f.getArgument(i).getType());
    int64_t want = type.getRank() ? type.getDimSize(0) : per;
    if (want != per)
      return rows(global, r * want, (r + 1) * want);
    return rows(global, r * per, (r + 1) * per);
  };
  for (int s = 0; s < kSteps; ++s) {
    for (int64_t d = 0; d < n; ++d)
      for (unsigned i = 0; i < step.getNumArguments(); ++i)
        if (auto t = inputFor(step, i, d, s, data[size_t(s)]))
          args[size_t(d)][i] = *t;
    std::vector<std::vector<Tensor>> results;
    EXPECT_TRUE(n > 1 ? grid.run(step, args, results, error)
                      : (results.resize(1), kiln::interp::run(step, args[0], results[0], error)))
        << error;
    if (results.size() != size_t(n))
      return tr;
    for (int64_t d = 1; d < n && checkReplicas; ++d)
      for (const char *k : {"loss", "grad_norm"})
        EXPECT_EQ(results[size_t(d)][out[k]].f[0], results[0][out[k]].f[0])
            << k << " differs between device 0 and device " << d;
    tr.loss.push_back(results[0][out["loss"]].f[0]);
    tr.norm.push_back(results[0][out["grad_norm"]].f[0]);
    for (int64_t d = 0; d < n; ++d)
      for (unsigned i = 0; i < step.getNumArguments(); ++i) {
        std::string p = attr(step, i, kiln::KilnDialect::kParamAttr);
        std::string st = attr(step, i, kiln::KilnDialect::kStateAttr);
        // Another stage's parameter is absent here (and never read).
        if ((!p.empty() || !st.empty()) &&
            !results[size_t(d)][out.at(p.empty() ? st : p)].absent)
          args[size_t(d)][i] = results[size_t(d)][out.at(p.empty() ? st : p)];
      }
    // @eval_step on the same batch with the updated parameters.
    if (eval) {
      std::vector<std::vector<Tensor>> eargs(static_cast<size_t>(n));
      for (int64_t d = 0; d < n; ++d)
        for (unsigned i = 0; i < eval.getNumArguments(); ++i) {
          if (auto t = inputFor(eval, i, d, s, data[size_t(s)])) {
            eargs[size_t(d)].push_back(*t);
            continue;
          }
          std::string p = attr(eval, i, kiln::KilnDialect::kParamAttr);
          for (unsigned j = 0; j < step.getNumArguments(); ++j)
            if (attr(step, j, kiln::KilnDialect::kParamAttr) == p)
              eargs[size_t(d)].push_back(args[size_t(d)][j]);
        }
      std::vector<std::vector<Tensor>> eres;
      EXPECT_TRUE(n > 1 ? grid.run(eval, eargs, eres, error)
                        : (eres.resize(1), kiln::interp::run(eval, eargs[0], eres[0], error)))
          << error;
      // @eval_step evaluates each dp replica's own rows (the trainer
      // averages): the mean over dp of equal-sized halves' means.
      if (eres.size() == size_t(n)) {
        double sum = 0;
        for (int64_t r = 0; r < dp; ++r)
          sum += eres[size_t(r * tp)][0].f[0];
        tr.evalLoss.push_back(sum / double(dp));
      }
    }
  }
  // @predict on the last batch with the final parameters (vocabulary-split
  // logits are all-gathered whole).
  if (auto pred = m.lookupSymbol<func::FuncOp>("predict")) {
    std::vector<std::vector<Tensor>> pargs(static_cast<size_t>(n));
    for (int64_t d = 0; d < n; ++d)
      for (unsigned i = 0; i < pred.getNumArguments(); ++i) {
        if (auto t = inputFor(pred, i, d, kSteps - 1, data[kSteps - 1])) {
          pargs[size_t(d)].push_back(*t);
          continue;
        }
        std::string p = attr(pred, i, kiln::KilnDialect::kParamAttr);
        for (unsigned j = 0; j < step.getNumArguments(); ++j)
          if (attr(step, j, kiln::KilnDialect::kParamAttr) == p)
            pargs[size_t(d)].push_back(args[size_t(d)][j]);
      }
    std::vector<std::vector<Tensor>> pres;
    EXPECT_TRUE(n > 1 ? grid.run(pred, pargs, pres, error)
                      : (pres.resize(1), kiln::interp::run(pred, pargs[0], pres[0], error)))
        << error;
    if (pres.size() == size_t(n)) {
      tr.logits = pres[0][0].f;
      for (int64_t d = 1; d < tp && checkReplicas; ++d)
        EXPECT_EQ(pres[size_t(d)][0].f, pres[0][0].f) << "@predict differs on tp device " << d;
    }
  }
  for (unsigned i = 0; i < step.getNumArguments(); ++i) {
    std::string p = attr(step, i, kiln::KilnDialect::kParamAttr);
    if (p.empty())
      continue;
    // The owner stage's devices hold it: [base, base + dp * tp).
    auto stage = step.getArgAttrOfType<IntegerAttr>(i, kiln::kStageAttr);
    int64_t base = stage ? stage.getInt() * dp * tp : 0, end = stage ? base + dp * tp : n;
    auto [dim, outer] = splitOf(step, i);
    if (dim < 0) {
      tr.params[p] = args[size_t(base)][i];
      for (int64_t d = base + 1; d < end && checkReplicas; ++d)
        EXPECT_EQ(args[size_t(d)][i].f, args[size_t(base)][i].f)
            << p << " differs on device " << d;
      continue;
    }
    std::vector<Tensor> blocks;
    for (int64_t c = 0; c < tp; ++c)
      blocks.push_back(args[size_t(base + c)][i]);
    tr.params[p] = join(blocks, dim, outer);
    for (int64_t d = base + tp; d < end && checkReplicas; ++d)
      EXPECT_EQ(args[size_t(d)][i].f, args[size_t(base + d % tp)][i].f)
          << p << " differs between dp replicas on device " << d;
  }
  return tr;
}

/// Global batches for kSteps steps: K*N*B rows of every data input of the
/// 1-device @train_step (floats N(0, 1), integers uniform in [0, classes)).
inline std::vector<std::map<std::string, Tensor>> makeData(ModuleOp one, int64_t classes) {
  auto step = one.lookupSymbol<func::FuncOp>("train_step");
  std::mt19937_64 rng(12345);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_int_distribution<int64_t> cls(0, classes - 1);
  std::vector<std::map<std::string, Tensor>> data(kSteps);
  for (int s = 0; s < kSteps; ++s)
    for (unsigned i = 0; i < step.getNumArguments(); ++i) {
      std::string in = attr(step, i, kiln::KilnDialect::kInputAttr);
      if (in.empty() || in == "step")
        continue;
      Tensor t = kiln::interp::fromType(step.getArgument(i).getType());
      for (int64_t k = 0; k < t.numel(); ++k) {
        if (kiln::isFloat(t.elem))
          t.f[k] = double(float(normal(rng)));
        else
          t.i[k] = cls(rng);
      }
      data[s][in] = t;
    }
  return data;
}

// Tolerance: 1e-5 relative plus an absolute floor of 1e-6 on parameters
// (fp32). A split contraction sums each output in T pieces and then adds
// them, where one device sums in one pass, so float32 rounding differs by a
// few ulps, and Adam's m / (sqrt(v) + eps) can amplify a few-ulp difference
// of a near-zero gradient. The floor is 1e-3 of lr, ten times data
// parallelism's (DataParallelTest.cpp), because of one parameter: the key
// bias of attention, whose gradient is zero in exact arithmetic (softmax
// does not change when every score of a row moves by q . b_k), so its
// Adam updates are rounding noise times lr / eps; measured, it differs by
// up to 1.02e-7 after 5 steps, and every other parameter by far less (the
// worst ratio is printed). A missing all-reduce moves parameters by ~lr:
// TensorParallelTolerance shows it caught by more than 10x.
inline constexpr double kRel = 1e-5, kAbsParam = 1e-6;

inline double worstOf(const Trace &a, const Trace &b) {
  double worst = 0;
  for (const auto &[name, t] : b.params) {
    const Tensor &u = a.params.at(name);
    if (u.f.size() != t.f.size())
      return 1e30;
    for (size_t k = 0; k < t.f.size(); ++k)
      worst = std::max(worst, std::fabs(u.f[k] - t.f[k]) / (kRel * std::fabs(t.f[k]) + kAbsParam));
  }
  return worst;
}

inline void expectClose(const Trace &a, const Trace &b, const std::string &what) {
  ASSERT_EQ(a.loss.size(), b.loss.size());
  ASSERT_EQ(a.evalLoss.size(), b.evalLoss.size());
  for (size_t s = 0; s < a.loss.size(); ++s) {
    EXPECT_NEAR(a.loss[s], b.loss[s], kRel * std::fabs(b.loss[s]) + 1e-7)
        << what << ": loss at step " << s;
    EXPECT_NEAR(a.norm[s], b.norm[s], kRel * std::fabs(b.norm[s]) + 1e-7)
        << what << ": grad norm at step " << s;
    EXPECT_NEAR(a.evalLoss[s], b.evalLoss[s], kRel * std::fabs(b.evalLoss[s]) + 1e-7)
        << what << ": eval loss after step " << s;
  }
  // @predict's logits (device 0: with dp > 1, the first replica's rows).
  if (!b.logits.empty() && a.logits.size() <= b.logits.size()) {
    ASSERT_FALSE(a.logits.empty());
    for (size_t k = 0; k < a.logits.size(); ++k)
      ASSERT_NEAR(a.logits[k], b.logits[k], kRel * std::fabs(b.logits[k]) + 1e-6)
          << what << ": @predict logit " << k;
  }
  for (const auto &[name, t] : b.params) {
    const Tensor &u = a.params.at(name);
    ASSERT_EQ(u.shape, t.shape) << name;
    for (size_t k = 0; k < t.f.size(); ++k)
      ASSERT_LE(std::fabs(u.f[k] - t.f[k]), kRel * std::fabs(t.f[k]) + kAbsParam)
          << what << ": parameter " << name << "[" << k << "] " << u.f[k] << " vs " << t.f[k];
  }
  std::printf("%s: worst parameter difference %.3f of the tolerance\n", what.c_str(),
              worstOf(a, b));
}

inline std::string inputs(const std::string &file) {
  return std::string(KILN_TEST_INPUTS_DIR) + "/" + file;
}
inline std::string example(const std::string &file) {
  return std::string(KILN_EXAMPLES_DIR) + "/" + file;
}

} // namespace kiln::testgrid

#endif // KILN_TEST_UNIT_PASSES_GRID_H
