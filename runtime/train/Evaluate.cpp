//===- Evaluate.cpp - Validation loss and accuracy ------------------------===//
#include "runtime/train/Evaluate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace kiln::train {

using program::Buffer;
using program::DType;

Expected<EvalResult> evaluate(Model &m, const DataSource &src, int64_t batches, int64_t step) {
  EvalResult r;
  std::vector<int> inputs = m.dataInputs("eval_step");
  int lossId = m.prog().function("eval_step")->results[0];
  const program::Function *pred = m.prog().function("predict");
  int logitsId = pred && !pred->results.empty() ? pred->results[0] : -1;
  int labelsIn = -1;
  std::vector<int> predInputs = m.dataInputs("predict");
  bool classify = logitsId >= 0 && m.prog().buffers[logitsId].shape.size() == 2;
  if (classify)
    for (size_t k = 0; k < inputs.size(); ++k)
      if (m.prog().buffers[inputs[k]].shape.size() == 1 &&
          m.prog().buffers[inputs[k]].dtype != DType::F32)
        labelsIn = int(k);
  int64_t correct = 0, total = 0;
  for (int64_t i = 0; i < batches; ++i) {
    Batch b = src.batch(uint64_t(i));
    (void)copyBatch(*m.exec, inputs, b);
    // Tensor parallelism with a vocabulary-split table: the device's tp
    // coordinate (each function's own input, written right before it runs:
    // buffers of different functions may share arena bytes).
    auto writeTpRank = [&](const char *fn) {
      if (int id = m.tpRankInput(fn); id >= 0 && m.holds(id)) {
        int64_t c = m.tpRank();
        (void)m.exec->write(id, &c, sizeof c);
      }
    };
    writeTpRank("eval_step");
    (void)m.exec->run("eval_step");
    r.loss += m.stageScalar(lossId); // every device (pipeline: broadcast)
    if (classify && labelsIn >= 0) {
      // @predict's inputs are @eval_step's minus the unused ones, by name.
      for (int id : predInputs)
        for (size_t k = 0; k < inputs.size(); ++k)
          if (m.prog().buffers[inputs[k]].name == m.prog().buffers[id].name)
            (void)m.exec->write(id, b.bytes[k].data(), b.bytes[k].size());
      writeTpRank("predict");
      (void)m.exec->run("predict");
      const Buffer &lb = m.prog().buffers[logitsId];
      int64_t rows = lb.shape[0], classes = lb.shape[1];
      auto all = m.exec->readAll<float>(logitsId);
      if (!all)
        break;
      const float *logits = all->data();
      for (int64_t row = 0; row < rows; ++row) {
        int64_t best = std::max_element(logits + row * classes, logits + (row + 1) * classes) -
                       (logits + row * classes);
        int64_t label = m.prog().buffers[inputs[labelsIn]].dtype == DType::I64
                            ? reinterpret_cast<const int64_t *>(b.bytes[labelsIn].data())[row]
                            : reinterpret_cast<const int32_t *>(b.bytes[labelsIn].data())[row];
        correct += best == label;
        ++total;
      }
    }
  }
  r.batches = batches;
  if (comm::Communicator *c = m.comm; c && c->size() > 1) {
    double mine[3] = {r.loss, double(correct), double(total)}, all[3] = {0, 0, 0};
    c->setContext(step >= 0 ? fmt::format("training step {}, averaging the validation loss", step)
                            : std::string("averaging the validation loss"));
    if (Status s = c->allReduce(mine, all, 3, ElementType::F64, comm::Reduction::Sum); !s)
      return s;
    r.loss = all[0] / double(c->size());
    correct = int64_t(all[1]);
    total = int64_t(all[2]);
  }
  r.loss /= double(std::max<int64_t>(batches, 1));
  if (total)
    r.accuracy = double(correct) / double(total);
  return r;
}

Expected<EvalReport> evaluateModel(Model &m, const EvalOptions &o, const BackendFactory &make,
                                   const Sink &out) {
  std::optional<ckpt::Checkpoint> params;
  if (!o.checkpoint.empty()) {
    auto c = readCheckpoint(m, o.checkpoint, o.quiet, out,
                            CheckpointUse::Parameters);
    if (!c)
      return c.status();
    params = std::move(*c);
  }
  const TrainConfig &tc = m.pkg.train;
  uint64_t seed = o.seed ? *o.seed : uint64_t(tc.seed);
  std::string path = resolvePath(o.valData.empty() ? (o.data.empty() ? tc.valData : o.data)
                                                    : o.valData, m.pkg);
  auto src = openData(path, m, "eval_step", seed ^ 0xe7a15eedULL, false, "validation");
  if (!src)
    return src.status();
  if (Status s = m.compile(make, o.profile); !s)
    return s;
  if (params)
    if (Status s = m.setPersistent(*params); !s)
      return s;
  int64_t batches = o.evalSteps > 0 ? o.evalSteps
                    : (*src)->epochBatches() > 0 ? (*src)->epochBatches()
                    : (tc.evalSteps > 0 ? tc.evalSteps : 20);
  EvalReport r;
  auto ev = evaluate(m, **src, batches);
  if (!ev)
    return ev.status();
  r.result = *ev;
  r.data = (*src)->describe();
  // The data was checked on load (finite, indices in range), so a loss that
  // is not a number comes from the parameters.
  if (!std::isfinite(r.result.loss))
    return Status::error(fmt::format(
        "the validation loss is {} with the parameters of {} on {}.\n  {}", r.result.loss,
        o.checkpoint.empty() ? m.pkg.path + " (initial parameters)" : o.checkpoint, r.data,
        m.pkg.inputRanges.empty()
            ? "The data's floats are finite; this artifact records no index ranges, so "
              "recompile it with kilnc to have labels and indices checked too, then evaluate "
              "an earlier checkpoint or retrain with a lower learning rate or grad_clip."
            : "The data is finite and in range, so the parameters are not: evaluate an "
              "earlier checkpoint, or retrain with a lower learning rate or grad_clip."));
  return r;
}

} // namespace kiln::train
