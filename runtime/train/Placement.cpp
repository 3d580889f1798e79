//===- Placement.cpp - Where each step of an entry point runs -------------===//
#include "runtime/train/Placement.h"

#include <fmt/format.h>

#include <algorithm>

namespace kiln::train {

using program::Collective;
using program::Program;
using program::Step;

namespace {

/// The devices of stage `stage` ("0,1"), or every device for -1.
std::string devicesOf(const Program &p, int stage) {
  std::vector<int> ds;
  for (int d = 0; d < p.numDevices(); ++d)
    if (stage < 0 || p.stageOf(d) == stage)
      ds.push_back(d);
  return fmt::format("{}", fmt::join(ds, ","));
}

/// "m.kiln:12" of "m.kiln:12:5" (the line, not the column).
std::string lineOf(const std::string &loc) {
  size_t last = loc.rfind(':');
  if (last == std::string::npos || last == 0)
    return loc;
  size_t before = loc.rfind(':', last - 1);
  return before == std::string::npos ? loc : loc.substr(0, last);
}

/// "stage 1" over "pp", "dp 1" over another axis, "device 3" in a group.
std::string peerName(const Collective &c) {
  if (c.axis == "pp")
    return fmt::format("stage {}", c.peer);
  if (!c.axis.empty())
    return fmt::format("{} {}", c.axis, c.peer);
  return fmt::format("device {}", c.group.empty() ? c.peer : c.group[size_t(c.peer)]);
}

std::string kernelName(const Program &p, int k) {
  const program::Kernel &kn = p.kernels[size_t(k)];
  return kn.op.empty() ? kn.symbol : fmt::format("{} ({})", kn.symbol, kn.op);
}

} // namespace

std::string placementOf(const Program &p, const Step &s) {
  if (s.stage >= 0)
    return fmt::format("stage {} (device{} {})", s.stage,
                       p.numDevices() / p.numStages() == 1 ? "" : "s", devicesOf(p, s.stage));
  return p.numDevices() == 1 ? "device 0" : "all devices";
}

std::string describeStep(const Program &p, const Step &s) {
  switch (s.kind) {
  case Step::Kernel:
    return "kernel " + kernelName(p, s.kernel);
  case Step::Gemm:
    return program::gemmLabel(s.gemm) +
           (s.epilogue >= 0 ? " + kernel " + kernelName(p, s.epilogue) : "");
  case Step::Copy:
    return fmt::format("copy {} B", p.buffers[size_t(s.args[0])].bytes);
  case Step::Attention:
    return program::attentionLabel(s.attention);
  case Step::Collective:
    break;
  }
  const Collective &c = s.collective;
  const char *op = program::collectiveOpName(c.op);
  switch (c.op) {
  case Collective::Op::Send:
    return fmt::format("send {} B to {}", c.bytes, peerName(c));
  case Collective::Op::Recv:
    return fmt::format("recv {} B from {}", c.bytes, peerName(c));
  case Collective::Op::Broadcast:
    return fmt::format("broadcast {} B from {}", c.bytes, peerName(c));
  default:
    break;
  }
  std::string over = c.axis.empty() ? fmt::format("devices {}", fmt::join(c.group, ","))
                                    : c.axis;
  return fmt::format("{} {} B over {}{}", op, c.bytes, over,
                     c.reduction == Collective::Reduction::None
                         ? ""
                         : fmt::format(" ({})", program::reductionName(c.reduction)));
}

std::vector<std::string> placementLines(const Program &p, const std::string &fn) {
  std::vector<std::string> out;
  const program::Function *f = p.function(fn);
  if (!f)
    return out;
  std::vector<std::string> axes;
  for (const program::MeshAxis &a : p.mesh.axes)
    axes.push_back(fmt::format("{}={}", a.name, a.size));
  out.push_back(fmt::format("placement of @{}: {} step{} on {} device{}{}", fn, f->steps.size(),
                            f->steps.size() == 1 ? "" : "s", p.numDevices(),
                            p.numDevices() == 1 ? "" : "s",
                            axes.empty() ? "" : fmt::format(" (mesh {})", fmt::join(axes, " x "))));
  std::vector<std::string> where(f->steps.size()), what(f->steps.size());
  size_t whereWidth = 0, whatWidth = 0;
  for (size_t i = 0; i < f->steps.size(); ++i) {
    where[i] = placementOf(p, f->steps[i]);
    what[i] = describeStep(p, f->steps[i]);
    whereWidth = std::max(whereWidth, where[i].size());
    whatWidth = std::max(whatWidth, what[i].size());
  }
  int indexWidth = int(std::to_string(f->steps.size()).size());
  for (size_t i = 0; i < f->steps.size(); ++i) {
    std::string line = fmt::format("  {:>{}}  {:<{}}  {:<{}}  {}", i, indexWidth, where[i],
                                   whereWidth, what[i], whatWidth,
                                   f->steps[i].loc.empty() ? "-" : lineOf(f->steps[i].loc));
    while (!line.empty() && line.back() == ' ')
      line.pop_back();
    out.push_back(line);
  }
  // Per stage: what its devices run (its steps and every device's).
  for (int st = 0; st < p.numStages(); ++st) {
    int64_t steps = 0, kernels = 0, gemms = 0, sends = 0, recvs = 0, sent = 0, arena = 0;
    for (const Step &s : f->steps) {
      if (s.stage >= 0 && s.stage != st)
        continue;
      ++steps;
      kernels += s.kind == Step::Kernel || (s.kind == Step::Gemm && s.epilogue >= 0);
      gemms += s.kind == Step::Gemm;
      if (s.kind == Step::Collective && s.collective.op == Collective::Op::Send) {
        ++sends;
        sent += s.collective.bytes;
      }
      recvs += s.kind == Step::Collective && s.collective.op == Collective::Op::Recv;
    }
    for (int d = 0; d < p.numDevices(); ++d)
      if (p.stageOf(d) == st)
        arena = std::max(arena, p.plan(d).arenaBytes);
    std::string who = p.numStages() > 1
                          ? fmt::format("stage {} (device{} {})", st,
                                        p.numDevices() / p.numStages() == 1 ? "" : "s",
                                        devicesOf(p, st))
                          : fmt::format("device{} {}", p.numDevices() == 1 ? "" : "s",
                                        devicesOf(p, -1));
    out.push_back(fmt::format("  {}: {} steps, {} kernels, {} GEMMs, {} sends, {} recvs, {} B "
                              "sent, arena {:.2f} MiB ({} B)",
                              who, steps, kernels, gemms, sends, recvs, sent,
                              double(arena) / (1 << 20), arena));
  }
  return out;
}

} // namespace kiln::train
