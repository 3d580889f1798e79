//===- DriverTest.cpp - The compile driver without kilnc ------------------===//
//
// compiler/Driver.h as the planner and the Python package use it: a model's
// text loaded, configured with layout and precision options, compiled into
// a plan and an artifact's sections; the errors a caller gets (a status
// naming the flag, diagnostics rendered against the model file).
//
//===----------------------------------------------------------------------===//
#include "compiler/Driver.h"
#include "dialects/kiln/KilnDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>

#include <string>

namespace {

const char *kMlp = R"(model mlp(features = 8, hidden = 16, classes = 4) {
  input x:      f32[B, features]
  input labels: i32[B]
  h = relu(linear(x, hidden))
  logits = linear(h, classes)
  loss = cross_entropy(logits, labels)
}

train {
  batch = 4
  steps = 2
  optimizer = adam(lr = 1e-3)
  seed = 7
}
)";

struct Driver : ::testing::Test {
  Driver() { context.loadDialect<kiln::KilnDialect, mlir::func::FuncDialect>(); }

  /// `text` loaded as the model file `name`; diagnostics collected in `diags`.
  kiln::LoadResult load(const std::string &name, const std::string &text) {
    source = std::make_unique<kiln::frontend::SourceFile>(name, text);
    diags = std::make_unique<kiln::DiagnosticText>(context, *source);
    return kiln::load(context, *source, kiln::frontend::FrontendOptions());
  }

  mlir::MLIRContext context;
  std::unique_ptr<kiln::frontend::SourceFile> source;
  std::unique_ptr<kiln::DiagnosticText> diags;
};

TEST_F(Driver, CompilesADataParallelLayoutIntoAPlanAndAPackage) {
  kiln::LoadResult loaded = load("mlp.kiln", kMlp);
  ASSERT_TRUE(loaded) << loaded.diagnostics << loaded.status.message();
  EXPECT_EQ(loaded.diagnostics, "");
  kiln::CompileOptions options;
  options.modelPath = "mlp.kiln";
  options.sourceText = kMlp;
  options.layout.devices = 2;
  options.layout.zero = 1;
  options.output = kiln::CompileOutput::Package;
  ASSERT_TRUE(kiln::configure(*loaded.module, options));
  EXPECT_EQ(kiln::initSeed(*loaded.module, std::nullopt), 7u);
  kiln::CompileResult r = kiln::compile(*loaded.module, options);
  ASSERT_TRUE(r) << r.status.message() << diags->text;
  ASSERT_TRUE(r.compiled);
  EXPECT_EQ(r.compiled->program.numDevices(), 2);
  EXPECT_TRUE(r.compiled->program.function("train_step"));
  EXPECT_FALSE(r.cuda);
  EXPECT_FALSE(r.package.empty());
}

TEST_F(Driver, LayoutErrorsNameTheFlag) {
  kiln::LoadResult loaded = load("mlp.kiln", kMlp);
  ASSERT_TRUE(loaded);
  kiln::CompileOptions zero;
  zero.layout.zero = 1;
  kiln::Status st = kiln::configure(*loaded.module, zero);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.exitCode(), 1);
  EXPECT_NE(st.message().find("--zero 1"), std::string::npos) << st.message();
  kiln::CompileOptions tp;
  tp.layout.tp = 3;
  tp.layout.devices = 2;
  st = kiln::configure(*loaded.module, tp);
  ASSERT_FALSE(st);
  EXPECT_NE(st.message().find("--tp 3 must divide the device count 2"), std::string::npos)
      << st.message();
}

TEST_F(Driver, FrontendErrorsComeAsDiagnostics) {
  kiln::LoadResult loaded = load("bad.kiln", "x = 1\n");
  EXPECT_FALSE(loaded);
  EXPECT_FALSE(loaded.module);
  EXPECT_EQ(loaded.status.exitCode(), 1);
  EXPECT_EQ(loaded.status.message(), ""); // the diagnostics say it all
  EXPECT_NE(loaded.diagnostics.find("bad.kiln:1:1: error:"), std::string::npos)
      << loaded.diagnostics;
}

TEST_F(Driver, MlirWithoutForwardOrTrainStepIsRefused) {
  kiln::LoadResult loaded = load("empty.mlir", "module {}\n");
  EXPECT_FALSE(loaded);
  EXPECT_NE(loaded.status.message().find("is not a kiln module"), std::string::npos);
  loaded = load("junk.mlir", "junk\n");
  EXPECT_FALSE(loaded);
  EXPECT_NE(loaded.diagnostics.find("junk.mlir:1:1: error:"), std::string::npos)
      << loaded.diagnostics;
}

TEST_F(Driver, PrecisionReportComparesWithFp32) {
  kiln::LoadResult loaded = load("mlp.kiln", kMlp);
  ASSERT_TRUE(loaded);
  kiln::CompileOptions options;
  options.precision = "bf16";
  ASSERT_TRUE(kiln::configure(*loaded.module, options));
  kiln::PrecisionReport report;
  kiln::Outcome o = kiln::precisionReport(*loaded.module, options, report);
  ASSERT_TRUE(o) << o.status.message() << diags->text;
  EXPECT_EQ(report.precision, "bf16");
  EXPECT_GT(report.activationBytes, 0);
  EXPECT_GT(report.fp32ActivationBytes, report.activationBytes);
}

TEST_F(Driver, GradCheckRefusesTensorParallelLayouts) {
  kiln::LoadResult loaded = load("mlp.kiln", kMlp);
  ASSERT_TRUE(loaded);
  kiln::CompileOptions options;
  options.layout.tp = 2;
  ASSERT_TRUE(kiln::configure(*loaded.module, options));
  kiln::Status st = kiln::prepareGradCheck(*loaded.module);
  ASSERT_FALSE(st);
  EXPECT_NE(st.message().find("tp = 2"), std::string::npos) << st.message();
}

TEST_F(Driver, ReferenceNotesTheLayoutItSetsAside) {
  kiln::LoadResult loaded = load("mlp.kiln", kMlp);
  ASSERT_TRUE(loaded);
  kiln::CompileOptions options;
  options.layout.devices = 2;
  std::string notes;
  options.note = [&](const std::string &line) { notes += line + "\n"; };
  ASSERT_TRUE(kiln::configure(*loaded.module, options));
  kiln::prepareReference(*loaded.module, options);
  EXPECT_NE(notes.find("note: --export-reference writes the one-device reference"),
            std::string::npos)
      << notes;
  EXPECT_TRUE(kiln::buildTraining(*loaded.module, options));
}

} // namespace
