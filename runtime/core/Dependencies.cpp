//===- Dependencies.cpp - What each step reads, writes and waits for ------===//
//
// The compiler builds a schedule as an ordered list of steps; plan v2 also
// records, per step, the earlier steps it must wait for, so that a backend
// with several queues (streams) may overlap steps that do not touch the same
// memory. Buffers alias where their byte ranges overlap (liveness reuses
// scratch memory), so conflicts are found on byte ranges, then kept compact:
// a step waits for the last writer of memory it touches and for the readers
// of memory it writes since that write; everything earlier is implied
// transitively.
//
//===----------------------------------------------------------------------===//
#include "runtime/core/Program.h"

#include <algorithm>

#include <fmt/format.h>

namespace kiln::program {

namespace {
/// A kernel call's reads and writes, by its table entry (inputs
/// [0, numInputs), and the positions it writes).
void kernelAccesses(const Kernel &k, const std::vector<int> &args, std::vector<int> &reads,
                    std::vector<int> &writes) {
  int inputs = k.numInputs > 0 ? std::min<int>(k.numInputs, int(args.size())) : int(args.size());
  for (int i = 0; i < inputs; ++i)
    reads.push_back(args[size_t(i)]);
  if (k.writes.empty()) { // no record: every output and every input may be written
    for (int id : args)
      writes.push_back(id);
    return;
  }
  for (int w : k.writes)
    if (w >= 0 && size_t(w) < args.size())
      writes.push_back(args[size_t(w)]);
}
/// Whether two stages can meet on one device (-1: every device's).
bool together(int a, int b) { return a < 0 || b < 0 || a == b; }
} // namespace

void stepAccesses(const Program &p, const Step &s, std::vector<int> &reads,
                  std::vector<int> &writes) {
  switch (s.kind) {
  case Step::Kernel:
    kernelAccesses(p.kernels[size_t(s.kernel)], s.args, reads, writes);
    break;
  case Step::Gemm:
    reads.insert(reads.end(), {s.args[0], s.args[1]});
    writes.push_back(s.args[2]);
    if (s.epilogue >= 0)
      kernelAccesses(p.kernels[size_t(s.epilogue)], s.epilogueArgs, reads, writes);
    if (s.lt.valid()) {
      if (s.lt.bias >= 0)
        reads.push_back(s.lt.bias);
      writes.push_back(s.lt.out);
      if (s.lt.aux >= 0)
        writes.push_back(s.lt.aux);
    }
    break;
  case Step::Copy:
    reads.push_back(s.args[0]);
    writes.push_back(s.args[1]);
    break;
  case Step::Attention: {
    size_t o = size_t(s.attention.firstOutput());
    reads.insert(reads.end(), s.args.begin(), s.args.begin() + long(o));
    writes.insert(writes.end(), s.args.begin() + long(o), s.args.end());
    break;
  }
  case Step::Collective:
    if (s.collective.op != Collective::Op::Recv)
      reads.push_back(s.args[0]);
    if (s.collective.op != Collective::Op::Send)
      writes.push_back(s.args.back());
    break;
  }
}

void computeDependencies(const Program &p, Function &f) {
  size_t n = p.buffers.size();
  // Which buffers share memory with each buffer (itself included).
  // Every device runs the same steps on its own buffer plan, whose offsets
  // may differ: two buffers conflict if they overlap on any device.
  std::vector<std::vector<int>> overlaps(n);
  for (size_t i = 0; i < n; ++i)
    overlaps[i].push_back(int(i));
  for (int d = 0; d < p.numDevices(); ++d) {
    const std::vector<Buffer> &bs = p.plan(d).buffers;
    std::vector<int> order(n);
    for (size_t i = 0; i < n; ++i)
      order[i] = int(i);
    std::sort(order.begin(), order.end(),
              [&](int a, int b) { return bs[size_t(a)].offset < bs[size_t(b)].offset; });
    for (size_t i = 0; i < n; ++i) {
      const Buffer &a = bs[size_t(order[i])];
      for (size_t j = i + 1; j < n; ++j) {
        const Buffer &b = bs[size_t(order[j])];
        if (b.offset >= a.offset + std::max<int64_t>(a.bytes, 1))
          break;
        if (!together(a.stage, b.stage)) // never on one device
          continue;
        overlaps[size_t(order[i])].push_back(order[j]);
        overlaps[size_t(order[j])].push_back(order[i]);
      }
    }
  }
  for (std::vector<int> &o : overlaps) {
    std::sort(o.begin(), o.end());
    o.erase(std::unique(o.begin(), o.end()), o.end());
  }
  std::vector<int> lastWriter(n, -1);
  std::vector<std::vector<int>> readersSince(n);
  std::vector<int> reads, writes;
  for (size_t si = 0; si < f.steps.size(); ++si) {
    Step &s = f.steps[si];
    reads.clear();
    writes.clear();
    stepAccesses(p, s, reads, writes);
    std::vector<int> deps;
    for (int r : reads)
      for (int b : overlaps[size_t(r)])
        if (lastWriter[size_t(b)] >= 0)
          deps.push_back(lastWriter[size_t(b)]);
    for (int w : writes)
      for (int b : overlaps[size_t(w)]) {
        if (lastWriter[size_t(b)] >= 0)
          deps.push_back(lastWriter[size_t(b)]);
        deps.insert(deps.end(), readersSince[size_t(b)].begin(), readersSince[size_t(b)].end());
      }
    // A step of another stage runs on none of this one's devices: wait for
    // what it waited for instead (those its own devices run).
    for (size_t k = 0; k < deps.size(); ++k) {
      const Step &d = f.steps[size_t(deps[k])];
      if (!together(d.stage, s.stage)) {
        deps.insert(deps.end(), d.deps.begin(), d.deps.end());
        deps[k] = -1;
      }
    }
    deps.erase(std::remove(deps.begin(), deps.end(), -1), deps.end());
    std::sort(deps.begin(), deps.end());
    deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
    deps.erase(std::remove(deps.begin(), deps.end(), int(si)), deps.end());
    s.queue = 0;
    s.deps = std::move(deps);
    for (int r : reads)
      readersSince[size_t(r)].push_back(int(si));
    // Memory it writes now holds this step's data, in every buffer that
    // overlaps it: later accesses wait for this step (which waited for
    // everything before on that memory).
    for (int w : writes)
      for (int b : overlaps[size_t(w)]) {
        lastWriter[size_t(b)] = int(si);
        readersSince[size_t(b)].clear();
      }
  }
}

void exactDependencies(const Program &p, Function &f) {
  size_t n = f.steps.size();
  std::vector<std::vector<int>> reads(n), writes(n);
  for (size_t i = 0; i < n; ++i)
    stepAccesses(p, f.steps[i], reads[i], writes[i]);
  auto overlap = [&](int a, int b) {
    if (!together(p.buffers[size_t(a)].stage, p.buffers[size_t(b)].stage))
      return false;
    for (int d = 0; d < p.numDevices(); ++d) {
      const Buffer &x = p.plan(d).buffers[size_t(a)], &y = p.plan(d).buffers[size_t(b)];
      if (x.offset < y.offset + std::max<int64_t>(y.bytes, 1) &&
          y.offset < x.offset + std::max<int64_t>(x.bytes, 1))
        return true;
    }
    return false;
  };
  auto conflict = [&](const std::vector<int> &xs, const std::vector<int> &ys) {
    for (int x : xs)
      for (int y : ys)
        if (overlap(x, y))
          return true;
    return false;
  };
  // after[j]: every step j waits for, directly or through others (a bit set).
  size_t words = (n + 63) / 64;
  std::vector<std::vector<uint64_t>> after(n, std::vector<uint64_t>(words, 0));
  for (size_t j = 0; j < n; ++j) {
    std::vector<uint64_t> &covered = after[j];
    std::vector<int> deps;
    for (size_t i = j; i-- > 0;) {
      if (covered[i / 64] >> (i % 64) & 1)
        continue;
      if (!together(f.steps[i].stage, f.steps[j].stage)) // never on one device
        continue;
      if (!conflict(writes[j], reads[i]) && !conflict(writes[j], writes[i]) &&
          !conflict(reads[j], writes[i]))
        continue;
      deps.push_back(int(i));
      for (size_t w = 0; w < words; ++w)
        covered[w] |= after[i][w];
      covered[i / 64] |= uint64_t(1) << (i % 64);
    }
    std::sort(deps.begin(), deps.end());
    f.steps[j].deps = std::move(deps);
  }
}

ScheduleShape scheduleShape(const Function &f) {
  ScheduleShape shape;
  shape.steps = f.steps.size();
  std::vector<size_t> level(f.steps.size(), 0), width;
  for (size_t i = 0; i < f.steps.size(); ++i) {
    for (int d : f.steps[i].deps)
      if (d >= 0 && size_t(d) < i)
        level[i] = std::max(level[i], level[size_t(d)] + 1);
    if (level[i] >= width.size())
      width.resize(level[i] + 1, 0);
    shape.widest = std::max(shape.widest, ++width[level[i]]);
  }
  shape.depth = width.size();
  return shape;
}

std::string scheduleNote(const Function &f, size_t i) {
  const Step &s = f.steps[i];
  bool crossing = s.queue != 0;
  for (int d : s.deps)
    crossing |= f.steps[size_t(d)].queue != s.queue;
  if (!crossing)
    return "";
  return fmt::format("[queue {}{}{}]", s.queue, s.deps.empty() ? "" : ", after ",
                     fmt::join(s.deps, " "));
}

} // namespace kiln::program
