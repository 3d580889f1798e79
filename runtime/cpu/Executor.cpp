//===- Executor.cpp - Runs a compiled program on the CPU ------------------===//
#include "runtime/cpu/Executor.h"

#include "runtime/core/Log.h"
#include "runtime/cpu/Attention.h"
#include "runtime/cpu/Blas.h"
#include "runtime/cpu/Gemm.h"
#include "runtime/cpu/Split.h"

#include <fmt/format.h>
#include <malloc.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>


namespace kiln::cpu {

Executor::~Executor() {
  queue_.reset();
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
  int device = options.device;
  if (Status st = checkCommunicator(program, comm, device); !st)
    return st;
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
  // Inter-op threads run the DAG of exact dependencies (the plan's own
  // may also order steps through a third, overlapping buffer: exact where
  // it matters, for a communication queue; conservative elsewhere).
  if (options.interOpThreads > 1)
    for (program::Function &f : e->program_.functions)
      program::exactDependencies(e->program_, f);
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
  if (comm) {
    bool inlineCalls = options.commThread == ExecutorOptions::CommThread::Off;
    e->queue_ = std::make_unique<CollectiveQueue>(*comm, device, inlineCalls);
  }
  if (options.interOpThreads > 1)
    e->interOp_ = std::make_unique<InterOpPool>(options.interOpThreads);
  std::string half = options.halfGemm;
  if (half.empty())
    if (const char *env = std::getenv("KILN_HALF_GEMM"))
      half = env;
  if (half == "widen")
    e->halfMode_ = HalfMode::Widen;
  else if (half == "library")
    e->halfMode_ = HalfMode::Library;
  else if (half == "dpbf16")
    e->halfMode_ = HalfMode::DotProducts;
  else if (half.empty() && program.deterministic)
    e->halfMode_ = HalfMode::Widen; // timed choices would make bits depend on the machine's load
  else if (!half.empty() && half != "measure")
    return Status::error("KILN_HALF_GEMM=" + half +
                         ": use measure (the default: time each way per GEMM shape, keep the "
                         "fastest), widen (float32 copies and sgemm), library (the BLAS "
                         "library's bf16/f16 GEMM) or dpbf16 (Kiln's bf16 GEMM on the CPU's "
                         "AVX512-BF16 dot products)");
  bool anyHalf = false;
  for (const program::Function &f : program.functions)
    for (const program::Step &st : f.steps)
      anyHalf = anyHalf || (st.kind == program::Step::Gemm && st.gemm.dtype != program::DType::F32);
  if (anyHalf)
    e->halfCache_ = std::make_unique<HalfGemmCache>(
        options.cacheDir.empty() ? "" : options.cacheDir + "/half-gemm-v2.txt", halfGemmMachine());
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

Status Executor::communicate(const program::Step &s) {
  return callCommunicator(*comm_, program_.mesh, s, device_, data(s.args[0]),
                          data(s.args.back()), [](void *to, const void *from, size_t n) {
                            std::memmove(to, from, n);
                            return Status::ok();
                          });
}

Status Executor::runCollective(const program::Step &s) {
  if (!comm_)
    return StepHooks::runCollective(s);
  // Through the communication thread, after the collectives started before.
  size_t index = current_ ? size_t(&s - current_->steps.data()) : 0;
  std::string where = current_ ? collectiveContext(context_, *current_, index) : context_;
  return queue_->run([this, &s] { return communicate(s); }, std::move(where));
}

Status Executor::startAsync(const program::Function &f, const program::Step &s, size_t index) {
  if (s.kind != program::Step::Collective)
    return Status::internal(fmt::format(
        "@{} step {} is a {} on queue {}: the CPU runs only collectives off queue 0", f.name,
        index, s.kind == program::Step::Copy ? "copy" : "kernel", s.queue));
  uint64_t t =
      queue_->push([this, &s] { return communicate(s); }, collectiveContext(context_, f, index));
  std::lock_guard<std::mutex> lock(ticketsMu_);
  asyncTickets_[index] = t;
  return Status::ok();
}

Status Executor::waitAsync(size_t index, double &seconds) {
  uint64_t t;
  {
    std::lock_guard<std::mutex> lock(ticketsMu_);
    auto it = asyncTickets_.find(index);
    if (it == asyncTickets_.end())
      return Status::internal(fmt::format("step {} was not started", index));
    t = it->second;
    asyncTickets_.erase(it);
  }
  return queue_->wait(t, seconds);
}

Status Executor::runGemm(const program::Step &s, bool libraryEpilogue) {
  const float *lhs = as<float>(s.args[0]), *rhs = as<float>(s.args[1]);
  float *out = as<float>(s.args[2]);
  int64_t parts = gemmParts(s.gemm);
  if (s.gemm.dtype != program::DType::F32) {
    // Half precision: the same parts as float32, on the pool; widened to
    // float32 for sgemm or the library's bf16/f16 GEMM, whichever was
    // measured faster for this shape.
    RunParts run = [&](int64_t n, const std::function<void(int64_t)> &job) {
      if (n == 1 || pool_->threads() == 1)
        serialParts(n, job);
      else
        pool_->forEach(n, std::min<int64_t>(n, pool_->threads()), job);
    };
    thread_local HalfGemmScratch scratch;
    matmulHalf(s.gemm, data(s.args[0]), data(s.args[1]), data(s.args[2]),
               halfGemmMethod(s, run), scratch, run);
  } else if (int t = gemmThreads(s.gemm, parts); t == 1) {
    for (int64_t p = 0; p < parts; ++p)
      matmulPart(s.gemm, lhs, rhs, out, p, parts);
  } else {
    // The parts are fixed by the shape; t only says how many threads share them.
    pool_->forEach(parts, t, [&](int64_t p) { matmulPart(s.gemm, lhs, rhs, out, p, parts); });
  }
  return Status::ok();
}

HalfGemm Executor::halfGemmMethod(const program::Step &s, const RunParts &run) {
  bool haveLibrary = hasLibraryHalfGemm(s.gemm.dtype);
  bool haveDot = hasDotProductHalfGemm(s.gemm.dtype);
  if (halfMode_ == HalfMode::Widen || (!haveLibrary && !haveDot))
    return HalfGemm::Widen;
  if (halfMode_ == HalfMode::Library)
    return haveLibrary ? HalfGemm::Library : HalfGemm::Widen;
  if (halfMode_ == HalfMode::DotProducts)
    return haveDot ? HalfGemm::DotProducts : HalfGemm::Widen;
  // Too small to time reliably (and to matter): widened, without measuring.
  if (program::gemmFlops(s.gemm) < double(1 << 19))
    return HalfGemm::Widen;
  std::string key = halfGemmKey(s.gemm);
  if (auto c = halfCache_->lookup(key))
    return c->method;
  // Every way this machine has, alternately, on this step's buffers; the
  // fastest of three runs each (after one warm-up each). The step then runs
  // for real.
  thread_local HalfGemmScratch scratch;
  std::vector<HalfGemm> ways = {HalfGemm::Widen};
  if (haveLibrary)
    ways.push_back(HalfGemm::Library);
  if (haveDot)
    ways.push_back(HalfGemm::DotProducts);
  double best[3] = {0, 0, 0};
  for (int rep = 0; rep < 4; ++rep)
    for (HalfGemm m : ways) {
      auto t0 = std::chrono::steady_clock::now();
      matmulHalf(s.gemm, data(s.args[0]), data(s.args[1]), data(s.args[2]), m, scratch, run);
      double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (rep > 0)
        best[int(m)] = best[int(m)] > 0 ? std::min(best[int(m)], sec) : sec;
    }
  HalfGemmChoice c;
  c.method = HalfGemm::Widen;
  for (HalfGemm m : ways)
    if (best[int(m)] < best[int(c.method)])
      c.method = m;
  c.widenSeconds = best[0];
  c.librarySeconds = best[1];
  c.dotSeconds = best[2];
  halfCache_->remember(key, c);
  log::debug("{} ({}): widened + sgemm {:.1f} us, library {:.1f} us, dpbf16 {:.1f} us: {}",
             program::gemmLabel(s.gemm), s.loc.empty() ? "?" : s.loc, best[0] * 1e6,
             best[1] * 1e6, best[2] * 1e6, halfGemmName(c.method));
  return c.method;
}

int Executor::gemmThreads(const MatmulShape &g, int64_t parts) const {
  if (parts == 1 || pool_->threads() == 1)
    return 1;
  int64_t lhs, rhs, out;
  gemmExtents(g, lhs, rhs, out);
  double flops = 2.0 * double(g.batch) * double(g.m) * double(g.n) * double(g.k);
  const SplitModel &model = splitModel();
  return splitThreads(model, estimateNanos(model, flops, 4.0 * double(lhs + rhs + out), true),
                      parts, pool_->threads());
}

Status Executor::runCopy(const program::Step &s) {
  std::memcpy(data(s.args[1]), data(s.args[0]), size_t(layout_->buffers[s.args[0]].bytes));
  return Status::ok();
}

Status Executor::runAttention(const program::Step &s) {
  std::vector<void *> args;
  for (int id : s.args)
    args.push_back(data(id));
  const program::AttentionParams &a = s.attention;
  uint64_t seed = 0;
  if (a.seedArg() >= 0)
    std::memcpy(&seed, args[size_t(a.seedArg())], sizeof seed);
  RunParts run = [&](int64_t n, const std::function<void(int64_t)> &job) {
    if (n == 1 || pool_->threads() == 1)
      serialParts(n, job);
    else
      pool_->forEach(n, int(std::min<int64_t>(n, pool_->threads())), job);
  };
  Status r = a.backward ? attentionBackward(a, args, seed, run)
                        : attentionForward(a, args, seed, run);
  if (!r)
    return Status::error(fmt::format("{} ({}): {}", program::attentionLabel(a),
                                     s.loc.empty() ? "?" : s.loc, r.message()));
  return Status::ok();
}

namespace {
/// The start of the timed region of the thread running a step (each
/// inter-op thread times its own steps; one region at a time per thread).
thread_local std::chrono::steady_clock::time_point timedRegionStart;
/// A kernel call's buffer pointers, per thread (inter-op threads call
/// kernels at once); the pool's threads read the caller's while it waits.
thread_local void *kernelArgs[4096];
} // namespace

Status Executor::beginTimed() {
  timedRegionStart = std::chrono::steady_clock::now();
  return Status::ok();
}

Expected<double> Executor::endTimed() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - timedRegionStart).count();
}

Status Executor::runKernel(int kernel, const std::vector<int> &args) {
  void **ptrs = kernelArgs;
  double bytes = 0; // every argument read or written once
  for (size_t i = 0; i < args.size(); ++i) {
    ptrs[i] = data(args[i]);
    bytes += double(program_.buffers[size_t(args[i])].bytes);
  }
  KernelFn fn = fns_[kernel];
  const program::Kernel &k = program_.kernels[kernel];
  int64_t chunks = k.chunks;
  const SplitModel &model = splitModel();
  int t = chunks == 1 || pool_->threads() == 1
              ? 1
              : splitThreads(model, estimateNanos(model, double(k.flops), bytes, false), chunks,
                             pool_->threads());
  if (t == 1) {
    for (int64_t c = 0; c < chunks; ++c)
      fn(ptrs, c);
    return Status::ok();
  }
  pool_->forEach(chunks, t, [&](int64_t c) { fn(ptrs, c); });
  return Status::ok();
}

std::string Executor::interOpNote() const {
  return interOp_ ? fmt::format(", {} inter-op threads", interOp_->threads()) : "";
}

std::string Executor::describe() const {
  if (comm_)
    return fmt::format("cpu device {} of {} ({} thread{}{}, {} communicator)", device_,
                       program_.numDevices(), pool_->threads(),
                       pool_->threads() == 1 ? "" : "s",
                       interOpNote() + (queue_->isInline() ? ", no communication thread" : ""),
                       comm_->kind());
  return fmt::format("cpu ({} thread{}{})", pool_->threads(), pool_->threads() == 1 ? "" : "s",
                     interOpNote());
}

Status Executor::write(int id, const void *src, size_t bytes) {
  if (id < 0 || size_t(id) >= layout_->buffers.size() ||
      bytes > size_t(layout_->buffers[size_t(id)].bytes))
    return Status::internal("write to buffer " + std::to_string(id) + " out of range");
  if (!program_.holds(device_, id))
    return notHeld(program_, device_, id, "write");
  std::memcpy(data(id), src, bytes);
  return Status::ok();
}

Status Executor::read(int id, void *dst, size_t bytes) {
  if (id < 0 || size_t(id) >= layout_->buffers.size() ||
      bytes > size_t(layout_->buffers[size_t(id)].bytes))
    return Status::internal("read of buffer " + std::to_string(id) + " out of range");
  if (!program_.holds(device_, id))
    return notHeld(program_, device_, id, "read");
  std::memcpy(dst, data(id), bytes);
  return Status::ok();
}

} // namespace kiln::cpu
