//===- Executor.h - Runs a compiled program on a GPU ------------*- C++ -*-===//
//
// One arena in device memory laid out by the compiler's plan (the same plan
// the CPU runs); run(name) queues an entry point's steps on the compute
// stream: kernel steps launch the CUDA functions the artifact's plan lists
// for the kernel (with the kernel's buffers as parameters), GEMM steps go to
// the device's GEMM (cuBLASLt) and then their epilogue kernel, copies are
// device copies. run() returns once the work is queued; read() waits.
//
// Inputs: write() of an input buffer copies into one of two page-locked
// host slots and uploads it on the copy stream into a device staging slot;
// the next run() of a function that takes the buffer makes the compute
// stream wait for that upload and copies the slot into the arena. So the
// next batch travels while the current step computes, and an entry point
// never sees another's staged inputs (their scratch memory overlaps).
//
// Steps run through the step loop (runtime/core/StepLoop.h) with this
// executor's hooks. Profiling records an event pair around every step
// (kernels, GEMMs and copies by name, as the CPU's profile). Every step goes
// to the compute stream in order, so plan v2's dependencies hold; a later
// version maps a step's queue to a stream of its own and its dependencies
// on other queues to event waits.
//
// Several devices (ExecutorOptions): with a Communicator (NCCL's, or any
// other that takes device memory), the executor runs one device of a mesh
// program, its arena laid out by program.plan(device). Two ways:
//   - with StreamOrdering (NCCL's streams, on a real GPU): the communicator
//     enqueues each collective on its communication stream after the work
//     enqueued on the compute stream so far, and returns; a queue-0
//     collective is followed by computeWaits() (the compute stream waits on
//     the device), a queue-1 collective only when a later step depends on
//     it (the step loop's waitAsync), so gradient buckets overlap backward.
//     The host never blocks on a collective; synchronize() and read() poll
//     the communicator's deadline first;
//   - without (the emulator, or a blocking communicator): every collective
//     in schedule order, after synchronizing the compute stream, and the
//     call returns when the data is in place (the Communicator contract).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CUDA_EXECUTOR_H
#define KILN_RUNTIME_CUDA_EXECUTOR_H

#include "runtime/comm/Communicator.h"
#include "runtime/core/Backend.h"
#include "runtime/core/Package.h"
#include "runtime/core/StepLoop.h"
#include "runtime/cuda/Device.h"

#include <map>
#include <memory>
#include <vector>

namespace kiln::cuda {

/// A communicator that runs collectives on streams (NCCL's: the trainer
/// adapts NcclCommunicator's setStreams/computeWaits/synchronize, with
/// setBlocking(false)).
class StreamOrdering {
public:
  virtual ~StreamOrdering() = default;
  /// Collectives wait (on the device) for the work enqueued on `stream` (a
  /// CUstream) up to each call.
  virtual Status setComputeStream(void *stream) = 0;
  /// The compute stream waits (on the device) for every collective
  /// enqueued so far.
  virtual Status computeWaits() = 0;
  /// The host waits for every collective enqueued so far, against the
  /// communicator's deadline.
  virtual Status synchronize() = 0;
};

struct ExecutorOptions {
  /// Not owned; must outlive the executor. Null: one device, and a plan
  /// over a mesh or with collective steps is refused.
  comm::Communicator *communicator = nullptr;
  /// Not owned; the communicator's stream ordering (used where the device
  /// has native streams), or null: collectives in order on the host.
  StreamOrdering *streams = nullptr;
  /// This executor's device in the mesh (= its world rank); -1: the
  /// communicator's rank().
  int device = -1;
};

class Executor : public Backend, private StepHooks {
public:
  /// Allocates the arena (zeroed), loads the kernels and resolves every
  /// launch of the artifact's CUDA plan.
  static Expected<std::unique_ptr<Executor>> create(const Package &pkg,
                                                    std::unique_ptr<Device> device);
  /// One device of a mesh program when options.communicator is set.
  static Expected<std::unique_ptr<Executor>> create(const Package &pkg,
                                                    std::unique_ptr<Device> device,
                                                    const ExecutorOptions &options);
  ~Executor() override;

  const program::Program &program() const override { return program_; }
  /// The GPU, and with a communicator this device of the mesh and the
  /// communicator's kind ("..., device 0 of 2 (nccl communicator)").
  std::string describe() const override {
    if (!comm_)
      return device_->describe();
    return device_->describe() + ", device " + std::to_string(meshDevice_) + " of " +
           std::to_string(comm_->size()) + " (" + comm_->kind() + " communicator)";
  }
  Status write(int id, const void *src, size_t bytes) override;
  Status read(int id, void *dst, size_t bytes) override;
  Status runSteps(const std::string &name, size_t begin, size_t end) override;
  Status synchronize() override;
  bool stagesInputs() const override { return true; }
  void setProfiling(bool on) override { profiling_ = on; }
  void setTracer(Tracer *t) override {
    profile_.tracer = t;
    if (t)
      profiling_ = true;
  }
  /// GEMM steps with a library epilogue (program::LtEpilogue) run it in the
  /// GEMM call instead of launching the epilogue kernel (default on;
  /// KILN_CUDA_EPILOGUES=kernels turns it off, for comparison).
  void setLibraryEpilogues(bool on) { libraryEpilogues_ = on; }
  bool usesLibraryEpilogues() const override { return libraryEpilogues_; }
  std::vector<Timing> timings() override { return profile_.timings(program_); }

  Device &device() { return *device_; }
  /// Buffer `id` in this device's arena.
  DevicePtr address(int id) const {
    return arena_ + DevicePtr(layout_->buffers[size_t(id)].offset);
  }
  /// Where the run is, for collective error messages ("training step 12").
  void setContext(std::string context) override { context_ = std::move(context); }

private:
  Executor() = default;
  // The step loop's hooks.
  Status runKernel(int kernel, const std::vector<int> &args) override;
  Status runGemm(const program::Step &s, bool libraryEpilogue) override;
  Status runCopy(const program::Step &s) override;
  Status runCollective(const program::Step &s) override;
  bool concurrentQueues() const override { return streams_ != nullptr; }
  int meshDevice() const override { return meshDevice_; }
  Status startAsync(const program::Function &f, const program::Step &s, size_t index) override;
  Status waitAsync(size_t index, double &seconds) override;
  /// Calls the communicator for `s` (enqueues it, with streams).
  Status communicate(const program::Step &s, size_t index);
  bool libraryEpilogues() const override { return libraryEpilogues_; }
  const char *gemmName() const override {
    return device_->emulated() ? "gemm (emulated)" : "gemm (cuBLASLt)";
  }
  Status beginTimed() override;
  Expected<double> endTimed() override;
  double timedStart(double hostStart) override {
    return timedStart_ >= 0 ? timedStart_ : hostStart;
  }
  /// --trace: records anchor_ on the compute stream and, once it has
  /// happened, the tracer's host time (the anchor of the timeline).
  Status anchorTrace();

  program::Program program_;
  /// --trace on the GPU's clock: an event recorded with a host timestamp
  /// when a function starts (anchorHost_, tracer seconds); a timed region's
  /// start is anchorHost_ + elapsed(anchor_, its start event) (timedStart_,
  /// -1 when not traced). Re-anchored per function run, so the float
  /// milliseconds of cuEventElapsedTime stay precise.
  int anchor_ = -1;
  double anchorHost_ = 0, timedStart_ = -1;
  const program::BufferPlan *layout_ = nullptr; ///< program_.plan(meshDevice_)
  int meshDevice_ = 0;
  comm::Communicator *comm_ = nullptr;
  StreamOrdering *streams_ = nullptr; ///< set when the device has native streams
  std::string context_;
  const program::Function *current_ = nullptr; ///< the function runSteps runs
  gpu::Plan plan_;
  std::unique_ptr<Device> device_;
  DevicePtr arena_ = 0;
  /// Per program kernel: the function handle of each launch.
  std::vector<std::vector<int>> functions_;

  /// Double-buffered input staging, per input buffer.
  struct Staging {
    void *host[2] = {nullptr, nullptr};
    DevicePtr device[2] = {0, 0};
    int uploaded[2] = {-1, -1}; ///< event: the upload from host[i] is done
    int consumed[2] = {-1, -1}; ///< event: device[i] was copied into the arena
    bool used[2] = {false, false};
    int next = 0;     ///< slot the next write takes
    int pending = -1; ///< slot written but not yet copied into the arena
  };
  std::map<int, Staging> staging_;

  bool profiling_ = false;
  bool libraryEpilogues_ = true;
  int eventA_ = -1, eventB_ = -1;
  StepProfile profile_;
};

} // namespace kiln::cuda

#endif // KILN_RUNTIME_CUDA_EXECUTOR_H
