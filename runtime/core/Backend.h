//===- Backend.h - What kiln-run drives: one device running a program -*- C++ -*-===//
//
// A backend holds the arena of one compiled program on one device and runs
// its entry points. The CPU executor (runtime/cpu) and the CUDA executor
// (runtime/cuda) implement it; kiln-run's sessions (train, eval, sample)
// only see this interface.
//
// Ordering: write() and run() may return before the device is done (the
// CUDA executor queues them); read() waits for everything queued before it.
// A write() of an input buffer never disturbs a run() still in flight: the
// CUDA executor stages it in pinned host memory and copies it while the
// previous step computes.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CORE_BACKEND_H
#define KILN_RUNTIME_CORE_BACKEND_H

#include "runtime/core/Program.h"
#include "runtime/core/Status.h"

#include <cstdint>
#include <cstddef>
#include <map>
#include <string>
#include <vector>

namespace kiln {

class Tracer;

class Backend {
public:
  virtual ~Backend() = default;

  virtual const program::Program &program() const = 0;
  /// "cpu (2 threads)", "cuda:0 NVIDIA H200 (sm_90)", ...
  virtual std::string describe() const = 0;

  /// Copies `bytes` (the whole buffer) from the host into buffer `id`.
  virtual Status write(int id, const void *src, size_t bytes) = 0;
  /// Copies buffer `id` to the host (waits for queued work).
  virtual Status read(int id, void *dst, size_t bytes) = 0;
  /// Whether GEMM steps with a library epilogue (program::LtEpilogue) run
  /// it in the GEMM call: their epilogue kernel does not run, and the GEMM's
  /// own output buffer is not written unless it is the pre-activation.
  virtual bool usesLibraryEpilogues() const { return false; }
  /// Runs @name (may return before the device is done).
  Status run(const std::string &name) { return runSteps(name, 0, SIZE_MAX); }
  /// Runs steps [begin, end) of @name's schedule (kiln-run check compares
  /// backends step by step).
  virtual Status runSteps(const std::string &name, size_t begin, size_t end) = 0;
  /// Waits until every queued operation has finished.
  virtual Status synchronize() = 0;
  /// Whether write() of an input stages it for the next run() instead of
  /// writing the arena (inputs and results share scratch memory: without
  /// staging, read the last run's results before writing the next inputs).
  virtual bool stagesInputs() const { return false; }

  /// Where the caller is ("training step 12"), for the messages of the
  /// backend's collectives (a multi-device program); ignored otherwise.
  virtual void setContext(std::string context) { (void)context; }

  /// Per-kernel timing (accumulated over runs; CUDA events on a GPU).
  virtual void setProfiling(bool on) = 0;
  struct Timing {
    std::string name, op, loc;
    double seconds = 0;
    int64_t calls = 0;
    double flops = 0; ///< floating-point operations in all calls (GEMMs), or 0
  };
  virtual std::vector<Timing> timings() = 0;
  /// Also records every timed step as a Span into `t` (runtime/core/
  /// Trace.h) while it is enabled; turns profiling on. Null detaches.
  virtual void setTracer(Tracer *t) { (void)t; }

  /// GEMM time by shape (program::gemmLabel), each with its first call's
  /// model line and the FLOPs done (the profiler prints the rate).
  class GemmTimings {
  public:
    /// A GEMM step, or an attention step (another library call) by its label.
    void add(const program::Step &s, double seconds, const char *op) {
      bool attention = s.kind == program::Step::Attention;
      std::string label = attention ? program::attentionLabel(s.attention)
                                    : program::gemmLabel(s.gemm);
      Timing &t = byShape_[label];
      if (!t.calls) {
        t.name = label;
        t.op = op;
        t.loc = s.loc;
      }
      t.seconds += seconds;
      t.calls++;
      t.flops += attention ? program::attentionFlops(s.attention) : program::gemmFlops(s.gemm);
    }
    void appendTo(std::vector<Timing> &out) const {
      for (const auto &[label, t] : byShape_)
        out.push_back(t);
    }

  private:
    std::map<std::string, Timing> byShape_;
  };

  /// Reads a float32 scalar buffer.
  Expected<float> scalar(int id) {
    float v = 0;
    if (Status s = read(id, &v, sizeof v); !s)
      return s;
    return v;
  }
  /// Reads a whole buffer into host memory.
  template <typename T> Expected<std::vector<T>> readAll(int id) {
    const program::Buffer &b = program().buffers[size_t(id)];
    std::vector<T> out(size_t(b.bytes) / sizeof(T));
    if (Status s = read(id, out.data(), size_t(b.bytes)); !s)
      return s;
    return out;
  }
};

} // namespace kiln

#endif // KILN_RUNTIME_CORE_BACKEND_H
