//===- Commands.cpp - kiln-run's train, eval, sample, check, devices ------===//
//
// Parses the flags of the commands that run a model, calls runtime/train,
// and prints what it reports: "kiln-run: " before notes, warnings and errors
// on stderr, a checkpoint on Ctrl-C (exit 130).
//
//===----------------------------------------------------------------------===//
#include "tools/kiln-run/Commands.h"

#include "runtime/core/Handshake.h"
#include "runtime/train/Check.h"
#include "runtime/train/Devices.h"
#include "runtime/train/Evaluate.h"
#include "runtime/train/Launch.h"
#include "runtime/train/Replicas.h"
#include "runtime/train/Sampler.h"
#include "runtime/train/Trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <thread>

namespace kiln::run {

namespace {

using train::Channel;

int fail(const Status &s) {
  fmt::print(stderr, "kiln-run: error: {}\n", s.message());
  return s.exitCode() ? s.exitCode() : 1;
}
int usage(const std::string &m) {
  fmt::print(stderr, "kiln-run: error: {} (see kiln-run --help)\n", m);
  return 1;
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
  int64_t steps = -1, logInterval = 10, evalInterval = -1, evalSteps = -1;
  int64_t checkpointEvery = -1, tokens = 200, topK = 0;
  int threads = 0;
  std::string device = "cpu"; ///< cpu, cuda, cuda:N, cuda-emu
  std::string data, valData, checkpoint, resume, cacheDir, vocab, lossLog;
  std::string prompt = "\n";
  double temperature = 0.8;
  double tolerance = 1e-4;   ///< kiln-run check
  double collectiveTimeout = 300; ///< seconds a collective may wait for the others
  bool threadsSet = false;
  std::string against = "cpu"; ///< kiln-run check: the reference device
  uint64_t seed = 0;
  bool seedSet = false, profile = false, noCache = false, quiet = false;
  bool inOrder = false; ///< .npy training data in file order, no shuffling
};

Status parseFlags(const std::vector<std::string> &args, Flags &f) {
  auto intArg = [](const std::string &name, const std::string &v, int64_t lo,
                   int64_t &out) -> Status {
    char *end = nullptr;
    long long x = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end || x < lo)
      return Status::error(fmt::format("{} needs an integer >= {}, got '{}'", name, lo, v));
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
    else if (a == "--log-interval") { if ((s = value(v))) s = intArg(a, v, 1, f.logInterval); }
    else if (a == "--eval-interval") { if ((s = value(v))) s = intArg(a, v, 0, f.evalInterval); }
    else if (a == "--eval-steps") { if ((s = value(v))) s = intArg(a, v, 1, f.evalSteps); }
    else if (a == "--checkpoint-every") { if ((s = value(v))) s = intArg(a, v, 0, f.checkpointEvery); }
    else if (a == "--tokens") { if ((s = value(v))) s = intArg(a, v, 1, f.tokens); }
    else if (a == "--top-k") { if ((s = value(v))) s = intArg(a, v, 0, f.topK); }
    else if (a == "--threads") { if ((s = value(v))) { s = intArg(a, v, 1, n); f.threads = int(n); f.threadsSet = true; } }
    else if (a == "--collective-timeout") {
      if ((s = value(v))) {
        char *end = nullptr;
        f.collectiveTimeout = std::strtod(v.c_str(), &end);
        if (v.empty() || *end || !(f.collectiveTimeout > 0) || !std::isfinite(f.collectiveTimeout))
          s = Status::error("--collective-timeout needs a number of seconds > 0");
      }
    }
    else if (a == "--seed") { if ((s = value(v))) { s = intArg(a, v, 0, n); f.seed = uint64_t(n); f.seedSet = true; } }
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
    else if (a == "--cache-dir") s = value(f.cacheDir);
    else if (a == "--vocab") s = value(f.vocab);
    else if (a == "--prompt") s = value(f.prompt);
    else if (a == "--loss-log") s = value(f.lossLog);
    else if (a == "--profile") f.profile = true;
    else if (a == "--in-order") f.inOrder = true;
    else if (a == "--no-cache") f.noCache = true;
    else if (a == "--quiet") f.quiet = true;
    else if (a.rfind("--", 0) == 0) s = Status::error("unknown option '" + a + "'");
    else if (f.artifact.empty()) f.artifact = a;
    else s = Status::error("unexpected argument '" + a + "'");
    if (!s)
      return s;
  }
  if (f.artifact.empty())
    return Status::error("no artifact given (MODEL.kpack, from kilnc MODEL.kiln -o MODEL.kpack)");
  if (f.threads == 0)
    f.threads = int(std::max(1u, std::thread::hardware_concurrency()));
  return Status::ok();
}

/// The backend --device names, created as the flags say.
train::BackendFactory backendFor(const Flags &f) {
  train::DeviceOptions o;
  o.device = f.device;
  o.artifact = f.artifact;
  o.threads = f.threads;
  o.cacheDir = f.cacheDir;
  o.noCache = f.noCache;
  o.quiet = f.quiet;
  if (const char *v = std::getenv("KILN_CUDA_EPILOGUES"))
    o.cudaEpilogues = v;
  if (const char *v = std::getenv("KILN_COMM_THREAD"))
    o.commThread = v;
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

std::optional<uint64_t> seedOf(const Flags &f) {
  return f.seedSet ? std::optional<uint64_t>(f.seed) : std::nullopt;
}

/// Ctrl-C during training: the trainer stops after the step and saves.
std::atomic<bool> gInterrupted{false};
extern "C" void onSigint(int) {
  gInterrupted = true;
  std::signal(SIGINT, SIG_DFL); // a second Ctrl-C ends the process at once
}

void printProfile(Backend &b) {
  auto t = b.timings();
  std::sort(t.begin(), t.end(), [](auto &a, auto &b) { return a.seconds > b.seconds; });
  double sum = 0;
  for (auto &x : t)
    sum += x.seconds;
  fmt::print("profile (all entry points, {:.2f} s in steps):\n", sum);
  for (size_t i = 0; i < std::min<size_t>(t.size(), 40); ++i)
    fmt::print("  {:5.1f}% {:9.3f} s {:8} calls  {:<36} {}{}\n", 100 * t[i].seconds / sum,
               t[i].seconds, t[i].calls, t[i].name, t[i].loc,
               t[i].flops > 0 ? fmt::format("  {:.0f} GFLOP/s", t[i].flops / t[i].seconds / 1e9)
                              : "");
  std::map<std::string, std::pair<double, int64_t>> byOp;
  for (auto &x : t) {
    byOp[x.op].first += x.seconds;
    byOp[x.op].second += x.calls;
  }
  std::vector<std::pair<std::string, std::pair<double, int64_t>>> ops(byOp.begin(), byOp.end());
  std::sort(ops.begin(), ops.end(),
            [](auto &a, auto &b) { return a.second.first > b.second.first; });
  fmt::print("by op:\n");
  for (auto &[op, v] : ops)
    fmt::print("  {:5.1f}% {:9.3f} s {:8} calls  {}\n", 100 * v.first / sum, v.first,
               v.second, op);
}

} // namespace

/// Training on several devices (docs/parallel.md "The multi-rank trainer"):
/// --device cpu:N in this process, or this process's rank under mpirun.
static int trainReplicas(const Flags &f, const train::TrainOptions &o, const train::DeviceSpec &spec,
                         const train::Launch &launch, const train::Model &model) {
  std::string how = launch.multiProcess()
                        ? fmt::format("{} with {} processes", launch.launcher, launch.size)
                        : "--device " + f.device;
  int devices = launch.multiProcess() ? launch.size : spec.count;
  if (launch.multiProcess() && spec.count > 1)
    return usage(fmt::format("--device {} runs {} devices in one process; under {} each "
                             "process is one device: use --device {}", f.device, spec.count,
                             launch.launcher, spec.kind));
  if (spec.kind != "cpu" && spec.kind != "cuda")
    return fail(Status::error(fmt::format(
        "--device {}: training on several {} devices is not supported; use --device cpu:N "
        "or cuda:0,1,..., or mpirun with --device cpu or cuda", f.device, spec.kind)));
  if (Status s = train::checkDeviceCount(model.prog(), devices, how, f.artifact); !s)
    return fail(s);
  // GPUs: NCCL's communicators for the program's collectives (device
  // memory), host ones (in-process, MPI) for the trainer's own.
  bool gpus = spec.kind == "cuda";
  std::vector<int> ordinals = spec.ordinals;
  if (gpus && ordinals.empty()) // --device cuda: GPU 0, or this node's rank's
    ordinals = {launch.multiProcess() ? launch.localRank : 0};
  if (gpus)
    if (Status s = train::checkGpus(ordinals, launch.multiProcess()
                                                  ? fmt::format("rank {} of {}", launch.rank, how)
                                                  : how);
        !s)
      return fail(s);
  std::vector<std::unique_ptr<comm::Communicator>> owned, host;
  if (launch.multiProcess()) {
    auto c = train::makeMpiCommunicator(f.collectiveTimeout);
    if (!c)
      return fail(c.status());
    if ((*c)->size() != launch.size || (*c)->rank() != launch.rank)
      return fail(Status::error(fmt::format(
          "{} says this is rank {} of {}, but MPI says rank {} of {}; start kiln-run with "
          "the mpirun of the MPI it was built with", launch.launcher, launch.rank, launch.size,
          (*c)->rank(), (*c)->size())));
    if (gpus) {
      auto n = train::makeNcclCommunicator(**c, ordinals[0], f.collectiveTimeout);
      if (!n) {
        Status s = Status::error(fmt::format("rank {}: {}", launch.rank, n.status().message()));
        int rc = fail(s);
        (*c)->abort("stopping the other ranks after the error above");
        return rc;
      }
      host.push_back(std::move(*c));
      owned.push_back(std::move(*n));
    } else {
      owned.push_back(std::move(*c));
    }
  } else {
    auto cs = train::makeInProcessCommunicators(spec.count, f.collectiveTimeout);
    if (!cs)
      return fail(cs.status());
    if (gpus) {
      auto ns = train::makeNcclCommunicators(ordinals, f.collectiveTimeout);
      if (!ns)
        return fail(ns.status());
      host = std::move(*cs);
      owned = std::move(*ns);
    } else {
      owned = std::move(*cs);
    }
  }
  train::ReplicaOptions ro;
  ro.train = o;
  ro.how = how;
  for (auto &c : owned)
    ro.comms.push_back(c.get());
  for (auto &c : host)
    ro.hostComms.push_back(c.get());
  // Threads: the machine's cores shared by this node's replicas, unless
  // --threads says how many each gets.
  int perReplica = f.threads;
  if (!f.threadsSet) {
    int sharing = launch.multiProcess() ? launch.localSize : spec.count;
    perReplica = std::max(1, int(std::thread::hardware_concurrency()) / std::max(1, sharing));
  }
  Flags bf = f;
  bf.threads = perReplica;
  ro.backend = [bf, gpus, ordinals](int device, comm::Communicator *c) -> train::BackendFactory {
    train::DeviceOptions d;
    d.device = bf.device;
    // cuda:0,1,...: replica i on the i-th GPU listed (one per process: its
    // own).
    if (gpus)
      d.device = fmt::format("cuda:{}", ordinals[ordinals.size() == 1 ? 0 : size_t(device)]);
    d.artifact = bf.artifact;
    d.threads = bf.threads;
    d.cacheDir = bf.cacheDir;
    d.noCache = bf.noCache;
    d.quiet = bf.quiet || device != 0;
    d.comm = c;
    d.deviceIndex = device;
    if (const char *v = std::getenv("KILN_CUDA_EPILOGUES"))
      d.cudaEpilogues = v;
    if (const char *v = std::getenv("KILN_COMM_THREAD"))
      d.commThread = v;
    return [d](const Package &pkg) { return train::makeBackend(pkg, d, print); };
  };
  // Start-up handshake: every rank runs the same artifact and collective
  // sequence, or none starts.
  std::string hash;
  {
    std::ifstream in(f.artifact, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    hash = contentHash(bytes.data(), bytes.size());
  }
  ro.handshake = [hash](comm::Communicator &c, const train::Model &m) {
    return checkSameProgram(c, m.prog(), hash);
  };
  auto r = train::trainReplicas(model.pkg, ro, print);
  if (!r) {
    int rc = fail(r.status());
    // The other processes stop at once rather than at their deadline.
    if (launch.multiProcess()) {
      owned[0]->abort("stopping the other ranks after the error above");
      if (!host.empty())
        host[0]->abort("stopping the other ranks after the error above");
    }
    return rc;
  }
  if (r->result.interrupted) {
    if (ro.comms[0]->rank() == 0)
      fmt::print("kiln-run: interrupted at step {}; saved {}; continue with: kiln-run "
                 "train {} --resume {}\n", r->result.next, r->result.checkpoint, f.artifact,
                 r->result.checkpoint);
    return 130;
  }
  if (f.profile && ro.comms[0]->rank() == 0)
    printProfile(*r->models[0]->exec);
  return 0;
}

int trainCommand(const std::vector<std::string> &args) {
  Flags f;
  std::unique_ptr<train::Model> model;
  if (int rc = begin(args, f, model))
    return rc;
  auto spec = train::parseDeviceSpec(f.device);
  if (!spec)
    return usage(spec.status().message());
  auto detected = train::detectLaunch();
  if (!detected)
    return fail(detected.status());
  train::Launch launch = *detected;
  // A program over a mesh, even of one device (a world of one), runs its
  // collectives through a communicator.
  bool multi = spec->count > 1 || launch.multiProcess() || !model->prog().mesh.axes.empty();
  train::TrainOptions o;
  o.artifact = f.artifact;
  o.steps = f.steps;
  o.logInterval = f.logInterval;
  o.evalInterval = f.evalInterval;
  o.evalSteps = f.evalSteps;
  o.checkpointEvery = f.checkpointEvery;
  o.data = f.data;
  o.valData = f.valData;
  o.checkpoint = f.checkpoint;
  o.resume = f.resume;
  o.lossLog = f.lossLog;
  o.seed = seedOf(f);
  o.inOrder = f.inOrder;
  o.quiet = f.quiet;
  o.profile = f.profile;
  o.stop = &gInterrupted;
  if (multi) {
    gInterrupted = false;
    std::signal(SIGINT, onSigint);
    int rc = trainReplicas(f, o, *spec, launch, *model);
    std::signal(SIGINT, SIG_DFL);
    return rc;
  }
  auto trainer = train::Trainer::open(*model, o, backendFor(f), print);
  if (!trainer)
    return fail(trainer.status());
  gInterrupted = false;
  std::signal(SIGINT, onSigint);
  auto r = (*trainer)->run();
  std::signal(SIGINT, SIG_DFL);
  if (!r)
    return fail(r.status());
  if (r->interrupted) {
    fmt::print("kiln-run: interrupted at step {}; saved {}; continue with: kiln-run "
               "train {} --resume {}\n", r->next, r->checkpoint, f.artifact, r->checkpoint);
    return 130;
  }
  if (f.profile)
    printProfile(*model->exec);
  return 0;
}

int evalCommand(const std::vector<std::string> &args) {
  Flags f;
  std::unique_ptr<train::Model> model;
  if (int rc = begin(args, f, model))
    return rc;
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
  train::SampleOptions o;
  o.checkpoint = f.checkpoint;
  o.vocab = f.vocab;
  o.prompt = f.prompt;
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
  if (!args.empty()) {
    fmt::print(stderr, "kiln-run: error: devices takes no arguments\n");
    return 1;
  }
  fmt::print("backends in this kiln-run: {}\n", train::availableDevices());
  for (const std::string &line : train::describeGpus())
    fmt::print("{}\n", line);
  return 0;
}

} // namespace kiln::run
