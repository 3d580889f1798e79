//===- MultiDevice.cpp - What a launcher does around trainReplicas --------===//
#include "runtime/train/MultiDevice.h"

#include "runtime/core/Cpus.h"
#include "runtime/core/Files.h"
#include "runtime/core/Handshake.h"
#include "runtime/core/Trace.h"
#include "runtime/train/Overview.h"
#include "runtime/train/XPlane.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>

namespace kiln::train {

Expected<ReplicaLaunch> planReplicas(const Launch &launch, const DeviceSpec &spec,
                                     const std::string &device, const program::Program &p,
                                     const std::string &artifact) {
  ReplicaLaunch run;
  run.launch = launch;
  run.spec = spec;
  run.how = launch.multiProcess()
                ? fmt::format("{} with {} processes", launch.launcher, launch.size)
                : "--device " + device;
  run.devices = launch.multiProcess() ? launch.size : spec.count;
  if (launch.multiProcess() && spec.count > 1)
    return Status::error(fmt::format("--device {} runs {} devices in one process; under {} "
                                     "each process is one device: use --device {}",
                                     device, spec.count, launch.launcher, spec.kind));
  if (spec.kind != "cpu" && spec.kind != "cuda")
    return Status::error(fmt::format(
        "--device {}: training on several {} devices is not supported; use --device cpu:N "
        "or cuda:0,1,..., or mpirun with --device cpu or cuda", device, spec.kind));
  if (Status s = checkDeviceCount(p, run.devices, run.how, artifact); !s)
    return s;
  if (spec.kind == "cuda") {
    // cuda: GPU 0, or this node's rank's.
    run.gpus = spec.ordinals;
    if (run.gpus.empty())
      run.gpus = {launch.multiProcess() ? launch.localRank : 0};
    if (Status s = checkGpus(run.gpus, launch.multiProcess()
                                           ? fmt::format("rank {} of {}", launch.rank, run.how)
                                           : run.how);
        !s)
      return s;
  }
  return run;
}

void ReplicaComms::abortOthers(const std::string &why) {
  if (!multiProcess)
    return;
  if (!program.empty())
    program[0]->abort(why);
  if (!host.empty())
    host[0]->abort(why);
}

Expected<ReplicaComms> connectReplicas(const ReplicaLaunch &run, double timeoutSeconds) {
  ReplicaComms out;
  out.multiProcess = run.launch.multiProcess();
  bool gpus = !run.gpus.empty();
  if (!out.multiProcess) {
    auto cs = makeInProcessCommunicators(run.spec.count, timeoutSeconds);
    if (!cs)
      return cs.status();
    if (!gpus) {
      out.program = std::move(*cs);
      return out;
    }
    auto ns = makeNcclCommunicators(run.gpus, timeoutSeconds);
    if (!ns)
      return ns.status();
    out.host = std::move(*cs);
    out.program = std::move(*ns);
    return out;
  }
  const Launch &l = run.launch;
  auto c = makeMpiCommunicator(timeoutSeconds);
  if (!c)
    return c.status();
  // The ranks that failed before this point tell theirs here.
  out.started = agreeOnStart(**c, Status::ok());
  if (out.started.status && ((*c)->size() != l.size || (*c)->rank() != l.rank))
    return Status::error(fmt::format(
        "{} says this is rank {} of {}, but MPI says rank {} of {}; start kiln-run with "
        "the mpirun of the MPI it was built with", l.launcher, l.rank, l.size, (*c)->rank(),
        (*c)->size()));
  if (!out.started.status || !gpus) {
    out.program.push_back(std::move(*c));
    return out;
  }
  auto n = makeNcclCommunicator(**c, run.gpus[0], timeoutSeconds);
  out.host.push_back(std::move(*c));
  if (!n)
    out.error = Status::error(fmt::format("rank {}: {}", l.rank, n.status().message()));
  else
    out.program.push_back(std::move(*n));
  return out;
}

StartFailure reportStartFailure(const Status &held, double timeoutSeconds) {
  StartFailure f;
  auto c = makeMpiCommunicator(timeoutSeconds);
  if (!c) { // no MPI to agree through: as one process
    f.agreement.status = held;
    return f;
  }
  f.agreement = agreeOnStart(**c, held);
  f.comm = std::move(*c);
  return f;
}

void leaveTogether(comm::Communicator &c) {
  int64_t printed = 1, all = 0;
  (void)c.allReduce(&printed, &all, 1, ElementType::I64, comm::Reduction::Max);
}

int replicaThreads(const Launch &launch, int devicesInProcess) {
  return threadsPerReplica(cpuBudget(), launch.multiProcess() ? launch.localSize : 1,
                           launch.multiProcess() ? 1 : devicesInProcess);
}

std::function<BackendFactory(int device, comm::Communicator *c)>
replicaBackends(const DeviceOptions &base, const std::vector<int> &gpus, Sink out) {
  return [base, gpus, out](int device, comm::Communicator *c) -> BackendFactory {
    DeviceOptions d = base;
    // cuda:0,1,...: replica i on the i-th GPU listed (one per process: its own).
    if (!gpus.empty())
      d.device = fmt::format("cuda:{}", gpus[gpus.size() == 1 ? 0 : size_t(device)]);
    d.quiet = base.quiet || device != 0;
    d.comm = c;
    d.deviceIndex = device;
    return [d, out](const Package &pkg) { return makeBackend(pkg, d, out); };
  };
}

Expected<std::function<Status(comm::Communicator &, const Model &)>>
sameArtifactHandshake(const std::string &artifact) {
  std::string bytes;
  if (!readFile(artifact, bytes))
    return Status::error(fmt::format("{}: cannot read the artifact again to hash it for the "
                                     "start-up handshake", artifact));
  std::string hash = contentHash(bytes.data(), bytes.size());
  return std::function<Status(comm::Communicator &, const Model &)>(
      [hash](comm::Communicator &c, const Model &m) { return checkSameProgram(c, m.prog(), hash); });
}

std::vector<Tracer *> replicaTracers(const std::vector<comm::Communicator *> &comms,
                                     Tracer *rank0, std::vector<std::unique_ptr<Tracer>> &own) {
  std::vector<Tracer *> tracers;
  for (comm::Communicator *c : comms) {
    Tracer *t = c->rank() == 0 ? rank0 : nullptr;
    if (!t) {
      own.push_back(std::make_unique<Tracer>());
      t = own.back().get();
    }
    t->rank = t->device = c->rank();
    tracers.push_back(t);
  }
  return tracers;
}

TraceSource traceSource(const Tracer &t, const Model &m, int rank) {
  TraceSource src;
  src.tracer = &t;
  src.program = &m.prog();
  src.process = fmt::format("rank {} \u00b7 {}", rank, m.exec ? m.exec->describe() : "");
  src.pid = rank;
  return src;
}

Expected<ReplicaTraces> collectTraces(const std::vector<Tracer *> &tracers, const ReplicaRun &r,
                                      bool multiProcess, bool chrome, bool xspace) {
  ReplicaTraces out;
  std::string host = machineName();
  auto renderX = [&host](const TraceSource &src) { return renderXSpace(src, host); };
  if (multiProcess) {
    // Every rank's events to rank 0, under the communicator's deadline.
    TraceSource src = traceSource(*tracers[0], *r.models[0], tracers[0]->rank);
    if (chrome) {
      auto got = gatherTrace(*r.models[0]->comm, src, renderTraceEvents);
      if (!got)
        return got.status();
      out.chrome = std::move(*got);
    }
    if (xspace) {
      auto got = gatherTrace(*r.models[0]->comm, src, renderX);
      if (!got)
        return got.status();
      out.xspaces = std::move(*got);
    }
    return out;
  }
  int64_t earliest = INT64_MAX;
  for (Tracer *t : tracers)
    earliest = std::min(earliest, originNanos(*t));
  for (size_t i = 0; i < tracers.size(); ++i) {
    TraceSource src = traceSource(*tracers[i], *r.models[i], tracers[i]->rank);
    src.shift = double(originNanos(*tracers[i]) - earliest) / 1e9;
    if (chrome)
      out.chrome.push_back(renderTraceEvents(src));
    if (xspace)
      out.xspaces.push_back(renderX(src));
  }
  return out;
}

Expected<std::vector<std::string>> collectStageRows(const std::vector<Tracer *> &tracers,
                                                    const ReplicaRun &r, bool multiProcess) {
  std::vector<std::string> rows;
  for (size_t i = 0; i < tracers.size(); ++i) {
    int rank = tracers[i]->rank;
    rows.push_back(formatStageRow(tracers[i]->spans(), r.models[i]->prog(), rank,
                                  meshCoordinate(r.models[i]->prog().mesh, "pp", rank)));
  }
  if (!multiProcess)
    return rows;
  r.models[0]->comm->setContext("gathering the pipeline stages' profiles (--profile)");
  return gatherText(*r.models[0]->comm, rows.empty() ? "" : rows[0]);
}

std::string relaunchCommand(const Launch &launch, int devices) {
  if (!launch.multiProcess())
    return "";
  if (launch.launcher == "slurm")
    return fmt::format("srun -n {} ", devices);
  if (launch.launcher == "openmpi" || launch.launcher == "pmi")
    return fmt::format("mpirun -np {} ", devices);
  return fmt::format("({} with {} processes) ", launch.launcher, devices);
}

} // namespace kiln::train
