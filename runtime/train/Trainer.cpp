//===- Trainer.cpp - The training loop ------------------------------------===//
#include "runtime/train/Trainer.h"
#include "runtime/train/TraceFile.h"

#include "runtime/core/Data.h"
#include "runtime/train/Evaluate.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <thread>
#include <tuple>

namespace kiln::train {

namespace {

/// The options with the train section's values filled in.
struct Resolved {
  uint64_t seed = 0;
  int64_t evalInterval = 0, evalSteps = 0, ckptEvery = 0, logInterval = 10;
  std::string ckptPath;
  LastBatch lastBatch = LastBatch::Wrap;
};

Resolved resolve(const Model &m, const TrainOptions &o) {
  const TrainConfig &tc = m.pkg.train;
  Resolved r;
  r.seed = o.seed ? *o.seed : uint64_t(tc.seed);
  r.lastBatch = o.lastBatch ? *o.lastBatch : parseLastBatch(tc.lastBatch).value_or(LastBatch::Wrap);
  r.evalInterval = o.evalInterval >= 0 ? o.evalInterval : tc.evalInterval;
  r.evalSteps = o.evalSteps > 0 ? o.evalSteps : (tc.evalSteps > 0 ? tc.evalSteps : 20);
  r.ckptPath = o.checkpoint.empty() ? defaultCheckpoint(o.artifact) : o.checkpoint;
  r.ckptEvery = o.checkpointEvery >= 0   ? o.checkpointEvery
                : tc.checkpointInterval >= 0 ? tc.checkpointInterval
                                             : r.evalInterval;
  r.logInterval = o.logInterval > 0 ? o.logInterval : tc.logInterval > 0 ? tc.logInterval : 10;
  return r;
}

/// The run's length: the step it trains to and, training by epochs, how
/// many (0: by steps). --steps, else --epochs, else the section's epochs,
/// else its steps (the frontend refuses a section with both).
struct Length {
  int64_t steps = 0, epochs = 0;
};

Expected<Length> runLength(const Model &m, const TrainOptions &o, const DataSource &train) {
  const TrainConfig &tc = m.pkg.train;
  if (o.steps > 0 && o.epochs > 0)
    return Status::error(fmt::format(
        "--steps {} and --epochs {} both set the run's length; give one of them", o.steps,
        o.epochs));
  if (o.steps > 0)
    return Length{o.steps, 0};
  int64_t epochs = o.epochs > 0 ? o.epochs : tc.epochs;
  if (epochs <= 0)
    return Length{std::max<int64_t>(tc.steps, 1), 0};
  std::string given = o.epochs > 0 ? fmt::format("--epochs {}", o.epochs)
                                   : fmt::format("the train section's epochs = {}", epochs);
  if (train.epochBatches() == 0)
    return Status::error(fmt::format(
        "{}: the training data {} is token windows drawn at random, which have no epochs; "
        "give --steps N instead", given, train.describe()));
  return Length{std::max<int64_t>(train.epochSteps(epochs), 1), epochs};
}

Status noTrainStep(const Model &m, const TrainOptions &o) {
  if (!m.prog().function("train_step"))
    return Status::error(o.artifact + " has no @train_step");
  return Status::ok();
}

/// A step time: "23.4" ms, "0.041" below a millisecond (a tiny model's
/// steps would read "0.0").
std::string msText(double ms) { return fmt::format(ms >= 1 ? "{:.1f}" : "{:.3f}", ms); }

/// "42s", "3m07s", "1h05m".
std::string duration(double s) {
  if (s < 60)
    return fmt::format("{:.0f}s", s);
  if (s < 3600)
    return fmt::format("{}m{:02}s", int(s) / 60, int(s) % 60);
  return fmt::format("{}h{:02}m", int(s) / 3600, (int(s) % 3600) / 60);
}

/// This replica's part of the global batch: its coordinate on the "dp"
/// mesh axis among the axis's devices (one part without a dp axis).
DataShard dataShard(const Model &m) {
  int a = m.prog().mesh.axis("dp");
  if (a < 0)
    return {};
  return DataShard{m.replica(), int(m.prog().mesh.axes[size_t(a)].size)};
}

} // namespace

RankFault RankFault::parse(const char *spec) {
  RankFault f;
  if (!spec)
    return f;
  std::string s(spec);
  size_t at = s.find('@'), colon = s.find(':', at == std::string::npos ? 0 : at);
  if (at == std::string::npos || colon == std::string::npos)
    return f;
  std::string what = s.substr(0, at);
  if (what == "rank-exit")
    f.kind = Exit;
  else if (what == "rank-stall")
    f.kind = Stall;
  else
    return f;
  f.step = std::strtoll(s.c_str() + at + 1, nullptr, 10);
  f.rank = int(std::strtol(s.c_str() + colon + 1, nullptr, 10));
  return f;
}

DataFault DataFault::parse(const char *spec) {
  DataFault f;
  std::string s(spec ? spec : "");
  if (s.rfind("slow-data@", 0) == 0)
    f.slowMs = std::max<long long>(std::strtoll(s.c_str() + 10, nullptr, 10), 0);
  return f;
}

Expected<std::unique_ptr<Trainer>> Trainer::open(Model &m, const TrainOptions &o,
                                                 const BackendFactory &make, Sink out) {
  if (Status s = noTrainStep(m, o); !s)
    return s;
  Resolved r = resolve(m, o);
  const TrainConfig &tc = m.pkg.train;
  // The checkpoint's folder, before any training a bad path would lose
  // (rank 0 writes it).
  if (o.rank == 0) {
    if (Status s = ckpt::checkWritable(r.ckptPath); !s)
      return s;
    for (const std::string &f : ckpt::removeStaleTemporaries(r.ckptPath))
      emit(out, Channel::Warning,
           fmt::format("removed {}: the partial checkpoint of a save whose process was "
                       "killed (the checkpoint itself was not touched)",
                       f));
  }
  std::string trainPath = resolvePath(o.data.empty() ? tc.data : o.data, m.pkg);
  auto train = openData(trainPath, m, "train_step", r.seed, /*shuffle=*/!o.inOrder, "training",
                        dataShard(m), o.shuffleBuffer, r.lastBatch);
  if (!train)
    return train.status();
  // (Before any kernel is compiled: --epochs of token data.)
  if (auto len = runLength(m, o, **train); !len)
    return len.status();
  // Token data is read as random windows: no file order to keep or shuffle,
  // no epochs to end.
  if (o.rank == 0 && (o.inOrder || o.shuffleBuffer > 0 || o.lastBatch) &&
      (*train)->epochBatches() == 0)
    emit(out, Channel::Warning,
         fmt::format("{} does nothing for token data ({} is read as random windows); it "
                     "applies to a directory of .npy arrays",
                     o.inOrder ? "--in-order" : o.shuffleBuffer > 0 ? "--shuffle-buffer"
                                                                    : "--last-batch",
                     trainPath));
  std::shared_ptr<const DataSource> val;
  std::string valPath = resolvePath(o.valData.empty() ? tc.valData : o.valData, m.pkg);
  if (!valPath.empty() && r.evalInterval > 0) {
    // Each dp replica scores its own part of every global validation batch
    // (as in training); evaluate() averages the replicas, so N devices
    // score the rows one device scores at the N-times batch.
    auto v = openData(valPath, m, "eval_step", r.seed ^ 0xe7a15eedULL, /*shuffle=*/false,
                      "validation", dataShard(m));
    if (!v)
      return v.status();
    val = std::move(*v);
  }
  std::optional<ckpt::Checkpoint> resume;
  if (!o.resume.empty()) {
    auto c = readCheckpoint(m, o.resume, o.quiet || o.rank != 0, out);
    if (!c)
      return c.status();
    resume = std::move(*c);
  }
  // --init: the parameters of a file, through the same sharding as a
  // checkpoint's (setPersistent), the optimizer's state the initial one.
  std::optional<ckpt::Checkpoint> init;
  if (!o.init.path.empty()) {
    if (Status s = initWithResume(o.init.path, o.resume); !s)
      return s;
    auto c = readInitWeights(m, o.init, o.quiet || o.rank != 0, out);
    if (!c)
      return c.status();
    init = std::move(*c);
  }
  if (Status s = m.compile(make, o.profile); !s)
    return s;
  if (init)
    if (Status s = m.setPersistent(*init); !s)
      return s;
  return create(m, o, std::move(*train), std::move(val), resume ? &*resume : nullptr,
                std::move(out));
}

Expected<std::unique_ptr<Trainer>> Trainer::create(Model &m, const TrainOptions &o,
                                                   std::shared_ptr<const DataSource> train,
                                                   std::shared_ptr<const DataSource> val,
                                                   const ckpt::Checkpoint *resume, Sink out) {
  if (Status s = noTrainStep(m, o); !s)
    return s;
  if (!m.exec)
    return Status::internal("Trainer::create: the model has no backend (Model::compile)");
  std::unique_ptr<Trainer> t(new Trainer(m));
  t->o_ = o;
  t->out_ = std::move(out);
  Resolved r = resolve(m, o);
  auto len = runLength(m, o, *train);
  if (!len)
    return len.status();
  t->seed_ = r.seed;
  t->steps_ = len->steps;
  t->epochs_ = len->epochs;
  t->evalInterval_ = r.evalInterval;
  t->evalSteps_ = r.evalSteps;
  t->ckptEvery_ = r.ckptEvery;
  t->o_.logInterval = r.logInterval;
  t->ckptPath_ = r.ckptPath;
  t->train_ = std::move(train);
  t->val_ = r.evalInterval > 0 ? std::move(val) : nullptr;
  // A .npy validation set has a fixed number of batches: scoring more would
  // repeat rows (and count them twice), so an evaluation stops at one pass
  // over it.
  if (t->val_ && t->val_->epochBatches() > 0 && t->evalSteps_ > t->val_->epochBatches())
    t->evalSteps_ = t->val_->epochBatches();

  if (resume) {
    if (Status s = m.setPersistent(*resume); !s)
      return s;
    t->start_ = checkpointStep(*resume);
    if (t->start_ >= t->steps_)
      return Status::error(fmt::format(
          "{} is at step {}, and this run trains to step {}{}: nothing is left to train; give "
          "--steps above {}{} to continue it",
          o.resume, t->start_, t->steps_,
          t->epochs_ ? fmt::format(" ({} epochs)", t->epochs_) : "", t->start_,
          t->epochs_ ? fmt::format(" or --epochs above {}", t->epochs_) : ""));
    CheckpointBatch was = checkpointBatch(*resume);
    int64_t now = globalBatchRows(m), devices = dataParallelDevices(m);
    std::string kept;
    if (was.globalBatch > 0 && now > 0 && was.globalBatch != now) {
      if (!o.allowBatchChange) {
        std::string counts;
        for (int64_t d = 1; d <= std::min<int64_t>(was.globalBatch, 64); ++d)
          if (was.globalBatch % d == 0)
            counts += (counts.empty() ? "" : ", ") + std::to_string(d);
        return Status::error(fmt::format(
            "{} was trained with a global batch of {} rows ({} device{}), and {} trains {} "
            "({} device{} x {} rows): resuming would change the global batch.\n"
            "  keep it: compile for the checkpoint's batch, N devices x {} / N rows each "
            "(kilnc --devices N --batch B, grad_accum K in the train section: "
            "N x B x K = {}); N = {}\n"
            "  or give --allow-batch-change to continue with {} rows per step",
            o.resume, was.globalBatch, was.devices, was.devices == 1 ? "" : "s", o.artifact, now,
            devices, devices == 1 ? "" : "s", now / devices, was.globalBatch, was.globalBatch,
            counts, now));
      }
      kept = fmt::format("; global batch changed from {} to {} rows (--allow-batch-change)",
                         was.globalBatch, now);
    } else if (was.globalBatch > 0 && was.devices > 0 && was.devices != devices) {
      kept = fmt::format("; global batch {} kept ({} device{} -> {}, {} rows each)", now,
                         was.devices, was.devices == 1 ? "" : "s", devices, now / devices);
    } else if (was.globalBatch == 0 && now > 0) {
      kept = fmt::format("; it does not record its global batch (an older checkpoint): "
                         "continuing with {} rows per step",
                         now);
    }
    if (!o.quiet)
      t->say(Channel::Note,
             fmt::format("resumed from {} at step {}{}", o.resume, t->start_, kept));
  }

  t->inputs_ = m.dataInputs("train_step");
  t->stepIn_ = m.stepInput("train_step");
  t->replicaIn_ = m.replicaInput("train_step");
  t->tpRankIn_ = m.tpRankInput("train_step");
  t->stopIn_ = m.inputNamed("train_step", "stop");
  t->stopOut_ = m.result("train_step", "stop");
  if ((t->stopIn_ < 0) != (t->stopOut_ < 0))
    return Status::error(o.artifact + ": @train_step has a \"stop\" " +
                         (t->stopIn_ < 0 ? "output but no such input" : "input but no such output") +
                         "; recompile it with this kilnc");
  t->fault_ = RankFault::parse(std::getenv("KILN_FAULT_INJECT"));
  t->dataFault_ = DataFault::parse(std::getenv("KILN_FAULT_INJECT"));
  t->lossId_ = m.result("train_step", "loss");
  t->normId_ = m.result("train_step", "grad_norm");
  t->lrId_ = m.result("train_step", "lr");
  t->scaleId_ = m.result("train_step", "loss_scale");
  t->skippedId_ = m.result("train_step", "skipped_steps");
  if (t->lossId_ < 0 || t->stepIn_ < 0)
    return Status::error(o.artifact + ": @train_step lacks its step input or loss output");
  if (t->inputs_.empty())
    return Status::error(o.artifact + ": @train_step takes no data inputs");
  const program::Buffer &first = m.prog().buffers[size_t(t->inputs_[0])];
  t->tokens_ = t->train_->countsTokens();
  t->items_ = 1;
  if (t->tokens_)
    for (int64_t d : first.shape)
      t->items_ *= d;
  else
    t->items_ = first.shape.empty() ? 1 : first.shape[0];
  t->items_ *= dataShard(m).count; // progress counts the global batch

  if (!o.quiet) {
    t->say(Channel::Note, fmt::format("training {} from {} for steps {}..{}{} on {}", m.pkg.model,
                                      o.artifact, t->start_, t->steps_,
                                      t->epochs_ ? fmt::format(" ({} epoch{})", t->epochs_,
                                                               t->epochs_ == 1 ? "" : "s")
                                                 : "",
                                      m.exec->describe()));
    std::string epoch = t->train_->epochNote();
    t->say(Channel::Line, fmt::format("  data: {}{}", t->train_->describe(),
                                      epoch.empty() ? "" : "; " + epoch));
    if (t->val_)
      t->say(Channel::Line, fmt::format("  validation: {}, {} batch{} every {} steps",
                                        t->val_->describe(), t->evalSteps_,
                                        t->evalSteps_ == 1 ? "" : "es", t->evalInterval_));
    t->say(Channel::Line,
           t->ckptEvery_ > 0
               ? fmt::format("  checkpoint: {} every {} steps and at the end", t->ckptPath_,
                             t->ckptEvery_)
               : fmt::format("  checkpoint: {} at the end", t->ckptPath_));
  }
  if (!o.lossLog.empty() && t->leader() &&
      !(t->lossLog_ = std::fopen(o.lossLog.c_str(), t->start_ ? "a" : "w")))
    return Status::error("cannot write the loss log " + o.lossLog);
  return t;
}

Trainer::~Trainer() {
  if (lossLog_)
    std::fclose(lossLog_);
}

void Trainer::say(Channel c, const std::string &text) const {
  if (leader())
    emit(out_, c, text);
}

Expected<bool> Trainer::agreeStop(int64_t step) {
  bool mine = o_.stop && o_.stop->load();
  comm::Communicator *c = m_.comm;
  if (!c || c->size() == 1)
    return mine;
  // The step summed every device's flag as it was when the step began: a
  // stop asked for during the step is seen one step later.
  if (stopOut_ >= 0)
    return stopVotes_ > 0.f;
  int32_t flag = mine ? 1 : 0, any = 0;
  c->setContext(fmt::format("training step {}, agreeing on stopping", step));
  if (Status s = c->allReduce(&flag, &any, 1, ElementType::I32, comm::Reduction::Max); !s)
    return Status::error(fmt::format("rank {}: {}", o_.rank, s.message()), s.kind());
  return any != 0;
}

Status Trainer::agreeOnRun() {
  comm::Communicator *c = m_.comm;
  if (!c || c->size() == 1)
    return Status::ok();
  struct Setting {
    const char *what; ///< as the user sets it
    int64_t value;
  };
  const Setting mine[] = {
      {"the first step (--resume's checkpoint step, 0 without one)", start_},
      {"the last step (--steps)", steps_},
      {"the evaluation interval (--eval-interval)", val_ ? evalInterval_ : 0},
      {"the evaluation batches (--eval-steps)", val_ ? evalSteps_ : 0},
      {"the checkpoint interval (--checkpoint-every)", ckptEvery_},
      {"the data seed (--seed)", int64_t(seed_)},
  };
  constexpr int K = int(std::size(mine));
  int64_t words[K];
  for (int k = 0; k < K; ++k)
    words[k] = mine[k].value;
  std::vector<int64_t> all(size_t(K) * size_t(c->size()));
  c->setContext("start-up, comparing the ranks' run settings");
  if (Status s = c->allGather(words, all.data(), K, ElementType::I64); !s)
    return Status::error(fmt::format("rank {}: {}", o_.rank, s.message()), s.kind());
  std::string diff;
  for (int r = 1; r < c->size(); ++r)
    for (int k = 0; k < K; ++k)
      if (all[size_t(r) * K + size_t(k)] != all[size_t(k)])
        diff += fmt::format("\n  rank {}: {} is {}, rank 0's is {}", r, mine[k].what,
                            all[size_t(r) * K + size_t(k)], all[size_t(k)]);
  if (diff.empty())
    return Status::ok();
  return Status::error(
      "the ranks were started with different settings, so they would not take the same "
      "steps together:" + diff +
      "\n  launch every rank with the same options (and the same --resume checkpoint)");
}

bool Trainer::injectFault(int64_t step) {
  if (fault_.kind == RankFault::None || fault_.step != step || fault_.rank != o_.rank)
    return false;
  bool process = !m_.comm || std::string(m_.comm->kind()) != "in-process";
  if (fault_.kind == RankFault::Exit) {
    if (process)
      std::_Exit(3); // as if the process died: no checkpoint, no goodbye
    return true;
  }
  // Stall: stop responding (mpirun ends the process when another rank
  // aborts the job; in-process, the launcher cancels it).
  auto until = std::chrono::steady_clock::now() + std::chrono::hours(1);
  while (std::chrono::steady_clock::now() < until && !(o_.cancel && o_.cancel->load()))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return true;
}

Expected<TrainResult> Trainer::run() {
  Model &m = m_;
  if (Status s = agreeOnRun(); !s)
    return s;
  const DataSource &train = *train_;
  data::PrefetchOptions po;
  po.depth = size_t(std::max(o_.prefetch, 1));
  po.workers = std::max(o_.dataWorkers, 1);
  po.timeoutSeconds = o_.dataTimeout;
  po.cancel = o_.cancel;
  po.what = "the training data " + train.describe();
  // The workers hold the source: one stuck in a read may outlive the run.
  // KILN_FAULT_INJECT=slow-data@MS sleeps in the producer, so more workers
  // or a deeper prefetch can hide it (what the overview recommends).
  int64_t slowMs = dataFault_.slowMs;
  data::Prefetcher<Batch> prefetch(
      [src = train_, slowMs](uint64_t step) {
        if (slowMs > 0)
          std::this_thread::sleep_for(std::chrono::milliseconds(slowMs));
        return src->batch(step);
      },
      uint64_t(start_), po);
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now(), tLog = t0;
  // Evaluations and checkpoint saves between steps: not step time (the
  // progress lines and the done line's ms/step are the steps' own).
  double paused = 0, pausedLog = 0;
  auto pause = [&](clock::time_point since) {
    double d = std::chrono::duration<double>(clock::now() - since).count();
    paused += d;
    pausedLog += d;
  };
  bool interrupted = false;
  int64_t sinceLog = 0;
  double lossSum = 0, lastVal = NAN;
  float loss = 0, norm = 0, lr = 0;
  int64_t step = start_;
  // Loss scaling: the scale and the skipped-step count after each step
  // (a checkpoint carries them across a resume).
  float scale = NAN;
  int64_t skipped = -1, skippedBefore = 0, lossCount = 0;
  // Steps skipped in a row; whether the warning about them was given.
  int64_t inARow = 0;
  bool warnedInARow = false;
  // What to do when the scaler cannot find a scale that fits (the same on
  // every rank: every rank reads the same skipped count).
  auto scalerAdvice = [&] {
    return fmt::format(
        "the loss scale never became small enough for the gradients to fit the low-precision "
        "type (scale now {:g}).\n  Lower loss_scale's init in the train section (the default "
        "is dynamic(init = 65536)), train in bf16 (precision = bf16: float32's range, no "
        "scaler), or look for inf/NaN in the data or the model (a log of 0, a division by "
        "0)",
        scale);
  };
  if (skippedId_ >= 0) {
    // (State of the last pipeline stage, maybe: read there, broadcast.)
    skipped = skippedBefore = int64_t(m.stageScalar(skippedId_));
    scale = m.stageScalar(scaleId_);
  }
  // The next batch is written while the step runs (a GPU queues the step
  // and copies the batch meanwhile); when an evaluation follows the step it
  // is written after it (entry points share scratch memory).
  bool batchReady = false;
  Tracer *tracer = o_.tracer;
  if (tracer)
    m.exec->setTracer(tracer);
  // traceFrom < 0: the default window (TraceFile.h).
  std::tie(o_.traceFrom, o_.traceTo) = traceWindow(o_.traceFrom, o_.traceTo, start_, steps_);
  // Whether `at` is in the traced window; switches recording on or off.
  auto traceStep = [&](int64_t at) {
    if (!tracer)
      return;
    tracer->setStep(at);
    tracer->setEnabled(at >= std::max(o_.traceFrom, start_ + o_.traceWarmup) &&
                       at < o_.traceTo);
  };
  auto writeNext = [&]() -> Status {
    Batch b;
    {
      SpanScope wait(tracer, Span::DataWait, "data wait");
      auto next = prefetch.next();
      if (!next)
        return o_.worldSize > 1 ? Status::error(fmt::format("rank {}: {}", o_.rank,
                                                            next.status().message()))
                                : next.status();
      b = std::move(*next);
    }
    batchReady = true;
    SpanScope copy(tracer, Span::HostToDevice, "host to device");
    return copyBatch(*m.exec, inputs_, b);
  };
  for (; step < steps_; ++step) {
    traceStep(step);
    SpanScope stepSpan(tracer, Span::Step, fmt::format("step {}", step));
    if (!batchReady)
      if (Status s = writeNext(); !s)
        return s;
    batchReady = false;
    if (injectFault(step)) {
      TrainResult left;
      left.start = start_;
      left.next = step;
      left.left = true;
      return left;
    }
    if (o_.cancel && o_.cancel->load())
      return Status::error(fmt::format("rank {}: stopped at step {}: another rank failed",
                                       o_.rank, step));
    int64_t s64 = step;
    if (stepIn_ >= 0 && m.holds(stepIn_))
      if (Status s = storeInts(*m.exec, stepIn_, &s64, 1); !s)
        return s;
    if (replicaIn_ >= 0 && m.holds(replicaIn_)) {
      int64_t r64 = m.replica();
      if (Status s = storeInts(*m.exec, replicaIn_, &r64, 1); !s)
        return s;
    }
    if (tpRankIn_ >= 0 && m.holds(tpRankIn_)) {
      int64_t c64 = m.tpRank();
      if (Status s = storeInts(*m.exec, tpRankIn_, &c64, 1); !s)
        return s;
    }
    if (stopIn_ >= 0) {
      // Whether this process was asked to stop before the step: the step
      // sums the flags with its other scalars (agreeStop reads the sum).
      float flag = o_.stop && o_.stop->load() ? 1.f : 0.f;
      if (Status s = m.exec->write(stopIn_, &flag, sizeof flag); !s)
        return s;
    }
    // The executor adds which collective it is in ("training step 12,
    // @train_step step 40 (all_reduce of 4096 bytes on queue 1 at ...)").
    if (m.comm) {
      m.exec->setContext(fmt::format("training step {}", step));
      m.comm->setContext(fmt::format("training step {}", step));
    }
    // (A collective's error names the rank, the collective and the
    // training step: the context above.)
    if (Status s = m.exec->run("train_step"); !s)
      return s;
    bool evalAfter = val_ && evalInterval_ > 0 &&
                     ((step + 1) % evalInterval_ == 0 || step + 1 == steps_);
    bool early = m.exec->stagesInputs() && step + 1 < steps_ && !evalAfter;
    if (early) {
      // The next step's batch: its wait and copy belong to that step.
      traceStep(step + 1);
      Status s = writeNext();
      traceStep(step);
      if (!s)
        return s;
    }
    // Every device reads every result (pipeline stages: a result one
    // stage holds is broadcast to the others, Model::stageScalar).
    loss = m.stageScalar(lossId_);
    norm = normId_ >= 0 ? m.stageScalar(normId_) : 0.f;
    // Read now: an evaluation before agreeStop reuses the step's scratch.
    stopVotes_ = stopOut_ >= 0 ? m.scalar(stopOut_) : 0.f;
    lr = lrId_ >= 0 ? m.stageScalar(lrId_) : 0.f;
    bool skippedNow = false;
    if (skippedId_ >= 0) {
      int64_t now = int64_t(m.stageScalar(skippedId_));
      skippedNow = now > skipped;
      skipped = now;
      scale = m.stageScalar(scaleId_);
      inARow = skippedNow ? inARow + 1 : 0;
    }
    stepSpan.span().step = step;
    stepSpan.finish(); // the step ends when its results are back
    if (o_.onStep)
      o_.onStep(StepMetrics{step, loss, norm, lr, scale, skipped});
    if (lossLog_)
      std::fprintf(lossLog_, "%lld %.9g %.9g\n", (long long)step, double(loss), double(norm));
    // A step the loss scaler skipped (its gradients overflowed) changed
    // nothing but the scale: training goes on.
    if (!skippedNow && (!std::isfinite(loss) || !std::isfinite(norm))) {
      if (lossLog_) {
        std::fclose(lossLog_);
        lossLog_ = nullptr;
      }
      // Numbered as the progress lines number steps (1-based); a NaN's sign
      // means nothing.
      auto text = [](double x) { return std::isnan(x) ? std::string("nan") : fmt::format("{}", x); };
      return Status::error(fmt::format(
          "step {}/{}: the loss is {} (grad norm {}); training stopped and {} was not "
          "overwritten.\n  Lower the learning rate, set grad_clip in the train section, or "
          "resume from the last checkpoint with --resume.",
          step + 1, steps_, text(loss), text(norm), ckptPath_));
    }
    if (inARow == kWarnSkippedInARow && !warnedInARow) {
      warnedInARow = true;
      say(Channel::Warning,
          fmt::format("step {}/{}: the loss scaler skipped the last {} steps in a row "
                      "(gradients not finite), scale now {:g}; {}",
                      step + 1, steps_, inARow, scale,
                      o_.maxSkippedSteps > 0
                          ? fmt::format("the run fails at {} in a row (--max-skipped-steps)",
                                        o_.maxSkippedSteps)
                          : std::string("--max-skipped-steps 0: the run goes on")));
    }
    if (o_.maxSkippedSteps > 0 && inARow >= o_.maxSkippedSteps) {
      if (lossLog_) {
        std::fclose(lossLog_);
        lossLog_ = nullptr;
      }
      return Status::error(fmt::format(
          "rank {}: step {}/{}: {} steps in a row skipped by the loss scaler "
          "(--max-skipped-steps {}); training stopped and {} was not overwritten: {}",
          o_.rank, step + 1, steps_, inARow, o_.maxSkippedSteps, ckptPath_, scalerAdvice()));
    }
    if (std::isfinite(loss)) {
      lossSum += loss;
      ++lossCount;
    }
    ++sinceLog;
    bool last = step + 1 == steps_;
    if ((!o_.quiet || o_.onLog) && (sinceLog == o_.logInterval || last || step == start_)) {
      auto now = clock::now();
      double dt = std::max(std::chrono::duration<double>(now - tLog).count() - pausedLog, 0.0) /
                  double(sinceLog);
      double eta = dt * double(steps_ - step - 1);
      double meanLoss = lossCount ? lossSum / double(lossCount) : double(NAN);
      if (o_.onLog && leader())
        o_.onLog(LogPoint{step + 1, meanLoss, lr, norm, double(items_) / dt, tokens_, dt * 1e3,
                          scale, skipped});
      if (!o_.quiet)
        say(Channel::Progress,
            fmt::format("step {:>5}/{} | loss {:.4f} | lr {:.2e} | grad norm {:.3f}{} | {} "
                        "ms/step | {:.1f}k {}/s | ETA {}",
                        step + 1, steps_, meanLoss, lr, norm,
                        skippedId_ >= 0 ? fmt::format(" | scale {:g} skipped {}", scale, skipped)
                                        : "",
                        msText(dt * 1e3), double(items_) / dt / 1e3, tokens_ ? "tok" : "samples",
                        duration(eta)));
      tLog = now;
      pausedLog = 0;
      sinceLog = 0;
      lossSum = 0;
      lossCount = 0;
    }
    // Training by epochs: a line as each ends (a wrapping batch ends an
    // epoch in the step that reads its last row).
    if (epochs_ > 0 && !o_.quiet) {
      int64_t done = train.epochsDone(step + 1);
      if (done > train.epochsDone(step))
        say(Channel::Progress, fmt::format("epoch {}/{} done at step {}", done, epochs_, step + 1));
    }
    if (val_ && evalInterval_ > 0 && ((step + 1) % evalInterval_ == 0 || last)) {
      SpanScope evalSpan(tracer, Span::Eval, "evaluation");
      auto evalStart = clock::now();
      auto ev = evaluate(m, *val_, evalSteps_, step + 1);
      pause(evalStart);
      if (!ev)
        return Status::error(fmt::format("rank {}: {}", o_.rank, ev.status().message()),
                             ev.status().kind());
      EvalResult e = *ev;
      lastVal = e.loss;
      if (o_.onEval && leader())
        o_.onEval(EvalPoint{step + 1, e.loss, e.accuracy});
      if (!o_.quiet)
        say(Channel::Progress,
            fmt::format("step {:>5}: val loss {:.4f}{} ({} batch{})", step + 1, e.loss,
                        e.accuracy >= 0 ? fmt::format(", accuracy {:.2f}%", 100 * e.accuracy)
                                        : "",
                        e.batches, e.batches == 1 ? "" : "es"));
    }
    auto stop = agreeStop(step);
    if (!stop)
      return stop.status();
    // A stop during the last step: the run is complete, not interrupted
    // (there is nothing to resume).
    if (*stop && !last) {
      interrupted = true;
      ++step;
      break;
    }
    if (ckptEvery_ > 0 && (step + 1) % ckptEvery_ == 0 && !last) {
      SpanScope save(tracer, Span::Checkpoint, "checkpoint");
      auto saveStart = clock::now();
      if (Status s = saveCheckpoint(m, ckptPath_, step + 1, seed_, leader()); !s)
        return s;
      pause(saveStart);
    }
  }
  double stepSeconds =
      std::max(std::chrono::duration<double>(clock::now() - t0).count() - paused, 0.0);
  if (tracer)
    tracer->setEnabled(false);
  if (lossLog_) {
    std::fclose(lossLog_);
    lossLog_ = nullptr;
  }
  // A run none of whose steps changed the parameters trained nothing.
  if (skippedId_ >= 0 && o_.maxSkippedSteps > 0 && !interrupted && step > start_ &&
      skipped - skippedBefore == step - start_)
    return Status::error(fmt::format(
        "rank {}: every step of the run ({} of {}) was skipped by the loss scaler; the "
        "parameters did not change and {} was not overwritten: {} (--max-skipped-steps 0 "
        "lets such a run end normally)",
        o_.rank, step - start_, step - start_, ckptPath_, scalerAdvice()));
  if (Status s = saveCheckpoint(m, ckptPath_, step, seed_, leader()); !s)
    return s;
  TrainResult r;
  r.start = start_;
  r.next = step;
  r.loss = loss;
  r.valLoss = lastVal;
  r.seconds = std::chrono::duration<double>(clock::now() - t0).count();
  r.interrupted = interrupted;
  r.checkpoint = ckptPath_;
  if (!o_.quiet && !r.interrupted) {
    int64_t ran = step - start_;
    say(Channel::Line,
        fmt::format("done: {} steps in {} ({} ms/step, {:.1f}k {}/s); final loss {:.4f}{}; "
                    "checkpoint {}",
                    ran, duration(r.seconds), msText(ran ? stepSeconds / double(ran) * 1e3 : 0.0),
                    ran && stepSeconds > 0 ? double(items_) * double(ran) / stepSeconds / 1e3 : 0.0,
                    tokens_ ? "tok" : "samples", loss,
                    std::isnan(lastVal) ? "" : fmt::format(", val loss {:.4f}", lastVal),
                    ckptPath_));
    if (skippedId_ >= 0)
      say(Channel::Line,
          fmt::format("loss scaling: {} of {} steps skipped (gradients not finite), scale "
                      "now {:g}; {} skipped in all", skipped - skippedBefore, ran, scale,
                      skipped));
  }
  return r;
}

} // namespace kiln::train
