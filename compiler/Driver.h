//===- Driver.h - From a kiln module to a compiled program -----*- C++ -*-===//
//
// The compile driver: the one place that decides how a model (the module
// the frontend built, or a kiln-dialect module read from .mlir) becomes a
// training program, a plan and an artifact. kilnc parses flags into
// CompileOptions and prints what the driver returns; the planner
// (tools/kilnc/Planner.cpp) compiles each candidate layout through it.
//
//   configure()  the options' parallel layout and precision written into the
//                module's kiln.train and kiln.mesh attributes, the layout
//                rules checked (pp x tp divides the devices, ZeRO needs
//                data-parallel replicas, ...), the module verified
//   compile()    the training program built (where the module has none),
//                kernels and plan (compileProgram), CUDA C++ where asked
//                for, the .kpack sections where asked for
//
// Messages name kilnc's flags (--tp, --pp, ...), as the options mirror them.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_COMPILER_DRIVER_H
#define KILN_COMPILER_DRIVER_H

#include "compiler/Codegen.h"
#include "compiler/cuda/Emitter.h"
#include "runtime/core/Artifact.h"
#include "runtime/core/Status.h"

#include "mlir/IR/BuiltinOps.h"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace kiln {

/// Overrides of the train section's parallel layout (docs/parallel.md), one
/// per kilnc flag; each one left unset keeps what the model says.
struct LayoutOptions {
  std::optional<int64_t> devices;       ///< --devices: all devices
  std::optional<int64_t> tp;            ///< --tp
  std::optional<int64_t> pp;            ///< --pp
  std::optional<int64_t> microBatches;  ///< --micro-batches
  std::optional<std::string> pipeline;  ///< --pipeline: 1f1b, gpipe, interleaved
  std::optional<int64_t> virtualStages; ///< --virtual-stages
  std::optional<int64_t> zero;          ///< --zero: 0, 1 or 2
  std::optional<double> bucketMb, firstBucketMb; ///< --bucket-mb, --first-bucket-mb
  std::optional<std::string> gradReduce;         ///< --grad-reduce: fp32 or bf16

  /// Whether any override is set (without one the module is left as it is).
  bool any() const {
    return devices || tp || pp || microBatches || pipeline || virtualStages || zero ||
           bucketMb || firstBucketMb || gradReduce;
  }
};

/// What compile() produces beyond the plan and kernel modules.
enum class CompileOutput {
  Program, ///< the plan and kernel modules (kilnc --emit=plan, counters, ...)
  LLVM,    ///< and the CPU kernels' LLVM IR as text (--emit=llvm)
  Package, ///< and the .kpack sections (CPU bitcode, CUDA where asked for)
};

struct CompileOptions {
  /// The model file: messages name it, the artifact records it and its text.
  std::string modelPath, sourceText;

  LayoutOptions layout;
  std::optional<std::string> precision;     ///< fp32, tf32, bf16 or fp16
  std::optional<std::string> precisionMode; ///< kiln or autocast

  CompileOutput output = CompileOutput::Program;
  bool fusion = true;                 ///< false: one op per kernel
  bool printKernelIRAfterAll = false; ///< the CPU lowering, to stderr
  /// The artifact's targets as given ("cpu", "cuda", "cpu,cuda"; see
  /// parseTarget), and whether CUDA C++ is emitted.
  std::string target = "cpu";
  bool cuda = false;
  CudaEmitOptions cudaEmit;
  std::vector<std::string> cudaArchs = {"sm_80", "sm_90"}; ///< compiled ahead of time
  int cudaMaxRegisters = 0;                                ///< 0: the launch bounds decide
  /// The initial parameters' seed; unset: the train section's (see initSeed).
  std::optional<uint64_t> seed;
  bool omitZeroInitializers = false;
  /// Receives the CUDA assembler's notes (one line each, per architecture).
  std::function<void(const std::string &)> note;
};

/// Applies `options`' layout and precision overrides to `module` (the
/// kiln.train and kiln.mesh attributes), checks the layout rules and
/// verifies the module. Fails with a user error naming the flag, or an
/// internal one when the module does not verify (the reasons are then in
/// the context's diagnostics).
Status configure(mlir::ModuleOp module, const CompileOptions &options);

/// Sets a whole layout on `module` as the planner chooses one (the
/// kiln.train attribute and the mesh): devices = pp x dp x tp. With pp = 1
/// the train section's grad_accum is kept; virtualStages > 1 is the
/// interleaved schedule.
void setLayout(mlir::ModuleOp module, int64_t devices, int64_t tp, int zero, int64_t pp = 1,
               int64_t microBatches = 1, int64_t virtualStages = 1);

/// Checks `target` ("cpu", "cuda" or "cpu,cuda") and says whether it names
/// CUDA.
Status parseTarget(const std::string &target, bool &cuda);

/// The seed of the initial parameters: `seed` where given, else the train
/// section's, else 0. The artifact and --export-reference share it.
uint64_t initSeed(mlir::ModuleOp module, std::optional<uint64_t> seed);

struct CompileResult {
  /// ok, or why compilation stopped (the kind gives the exit code).
  Status status;
  /// On failure: the context's diagnostics (collected by the caller's
  /// handler) say why, and come before the status's message.
  bool diagnosticsFirst = false;
  std::optional<CompiledProgram> compiled;
  std::optional<CudaProgram> cuda;                ///< with options.cuda
  std::vector<artifact::Section> package;         ///< with CompileOutput::Package

  explicit operator bool() const { return status.isOk(); }
};

/// Compiles `module`, on which configure() ran: builds its training program
/// unless it has one (@train_step), then the kernels and plan, the CUDA C++
/// and the artifact's sections as `options` ask.
CompileResult compile(mlir::ModuleOp module, const CompileOptions &options);

} // namespace kiln

#endif // KILN_COMPILER_DRIVER_H
