//===- Overview.cpp - Where a training step's time goes, from its spans ----===//
#include "runtime/train/Overview.h"

#include "runtime/train/Trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <tuple>

namespace kiln::train {

void profileWindow(TrainOptions &o, int64_t warmup) {
  o.traceFrom = 0;
  o.traceTo = INT64_MAX;
  o.traceWarmup = std::max<int64_t>(warmup, 0);
}

namespace {

/// Clock reads of nested regions may disagree by a few ns.
constexpr double kEps = 1e-7;

/// Spans of the loop's thread that make up a step (Collective spans run on
/// their own queue: overlapped or, synchronous, the same as their wait).
bool onTimeline(const Span &s) {
  if (s.thread != 0)
    return false;
  switch (s.kind) {
  case Span::Kernel:
  case Span::Gemm:
  case Span::Copy:
  case Span::CollectiveWait:
  case Span::DataWait:
  case Span::HostToDevice:
    return true;
  default:
    return false;
  }
}

bool isWork(const Span &s) {
  return s.kind == Span::Kernel || s.kind == Span::Gemm || s.kind == Span::Copy ||
         s.kind == Span::Collective || s.kind == Span::CollectiveWait;
}

/// The Step spans, in time order.
std::vector<const Span *> stepSpans(const std::vector<Span> &spans) {
  std::vector<const Span *> steps;
  for (const Span &s : spans)
    if (s.kind == Span::Step)
      steps.push_back(&s);
  std::sort(steps.begin(), steps.end(),
            [](const Span *a, const Span *b) { return a->start < b->start; });
  return steps;
}

/// The Step span `s` starts in, or null.
const Span *stepOf(const std::vector<const Span *> &steps, const Span &s) {
  auto it = std::upper_bound(steps.begin(), steps.end(), s.start + kEps,
                             [](double t, const Span *x) { return t < x->start; });
  if (it == steps.begin())
    return nullptr;
  const Span *st = *(it - 1);
  return s.start <= st->start + st->seconds + kEps ? st : nullptr;
}

std::string pct(double part, double whole) {
  return fmt::format("{:.1f}%", whole > 0 ? 100 * part / whole : 0.0);
}

std::string ms(double s) { return fmt::format("{:.3f} ms", s * 1e3); }

/// "m.kiln:12:5 (+3 more)".
std::string firstLine(const KernelStat &k) {
  if (k.lines.empty())
    return "-";
  return k.lines.size() == 1 ? k.lines[0]
                             : fmt::format("{} (+{} more)", k.lines[0], k.lines.size() - 1);
}

std::string join(const std::vector<std::string> &v, const char *sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i)
    out += (i ? sep : "") + v[i];
  return out;
}

/// " [kiln.mul + kiln.add]"; long lists by their ends: " [22 ops: kiln.cast
/// + kiln.add + ... + kiln.sub]" (--stats-csv has them all).
std::string fusedOps(const KernelStat &k) {
  if (k.ops.size() < 2)
    return "";
  if (k.ops.size() <= 5)
    return " [" + join(k.ops, " + ") + "]";
  return fmt::format(" [{} ops: {} + {} + ... + {}]", k.ops.size(), k.ops[0], k.ops[1],
                     k.ops.back());
}

/// The top row of the kind (kinds: "kernel", "gemm"), or null.
const KernelStat *top(const std::vector<KernelStat> &stats, const char *kind) {
  for (const KernelStat &k : stats)
    if (k.kind == kind)
      return &k;
  return nullptr;
}

/// The union of intervals, as sorted disjoint intervals.
std::vector<std::pair<double, double>> merged(std::vector<std::pair<double, double>> v) {
  std::sort(v.begin(), v.end());
  std::vector<std::pair<double, double>> out;
  for (const auto &iv : v) {
    if (iv.second <= iv.first)
      continue;
    if (!out.empty() && iv.first <= out.back().second)
      out.back().second = std::max(out.back().second, iv.second);
    else
      out.push_back(iv);
  }
  return out;
}

/// The length of the intersection of two sorted disjoint interval lists.
double overlap(const std::vector<std::pair<double, double>> &x,
               const std::vector<std::pair<double, double>> &y) {
  double t = 0;
  size_t i = 0, j = 0;
  while (i < x.size() && j < y.size()) {
    t += std::max(0.0, std::min(x[i].second, y[j].second) - std::max(x[i].first, y[j].first));
    if (x[i].second < y[j].second)
      ++i;
    else
      ++j;
  }
  return t;
}

/// A stretch of time in which inter-op workers ran something: rank 0 (a
/// GEMM), 1 (a kernel) or 2 (only copies).
struct Segment {
  double start, end;
  int rank;
};

/// The stretches of [a, e] in which some worker span of `workers` (sorted
/// by start; none longer than `longest` seconds) ran, split where the highest-ranked kind running
/// changes.
std::vector<Segment> workerSegments(const std::vector<const Span *> &workers, double longest,
                                    double a, double e) {
  std::vector<std::pair<double, int>> events; // (time, +-(rank + 1))
  auto from = std::lower_bound(workers.begin(), workers.end(), a - longest - kEps,
                               [](const Span *x, double t) { return x->start < t; });
  for (auto it = from; it != workers.end() && (*it)->start < e; ++it) {
    double s0 = std::max((*it)->start, a), s1 = std::min((*it)->start + (*it)->seconds, e);
    if (s1 <= s0)
      continue;
    int r = (*it)->kind == Span::Gemm ? 0 : (*it)->kind == Span::Kernel ? 1 : 2;
    events.push_back({s0, r + 1});
    events.push_back({s1, -(r + 1)});
  }
  std::sort(events.begin(), events.end());
  std::vector<Segment> out;
  int count[3] = {0, 0, 0};
  double at = a;
  for (const auto &[t, ev] : events) {
    int r = count[0] ? 0 : count[1] ? 1 : count[2] ? 2 : -1;
    if (r >= 0 && t > at)
      out.push_back({at, t, r});
    at = t;
    count[std::abs(ev) - 1] += ev > 0 ? 1 : -1;
  }
  return out;
}

} // namespace

Breakdown breakdown(const std::vector<Span> &spans) {
  Breakdown b;
  std::vector<const Span *> steps = stepSpans(spans);
  std::vector<const Span *> line; // the loop thread's spans, by start
  for (const Span &s : spans)
    if (onTimeline(s))
      line.push_back(&s);
  std::sort(line.begin(), line.end(), [](const Span *x, const Span *y) {
    return std::make_tuple(x->start, -x->seconds) < std::make_tuple(y->start, -y->seconds);
  });
  std::vector<const Span *> workers; // inter-op workers' kernels, GEMMs, copies
  for (const Span &s : spans)
    if (s.thread != 0 && (s.kind == Span::Kernel || s.kind == Span::Gemm || s.kind == Span::Copy))
      workers.push_back(&s);
  std::sort(workers.begin(), workers.end(),
            [](const Span *x, const Span *y) { return x->start < y->start; });
  double longest = 0;
  for (const Span *w : workers)
    longest = std::max(longest, w->seconds);
  std::vector<const Span *> runs; // collectives' run times, by start
  for (const Span &s : spans)
    if (s.kind == Span::Collective)
      runs.push_back(&s);
  std::sort(runs.begin(), runs.end(),
            [](const Span *x, const Span *y) { return x->start < y->start; });
  auto byStart = [](const Span *x, double t) { return x->start < t; };
  double stepSum = 0, kernelCalls = 0, kernelTime = 0;
  for (const Span *st : steps) {
    double a = st->start, e = st->start + st->seconds;
    b.steps++;
    stepSum += st->seconds;
    if (b.firstStep < 0 || st->step < b.firstStep)
      b.firstStep = st->step;
    b.lastStep = std::max(b.lastStep, st->step);
    // This step's spans, clipped to it; each one's own time is its length
    // less the spans nested in it.
    struct Part {
      Span::Kind kind;
      double start, end, self;
    };
    std::vector<Part> parts;
    auto from = std::lower_bound(line.begin(), line.end(), a - kEps, byStart);
    for (auto it = from; it != line.end() && (*it)->start <= e + kEps; ++it) {
      double s0 = std::max((*it)->start, a), s1 = std::min((*it)->start + (*it)->seconds, e);
      if (s1 < s0)
        s1 = s0;
      parts.push_back({(*it)->kind, s0, s1, s1 - s0});
    }
    std::vector<size_t> open;
    std::vector<std::pair<double, double>> gaps; // on the loop's thread
    double covered = a;
    for (size_t i = 0; i < parts.size(); ++i) {
      Part &p = parts[i];
      while (!open.empty() && parts[open.back()].end <= p.start + kEps)
        open.pop_back();
      if (!open.empty() && p.end <= parts[open.back()].end + kEps)
        parts[open.back()].self -= p.end - p.start; // nested: the parent's time less it
      open.push_back(i);
      // Idle: the gap since everything before it ended.
      if (p.start > covered)
        gaps.push_back({covered, p.start});
      covered = std::max(covered, p.end);
    }
    if (e > covered)
      gaps.push_back({covered, e});
    // Inter-op workers: where the loop's thread has a gap while a worker
    // runs a kernel, GEMM or copy, the step computes (a GEMM where one
    // runs, else a kernel, else a copy); the rest of the gap is idle.
    double filled[3] = {0, 0, 0}; // gemm, kernel, copy
    std::vector<Segment> work = workerSegments(workers, longest, a, e);
    size_t w = 0;
    for (const auto &[g0, g1] : gaps) {
      double busy = 0;
      while (w < work.size() && work[w].end <= g0)
        ++w;
      for (size_t j = w; j < work.size() && work[j].start < g1; ++j) {
        double t = std::min(work[j].end, g1) - std::max(work[j].start, g0);
        if (t > 0) {
          filled[work[j].rank] += t;
          busy += t;
        }
      }
      b.idle += (g1 - g0) - busy;
    }
    b.gemm += filled[0];
    b.kernel += filled[1];
    b.copy += filled[2];
    double exposed = 0;
    for (const Part &p : parts) {
      double t = std::max(p.self, 0.0);
      switch (p.kind) {
      case Span::DataWait:
        b.input += t;
        break;
      case Span::HostToDevice:
        b.hostToDevice += t;
        break;
      case Span::Gemm:
        b.gemm += t;
        break;
      case Span::Kernel:
        b.kernel += t;
        break;
      case Span::Copy:
        b.copy += t;
        break;
      case Span::CollectiveWait:
        exposed += t;
        break;
      default:
        break;
      }
    }
    b.commExposed += exposed;
    // Overlapped: the time some collective ran while the loop's thread
    // computed (a kernel, GEMM or copy). Not run time - exposed: two
    // collectives may run at once (a synchronous one on queue 0 beside an
    // asynchronous one), overlapping each other, not compute.
    std::vector<std::pair<double, double>> ran, computed;
    for (auto it = std::lower_bound(runs.begin(), runs.end(), a - kEps, byStart);
         it != runs.end() && (*it)->start <= e + kEps; ++it)
      ran.push_back({(*it)->start, std::min((*it)->start + (*it)->seconds, e)});
    for (const Part &p : parts)
      if (p.kind == Span::Kernel || p.kind == Span::Gemm || p.kind == Span::Copy)
        computed.push_back({p.start, p.end});
    b.commOverlapped += overlap(merged(std::move(ran)), merged(std::move(computed)));
  }
  for (const Span &s : spans) {
    if (s.kind == Span::Eval) {
      b.evals++;
      b.evalSeconds += s.seconds;
    } else if (s.kind == Span::Checkpoint) {
      b.checkpoints++;
      b.checkpointSeconds += s.seconds;
    } else if ((s.kind == Span::Kernel || s.kind == Span::Gemm) && stepOf(steps, s)) {
      kernelCalls += 1;
      kernelTime += s.seconds;
    }
  }
  if (b.steps) {
    double n = double(b.steps);
    b.step = stepSum / n;
    b.input /= n;
    b.hostToDevice /= n;
    b.gemm /= n;
    b.kernel /= n;
    b.copy /= n;
    b.commExposed /= n;
    b.commOverlapped /= n;
    b.idle /= n;
    b.kernelsPerStep = kernelCalls / n;
  }
  b.meanKernel = kernelCalls > 0 ? kernelTime / kernelCalls : 0;
  return b;
}

std::vector<KernelStat> kernelStats(const std::vector<Span> &spans, const program::Program &p,
                                    const Breakdown &b, const MachinePeak &peak) {
  std::vector<const Span *> steps = stepSpans(spans);
  std::map<std::pair<std::string, std::string>, KernelStat> rows;
  auto addLine = [](KernelStat &k, const std::string &l) {
    if (!l.empty() && std::find(k.lines.begin(), k.lines.end(), l) == k.lines.end())
      k.lines.push_back(l);
  };
  for (const Span &s : spans) {
    if (!isWork(s) || !stepOf(steps, s))
      continue;
    std::string kind = spanKindName(s.kind);
    KernelStat &k = rows[{kind, s.name}];
    if (k.calls == 0) {
      k.kind = kind;
      k.name = s.name;
      if (s.kind == Span::Kernel && s.kernel >= 0 && size_t(s.kernel) < p.kernels.size()) {
        const program::Kernel &pk = p.kernels[size_t(s.kernel)];
        for (const std::string &l : pk.locs)
          addLine(k, l);
        k.ops = pk.ops;
      }
    }
    if (s.kind != Span::Kernel && s.planStep >= 0)
      if (const program::Function *f = p.function(s.function))
        if (size_t(s.planStep) < f->steps.size())
          addLine(k, f->steps[size_t(s.planStep)].loc);
    k.calls++;
    k.seconds += s.seconds;
    k.flops += s.flops;
    if (s.kind != Span::CollectiveWait) // a wait moves nothing itself
      k.bytes += s.bytes;
  }
  std::vector<KernelStat> out;
  double stepTotal = b.step * double(b.steps);
  for (auto &[key, k] : rows) {
    k.stepShare = stepTotal > 0 ? k.seconds / stepTotal : 0;
    bool local = k.kind == "kernel" || k.kind == "gemm" || k.kind == "copy";
    if (local && k.seconds > 0 && (peak.flops > 0 || peak.bandwidth > 0)) {
      double tf = peak.flops > 0 ? k.flops / peak.flops : 0;
      double tb = peak.bandwidth > 0 ? k.bytes / peak.bandwidth : 0;
      k.peakShare = std::max(tf, tb) / k.seconds;
      k.bound = tf >= tb ? "compute" : "memory";
    }
    out.push_back(std::move(k));
  }
  std::sort(out.begin(), out.end(), [](const KernelStat &x, const KernelStat &y) {
    return x.seconds != y.seconds ? x.seconds > y.seconds : x.name < y.name;
  });
  return out;
}

std::string recommend(const Breakdown &b, const std::vector<KernelStat> &stats,
                      const Thresholds &t) {
  double S = b.step;
  if (b.steps == 0 || S <= 0)
    return "no profiled steps (the first step of a run is warm-up: train at least 2 steps)";
  double input = b.input + b.hostToDevice;
  if (input > t.input * S)
    return fmt::format(
        "input-bound: {} of the step waits for data or its copy to the device ({} of {}); "
        "raise --prefetch or --data-workers, or use a faster data format (a token file, "
        "memory-mapped)",
        pct(input, S), ms(input), ms(S));
  // A pipeline's exposed waits are mostly receives from the neighbouring
  // stage: its bubble and stage imbalance, which buckets do not change.
  // (Sends count too: under MPI a blocking send to a stage that is not
  // ready waits as long as a receive.)
  double recvWait = 0;
  auto isP2p = [](const std::string &n) {
    return n == "recv" || n.rfind("recv ", 0) == 0 || n == "send" || n.rfind("send ", 0) == 0;
  };
  for (const KernelStat &k : stats)
    if (k.kind == "collective wait" && isP2p(k.name))
      recvWait += k.seconds / double(std::max<int64_t>(1, b.steps));
  if (b.commExposed > t.comm * S && recvWait > 0.5 * b.commExposed)
    return fmt::format(
        "pipeline-bubble: {} of the step waits for collectives ({}), {} of it sending or "
        "receiving activations or gradients between stages: the schedule's bubble, "
        "(p - 1) / (M + p - 1), and unbalanced stages; use more micro-batches "
        "(micro_batches, kilnc --micro-batches), the interleaved schedule (kilnc --pipeline "
        "interleaved: (p - 1) / (V M + p - 1)), or balance the stages (stage blocks)",
        pct(b.commExposed, S), ms(b.commExposed), ms(recvWait));
  if (b.commExposed > t.comm * S)
    return fmt::format(
        "communication-exposed: {} of the step waits for collectives ({}; {} more ran "
        "alongside compute); with data parallelism, change the gradient buckets (bucket_mb "
        "in the train section, kilnc --bucket-mb) so more of it overlaps backward; with "
        "tensor parallelism (whose all_reduces sit between layers), use a smaller tp; or "
        "train on fewer devices",
        pct(b.commExposed, S), ms(b.commExposed), ms(b.commOverlapped));
  if (b.idle > t.idle * S)
    return fmt::format(
        "idle: {} of the step ({}) is gaps between the spans of the loop's thread (host work "
        "between kernels, reading the loss back); profile the host, or run more work per "
        "step (a larger batch)",
        pct(b.idle, S), ms(b.idle));
  double compute = b.gemm + b.kernel + b.copy;
  if (b.kernelsPerStep >= t.launchKernels && b.meanKernel < t.launchMean &&
      compute > t.launchShare * S)
    return fmt::format(
        "launch-bound: {:.0f} kernels and GEMMs per step, {:.1f} us each on average; the cost "
        "of each call dominates: fuse more (fewer, larger kernels) or raise the batch size",
        b.kernelsPerStep, b.meanKernel * 1e6);
  if (compute > t.compute * S) {
    bool gemms = b.gemm >= b.kernel;
    const KernelStat *k = top(stats, gemms ? "gemm" : "kernel");
    std::string which =
        k ? fmt::format("; the top one is {} at {} ({} of the step{}{})", k->name, firstLine(*k),
                        pct(k->stepShare, 1),
                        k->peakShare > 0 ? fmt::format(", {:.0f}% of the machine's {} peak",
                                                       100 * k->peakShare, k->bound)
                                         : "",
                        !gemms && k->ops.size() > 1 ? ", fusing " + join(k->ops, " + ") : "")
          : "";
    return fmt::format("compute-bound in {}: {} of the step{}",
                       gemms ? "GEMMs" : "generated kernels", pct(gemms ? b.gemm : b.kernel, S),
                       which);
  }
  return fmt::format("no single part dominates (compute {}, input {}, exposed communication "
                     "{}, idle {})",
                     pct(compute, S), pct(input, S), pct(b.commExposed, S), pct(b.idle, S));
}

std::string formatOverview(const Breakdown &b, const std::vector<KernelStat> &stats,
                           const MachinePeak &peak, const std::string &who, size_t topN) {
  std::string o;
  double S = b.step;
  if (b.steps == 0)
    return fmt::format("profile: {}\n", recommend(b, stats));
  o += fmt::format("profile of steps {}..{} ({} steps{}{}):\n", b.firstStep, b.lastStep, b.steps,
                   who.empty() ? "" : ", ", who);
  if (!peak.how.empty())
    o += fmt::format("  machine peak: {:.1f} GFLOP/s, {:.1f} GB/s ({})\n", peak.flops / 1e9,
                     peak.bandwidth / 1e9, peak.how);
  o += fmt::format("step-time breakdown (mean per step):\n");
  auto row = [&](const char *what, double t) {
    o += fmt::format("  {:<30} {:>10}  {:>6}\n", what, ms(t), pct(t, S));
  };
  row("input (waiting for data)", b.input);
  row("host to device", b.hostToDevice);
  row("compute: GEMMs", b.gemm);
  row("compute: generated kernels", b.kernel);
  row("compute: copies", b.copy);
  row("communication (exposed)", b.commExposed);
  row("idle (gaps between spans)", b.idle);
  o += fmt::format("  {:<30} {:>10}  (alongside compute; not in the sum)\n",
                   "communication (overlapped)", ms(b.commOverlapped));
  o += fmt::format("  parts add up to {:.1f}% of the measured {:.3f} ms/step\n", 100 * b.coverage(),
                   S * 1e3);
  if (b.evals)
    o += fmt::format("  between steps: {} evaluation{}, {} each\n", b.evals,
                     b.evals == 1 ? "" : "s", ms(b.evalSeconds / double(b.evals)));
  if (b.checkpoints)
    o +=
        fmt::format("  between steps: {} checkpoint write{}, {} each\n", b.checkpoints,
                    b.checkpoints == 1 ? "" : "s", ms(b.checkpointSeconds / double(b.checkpoints)));
  o += "recommendation: " + recommend(b, stats) + "\n";
  size_t n = std::min(topN, stats.size());
  o += fmt::format("kernel stats (top {} of {} by total time; --stats-csv FILE writes all):\n", n,
                   stats.size());
  o += fmt::format("  {:<10} {:<34} {:>10} {:>8} {:>9} {:>6} {:>8} {:>7} {:>7}  {}\n", "kind",
                   "name", "calls/step", "ms/step", "mean us", "step", "GFLOP/s", "GB/s", "peak",
                   "model line");
  double steps = double(std::max<int64_t>(b.steps, 1));
  for (size_t i = 0; i < n; ++i) {
    const KernelStat &k = stats[i];
    std::string name = k.name.size() > 34 ? k.name.substr(0, 31) + "..." : k.name;
    o += fmt::format("  {:<10} {:<34} {:>10} {:>8.3f} {:>9.1f} {:>6} {:>8.1f} {:>7.1f} {:>7}  "
                     "{}{}\n",
                     k.kind == "collective wait" ? "comm wait" : k.kind, name,
                     fmt::format("{:g}", double(k.calls) / steps), k.seconds * 1e3 / steps,
                     k.mean() * 1e6, pct(k.stepShare, 1), k.gflops(), k.gbps(),
                     k.peakShare > 0 ? pct(k.peakShare, 1) : "-", firstLine(k), fusedOps(k));
  }
  if (stats.size() > n) {
    double rest = 0;
    for (size_t i = n; i < stats.size(); ++i)
      rest += stats[i].seconds;
    o += fmt::format("  ... {} more ({:.3f} ms/step)\n", stats.size() - n, rest * 1e3 / steps);
  }
  return o;
}

int meshCoordinate(const program::Mesh &m, const std::string &axis, int rank) {
  int a = m.axis(axis);
  if (a < 0)
    return -1;
  int64_t inner = 1; // devices per step along the axis (row-major)
  for (size_t i = size_t(a) + 1; i < m.axes.size(); ++i)
    inner *= m.axes[i].size;
  return int((rank / inner) % std::max<int64_t>(1, m.axes[size_t(a)].size));
}

std::string stageHeader() {
  return "pipeline stages (each device's own spans, mean per step; bubble = exposed waits for "
         "sends, receives and collectives + idle):\n"
         "  stage  rank      step ms   compute ms  share    waits ms    idle ms   bubble  top "
         "kernels (ms/step)\n";
}

std::string formatStageRow(const std::vector<Span> &spans, const program::Program &p, int rank,
                           int stage, size_t top) {
  Breakdown b = breakdown(spans);
  if (b.steps == 0)
    return fmt::format("  {:>5}  {:>4}  no profiled steps\n", stage, rank);
  std::vector<KernelStat> stats = kernelStats(spans, p, b, MachinePeak{});
  double S = b.step, steps = double(std::max<int64_t>(b.steps, 1));
  double compute = b.gemm + b.kernel + b.copy;
  std::string tops;
  size_t shown = 0;
  for (const KernelStat &k : stats) {
    if (k.kind != "kernel" && k.kind != "gemm" && k.kind != "copy")
      continue;
    if (shown++ == top)
      break;
    // "path/to/m.kiln:12:5" -> "m.kiln:12".
    std::string line = k.lines.empty() ? "" : k.lines[0];
    if (size_t c = line.rfind(':'); c != std::string::npos && line.rfind(':', c - 1) != std::string::npos)
      line.resize(c);
    if (size_t slash = line.rfind('/'); slash != std::string::npos)
      line = line.substr(slash + 1);
    tops += fmt::format("{}{} {:.3f}{}", tops.empty() ? "" : ", ", k.name, k.seconds * 1e3 / steps,
                        line.empty() ? "" : " (" + line + ")");
  }
  return fmt::format("  {:>5}  {:>4}  {:>11.3f}  {:>11.3f}  {:>5}  {:>10.3f} {:>10.3f}  {:>6}  {}\n",
                     stage, rank, S * 1e3, compute * 1e3, pct(compute, S), b.commExposed * 1e3,
                     b.idle * 1e3, pct(b.commExposed + b.idle, S), tops);
}

Status writeStatsCsv(const std::string &path, const std::vector<KernelStat> &stats) {
  std::FILE *f = std::fopen(path.c_str(), "w");
  if (!f)
    return Status::error(fmt::format("--stats-csv {}: cannot write the file; check that its "
                                     "folder exists and is writable",
                                     path));
  auto quote = [](const std::string &s) {
    std::string q = "\"";
    for (char c : s)
      q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
  };
  std::string out = "kind,name,calls,total_s,mean_s,step_share,flops,bytes,gflops_per_s,"
                    "gbytes_per_s,peak_share,bound,model_lines,fused_ops\n";
  for (const KernelStat &k : stats)
    out +=
        fmt::format("{},{},{},{:.9g},{:.9g},{:.6g},{:.9g},{:.9g},{:.6g},{:.6g},{:.6g},{},{},{}\n",
                    quote(k.kind), quote(k.name), k.calls, k.seconds, k.mean(), k.stepShare,
                    k.flops, k.bytes, k.gflops(), k.gbps(), k.peakShare, quote(k.bound),
                    quote(join(k.lines, ";")), quote(join(k.ops, ";")));
  bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
  ok = std::fclose(f) == 0 && ok;
  if (!ok)
    return Status::error(fmt::format("--stats-csv {}: writing failed (disk full?)", path));
  return Status::ok();
}

} // namespace kiln::train
