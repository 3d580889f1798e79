// What inter-op threads can gain at most on a model, from measured step
// times rather than wall clocks under load (docs/runtime.md "Inter-op
// threads"): runs @train_step on one CPU thread (intra-op and inter-op),
// takes each plan step's mean time from the tracer's spans, and weighs the
// exact dependency DAG (program::exactDependencies) with them:
//   - serial: the sum of the step times (what one thread does);
//   - critical path: the longest chain (no number of threads beats it);
//   - 2 and 4 threads: a list schedule of the DAG as the inter-op
//     scheduler runs it (the ready step earliest in schedule order first,
//     on the first free thread), with each step as long as alone: the
//     step time on free cores, before memory-bandwidth sharing.
// Under load every step slows down by about the same factor, so the ratios
// hold where the absolute times do not. Inputs are zeros (token 0, lr 0):
// the arithmetic, not the values, sets the time.
// Build and run from the repository root after building kiln-run:
//   g++ -O2 -std=c++17 -I. bench/interop_bound.cpp build/runtime/cpu/libKilnRuntimeCpuJit.a \
//     build/runtime/cpu/libKilnRuntimeCpu.a build/runtime/core/libKilnRuntimeCore.a \
//     -L/usr/lib/llvm-19/lib -lLLVM-19 -lopenblas -lfmt -ldl -lpthread -o build/interop_bound
//   build/interop_bound MODEL.kpack [runs]
#include "runtime/core/Package.h"
#include "runtime/core/Program.h"
#include "runtime/core/Trace.h"
#include "runtime/cpu/Executor.h"
#include "runtime/cpu/Jit.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <queue>
#include <vector>

using namespace kiln;

namespace {

/// The makespan of a list schedule of `f`'s DAG on `threads` threads, steps
/// taking `w` seconds: the ready step earliest in schedule order starts on
/// the thread that frees first.
double listSchedule(const program::Function &f, const std::vector<double> &w, int threads) {
  size_t n = f.steps.size();
  std::vector<int> remaining(n, 0);
  std::vector<std::vector<size_t>> dependents(n);
  for (size_t i = 0; i < n; ++i)
    for (int d : f.steps[i].deps) {
      remaining[i]++;
      dependents[size_t(d)].push_back(i);
    }
  std::priority_queue<size_t, std::vector<size_t>, std::greater<size_t>> ready;
  for (size_t i = 0; i < n; ++i)
    if (!remaining[i])
      ready.push(i);
  // Running steps by end time.
  using Run = std::pair<double, size_t>;
  std::priority_queue<Run, std::vector<Run>, std::greater<Run>> running;
  double now = 0;
  int free = threads;
  size_t done = 0;
  while (done < n) {
    while (free > 0 && !ready.empty()) {
      size_t i = ready.top();
      ready.pop();
      running.push({now + w[i], i});
      --free;
    }
    auto [end, i] = running.top();
    running.pop();
    now = end;
    ++free;
    ++done;
    for (size_t j : dependents[i])
      if (--remaining[j] == 0)
        ready.push(j);
  }
  return now;
}

int fail(const Status &s) {
  fmt::print(stderr, "interop_bound: {}\n", s.message());
  return 1;
}

} // namespace

int main(int argc, char **argv) {
  if (argc < 2) {
    fmt::print(stderr, "usage: interop_bound MODEL.kpack [runs]\n");
    return 1;
  }
  int runs = argc > 2 ? std::max(1, std::atoi(argv[2])) : 20;
  auto pkg = Package::open(argv[1]);
  if (!pkg)
    return fail(pkg.status());
  cpu::JitOptions jo;
  jo.cacheDir = cpu::defaultCacheDir();
  auto lib = cpu::KernelLibrary::load(pkg->cpuBitcode, argv[1], jo);
  if (!lib)
    return fail(lib.status());
  auto e = cpu::Executor::create(pkg->program, std::move(*lib), 1);
  if (!e)
    return fail(e.status());
  Tracer tracer;
  (*e)->setTracer(&tracer);
  for (int i = 0; i < 3; ++i) // warm-up: caches, page faults
    if (Status s = (*e)->run("train_step"); !s)
      return fail(s);
  tracer.setEnabled(true);
  for (int i = 0; i < runs; ++i)
    if (Status s = (*e)->run("train_step"); !s)
      return fail(s);
  program::Function f = *pkg->program.function("train_step");
  program::exactDependencies(pkg->program, f);
  std::vector<double> w(f.steps.size(), 0.0);
  for (const Span &s : tracer.spans())
    if (s.function == "train_step" && s.planStep >= 0 && size_t(s.planStep) < w.size())
      w[size_t(s.planStep)] += s.seconds / runs;
  double serial = 0;
  std::vector<double> finish(f.steps.size(), 0.0);
  double path = 0;
  for (size_t i = 0; i < f.steps.size(); ++i) {
    double start = 0;
    for (int d : f.steps[i].deps)
      start = std::max(start, finish[size_t(d)]);
    finish[i] = start + w[i];
    path = std::max(path, finish[i]);
    serial += w[i];
  }
  program::ScheduleShape g = program::scheduleShape(f);
  fmt::print("{}: @train_step, {} steps on {} levels (widest {}), one thread, mean of {} runs\n",
             argv[1], g.steps, g.depth, g.widest, runs);
  fmt::print("  serial (sum of step times): {:8.2f} ms\n", serial * 1e3);
  fmt::print("  critical path:              {:8.2f} ms  (at most {:.2f}x from inter-op threads)\n",
             path * 1e3, serial / path);
  for (int t : {2, 4}) {
    double m = listSchedule(f, w, t);
    fmt::print("  {} inter-op threads:          {:8.2f} ms  ({:.2f}x; steps as long as alone)\n", t,
               m * 1e3, serial / m);
  }
  return 0;
}
