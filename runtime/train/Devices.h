//===- Devices.h - Device names to backends ----------------------*- C++ -*-===//
//
// The one place that knows every backend: parses a device name (cpu, cuda,
// cuda:N, cuda-emu; cpu:N for N devices in this process) and creates the
// backend for it, with the backends this build has (the CPU JIT needs LLVM
// and a BLAS, cuda the CUDA toolkit, the emulator a BLAS), and the
// communicators of multi-device runs (runtime/comm: in-process, MPI). The
// rest of runtime/train sees only Backend and Communicator.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_TRAIN_DEVICES_H
#define KILN_RUNTIME_TRAIN_DEVICES_H

#include "runtime/comm/Communicator.h"
#include "runtime/core/Backend.h"
#include "runtime/core/Package.h"
#include "runtime/train/Output.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kiln::train {

struct DeviceOptions {
  /// cpu, cuda (= cuda:0), cuda:N, or cuda-emu (the CUDA emulator).
  std::string device = "cpu";
  std::string artifact; ///< the artifact's path, for messages
  int threads = 1; ///< CPU threads
  /// CPU: threads that run independent plan steps at once (each device's
  /// own); 1: one step at a time.
  int interOpThreads = 1;
  std::string cacheDir;
  bool noCache = false, quiet = false;
  /// GPU GEMM epilogues: "library" (the default: in the cuBLASLt call where
  /// it can), "kernels" (always Kiln's own kernels; for comparison and
  /// debugging); unset: the default. kiln-run takes it from
  /// KILN_CUDA_EPILOGUES.
  std::optional<std::string> cudaEpilogues;
  /// Where a CPU device's collectives run: "auto" or "on" (the default: on
  /// a communication thread), "off" (on the device's own thread, when a
  /// step waits for them); unset: the default.
  /// kiln-run takes it from KILN_COMM_THREAD (docs/parallel.md).
  std::optional<std::string> commThread;
  /// A multi-device program: this backend's device (its index in the mesh)
  /// and the communicator its collective steps use.
  comm::Communicator *comm = nullptr;
  int deviceIndex = 0;
};

/// The settings a front end takes from the environment:
/// KILN_CUDA_EPILOGUES (cudaEpilogues) and KILN_COMM_THREAD (commThread),
/// where set.
void deviceOptionsFromEnvironment(DeviceOptions &o);

/// A --device value taken apart: the backend kind ("cpu", "cuda",
/// "cuda-emu") and how many devices of it this process drives: cpu:N is N
/// CPU devices in this process (each a replica with its own arena and
/// threads); cuda:N is GPU N, cuda:0,1,2,3 four GPUs.
struct DeviceSpec {
  std::string kind;
  int count = 1;
  std::vector<int> ordinals; ///< cuda: the GPUs (empty: GPU 0)
};
Expected<DeviceSpec> parseDeviceSpec(const std::string &device);

/// Checks that a program compiled for `p.numDevices()` devices runs on
/// `devices` (`how` says how they were asked for: "--device cpu:4",
/// "mpirun -np 2"); the error says how to recompile or relaunch.
Status checkDeviceCount(const program::Program &p, int devices, const std::string &how,
                        const std::string &artifact);

/// The communicators of a run: `n` in-process ranks sharing memory (one
/// per replica thread; docs/parallel.md), each with `timeoutSeconds`.
Expected<std::vector<std::unique_ptr<comm::Communicator>>>
makeInProcessCommunicators(int n, double timeoutSeconds);
/// This process's rank of an MPI world (MPI started here).
Expected<std::unique_ptr<comm::Communicator>> makeMpiCommunicator(double timeoutSeconds);

/// Checks that this machine has the GPUs `ordinals` (asked for by `how`:
/// "--device cuda:0,1"); the error names what was asked and what exists.
/// Asks the driver only: never hangs.
Status checkGpus(const std::vector<int> &ordinals, const std::string &how);
/// NCCL (docs/parallel.md): one communicator per GPU of `ordinals` driven
/// by this process (rank i on ordinals[i]), or this process's rank of a
/// world of one process per GPU, NCCL's id carried by `bootstrap` (MPI),
/// driving GPU `ordinal`. Each blocking, with `timeoutSeconds`. Errors
/// where this build has no NCCL.
Expected<std::vector<std::unique_ptr<comm::Communicator>>>
makeNcclCommunicators(const std::vector<int> &ordinals, double timeoutSeconds);
Expected<std::unique_ptr<comm::Communicator>>
makeNcclCommunicator(comm::Communicator &bootstrap, int ordinal, double timeoutSeconds);

/// Creates the backend `o.device` names for `pkg`: compiles or loads its
/// kernels and allocates its arena. Errors say what this build or machine
/// lacks and what to use instead. Unless `o.quiet`, says what it prepared
/// (a Note: kernels, where they came from, the device).
Expected<std::unique_ptr<Backend>> makeBackend(const Package &pkg, const DeviceOptions &o,
                                               const Sink &out = {});

/// The devices this build has ("cpu, cuda[:N], cuda-emu", or "none").
std::string availableDevices();

/// The GPUs of this machine, one line each after a line naming the driver;
/// or one line "no GPU: <why>".
std::vector<std::string> describeGpus();

} // namespace kiln::train

#endif // KILN_RUNTIME_TRAIN_DEVICES_H
