//===- Emulator.cpp - Run CUDA kernels on the CPU, for tests --------------===//
//
// One BlockRunner per OS thread runs blocks one at a time. A block's threads
// are fibers on a FIFO run queue; each runs until it calls into the emulator
// (a barrier, a warp primitive, __trap) or returns, and the scheduler then
// decides, on its own stack, what that event completes:
//  * a barrier completes when every thread that has not exited waits at one;
//  * a warp primitive completes when every lane named in its mask waits at
//    the same primitive (kind, mask and source line);
//  * __activemask() completes when the whole block is blocked: the lanes of a
//    warp waiting at the same __activemask() call form the mask;
//  * a block where nothing can run while threads still wait is a deadlock.
// Completed threads go back on the queue in thread order, so the schedule,
// and with it every result, is the same on every run.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/emu/Emulator.h"

#include "runtime/cuda/emu/Fiber.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <signal.h>
#include <sys/mman.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace kiln::cuda::emu {

namespace {

enum class State : uint8_t { Runnable, Barrier, Warp, Exited, Trapped };

class BlockRunner;

/// One emulated CUDA thread. Standard layout with `pub` first: the hooks
/// receive &pub and convert back.
struct EmuThread {
  KilnEmuThread pub;
  FiberContext ctx;
  BlockRunner *runner = nullptr;
  unsigned linear = 0;
  State state = State::Runnable;
  // The barrier it waits at.
  int barrierKind = 0, predicate = 0, line = 0, column = 0;
  int barrierResult = 0;
  // The warp primitive it waits at.
  KilnEmuWarpOp op{};
  unsigned long long result = 0;
  const char *trapWhat = nullptr;
};

EmuThread &fromPublic(KilnEmuThread *self) {
  return *reinterpret_cast<EmuThread *>(self);
}

/// One launch's configuration, shared by its runners.
struct Config {
  Shim shim = nullptr;
  Dim3 grid, block;
  size_t dynamicSharedBytes = 0;
  void **params = nullptr;
  const LaunchOptions *options = nullptr;
  unsigned threadsPerBlock = 0;
  size_t stackBytes = 0;
};

const char *warpName(int kind) {
  switch (kind) {
  case KILN_EMU_SHFL_IDX:
    return "__shfl_sync";
  case KILN_EMU_SHFL_UP:
    return "__shfl_up_sync";
  case KILN_EMU_SHFL_DOWN:
    return "__shfl_down_sync";
  case KILN_EMU_SHFL_XOR:
    return "__shfl_xor_sync";
  case KILN_EMU_BALLOT:
    return "__ballot_sync";
  case KILN_EMU_ANY:
    return "__any_sync";
  case KILN_EMU_ALL:
    return "__all_sync";
  case KILN_EMU_SYNCWARP:
    return "__syncwarp";
  case KILN_EMU_ACTIVEMASK:
    return "__activemask";
  case KILN_EMU_REDUCE_ADD:
    return "__reduce_add_sync";
  case KILN_EMU_REDUCE_MIN_U:
  case KILN_EMU_REDUCE_MIN_I:
    return "__reduce_min_sync";
  case KILN_EMU_REDUCE_MAX_U:
  case KILN_EMU_REDUCE_MAX_I:
    return "__reduce_max_sync";
  case KILN_EMU_REDUCE_AND:
    return "__reduce_and_sync";
  case KILN_EMU_REDUCE_OR:
    return "__reduce_or_sync";
  case KILN_EMU_REDUCE_XOR:
    return "__reduce_xor_sync";
  default:
    return "an unknown warp primitive";
  }
}

const char *barrierName(int kind) {
  switch (kind) {
  case KILN_EMU_SYNCTHREADS_COUNT:
    return "__syncthreads_count";
  case KILN_EMU_SYNCTHREADS_AND:
    return "__syncthreads_and";
  case KILN_EMU_SYNCTHREADS_OR:
    return "__syncthreads_or";
  default:
    return "__syncthreads";
  }
}

bool isShuffle(int kind) {
  return kind >= KILN_EMU_SHFL_IDX && kind <= KILN_EMU_SHFL_XOR;
}

/// A call site for messages. Sites are told apart by line and column (the
/// column is known only where the host compiler has __builtin_COLUMN).
std::string site(int line, int /*column*/) {
  return fmt::format("line {}", line);
}

/// "0..15, 17, 20..31" for sorted ids.
std::string idList(const std::vector<unsigned> &ids) {
  std::string out;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1)
      ++j;
    if (!out.empty())
      out += ", ";
    out += j == i ? fmt::format("{}", ids[i])
                  : fmt::format("{}..{}", ids[i], ids[j]);
    i = j + 1;
  }
  return out;
}

/// The set bits of a lane mask, lowest first, for range-for.
struct LaneRange {
  unsigned mask;
  struct Iterator {
    unsigned rest;
    unsigned operator*() const { return unsigned(__builtin_ctz(rest)); }
    Iterator &operator++() {
      rest &= rest - 1;
      return *this;
    }
    bool operator!=(const Iterator &o) const { return rest != o.rest; }
  };
  Iterator begin() const { return {mask}; }
  Iterator end() const { return {0}; }
};
LaneRange lanesOf(unsigned mask) { return {mask}; }

std::vector<unsigned> laneList(unsigned mask) {
  std::vector<unsigned> lanes;
  for (unsigned l : lanesOf(mask))
    lanes.push_back(l);
  return lanes;
}

/// A value read from a lane that does not take part: a NaN for floating
/// types of every width, conspicuous for integers.
unsigned long long poison(int bytes) {
  switch (bytes) {
  case 1:
    return 0xffull;
  case 2:
    return 0x7fffull;
  case 4:
    return 0x7fc0bad0ull;
  default:
    return 0x7ff8badbadbadbadull;
  }
}

/// Whether two lanes wait at the same warp primitive.
bool sameWarpOp(const KilnEmuWarpOp &a, const KilnEmuWarpOp &b) {
  if (a.kind != b.kind || a.mask != b.mask)
    return false;
  // __syncwarp may meet at different call sites (sm_70+).
  return a.kind == KILN_EMU_SYNCWARP ||
         (a.line == b.line && a.column == b.column);
}

/// The source lane of lane `lane`'s shuffle, as PTX's shfl.sync computes it
/// (c = ((32 - width) << 8) | clamp), or `lane` itself where the mode clamps.
unsigned shuffleSource(const KilnEmuWarpOp &op, unsigned lane) {
  const int b = op.arg & 31;
  const int segmask = (32 - op.width) & 31;
  const int clamp = op.kind == KILN_EMU_SHFL_UP ? 0 : 31;
  const int maxLane = (int(lane) & segmask) | (clamp & ~segmask & 31);
  const int minLane = int(lane) & segmask;
  int j = int(lane);
  bool valid = true;
  switch (op.kind) {
  case KILN_EMU_SHFL_IDX:
    j = minLane | (b & ~segmask & 31);
    valid = j <= maxLane;
    break;
  case KILN_EMU_SHFL_UP:
    j = int(lane) - b;
    valid = j >= maxLane;
    break;
  case KILN_EMU_SHFL_DOWN:
    j = int(lane) + b;
    valid = j <= maxLane;
    break;
  case KILN_EMU_SHFL_XOR:
    j = int(lane) ^ b;
    valid = j <= maxLane;
    break;
  }
  return valid ? unsigned(j) : lane;
}

class BlockRunner {
public:
  /// Sizes the thread records, stacks and shared memory for `config`.
  Status prepare(const Config &config);
  /// Runs block `block` (linear, x fastest) to completion or to an error.
  Status run(uint64_t block);
  const Config &config() const { return *cfg_; }
  uint64_t switches() const { return switches_; }
  /// Whether `address` is in the guard page below thread `t`'s stack.
  bool inGuardPage(const EmuThread &t, const void *address) const {
    auto a = reinterpret_cast<uintptr_t>(address);
    auto base = reinterpret_cast<uintptr_t>(stackBases_[t.linear]);
    return a < base && a + size_t(sysconf(_SC_PAGESIZE)) >= base;
  }
  ~BlockRunner();

  /// Called on a fiber: back to the scheduler until resumed.
  void suspend(EmuThread &t) { fiberSwitch(t.ctx, scheduler_); }
  /// Called on a fiber that is done (returned or trapped): never resumed.
  [[noreturn]] void leave(EmuThread &t) {
    fiberSwitch(t.ctx, scheduler_, /*leaving=*/true);
    __builtin_trap();
  }

private:
  Status handle(EmuThread &t);
  Status arriveWarp(EmuThread &t);
  void tryComplete(EmuThread &t);
  void resolveWarp(unsigned warp, KilnEmuWarpOp key);
  Status onExit(EmuThread &t);
  Status checkBarrier();
  bool resolveActiveMasks();
  Status deadlock();

  void push(EmuThread &t);
  EmuThread *lane(unsigned warp, unsigned lane) {
    unsigned id = warp * 32 + lane;
    return id < threads_.size() ? &threads_[id] : nullptr;
  }
  /// Lanes of `warp` that do not exist (partial warp) or have exited.
  unsigned absentLanes(unsigned warp);
  /// Those of `lanes` that do not wait at the warp primitive `key`.
  unsigned missingLanes(unsigned warp, const KilnEmuWarpOp &key,
                        unsigned lanes);
  std::string where() const;
  std::string who(const EmuThread &t) const;
  std::string describe(EmuThread &t);
  std::vector<unsigned> idsWhere(State state) const;
  Status error(std::string what) const {
    return Status::error(fmt::format("{}: {}", where(), what));
  }

  const Config *cfg_ = nullptr;
  std::vector<EmuThread> threads_;
  StackPool stacks_;
  std::vector<void *> stackBases_;
  FiberContext scheduler_;
  std::vector<unsigned> queue_; ///< ring buffer of runnable thread ids
  size_t head_ = 0, count_ = 0;
  unsigned barrierWaiters_ = 0, exited_ = 0;
  // Per warp: lanes that exist, have exited, wait at a warp primitive.
  std::vector<unsigned> present_, exitedLanes_, waitingLanes_;
  std::unique_ptr<unsigned char, void (*)(void *)> shared_{nullptr, std::free};
  size_t sharedCapacity_ = 0;
  KilnEmuDim blockIdx_{};
  uint64_t switches_ = 0;
  void *altStack_ = nullptr; ///< the signal stack this runner installed
};

//===--- Stack overflow reports -------------------------------------------===//
//
// A fiber that overflows its stack faults on the guard page below it
// (modules are compiled with -fstack-clash-protection, so a large frame
// probes every page). A SIGSEGV handler, installed once and run on an
// alternate signal stack, names the emulated thread and the fix, then hands
// the fault to the handler that was there before (or the default action).

thread_local const BlockRunner *tlsRunner = nullptr;
thread_local const EmuThread *tlsRunning = nullptr; ///< the fiber on the CPU
struct sigaction previousSegv;
const size_t kAltStackBytes = 64 * 1024;

void writeText(const char *text) {
  size_t n = std::strlen(text);
  while (n > 0) {
    ssize_t w = write(2, text, n);
    if (w <= 0)
      return;
    text += w;
    n -= size_t(w);
  }
}

void writeNumber(uint64_t v) {
  char buf[24];
  char *p = buf + sizeof(buf);
  *--p = 0;
  do
    *--p = char('0' + v % 10);
  while (v /= 10);
  writeText(p);
}

void segvHandler(int sig, siginfo_t *info, void *context) {
  const BlockRunner *runner = tlsRunner;
  const EmuThread *t = tlsRunning;
  if (runner && t && runner->inGuardPage(*t, info->si_addr)) {
    const Config &c = runner->config();
    writeText("CUDA emulator: stack overflow in kernel '");
    writeText(c.options->kernel.c_str());
    writeText("', emulated thread ");
    writeNumber(t->linear);
    writeText(" of block (");
    writeNumber(t->pub.blockIdx.x);
    writeText(",");
    writeNumber(t->pub.blockIdx.y);
    writeText(",");
    writeNumber(t->pub.blockIdx.z);
    writeText("): its stack has ");
    writeNumber(c.stackBytes / 1024);
    writeText(" KiB; raise LaunchOptions::stackBytes or $KILN_EMU_STACK_KIB\n");
  }
  if (previousSegv.sa_flags & SA_SIGINFO) {
    if (previousSegv.sa_sigaction) {
      previousSegv.sa_sigaction(sig, info, context);
      return;
    }
  } else if (previousSegv.sa_handler != SIG_DFL &&
             previousSegv.sa_handler != SIG_IGN) {
    previousSegv.sa_handler(sig);
    return;
  }
  signal(SIGSEGV, SIG_DFL); // the fault repeats and takes the default action
}

void installOverflowReports() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action;
    std::memset(&action, 0, sizeof(action));
    action.sa_sigaction = segvHandler;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    sigaction(SIGSEGV, &action, &previousSegv);
  });
}

BlockRunner::~BlockRunner() {
  if (!altStack_)
    return;
  stack_t off;
  std::memset(&off, 0, sizeof(off));
  off.ss_flags = SS_DISABLE;
  sigaltstack(&off, nullptr);
  munmap(altStack_, kAltStackBytes);
}

//===--- Hooks: the services kernel code calls (on its fiber)
//--------------===//

void hookTrap(KilnEmuThread *self, const char *what, int line) {
  EmuThread &t = fromPublic(self);
  t.state = State::Trapped;
  t.trapWhat = what;
  t.line = line;
  t.runner->leave(t);
}

int hookBarrier(KilnEmuThread *self, int kind, int predicate, int line,
                int column) {
  EmuThread &t = fromPublic(self);
  t.state = State::Barrier;
  t.barrierKind = kind;
  t.predicate = predicate;
  t.line = line;
  t.column = column;
  t.runner->suspend(t);
  return t.barrierResult;
}

unsigned long long hookWarp(KilnEmuThread *self, const KilnEmuWarpOp *op) {
  EmuThread &t = fromPublic(self);
  t.state = State::Warp;
  t.op = *op;
  t.runner->suspend(t);
  return t.result;
}

const KilnEmuHooks kHooks = {hookTrap, hookBarrier, hookWarp};

void fiberMain(void *arg) {
  EmuThread &t = *static_cast<EmuThread *>(arg);
  const Config &config = t.runner->config();
  config.shim(&t.pub, config.params);
  t.state = State::Exited;
  t.runner->leave(t);
}

//===--- BlockRunner ------------------------------------------------------===//

Status BlockRunner::prepare(const Config &config) {
  cfg_ = &config;
  // The overflow report runs on a signal stack of this OS thread's own.
  installOverflowReports();
  stack_t current;
  if (!altStack_ && sigaltstack(nullptr, &current) == 0 &&
      (current.ss_flags & SS_DISABLE)) {
    void *m = mmap(nullptr, kAltStackBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m != MAP_FAILED) {
      stack_t alt;
      std::memset(&alt, 0, sizeof(alt));
      alt.ss_sp = m;
      alt.ss_size = kAltStackBytes;
      if (sigaltstack(&alt, nullptr) == 0)
        altStack_ = m;
      else
        munmap(m, kAltStackBytes);
    }
  }
  const unsigned n = config.threadsPerBlock;
  threads_.clear();
  threads_.resize(n);
  queue_.assign(n, 0);
  const unsigned warps = (n + 31) / 32;
  present_.assign(warps, ~0u);
  if (n % 32)
    present_[warps - 1] = (1u << (n % 32)) - 1;
  exitedLanes_.assign(warps, 0);
  waitingLanes_.assign(warps, 0);
  stacks_.setStackBytes(config.stackBytes);
  stackBases_.resize(n);
  for (unsigned i = 0; i < n; ++i) {
    Expected<void *> base = stacks_.stack(i);
    if (!base)
      return base.status();
    stackBases_[i] = *base;
  }
  size_t want = std::max<size_t>(config.dynamicSharedBytes, 16);
  want = (want + 63) / 64 * 64;
  if (want > sharedCapacity_) {
    shared_.reset(static_cast<unsigned char *>(std::aligned_alloc(64, want)));
    if (!shared_)
      return Status::error(fmt::format(
          "CUDA emulator: cannot allocate {} bytes of shared memory", want));
    sharedCapacity_ = want;
  }
  return Status::ok();
}

std::string BlockRunner::where() const {
  const Config &c = *cfg_;
  return fmt::format("CUDA emulator: kernel '{}', block ({},{},{}) of grid "
                     "({},{},{}), block size ({},{},{})",
                     c.options->kernel, blockIdx_.x, blockIdx_.y, blockIdx_.z,
                     c.grid.x, c.grid.y, c.grid.z, c.block.x, c.block.y,
                     c.block.z);
}

std::string BlockRunner::who(const EmuThread &t) const {
  const KilnEmuDim &i = t.pub.threadIdx;
  std::string s = fmt::format("thread {} (lane {} of warp {}", t.linear,
                              t.linear & 31, t.linear >> 5);
  if (cfg_->block.y > 1 || cfg_->block.z > 1)
    s += fmt::format(", threadIdx ({},{},{})", i.x, i.y, i.z);
  return s + ")";
}

std::vector<unsigned> BlockRunner::idsWhere(State state) const {
  std::vector<unsigned> ids;
  for (const EmuThread &t : threads_)
    if (t.state == state)
      ids.push_back(t.linear);
  return ids;
}

void BlockRunner::push(EmuThread &t) {
  if (t.state == State::Warp)
    waitingLanes_[t.linear >> 5] &= ~(1u << (t.linear & 31));
  t.state = State::Runnable;
  queue_[(head_ + count_) % queue_.size()] = t.linear;
  ++count_;
}

unsigned BlockRunner::absentLanes(unsigned warp) {
  return ~present_[warp] | exitedLanes_[warp];
}

unsigned BlockRunner::missingLanes(unsigned warp, const KilnEmuWarpOp &key,
                                   unsigned lanes) {
  unsigned missing = lanes & ~waitingLanes_[warp];
  for (unsigned l : lanesOf(lanes & waitingLanes_[warp])) {
    EmuThread *u = lane(warp, l);
    if (!u || u->state != State::Warp || !sameWarpOp(u->op, key))
      missing |= 1u << l;
  }
  return missing;
}

Status BlockRunner::run(uint64_t block) {
  const Config &c = *cfg_;
  const unsigned n = c.threadsPerBlock;
  blockIdx_ = {unsigned(block % c.grid.x),
               unsigned(block / c.grid.x % c.grid.y),
               unsigned(block / (uint64_t(c.grid.x) * c.grid.y))};
  if (c.options->poisonSharedMemory && c.dynamicSharedBytes)
    std::memset(shared_.get(), 0xff, c.dynamicSharedBytes);
  for (unsigned i = 0; i < n; ++i) {
    EmuThread &t = threads_[i];
    t.pub.threadIdx = {i % c.block.x, i / c.block.x % c.block.y,
                       i / (c.block.x * c.block.y)};
    t.pub.blockIdx = blockIdx_;
    t.pub.blockDim = {c.block.x, c.block.y, c.block.z};
    t.pub.gridDim = {c.grid.x, c.grid.y, c.grid.z};
    t.pub.dynamicShared = shared_.get();
    t.pub.dynamicSharedBytes = c.dynamicSharedBytes;
    t.pub.hooks = &kHooks;
    t.pub.abiVersion = KILN_EMU_ABI_VERSION;
    t.runner = this;
    t.linear = i;
    t.state = State::Runnable;
    fiberInit(t.ctx, stackBases_[i], stacks_.stackBytes(), fiberMain, &t);
    queue_[i] = i;
  }
  std::fill(exitedLanes_.begin(), exitedLanes_.end(), 0u);
  std::fill(waitingLanes_.begin(), waitingLanes_.end(), 0u);
  head_ = 0;
  count_ = n;
  barrierWaiters_ = 0;
  exited_ = 0;

  while (true) {
    if (count_ == 0) {
      if (exited_ == n)
        return Status::ok();
      if (resolveActiveMasks())
        continue;
      return deadlock();
    }
    EmuThread &t = threads_[queue_[head_]];
    head_ = (head_ + 1) % n;
    --count_;
    ++switches_;
    tlsRunner = this;
    tlsRunning = &t;
    fiberSwitch(scheduler_, t.ctx);
    tlsRunning = nullptr;
    if (Status s = handle(t); !s)
      return s;
  }
}

Status BlockRunner::handle(EmuThread &t) {
  switch (t.state) {
  case State::Exited:
    ++exited_;
    exitedLanes_[t.linear >> 5] |= 1u << (t.linear & 31);
    return onExit(t);
  case State::Barrier:
    ++barrierWaiters_;
    return checkBarrier();
  case State::Warp:
    waitingLanes_[t.linear >> 5] |= 1u << (t.linear & 31);
    return arriveWarp(t);
  case State::Trapped:
    return error(fmt::format("{} stopped the kernel: {}{}", who(t),
                             t.trapWhat ? t.trapWhat : "trap",
                             t.line ? fmt::format(" (line {})", t.line) : ""));
  case State::Runnable:
    break;
  }
  return Status::internal(
      fmt::format("{}: {} switched back while runnable", where(), who(t)));
}

Status BlockRunner::arriveWarp(EmuThread &t) {
  const KilnEmuWarpOp &op = t.op;
  if (op.kind == KILN_EMU_ACTIVEMASK)
    return Status::ok(); // resolved once the block is blocked
  const unsigned warp = t.linear >> 5, self = t.linear & 31;
  auto call = [&] {
    return fmt::format("{} ({}, mask {:#010x})", warpName(op.kind),
                       site(op.line, op.column), op.mask);
  };
  if (!(op.mask >> self & 1u))
    return error(fmt::format(
        "{} calls {}, whose mask does not include its own lane {}; CUDA "
        "requires the calling lane in the mask",
        who(t), call(), self));
  if (isShuffle(op.kind) &&
      (op.width < 1 || op.width > 32 || (op.width & (op.width - 1))))
    return error(fmt::format("{} calls {} with width {}; the width must be a "
                             "power of two from 1 to 32",
                             who(t), call(), op.width));
  if (cfg_->options->strict) {
    if (unsigned absent = absentLanes(warp) & op.mask) {
      std::vector<unsigned> gone, none;
      for (unsigned l : lanesOf(absent))
        (lane(warp, l) ? gone : none).push_back(l);
      std::string why;
      if (!gone.empty())
        why = fmt::format("lanes {} have exited", idList(gone));
      if (!none.empty())
        why += fmt::format("{}lanes {} do not exist (the block has {} threads)",
                           why.empty() ? "" : " and ", idList(none),
                           cfg_->threadsPerBlock);
      return error(fmt::format(
          "{} calls {}, but in warp {} {}: every lane named in the mask must "
          "take part",
          who(t), call(), warp, why));
    }
  }
  tryComplete(t);
  return Status::ok();
}

void BlockRunner::tryComplete(EmuThread &t) {
  const unsigned warp = t.linear >> 5;
  unsigned needed = t.op.mask;
  if (!cfg_->options->strict)
    needed &= ~absentLanes(warp); // PTX: exited lanes do not take part
  if ((needed & ~waitingLanes_[warp]) == 0 && // cheap test first
      missingLanes(warp, t.op, needed) == 0)
    resolveWarp(warp, t.op);
}

void BlockRunner::resolveWarp(unsigned warp, KilnEmuWarpOp key) {
  // Who takes part: the lanes of the mask waiting at this primitive.
  unsigned part = 0;
  EmuThread *lanes[32] = {};
  for (unsigned l = 0; l < 32; ++l) {
    EmuThread *u = lane(warp, l);
    if ((key.mask >> l & 1u) && u && u->state == State::Warp &&
        sameWarpOp(u->op, key)) {
      part |= 1u << l;
      lanes[l] = u;
    }
  }
  auto low32 = [](unsigned long long v) { return unsigned(v); };
  unsigned long long combined = 0;
  switch (key.kind) {
  case KILN_EMU_BALLOT:
  case KILN_EMU_ANY:
  case KILN_EMU_ALL: {
    unsigned ballot = 0;
    for (unsigned l : lanesOf(part))
      if (lanes[l]->op.value)
        ballot |= 1u << l;
    combined = key.kind == KILN_EMU_BALLOT ? ballot
               : key.kind == KILN_EMU_ANY  ? (ballot != 0)
                                           : (ballot == part);
    break;
  }
  case KILN_EMU_REDUCE_ADD:
  case KILN_EMU_REDUCE_MIN_U:
  case KILN_EMU_REDUCE_MAX_U:
  case KILN_EMU_REDUCE_MIN_I:
  case KILN_EMU_REDUCE_MAX_I:
  case KILN_EMU_REDUCE_AND:
  case KILN_EMU_REDUCE_OR:
  case KILN_EMU_REDUCE_XOR: {
    bool first = true;
    unsigned acc = 0;
    for (unsigned l : lanesOf(part)) {
      unsigned v = low32(lanes[l]->op.value);
      if (first) {
        acc = v;
        first = false;
        continue;
      }
      switch (key.kind) {
      case KILN_EMU_REDUCE_ADD:
        acc += v;
        break;
      case KILN_EMU_REDUCE_MIN_U:
        acc = std::min(acc, v);
        break;
      case KILN_EMU_REDUCE_MAX_U:
        acc = std::max(acc, v);
        break;
      case KILN_EMU_REDUCE_MIN_I:
        acc = unsigned(std::min(int(acc), int(v)));
        break;
      case KILN_EMU_REDUCE_MAX_I:
        acc = unsigned(std::max(int(acc), int(v)));
        break;
      case KILN_EMU_REDUCE_AND:
        acc &= v;
        break;
      case KILN_EMU_REDUCE_OR:
        acc |= v;
        break;
      case KILN_EMU_REDUCE_XOR:
        acc ^= v;
        break;
      }
    }
    combined = acc;
    break;
  }
  default:
    break;
  }
  for (unsigned l : lanesOf(part)) {
    EmuThread &u = *lanes[l];
    if (isShuffle(key.kind)) {
      unsigned src = shuffleSource(u.op, l);
      u.result = (part >> src & 1u) ? lanes[src]->op.value : poison(u.op.bytes);
    } else {
      u.result = combined;
    }
    push(u);
  }
}

Status BlockRunner::onExit(EmuThread &t) {
  const unsigned warp = t.linear >> 5, self = t.linear & 31;
  for (unsigned l : lanesOf(waitingLanes_[warp])) {
    EmuThread *u = lane(warp, l);
    if (u->state != State::Warp || u->op.kind == KILN_EMU_ACTIVEMASK ||
        !(u->op.mask >> self & 1u))
      continue;
    if (!cfg_->options->strict) {
      tryComplete(*u); // the exited lane no longer counts
      continue;
    }
    std::vector<unsigned> waiting;
    for (unsigned m = 0; m < 32; ++m) {
      EmuThread *v = lane(warp, m);
      if (v && v->state == State::Warp && sameWarpOp(v->op, u->op))
        waiting.push_back(m);
    }
    return error(fmt::format(
        "{} exited while lanes {} of warp {} wait for it in {} ({}, mask "
        "{:#010x}): every lane named in the mask must take part",
        who(t), idList(waiting), warp, warpName(u->op.kind),
        site(u->op.line, u->op.column), u->op.mask));
  }
  return checkBarrier();
}

Status BlockRunner::checkBarrier() {
  const unsigned n = cfg_->threadsPerBlock;
  if (barrierWaiters_ == 0 || barrierWaiters_ + exited_ != n)
    return Status::ok();
  std::vector<unsigned> waiting = idsWhere(State::Barrier);
  const EmuThread &first = threads_[waiting.front()];
  if (cfg_->options->strict && exited_ > 0)
    return error(fmt::format(
        "barrier divergence: threads {} wait at {} ({}) but threads {} "
        "exited without reaching it. CUDA requires every thread of the block "
        "to reach each __syncthreads (a GPU may hang or release the barrier "
        "early); non-strict emulation follows PTX, where exited threads "
        "count as arrived",
        idList(waiting), barrierName(first.barrierKind),
        site(first.line, first.column), idList(idsWhere(State::Exited))));
  if (cfg_->options->strict) {
    for (unsigned id : waiting) {
      const EmuThread &u = threads_[id];
      if (u.line == first.line && u.column == first.column &&
          u.barrierKind == first.barrierKind)
        continue;
      std::vector<unsigned> here, there;
      for (unsigned v : waiting)
        (threads_[v].line == first.line && threads_[v].column == first.column
             ? here
             : there)
            .push_back(v);
      return error(fmt::format(
          "divergent barrier: threads {} wait at {} ({}) while threads {} "
          "wait at other barriers (thread {} at {}, {}); CUDA requires all "
          "threads of the block to meet at the same __syncthreads",
          idList(here), barrierName(first.barrierKind),
          site(first.line, first.column), idList(there), u.linear,
          barrierName(u.barrierKind), site(u.line, u.column)));
    }
  }
  int count = 0;
  for (unsigned id : waiting)
    count += threads_[id].predicate != 0;
  const int total = int(waiting.size());
  for (unsigned id : waiting) {
    EmuThread &u = threads_[id];
    switch (u.barrierKind) {
    case KILN_EMU_SYNCTHREADS_COUNT:
      u.barrierResult = count;
      break;
    case KILN_EMU_SYNCTHREADS_AND:
      u.barrierResult = count == total;
      break;
    case KILN_EMU_SYNCTHREADS_OR:
      u.barrierResult = count > 0;
      break;
    default:
      u.barrierResult = 0;
      break;
    }
    push(u);
  }
  barrierWaiters_ = 0;
  return Status::ok();
}

bool BlockRunner::resolveActiveMasks() {
  bool any = false;
  const unsigned warps = (cfg_->threadsPerBlock + 31) / 32;
  for (unsigned w = 0; w < warps; ++w) {
    unsigned pending = 0;
    for (unsigned l = 0; l < 32; ++l) {
      EmuThread *u = lane(w, l);
      if (u && u->state == State::Warp && u->op.kind == KILN_EMU_ACTIVEMASK)
        pending |= 1u << l;
    }
    while (pending) {
      EmuThread &lead = *lane(w, unsigned(__builtin_ctz(pending)));
      unsigned group = 0;
      for (unsigned l : lanesOf(pending)) {
        EmuThread &u = *lane(w, l);
        if (u.op.line == lead.op.line && u.op.column == lead.op.column)
          group |= 1u << l;
      }
      for (unsigned l : lanesOf(group)) {
        lane(w, l)->result = group;
        push(*lane(w, l));
      }
      pending &= ~group;
      any = true;
    }
  }
  return any;
}

std::string BlockRunner::describe(EmuThread &t) {
  switch (t.state) {
  case State::Barrier:
    return fmt::format("wait at {} ({})", barrierName(t.barrierKind),
                       site(t.line, t.column));
  case State::Warp: {
    std::string s =
        fmt::format("wait at {} ({}, mask {:#010x})", warpName(t.op.kind),
                    site(t.op.line, t.op.column), t.op.mask);
    unsigned missing = missingLanes(t.linear >> 5, t.op, t.op.mask);
    if (missing)
      s += fmt::format(" for lanes {} of warp {}", idList(laneList(missing)),
                       t.linear >> 5);
    return s;
  }
  case State::Exited:
    return "exited";
  case State::Trapped:
    return "trapped";
  case State::Runnable:
    return "runnable";
  }
  return "?";
}

Status BlockRunner::deadlock() {
  std::string lines;
  std::vector<unsigned> group;
  std::string current;
  auto flush = [&] {
    if (!group.empty())
      lines += fmt::format("\n  threads {}: {}", idList(group), current);
    group.clear();
  };
  for (EmuThread &t : threads_) {
    std::string d = describe(t);
    if (d != current)
      flush();
    current = d;
    group.push_back(t.linear);
  }
  flush();
  return error(fmt::format(
      "deadlock: no thread can proceed (a GPU would hang here){}\n"
      "(thread ids are linear, x fastest; a warp is 32 consecutive ids; "
      "lines are the kernel source's)",
      lines));
}

//===--- launch -----------------------------------------------------------===//

thread_local bool tlsInLaunch = false;

unsigned envUnsigned(const char *name, unsigned fallback) {
  const char *v = std::getenv(name);
  if (!v || !*v)
    return fallback;
  char *end = nullptr;
  unsigned long x = std::strtoul(v, &end, 10);
  return (end && *end == 0 && x > 0 && x < 1u << 20) ? unsigned(x) : fallback;
}

Status validate(const std::string &kernel, Dim3 grid, Dim3 block,
                size_t dynamicSharedBytes, const LaunchOptions &options) {
  auto bad = [&](std::string what) {
    return Status::error(fmt::format(
        "CUDA emulator: invalid launch of kernel '{}': {}", kernel, what));
  };
  if (block.x == 0 || block.y == 0 || block.z == 0 || grid.x == 0 ||
      grid.y == 0 || grid.z == 0)
    return bad(fmt::format("grid ({},{},{}) and block ({},{},{}) must not be "
                           "empty",
                           grid.x, grid.y, grid.z, block.x, block.y, block.z));
  uint64_t threads = uint64_t(block.x) * block.y * block.z;
  if (block.x > 1024 || block.y > 1024 || block.z > 64 || threads > 1024)
    return bad(fmt::format("block ({},{},{}) has {} threads; CUDA allows at "
                           "most 1024 per block and (1024, 1024, 64) per "
                           "dimension",
                           block.x, block.y, block.z, threads));
  if (grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535)
    return bad(fmt::format("grid ({},{},{}) exceeds CUDA's (2^31-1, 65535, "
                           "65535)",
                           grid.x, grid.y, grid.z));
  if (dynamicSharedBytes > options.maxDynamicSharedBytes)
    return bad(fmt::format("{} bytes of dynamic shared memory exceed the "
                           "limit of {} (LaunchOptions::maxDynamicSharedBytes)",
                           dynamicSharedBytes, options.maxDynamicSharedBytes));
  return Status::ok();
}

} // namespace

Status launch(Shim shim, Dim3 grid, Dim3 block, size_t dynamicSharedBytes,
              void **params, const LaunchOptions &options, LaunchStats *stats) {
  const std::string &kernel = options.kernel;
  if (!shim)
    return Status::error(
        fmt::format("CUDA emulator: no entry point for kernel '{}'", kernel));
  if (tlsInLaunch)
    return Status::error(fmt::format(
        "CUDA emulator: kernel '{}' launched from inside an emulated kernel "
        "(dynamic parallelism is not emulated)",
        kernel));
  if (Status s = validate(kernel, grid, block, dynamicSharedBytes, options); !s)
    return s;

  Config config;
  config.shim = shim;
  config.grid = grid;
  config.block = block;
  config.dynamicSharedBytes = dynamicSharedBytes;
  config.params = params;
  config.options = &options;
  config.threadsPerBlock = block.x * block.y * block.z;
  size_t stack = options.stackBytes
                     ? options.stackBytes
                     : size_t(envUnsigned("KILN_EMU_STACK_KIB", 64)) * 1024;
  config.stackBytes = std::max<size_t>(stack, 16 * 1024);

  const uint64_t blocks = uint64_t(grid.x) * grid.y * grid.z;
  unsigned workers =
      options.threads ? options.threads : envUnsigned("KILN_EMU_THREADS", 1);
  workers = unsigned(std::min<uint64_t>(std::max(workers, 1u), blocks));

  const auto start = std::chrono::steady_clock::now();
  uint64_t switches = 0;
  Status result = Status::ok();
  if (workers == 1) {
    // The calling thread runs every block; its runner (and stacks) persist.
    static thread_local BlockRunner runner;
    tlsInLaunch = true;
    result = runner.prepare(config);
    uint64_t before = runner.switches();
    for (uint64_t b = 0; result && b < blocks; ++b)
      result = runner.run(b);
    switches = runner.switches() - before;
    tlsInLaunch = false;
  } else {
    std::atomic<uint64_t> next{0};
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> totalSwitches{0};
    std::mutex mu;
    uint64_t failedBlock = UINT64_MAX;
    std::vector<std::thread> pool;
    for (unsigned w = 0; w < workers; ++w) {
      pool.emplace_back([&] {
        tlsInLaunch = true;
        BlockRunner runner;
        Status s = runner.prepare(config);
        uint64_t b = 0;
        while (s && !stop.load(std::memory_order_relaxed) &&
               (b = next.fetch_add(1)) < blocks)
          s = runner.run(b);
        totalSwitches += runner.switches();
        if (!s) {
          std::lock_guard<std::mutex> lock(mu);
          if (b < failedBlock || failedBlock == UINT64_MAX) {
            failedBlock = b;
            result = s;
          }
          stop = true;
        }
      });
    }
    for (std::thread &t : pool)
      t.join();
    switches = totalSwitches;
  }
  if (stats) {
    stats->blocks = blocks;
    stats->threads = blocks * config.threadsPerBlock;
    stats->switches = switches;
    stats->osThreads = workers;
    stats->seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
  }
  return result;
}

} // namespace kiln::cuda::emu
