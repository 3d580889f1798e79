//===- TensorParallelTest.cpp - The tensor-parallel step on the reference grid ===//
//
// kiln-tensor-parallel checked numerically with no runtime involved: the
// tp = N per-device programs (@train_step, @eval_step), run on the
// reference interpreter's process grid (collectives in member order), each
// device given its blocks of the split parameters and optimizer state,
// against the 1-device program on the same batch, over 5 AdamW steps with
// clipping active; then the blocks are joined back into the logical
// parameters and compared. Also dp x tp = 2 x 2 against one device on the
// 2-times batch.
//
//===----------------------------------------------------------------------===//
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
#include <fstream>
#include <map>
#include <random>
#include <sstream>

using namespace mlir;
using kiln::interp::Elem;
using kiln::interp::Tensor;

namespace {

struct Model {
  std::string path;                           ///< the .kiln file
  std::map<std::string, std::string> params;  ///< --param overrides
  int64_t batch;                              ///< per data-parallel replica
  double gradClip;
  int64_t classes; ///< integer inputs are drawn from [0, classes)
};

std::string readFile(const std::string &path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// The training program of `s` on dp x tp devices.
OwningOpRef<ModuleOp> compile(MLIRContext &ctx, const Model &s, int64_t dp, int64_t tp,
                              int64_t batch) {
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
  t.set("devices", b.getI64IntegerAttr(dp * tp));
  t.set("tp", b.getI64IntegerAttr(tp));
  (*m)->setAttr(kiln::KilnDialect::kTrainAttr, t.getDictionary(&ctx));
  kiln::setMesh(*m, kiln::meshFor(dp * tp, tp));
  PassManager pm(&ctx);
  kiln::buildTrainProgramPipeline(pm);
  EXPECT_TRUE(succeeded(pm.run(*m)));
  return m;
}

std::string attr(func::FuncOp f, unsigned i, StringRef name) {
  if (auto a = f.getArgAttrOfType<StringAttr>(i, name))
    return a.getValue().str();
  return "";
}

/// How an argument is split over tp: {dim, outer}, or dim -1.
std::pair<int64_t, int64_t> splitOf(func::FuncOp f, unsigned i) {
  auto s = f.getArgAttrOfType<DictionaryAttr>(i, kiln::kShardAttr);
  if (!s || !s.get("dim"))
    return {-1, 1};
  return {s.getAs<IntegerAttr>("dim").getInt(), s.getAs<IntegerAttr>("outer").getInt()};
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
Tensor cut(const Tensor &t, int64_t dim, int64_t outer, int64_t n, int64_t c) {
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
Tensor join(const std::vector<Tensor> &blocks, int64_t dim, int64_t outer) {
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
Tensor rows(const Tensor &t, int64_t begin, int64_t end) {
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

constexpr int kSteps = 5;

/// @init, then kSteps train steps (and an @eval_step after each) on the
/// dp x tp grid; device d = dp coordinate * tp + tp coordinate.
Trace train(ModuleOp m, int64_t dp, int64_t tp,
            const std::vector<std::map<std::string, Tensor>> &data, bool checkReplicas = true,
            bool sameTpRank = false) {
  Trace tr;
  int64_t n = dp * tp;
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
        args[size_t(d)].push_back(dim < 0 ? t : cut(t, dim, outer, tp, d % tp));
      } else {
        args[size_t(d)].push_back(Tensor::zeros(Elem::I64, {}));
      }
    }
  kiln::interp::ProcessGrid grid;
  std::vector<kiln::interp::GridAxis> axes;
  if (tp > 1)
    axes = {{"dp", dp}, {"tp", tp}};
  else if (dp > 1)
    axes = {{"dp", dp}};
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
    int64_t r = d / tp; // the dp coordinate
    if (in == "step" || in == "replica" || in == "tp_rank") {
      Tensor t = Tensor::zeros(Elem::I64, {});
      t.i[0] = in == "step" ? s : in == "replica" ? r : sameTpRank ? 0 : d % tp;
      return t;
    }
    const Tensor &global = batch.at(in);
    int64_t per = global.shape[0] / dp;
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
        if (!p.empty() || !st.empty())
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
    auto [dim, outer] = splitOf(step, i);
    if (dim < 0) {
      tr.params[p] = args[0][i];
      for (int64_t d = 1; d < n && checkReplicas; ++d)
        EXPECT_EQ(args[size_t(d)][i].f, args[0][i].f) << p << " differs on device " << d;
      continue;
    }
    std::vector<Tensor> blocks;
    for (int64_t c = 0; c < tp; ++c)
      blocks.push_back(args[size_t(c)][i]);
    tr.params[p] = join(blocks, dim, outer);
    for (int64_t d = tp; d < n && checkReplicas; ++d)
      EXPECT_EQ(args[size_t(d)][i].f, args[size_t(d % tp)][i].f)
          << p << " differs between dp replicas on device " << d;
  }
  return tr;
}

/// Global batches for kSteps steps: K*N*B rows of every data input of the
/// 1-device @train_step (floats N(0, 1), integers uniform in [0, classes)).
std::vector<std::map<std::string, Tensor>> makeData(ModuleOp one, int64_t classes) {
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
constexpr double kRel = 1e-5, kAbsParam = 1e-6;

double worstOf(const Trace &a, const Trace &b) {
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

void expectClose(const Trace &a, const Trace &b, const std::string &what) {
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

std::string inputs(const std::string &file) {
  return std::string(KILN_TEST_INPUTS_DIR) + "/" + file;
}
std::string example(const std::string &file) {
  return std::string(KILN_EXAMPLES_DIR) + "/" + file;
}

Model mlp() { return {inputs("tp_mlp.kiln"), {{"hidden", "32"}}, 4, 0.2, 10}; }
/// Column-parallel layers whose outputs must be gathered whole.
Model gatherMlp() { return {inputs("tp_gather.kiln"), {}, 4, 0.2, 10}; }
Model gpt() {
  return {example("shakespeare_char_cpu.kiln"),
          {{"layers", "1"}, {"d", "16"}, {"ctx", "8"}, {"heads", "2"}},
          2, 0.1, 65};
}
Model gptBias() { return {inputs("tp_gpt.kiln"), {{"layers", "1"}, {"ctx", "8"}}, 2, 0.1, 65}; }
/// A vocabulary of 68 (tp = 2 and 4 divide it): the tied embedding and
/// lm_head split on their rows, the cross-entropy vocabulary-parallel.
Model gptVocab() {
  return {inputs("tp_gpt.kiln"), {{"layers", "1"}, {"ctx", "8"}, {"vocab", "68"}}, 2, 0.1, 68};
}

class TensorParallel : public ::testing::Test {
protected:
  void SetUp() override { ctx_.loadDialect<kiln::KilnDialect, func::FuncDialect>(); }
  /// dp x tp against one device on the dp-times batch.
  void check(const Model &s, int64_t dp, int64_t tp) {
    OwningOpRef<ModuleOp> one = compile(ctx_, s, 1, 1, dp * s.batch);
    ASSERT_TRUE(one);
    auto data = makeData(*one, s.classes);
    Trace ref = train(*one, 1, 1, data);
    OwningOpRef<ModuleOp> m = compile(ctx_, s, dp, tp, s.batch);
    ASSERT_TRUE(m);
    Trace t = train(*m, dp, tp, data);
    expectClose(t, ref, s.path + " dp=" + std::to_string(dp) + " tp=" + std::to_string(tp));
    EXPECT_GT(ref.norm[0], s.gradClip) << "clipping should be active";
  }
  MLIRContext ctx_;
};

TEST_F(TensorParallel, MlpTp2EqualsOneDevice) { check(mlp(), 1, 2); }
TEST_F(TensorParallel, MlpTp4EqualsOneDevice) { check(mlp(), 1, 4); }
TEST_F(TensorParallel, GptTp2EqualsOneDevice) { check(gpt(), 1, 2); }
TEST_F(TensorParallel, GptWithBiasesTp2EqualsOneDevice) { check(gptBias(), 1, 2); }
TEST_F(TensorParallel, GptWithBiasesTp4EqualsOneDevice) { check(gptBias(), 1, 4); }
TEST_F(TensorParallel, MlpDp2Tp2EqualsOneDeviceOnTheTwiceBatch) { check(mlp(), 2, 2); }
TEST_F(TensorParallel, GatheredColumnOutputsTp2EqualsOneDevice) { check(gatherMlp(), 1, 2); }
TEST_F(TensorParallel, GatheredColumnOutputsTp4EqualsOneDevice) { check(gatherMlp(), 1, 4); }
TEST_F(TensorParallel, VocabParallelGptTp2EqualsOneDevice) { check(gptVocab(), 1, 2); }
TEST_F(TensorParallel, VocabParallelGptTp4EqualsOneDevice) { check(gptVocab(), 1, 4); }
TEST_F(TensorParallel, VocabParallelGptDp2Tp2EqualsOneDeviceOnTheTwiceBatch) {
  check(gptVocab(), 2, 2);
}
TEST_F(TensorParallel, GptDp2Tp2EqualsOneDeviceOnTheTwiceBatch) { check(gptBias(), 2, 2); }

/// Dropout of attention's probabilities (split by heads): the masks depend
/// on the device's tp coordinate ("tp_rank"), so tp devices do not draw the
/// same mask for their different heads; giving both devices coordinate 0
/// changes the result.
TEST_F(TensorParallel, SplitDropoutDrawsPerTpDevice) {
  std::string src = readFile(inputs("tp_gpt.kiln"));
  std::string from = "causal = true, bias = true)";
  size_t at = src.find(from);
  ASSERT_NE(at, std::string::npos);
  src.replace(at, from.size(), "causal = true, bias = true, dropout = 0.5)");
  std::string path = ::testing::TempDir() + "/tp_gpt_dropout.kiln";
  std::ofstream(path) << src;
  Model s{path, {{"layers", "1"}, {"ctx", "8"}}, 2, 0.1, 65};
  OwningOpRef<ModuleOp> m = compile(ctx_, s, 1, 2, s.batch);
  ASSERT_TRUE(m);
  bool hasRank = false;
  auto step = m->lookupSymbol<func::FuncOp>("train_step");
  for (unsigned i = 0; i < step.getNumArguments(); ++i)
    hasRank |= attr(step, i, kiln::KilnDialect::kInputAttr) == "tp_rank";
  ASSERT_TRUE(hasRank);
  auto data = makeData(*m, s.classes);
  Trace own = train(*m, 1, 2, data);
  Trace same = train(*m, 1, 2, data, /*checkReplicas=*/true, /*sameTpRank=*/true);
  ASSERT_EQ(own.loss.size(), same.loss.size());
  EXPECT_NE(own.loss[0], same.loss[0]);
  EXPECT_GT(worstOf(own, same), 10.0);
}

/// The cutting helpers of this test agree with each other (the reference
/// for the runtime's own cutting).
TEST(TensorParallelCut, JoinInvertsCut) {
  Tensor t = Tensor::zeros(Elem::F32, {6, 4});
  for (size_t k = 0; k < t.f.size(); ++k)
    t.f[k] = double(k);
  for (auto [dim, outer] : {std::pair<int64_t, int64_t>{0, 1}, {0, 3}, {1, 1}, {1, 2}}) {
    std::vector<Tensor> blocks;
    for (int64_t c = 0; c < 2; ++c)
      blocks.push_back(cut(t, dim, outer, 2, c));
    EXPECT_EQ(join(blocks, dim, outer).f, t.f) << dim << " " << outer;
  }
  // [6, 4] on dim 0 in 3 parts over 2: device 1 holds rows 1, 3, 5.
  Tensor b = cut(t, 0, 3, 2, 1);
  EXPECT_EQ(b.shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(b.f[0], 4.0);
  EXPECT_EQ(b.f[4], 12.0);
  EXPECT_EQ(b.f[8], 20.0);
}

/// The tolerance is not vacuous: skipping the tp all-reduces is caught.
TEST(TensorParallelTolerance, AMissingAllReduceIsCaught) {
  MLIRContext ctx;
  ctx.loadDialect<kiln::KilnDialect, func::FuncDialect>();
  Model s = mlp();
  OwningOpRef<ModuleOp> one = compile(ctx, s, 1, 1, s.batch);
  ASSERT_TRUE(one);
  auto data = makeData(*one, s.classes);
  Trace ref = train(*one, 1, 1, data);
  OwningOpRef<ModuleOp> m = compile(ctx, s, 1, 2, s.batch);
  ASSERT_TRUE(m);
  int64_t removed = 0;
  m->lookupSymbol<func::FuncOp>("train_step").walk([&](kiln::AllReduceOp op) {
    if (op.getType().getRank() > 0) {
      op.getResult().replaceAllUsesWith(op.getOperand());
      ++removed;
    }
  });
  EXPECT_GT(removed, 0);
  Trace bad = train(*m, 1, 2, data, /*checkReplicas=*/false);
  EXPECT_GT(worstOf(bad, ref), 10.0) << "a missing all-reduce must be far outside the tolerance";
}

} // namespace
