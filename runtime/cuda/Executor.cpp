//===- Executor.cpp - Runs a compiled program on a GPU --------------------===//
#include "runtime/cuda/Executor.h"

#include "runtime/core/Collectives.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace kiln::cuda {

Executor::~Executor() {
  if (!device_)
    return;
  (void)device_->synchronize();
  for (auto &[id, st] : staging_)
    for (int i = 0; i < 2; ++i) {
      if (st.host[i])
        device_->releaseHost(st.host[i]);
      if (st.device[i])
        device_->release(st.device[i]);
    }
  if (arena_)
    device_->release(arena_);
}

Expected<std::unique_ptr<Executor>> Executor::create(const Package &pkg,
                                                     std::unique_ptr<Device> device) {
  return create(pkg, std::move(device), ExecutorOptions());
}

Expected<std::unique_ptr<Executor>> Executor::create(const Package &pkg,
                                                     std::unique_ptr<Device> device,
                                                     const ExecutorOptions &options) {
  if (!pkg.hasCuda)
    return Status::error(pkg.path + ": the artifact has no CUDA kernels; compile it with "
                                    "kilnc --target=cpu,cuda");
  int meshDevice = options.device;
  if (Status s = checkCommunicator(pkg.program, options.communicator, meshDevice); !s)
    return s;
  std::unique_ptr<Executor> e(new Executor());
  e->program_ = pkg.program;
  e->meshDevice_ = meshDevice;
  e->layout_ = &e->program_.plan(meshDevice);
  e->comm_ = options.communicator;
  if (e->comm_ && options.streams && device->nativeStream(Stream::Compute)) {
    e->streams_ = options.streams;
    if (Status s = e->streams_->setComputeStream(device->nativeStream(Stream::Compute)); !s)
      return s;
  }
  e->plan_ = pkg.cudaPlan;
  e->device_ = std::move(device);
  Device &d = *e->device_;
  size_t bytes = size_t(std::max<int64_t>(e->layout_->arenaBytes, 256));
  auto arena = d.alloc(bytes);
  if (!arena)
    return Status::error(fmt::format("{}: cannot allocate the {:.1f} MiB arena on {}: {}",
                                     pkg.path, double(bytes) / (1 << 20), d.describe(),
                                     arena.status().message()));
  e->arena_ = *arena;
  if (Status s = d.fill(e->arena_, 0, bytes, Stream::Compute); !s)
    return s;
  if (Status s = d.loadKernels(pkg); !s)
    return s;
  for (const std::vector<gpu::Launch> &k : e->plan_.kernels) {
    std::vector<int> fs;
    for (const gpu::Launch &l : k) {
      auto f = d.function(l.function);
      if (!f)
        return f.status();
      fs.push_back(*f);
    }
    e->functions_.push_back(std::move(fs));
  }
  // Staging for every input buffer of every entry point.
  for (const program::Function &f : e->program_.functions)
    for (int id : f.args) {
      const program::Buffer &b = e->layout_->buffers[size_t(id)];
      if (b.role != program::Role::Input || e->staging_.count(id) ||
          !e->program_.holds(meshDevice, id))
        continue;
      Staging st;
      for (int i = 0; i < 2; ++i) {
        size_t n = size_t(std::max<int64_t>(b.bytes, 1));
        auto h = d.allocHost(n);
        if (!h)
          return h.status();
        st.host[i] = *h;
        auto dv = d.alloc(n);
        if (!dv)
          return dv.status();
        st.device[i] = *dv;
        auto u = d.createEvent(), c = d.createEvent();
        if (!u)
          return u.status();
        if (!c)
          return c.status();
        st.uploaded[i] = *u;
        st.consumed[i] = *c;
      }
      e->staging_[id] = st;
    }
  auto a = d.createEvent(), b = d.createEvent();
  if (!a)
    return a.status();
  if (!b)
    return b.status();
  e->eventA_ = *a;
  e->eventB_ = *b;
  auto anchor = d.createEvent();
  if (!anchor)
    return anchor.status();
  e->anchor_ = *anchor;
  e->profile_ = StepProfile(e->program_.kernels.size());
  if (Status s = d.synchronize(); !s)
    return s;
  return e;
}

Status Executor::write(int id, const void *src, size_t bytes) {
  if (id < 0 || size_t(id) >= layout_->buffers.size() ||
      bytes > size_t(layout_->buffers[size_t(id)].bytes))
    return Status::internal("write to buffer " + std::to_string(id) + " out of range");
  if (!program_.holds(meshDevice_, id))
    return notHeld(program_, meshDevice_, id, "write");
  auto it = staging_.find(id);
  if (it == staging_.end()) // parameters and state: straight into the arena
    return device_->upload(address(id), src, bytes, Stream::Compute);
  Staging &st = it->second;
  int slot = st.next;
  st.next ^= 1;
  if (st.used[slot]) {
    // The host slot is free once its last upload finished; the device slot
    // once the compute stream copied it into the arena.
    if (Status s = device_->synchronize(st.uploaded[slot]); !s)
      return s;
    if (Status s = device_->wait(Stream::Copy, st.consumed[slot]); !s)
      return s;
  }
  std::memcpy(st.host[slot], src, bytes);
  if (Status s = device_->upload(st.device[slot], st.host[slot], bytes, Stream::Copy); !s)
    return s;
  if (Status s = device_->record(st.uploaded[slot], Stream::Copy); !s)
    return s;
  st.used[slot] = true;
  st.pending = slot;
  return Status::ok();
}

Status Executor::read(int id, void *dst, size_t bytes) {
  if (id < 0 || size_t(id) >= layout_->buffers.size() ||
      bytes > size_t(layout_->buffers[size_t(id)].bytes))
    return Status::internal("read of buffer " + std::to_string(id) + " out of range");
  if (!program_.holds(meshDevice_, id))
    return notHeld(program_, meshDevice_, id, "read");
  if (streams_) // the collectives' deadline, before a wait that has none
    if (Status s = streams_->synchronize(); !s)
      return s;
  if (Status s = device_->download(dst, address(id), bytes, Stream::Compute); !s)
    return s;
  return device_->synchronize();
}

Status Executor::runKernel(int kernel, const std::vector<int> &args) {
  std::vector<DevicePtr> ptrs(args.size());
  std::vector<void *> params(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    ptrs[i] = address(args[i]);
    params[i] = &ptrs[i];
  }
  const std::vector<gpu::Launch> &ls = plan_.kernels[size_t(kernel)];
  for (size_t i = 0; i < ls.size(); ++i)
    if (Status s = device_->launch(functions_[size_t(kernel)][i], ls[i], params.data(),
                                   Stream::Compute);
        !s)
      return Status::error(fmt::format("kernel {} ({}): {}", program_.kernels[size_t(kernel)].symbol,
                                       ls[i].function, s.message()),
                           s.kind());
  return Status::ok();
}

Status Executor::runSteps(const std::string &name, size_t begin, size_t end) {
  const program::Function *f = program_.function(name);
  if (!f)
    return Status::error("the artifact has no @" + name);
  // Inputs staged for this function: wait for their upload, copy them in.
  for (int id : f->args) {
    auto it = staging_.find(id);
    if (it == staging_.end() || it->second.pending < 0)
      continue;
    Staging &st = it->second;
    int slot = st.pending;
    st.pending = -1;
    if (Status s = device_->wait(Stream::Compute, st.uploaded[slot]); !s)
      return s;
    if (Status s = device_->copy(address(id), st.device[slot],
                                 size_t(layout_->buffers[size_t(id)].bytes), Stream::Compute);
        !s)
      return s;
    if (Status s = device_->record(st.consumed[slot], Stream::Compute); !s)
      return s;
  }
  current_ = f;
  if (Status s = anchorTrace(); !s)
    return s;
  Status r = kiln::runSteps(program_, *f, begin, end, *this, profiling_ ? &profile_ : nullptr);
  current_ = nullptr;
  return r;
}

Status Executor::communicate(const program::Step &s, size_t index) {
  if (current_)
    comm_->setContext(collectiveContext(context_, *current_, index));
  auto ptr = [](DevicePtr p) { return reinterpret_cast<void *>(uintptr_t(p)); };
  return callCommunicator(
      *comm_, program_.mesh, s, meshDevice_, ptr(address(s.args[0])), ptr(address(s.args.back())),
      [&](void *to, const void *from, size_t n) {
        if (Status x = device_->copy(DevicePtr(uintptr_t(to)), DevicePtr(uintptr_t(from)), n,
                                     Stream::Compute);
            !x)
          return x;
        // With streams the collective waits for the copy on the device.
        return streams_ ? Status::ok() : device_->synchronize();
      });
}

Status Executor::runCollective(const program::Step &s) {
  if (!comm_)
    return StepHooks::runCollective(s);
  size_t index = current_ ? size_t(&s - current_->steps.data()) : 0;
  if (streams_) {
    // Enqueued after the compute work so far; later compute waits for it.
    if (Status x = communicate(s, index); !x)
      return x;
    return streams_->computeWaits();
  }
  // In schedule order on this thread: what the kernels wrote must be in
  // memory first; the communicator returns when the result is.
  if (Status x = device_->synchronize(); !x)
    return x;
  return communicate(s, index);
}

Status Executor::startAsync(const program::Function &, const program::Step &s, size_t index) {
  if (s.kind != program::Step::Collective)
    return Status::internal("only collectives run off queue 0");
  return communicate(s, index);
}

Status Executor::waitAsync(size_t, double &seconds) {
  seconds = -1; // on the device: the host does not see it run
  return streams_->computeWaits();
}

Status Executor::synchronize() {
  if (streams_)
    if (Status s = streams_->synchronize(); !s)
      return s;
  return device_->synchronize();
}

Status Executor::runGemm(const program::Step &s, bool libraryEpilogue) {
  if (libraryEpilogue) {
    // The epilogue kernel's work in the library call: the result goes
    // straight to the epilogue's output (and the pre-activation to aux).
    Device::Epilogue e;
    e.activation = s.lt.activation;
    e.bias = s.lt.bias >= 0 ? address(s.lt.bias) : 0;
    e.aux = s.lt.aux >= 0 ? address(s.lt.aux) : 0;
    return device_->gemm(s.gemm, address(s.args[0]), address(s.args[1]), address(s.lt.out),
                         Stream::Compute, &e);
  }
  return device_->gemm(s.gemm, address(s.args[0]), address(s.args[1]), address(s.args[2]),
                       Stream::Compute);
}

Status Executor::runCopy(const program::Step &s) {
  return device_->copy(address(s.args[1]), address(s.args[0]),
                       size_t(layout_->buffers[size_t(s.args[0])].bytes), Stream::Compute);
}

Status Executor::beginTimed() { return device_->record(eventA_, Stream::Compute); }

Status Executor::anchorTrace() {
  timedStart_ = -1;
  Tracer *t = profile_.tracer;
  if (!t || !t->enabled())
    return Status::ok();
  // The event happens once the work queued before it is done; the host
  // reads its clock as soon as it sees that (its wake-up latency, a few
  // microseconds, is the alignment's error).
  if (Status s = device_->record(anchor_, Stream::Compute); !s)
    return s;
  if (Status s = device_->synchronize(anchor_); !s)
    return s;
  anchorHost_ = t->now();
  timedStart_ = anchorHost_;
  return Status::ok();
}

Expected<double> Executor::endTimed() {
  if (Status x = device_->record(eventB_, Stream::Compute); !x)
    return x;
  if (Status x = device_->synchronize(eventB_); !x)
    return x;
  auto ms = device_->elapsed(eventA_, eventB_);
  if (!ms)
    return ms.status();
  if (timedStart_ >= 0) { // traced: where the region began on the GPU's clock
    auto since = device_->elapsed(anchor_, eventA_);
    if (!since)
      return since.status();
    timedStart_ = anchorHost_ + double(*since) / 1e3;
  }
  return *ms / 1e3;
}

} // namespace kiln::cuda
