//===- Collectives.cpp - Collective steps through a Communicator
//-----------===//
#include "runtime/core/Collectives.h"

#include "runtime/core/StepLoop.h"

#include <fmt/format.h>

#include <chrono>
#include <set>

namespace kiln {

Status checkCommunicator(const program::Program &p, comm::Communicator *comm,
                         int &device) {
  if (!comm) {
    device = 0;
    return checkSingleDevice(p);
  }
  int n = p.numDevices();
  if (comm->size() != n)
    return Status::error(
        fmt::format("the program was compiled for a mesh of {} device{} but "
                    "the {} communicator has {} "
                    "rank{}; run it on {} devices (--device cpu:{} or mpirun "
                    "-np {}), or recompile the "
                    "model for {}",
                    n, n == 1 ? "" : "s", comm->kind(), comm->size(),
                    comm->size() == 1 ? "" : "s", n, n, n, comm->size()));
  if (device < 0)
    device = comm->rank();
  if (device != comm->rank())
    return Status::internal(
        fmt::format("device {} was given the communicator of rank {}: a "
                    "device's world rank is its index in the mesh",
                    device, comm->rank()));
  if (p.deterministic) {
    // The same bits on any device count: sums over devices in the fixed
    // pairwise tree, which only the CPU communicators keep.
    if (std::string(comm->kind()) == "nccl")
      return Status::error(
          "the artifact was compiled with deterministic = \"devices\", whose sums over "
          "devices follow a fixed tree; NCCL adds in its own order. Train it on CPU devices "
          "(--device cpu:N or mpirun with --device cpu), or recompile with --deterministic "
          "none");
    comm->setSumOrder(comm::SumOrder::Tree);
  }
  return Status::ok();
}

comm::Group collectiveGroup(const program::Mesh &mesh,
                            const program::Collective &c, int device) {
  comm::Group g;
  if (!c.group.empty()) {
    g = c.group;
  } else {
    int a = mesh.axis(c.axis);
    if (a < 0)
      return g; // parse() refuses a collective over an unknown axis
    // Row-major: the devices differing from `device` only along axis a.
    int64_t stride = 1;
    for (size_t i = size_t(a) + 1; i < mesh.axes.size(); ++i)
      stride *= mesh.axes[i].size;
    int64_t size = mesh.axes[size_t(a)].size;
    int64_t coord = (device / stride) % size;
    int64_t base = device - coord * stride;
    for (int64_t i = 0; i < size; ++i)
      g.push_back(int(base + i * stride));
  }
  // Every device in rank order is the communicator's default group.
  bool all = int(g.size()) == mesh.numDevices();
  for (size_t i = 0; all && i < g.size(); ++i)
    all = g[i] == int(i);
  if (all)
    g.clear();
  return g;
}

std::vector<comm::Group> collectiveGroups(const program::Program &p) {
  std::set<comm::Group> groups;
  for (const program::Function &f : p.functions)
    for (const program::Step &s : f.steps)
      if (s.kind == program::Step::Collective)
        for (int d = 0; d < p.numDevices(); ++d)
          if (comm::Group g = collectiveGroup(p.mesh, s.collective, d);
              !g.empty())
            groups.insert(g);
  return {groups.begin(), groups.end()};
}

namespace {

Expected<comm::Reduction> reductionOf(const program::Collective &c) {
  switch (c.reduction) {
  case program::Collective::Reduction::Sum:
    return comm::Reduction::Sum;
  case program::Collective::Reduction::Mean:
    return comm::Reduction::Mean;
  case program::Collective::Reduction::Max:
    return comm::Reduction::Max;
  case program::Collective::Reduction::Min:
    return comm::Reduction::Min;
  case program::Collective::Reduction::None:
    break;
  }
  return Status::internal(fmt::format("the plan's {} has no reduction",
                                      program::collectiveOpName(c.op)));
}

} // namespace

Status callCommunicator(
    comm::Communicator &comm, const program::Mesh &mesh, const program::Step &s,
    int device, void *sendBase, void *recvBase,
    const std::function<Status(void *, const void *, size_t)> &copy) {
  const program::Collective &c = s.collective;
  using Op = program::Collective::Op;
  char *send = static_cast<char *>(sendBase) + c.sendOffset;
  char *recv = static_cast<char *>(recvBase) + c.recvOffset;
  int64_t count = c.bytes / dtypeBytes(c.dtype);
  comm::Group group = collectiveGroup(mesh, c, device);
  int members = group.empty() ? comm.size() : int(group.size());
  auto world = [&](int member) {
    return group.empty() ? member : group[size_t(member)];
  };
  switch (c.op) {
  case Op::AllReduce: {
    auto r = reductionOf(c);
    if (!r)
      return r.status();
    return comm.allReduce(send, recv, count, c.dtype, *r, group);
  }
  case Op::ReduceScatter: {
    auto r = reductionOf(c);
    if (!r)
      return r.status();
    return comm.reduceScatter(send, recv, count / members, c.dtype, *r, group);
  }
  case Op::AllGather:
    return comm.allGather(send, recv, count, c.dtype, group);
  case Op::Broadcast:
    // args[0] -> args[1] on the root, then args[1] everywhere.
    if (world(c.peer) == device && send != recv)
      if (Status x = copy(recv, send, size_t(c.bytes)); !x)
        return x;
    return comm.broadcast(recv, count, c.dtype, c.peer, group);
  case Op::Send:
    return comm.send(send, count, c.dtype, world(c.peer));
  case Op::Recv:
    return comm.recv(recv, count, c.dtype, world(c.peer));
  }
  return Status::internal("unknown collective op");
}

std::string collectiveContext(const std::string &prefix,
                              const program::Function &f, size_t index) {
  const program::Step &s = f.steps[index];
  return fmt::format(
      "{}@{} step {} ({} of {} bytes{}{})", prefix.empty() ? "" : prefix + ", ",
      f.name, index, program::collectiveOpName(s.collective.op),
      s.collective.bytes, s.queue ? fmt::format(" on queue {}", s.queue) : "",
      s.loc.empty() ? "" : " at " + s.loc);
}

CollectiveQueue::CollectiveQueue(comm::Communicator &comm, int device,
                                 bool inlineCalls)
    : comm_(comm), device_(device), inline_(inlineCalls) {
  if (!inline_)
    thread_ = std::thread([this] { loop(); });
}

CollectiveQueue::~CollectiveQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable())
    thread_.join();
}

uint64_t CollectiveQueue::push(std::function<Status()> call,
                               std::string context) {
  uint64_t t;
  {
    std::lock_guard<std::mutex> lock(mu_);
    t = next_++;
    tasks_.push_back({t, std::move(call), std::move(context)});
  }
  if (!inline_)
    wake_.notify_one();
  return t;
}

CollectiveQueue::Done CollectiveQueue::call(Task &t,
                                            const std::string &failed) {
  Done d;
  if (!failed.empty()) {
    // The members' call sequences no longer match: start no other call.
    // The cause first: the earlier failure, then what it held back.
    d.status = Status::error(fmt::format(
        "{} (so device {} did not start the collective after it: {})", failed, device_,
        t.context));
  } else {
    comm_.setContext(t.context);
    auto t0 = std::chrono::steady_clock::now();
    d.status = t.call();
    d.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
  }
  return d;
}

void CollectiveQueue::loop() {
  for (;;) {
    Task t;
    std::string failed;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty())
        return;
      t = std::move(tasks_.front());
      tasks_.pop_front();
      if (failed_)
        failed = error_;
      // Nobody waits for it yet: it overlaps compute (Communicator::
      // setWaitedFor), until wait() says otherwise.
      busy_ = true;
      comm_.setWaitedFor(waiting_);
    }
    Done d = call(t, failed);
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_ = false;
      if (tasks_.empty()) // idle: direct callers of the communicator are waited for
        comm_.setWaitedFor(true);
      if (!d.status && !failed_) {
        failed_ = true;
        error_ = d.status.message();
      }
      results_[t.ticket] = std::move(d);
    }
    done_.notify_all();
  }
}

Status CollectiveQueue::wait(uint64_t ticket, double &seconds) {
  if (inline_) {
    // Make every call queued up to `ticket`, in order, on this thread; each
    // has the communicator's own deadline.
    std::unique_lock<std::mutex> lock(mu_);
    while (!results_.count(ticket) && !tasks_.empty() &&
           tasks_.front().ticket <= ticket) {
      Task t = std::move(tasks_.front());
      tasks_.pop_front();
      std::string failed = failed_ ? error_ : "";
      lock.unlock();
      Done d = call(t, failed);
      lock.lock();
      if (!d.status && !failed_) {
        failed_ = true;
        error_ = d.status.message();
      }
      results_[t.ticket] = std::move(d);
    }
    auto it = results_.find(ticket);
    if (it == results_.end())
      return Status::internal(fmt::format(
          "device {}: collective ticket {} was never queued", device_, ticket));
    Done d = std::move(it->second);
    results_.erase(it);
    seconds = d.seconds;
    return d.status;
  }
  double limit = comm_.timeout() * 2 + 10;
  std::unique_lock<std::mutex> lock(mu_);
  waiting_ = true;
  comm_.setWaitedFor(true);
  bool done = done_.wait_for(lock, std::chrono::duration<double>(limit),
                             [&] { return results_.count(ticket) != 0; });
  waiting_ = false;
  comm_.setWaitedFor(!busy_ && tasks_.empty());
  if (!done) {
    lock.unlock();
    std::string why =
        fmt::format("device {}: a collective did not return within {:.0f} s, "
                    "twice the communicator's timeout; the communicator was "
                    "aborted",
                    device_, limit);
    comm_.abort(why);
    return Status::error(why);
  }
  Done d = std::move(results_[ticket]);
  results_.erase(ticket);
  seconds = d.seconds;
  return d.status;
}

Status CollectiveQueue::run(std::function<Status()> call, std::string context) {
  double seconds = 0;
  return wait(push(std::move(call), std::move(context)), seconds);
}

} // namespace kiln
