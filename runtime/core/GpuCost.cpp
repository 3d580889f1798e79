//===- GpuCost.cpp - Predicted GPU time of a plan, without a GPU ----------===//
#include "runtime/core/GpuCost.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include <fmt/format.h>

namespace kiln::gpu {
namespace {

using program::Buffer;
using program::DType;
using program::Program;
using program::Step;

// Fractions of the datasheet peaks a well-shaped call reaches. The SGEMM
// and bf16 GEMM figures and the bandwidth were measured on the H200 of
// docs/gpu-check.md (notes: about 50 of 67 TFLOP/s, 790-800 of 989, 4.3 of
// 4.8 TB/s); the same fractions are assumed on the other devices.
constexpr double kSgemmEfficiency = 0.75;
constexpr double kTensorEfficiency = 0.80;
constexpr double kBandwidthEfficiency = 0.90;
// A generated kernel's arithmetic runs on the FMA pipes at about half their
// peak (address arithmetic, conversions and reductions take the rest).
constexpr double kKernelFlopEfficiency = 0.5;

// The CTA tile of a library GEMM and how many of them an SM holds at once.
constexpr int64_t kGemmTile = 128;
constexpr int64_t kGemmCtasPerSm = 1;
// The shortest K slice a split-K piece gets.
constexpr int64_t kSplitKMinDepth = 512;
// A library call's fixed GPU time (prologue, the first tile's pipeline fill,
// the tail): what makes a 50 MFLOP call take ~10 us, not ~1 (calibrated on
// the fp32 attention GEMMs of the H200 profile: 3.6-4.1 TFLOP/s in calls of
// 6 matrices).
constexpr double kGemmFixedSeconds = 5e-6;

// Between two kernels on one stream the GPU idles for about a microsecond
// (drain, launch of the next grid); a replayed CUDA graph shortens it.
constexpr double kGapSeconds = 1.5e-6;
constexpr double kGraphGapSeconds = 0.8e-6;
// The host's cost of issuing one launch (cuLaunchKernel) and one cuBLASLt
// matmul (descriptor checks, heuristics cached): the GPU waits for the host
// when kernels are shorter than these. A graph is issued once per call.
constexpr double kHostKernelSeconds = 2.5e-6;
constexpr double kHostLibrarySeconds = 5e-6;
constexpr double kHostGraphSeconds = 10e-6;

// Memory parallelism (Little's law): a launch keeps at most `threads x
// load width x kLoadsInFlight` bytes in flight (an SM holds 2048 threads),
// and each request takes kMemoryLatencySeconds, so a small grid or narrow
// loads reach only part of the bandwidth: one block of 256 threads reading
// 4-byte floats gets ~5 GB/s, 2-byte half loads at full occupancy about
// half of the H200's 4.3 TB/s (its bf16 step's generated kernels).
constexpr double kThreadsPerSm = 2048;
constexpr double kLoadsInFlight = 2;
constexpr double kMemoryLatencySeconds = 0.8e-6;

// `columns(block per column)`: the lanes of a warp read one element each
// from rows k elements apart, so every 32-byte sector fetched carries one
// element. Neighbouring blocks' columns share the sectors when they run at
// once, which L2 turns into a partial hit rate: kColumnSectorReuse of the
// wasted sectors come back from L2 instead of HBM.
constexpr double kColumnSectorReuse = 0.5;

int64_t dtypeWidth(DType t) { return std::max<int64_t>(1, program::dtypeBytes(t)); }

double argBytes(const Program &p, const std::vector<int> &args) {
  double b = 0;
  for (int a : args)
    if (a >= 0 && size_t(a) < p.buffers.size())
      b += double(p.buffers[size_t(a)].bytes);
  return b;
}

/// The element width of a kernel's traffic: its largest float buffer's.
int64_t elementWidth(const Program &p, const std::vector<int> &args) {
  int64_t best = -1, width = 4;
  for (int a : args) {
    if (a < 0 || size_t(a) >= p.buffers.size())
      continue;
    const Buffer &b = p.buffers[size_t(a)];
    if (!kiln::isFloat(b.dtype) || b.bytes <= best)
      continue;
    best = b.bytes;
    width = dtypeWidth(b.dtype);
  }
  return width;
}

/// The number of indices a scatter reads: its largest integer argument.
int64_t indexCount(const Program &p, const std::vector<int> &args) {
  int64_t n = 0;
  for (int a : args) {
    if (a < 0 || size_t(a) >= p.buffers.size())
      continue;
    const Buffer &b = p.buffers[size_t(a)];
    if (!kiln::isFloat(b.dtype))
      n = std::max<int64_t>(n, b.bytes / dtypeWidth(b.dtype));
  }
  return n;
}

int64_t threadsOf(const Launch &l) {
  return l.grid[0] * l.grid[1] * l.grid[2] * l.block[0] * l.block[1] * l.block[2];
}

/// The chunked scatter_add (`scatter(chunks)` then `scatter(chunk sums)`,
/// compiler/cuda/Scatter.cpp): how many chunks of how many indices, and the
/// bytes each launch moves. The first launch runs a thread per (outer,
/// inner) column per chunk, so its threads over the updates' columns
/// (update elements / indices) give the chunk count; its fp32 partials are
/// the output's size per chunk, written once and read once.
struct ScatterChunks {
  int64_t chunks = 0, chunkLength = 0;
  double inputBytes = 0, outputBytes = 0, partialBytes = 0;
};

ScatterChunks scatterChunks(const Program &p, const program::Kernel &k,
                            const std::vector<int> &args, const std::vector<Launch> &ls,
                            int64_t indices) {
  ScatterChunks sc;
  const Launch *first = nullptr;
  for (const Launch &l : ls)
    if (l.form == "scatter(chunks)")
      first = &l;
  if (!first || indices <= 0)
    return sc;
  int64_t updates = 0; // the largest float input's elements
  double outElems = 0, partialWidth = 4; // fp32 partials (f64 for f64)
  for (size_t i = 0; i < args.size(); ++i) {
    int a = args[i];
    if (a < 0 || size_t(a) >= p.buffers.size())
      continue;
    const Buffer &b = p.buffers[size_t(a)];
    double bytes = double(b.bytes);
    if (int(i) < k.numInputs) {
      sc.inputBytes += bytes;
      if (kiln::isFloat(b.dtype))
        updates = std::max<int64_t>(updates, b.bytes / dtypeWidth(b.dtype));
    } else {
      sc.outputBytes += bytes;
      outElems += bytes / double(dtypeWidth(b.dtype));
      if (b.dtype == DType::F64)
        partialWidth = 8;
    }
  }
  int64_t columns = updates / indices; // outer x inner
  if (columns <= 0)
    return sc;
  sc.chunks = std::max<int64_t>(1, threadsOf(*first) / columns);
  sc.chunkLength = (indices + sc.chunks - 1) / sc.chunks;
  sc.partialBytes = double(sc.chunks) * outElems * partialWidth;
  return sc;
}

struct Timed {
  double seconds = 0;
  const char *bound = "memory";
};

/// One launch of a generated kernel moving `bytes` and computing `flops`.
Timed launchTime(const Launch &l, double bytes, double flops, int64_t width,
                 int64_t indices, int64_t chunkLength, const DeviceSpec &dev) {
  double threads = std::min(double(threadsOf(l)), dev.sms * kThreadsPerSm);
  double loadBytes =
      l.form == "elementwise(float4)" || l.form == "elementwise(vec8)" ? 16.0 : double(width);
  double moved = bytes;
  if (l.form == "columns(block per column)" && l.grid[0] * l.grid[1] * l.grid[2] > 1) {
    // Several columns: each lane's element is k elements from its
    // neighbour's, so each costs a whole sector, in flight and in traffic.
    // (One column, k = 1, is read by adjacent threads: coalesced, but one
    // block keeps only 256 threads' loads in flight.)
    double waste = 32.0 / double(width);
    moved = bytes * (1.0 + (waste - 1.0) * (1.0 - kColumnSectorReuse));
    loadBytes = 32.0;
  }
  double bandwidth = std::min(dev.bandwidth * kBandwidthEfficiency,
                              threads * loadBytes * kLoadsInFlight / kMemoryLatencySeconds);
  Timed t;
  t.seconds = moved / bandwidth;
  double fill = std::min(1.0, threads / (dev.sms * kThreadsPerSm / 2));
  double compute = flops / (dev.fp32Flops * kKernelFlopEfficiency * std::max(fill, 1e-3));
  if (compute > t.seconds) {
    t.seconds = compute;
    t.bound = "compute";
  }
  if (l.form == "scatter(chunks)" && chunkLength > 0) {
    // Each thread walks its chunk's indices in order: a dependent chain of
    // an index load (L2) and a shared-memory add per index.
    double walk = double(chunkLength) * dev.l2LatencyCycles / dev.clockHz;
    if (walk > t.seconds) {
      t.seconds = walk;
      t.bound = "latency";
    }
  }
  if (l.form == "scatter(by row)" && indices > 0) {
    // Each thread walks every index in order, one dependent L2 load each.
    double walk = double(indices) * dev.l2LatencyCycles / dev.clockHz;
    if (walk > t.seconds) {
      t.seconds = walk;
      t.bound = "latency";
    }
  }
  return t;
}

/// One GEMM step issued as `calls` library calls of `batch` matrices.
Timed gemmTime(const program::GemmParams &g, GemmCalls split, double bytes, bool tf32,
               const DeviceSpec &dev) {
  double peak = g.dtype == DType::F32 ? (tf32 || g.tf32 ? dev.tf32Flops * kTensorEfficiency
                                              : dev.fp32Flops * kSgemmEfficiency)
                                      : dev.halfFlops * kTensorEfficiency;
  // A batch the plan folds into the rows (a shared weight): m grows instead.
  int64_t m = g.m * std::max<int64_t>(g.batch / std::max<int64_t>(split.calls * split.batch, 1), 1);
  int64_t tiles = ((m + kGemmTile - 1) / kGemmTile) * ((g.n + kGemmTile - 1) / kGemmTile) *
                  split.batch;
  int64_t slots = int64_t(dev.sms) * kGemmCtasPerSm;
  // Few tiles over a long K: the library splits K over more CTAs (split-K)
  // and adds the partial products, as cuBLAS's heuristics do.
  if (tiles < slots)
    tiles *= std::clamp<int64_t>(slots / std::max<int64_t>(tiles, 1), 1,
                                 std::max<int64_t>(g.k / kSplitKMinDepth, 1));
  int64_t waves = (tiles + slots - 1) / slots;
  double fill = double(tiles) / double(waves * slots);
  double callFlops = 2.0 * double(split.batch) * double(m) * double(g.n) * double(g.k);
  double compute = callFlops / (peak * fill);
  double memory = bytes / double(split.calls) / (dev.bandwidth * kBandwidthEfficiency);
  Timed t;
  t.bound = compute >= memory ? "compute" : "memory";
  t.seconds = double(split.calls) * (std::max(compute, memory) + kGemmFixedSeconds);
  return t;
}

std::string lower(std::string s) {
  for (char &c : s)
    c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

} // namespace

GemmCalls gemmCalls(const program::GemmParams &g, GemmPlanForm form) {
  auto plan = planGemm(g, form);
  if (!plan)
    return {1, std::max<int64_t>(g.batch, 1)};
  // A folded batch (one GEMM of batch x m rows) is one matrix per call.
  return {plan->calls(), plan->batch};
}

const std::vector<DeviceSpec> &DeviceSpec::table() {
  // Datasheet figures (NVIDIA H100 and H200 product briefs, A100 datasheet):
  // dense tensor-core peaks, boost clocks, HBM bandwidth. L2 hit latency
  // from published microbenchmarks (about 260-300 cycles on Hopper).
  static const std::vector<DeviceSpec> devices = {
      {"H100-SXM", 132, 1.98e9, 66.9e12, 494.7e12, 989.4e12, 3.35e12, 300},
      {"H200", 132, 1.98e9, 66.9e12, 494.7e12, 989.4e12, 4.8e12, 300},
      {"A100-SXM", 108, 1.41e9, 19.5e12, 156e12, 312e12, 2.039e12, 250},
  };
  return devices;
}

const DeviceSpec *DeviceSpec::find(const std::string &name) {
  std::string want = lower(name);
  for (const DeviceSpec &d : table()) {
    std::string have = lower(d.name);
    if (have == want || have.rfind(want + "-", 0) == 0)
      return &d;
  }
  return nullptr;
}

CostReport predict(const Program &p, const program::Function &f,
                   const std::vector<std::vector<Launch>> &launches, const DeviceSpec &dev,
                   const CostOptions &options) {
  CostReport r;
  r.device = dev.name;
  int counted = 0; // the device with the largest arena, as countPlan
  int64_t largest = -1;
  for (int d = 0; d < p.numDevices(); ++d)
    if (p.plan(d).arenaBytes > largest) {
      largest = p.plan(d).arenaBytes;
      counted = d;
    }
  double gap = options.cudaGraphs ? kGraphGapSeconds : kGapSeconds;
  double host = options.cudaGraphs ? kHostGraphSeconds : 0;
  auto kernelItem = [&](int kernel, const std::vector<int> &args, CostItem &item) {
    if (kernel < 0 || size_t(kernel) >= launches.size() || size_t(kernel) >= p.kernels.size())
      return;
    const std::vector<Launch> &ls = launches[size_t(kernel)];
    const program::Kernel &k = p.kernels[size_t(kernel)];
    double bytes = kernelTrafficBytes(p, kernel, args);
    int64_t width = elementWidth(p, args);
    int64_t indices = indexCount(p, args);
    double threads = 0;
    for (const Launch &l : ls)
      threads += double(threadsOf(l));
    ScatterChunks sc = scatterChunks(p, k, args, ls, indices);
    for (const Launch &l : ls) {
      double share = threads > 0 ? double(threadsOf(l)) / threads : 1.0 / double(ls.size());
      double launchBytes = bytes * share;
      int64_t launchWidth = width;
      if (sc.chunks > 0 && l.form == "scatter(chunks)") {
        launchBytes = sc.inputBytes + sc.partialBytes; // read once, partials written
      } else if (sc.chunks > 0 && l.form == "scatter(chunk sums)") {
        launchBytes = sc.partialBytes + sc.outputBytes; // partials read, output written
        launchWidth = 4;
      }
      Timed t = launchTime(l, launchBytes, double(k.flops) * share, launchWidth, indices,
                           sc.chunkLength, dev);
      if (sc.chunks > 0)
        item.bytes += launchBytes - bytes * share; // the scratch traffic
      item.seconds += t.seconds + gap;
      item.bound = t.bound;
      if (item.form.empty())
        item.form = l.form;
      r.kernelSeconds += t.seconds + gap;
      if (!options.cudaGraphs)
        host += kHostKernelSeconds;
    }
    item.launches += int64_t(ls.size());
    r.launches += int64_t(ls.size());
    item.flops += double(k.flops);
    item.bytes += bytes;
    if (item.what.empty())
      item.what = k.symbol;
  };
  for (size_t i = 0; i < f.steps.size(); ++i) {
    const Step &s = f.steps[i];
    if (!p.runs(counted, s))
      continue;
    CostItem item;
    item.step = int(i);
    if (s.kind == Step::Kernel) {
      kernelItem(s.kernel, s.args, item);
    } else if (s.kind == Step::Gemm) {
      GemmCalls split = options.gemmSplit ? options.gemmSplit(s.gemm)
                                          : GemmCalls{1, std::max<int64_t>(s.gemm.batch, 1)};
      double bytes = argBytes(p, s.args);
      if (s.lt.valid() && s.epilogue >= 0)
        bytes += kernelTrafficBytes(p, s.epilogue, s.epilogueArgs);
      Timed t = gemmTime(s.gemm, split, bytes, options.tf32, dev);
      item.what = program::gemmLabel(s.gemm);
      item.form = "gemm";
      item.flops = program::gemmFlops(s.gemm);
      item.bytes = bytes;
      item.bound = t.bound;
      item.launches = split.calls;
      item.seconds = t.seconds + double(split.calls) * gap;
      r.gemmSeconds += item.seconds;
      r.libraryCalls += split.calls;
      if (!options.cudaGraphs)
        host += double(split.calls) * kHostLibrarySeconds;
      if (s.epilogue >= 0 && !s.lt.valid()) {
        CostItem epilogue;
        kernelItem(s.epilogue, s.epilogueArgs, epilogue);
        item.seconds += epilogue.seconds;
        item.launches += epilogue.launches;
      }
    } else {
      continue; // copies and collectives: not modelled on the GPU yet
    }
    r.items.push_back(std::move(item));
  }
  r.hostSeconds = host;
  // The host runs ahead of the GPU on one stream; the slower of the two sets
  // the pace.
  r.seconds = std::max(r.gemmSeconds + r.kernelSeconds, host);
  return r;
}

std::string formatReport(const CostReport &r, size_t top) {
  std::string out = fmt::format(
      "{}: {:.3f} ms predicted ({:.3f} ms in {} GEMM library calls, {:.3f} ms in {} kernel "
      "launches; the host issues them in {:.3f} ms{})\n",
      r.device, r.seconds * 1e3, r.gemmSeconds * 1e3, r.libraryCalls, r.kernelSeconds * 1e3,
      r.launches, r.hostSeconds * 1e3,
      r.hostSeconds > r.gemmSeconds + r.kernelSeconds ? ": host-bound" : "");
  // Time by form, most expensive first.
  std::vector<std::pair<std::string, std::pair<double, int64_t>>> forms;
  for (const CostItem &i : r.items) {
    auto it = std::find_if(forms.begin(), forms.end(),
                           [&](const auto &f) { return f.first == i.form; });
    if (it == forms.end())
      it = forms.insert(forms.end(), {i.form, {0.0, 0}});
    it->second.first += i.seconds;
    it->second.second += i.launches;
  }
  std::stable_sort(forms.begin(), forms.end(), [](const auto &a, const auto &b) {
    return a.second.first > b.second.first;
  });
  out += "  by form:";
  for (size_t k = 0; k < forms.size(); ++k)
    out += fmt::format("{} {} {:.3f} ms ({})", k ? "," : "", forms[k].first,
                       forms[k].second.first * 1e3, forms[k].second.second);
  out += "\n";
  std::vector<const CostItem *> order;
  for (const CostItem &i : r.items)
    order.push_back(&i);
  std::stable_sort(order.begin(), order.end(),
                   [](const CostItem *a, const CostItem *b) { return a->seconds > b->seconds; });
  if (order.size() > top)
    order.resize(top);
  out += fmt::format("  {:>5}  {:>9}  {:>6}  {:>8}  {:>9}  {:>9}  {:<26} {}\n", "step", "ms",
                     "share", "bound", "MB", "GFLOP", "form", "what (launches)");
  for (const CostItem *i : order)
    out += fmt::format("  {:>5}  {:>9.4f}  {:>5.1f}%  {:>8}  {:>9.2f}  {:>9.3f}  {:<26} {} ({})\n",
                       i->step, i->seconds * 1e3,
                       r.seconds > 0 ? 100.0 * i->seconds / r.seconds : 0.0, i->bound,
                       i->bytes / 1e6, i->flops / 1e9, i->form, i->what, i->launches);
  return out;
}

} // namespace kiln::gpu
