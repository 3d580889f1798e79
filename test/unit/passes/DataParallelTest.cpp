//===- DataParallelTest.cpp - The data-parallel step on the reference grid ===//
//
// kiln-data-parallel checked numerically with no runtime involved: the
// N-device @train_step, run on the reference interpreter's process grid
// (dp = N, collectives in member order), against the 1-device step on the
// N-times batch, for both examples, with grad_accum and clipping, over 5
// optimizer steps; and ZeRO-1/2 against plain DP, bit for bit.
//
// Data follows the cross-part convention: one step of the 1-device run
// reads K*N*B rows; rank r reads rows [r*K*B, (r+1)*K*B) of them.
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
  std::string file;                            ///< examples/...
  std::map<std::string, std::string> params;  ///< --param overrides
  int64_t batch;                               ///< per device
  int64_t gradAccum;
  double gradClip;
  int64_t classes; ///< integer inputs are drawn from [0, classes)
};

std::string readFile(const std::string &path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// The training program of `s` for `devices` devices (batch = per-device
/// batch) with ZeRO stage `zero`.
OwningOpRef<ModuleOp> compile(MLIRContext &ctx, const Model &s, int64_t devices, int64_t batch,
                              int zero) {
  std::string path = std::string(KILN_EXAMPLES_DIR) + "/" + s.file;
  kiln::frontend::SourceFile source(path, readFile(path));
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
  t.set("grad_accum", b.getI64IntegerAttr(s.gradAccum));
  t.set("grad_clip", b.getF64FloatAttr(s.gradClip));
  t.set("devices", b.getI64IntegerAttr(devices));
  t.set("zero", b.getI64IntegerAttr(zero));
  (*m)->setAttr(kiln::KilnDialect::kTrainAttr, t.getDictionary(&ctx));
  kiln::MeshShape mesh;
  if (devices > 1)
    mesh.axes.push_back({"dp", devices});
  kiln::setMesh(*m, mesh);
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

/// Block d of the zero-padded row-major flattening of `t` into n blocks.
Tensor block(const Tensor &t, int64_t n, int64_t d) {
  int64_t size = (t.numel() + n - 1) / n;
  Tensor out = Tensor::zeros(t.elem, {size});
  for (int64_t k = 0; k < size; ++k)
    if (d * size + k < t.numel())
      out.f[k] = t.f[d * size + k];
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

/// What 5 steps produce: per step loss and grad norm; the final named
/// parameters (and optimizer state, logical).
struct Trace {
  std::vector<double> loss, norm;
  std::map<std::string, Tensor> params;
};

constexpr int kSteps = 5;

/// Runs @init then kSteps train steps of `m` on `n` devices of the grid;
/// `data[s]` holds step s's global batch (K*N*B rows per input).
Trace train(ModuleOp m, int64_t n, const std::vector<std::map<std::string, Tensor>> &data,
            bool checkReplicasEqual = true) {
  Trace tr;
  auto init = m.lookupSymbol<func::FuncOp>("init");
  auto step = m.lookupSymbol<func::FuncOp>("train_step");
  std::vector<Tensor> initOut;
  std::string error;
  Tensor seed = Tensor::zeros(Elem::I64, {});
  seed.i[0] = 7;
  EXPECT_TRUE(kiln::interp::run(init, {seed}, initOut, error)) << error;
  std::map<std::string, Tensor> logical; // by kiln.output name of @init
  for (unsigned i = 0; i < init.getNumResults(); ++i)
    logical[init.getResultAttrOfType<StringAttr>(i, kiln::KilnDialect::kOutputAttr).str()] =
        initOut[i];
  // Per-device argument lists.
  std::vector<std::vector<Tensor>> args(n);
  for (int64_t r = 0; r < n; ++r)
    for (unsigned i = 0; i < step.getNumArguments(); ++i) {
      std::string p = attr(step, i, kiln::KilnDialect::kParamAttr);
      std::string s = attr(step, i, kiln::KilnDialect::kStateAttr);
      if (!p.empty())
        args[r].push_back(logical.at(p));
      else if (!s.empty())
        args[r].push_back(step.getArgAttr(i, kiln::kShardAttr) ? block(logical.at(s), n, r)
                                                               : logical.at(s));
      else
        args[r].push_back(Tensor::zeros(Elem::I64, {})); // inputs: filled per step
    }
  kiln::interp::ProcessGrid grid;
  if (n > 1)
    EXPECT_TRUE(kiln::interp::ProcessGrid::create({{"dp", n}}, grid, error)) << error;
  std::map<std::string, unsigned> out;
  for (unsigned i = 0; i < step.getNumResults(); ++i)
    out[step.getResultAttrOfType<StringAttr>(i, kiln::KilnDialect::kOutputAttr).str()] = i;
  for (int s = 0; s < kSteps; ++s) {
    for (int64_t r = 0; r < n; ++r)
      for (unsigned i = 0; i < step.getNumArguments(); ++i) {
        std::string in = attr(step, i, kiln::KilnDialect::kInputAttr);
        if (in.empty())
          continue;
        if (in == "step" || in == "replica") {
          args[r][i] = Tensor::zeros(Elem::I64, {});
          args[r][i].i[0] = in == "step" ? s : r;
          continue;
        }
        if (in == "stop") { // this device's stop request: the last device asks at the last step
          args[r][i] = Tensor::zeros(Elem::F32, {});
          args[r][i].f[0] = s == kSteps - 1 && r == n - 1 ? 1.0f : 0.0f;
          continue;
        }
        const Tensor &global = data[s].at(in);
        int64_t per = global.shape[0] / n;
        args[r][i] = rows(global, r * per, (r + 1) * per);
      }
    std::vector<std::vector<Tensor>> results;
    EXPECT_TRUE(grid.run(step, args, results, error)) << error;
    if (results.size() != size_t(n))
      return tr;
    if (checkReplicasEqual)
      for (int64_t r = 1; r < n; ++r)
        for (const char *k : {"loss", "grad_norm"})
          EXPECT_EQ(results[r][out[k]].f[0], results[0][out[k]].f[0])
              << k << " differs between device 0 and device " << r;
    if (n > 1) { // the combined scalars' exchange: every device sees the sum of the votes
      for (int64_t r = 0; r < n; ++r) {
        EXPECT_EQ(results[r][out.at("stop")].f[0], s == kSteps - 1 ? 1.0f : 0.0f)
            << "stop votes seen by device " << r << " at step " << s;
      }
    }
    tr.loss.push_back(results[0][out["loss"]].f[0]);
    tr.norm.push_back(results[0][out["grad_norm"]].f[0]);
    // The next step's parameters and state: each device's own results.
    for (int64_t r = 0; r < n; ++r)
      for (unsigned i = 0; i < step.getNumArguments(); ++i) {
        std::string p = attr(step, i, kiln::KilnDialect::kParamAttr);
        std::string st = attr(step, i, kiln::KilnDialect::kStateAttr);
        if (!p.empty())
          args[r][i] = results[r][out.at(p)];
        else if (!st.empty())
          args[r][i] = results[r][out.at(st)];
      }
  }
  for (unsigned i = 0; i < step.getNumArguments(); ++i) {
    std::string p = attr(step, i, kiln::KilnDialect::kParamAttr);
    if (p.empty())
      continue;
    tr.params[p] = args[0][i];
    for (int64_t r = 1; r < n && checkReplicasEqual; ++r)
      EXPECT_EQ(args[r][i].f, args[0][i].f) << "parameter " << p << " differs on device " << r;
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

// Tolerance: 1e-5 relative plus an absolute floor of 1e-7 on parameters
// (fp32). The N-device step sums each gradient in a different order (per
// device, then over devices) from the 1-device step, so float32 rounding
// differs by a few ulps; Adam's m / (sqrt(v) + eps) can turn a few-ulp
// difference in a near-zero gradient into a larger one in that
// coordinate's update, and parameters near zero have no relative margin:
// the floor (1e-4 of lr = 1e-3) covers that. Measured: the worst
// coordinate uses about 1-2% of it. A real error (an unreduced gradient)
// moves parameters by ~lr; the sanity check below shows it caught.
constexpr double kRel = 1e-5, kAbsParam = 1e-7;

void expectClose(const Trace &a, const Trace &b, const std::string &what) {
  ASSERT_EQ(a.loss.size(), b.loss.size());
  for (size_t s = 0; s < a.loss.size(); ++s) {
    EXPECT_NEAR(a.loss[s], b.loss[s], kRel * std::fabs(b.loss[s]) + 1e-7)
        << what << ": loss at step " << s;
    EXPECT_NEAR(a.norm[s], b.norm[s], kRel * std::fabs(b.norm[s]) + 1e-7)
        << what << ": grad norm at step " << s;
  }
  double worst = 0;
  for (const auto &[name, t] : b.params) {
    const Tensor &u = a.params.at(name);
    ASSERT_EQ(u.f.size(), t.f.size()) << name;
    for (size_t k = 0; k < t.f.size(); ++k) {
      double d = std::fabs(u.f[k] - t.f[k]);
      worst = std::max(worst, d / (kRel * std::fabs(t.f[k]) + kAbsParam));
      ASSERT_LE(d, kRel * std::fabs(t.f[k]) + kAbsParam)
          << what << ": parameter " << name << "[" << k << "] " << u.f[k] << " vs " << t.f[k];
    }
  }
  std::printf("%s: worst parameter difference %.3f of the tolerance\n", what.c_str(), worst);
}

void expectBitwise(const Trace &a, const Trace &b, const std::string &what) {
  EXPECT_EQ(a.loss, b.loss) << what;
  EXPECT_EQ(a.norm, b.norm) << what;
  for (const auto &[name, t] : b.params)
    EXPECT_EQ(a.params.at(name).f, t.f) << what << ": parameter " << name;
}

class DataParallel : public ::testing::TestWithParam<int> {
protected:
  void SetUp() override { ctx_.loadDialect<kiln::KilnDialect, func::FuncDialect>(); }
  void check(const Model &s) {
    int64_t n = GetParam();
    OwningOpRef<ModuleOp> one = compile(ctx_, s, 1, n * s.batch, 0);
    ASSERT_TRUE(one);
    auto data = makeData(*one, s.classes);
    Trace ref = train(*one, 1, data);
    OwningOpRef<ModuleOp> dp = compile(ctx_, s, n, s.batch, 0);
    ASSERT_TRUE(dp);
    Trace t0 = train(*dp, n, data);
    expectClose(t0, ref, s.file + " dp=" + std::to_string(n));
    // The check can fail: the gradient clipping is active, and parameters
    // moved by much more than the tolerance.
    EXPECT_GT(ref.norm[0], s.gradClip) << "clipping should be active";
    for (int z : {1, 2}) {
      OwningOpRef<ModuleOp> zm = compile(ctx_, s, n, s.batch, z);
      ASSERT_TRUE(zm);
      Trace tz = train(*zm, n, data);
      expectBitwise(tz, t0, s.file + " zero=" + std::to_string(z) + " vs dp");
    }
  }
  MLIRContext ctx_;
};

TEST_P(DataParallel, MlpEqualsOneDeviceOnTheNTimesBatch) {
  check({"mlp.kiln", {{"hidden", "32"}}, 4, 2, 0.2, 10});
}

TEST_P(DataParallel, GptEqualsOneDeviceOnTheNTimesBatch) {
  check({"shakespeare_char_cpu.kiln",
         {{"layers", "1"}, {"d", "16"}, {"ctx", "8"}, {"heads", "2"}},
         2, 2, 0.1, 65});
}

INSTANTIATE_TEST_SUITE_P(Devices, DataParallel, ::testing::Values(2, 4),
                         [](const auto &info) { return "dp" + std::to_string(info.param); });

/// The sanity check of the tolerance: a step whose devices skip the
/// gradient all-reduce (each trains on its own rows) is caught.
TEST(DataParallelTolerance, AWrongReductionIsCaught) {
  MLIRContext ctx;
  ctx.loadDialect<kiln::KilnDialect, func::FuncDialect>();
  Model s{"mlp.kiln", {{"hidden", "32"}}, 4, 1, 0.0, 10};
  OwningOpRef<ModuleOp> one = compile(ctx, s, 1, 2 * s.batch, 0);
  ASSERT_TRUE(one);
  auto data = makeData(*one, s.classes);
  Trace ref = train(*one, 1, data);
  OwningOpRef<ModuleOp> dp = compile(ctx, s, 2, s.batch, 0);
  ASSERT_TRUE(dp);
  dp->walk([](kiln::AllReduceOp op) {
    if (op->hasAttr(kiln::KilnDialect::kOverlapAttr))
      op.getResult().replaceAllUsesWith(op.getOperand());
  });
  Trace bad = train(*dp, 2, data, /*checkReplicasEqual=*/false);
  double worst = 0;
  for (const auto &[name, t] : ref.params)
    for (size_t k = 0; k < t.f.size(); ++k)
      worst = std::max(worst, std::fabs(bad.params.at(name).f[k] - t.f[k]) /
                                  (kRel * std::fabs(t.f[k]) + kAbsParam));
  EXPECT_GT(worst, 10.0) << "unreduced gradients must be far outside the tolerance";
}

} // namespace
