//===- Commands.cpp - kiln-run's eval, sample, check, devices ----------------===//
//
// Parses the flags of the commands that run a model, calls runtime/train,
// and prints what it reports: "kiln-run: " before notes, warnings and errors
// on stderr, a checkpoint on Ctrl-C (exit 130).
//
//===----------------------------------------------------------------------===//
#include "tools/kiln-run/Commands.h"
#include "tools/kiln-run/Flags.h"


#include "runtime/core/Cpus.h"
#include "runtime/core/Machine.h"
#include "runtime/train/Check.h"
#include "runtime/train/Devices.h"
#include "runtime/train/Evaluate.h"
#include "runtime/train/Calibrate.h"
#include "runtime/train/Launch.h"
#include "runtime/train/MultiDevice.h"
#include "runtime/train/Overview.h"
#include "runtime/train/Placement.h"
#include "runtime/train/Replicas.h"
#include "runtime/train/Sampler.h"
#include "runtime/train/TensorBoard.h"
#include "runtime/train/TraceFile.h"
#include "runtime/train/Trainer.h"
#include "runtime/train/XPlane.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <sys/stat.h>
#include <thread>
#include <time.h>
#include <unistd.h>
#include <tuple>


namespace kiln::run {

namespace {

/// Without --checkpoint, eval and sample use the artifact's initial
/// (untrained) parameters: a warning says so, and names the checkpoint a
/// training run of the artifact saved by default, if there is one.
void warnUntrained(const Flags &f, const char *doing) {
  std::string trained = train::defaultCheckpoint(f.artifact);
  struct stat st;
  bool saved = ::stat(trained.c_str(), &st) == 0;
  fmt::print(stderr,
             "kiln-run: warning: no --checkpoint: {} {}'s initial (untrained) parameters{}\n",
             doing, f.artifact,
             saved ? fmt::format("; training saved {}: add --checkpoint {}", trained, trained)
                   : "");
}
} // namespace

int evalCommand(const std::vector<std::string> &args) {
  Flags f;
  std::unique_ptr<train::Model> model;
  if (int rc = begin(args, f, model))
    return rc;
  if (f.logPlacement)
    logPlacement(*model, "eval_step");
  if (f.checkpoint.empty())
    if (model->prog().numDevices() == 1) // else refused below, before any parameters
      warnUntrained(f, "evaluating");
  train::EvalOptions o;
  o.checkpoint = f.checkpoint;
  o.data = f.data;
  o.valData = f.valData;
  o.evalSteps = f.evalSteps;
  o.seed = seedOf(f);
  o.quiet = f.quiet;
  o.profile = f.profile;
  auto r = train::evaluateModel(*model, o, backendFor(f), print);
  if (!r)
    return fail(r.status());
  const train::EvalResult &e = r->result;
  fmt::print("{}: loss {:.4f}{} over {} batches of {}\n",
             f.checkpoint.empty() ? f.artifact + " (initial parameters)" : f.checkpoint,
             e.loss, e.accuracy >= 0 ? fmt::format(", accuracy {:.2f}%", 100 * e.accuracy) : "",
             e.batches, r->data);
  return 0;
}

int sampleCommand(const std::vector<std::string> &args) {
  Flags f;
  std::unique_ptr<train::Model> model;
  if (int rc = begin(args, f, model))
    return rc;
  f.quiet = true;
  if (f.checkpoint.empty())
    if (model->prog().numDevices() == 1) // else refused below
      warnUntrained(f, "sampling from");
  train::SampleOptions o;
  o.checkpoint = f.checkpoint;
  o.vocab = f.vocab;
  o.prompt = f.prompt;
  o.promptGiven = f.promptGiven;
  o.tokens = f.tokens;
  o.temperature = f.temperature;
  o.topK = f.topK;
  o.seed = seedOf(f);
  o.profile = f.profile;
  auto text = train::sample(*model, o, backendFor(f), print);
  if (!text)
    return fail(text.status());
  fmt::print("{}\n", *text);
  return 0;
}

int checkCommand(const std::vector<std::string> &args) {
  Flags f;
  std::unique_ptr<train::Model> model;
  if (int rc = begin(args, f, model))
    return rc;
  if (f.device == "cpu")
    f.device = "cuda-emu";
  train::Model &m = *model;
  // Two backends on the same artifact: the reference and the one checked.
  Flags rf = f;
  rf.device = f.against;
  rf.quiet = true;
  train::Model ref;
  ref.pkg = m.pkg;
  if (Status s = ref.compile(backendFor(rf), rf.profile); !s)
    return fail(s);
  if (Status s = m.compile(backendFor(f), f.profile); !s)
    return fail(s);
  train::CheckOptions o;
  o.tolerance = f.tolerance;
  o.seed = seedOf(f);
  auto r = train::check(m, ref, o, print);
  if (!r)
    return fail(r.status());
  return r->failures ? 1 : 0;
}

int devicesCommand(const std::vector<std::string> &args) {
  bool calibrate = false;
  int devices = 1;
  std::string out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string &a = args[i];
    bool hasValue = i + 1 < args.size();
    if (a == "--calibrate") {
      calibrate = true;
    } else if (a == "--devices" && hasValue) {
      char *end = nullptr;
      long n = std::strtol(args[++i].c_str(), &end, 10);
      if (*end || n < 1 || n > 1024) {
        fmt::print(stderr, "kiln-run: error: --devices takes a count from 1 to 1024, got '{}'\n",
                   args[i]);
        return 1;
      }
      devices = int(n);
    } else if (a == "-o" && hasValue) {
      out = args[++i];
    } else {
      fmt::print(stderr,
                 "kiln-run: error: devices takes [--calibrate [--devices N] [-o FILE]], got "
                 "'{}'\n",
                 a);
      return 1;
    }
  }
  if (!calibrate && (devices != 1 || !out.empty())) {
    fmt::print(stderr, "kiln-run: error: --devices and -o go with --calibrate\n");
    return 1;
  }
  if (!calibrate) {
    fmt::print("backends in this kiln-run: {}\n", train::availableDevices());
    for (const std::string &line : train::describeGpus())
      fmt::print("{}\n", line);
    return 0;
  }
  // The machine as the planner sees it, measured once for N in-process
  // devices (kilnc --parallel=auto --machine FILE reads it).
  planner::Machine m;
  std::string error;
  if (!train::measureMachine(devices, m, error)) {
    fmt::print(stderr, "kiln-run: error: cannot measure this machine: {}\n", error);
    return 1;
  }
  std::string text = planner::machineFileText(m);
  if (out.empty() || out == "-") {
    fmt::print("{}", text);
    return 0;
  }
  std::string tmp = out + ".tmp";
  FILE *f = std::fopen(tmp.c_str(), "w");
  bool ok = f && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  ok = f && std::fclose(f) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), out.c_str()) != 0) {
    std::remove(tmp.c_str());
    fmt::print(stderr, "kiln-run: error: cannot write {}: {}\n", out, std::strerror(errno));
    return 1;
  }
  fmt::print("kiln-run: wrote {}: {} devices, {} cores, {:.1f} GFLOP/s, {:.1f} GB/s, all_reduce "
             "{:.1f} us + {:.2f} GB/s bus\n",
             out, m.devices, m.cores, m.machineFlops / 1e9, m.machineBandwidth / 1e9,
             m.commLatency * 1e6, m.commBusBandwidth / 1e9);
  return 0;
}

} // namespace kiln::run
