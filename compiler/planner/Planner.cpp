//===- Planner.cpp - kilnc --parallel=auto: choose pp x dp x tp -----------===//
#include "compiler/planner/Planner.h"

#include "runtime/core/Files.h"

#include "compiler/Codegen.h"
#include "compiler/Driver.h"
#include "compiler/Training.h"
#include "dialects/kiln/KilnDialect.h"
#include "dialects/kiln/TrainSettings.h"
#include "runtime/core/Program.h"

#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Verifier.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Path.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace kiln::planner {
namespace {

std::string mib(int64_t bytes) {
  return fmt::format("{:.2f} MiB", double(bytes) / (1 << 20));
}
std::string ms(double seconds) { return fmt::format("{:.1f}", seconds * 1e3); }
/// Milliseconds per row: two decimals, or two significant digits below 0.1.
std::string msPerRow(double seconds) {
  double v = seconds * 1e3;
  return v >= 0.1 ? fmt::format("{:.2f}", v) : fmt::format("{:.2g}", v);
}

int64_t argBytes(const program::Program &p, const std::vector<int> &args) {
  int64_t b = 0;
  for (int a : args)
    if (a >= 0 && size_t(a) < p.buffers.size())
      b += p.buffers[size_t(a)].bytes;
  return b;
}

/// Bytes one device sends and receives for `c` with `n` members, as a ring
/// moves them (nccl-tests' bus-bandwidth convention).
double busBytes(const program::Collective &c, int n) {
  double b = double(c.bytes), f = double(n - 1) / double(n);
  switch (c.op) {
  case program::Collective::Op::AllReduce:
    return 2 * f * b;
  case program::Collective::Op::ReduceScatter: // bytes: the full input
    return f * b;
  case program::Collective::Op::AllGather: // bytes: one member's part
    return f * b * n;
  default:
    return b;
  }
}

/// First line of `text`, without a trailing location-free prefix.
std::string firstLine(const std::string &text) {
  std::string line = text.substr(0, text.find('\n'));
  return line;
}

/// Compiles `c`'s layout of `module` and records its plan and memory.
void compile(mlir::ModuleOp module, Candidate &c, const Options &o,
             std::string &diagnostics) {
  mlir::OwningOpRef<mlir::ModuleOp> mod = module.clone();
  setLayout(*mod, c.pp * c.dp * c.tp, c.tp, c.zero, c.pp, c.microBatches, c.virtualStages);
  diagnostics.clear();
  if (mlir::failed(buildTrainProgram(*mod))) {
    c.applicable = false;
    c.reason = diagnostics.empty() ? "the training program cannot be built"
                                   : firstLine(diagnostics);
    return;
  }
  CodegenOptions co;
  co.emitLLVM = false;
  co.fusion = o.fusion;
  std::string err;
  auto compiled = compileProgram(*mod, co, err);
  if (mlir::failed(compiled)) {
    c.applicable = false;
    c.reason = firstLine(err.empty() ? diagnostics : err);
    return;
  }
  c.program = std::move(compiled->program);
  const program::Program &p = c.program;
  const program::Function *f = nullptr;
  for (const program::Function &fn : p.functions)
    if (fn.name == "train_step")
      f = &fn;
  if (!f) {
    c.applicable = false;
    c.reason = "the plan has no @train_step";
    return;
  }
  c.persistentBytes = p.persistentBytes;
  c.arenaBytes = p.arenaBytes;
  c.peakBytes = p.persistentBytes + f->scratchBytes;
  if (c.pp > 1) {
    // Each stage's devices have their own arena: the candidate needs the
    // largest. Persistent: the parameters and optimizer state the stage
    // holds (its own and those of stage -1), as --emit=plan counts them.
    c.stages.assign(size_t(c.pp), StageCost());
    for (int d = 0; d < p.numDevices(); ++d) {
      const program::BufferPlan &bp = p.plan(d);
      int stage = p.stageOf(d);
      if (stage < 0 || stage >= c.pp)
        continue;
      StageCost &st = c.stages[size_t(stage)];
      if (bp.arenaBytes <= st.arenaBytes)
        continue;
      st.arenaBytes = bp.arenaBytes;
      st.persistentBytes = 0;
      for (const program::Buffer &b : bp.buffers)
        if ((b.role == program::Role::Param ||
             b.role == program::Role::State) &&
            (b.stage < 0 || b.stage == stage))
          st.persistentBytes += (b.bytes + 63) / 64 * 64;
    }
    const StageCost *most = &c.stages.front();
    for (const StageCost &st : c.stages)
      if (st.arenaBytes > most->arenaBytes)
        most = &st;
    c.arenaBytes = c.peakBytes = most->arenaBytes;
    c.persistentBytes = most->persistentBytes;
  }
  c.steps = int64_t(f->steps.size());
  TrainSettings train(*mod);
  c.rowsPerStep = c.dp * train.integer("batch", 1) * train.gradAccum();
  c.fits = !o.budgetBytes || c.memoryBytes() <= *o.budgetBytes;
}

/// What one device's replay of a step list found.
struct Replay {
  double seconds = 0, gemmSeconds = 0, kernelSeconds = 0, commSeconds = 0;
  int64_t gemmFlops = 0, gemms = 0, timedGemms = 0, kernelBytes = 0;
  std::map<std::string, AxisTraffic> traffic;
  int64_t transfers = 0, transferBytes = 0; ///< sends (pipeline transfers)
};

/// Replays the steps of `f` that the devices of pipeline stage `stage` run
/// (those of that stage and of stage -1; every step when `stage` < 0) on
/// `m`. Sends and receives take no time here: the pipeline's transfers are
/// costed apart (predict).
Replay replay(const program::Program &p, const program::Function &f, int stage,
              const Machine &m) {
  Replay r;
  // The step on two queues: queue 0 runs kernels, GEMMs, copies and the
  // collectives not marked for overlap in order; queue 1 the gradient
  // buckets. A step starts when its queue is free and the steps it depends
  // on (the plan's exact dependencies) have finished; the steps of other
  // stages finish at 0 (they run on other devices).
  std::vector<double> finish(f.steps.size(), 0);
  double queueFree[2] = {0, 0};
  for (size_t j = 0; j < f.steps.size(); ++j) {
    const program::Step &s = f.steps[j];
    if (stage >= 0 && s.stage >= 0 && s.stage != stage)
      continue;
    double d = 0;
    switch (s.kind) {
    case program::Step::Gemm: {
      int64_t flops = int64_t(program::gemmFlops(s.gemm));
      r.gemmFlops += flops;
      ++r.gemms;
      double g = double(flops) / m.deviceFlops;
      auto it = m.gemmSeconds.find(gemmShapeKey(s.gemm));
      if (s.gemm.dtype == program::DType::F32 && it != m.gemmSeconds.end()) {
        g = it->second / m.coreShare;
        ++r.timedGemms;
      }
      r.gemmSeconds += g;
      d = g;
      if (s.epilogue >= 0) {
        int64_t b = argBytes(p, s.epilogueArgs);
        r.kernelBytes += b;
        r.kernelSeconds += double(b) / m.deviceBandwidth;
        d += double(b) / m.deviceBandwidth;
      }
      break;
    }
    case program::Step::Attention: {
      // The products at the GEMM rate: the fused kernel's time is theirs.
      int64_t flops = int64_t(program::attentionFlops(s.attention));
      r.gemmFlops += flops;
      d = double(flops) / m.deviceFlops;
      r.gemmSeconds += d;
      break;
    }
    case program::Step::Kernel:
    case program::Step::Copy: {
      int64_t b = argBytes(p, s.args);
      r.kernelBytes += b;
      d = double(b) / m.deviceBandwidth;
      r.kernelSeconds += d;
      break;
    }
    case program::Step::Collective: {
      const program::Collective &col = s.collective;
      int n = col.groupSize(p.mesh);
      AxisTraffic &t = r.traffic[col.axis.empty() ? "group" : col.axis];
      ++t.count;
      t.bytes += col.bytes;
      if (col.op == program::Collective::Op::Send) {
        ++r.transfers;
        r.transferBytes += col.bytes;
      } else if (col.op != program::Collective::Op::Recv && n > 1) {
        d = m.commLatency + busBytes(col, n) / m.commBusBandwidth;
      }
      r.commSeconds += d;
      break;
    }
    }
    int q = s.queue == 0 ? 0 : 1;
    double start = queueFree[q];
    for (int dep : s.deps)
      if (dep >= 0 && size_t(dep) < j)
        start = std::max(start, finish[size_t(dep)]);
    finish[j] = start + d;
    queueFree[q] = finish[j];
  }
  r.seconds = std::max(queueFree[0], queueFree[1]);
  return r;
}

void take(Candidate &c, const Replay &r) {
  c.gemmFlops = r.gemmFlops;
  c.gemms = r.gemms;
  c.timedGemms = r.timedGemms;
  c.kernelBytes = r.kernelBytes;
  c.gemmSeconds = r.gemmSeconds;
  c.kernelSeconds = r.kernelSeconds;
  c.commSeconds = r.commSeconds;
  c.traffic = r.traffic;
}

/// Predicts the step time of `c`'s plan on `m`. Without a pipeline: the
/// replay of every step. With pp = p stages and M micro-batches: stage s's
/// devices take T_s (the replay of their steps, all M micro-batches), a
/// micro-batch t = max_s T_s / M, and the step (M + p - 1) t (the slowest
/// stage stretched by the bubble of p - 1 micro-batch slots) plus the
/// transfers: each send latency + bytes / the bus bandwidth.
void predict(Candidate &c, const Machine &m) {
  const program::Program &p = c.program;
  const program::Function *f = nullptr;
  for (const program::Function &fn : p.functions)
    if (fn.name == "train_step")
      f = &fn;
  if (c.pp <= 1) {
    Replay r = replay(p, *f, -1, m);
    take(c, r);
    c.stepSeconds = r.seconds;
  } else {
    double slowest = -1;
    for (int64_t s = 0; s < c.pp; ++s) {
      Replay r = replay(p, *f, int(s), m);
      StageCost &st = c.stages[size_t(s)];
      st.seconds = r.seconds;
      st.computeSeconds = r.gemmSeconds + r.kernelSeconds;
      c.transfers += r.transfers;
      c.transferBytes += r.transferBytes;
      if (r.seconds > slowest) { // the table shows the slowest stage's device
        slowest = r.seconds;
        take(c, r);
      }
    }
    // Interleaved (V chunks per device): the bubble is p - 1 slots of one
    // chunk's share of a micro-batch, (p - 1) / V micro-batch times.
    double microBatch = slowest / double(c.microBatches);
    c.bubbleSeconds = double(c.pp - 1) * microBatch / double(c.virtualStages);
    c.transferSeconds = double(c.transfers) * m.commLatency +
                        double(c.transferBytes) / m.commBusBandwidth;
    c.commSeconds += c.transferSeconds;
    c.stepSeconds = double(c.microBatches) * microBatch + c.bubbleSeconds + c.transferSeconds;
  }
  c.exposedCommSeconds = std::max(0.0, c.stepSeconds - c.gemmSeconds -
                                           c.kernelSeconds - c.bubbleSeconds);
  c.program = program::Program(); // the numbers are all the report needs
}

std::string trafficText(const Candidate &c) {
  std::string out;
  for (const auto &[axis, t] : c.traffic)
    out += fmt::format("{}{}: {} ({})", out.empty() ? "" : ", ", axis, t.count,
                       mib(t.bytes));
  return out.empty() ? "none" : out;
}

} // namespace

std::string Candidate::layout() const {
  if (pp > 1)
    return fmt::format("pp={} dp={} tp={} M={}{}{}", pp, dp, tp, microBatches,
                       virtualStages > 1 ? fmt::format(" V={}", virtualStages) : std::string(),
                       zero > 0 ? fmt::format(" zero={}", zero) : std::string());
  return fmt::format("dp={} tp={} zero={}", dp, tp, zero);
}

std::string Candidate::flags() const {
  std::string f = fmt::format("--devices {}", pp * dp * tp);
  if (pp > 1)
    f += fmt::format(" --pp {} --micro-batches {}", pp, microBatches);
  if (pp > 1 && virtualStages > 1)
    f += fmt::format(" --pipeline interleaved --virtual-stages {}", virtualStages);
  if (tp > 1)
    f += fmt::format(" --tp {}", tp);
  if (zero > 0)
    f += fmt::format(" --zero {}", zero);
  return f;
}

bool parseMachine(const std::string &text, int devices, Machine &m,
                  std::string &error) {
  m.measured = false;
  m.devices = std::max(1, devices);
  std::map<std::string, double> v;
  llvm::SmallVector<llvm::StringRef> items;
  llvm::StringRef(text).split(items, ',');
  for (llvm::StringRef item : items) {
    auto [key, value] = item.split('=');
    double d = 0;
    if (value.trim().getAsDouble(d) || !(d > 0)) {
      error =
          "--planner-machine: '" + item.str() + "' is not KEY=POSITIVE-NUMBER";
      return false;
    }
    v[key.trim().str()] = d;
  }
  for (const char *k : {"cores", "gflops", "gbps", "latency-us", "busbw-gbps"})
    if (!v.count(k)) {
      error = std::string(
                  "--planner-machine needs cores, gflops, gbps, latency-us and "
                  "busbw-gbps; ") +
              k + " is missing";
      return false;
    }
  if (v.size() != 5) {
    error = "--planner-machine takes only cores, gflops, gbps, latency-us and "
            "busbw-gbps";
    return false;
  }
  setMachineTotals(m, int(v["cores"]), v["gflops"], v["gbps"], v["latency-us"], v["busbw-gbps"]);
  m.calibration = "given by --planner-machine, not measured";
  m.commCalibration = "given by --planner-machine, not measured";
  return true;
}

Result plan(mlir::ModuleOp module, const Options &o, Machine &m, const MachineProbe &probe,
            std::string &diagnostics) {
  Result r;
  // pp outermost, then tp; ZeRO wherever dp > 1 (with pp each stage shards
  // its state over its dp devices; with tp each device's tp block over its
  // dp group); micro-batches only with a pipeline.
  for (int64_t pp = 1; pp <= o.devices; ++pp) {
    if (o.devices % pp != 0)
      continue;
    for (int64_t tp = 1; tp <= o.devices / pp; ++tp) {
      if ((o.devices / pp) % tp != 0)
        continue;
      int64_t dp = o.devices / pp / tp;
      int maxZero = dp > 1 ? 2 : 0;
      for (int64_t micro : {1, 2, 4, 8}) {
        if (pp == 1 && micro > 1)
          break;
        for (int zero = 0; zero <= maxZero; ++zero) {
          Candidate c;
          c.pp = pp;
          c.dp = dp;
          c.tp = tp;
          c.zero = zero;
          c.microBatches = pp > 1 ? micro : 1;
          Candidate interleaved = c;
          compile(module, c, o, diagnostics);
          r.candidates.push_back(std::move(c));
          // Interleaved 1F1B with 2 chunks per device, where Megatron's
          // order exists (M a multiple of pp); left out when it does not
          // compile (too few layers for pp x 2 chunks, or whatever refused
          // the plain 1F1B layout, which is listed).
          if (pp > 1 && micro % pp == 0 && r.candidates.back().applicable) {
            interleaved.virtualStages = 2;
            compile(module, interleaved, o, diagnostics);
            if (interleaved.applicable)
              r.candidates.push_back(std::move(interleaved));
          }
        }
      }
    }
  }
  std::vector<program::GemmParams> shapes;
  std::map<std::string, bool> seen;
  for (const Candidate &c : r.candidates)
    for (const program::Function &f : c.program.functions)
      if (f.name == "train_step")
        for (const program::Step &s : f.steps)
          if (s.kind == program::Step::Gemm &&
              s.gemm.dtype == program::DType::F32 &&
              !seen[gemmShapeKey(s.gemm)]) {
            seen[gemmShapeKey(s.gemm)] = true;
            shapes.push_back(s.gemm);
          }
  if (m.measured && probe.timeGemms)
    probe.timeGemms(shapes, m);
  else if (m.measured)
    m.gemmCalibration = "not timed (no GEMM timer given): every GEMM at the sgemm rate";
  else
    m.gemmCalibration =
        "not timed (--planner-machine): every GEMM at the sgemm rate";
  for (Candidate &c : r.candidates)
    if (c.applicable)
      predict(c, m);
  for (size_t i = 0; i < r.candidates.size(); ++i)
    if (r.candidates[i].applicable)
      r.ranking.push_back(i);
  // Best first by predicted time per training row (the layouts train
  // different global batches: dp * batch * micro-batches rows); ties keep
  // the enumeration order (smaller pp, smaller tp, fewer micro-batches,
  // lower ZeRO stage).
  std::stable_sort(r.ranking.begin(), r.ranking.end(), [&](size_t a, size_t b) {
    return r.candidates[a].secondsPerRow() < r.candidates[b].secondsPerRow();
  });
  // The best predicted layout that fits, unless one with less model
  // parallelism (a smaller pp x tp, then a smaller tp) that fits is
  // predicted within the margin of it: then the best of the least such
  // (tensor parallelism puts blocking collectives on the step's critical
  // path, a pipeline its transfers and bubble, which the model predicts
  // least well).
  for (size_t i : r.ranking)
    if (r.candidates[i].fits) {
      r.fastest = i;
      break;
    }
  if (r.fastest) {
    double limit = r.candidates[*r.fastest].secondsPerRow() * (1 + o.margin);
    for (size_t i : r.ranking) {
      const Candidate &c = r.candidates[i];
      if (!c.fits || c.secondsPerRow() > limit)
        continue;
      if (!r.chosen)
        r.chosen = i;
      const Candidate &w = r.candidates[*r.chosen];
      if (c.pp * c.tp < w.pp * w.tp ||
          (c.pp * c.tp == w.pp * w.tp && c.tp < w.tp))
        r.chosen = i;
    }
  }
  if (r.ranking.empty()) {
    r.error = fmt::format(
        "no layout of {} on {} devices compiles (every candidate is listed "
        "above with the compiler's reason)",
        o.modelPath, o.devices);
  } else if (!r.chosen) {
    size_t small = r.ranking.front();
    for (size_t i : r.ranking)
      if (r.candidates[i].memoryBytes() < r.candidates[small].memoryBytes())
        small = i;
    const Candidate &c = r.candidates[small];
    r.error = fmt::format(
        "no layout of {} on {} devices fits in --memory-per-device {} ({} "
        "bytes): the smallest, "
        "{}, needs {} ({} bytes: persistent {}, scratch peak {}). Give at "
        "least {} bytes per "
        "device, use more devices (tensor and pipeline parallelism divide "
        "weights and activations), or a smaller per-device batch (--batch)",
        o.modelPath, o.devices, mib(*o.budgetBytes), *o.budgetBytes, c.layout(),
        mib(c.memoryBytes()), c.memoryBytes(), mib(c.persistentBytes),
        mib(c.memoryBytes() - c.persistentBytes), c.memoryBytes());
  }
  return r;
}

void printReport(const Result &r, const Options &o, const Machine &m,
                 llvm::raw_ostream &os) {
  os << fmt::format(
      "planner: {} ({}) on {} device{}, memory per device: {}\n", o.modelName,
      o.modelPath, o.devices, o.devices == 1 ? "" : "s",
      o.budgetBytes
          ? fmt::format("{} ({} bytes)", mib(*o.budgetBytes), *o.budgetBytes)
          : std::string("no budget (--memory-per-device not given)"));
  os << fmt::format(
      "device model: {} in-process CPU devices share this machine's {} cores: "
      "each gets {} "
      "thread{} ({:.2f} cores) and that share of the measured rates\n",
      m.devices, m.cores, m.threadsPerDevice,
      m.threadsPerDevice == 1 ? "" : "s", m.coreShare);
  os << fmt::format("  compute: sgemm {:.1f} GFLOP/s, memory {:.1f} GB/s for "
                    "the machine ({}); "
                    "per device {:.1f} GFLOP/s, {:.1f} GB/s\n",
                    m.machineFlops * 1e-9, m.machineBandwidth * 1e-9,
                    m.calibration, m.deviceFlops * 1e-9,
                    m.deviceBandwidth * 1e-9);
  if (m.devices > 1)
    os << fmt::format("  communication: latency {:.1f} us per collective, bus "
                      "bandwidth {:.2f} "
                      "GB/s ({})\n",
                      m.commLatency * 1e6, m.commBusBandwidth * 1e-9,
                      m.commCalibration);
  os << fmt::format("  GEMMs: {}; per device that time / {:.2f} cores\n",
                    m.gemmCalibration, m.coreShare);
  os << "cost model: each plan step of @train_step in order on its queue, "
        "after the steps it "
        "depends on: a GEMM its shape's timed call (FLOPs / sgemm rate where "
        "untimed), a kernel or copy its bytes / memory "
        "bandwidth, a collective latency + bytes * 2(n-1)/n (all_reduce), "
        "(n-1)/n of the full "
        "data (reduce_scatter, all_gather) / bus bandwidth over its group of "
        "n; gradient "
        "buckets run on queue 1 beside backward, so only what outlasts the "
        "compute they "
        "overlap is exposed; everything else waits. Ranked by predicted time "
        "per training row "
        "(dp replicas each train the model's batch).\n";
  os << "pipeline (pp = p > 1, M micro-batches; zero=N: ZeRO over each stage's dp devices): stage s's devices "
        "replay the steps they run (stage s and -1) in T_s for all M "
        "micro-batches; step = (M + p - 1) * max_s T_s / M (the slowest "
        "stage stretched by the bubble, (p - 1) / (M + p - 1) of the step "
        "idle) + each send's latency + bytes / bus bandwidth; interleaved "
        "(V=2 model chunks per device, M a multiple of p): step = (M + (p - 1) "
        "/ V) * max_s T_s / M + the sends, bubble (p - 1) / (V M + p - 1). A pipeline "
        "trains dp * batch * M rows per step, so layouts are compared per "
        "row; layouts without one keep the train section's grad_accum\n\n";

  os << fmt::format("{:>4}  {:<30} {:>11} {:>11}  {:<4} {:>8} {:>8} {:>8} "
                    "{:>8} {:>5} {:>7} {:>6}  {}\n",
                    "rank", "layout", "memory", "persistent", "fits", "ms/step",
                    "compute", "comm", "exposed", "rows", "ms/row", "bubble",
                    "collectives per step (axis: count, bytes)");
  int rank = 0;
  for (size_t i : r.ranking) {
    const Candidate &c = r.candidates[i];
    os << fmt::format(
        "{:>4}  {:<30} {:>11} {:>11}  {:<4} {:>8} {:>8} {:>8} "
        "{:>8} {:>5} {:>7} {:>6}  {}\n",
        ++rank, c.layout(), mib(c.memoryBytes()), mib(c.persistentBytes),
        c.fits ? "yes" : "no", ms(c.stepSeconds),
        ms(c.gemmSeconds + c.kernelSeconds), ms(c.commSeconds),
        ms(c.exposedCommSeconds), c.rowsPerStep, msPerRow(c.secondsPerRow()),
        c.pp > 1 ? fmt::format("{:.1f}%", c.bubbleFraction() * 100)
                 : std::string("-"),
        trafficText(c));
  }
  for (const Candidate &c : r.candidates)
    if (!c.applicable)
      os << fmt::format("{:>4}  {:<30} not applicable: {}\n", "-", c.layout(),
                        c.reason);
  os << "\n";
  if (!r.chosen)
    return;
  const Candidate &w = r.candidates[*r.chosen];
  std::string text = fmt::format("chose {} ({}): ", w.layout(), w.flags());
  text +=
      o.budgetBytes
          ? fmt::format("fits in {} with {} per device (persistent {})",
                        mib(*o.budgetBytes), mib(w.memoryBytes()),
                        mib(w.persistentBytes))
          : fmt::format(
                "every layout fits without a budget; it needs {} per device "
                "(persistent {})",
                mib(w.memoryBytes()), mib(w.persistentBytes));
  text += fmt::format(
      "; predicted {} ms/step for {} rows ({} ms/row: compute {} ms, "
      "communication {} ms of which {} exposed",
      ms(w.stepSeconds), w.rowsPerStep, msPerRow(w.secondsPerRow()),
      ms(w.gemmSeconds + w.kernelSeconds), ms(w.commSeconds),
      ms(w.exposedCommSeconds));
  if (w.pp > 1)
    text += fmt::format(
        ", bubble {} ms = {:.1f}% of the step slots ({} - 1) / ({}{} + {} - 1), "
        "{} transfers of {} in {} ms",
        ms(w.bubbleSeconds), w.bubbleFraction() * 100, w.pp,
        w.virtualStages > 1 ? fmt::format("{} x ", w.virtualStages) : std::string(),
        w.microBatches, w.pp, w.transfers, mib(w.transferBytes), ms(w.transferSeconds));
  text += ")";
  // Plain data parallelism, when a budget rules it out: its numbers.
  for (size_t i : r.ranking) {
    const Candidate &c = r.candidates[i];
    if (c.pp == 1 && c.tp == 1 && c.zero == 0 && !c.fits && i != *r.chosen &&
        c.secondsPerRow() >= w.secondsPerRow())
      text += fmt::format(
          "; plain data parallelism ({}) needs {} per device, over the "
          "budget (predicted {} ms/row)",
          c.layout(), mib(c.memoryBytes()), msPerRow(c.secondsPerRow()));
  }
  // The next best that fits, and why it loses.
  std::optional<size_t> next;
  std::vector<size_t> faster; // better predicted, over the budget
  for (size_t i : r.ranking) {
    if (i == *r.chosen || (r.fastest && i == *r.fastest))
      continue;
    const Candidate &c = r.candidates[i];
    if (!c.fits && c.secondsPerRow() < w.secondsPerRow())
      faster.push_back(i);
    else if (c.fits && !next)
      next = i;
  }
  if (r.fastest && *r.fastest != *r.chosen) {
    const Candidate &f = r.candidates[*r.fastest];
    text += fmt::format(
        "; {} is predicted {:.0f}% faster per row ({} against {} "
        "ms/row), within the "
        "planner's {:.0f}% margin (the spread of its predictions against "
        "measured step times), "
        "so the {} wins: {}",
        f.layout(), (w.secondsPerRow() / f.secondsPerRow() - 1) * 100,
        msPerRow(f.secondsPerRow()), msPerRow(w.secondsPerRow()),
        o.margin * 100,
        f.pp * f.tp > w.pp * w.tp ? "less model parallelism" : "smaller tp",
        f.pp > 1 && f.pp > w.pp
            ? fmt::format("{} idles {:.1f}% of its step in the pipeline "
                          "bubble and makes {} transfers per step",
                          f.layout(), f.bubbleFraction() * 100, f.transfers)
            : fmt::format("{} meets its tp group in {} blocking collectives "
                          "per step",
                          f.layout(),
                          f.traffic.count("tp") ? f.traffic.at("tp").count
                                                : 0));
    next = r.fastest;
  }
  if (next) {
    const Candidate &c = r.candidates[*next];
    double rowsW = double(w.rowsPerStep), rowsC = double(c.rowsPerStep);
    text += fmt::format(
        "{} {} ms/row for {}{}: per row it computes "
        "for {:.2f} ms against {:.2f} ({} against {} GFLOP of GEMMs and {} "
        "against {} MiB of "
        "kernel traffic per device per step) and exposes {:.2f} ms of "
        "communication against "
        "{:.2f} ({} against {})",
        r.fastest && *next == *r.fastest ? "; against" : ", against",
        msPerRow(c.secondsPerRow()), c.layout(),
        r.fastest && *next == *r.fastest ? "" : ", the next best that fits",
        (w.gemmSeconds + w.kernelSeconds) / rowsW * 1e3,
        (c.gemmSeconds + c.kernelSeconds) / rowsC * 1e3,
        fmt::format("{:.2f}", w.gemmFlops * 1e-9),
        fmt::format("{:.2f}", c.gemmFlops * 1e-9),
        fmt::format("{:.1f}", double(w.kernelBytes) / (1 << 20)),
        fmt::format("{:.1f}", double(c.kernelBytes) / (1 << 20)),
        w.exposedCommSeconds / rowsW * 1e3, c.exposedCommSeconds / rowsC * 1e3,
        trafficText(w), trafficText(c));
  } else {
    text += ", the only layout that fits";
  }
  for (size_t i : faster) {
    const Candidate &c = r.candidates[i];
    text += fmt::format(
        "; {} would be faster ({} ms/row) but needs {}, over the budget",
        c.layout(), msPerRow(c.secondsPerRow()), mib(c.memoryBytes()));
  }
  os << text << ".\n";
  if (w.pp > 1) {
    std::string stages;
    for (size_t s = 0; s < w.stages.size(); ++s) {
      const StageCost &st = w.stages[s];
      stages += fmt::format(
          "{}stage {}: {} per device (persistent {}), {} ms for its {} "
          "micro-batch{} (compute {} ms)",
          s ? "; " : "", s, mib(st.arenaBytes), mib(st.persistentBytes),
          ms(st.seconds), w.microBatches, w.microBatches == 1 ? "" : "es",
          ms(st.computeSeconds));
    }
    os << "per stage of " << w.layout() << ": " << stages << ".\n";
  }
}

bool parseSize(const std::string &text, int64_t &bytes) {
  const char *s = text.c_str();
  char *end = nullptr;
  double v = std::strtod(s, &end);
  if (end == s || !(v > 0) || !std::isfinite(v))
    return false;
  std::string unit(end);
  unit.erase(0, unit.find_first_not_of(' '));
  double scale = 0;
  if (unit.empty() || unit == "B")
    scale = 1;
  else if (unit == "KiB")
    scale = 1024.0;
  else if (unit == "MiB")
    scale = 1024.0 * 1024;
  else if (unit == "GiB")
    scale = 1024.0 * 1024 * 1024;
  else
    return false;
  double b = v * scale;
  if (b > 9e18 || (scale == 1 && v != std::floor(v)))
    return false;
  bytes = int64_t(b);
  return bytes > 0;
}

Status chooseLayout(mlir::ModuleOp module, Options &options,
                    const std::optional<std::string> &machineSpec, const MachineProbe &probe,
                    std::string &diagnostics, llvm::raw_ostream &os) {
  if (!module.lookupSymbol("forward"))
    return Status::error("--parallel=auto lays out a model (a .kiln file, or a .mlir module with "
                         "func.func @forward); '" +
                         options.modelPath +
                         "' is a hand-written @train_step, compiled as it is: give --devices and "
                         "--tp yourself");
  if (options.devices == 0) {
    options.devices = TrainSettings(module).integer("devices", 1);
  }
  if (options.devices < 1 || options.devices > 1024)
    return Status::error("--parallel=auto needs --devices N with N from 1 to 1024 (or devices = "
                         "N in the train section)");
  if (options.modelName.empty())
    options.modelName = module.getName() ? module.getName()->str()
                                         : llvm::sys::path::stem(options.modelPath).str();
  Machine machine;
  std::string err;
  if (machineSpec && !options.machineFile.empty())
    return Status::error("--planner-machine and --machine both give the machine: use one");
  if (machineSpec) {
    if (!parseMachine(*machineSpec, int(options.devices), machine, err))
      return Status::error(err);
  } else if (!options.machineFile.empty()) {
    std::string text;
    if (!readFile(options.machineFile, text))
      return Status::error("--machine: cannot read " + options.machineFile +
                           "; write it with kiln-run devices --calibrate --devices " +
                           std::to_string(options.devices) + " -o " + options.machineFile);
    if (!parseMachineFile(text, options.machineFile, machine, err))
      return Status::error("--machine: " + err);
    if (machine.devices != int(options.devices))
      return Status::error(fmt::format(
          "--machine: {} was measured for {} devices, and this plan is for {}: the "
          "communication constants depend on the count; run kiln-run devices --calibrate "
          "--devices {} -o {}",
          options.machineFile, machine.devices, options.devices, options.devices,
          options.machineFile));
  } else if (!probe.measure) {
    return Status::error("--parallel=auto cannot measure this machine here (no measurements "
                         "given): give its constants with --planner-machine");
  } else if (!probe.measure(int(options.devices), machine, err)) {
    return Status::error("--parallel=auto cannot measure this machine: " + err);
  }
  Result result = plan(module, options, machine, probe, diagnostics);
  diagnostics.clear();
  printReport(result, options, machine, os);
  os.flush();
  if (!result.chosen)
    return Status::error(result.error);
  const Candidate &c = result.candidates[*result.chosen];
  setLayout(module, c.pp * c.dp * c.tp, c.tp, c.zero, c.pp, c.microBatches, c.virtualStages);
  return Status::ok();
}

} // namespace kiln::planner
