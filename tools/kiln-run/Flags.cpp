//===- Flags.cpp - kiln-run's flags, output and stop signals -------------===//
#include "tools/kiln-run/Flags.h"
#include "tools/kiln-run/Commands.h"


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



HeldError gHeld;

int fail(const Status &s) {
  int rc = s.exitCode() ? s.exitCode() : 1;
  if (gHeld.hold) {
    if (!gHeld.status)
      gHeld.status = s;
    return rc;
  }
  fmt::print(stderr, "kiln-run: error: {}\n", s.message());
  return rc;
}
int usage(const std::string &m) {
  return fail(Status::error(m + " (see kiln-run --help)"));
}

/// Prints what runtime/train reports.
void print(Channel c, const std::string &text) {
  switch (c) {
  case Channel::Note:
    fmt::print("kiln-run: {}\n", text);
    break;
  case Channel::Line:
    fmt::print("{}\n", text);
    break;
  case Channel::Progress:
    fmt::print("{}\n", text);
    std::fflush(stdout);
    break;
  case Channel::Warning:
    fmt::print(stderr, "kiln-run: warning: {}\n", text);
    break;
  }
}


Status parseFlags(const std::vector<std::string> &args, Flags &f) {
  auto intArg = [](const std::string &name, const std::string &v, int64_t lo, int64_t &out,
                   int64_t hi = kMaxCount) -> Status {
    char *end = nullptr;
    errno = 0;
    long long x = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end || errno == ERANGE || x < lo || x > hi)
      return Status::error(
          fmt::format("{} needs an integer from {} to {}, got '{}'", name, lo, hi, v));
    out = x;
    return Status::ok();
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string &a = args[i];
    auto value = [&](std::string &out) -> Status {
      if (i + 1 >= args.size())
        return Status::error(a + " needs a value");
      out = args[++i];
      return Status::ok();
    };
    std::string v;
    Status s = Status::ok();
    int64_t n = 0;
    if (a == "--steps") { if ((s = value(v))) s = intArg(a, v, 1, f.steps); }
    else if (a == "--epochs") { if ((s = value(v))) s = intArg(a, v, 1, f.epochs); }
    else if (a == "--last-batch") {
      if ((s = value(f.lastBatch)) && !train::parseLastBatch(f.lastBatch))
        s = Status::error(fmt::format(
            "--last-batch needs drop (each epoch's last partial batch is not read) or wrap "
            "(batches run on into the next epoch), got '{}'", f.lastBatch));
    }
    else if (a == "--log-interval") { if ((s = value(v))) s = intArg(a, v, 1, f.logInterval); }
    else if (a == "--max-skipped-steps") { if ((s = value(v))) s = intArg(a, v, 0, f.maxSkippedSteps); }
    else if (a == "--eval-interval") { if ((s = value(v))) s = intArg(a, v, 0, f.evalInterval); }
    else if (a == "--eval-steps") { if ((s = value(v))) s = intArg(a, v, 1, f.evalSteps); }
    else if (a == "--checkpoint-every") { if ((s = value(v))) s = intArg(a, v, 0, f.checkpointEvery); }
    else if (a == "--tokens") { if ((s = value(v))) s = intArg(a, v, 1, f.tokens); }
    else if (a == "--top-k") { if ((s = value(v))) s = intArg(a, v, 0, f.topK); }
    else if (a == "--prefetch") { if ((s = value(v))) s = intArg(a, v, 1, f.prefetch, 1 << 20); }
    else if (a == "--data-workers") { if ((s = value(v))) s = intArg(a, v, 1, f.dataWorkers, kMaxThreads); }
    else if (a == "--shuffle-buffer") { if ((s = value(v))) s = intArg(a, v, 1, f.shuffleBuffer); }
    else if (a == "--threads") { if ((s = value(v))) { s = intArg(a, v, 1, n, kMaxThreads); f.threads = int(n); f.threadsSet = true; } }
    else if (a == "--inter-op-threads") { if ((s = value(v))) { s = intArg(a, v, 1, n, kMaxThreads); f.interOpThreads = int(n); } }
    else if (a == "--collective-timeout") {
      if ((s = value(v))) {
        char *end = nullptr;
        f.collectiveTimeout = std::strtod(v.c_str(), &end);
        if (v.empty() || *end || !(f.collectiveTimeout > 0) ||
            !(f.collectiveTimeout <= kMaxCollectiveTimeout))
          s = Status::error(fmt::format(
              "--collective-timeout needs a number of seconds > 0 and at most {:g} (115 days), "
              "got '{}'", kMaxCollectiveTimeout, v));
      }
    }
    else if (a == "--seed") { if ((s = value(v))) { s = intArg(a, v, 0, n, INT64_MAX); f.seed = uint64_t(n); f.seedSet = true; } }
    else if (a == "--tolerance" || a == "--against") {
      if ((s = value(v))) {
        if (a == "--against")
          f.against = v;
        else {
          char *end = nullptr;
          f.tolerance = std::strtod(v.c_str(), &end);
          if (*end || !(f.tolerance > 0))
            s = Status::error("--tolerance needs a number > 0");
        }
      }
    }
    else if (a == "--temperature") {
      if ((s = value(v))) {
        char *end = nullptr;
        f.temperature = std::strtod(v.c_str(), &end);
        if (*end || !(f.temperature >= 0) || !std::isfinite(f.temperature))
          s = Status::error("--temperature needs a number >= 0");
      }
    }
    else if (a == "--device") s = value(f.device);
    else if (a == "--data") s = value(f.data);
    else if (a == "--val-data") s = value(f.valData);
    else if (a == "--checkpoint") s = value(f.checkpoint);
    else if (a == "--resume") s = value(f.resume);
    else if (a == "--init") s = value(f.init.path);
    else if (a == "--init-rename") {
      if ((s = value(v))) {
        auto r = train::parseInitRename(v);
        if (!r)
          s = r.status();
        else
          f.init.renames.push_back(*r);
      }
    }
    else if (a == "--init-ignore") { if ((s = value(v))) f.init.ignore.push_back(v); }
    else if (a == "--cache-dir") s = value(f.cacheDir);
    else if (a == "--vocab") s = value(f.vocab);
    else if (a == "--prompt") { s = value(f.prompt); f.promptGiven = true; }
    else if (a == "--loss-log") s = value(f.lossLog);
    else if (a == "--tensorboard") s = value(f.tensorboard);
    else if (a == "--stats-csv") { if ((s = value(f.statsCsv))) f.profile = true; }
    else if (a == "--trace") s = value(f.trace);
    else if (a == "--trace-steps") {
      if ((s = value(v))) {
        auto w = train::parseTraceSteps(v);
        if (!w)
          s = w.status();
        else
          std::tie(f.traceFrom, f.traceTo) = *w;
      }
    }
    else if (a == "--profile") f.profile = true;
    else if (a == "--in-order") f.inOrder = true;
    else if (a == "--allow-batch-change") f.allowBatchChange = true;
    else if (a == "--log-placement") f.logPlacement = true;
    else if (a == "--no-cache") f.noCache = true;
    else if (a == "--quiet") f.quiet = true;
    else if (a.rfind("--", 0) == 0) s = Status::error("unknown option '" + a + "'");
    else if (f.artifact.empty()) f.artifact = a;
    else s = Status::error("unexpected argument '" + a + "'");
    if (!s)
      return s;
  }
  if (f.steps > 0 && f.epochs > 0)
    return Status::error("--steps and --epochs both set the run's length: give one of them "
                         "(the data line says how many steps an epoch is)");
  if (f.inOrder && f.shuffleBuffer > 0)
    return Status::error("--shuffle-buffer shuffles .npy rows, --in-order keeps file order: "
                         "give one of them");
  if (Status s = train::initWithResume(f.init.path, f.resume); !s)
    return s;
  if (f.allowBatchChange && f.resume.empty())
    return Status::error("--allow-batch-change accepts a resumed run's change of the global "
                         "batch: give it with --resume CKPT");
  if (f.init.path.empty() && (!f.init.renames.empty() || !f.init.ignore.empty()))
    return Status::error("--init-rename and --init-ignore apply to --init FILE: give it");
  if (f.traceFrom >= 0 && f.trace.empty() && f.tensorboard.empty())
    return Status::error("--trace-steps needs where the trace goes: --trace FILE (a Chrome "
                         "trace) or --tensorboard DIR (TensorBoard's Profile tab), or both");
  if (f.artifact.empty())
    return Status::error("no artifact given (MODEL.kpack, from kilnc MODEL.kiln -o MODEL.kpack)");
  if (f.threads == 0)
    f.threads = cpuBudget().usable(); // the CPUs this process may use
  return Status::ok();
}

/// The device options the flags (and the environment: KILN_CUDA_EPILOGUES,
/// KILN_COMM_THREAD) ask for; a run on several devices gives each replica
/// its own copy (train::replicaBackends).
train::DeviceOptions deviceOptions(const Flags &f) {
  train::DeviceOptions o;
  o.device = f.device;
  o.artifact = f.artifact;
  o.threads = f.threads;
  o.interOpThreads = f.interOpThreads;
  o.cacheDir = f.cacheDir;
  o.noCache = f.noCache;
  o.quiet = f.quiet;
  train::deviceOptionsFromEnvironment(o);
  return o;
}

/// The backend --device names, created as the flags say.
train::BackendFactory backendFor(const Flags &f) {
  train::DeviceOptions o = deviceOptions(f);
  return [o](const Package &pkg) { return train::makeBackend(pkg, o, print); };
}

/// Parses the flags and opens the artifact; returns 0, or the exit code.
int begin(const std::vector<std::string> &args, Flags &f, std::unique_ptr<train::Model> &m) {
  if (Status s = parseFlags(args, f); !s)
    return usage(s.message());
  auto opened = train::Model::open(f.artifact);
  if (!opened)
    return fail(opened.status());
  m = std::move(*opened);
  return 0;
}

/// --log-placement: where each step of `fn` runs, on stdout.
void logPlacement(const train::Model &m, const std::string &fn) {
  for (const std::string &line : train::placementLines(m.prog(), fn))
    fmt::print("{}\n", line);
  std::fflush(stdout);
}

std::optional<uint64_t> seedOf(const Flags &f) {
  return f.seedSet ? std::optional<uint64_t>(f.seed) : std::nullopt;
}

/// Ctrl-C during training: the trainer stops after the step and saves.
std::atomic<bool> gInterrupted{false};
/// When the first stop signal came (CLOCK_MONOTONIC, ns).
std::atomic<int64_t> gFirstStopNs{0};
/// As invoked (setProgram), for the resume hint.
std::string gProgram = "kiln-run";
/// SIGTERM too: what Slurm and other schedulers send the processes before
/// they preempt a job; and SIGUSR1, which mpirun forwards to the ranks
/// (`kill -USR1 <mpirun>`: mpirun itself ends the job on SIGINT or SIGTERM).
/// A second signal a second or more after the first ends the process at
/// once, saying so; one within a second is the same stop delivered twice
/// (`timeout -s INT` signals the process, then its process group) and is
/// ignored, so the run still saves.
extern "C" void onSigint(int sig) {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  int64_t now = int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
  if (!gInterrupted.exchange(true)) {
    gFirstStopNs = now;
    return;
  }
  if (now - gFirstStopNs.load() < 1000000000)
    return;
  static const char msg[] = "\nkiln-run: a second stop signal: exiting now without saving a "
                            "checkpoint (the last one saved is unchanged)\n";
  ssize_t ignored = ::write(2, msg, sizeof msg - 1);
  (void)ignored;
  std::signal(sig, SIG_DFL);
  std::raise(sig); // killed by the signal, not exit(130) as a clean stop
}
void catchStops() {
  for (int sig : {SIGINT, SIGTERM, SIGUSR1})
    std::signal(sig, onSigint);
}
void releaseStops() {
  for (int sig : {SIGINT, SIGTERM, SIGUSR1})
    std::signal(sig, SIG_DFL);
}


void setProgram(const std::string &argv0) { gProgram = argv0.empty() ? "kiln-run" : argv0; }

} // namespace kiln::run
