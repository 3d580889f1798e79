//===- TrainerTest.cpp - runtime/train without kiln-run -------------------===//
//
// Drives the trainer through its C++ API on a fake backend: a linear model
// y = w.x trained by SGD with momentum, with the buffers, entry points and
// checkpoints of a real artifact but no compiled code. Replicas on threads
// of one process train alike; a resumed run repeats an uninterrupted one;
// the stop flag and a non-finite loss end a run as kiln-run documents.
//
//===----------------------------------------------------------------------===//
#include "TrainFixtures.h"
#include "runtime/core/Data.h"
#include "runtime/core/Random.h"
#include "runtime/train/Evaluate.h"
#include "runtime/train/Trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

using namespace kiln;
using namespace kiln::train;
using program::Buffer;
using program::DType;
using program::Role;

namespace {

constexpr int64_t kBatch = 8, kFeatures = 4;

/// Buffer ids of the fake program.
enum Id { W, M, X, Y, StepIn, Loss, Norm, Lr, EvalLoss, NumBuffers };

Package fakePackage() {
  Package pkg;
  pkg.path = "fake.kpack";
  pkg.model = "linear";
  pkg.sourceHash = "0123456789abcdef";
  program::Program &p = pkg.program;
  auto add = [&](const char *name, Role role, DType t, std::vector<int64_t> shape) {
    Buffer b;
    b.name = name;
    b.role = role;
    b.dtype = t;
    b.shape = std::move(shape);
    b.bytes = b.numElements() * program::dtypeBytes(t);
    b.offset = p.arenaBytes;
    p.arenaBytes += (b.bytes + 63) / 64 * 64;
    p.buffers.push_back(b);
  };
  add("w", Role::Param, DType::F32, {kFeatures});
  add("m", Role::State, DType::F32, {kFeatures});
  add("x", Role::Input, DType::F32, {kBatch, kFeatures});
  add("y", Role::Input, DType::F32, {kBatch});
  add("step", Role::Input, DType::I64, {});
  add("loss", Role::Output, DType::F32, {});
  add("grad_norm", Role::Output, DType::F32, {});
  add("lr", Role::Output, DType::F32, {});
  add("loss", Role::Output, DType::F32, {});
  p.persistentBytes = p.buffers[X].offset;
  program::Function train;
  train.name = "train_step";
  train.args = {W, M, X, Y, StepIn};
  train.results = {Loss, Norm, Lr};
  program::Function eval;
  eval.name = "eval_step";
  eval.args = {W, X, Y};
  eval.results = {EvalLoss};
  p.functions = {train, eval};
  for (int id : {W, M}) {
    ckpt::Tensor t;
    t.name = p.buffers[id].name;
    t.dtype = "F32";
    t.shape = p.buffers[id].shape;
    t.bytes.assign(size_t(p.buffers[id].bytes), '\0');
    pkg.initial.tensors.push_back(t);
  }
  pkg.train.steps = 20;
  pkg.train.seed = 7;
  return pkg;
}

/// Runs the fake program on the host, one buffer per string.
class FakeBackend : public Backend {
public:
  explicit FakeBackend(const program::Program &p, int nanAtStep = -1)
      : p_(p), nanAtStep_(nanAtStep) {
    for (const Buffer &b : p.buffers)
      data_.emplace_back(size_t(b.bytes), '\0');
  }
  const program::Program &program() const override { return p_; }
  std::string describe() const override { return "fake"; }
  Status write(int id, const void *src, size_t bytes) override {
    if (bytes != data_[size_t(id)].size())
      return Status::internal("write of the wrong size");
    std::memcpy(data_[size_t(id)].data(), src, bytes);
    return Status::ok();
  }
  Status read(int id, void *dst, size_t bytes) override {
    if (bytes > data_[size_t(id)].size())
      return Status::internal("read of the wrong size");
    std::memcpy(dst, data_[size_t(id)].data(), bytes);
    return Status::ok();
  }
  Status runSteps(const std::string &name, size_t, size_t) override {
    float *w = f(W), *m = f(M), *x = f(X), *y = f(Y);
    std::vector<double> grad(kFeatures, 0.0);
    double loss = 0;
    for (int64_t r = 0; r < kBatch; ++r) {
      double pred = 0;
      for (int64_t k = 0; k < kFeatures; ++k)
        pred += double(w[k]) * x[r * kFeatures + k];
      double e = pred - y[r];
      loss += e * e / kBatch;
      for (int64_t k = 0; k < kFeatures; ++k)
        grad[size_t(k)] += 2 * e * x[r * kFeatures + k] / kBatch;
    }
    if (name == "eval_step") {
      *f(EvalLoss) = float(loss);
      return Status::ok();
    }
    int64_t step;
    std::memcpy(&step, data_[StepIn].data(), 8);
    double norm = 0, lr = 0.1 / (1.0 + 0.01 * double(step));
    for (int64_t k = 0; k < kFeatures; ++k) {
      norm += grad[size_t(k)] * grad[size_t(k)];
      m[k] = float(0.9 * m[k] + grad[size_t(k)]);
      w[k] = float(w[k] - lr * m[k]);
    }
    *f(Loss) = step == nanAtStep_ ? NAN : float(loss);
    *f(Norm) = float(std::sqrt(norm));
    *f(Lr) = float(lr);
    return Status::ok();
  }
  Status synchronize() override { return Status::ok(); }
  void setProfiling(bool) override {}
  std::vector<Timing> timings() override { return {}; }

private:
  float *f(int id) { return reinterpret_cast<float *>(data_[size_t(id)].data()); }
  const program::Program &p_;
  int nanAtStep_;
  std::vector<std::string> data_;
};

BackendFactory fakeFactory(int nanAtStep = -1) {
  return [nanAtStep](const Package &pkg) -> Expected<std::unique_ptr<Backend>> {
    return std::unique_ptr<Backend>(std::make_unique<FakeBackend>(pkg.program, nanAtStep));
  };
}

std::string tempDir() { return fixtures::freshDir("kiln-train-"); }

/// DIR/x.npy and DIR/y.npy: 64 rows of y = (1, -2, 0.5, 3) . x.
void writeData(const std::string &dir) {
  data::NpyArray x, y;
  x.descr = y.descr = "<f4";
  x.shape = {64, kFeatures};
  y.shape = {64};
  const double truth[kFeatures] = {1, -2, 0.5, 3};
  for (int64_t r = 0; r < 64; ++r) {
    double v = 0;
    for (int64_t k = 0; k < kFeatures; ++k) {
      double e = random::uniform(3, uint64_t(r), uint64_t(k)) * 2 - 1;
      x.f.push_back(e);
      v += truth[k] * e;
    }
    y.f.push_back(v);
  }
  ASSERT_TRUE(data::writeNpy(dir + "/x.npy", x));
  ASSERT_TRUE(data::writeNpy(dir + "/y.npy", y));
}

/// Everything one replica needs, made by hand as a launcher would.
struct Replica {
  Model model;
  std::shared_ptr<const DataSource> trainData, valData;
  std::vector<float> losses;
  std::vector<std::string> lines;
  std::mutex linesMu;

  Replica(const std::string &dir, const BackendFactory &make = fakeFactory()) {
    model.pkg = fakePackage();
    EXPECT_TRUE(model.compile(make));
    auto t = openData(dir, model, "train_step", 7, /*shuffle=*/true, "training");
    EXPECT_TRUE(t) << t.status().message();
    trainData = std::move(*t);
    auto v = openData(dir, model, "eval_step", 7 ^ 0xe7a15eedULL, /*shuffle=*/false,
                      "validation");
    EXPECT_TRUE(v) << v.status().message();
    valData = std::move(*v);
  }
  TrainOptions options(const std::string &ckpt) {
    TrainOptions o;
    o.artifact = "fake.kpack";
    o.checkpoint = ckpt;
    o.evalInterval = 5;
    o.evalSteps = 2;
    o.onStep = [this](const StepMetrics &s) { losses.push_back(s.loss); };
    return o;
  }
  Sink sink() {
    return [this](Channel, const std::string &text) {
      std::lock_guard<std::mutex> lock(linesMu);
      lines.push_back(text);
    };
  }
  Expected<TrainResult> train(const TrainOptions &o, const ckpt::Checkpoint *resume = nullptr) {
    auto t = Trainer::create(model, o, trainData, valData, resume, sink());
    if (!t)
      return t.status();
    return (*t)->run();
  }
};

bool contains(const std::vector<std::string> &lines, const std::string &prefix) {
  for (const std::string &l : lines)
    if (l.rfind(prefix, 0) == 0)
      return true;
  return false;
}

TEST(Trainer, ReplicasOnThreadsTrainAlike) {
  std::string d = tempDir();
  writeData(d);
  Replica a(d), b(d);
  TrainOptions oa = a.options(d + "/a.safetensors"), ob = b.options(d + "/b.safetensors");
  ob.rank = 1;
  ob.worldSize = oa.worldSize = 2;
  Expected<TrainResult> ra = Status::ok(), rb = Status::ok();
  std::thread ta([&] { ra = a.train(oa); });
  std::thread tb([&] { rb = b.train(ob); });
  ta.join();
  tb.join();
  ASSERT_TRUE(ra) << ra.status().message();
  ASSERT_TRUE(rb) << rb.status().message();
  ASSERT_EQ(a.losses.size(), 20u);
  EXPECT_EQ(a.losses, b.losses); // bit for bit
  EXPECT_LT(a.losses.back(), a.losses.front() / 10);
  EXPECT_EQ(ra->next, 20);
  EXPECT_FALSE(ra->interrupted);
  EXPECT_FALSE(std::isnan(ra->valLoss));
  // Rank 0 reports and saves; rank 1 only trains.
  EXPECT_TRUE(contains(a.lines, "training linear from fake.kpack for steps 0..20 on fake"));
  EXPECT_TRUE(contains(a.lines, "step     5: val loss "));
  EXPECT_TRUE(contains(a.lines, "done: 20 steps in "));
  EXPECT_TRUE(b.lines.empty());
  EXPECT_TRUE(pathExists(d + "/a.safetensors"));
  EXPECT_FALSE(pathExists(d + "/b.safetensors"));
}

TEST(Trainer, ResumeRepeatsAnUninterruptedRun) {
  std::string d = tempDir();
  writeData(d);
  Replica whole(d), first(d), second(d);
  ASSERT_TRUE(whole.train(whole.options(d + "/whole.safetensors")));
  TrainOptions o = first.options(d + "/half.safetensors");
  o.steps = 10;
  ASSERT_TRUE(first.train(o));
  auto c = readCheckpoint(second.model, d + "/half.safetensors", false, {});
  ASSERT_TRUE(c) << c.status().message();
  EXPECT_EQ(checkpointStep(*c), 10);
  TrainOptions o2 = second.options(d + "/half.safetensors");
  o2.resume = d + "/half.safetensors";
  auto r = second.train(o2, &*c);
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ(r->start, 10);
  std::vector<float> joined = first.losses;
  joined.insert(joined.end(), second.losses.begin(), second.losses.end());
  EXPECT_EQ(joined, whole.losses);
}

TEST(Trainer, StopFlagEndsTheRunWithACheckpoint) {
  std::string d = tempDir();
  writeData(d);
  Replica a(d);
  std::atomic<bool> stop{true};
  TrainOptions o = a.options(d + "/stopped.safetensors");
  o.stop = &stop;
  auto r = a.train(o);
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_TRUE(r->interrupted);
  EXPECT_EQ(r->next, 1);
  EXPECT_EQ(a.losses.size(), 1u);
  auto c = ckpt::read(d + "/stopped.safetensors");
  ASSERT_TRUE(c) << c.status().message();
  EXPECT_EQ(checkpointStep(*c), 1);
  EXPECT_FALSE(contains(a.lines, "done:"));
}

TEST(Trainer, StopDuringTheLastStepCompletesTheRun) {
  // A stop that arrives in the last step leaves nothing to resume: the run
  // is complete (its checkpoint at the last step), not interrupted.
  std::string d = tempDir();
  writeData(d);
  Replica a(d);
  std::atomic<bool> stop{true};
  TrainOptions o = a.options(d + "/last.safetensors");
  o.steps = 1;
  o.stop = &stop;
  auto r = a.train(o);
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_FALSE(r->interrupted);
  EXPECT_EQ(r->next, 1);
  auto c = ckpt::read(d + "/last.safetensors");
  ASSERT_TRUE(c) << c.status().message();
  EXPECT_EQ(checkpointStep(*c), 1);
  EXPECT_TRUE(contains(a.lines, "done:"));
}

TEST(Trainer, NonFiniteLossIsAnErrorAndKeepsTheCheckpoint) {
  std::string d = tempDir();
  writeData(d);
  Replica a(d, fakeFactory(/*nanAtStep=*/3));
  auto r = a.train(a.options(d + "/never.safetensors"));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.status().exitCode(), 1);
  // Step index 3 is the fourth step, numbered as the progress lines do.
  EXPECT_EQ(r.status().message().rfind("step 4/", 0), 0u) << r.status().message();
  EXPECT_NE(r.status().message().find(": the loss is nan"), std::string::npos)
      << r.status().message();
  EXPECT_FALSE(pathExists(d + "/never.safetensors"));
}

TEST(Trainer, OpenNamesMissingDataBeforeCreatingTheBackend) {
  Model m;
  m.pkg = fakePackage();
  bool made = false;
  BackendFactory make = [&](const Package &pkg) -> Expected<std::unique_ptr<Backend>> {
    made = true;
    return fakeFactory()(pkg);
  };
  TrainOptions o;
  o.artifact = "fake.kpack";
  o.data = "/nonexistent/kiln-train-data";
  auto t = Trainer::open(m, o, make, {});
  ASSERT_FALSE(t);
  EXPECT_EQ(t.status().message(), "training data '/nonexistent/kiln-train-data' does not exist");
  EXPECT_FALSE(made);
}

TEST(Trainer, EvaluateAveragesTheLossOverBatches) {
  std::string d = tempDir();
  writeData(d);
  Replica a(d);
  auto ev = evaluate(a.model, *a.valData, 4);
  ASSERT_TRUE(ev) << ev.status().message();
  EvalResult e = *ev;
  EXPECT_EQ(e.batches, 4);
  EXPECT_GT(e.loss, 0);
  EXPECT_EQ(e.accuracy, -1); // no @predict: not a classifier
}

} // namespace
