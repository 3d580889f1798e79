//===- Trace.h - Timed spans of a run, for the trace and the overview -*- C++ -*-===//
//
// A Tracer collects spans: what ran (a kernel, a GEMM, a collective, a wait
// for data, a host-to-device copy, a checkpoint write, an evaluation, a
// whole training step), when it started on the host's steady clock (seconds
// since the tracer's origin), how long it took, and which track it belongs
// to (rank, device, plan queue, inter-op thread). The step loop adds one
// span per plan step while a tracer is attached and enabled
// (Backend::setTracer); the trainer adds the spans around the steps. The
// Chrome trace file (--trace), the step-time overview and the kernel stats
// are all views of the same spans, so they agree with each other.
//
// Thread-safe: add() may be called from several threads at once (the
// asynchronous communication queue, inter-op worker threads, the data
// prefetcher). Recording is off until setEnabled(true) (a --trace-steps
// window turns it on and off around the steps it covers).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CORE_TRACE_H
#define KILN_RUNTIME_CORE_TRACE_H

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace kiln {

struct Span {
  enum Kind : uint8_t {
    Kernel,         ///< a generated kernel (also a GEMM's epilogue kernel)
    Gemm,           ///< a library GEMM
    Copy,           ///< a plan copy step
    Collective,     ///< a collective's own run time (on its queue)
    CollectiveWait, ///< time queue 0 waited for a collective (exposed)
    DataWait,       ///< the trainer waited for the next batch
    HostToDevice,   ///< a batch copied into the device's input buffers
    Checkpoint,     ///< a checkpoint written
    Eval,           ///< an evaluation pass
    Step,           ///< one whole training step, as the trainer saw it
    Other,
  };
  Kind kind = Other;
  /// Kernel symbol, GEMM label (program::gemmLabel), collective op, or a
  /// short description ("data wait", "checkpoint").
  std::string name;
  double start = 0;   ///< seconds since the tracer's origin (host clock)
  double seconds = 0; ///< duration
  int64_t step = -1;  ///< the training step it belongs to (-1: none)
  int queue = 0;      ///< the plan queue (0: compute, 1: communication)
  int thread = 0;     ///< inter-op worker that ran it (0: the loop's thread)
  int kernel = -1;    ///< index into Program::kernels (Kernel spans)
  int planStep = -1;  ///< index of the plan step in its function
  std::string function; ///< the entry point ("train_step")
  double flops = 0;   ///< floating-point operations done (estimate), or 0
  double bytes = 0;   ///< bytes moved (kernel arguments, collective bytes)
};

const char *spanKindName(Span::Kind k);

class Tracer {
public:
  Tracer() : origin_(std::chrono::steady_clock::now()) {}
  Tracer(const Tracer &) = delete;
  Tracer &operator=(const Tracer &) = delete;

  /// Seconds since the origin on the host's steady clock.
  double now() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - origin_).count();
  }
  std::chrono::steady_clock::time_point origin() const { return origin_; }

  /// Recording on or off; add() drops spans while off.
  void setEnabled(bool on) { enabled_.store(on, std::memory_order_relaxed); }
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  /// The training step spans added from now on belong to (when their own
  /// step is -1).
  void setStep(int64_t step) { step_.store(step, std::memory_order_relaxed); }
  int64_t step() const { return step_.load(std::memory_order_relaxed); }

  /// Records `s` (thread-safe; dropped while disabled).
  void add(Span s);
  /// Every span recorded so far, in the order added.
  std::vector<Span> spans() const;
  void clear();

  /// Whose spans these are (the trace's tracks): rank of the run, device
  /// index within the process, and the device's description.
  int rank = 0, device = 0;
  std::string deviceName;

private:
  std::chrono::steady_clock::time_point origin_;
  std::atomic<bool> enabled_{false};
  std::atomic<int64_t> step_{-1};
  mutable std::mutex mu_;
  std::vector<Span> spans_;
};

/// Times a region into a tracer: the span is added when the scope ends
/// (nothing happens for a null or disabled tracer).
class SpanScope {
public:
  SpanScope(Tracer *t, Span::Kind kind, std::string name);
  ~SpanScope();
  SpanScope(const SpanScope &) = delete;
  SpanScope &operator=(const SpanScope &) = delete;
  Span &span() { return s_; }
  /// Ends the span now (the destructor then does nothing).
  void finish();

private:
  Tracer *t_;
  Span s_;
};

} // namespace kiln

#endif // KILN_RUNTIME_CORE_TRACE_H
