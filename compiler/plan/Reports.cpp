//===- Reports.cpp - The plan reports ------------------------------------===//
//
// What kilnc --emit=plan and --fusion-report print: the arena, every step
// with its buffers, dependencies and overlap, ZeRO's memory, the kernels
// and every refused fusion.
//
//===----------------------------------------------------------------------===//
#include "compiler/Generator.h"

#include "dialects/kiln/KilnDialect.h"
#include "dialects/kiln/KilnOps.h"
#include "dialects/kiln/Sharding.h"
#include "dialects/kiln/TrainSettings.h"
#include "passes/Fusion.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/ScopeExit.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SmallPtrSet.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

using namespace mlir;


namespace kiln {

using program::Buffer;
using program::DType;
using program::Role;
using program::Step;

namespace {
/// The three rows of `m`, each line starting with `indent`.
void printZeroRows(const ZeroMemory &m, llvm::raw_ostream &os, const std::string &indent) {
  double psi = double(std::max<int64_t>(m.psi, 1));
  auto per = [&](int64_t b) { return fmt::format("{:g}", double(b) / psi); };
  auto mib = [](int64_t b) { return fmt::format("{:.2f} MiB", double(b) / (1 << 20)); };
  os << fmt::format("{}  plain DP  {:>12} bytes ({}), {} Psi\n", indent, m.plainDP(),
                    mib(m.plainDP()), per(m.plainDP()));
  os << fmt::format("{}  ZeRO-1    {:>12} bytes ({}), {} Psi: optimizer state / N\n", indent,
                    m.zero1(), mib(m.zero1()), per(m.zero1()));
  os << fmt::format("{}  ZeRO-2    {:>12} bytes ({}), {} Psi: gradients and optimizer state / N\n",
                    indent, m.zero2(), mib(m.zero2()), per(m.zero2()));
}

/// "params 4 Psi + gradients 4 Psi + optimizer state 8 Psi" for `m`.
std::string zeroPerPsi(const ZeroMemory &m) {
  double psi = double(std::max<int64_t>(m.psi, 1));
  auto per = [&](int64_t b) { return fmt::format("{:g}", double(b) / psi); };
  return fmt::format("params {} Psi + gradients {} Psi + optimizer state {} Psi",
                     per(m.paramBytes), per(m.gradBytes), per(m.optimizerBytes));
}
} // namespace

void printZeroMemory(const ZeroMemory &m, llvm::raw_ostream &os, const std::string &indent) {
  os << fmt::format("{}memory per device, ZeRO paper accounting (Psi = {} parameters, N = {}; "
                    "{}):\n",
                    indent, m.psi, m.devices, zeroPerPsi(m));
  printZeroRows(m, os, indent);
}

void printStageZeroMemory(const std::vector<ZeroMemory> &stages, llvm::raw_ostream &os,
                          const std::string &indent) {
  int64_t n = stages.empty() ? 1 : stages[0].devices;
  os << fmt::format("{}memory per device of each pipeline stage, ZeRO paper accounting (Psi_stage "
                    "= the parameters the stage holds, N = {} data-parallel replica{} of each "
                    "stage):\n",
                    indent, n, n == 1 ? "" : "s");
  for (size_t s = 0; s < stages.size(); ++s) {
    os << fmt::format("{}  stage {} (Psi_stage = {} parameters; {}):\n", indent, s,
                      stages[s].psi, zeroPerPsi(stages[s]));
    printZeroRows(stages[s], os, indent + "  ");
  }
}

namespace {
/// The queue-0 steps a queue-1 step `i` of `f` overlaps: those after it up
/// to the first queue-0 step that waits for it, or for a later queue-1 step
/// (which runs after it on its queue).
std::vector<size_t> overlapped(const program::Function &f, size_t i) {
  std::vector<size_t> out;
  if (f.steps[i].queue == 0)
    return out;
  for (size_t j = i + 1; j < f.steps.size(); ++j) {
    const Step &s = f.steps[j];
    if (s.queue != 0)
      continue;
    bool waits = llvm::any_of(s.deps, [&](int d) {
      return size_t(d) >= i && f.steps[size_t(d)].queue == f.steps[i].queue;
    });
    if (waits)
      break;
    out.push_back(j);
  }
  return out;
}
} // namespace

void printPlan(const program::Program &p, llvm::raw_ostream &os,
               const std::map<std::string, ActivationMemory> &activations) {
  auto mib = [](int64_t b) { return fmt::format("{:.2f} MiB", double(b) / (1 << 20)); };
  os << fmt::format("arena: {} bytes ({}): persistent {} bytes (parameters and "
                    "optimizer state), scratch peak {} bytes\n",
                    p.arenaBytes, mib(p.arenaBytes), p.persistentBytes,
                    p.arenaBytes - p.persistentBytes);
  int64_t split = 0;
  for (const program::Kernel &k : p.kernels)
    split += k.chunks > 1;
  os << fmt::format("kernels: {} distinct, {} of them split into row pieces for threads\n",
                    p.kernels.size(), split);
  if (p.mesh.numDevices() > 1) {
    std::string axes;
    for (const program::MeshAxis &a : p.mesh.axes)
      axes += fmt::format("{}{}={}", axes.empty() ? "" : " x ", a.name, a.size);
    int pp = p.mesh.axis("pp") >= 0 ? int(p.mesh.axes[size_t(p.mesh.axis("pp"))].size) : 1;
    os << fmt::format("mesh: {} ({} devices{}); {} queue{}\n", axes, p.mesh.numDevices(),
                      pp > 1 ? "" : ", each with this arena", p.queues,
                      p.queues == 1 ? "" : "s");
    if (pp > 1) {
      // Pipeline stages: each stage's devices hold its own arena and run
      // its own steps of each function.
      int per = p.mesh.numDevices() / pp;
      for (int st = 0; st < pp; ++st) {
        const program::BufferPlan &bp = p.plan(st * per);
        std::string devs;
        for (int d = st * per; d < (st + 1) * per; ++d)
          devs += (devs.empty() ? "" : ",") + std::to_string(d);
        int64_t held = 0; // parameters and optimizer state this stage holds
        for (const Buffer &b : bp.buffers)
          if ((b.role == Role::Param || b.role == Role::State) && (b.stage < 0 || b.stage == st))
            held += (b.bytes + 63) / 64 * 64;
        os << fmt::format("  stage {} (device{} {}): arena {} bytes ({}): persistent {} bytes, "
                          "scratch peak {} bytes\n",
                          st, per > 1 ? "s" : "", devs, bp.arenaBytes, mib(bp.arenaBytes), held,
                          bp.arenaBytes - held);
        for (const program::Function &f : p.functions) {
          int kernels = 0, gemms = 0, copies = 0, attention = 0;
          std::map<std::string, int> coll;
          int64_t sent = 0, ncoll = 0;
          for (const program::Step &x : f.steps) {
            if (x.stage >= 0 && x.stage != st)
              continue;
            if (x.kind == Step::Kernel)
              ++kernels;
            else if (x.kind == Step::Gemm)
              ++gemms;
            else if (x.kind == Step::Copy)
              ++copies;
            else if (x.kind == Step::Attention)
              ++attention;
            else {
              ++coll[program::collectiveOpName(x.collective.op)], ++ncoll;
              if (x.collective.op == program::Collective::Op::Send)
                sent += x.collective.bytes;
            }
          }
          std::string list;
          for (auto &[name, n] : coll)
            list += fmt::format("{}{} {}", list.empty() ? "" : ", ", name, n);
          os << fmt::format("    @{}: {} kernels, {} gemms, {}{} copies, {} collectives ({}); "
                            "{} bytes sent\n",
                            f.name, kernels, gemms,
                            attention ? fmt::format("{} attention, ", attention) : "", copies,
                            ncoll, list, sent);
        }
      }
    }
    if (pp > 1) {
      std::vector<ZeroMemory> stages;
      for (int s = 0; s < pp; ++s)
        stages.push_back(zeroMemory(p, s));
      printStageZeroMemory(stages, os, "");
    } else {
      printZeroMemory(zeroMemory(p), os, "");
    }
    if (pp <= 1)
      os << fmt::format("  this plan  {:>12} bytes ({}) per device: persistent {} bytes, "
                      "scratch peak {} bytes\n",
                      p.arenaBytes, mib(p.arenaBytes), p.persistentBytes,
                      p.arenaBytes - p.persistentBytes);
  }
  auto shapeStr = [](const Buffer &b) {
    std::string s = program::dtypeName(b.dtype);
    s += "[";
    for (size_t i = 0; i < b.shape.size(); ++i)
      s += (i ? "x" : "") + std::to_string(b.shape[i]);
    return s + "]";
  };
  // Tensor-parallel buffers (listed only where there are some, so ZeRO and
  // single-device listings are unchanged).
  std::string tp;
  for (const Buffer &b : p.buffers)
    if (!b.shardAxis.empty() && b.shardDim >= 0)
      tp += fmt::format(
          "  {}: {} of logical [{}], sharded over {} on dim {}{}{}\n", b.name,
          shapeStr(b), fmt::join(b.logicalShape, "x"), b.shardAxis, b.shardDim,
          b.shardOuter > 1 ? fmt::format(" in {} parts", b.shardOuter) : "",
          b.zeroAxis.empty() ? "" : fmt::format(", then ZeRO blocks over {}", b.zeroAxis));
  if (!tp.empty())
    os << "tensor-parallel buffers (each device holds its block):\n" << tp;
  for (const program::Function &f : p.functions) {
    int64_t temps = 0, kernels = 0, gemms = 0, copies = 0, collectives = 0, attention = 0;
    for (const Step &s : f.steps)
      (s.kind == Step::Kernel       ? kernels
       : s.kind == Step::Gemm       ? gemms
       : s.kind == Step::Collective ? collectives
       : s.kind == Step::Attention  ? attention
                                    : copies)++;
    std::set<int> ids;
    for (const Step &s : f.steps)
      for (int id : llvm::concat<const int>(s.args, s.epilogueArgs))
        if (p.buffers[id].role == Role::Temp && ids.insert(id).second)
          temps += p.buffers[id].bytes;
    os << fmt::format("\n@{}: {} steps ({} kernels, {} gemms, {}{} copies{}); scratch "
                      "peak {} bytes ({}); {} bytes of temporaries without reuse\n",
                      f.name, f.steps.size(), kernels, gemms,
                      attention ? fmt::format("{} attention, ", attention) : "", copies,
                      collectives ? fmt::format(", {} collectives", collectives) : "",
                      f.scratchBytes, mib(f.scratchBytes), temps);
    if (collectives) {
      std::map<std::string, int64_t> byOp;
      int64_t reduced = 0, bucketed = 0, buckets = 0;
      for (const Step &s : f.steps) {
        if (s.kind != Step::Collective)
          continue;
        byOp[program::collectiveOpName(s.collective.op)]++;
        buckets += s.queue == 1;
        if (s.collective.op == program::Collective::Op::AllReduce) {
          reduced += s.collective.bytes;
          bucketed += s.queue == 1 ? s.collective.bytes : 0;
        }
      }
      std::string ops;
      for (auto &[op, k] : byOp)
        ops += fmt::format("{}{} {}", ops.empty() ? "" : ", ", op, k);
      os << fmt::format("  collectives per step: {} ({}); bytes all-reduced per step: {} ({} in "
                        "buckets); buckets: {} (collectives on queue 1)\n",
                        collectives, ops, reduced, bucketed, buckets);
    }
    // What --inter-op-threads runs: the DAG of exact dependencies.
    program::Function exact = f;
    program::exactDependencies(p, exact);
    if (program::ScheduleShape g = program::scheduleShape(exact); g.steps)
      os << fmt::format("  dependency DAG: {} levels, widest {} steps, {:.2f} steps per level "
                        "(what --inter-op-threads can run at once)\n",
                        g.depth, g.widest, g.meanWidth());
    if (auto it = activations.find(f.name); it != activations.end()) {
      const ActivationMemory &a = it->second;
      std::string types;
      for (auto &[t, b] : a.bytesByType)
        types += fmt::format("{}{} {} bytes", types.empty() ? "" : ", ", t, b);
      os << fmt::format("  activations saved for backward: {} bytes ({}) in {} buffers (values "
                        "the first micro-batch's loss depends on, read by backward){}{}\n",
                        a.bytes, mib(a.bytes), a.buffers, types.empty() ? "" : ": ", types);
    }
    for (size_t i = 0; i < f.steps.size(); ++i) {
      const Step &s = f.steps[i];
      std::string what = s.kind == Step::Kernel
                             ? p.kernels[s.kernel].symbol +
                                   (p.kernels[s.kernel].chunks > 1
                                        ? fmt::format(" x{}", p.kernels[s.kernel].chunks)
                                        : "")
                         : s.kind == Step::Gemm ? "gemm"
                         : s.kind == Step::Attention ? program::attentionLabel(s.attention)
                         : s.kind == Step::Collective
                             ? fmt::format("{}{} over {}",
                                           program::collectiveOpName(s.collective.op),
                                           s.collective.reduction ==
                                                   program::Collective::Reduction::None
                                               ? ""
                                               : fmt::format("({})", program::reductionName(
                                                                        s.collective.reduction)),
                                           s.collective.axis)
                             : "copy";
      std::string args;
      for (int id : s.args) {
        const Buffer &b = p.buffers[id];
        args += fmt::format(" {}{}@{}", b.name.empty() ? "" : b.name + ":",
                            shapeStr(b), b.offset);
      }
      os << fmt::format("  {:4} {:<34}{}", i, what, args);
      if (std::string sched = program::scheduleNote(f, i); !sched.empty())
        os << "  " << sched;
      if (!s.loc.empty())
        os << "  ; " << s.loc;
      os << "\n";
      if (s.kind == Step::Collective) {
        std::vector<size_t> over = overlapped(f, i);
        std::string kernels;
        for (size_t j = 0; j < over.size() && j < 4; ++j) {
          const Step &o = f.steps[over[j]];
          kernels += (j ? " " : "") + (o.kind == Step::Kernel ? p.kernels[o.kernel].symbol
                                       : o.kind == Step::Gemm ? std::string("gemm")
                                       : o.kind == Step::Attention ? std::string("attention")
                                                              : fmt::format("step{}", over[j]));
        }
        if (over.size() > 4)
          kernels += " ...";
        os << fmt::format("       {} bytes of {} per device, queue {}{}{}\n", s.collective.bytes,
                          program::dtypeName(s.collective.dtype), s.queue,
                          s.args.size() == 2 && s.args[0] == s.args[1] ? ", in place" : "",
                          s.queue == 0 ? ""
                          : over.empty()
                              ? ", overlaps nothing"
                          : over.size() == 1
                              ? fmt::format(", overlaps step {} ({})", over.front(), kernels)
                              : fmt::format(", overlaps {} steps, {}-{} ({})", over.size(),
                                            over.front(), over.back(), kernels));
      }
      if (s.kind == Step::Gemm && s.epilogue >= 0) {
        const program::Kernel &k = p.kernels[s.epilogue];
        std::string eargs;
        for (int id : s.epilogueArgs) {
          const Buffer &b = p.buffers[id];
          eargs += fmt::format(" {}{}@{}", b.name.empty() ? "" : b.name + ":", shapeStr(b),
                               b.offset);
        }
        os << fmt::format("       + epilogue {:<23}{}\n",
                          k.symbol + (k.chunks > 1 ? fmt::format(" x{}", k.chunks) : ""), eargs);
        if (s.lt.valid()) {
          auto at = [&](int id) { return fmt::format("@{}", p.buffers[id].offset); };
          std::string pre = "A B" + (s.lt.bias >= 0 ? " + bias " + at(s.lt.bias) : "");
          if (s.lt.activation != program::LtEpilogue::Activation::None)
            pre = fmt::format("{}({})", program::activationName(s.lt.activation), pre);
          os << fmt::format("         as a library epilogue (cuBLASLt): out = {} {}{}\n", pre,
                            at(s.lt.out),
                            s.lt.aux >= 0 ? ", pre-activation " + at(s.lt.aux) : "");
        }
      }
    }
  }
}

void printFusionReport(const program::Program &p, const std::vector<Refusal> &refusals,
                       const std::vector<std::string> &attentionRemarks, llvm::raw_ostream &os) {
  const program::Function *f = p.function("train_step");
  if (!f)
    f = p.functions.empty() ? nullptr : &p.functions.front();
  if (!f)
    return;
  int64_t kernels = 0, gemms = 0, epilogues = 0, copies = 0, flops = 0, bytes = 0, fused = 0,
          attention = 0;
  std::map<std::string, int64_t> byKind;
  std::string lines;
  auto where = [&](const program::Kernel &k) {
    std::vector<std::string> fileLines; // "file:line", without directories
    for (const std::string &loc : k.locs) {
      llvm::StringRef l(loc);
      size_t c = l.rfind(':');
      l = c == llvm::StringRef::npos ? l : l.take_front(c);
      size_t slash = l.rfind('/');
      std::string fl = (slash == llvm::StringRef::npos ? l : l.drop_front(slash + 1)).str();
      if (!llvm::is_contained(fileLines, fl))
        fileLines.push_back(fl);
    }
    std::string w;
    for (size_t j = 0; j < fileLines.size() && j < 4; ++j)
      w += (j ? ", " : "") + fileLines[j];
    if (fileLines.size() > 4)
      w += ", ...";
    return w;
  };
  auto opsOf = [](const program::Kernel &k) {
    std::string ops;
    for (size_t j = 0; j < k.ops.size(); ++j)
      ops += (j ? " " : "") + llvm::StringRef(k.ops[j]).drop_front(5).str();
    return ops;
  };
  auto moved = [&](const std::vector<int> &ids) {
    int64_t m = 0;
    for (int id : ids)
      m += p.buffers[id].bytes;
    return m;
  };
  for (size_t i = 0; i < f->steps.size(); ++i) {
    const Step &s = f->steps[i];
    // Kernels: in-place (tied) outputs are read and written.
    int64_t m = s.kind == Step::Kernel
                    ? int64_t(program::kernelTrafficBytes(p, s.kernel, s.args))
                    : moved(s.args);
    if (s.kind == Step::Gemm) {
      ++gemms;
      int64_t fl = 2 * s.gemm.batch * s.gemm.m * s.gemm.n * s.gemm.k;
      std::string shape = fmt::format("[{}x{}x{}]x{}{}{}", s.gemm.m, s.gemm.n, s.gemm.k,
                                      s.gemm.batch, s.gemm.transposeLhs ? " tA" : "",
                                      s.gemm.transposeRhs ? " tB" : "");
      if (s.epilogue >= 0) {
        const program::Kernel &k = p.kernels[s.epilogue];
        ++epilogues;
        fl += k.flops;
        m += int64_t(program::kernelTrafficBytes(p, s.epilogue, s.epilogueArgs));
        lines += fmt::format("  {:4} {:<20} {:<40} {:>12} flops {:>10} bytes  ; {}\n", i,
                             "gemm+epilogue", shape + " + " + k.symbol, fl, m, s.loc);
        lines += fmt::format("       epilogue: {}\n", opsOf(k));
      } else {
        lines += fmt::format("  {:4} {:<20} {:<40} {:>12} flops {:>10} bytes  ; {}\n", i,
                             "gemm", shape, fl, m, s.loc);
      }
      flops += fl;
      bytes += m;
      continue;
    }
    bytes += m;
    if (s.kind == Step::Collective) {
      lines += fmt::format("  {:4} {:<20} {:<40} {:>12} flops {:>10} bytes  ; {}\n", i,
                           "collective", program::collectiveOpName(s.collective.op), 0,
                           s.collective.bytes, s.loc);
      continue;
    }
    if (s.kind == Step::Attention) {
      ++attention;
      int64_t fl = int64_t(program::attentionFlops(s.attention));
      flops += fl;
      lines += fmt::format("  {:4} {:<20} {:<40} {:>12} flops {:>10} bytes  ; {}\n", i,
                           "attention", program::attentionLabel(s.attention), fl, m, s.loc);
      continue;
    }
    if (s.kind == Step::Copy) {
      ++copies;
      lines += fmt::format("  {:4} copy                 {:<40} {:>12} flops {:>10} bytes  ; {}\n", i,
                           p.buffers[s.args[1]].name, 0, m,
                           "fused update is not in place");
      continue;
    }
    ++kernels;
    const program::Kernel &k = p.kernels[s.kernel];
    flops += k.flops;
    byKind[k.kind]++;
    fused += k.ops.size() > 1;
    lines += fmt::format("  {:4} {:<20} {:<40} {:>12} flops {:>10} bytes  ; {}\n", i, k.kind,
                         k.symbol, k.flops, m, where(k));
    if (k.ops.size() > 1)
      lines += fmt::format("       ops: {}\n", opsOf(k));
  }
  std::string fl = flops >= 100000000 ? fmt::format("{:.2f} GFLOP", double(flops) / 1e9)
                                      : fmt::format("{:.3f} MFLOP", double(flops) / 1e6);
  std::string by = bytes >= 1000000 ? fmt::format("{:.1f} MB", double(bytes) / 1e6)
                                    : fmt::format("{:.1f} kB", double(bytes) / 1e3);
  os << fmt::format("fusion report for @{}: {} kernels ({} fused from several ops), {} "
                    "GEMMs ({} with a fused epilogue), {}{} copies; {} and {} of buffer "
                    "traffic per call (estimates)\n",
                    f->name, kernels, fused, gemms, epilogues,
                    attention ? fmt::format("{} fused attention, ", attention) : "", copies, fl,
                    by);
  os << "kernels by kind:";
  for (auto &[kind, n] : byKind)
    os << fmt::format(" {} {}", kind, n);
  os << "\n\n" << lines;
  if (!attentionRemarks.empty()) {
    os << "\nattention (kiln-raise-attention):\n";
    for (const std::string &r : attentionRemarks)
      os << "  " << r << "\n";
  }
  std::map<std::string, int64_t> byRule;
  for (const Refusal &r : refusals)
    if (r.function == f->name)
      byRule[r.rule.substr(0, r.rule.find(':'))]++;
  os << fmt::format("\nfusions refused in @{}: {}\n", f->name,
                    std::accumulate(byRule.begin(), byRule.end(), int64_t(0),
                                    [](int64_t a, auto &kv) { return a + kv.second; }));
  for (auto &[rule, n] : byRule)
    os << fmt::format("  {:<20} {}\n", rule, n);
  os << "\n";
  for (const Refusal &r : refusals)
    if (r.function == f->name)
      os << fmt::format("  refused {} ({}) -> {} ({}): {}\n", r.producer, r.producerLoc,
                        r.consumer, r.consumerLoc, r.rule);
}

} // namespace kiln
