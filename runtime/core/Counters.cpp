//===- Counters.cpp - What one call of an entry point costs, by count -----===//
#include "runtime/core/Counters.h"

#include "runtime/core/GemmPlan.h"
#include "runtime/core/GpuCost.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include <nlohmann/json.hpp>

namespace kiln::program {
namespace {

using json = nlohmann::ordered_json;

int64_t argBytes(const Program &p, const std::vector<int> &args) {
  int64_t b = 0;
  for (int a : args)
    if (a >= 0 && size_t(a) < p.buffers.size())
      b += p.buffers[size_t(a)].bytes;
  return b;
}

/// Adds one call of generated kernel `k` (its FLOPs and fused ops).
void addKernel(const Program &p, int k, FunctionCounters &c) {
  ++c.kernels;
  if (k < 0 || size_t(k) >= p.kernels.size())
    return;
  const Kernel &kernel = p.kernels[size_t(k)];
  c.flops += kernel.flops;
  if (kernel.ops.size() > 1)
    c.fusedOps += int64_t(kernel.ops.size());
}

int64_t launchesOf(const std::vector<std::vector<gpu::Launch>> &launches,
                   int k) {
  return k >= 0 && size_t(k) < launches.size()
             ? int64_t(launches[size_t(k)].size())
             : 0;
}

} // namespace

Counters countPlan(const Program &p,
                   const std::vector<std::vector<gpu::Launch>> *cudaLaunches,
                   gpu::GemmPlanForm gemmForm) {
  Counters out;
  out.devices = p.numDevices();
  out.queues = p.queues;
  int64_t persistent = 0;
  int largest = 0; // the device counted: with pipeline stages, its steps
  for (int d = 0; d < p.numDevices(); ++d) {
    const BufferPlan &bp = p.plan(d);
    if (bp.arenaBytes > out.arenaBytes) {
      largest = d;
      out.arenaBytes = bp.arenaBytes;
      out.persistentBytes = bp.persistentBytes;
    }
    persistent = std::max(persistent, bp.persistentBytes);
  }
  for (const Function &f : p.functions) {
    FunctionCounters c;
    c.function = f.name;
    c.steps = 0;
    c.peakBytes = persistent + f.scratchBytes;
    if (cudaLaunches)
      c.cudaLaunches = c.cudaGemmCalls = 0;
    for (const Step &s : f.steps) {
      if (!p.runs(largest, s)) // another pipeline stage's
        continue;
      ++c.steps;
      switch (s.kind) {
      case Step::Kernel:
        addKernel(p, s.kernel, c);
        c.bytes += int64_t(kernelTrafficBytes(p, s.kernel, s.args));
        if (cudaLaunches)
          c.cudaLaunches += launchesOf(*cudaLaunches, s.kernel);
        break;
      case Step::Gemm:
        ++c.gemms;
        c.flops += int64_t(gemmFlops(s.gemm));
        c.bytes += argBytes(p, s.args);
        if (cudaLaunches) {
          int64_t calls = gpu::gemmCalls(s.gemm, gemmForm).calls;
          c.cudaGemmCalls += calls;
          c.cudaLaunches += calls;
        }
        if (s.epilogue >= 0) {
          addKernel(p, s.epilogue, c);
          c.bytes += int64_t(kernelTrafficBytes(p, s.epilogue, s.epilogueArgs));
          if (cudaLaunches && !s.lt.valid())
            c.cudaLaunches += launchesOf(*cudaLaunches, s.epilogue);
        }
        break;
      case Step::Copy:
        ++c.copies;
        c.bytes += argBytes(p, s.args);
        break;
      case Step::Attention:
        ++c.attention;
        c.flops += int64_t(attentionFlops(s.attention));
        c.bytes += argBytes(p, s.args);
        if (cudaLaunches)
          c.cudaLaunches += 1;
        break;
      case Step::Collective:
        ++c.collectives;
        c.collectiveBytes += s.collective.bytes;
        break;
      }
    }
    if (cudaLaunches)
      for (const gpu::DeviceSpec &d : gpu::DeviceSpec::table()) {
        std::string key;
        for (char ch : d.name)
          key += ch == '-' ? '_' : char(std::tolower(static_cast<unsigned char>(ch)));
        gpu::CostOptions o;
        o.gemmSplit = [gemmForm](const GemmParams &g) { return gpu::gemmCalls(g, gemmForm); };
        double ms = gpu::predict(p, f, *cudaLaunches, d, o).seconds * 1e3;
        c.gpuMs.emplace_back(key, std::round(ms * 1e3) / 1e3);
      }
    out.functions.push_back(std::move(c));
  }
  return out;
}

std::string Counters::toJson() const {
  json fs = json::object();
  for (const FunctionCounters &c : functions) {
    json f = {{"steps", c.steps},
              {"kernels", c.kernels},
              {"gemms", c.gemms},
              {"copies", c.copies},
              {"flops", c.flops},
              {"bytes", c.bytes},
              {"collectives", c.collectives},
              {"collective_bytes", c.collectiveBytes},
              {"peak_bytes", c.peakBytes},
              {"fused_ops", c.fusedOps}};
    if (c.attention > 0) // absent in plans without fused attention
      f["attention"] = c.attention;
    if (c.cudaLaunches >= 0) {
      f["cuda_launches"] = c.cudaLaunches;
      f["cuda_gemm_calls"] = c.cudaGemmCalls;
    }
    for (const auto &[device, ms] : c.gpuMs)
      f["gpu_ms_" + device] = ms;
    fs[c.function] = std::move(f);
  }
  json j = {{"devices", devices},
            {"queues", queues},
            {"arena_bytes", arenaBytes},
            {"persistent_bytes", persistentBytes},
            {"functions", std::move(fs)}};
  return j.dump(2) + "\n";
}

} // namespace kiln::program
