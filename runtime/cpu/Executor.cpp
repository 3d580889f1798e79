//===- Executor.cpp - Runs a compiled program on the CPU ------------------===//
#include "runtime/cpu/Executor.h"

#include "runtime/cpu/Blas.h"
#include "runtime/cpu/Gemm.h"

#include <fmt/format.h>
#include <malloc.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>


namespace kiln::cpu {

Executor::~Executor() {
  if (commThread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(commMu_);
      commStop_ = true;
    }
    commWake_.notify_all();
    commThread_.join();
  }
  std::free(arena_);
}

int Executor::threadShare(int total, int devices, int device) {
  total = std::max(total, 1);
  devices = std::max(devices, 1);
  int share = total / devices + (device < total % devices ? 1 : 0);
  return std::max(share, 1);
}

Expected<std::unique_ptr<Executor>>
Executor::create(const program::Program &program, std::unique_ptr<KernelLibrary> lib,
                 int threads) {
  ExecutorOptions o;
  o.threads = threads;
  return create(program, std::move(lib), o);
}

Expected<std::unique_ptr<Executor>>
Executor::create(const program::Program &program, std::unique_ptr<KernelLibrary> lib,
                 const ExecutorOptions &options) {
  int threads = options.threads;
  comm::Communicator *comm = options.communicator;
  int device = 0;
  if (!comm) {
    if (Status s = checkSingleDevice(program); !s)
      return s;
  } else {
    int n = program.numDevices();
    if (comm->size() != n)
      return Status::error(fmt::format(
          "the program was compiled for a mesh of {} device{} but the {} communicator has {} "
          "rank{}; run it on {} devices (--device cpu:{} or mpirun -np {}), or recompile the "
          "model for {}",
          n, n == 1 ? "" : "s", comm->kind(), comm->size(), comm->size() == 1 ? "" : "s", n, n,
          n, comm->size()));
    device = options.device < 0 ? comm->rank() : options.device;
    if (device != comm->rank())
      return Status::internal(fmt::format(
          "device {} was given the communicator of rank {}: a device's world rank is its "
          "index in the mesh",
          device, comm->rank()));
  }
  if (!lib && !program.kernels.empty())
    return Status::internal("the CPU executor needs the kernel library of a program with "
                            "kernels");
  if (auto b = blas(); !b)
    return b.status();
  // Kernels allocate their temporaries (reductions' partial results, a
  // softmax's exponentials) with malloc on every call, from every pool
  // thread. glibc would hand blocks over 128 KiB back to the kernel each
  // time (mmap/munmap, or trimming a thread arena's heap), and the next
  // call would page-fault on all of it again: a fifth of a softmax
  // kernel's time. Keep them in the heap.
  static bool tuned = [] {
    mallopt(M_MMAP_THRESHOLD, 256 << 20);
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
    return true;
  }();
  (void)tuned;
  std::unique_ptr<Executor> e(new Executor());
  e->program_ = program;
  e->lib_ = std::move(lib);
  e->device_ = device;
  e->layout_ = &e->program_.plan(device);
  e->comm_ = comm;
  for (const program::Kernel &k : program.kernels) {
    std::string why;
    KernelFn fn = e->lib_->lookup(k.symbol, &why);
    if (!fn)
      return Status::error("cannot link kernel '" + k.symbol + "' (" + why +
                           "); recompile the model with this version of kilnc");
    e->fns_.push_back(fn);
  }
  size_t bytes = size_t(std::max<int64_t>(e->layout_->arenaBytes, 64));
  bytes = (bytes + 63) / 64 * 64;
  e->arena_ = static_cast<char *>(std::aligned_alloc(64, bytes));
  if (!e->arena_)
    return Status::error(fmt::format("cannot allocate the {}-byte arena", bytes));
  std::memset(e->arena_, 0, bytes);
  e->profile_ = StepProfile(program.kernels.size());
  // BLAS runs single-threaded inside the pool's parts (one pool, no
  // second set of spinning threads; results independent of the count):
  // blas() set that up.
  e->pool_ = std::make_unique<ThreadPool>(std::max(threads, 1));
  if (comm)
    e->commThread_ = std::thread([p = e.get()] { p->commLoop(); });
  return e;
}

Status Executor::runSteps(const std::string &name, size_t begin, size_t end) {
  const program::Function *f = program_.function(name);
  if (!f)
    return Status::error("the artifact has no @" + name);
  current_ = f;
  Status r = kiln::runSteps(program_, *f, begin, end, *this, profiling_ ? &profile_ : nullptr);
  current_ = nullptr;
  return r;
}

// Collectives ------------------------------------------------------------

namespace {

Expected<comm::Reduction> reductionOf(const program::Collective &c) {
  switch (c.reduction) {
  case program::Collective::Reduction::Sum: return comm::Reduction::Sum;
  case program::Collective::Reduction::Mean: return comm::Reduction::Mean;
  case program::Collective::Reduction::Max: return comm::Reduction::Max;
  case program::Collective::Reduction::Min: return comm::Reduction::Min;
  case program::Collective::Reduction::None: break;
  }
  return Status::internal(fmt::format("the plan's {} has no reduction",
                                      program::collectiveOpName(c.op)));
}

} // namespace

comm::Group collectiveGroup(const program::Mesh &mesh, const program::Collective &c,
                            int device) {
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

Status Executor::communicate(const program::Step &s) {
  const program::Collective &c = s.collective;
  using Op = program::Collective::Op;
  char *send = static_cast<char *>(data(s.args[0])) + c.sendOffset;
  char *recv = static_cast<char *>(data(s.args.back())) + c.recvOffset;
  int64_t count = c.bytes / dtypeBytes(c.dtype);
  comm::Group group = collectiveGroup(program_.mesh, c, device_);
  int members = group.empty() ? comm_->size() : int(group.size());
  switch (c.op) {
  case Op::AllReduce: {
    auto r = reductionOf(c);
    if (!r)
      return r.status();
    return comm_->allReduce(send, recv, count, c.dtype, *r, group);
  }
  case Op::ReduceScatter: {
    auto r = reductionOf(c);
    if (!r)
      return r.status();
    return comm_->reduceScatter(send, recv, count / members, c.dtype, *r, group);
  }
  case Op::AllGather:
    return comm_->allGather(send, recv, count, c.dtype, group);
  case Op::Broadcast: {
    // args[0] -> args[1] on the root, then args[1] everywhere.
    int root = group.empty() ? c.peer : group[size_t(c.peer)];
    if (root == device_ && send != recv)
      std::memmove(recv, send, size_t(c.bytes));
    return comm_->broadcast(recv, count, c.dtype, c.peer, group);
  }
  case Op::Send:
    return comm_->send(send, count, c.dtype, group.empty() ? c.peer : group[size_t(c.peer)]);
  case Op::Recv:
    return comm_->recv(recv, count, c.dtype, group.empty() ? c.peer : group[size_t(c.peer)]);
  }
  return Status::internal("unknown collective op");
}

/// "training step 3, @train_step step 7 (all_reduce of 4096 bytes on queue
/// 1 at m.kiln:9:3)": what a communicator's errors name.
static std::string collectiveWhere(const std::string &context, const program::Function *f,
                                   const program::Step &s) {
  std::string fn = "@?";
  size_t index = 0;
  if (f && !f->steps.empty() && &s >= f->steps.data() && &s < f->steps.data() + f->steps.size()) {
    fn = "@" + f->name;
    index = size_t(&s - f->steps.data());
  }
  return fmt::format("{}{} step {} ({} of {} bytes{}{})", context.empty() ? "" : context + ", ",
                     fn, index, program::collectiveOpName(s.collective.op), s.collective.bytes,
                     s.queue ? fmt::format(" on queue {}", s.queue) : "",
                     s.loc.empty() ? "" : " at " + s.loc);
}

uint64_t Executor::push(const program::Step &s, std::string where) {
  uint64_t t;
  {
    std::lock_guard<std::mutex> lock(commMu_);
    t = nextTicket_++;
    commTasks_.push_back({t, &s, std::move(where)});
  }
  commWake_.notify_one();
  return t;
}

void Executor::commLoop() {
  for (;;) {
    Task t;
    std::string failed;
    {
      std::unique_lock<std::mutex> lock(commMu_);
      commWake_.wait(lock, [&] { return commStop_ || !commTasks_.empty(); });
      if (commTasks_.empty())
        return;
      t = std::move(commTasks_.front());
      commTasks_.pop_front();
      if (commFailed_)
        failed = commError_;
    }
    Done d;
    if (!failed.empty()) {
      // The members' call sequences no longer match: do not start another.
      d.status = Status::error(fmt::format("{}: not run on device {}, because an earlier "
                                           "collective failed: {}",
                                           t.where, device_, failed));
    } else {
      comm_->setContext(t.where);
      auto t0 = std::chrono::steady_clock::now();
      d.status = communicate(*t.step);
      d.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    {
      std::lock_guard<std::mutex> lock(commMu_);
      if (!d.status && !commFailed_) {
        commFailed_ = true;
        commError_ = d.status.message();
      }
      commResults_[t.ticket] = std::move(d);
    }
    commDone_.notify_all();
  }
}

Status Executor::wait(uint64_t ticket, double &seconds) {
  double limit = comm_->timeout() * 2 + 10;
  std::unique_lock<std::mutex> lock(commMu_);
  bool done = commDone_.wait_for(lock, std::chrono::duration<double>(limit),
                                 [&] { return commResults_.count(ticket) != 0; });
  if (!done) {
    lock.unlock();
    std::string why = fmt::format(
        "device {}: a collective did not return within {:.0f} s, twice the communicator's "
        "timeout; the communicator was aborted",
        device_, limit);
    comm_->abort(why);
    return Status::error(why);
  }
  Done d = std::move(commResults_[ticket]);
  commResults_.erase(ticket);
  seconds = d.seconds;
  return d.status;
}

Status Executor::runCollective(const program::Step &s) {
  if (!comm_)
    return StepHooks::runCollective(s);
  // Through the communication thread, after the collectives started before.
  double seconds = 0;
  return wait(push(s, collectiveWhere(context_, current_, s)), seconds);
}

Status Executor::startAsync(const program::Function &f, const program::Step &s, size_t index) {
  if (s.kind != program::Step::Collective)
    return Status::internal(fmt::format(
        "@{} step {} is a {} on queue {}: the CPU runs only collectives off queue 0", f.name,
        index, s.kind == program::Step::Copy ? "copy" : "kernel", s.queue));
  asyncTickets_[index] = push(s, collectiveWhere(context_, &f, s));
  return Status::ok();
}

Status Executor::waitAsync(size_t index, double &seconds) {
  auto it = asyncTickets_.find(index);
  if (it == asyncTickets_.end())
    return Status::internal(fmt::format("step {} was not started", index));
  uint64_t t = it->second;
  asyncTickets_.erase(it);
  return wait(t, seconds);
}

Status Executor::runGemm(const program::Step &s, bool libraryEpilogue) {
  const float *lhs = as<float>(s.args[0]), *rhs = as<float>(s.args[1]);
  float *out = as<float>(s.args[2]);
  int64_t parts = gemmParts(s.gemm);
  if (s.gemm.dtype != program::DType::F32) {
    // Half precision: widened to float32 and back (one thread; the
    // CPU has no half-precision BLAS to split).
    matmulTyped(s.gemm, data(s.args[0]), data(s.args[1]), data(s.args[2]));
  } else if (parts == 1 || pool_->threads() == 1) {
    for (int64_t p = 0; p < parts; ++p)
      matmulPart(s.gemm, lhs, rhs, out, p, parts);
  } else {
    pool_->parallelFor(parts, 1, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p)
        matmulPart(s.gemm, lhs, rhs, out, p, parts);
    });
  }
  return Status::ok();
}

Status Executor::runCopy(const program::Step &s) {
  std::memcpy(data(s.args[1]), data(s.args[0]), size_t(layout_->buffers[s.args[0]].bytes));
  return Status::ok();
}

Status Executor::beginTimed() {
  timedStart_ = std::chrono::steady_clock::now();
  return Status::ok();
}

Expected<double> Executor::endTimed() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - timedStart_).count();
}

Status Executor::runKernel(int kernel, const std::vector<int> &args) {
  void **ptrs = ptrs_;
  for (size_t i = 0; i < args.size(); ++i)
    ptrs[i] = data(args[i]);
  KernelFn fn = fns_[kernel];
  int64_t chunks = program_.kernels[kernel].chunks;
  if (chunks == 1 || pool_->threads() == 1) {
    for (int64_t c = 0; c < chunks; ++c)
      fn(ptrs, c);
    return Status::ok();
  }
  pool_->parallelFor(chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c)
      fn(ptrs, c);
  });
  return Status::ok();
}

std::string Executor::describe() const {
  if (comm_)
    return fmt::format("cpu device {} of {} ({} thread{}, {} communicator)", device_,
                       program_.numDevices(), pool_->threads(),
                       pool_->threads() == 1 ? "" : "s", comm_->kind());
  return fmt::format("cpu ({} thread{})", pool_->threads(), pool_->threads() == 1 ? "" : "s");
}

Status Executor::write(int id, const void *src, size_t bytes) {
  if (id < 0 || size_t(id) >= layout_->buffers.size() ||
      bytes > size_t(layout_->buffers[size_t(id)].bytes))
    return Status::internal("write to buffer " + std::to_string(id) + " out of range");
  std::memcpy(data(id), src, bytes);
  return Status::ok();
}

Status Executor::read(int id, void *dst, size_t bytes) {
  if (id < 0 || size_t(id) >= layout_->buffers.size() ||
      bytes > size_t(layout_->buffers[size_t(id)].bytes))
    return Status::internal("read of buffer " + std::to_string(id) + " out of range");
  std::memcpy(dst, data(id), bytes);
  return Status::ok();
}

} // namespace kiln::cpu
