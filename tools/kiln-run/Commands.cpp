//===- Commands.cpp - kiln-run's train, eval, sample, check, devices ------===//
//
// Parses the flags of the commands that run a model, calls runtime/train,
// and prints what it reports: "kiln-run: " before notes, warnings and errors
// on stderr, a checkpoint on Ctrl-C (exit 130).
//
//===----------------------------------------------------------------------===//
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

namespace {

using train::Channel;

/// `kiln-run train` under a launcher of several processes, until the
/// communicator exists: the first error (a flag, the artifact, --device) is
/// held here instead of printed, and the ranks agree on it once they can
/// talk (reportStartError()), so that it is printed once, by rank 0, and
/// names the ranks when not all of them hit it.
struct HeldError {
  bool hold = false;
  std::optional<Status> status;
};
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

/// Command-line flags of train, eval, sample and check.
struct Flags {
  std::string artifact;
  int64_t steps = -1, logInterval = -1, evalInterval = -1, evalSteps = -1;
  int64_t epochs = -1; ///< --epochs (train): the steps of this many epochs
  std::string lastBatch; ///< --last-batch drop|wrap; "": the train section's
  int64_t checkpointEvery = -1, tokens = 200, topK = 0;
  int threads = 0;
  int interOpThreads = 1; ///< --inter-op-threads (CPU)
  std::string device = "cpu"; ///< cpu, cuda, cuda:N, cuda-emu
  std::string data, valData, checkpoint, resume, cacheDir, vocab, lossLog;
  std::string statsCsv; ///< --stats-csv: every kernel stats row (implies --profile)
  std::string prompt = "\n";
  bool promptGiven = false;
  double temperature = 0.8;
  double tolerance = 1e-4;   ///< kiln-run check
  double collectiveTimeout = 300; ///< seconds a collective may wait for the others
  bool threadsSet = false;
  std::string against = "cpu"; ///< kiln-run check: the reference device
  uint64_t seed = 0;
  bool seedSet = false, profile = false, noCache = false, quiet = false;
  bool inOrder = false; ///< .npy training data in file order, no shuffling
  bool allowBatchChange = false; ///< resume with another global batch
  bool logPlacement = false; ///< --log-placement: where each step runs, first
  std::string tensorboard; ///< --tensorboard DIR: scalars for TensorBoard
  int64_t prefetch = 3, dataWorkers = 1, shuffleBuffer = 0; ///< the input pipeline
  int64_t maxSkippedSteps = 100; ///< --max-skipped-steps (loss scaling; 0: never fail)
  std::vector<std::string> args; ///< as given (train: the resume hint repeats them)
  train::InitWeights init; ///< --init FILE, --init-rename FROM=TO, --init-ignore NAME
  std::string trace;    ///< --trace FILE (train)
  int64_t traceFrom = -1, traceTo = -1; ///< --trace-steps A:B; -1: the default window
  std::string profileRun; ///< the TensorBoard profile's run name (profileRunName)

  /// --tensorboard DIR with --trace FILE or --trace-steps A:B: the traced
  /// steps also go to DIR/plugins/profile (TensorBoard's Profile tab).
  bool tensorboardProfile() const {
    return !tensorboard.empty() && (!trace.empty() || traceFrom >= 0);
  }
  /// Some steps are traced: into --trace's file, the TensorBoard profile, or both.
  bool traced() const { return !trace.empty() || tensorboardProfile(); }
};

/// Counts are bounded so that nothing downstream overflows (a step count,
/// an ETA) or asks the system for more than it has (threads).
constexpr int64_t kMaxCount = 1'000'000'000'000; // 1e12
/// Threads a device's pool (or the inter-op pool) may start: far above any
/// machine's cores, below what the system refuses.
constexpr int64_t kMaxThreads = 1024;
/// A collective's deadline (seconds): a time point this far ahead still
/// fits the clocks' 64-bit nanoseconds (about 292 years) with room to spare.
constexpr double kMaxCollectiveTimeout = 1e7;

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

} // namespace

void setProgram(const std::string &argv0) { gProgram = argv0.empty() ? "kiln-run" : argv0; }

namespace {

/// The command that continues an interrupted run: the same arguments
/// (any --resume replaced, --init and its options left out: the
/// checkpoint holds the parameters) after `launcher` ("" or "mpirun -np 2
/// "), and --resume CKPT; arguments with shell characters are single-quoted.
std::string resumeCommand(const Flags &f, const std::string &launcher, const std::string &ckpt) {
  auto quote = [](const std::string &a) {
    bool plain = !a.empty() && a.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTU"
                                                   "VWXYZ0123456789_./:=,+-@%") == std::string::npos;
    if (plain)
      return a;
    std::string q = "'";
    for (char c : a)
      q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
  };
  std::string cmd = launcher + quote(gProgram) + " train";
  for (size_t i = 0; i < f.args.size(); ++i) {
    if (f.args[i] == "--resume" || f.args[i] == "--init" || f.args[i] == "--init-rename" ||
        f.args[i] == "--init-ignore") {
      ++i;
      continue;
    }
    cmd += " " + quote(f.args[i]);
  }
  return cmd + " --resume " + quote(ckpt);
}

/// --profile: the tracer the trainer records into, and the machine's
/// peak measured before training (CPU devices; the kernel stats' "% of
/// peak").
struct Profiler {
  std::unique_ptr<Tracer> tracer;
  train::MachinePeak peak;
};

void startProfile(const Flags &f, train::TrainOptions &o, Profiler &p, int threads) {
  if (!f.profile)
    return;
  p.tracer = std::make_unique<Tracer>();
  o.tracer = p.tracer.get();
  train::profileWindow(o);
  if (f.device.rfind("cpu", 0) != 0)
    return; // a GPU's peak is not measured (yet): no "% of peak"
  auto peak = train::measureCpuPeak(threads);
  if (peak)
    p.peak = *peak;
  else if (!f.quiet)
    print(Channel::Warning, peak.status().message());
}

/// --profile of a pipeline-parallel program: every device records its
/// spans, and rank 0 prints a row per stage under the overview.
bool profileStages(const Flags &f, const program::Program &p) {
  int a = p.mesh.axis("pp");
  return f.profile && a >= 0 && p.mesh.axes[size_t(a)].size > 1;
}

/// The overview and the kernel stats of the profiled steps; 0 or the exit
/// code (--stats-csv not written).
int printOverview(const Flags &f, const Profiler &p, const program::Program &prog,
                  const std::string &who) {
  std::vector<Span> spans = p.tracer->spans();
  train::Breakdown b = train::breakdown(spans);
  std::vector<train::KernelStat> stats = train::kernelStats(spans, prog, b, p.peak);
  fmt::print("{}", train::formatOverview(b, stats, p.peak, who));
  if (!f.statsCsv.empty()) {
    if (Status s = train::writeStatsCsv(f.statsCsv, stats); !s)
      return fail(s);
    fmt::print("kiln-run: wrote {} kernel stats rows to {}\n", stats.size(), f.statsCsv);
  }
  return 0;
}

/// Writes --trace's file from the devices' rendered events (every rank's,
/// for rank 0 of an MPI run) and, with --tensorboard, the TensorBoard
/// profile from their XSpaces (rank order), for a run of steps [start,
/// next) that traced the window `o` asked for.
int writeTrace(const Flags &f, const train::TrainOptions &o, const train::Model &m,
               const std::vector<std::string> &pieces, const std::vector<std::string> &spaces,
               int64_t start, int64_t next, int devices) {
  auto [from, to] = train::traceWindow(o.traceFrom, o.traceTo, start, next);
  if (!f.trace.empty()) {
    std::vector<std::pair<std::string, std::string>> info = {
        {"tool", "\"kiln-run train\""}, {"model", train::jsonString(m.pkg.model)}};
    for (auto &kv : train::traceSourceInfo(f.artifact, m.pkg.sourcePath, m.pkg.sourceAbsPath,
                                           m.pkg.sourceHash))
      info.push_back(kv);
    info.insert(info.end(), {
        {"steps", fmt::format("[{},{}]", from, to)},
        {"devices", fmt::format("{}", devices)},
        {"clock", "\"host steady clock, microseconds since the earliest tracer's origin; "
                  "ranks on one host share it, several hosts are not aligned\""}});
    if (Status s = train::writeTraceFile(f.trace, pieces, info); !s)
      return fail(s);
  }
  // An empty window: the Chrome trace file is written (as before), no
  // profile run that would only clutter the Profile tab's list.
  bool profile = f.tensorboardProfile() && from < to;
  train::ProfileFiles written;
  if (profile) {
    std::vector<std::pair<std::string, std::string>> hosts;
    for (size_t i = 0; i < spaces.size(); ++i)
      hosts.emplace_back(train::profileHostName(int(i)), spaces[i]);
    auto w = train::writeProfile(f.tensorboard, f.profileRun, hosts);
    if (!w)
      return fail(w.status());
    written = std::move(*w);
  }
  if (from == to) {
    std::string what = f.trace.empty() ? "" : fmt::format("{} holds no steps", f.trace);
    if (f.tensorboardProfile())
      what += fmt::format("{}no TensorBoard profile written", what.empty() ? "" : "; ");
    print(Channel::Warning,
          fmt::format("--trace-steps {}:{} is outside this run's steps {}..{}: {}", f.traceFrom,
                      f.traceTo, start, next - 1, what));
  }
  if (!f.quiet && !f.trace.empty())
    fmt::print("kiln-run: trace of steps {}..{} written to {} (open it in ui.perfetto.dev "
               "or chrome://tracing)\n", from, to - 1, f.trace);
  if (!f.quiet && profile) {
    std::string names;
    for (const std::string &path : written.files)
      names += (names.empty() ? "" : ", ") + path.substr(path.rfind('/') + 1);
    fmt::print("kiln-run: TensorBoard profile of steps {}..{} written to {} ({}; tensorboard "
               "--logdir {}, Profile tab)\n",
               from, to - 1, written.dir, names, f.tensorboard);
  }
  return 0;
}

} // namespace

/// Ends the run of a rank once the ranks agreed that some could not start
/// (`a`): rank 0 prints what failed, then the ranks leave together.
static int endStart(comm::Communicator &c, const train::StartAgreement &a) {
  int rc = a.report ? fail(a.status) : a.status.exitCode();
  std::fflush(stderr);
  train::leaveTogether(c);
  return rc;
}

/// A start-up error `held` before the communicator existed, under a launcher
/// of several processes: every rank gets to agree on it (the others right
/// after making their communicator), rank 0 prints what failed, and every
/// rank exits with its code. A rank missing there (dead, or stuck before
/// it) is named by the collective's deadline.
static int reportStartError(const Flags &f, const Status &held) {
  // (The flag itself may be what was wrong.)
  double timeout = f.collectiveTimeout > 0 && f.collectiveTimeout <= kMaxCollectiveTimeout
                       ? f.collectiveTimeout
                       : Flags().collectiveTimeout;
  train::StartFailure s = train::reportStartFailure(held, timeout);
  if (!s.comm)
    return fail(held); // no MPI to agree through: as one process
  return endStart(*s.comm, s.agreement);
}

/// Training on several devices (docs/parallel.md "The multi-rank trainer"):
/// --device cpu:N in this process, or this process's rank under mpirun;
/// runtime/train/MultiDevice.h does the launch, this prints.
static int trainReplicas(const Flags &f, const train::TrainOptions &o, const train::DeviceSpec &spec,
                         const train::Launch &launch, const train::Model &model,
                         const Profiler &prof) {
  auto run = train::planReplicas(launch, spec, f.device, model.prog(), f.artifact);
  if (!run)
    return fail(run.status());
  if (launch.multiProcess())
    gHeld.hold = false; // from here on, each rank's errors name it
  auto comms = train::connectReplicas(*run, f.collectiveTimeout);
  if (!comms)
    return fail(comms.status());
  if (!comms->started.status)
    return endStart(comms->leader(), comms->started);
  const std::string stopping = "stopping the other ranks after the error above";
  auto failAll = [&](const Status &s) { // the other processes stop at once
    int rc = fail(s);
    comms->abortOthers(stopping);
    return rc;
  };
  if (!comms->error)
    return failAll(comms->error);
  train::ReplicaOptions ro;
  ro.train = o;
  ro.how = run->how;
  for (auto &c : comms->program)
    ro.comms.push_back(c.get());
  for (auto &c : comms->host)
    ro.hostComms.push_back(c.get());
  // Threads: the CPUs this process may use shared by this host's replicas,
  // unless --threads says how many each gets.
  train::DeviceOptions d = deviceOptions(f);
  d.threads = f.threadsSet ? f.threads : train::replicaThreads(launch, spec.count);
  ro.backend = train::replicaBackends(d, run->gpus, print);
  // Start-up handshake: every rank runs the same artifact and collective
  // sequence, or none starts.
  auto handshake = train::sameArtifactHandshake(f.artifact);
  if (!handshake)
    return failAll(handshake.status());
  ro.handshake = *handshake;
  // --trace: one tracer per replica of this process (rank 0's the one
  // o.tracer names, when something else set it already).
  std::vector<std::unique_ptr<Tracer>> ownTracers;
  bool stages = profileStages(f, model.prog());
  if (f.traced() || stages)
    ro.tracers = train::replicaTracers(ro.comms, o.tracer, ownTracers);
  if (launch.multiProcess())
    ro.started = &comms->started;
  auto r = train::trainReplicas(model.pkg, ro, print);
  if (!r && !comms->started.status) // every rank knows: none waits for another
    return endStart(comms->leader(), comms->started);
  if (!r)
    return failAll(r.status());
  bool leader = ro.comms[0]->rank() == 0;
  if (f.traced()) {
    auto traces = train::collectTraces(ro.tracers, *r, launch.multiProcess(), !f.trace.empty(),
                                       f.tensorboardProfile());
    if (!traces)
      return failAll(traces.status());
    if (leader)
      if (int rc = writeTrace(f, o, model, traces->chrome, traces->xspaces, r->result.start,
                              r->result.next, run->devices))
        return rc;
  }
  if (r->result.interrupted) {
    // The same launch again, from the checkpoint.
    if (leader)
      fmt::print("kiln-run: interrupted at step {}; saved {}; continue with: {}\n",
                 r->result.next, r->result.checkpoint,
                 resumeCommand(f, train::relaunchCommand(launch, run->devices),
                               r->result.checkpoint));
    return 130;
  }
  // Pipeline stages: each device's row, from its own spans (every rank's
  // to rank 0 under mpirun).
  std::vector<std::string> stageRows;
  if (stages) {
    auto rows = train::collectStageRows(ro.tracers, *r, launch.multiProcess());
    if (!rows)
      return failAll(rows.status());
    stageRows = std::move(*rows);
  }
  if (f.profile && leader) {
    int rc = printOverview(f, prof, r->models[0]->prog(),
                           fmt::format("rank 0 of {} on {}", run->devices, run->how));
    if (stages) {
      fmt::print("{}", train::stageHeader());
      for (const std::string &row : stageRows)
        fmt::print("{}", row);
    }
    return rc;
  }
  return 0;
}

static int train(const std::vector<std::string> &args, Flags &f);

int trainCommand(const std::vector<std::string> &args) {
  // Several processes: a start-up error is printed once (gHeld).
  auto launch = train::detectLaunch();
  gHeld = HeldError{};
  gHeld.hold = launch && launch->multiProcess();
  Flags f;
  int rc = train(args, f);
  std::optional<Status> held = gHeld.hold ? gHeld.status : std::nullopt;
  gHeld = HeldError{};
  return held ? reportStartError(f, *held) : rc;
}

static int train(const std::vector<std::string> &args, Flags &f) {
  Tracer tracer; // --trace on one device (outlives the model using it)
  std::unique_ptr<train::Model> model;
  if (int rc = begin(args, f, model))
    return rc;
  f.args = args;
  auto spec = train::parseDeviceSpec(f.device);
  if (!spec)
    return usage(spec.status().message());
  auto detected = train::detectLaunch();
  if (!detected)
    return fail(detected.status());
  train::Launch launch = *detected;
  // Threads narrower than the machine (taskset, a launcher's binding, a
  // cgroup quota): say why, once, as the leader sees it.
  if (!f.threadsSet && !f.quiet && launch.rank == 0 && f.device.rfind("cuda", 0) != 0)
    if (CpuBudget b = cpuBudget(); b.narrowed())
      print(Channel::Note,
            fmt::format("threads: {} per device, for the {} this process may use (--threads N "
                        "to choose)",
                        launch.multiProcess() || spec->count > 1
                            ? train::replicaThreads(launch, spec->count)
                            : f.threads,
                        b.describe()));
  // --log-placement: once, by the leader (rank 0 under mpirun).
  if (f.logPlacement && launch.rank == 0)
    logPlacement(*model, "train_step");
  // --trace: a file rank 0 can write, before anything is compiled.
  if (!f.trace.empty() && launch.rank == 0)
    if (Status s = train::checkTraceFile(f.trace); !s)
      return fail(s);
  // The TensorBoard profile's run: named for the run's start, checked now.
  f.profileRun = train::profileRunName(std::time(nullptr));
  if (f.tensorboardProfile() && launch.rank == 0)
    if (Status s = train::checkProfileDir(f.tensorboard, f.profileRun); !s)
      return fail(s);
  // A program over a mesh, even of one device (a world of one), runs its
  // collectives through a communicator.
  bool multi = spec->count > 1 || launch.multiProcess() || !model->prog().mesh.axes.empty();
  train::TrainOptions o;
  o.artifact = f.artifact;
  o.steps = f.steps;
  o.epochs = f.epochs;
  if (!f.lastBatch.empty())
    o.lastBatch = train::parseLastBatch(f.lastBatch);
  o.logInterval = f.logInterval;
  o.maxSkippedSteps = f.maxSkippedSteps;
  o.evalInterval = f.evalInterval;
  o.evalSteps = f.evalSteps;
  o.checkpointEvery = f.checkpointEvery;
  o.data = f.data;
  o.valData = f.valData;
  o.checkpoint = f.checkpoint;
  o.resume = f.resume;
  o.allowBatchChange = f.allowBatchChange;
  o.init = f.init;
  o.lossLog = f.lossLog;
  o.seed = seedOf(f);
  o.inOrder = f.inOrder;
  o.prefetch = int(f.prefetch);
  o.dataWorkers = int(f.dataWorkers);
  o.shuffleBuffer = f.shuffleBuffer;
  o.quiet = f.quiet;
  o.profile = f.profile;
  o.stop = &gInterrupted;
  // --tensorboard: one event file, rank 0's (its trainer alone writes).
  std::shared_ptr<train::TensorBoardWriter> tb;
  if (!f.tensorboard.empty() && (!launch.multiProcess() || launch.rank == 0)) {
    auto w = train::TensorBoardWriter::open(f.tensorboard);
    if (!w)
      return fail(w.status());
    tb = std::move(*w);
    train::attachTensorBoard(o, tb, print);
    if (!f.quiet)
      print(Channel::Note, fmt::format("TensorBoard scalars: {} (tensorboard --logdir {})",
                                       tb->path(), f.tensorboard));
  }
  // A finished run whose event file failed (a full disk) still fails.
  auto tbDone = [&tb](int rc) {
    if (rc == 0 && tb)
      if (Status s = tb->close(); !s)
        return fail(s);
    return rc;
  };
  Profiler prof;
  // The steps recorded: --profile alone, every step but the run's first;
  // with --trace, the trace's window (--trace-steps, or its default), which
  // the overview then covers too. Set after startProfile on every rank.
  auto traceWindow = [&] {
    if (!f.traced())
      return;
    o.traceFrom = f.traceFrom;
    o.traceTo = f.traceTo < 0 ? INT64_MAX : f.traceTo;
    o.traceWarmup = 0;
  };
  if (multi) {
    // The threads rank 0 gets (trainReplicas' split of the cores).
    // Under mpirun only rank 0 profiles (it prints the overview).
    if (!launch.multiProcess() || launch.rank == 0)
      startProfile(f, o, prof, f.threadsSet ? f.threads : train::replicaThreads(launch, spec->count));
    else if (profileStages(f, model->prog()))
      train::profileWindow(o); // every stage records the same steps
    traceWindow();
    gInterrupted = false;
    catchStops();
    int rc = trainReplicas(f, o, *spec, launch, *model, prof);
    releaseStops();
    return tbDone(rc);
  }
  startProfile(f, o, prof, f.threads);
  traceWindow();
  if (f.traced() && !o.tracer)
    o.tracer = &tracer;
  auto trainer = train::Trainer::open(*model, o, backendFor(f), print);
  if (!trainer)
    return fail(trainer.status());
  gInterrupted = false;
  catchStops();
  auto r = (*trainer)->run();
  releaseStops();
  if (!r)
    return fail(r.status());
  if (f.traced()) {
    train::TraceSource src = train::traceSource(*o.tracer, *model, 0);
    std::vector<std::string> pieces, spaces;
    if (!f.trace.empty())
      pieces.push_back(train::renderTraceEvents(src));
    if (f.tensorboardProfile())
      spaces.push_back(train::renderXSpace(src, train::machineName()));
    if (int rc = writeTrace(f, o, *model, pieces, spaces, r->start, r->next, 1))
      return rc;
  }
  if (r->interrupted) {
    fmt::print("kiln-run: interrupted at step {}; saved {}; continue with: {}\n", r->next,
               r->checkpoint, resumeCommand(f, "", r->checkpoint));
    return 130;
  }
  if (f.profile)
    return tbDone(printOverview(f, prof, model->prog(), "on " + model->exec->describe()));
  return tbDone(0);
}

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
