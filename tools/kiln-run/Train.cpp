//===- Train.cpp - kiln-run train -----------------------------------------===//
//
// The train command on one device or several (in process or under a
// launcher): flags in, runtime/train's training, the resume hint, the trace
// and profile files and the overview out.
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

} // namespace kiln::run
