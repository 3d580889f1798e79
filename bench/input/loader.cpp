// Input pipeline throughput (issue 17, part C): batches per second that
// kiln-run's loader (DataSource + Prefetcher, the trainer's pipeline) makes
// for a model's training data, for each worker count and prefetch depth,
// with a consumer that takes batches as fast as they come (so the loader is
// the bottleneck), and optionally a step of S ms of sleep per batch (the
// fraction of steps that still had to wait) and a slow source (P ms of
// sleep per batch in the worker, like KILN_FAULT_INJECT=slow-data@P: a
// slow file system, whose latency workers overlap).
//
//   loader MODEL.kpack DATA [--batches N] [--workers "1 2"] [--depth "1 3 8"]
//          [--shuffle-buffer N] [--step-ms S] [--slow-ms P]
//
// Built and run by bench/input/run.sh.
#include "runtime/core/Data.h"
#include "runtime/train/DataSource.h"
#include "runtime/train/Model.h"

#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace kiln;
using Clock = std::chrono::steady_clock;

static std::vector<int> ints(const std::string &s) {
  std::vector<int> v;
  std::stringstream ss(s);
  for (int x; ss >> x;)
    v.push_back(x);
  return v;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fmt::print(
        stderr,
        "usage: loader MODEL.kpack DATA [--batches N] [--workers \"1 2\"] "
        "[--depth \"1 3 8\"] [--shuffle-buffer N] [--step-ms S]\n");
    return 1;
  }
  std::string kpack = argv[1], data = argv[2];
  int batches = 2000;
  std::vector<int> workers = {1, 2}, depths = {1, 3, 8};
  int64_t shuffleBuffer = 0;
  double stepMs = 0, slowMs = 0;
  for (int i = 3; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--batches")
      batches = std::atoi(v.c_str());
    else if (a == "--workers")
      workers = ints(v);
    else if (a == "--depth")
      depths = ints(v);
    else if (a == "--shuffle-buffer")
      shuffleBuffer = std::atoll(v.c_str());
    else if (a == "--step-ms")
      stepMs = std::atof(v.c_str());
    else if (a == "--slow-ms")
      slowMs = std::atof(v.c_str());
  }
  auto model = train::Model::open(kpack);
  if (!model) {
    fmt::print(stderr, "{}\n", model.status().message());
    return 1;
  }
  auto t0 = Clock::now();
  auto src = train::openData(data, **model, "train_step", 1337, true,
                             "training", {}, shuffleBuffer);
  double openS = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!src) {
    fmt::print(stderr, "{}\n", src.status().message());
    return 1;
  }
  size_t bytes = 0;
  for (const std::string &b : (*src)->batch(0).bytes)
    bytes += b.size();
  fmt::print(
      "{}: {}\n  opened in {:.3f} s; {} KiB per batch; {} batches per "
      "run{}{}\n",
      kpack, (*src)->describe(), openS, bytes / 1024, batches,
      stepMs > 0 ? fmt::format("; a step of {} ms per batch", stepMs) : "",
      slowMs > 0 ? fmt::format("; {} ms more to make each", slowMs) : "");
  fmt::print("  {:>7} {:>5} {:>11} {:>9} {:>10}\n", "workers", "depth",
             "batches/s", "MiB/s", "waited");
  for (int w : workers)
    for (int d : depths) {
      data::PrefetchOptions o;
      o.workers = w;
      o.depth = size_t(d);
      const train::DataSource *s = src->get();
      uint64_t first = 1000; // the same batches in every configuration
      data::Prefetcher<train::Batch> p(
          [s, slowMs](uint64_t i) {
            if (slowMs > 0)
              std::this_thread::sleep_for(
                  std::chrono::duration<double, std::milli>(slowMs));
            return s->batch(i);
          },
          first, o);
      int waited = 0;
      auto start = Clock::now();
      for (int i = 0; i < batches; ++i) {
        auto w0 = Clock::now();
        auto b = p.next();
        if (!b) {
          fmt::print(stderr, "{}\n", b.status().message());
          return 1;
        }
        if (stepMs > 0) {
          waited += std::chrono::duration<double, std::milli>(Clock::now() - w0)
                        .count() > 0.05;
          std::this_thread::sleep_for(
              std::chrono::duration<double, std::milli>(stepMs));
        }
      }
      double sec = std::chrono::duration<double>(Clock::now() - start).count();
      fmt::print("  {:>7} {:>5} {:>11.0f} {:>9.1f} {:>10}\n", w, d,
                 batches / sec, double(bytes) * batches / sec / (1 << 20),
                 stepMs > 0 ? fmt::format("{:.0f}%", 100.0 * waited / batches)
                            : "-");
    }
  return 0;
}
