//===- PlannerTest.cpp - The parallelism planner over a machine given as data
//
// compiler/planner/Planner.h takes the machine it plans for as data: from
// a MachineProbe (kilnc passes the runtime's measurements) or from given
// constants. Here a probe that measures nothing: the planner asks it once
// for the device count it plans, hands it the candidates' GEMM shapes to
// time, predicts from what it returned, and lays the module out; given
// constants bypass the probe; a front end with neither is told what to give.
//
//===----------------------------------------------------------------------===//
#include "compiler/Driver.h"
#include "compiler/planner/Planner.h"
#include "dialects/kiln/KilnDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>

#include <string>

namespace {

const char *kMlp = R"(model mlp(features = 64, hidden = 128, classes = 10) {
  input x:      f32[B, features]
  input labels: i32[B]
  h = relu(linear(x, hidden))
  logits = linear(h, classes)
  loss = cross_entropy(logits, labels)
}

train {
  batch = 8
  steps = 2
  optimizer = sgd(lr = 0.1)
}
)";

struct Planner : ::testing::Test {
  Planner() { context.loadDialect<kiln::KilnDialect, mlir::func::FuncDialect>(); }

  mlir::OwningOpRef<mlir::ModuleOp> load() {
    source = std::make_unique<kiln::frontend::SourceFile>("mlp.kiln", kMlp);
    diags = std::make_unique<kiln::DiagnosticText>(context, *source);
    kiln::LoadResult loaded = kiln::load(context, *source, kiln::frontend::FrontendOptions());
    EXPECT_TRUE(loaded) << loaded.diagnostics << loaded.status.message();
    kiln::CompileOptions options;
    options.modelPath = "mlp.kiln";
    EXPECT_TRUE(kiln::configure(*loaded.module, options));
    return std::move(loaded.module);
  }

  int64_t trainInt(mlir::ModuleOp m, const char *key) {
    auto train = m->getAttrOfType<mlir::DictionaryAttr>(kiln::KilnDialect::kTrainAttr);
    auto a = train ? train.getAs<mlir::IntegerAttr>(key) : nullptr;
    return a ? a.getInt() : -1;
  }

  mlir::MLIRContext context;
  std::unique_ptr<kiln::frontend::SourceFile> source;
  std::unique_ptr<kiln::DiagnosticText> diags;
};

TEST_F(Planner, AsksTheProbeForTheMachineAndTimesTheCandidatesGemms) {
  auto module = load();
  ASSERT_TRUE(module);
  int measured = 0, timed = 0;
  size_t shapes = 0;
  kiln::planner::MachineProbe probe;
  probe.measure = [&](int devices, kiln::planner::Machine &m, std::string &) {
    ++measured;
    EXPECT_EQ(devices, 2);
    m.devices = devices;
    m.cores = 2;
    m.machineFlops = 100e9;
    m.machineBandwidth = 20e9;
    kiln::planner::shareMachine(m);
    m.commLatency = 50e-6;
    m.commBusBandwidth = 4e9;
    m.calibration = "the test's constants";
    m.commCalibration = "the test's constants";
    return true;
  };
  probe.timeGemms = [&](const std::vector<kiln::program::GemmParams> &s,
                        kiln::planner::Machine &m) {
    ++timed;
    shapes = s.size();
    for (const kiln::program::GemmParams &g : s)
      m.gemmSeconds[kiln::planner::gemmShapeKey(g)] = 1e-5;
    m.gemmCalibration = "every shape 10 us (the test's)";
  };
  kiln::planner::Options options;
  options.devices = 2;
  options.modelPath = "mlp.kiln";
  std::string report;
  llvm::raw_string_ostream os(report);
  kiln::Status st =
      kiln::planner::chooseLayout(*module, options, std::nullopt, probe, diags->text, os);
  ASSERT_TRUE(st) << st.message() << report;
  EXPECT_EQ(measured, 1);
  EXPECT_EQ(timed, 1);
  EXPECT_GT(shapes, 0u);
  EXPECT_NE(report.find("the test's constants"), std::string::npos) << report;
  EXPECT_NE(report.find("every shape 10 us (the test's)"), std::string::npos) << report;
  EXPECT_EQ(trainInt(*module, "devices"), 2); // the chosen layout, set on the module
}

TEST_F(Planner, GivenConstantsBypassTheProbeAndNoneIsAnError) {
  auto module = load();
  ASSERT_TRUE(module);
  kiln::planner::MachineProbe probe;
  bool asked = false;
  probe.measure = [&](int, kiln::planner::Machine &, std::string &) { return asked = true; };
  kiln::planner::Options options;
  options.devices = 2;
  options.modelPath = "mlp.kiln";
  std::string report;
  llvm::raw_string_ostream os(report);
  kiln::Status st = kiln::planner::chooseLayout(
      *module, options, std::string("cores=2,gflops=100,gbps=20,latency-us=50,busbw-gbps=4"),
      probe, diags->text, os);
  ASSERT_TRUE(st) << st.message();
  EXPECT_FALSE(asked);
  EXPECT_NE(report.find("not timed (--planner-machine)"), std::string::npos) << report;

  auto other = load();
  st = kiln::planner::chooseLayout(*other, options, std::nullopt, kiln::planner::MachineProbe{},
                                   diags->text, os);
  ASSERT_FALSE(st);
  EXPECT_NE(st.message().find("--planner-machine"), std::string::npos) << st.message();
}

} // namespace
