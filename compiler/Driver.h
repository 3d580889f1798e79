//===- Driver.h - From a kiln module to a compiled program -----*- C++ -*-===//
//
// The compile driver: the one place that decides how a model (the module
// the frontend built, or a kiln-dialect module read from .mlir) becomes a
// training program, a plan and an artifact. kilnc parses flags into
// CompileOptions and prints what the driver returns; the planner
// (compiler/planner/Planner.cpp) lays out each candidate through it.
//
//   load()       the model as a module: a .kiln file through the frontend, or
//                a kiln-dialect .mlir module parsed as it is
//   configure()  the options' parallel layout and precision written into the
//                module's kiln.train and kiln.mesh attributes, the layout
//                rules checked (pp x tp divides the devices, ZeRO needs
//                data-parallel replicas, ...), the module verified
//   compile()    the training program built (where the module has none),
//                kernels and plan (compileProgram), CUDA C++ where asked
//                for, the .kpack sections where asked for
//
// and for kilnc's other outputs, on a configured module:
//
//   buildTraining()      the training program (--emit=train, --gradcheck,
//                        --export-reference)
//   precisionReport()    the rounding points and activation memory
//                        (--precision-report)
//   prepareGradCheck()   the one-device float64 model --gradcheck checks
//   prepareReference()   the one-device layout --export-reference runs
//
// Messages name kilnc's flags (--tp, --pp, ...), as the options mirror them.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_COMPILER_DRIVER_H
#define KILN_COMPILER_DRIVER_H

#include "compiler/Codegen.h"
#include "compiler/PrecisionReport.h"
#include "compiler/cuda/Emitter.h"
#include "frontend/Frontend.h"
#include "frontend/Source.h"
#include "runtime/core/Artifact.h"
#include "runtime/core/Status.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/OwningOpRef.h"

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
  std::optional<std::string> deterministic;      ///< --deterministic: none or devices
  std::optional<int64_t> deterministicChunks;    ///< --deterministic-chunks
  /// --separate-scalar-reductions (a measuring aid): the loss and the
  /// norm's sum of squares in an all_reduce each, and no stop flag in the
  /// step (train entry scalar_reduce = "separate"; default "combined").
  bool separateScalarReductions = false;

  /// Whether any override is set (without one the module is left as it is).
  bool any() const {
    return devices || tp || pp || microBatches || pipeline || virtualStages || zero ||
           bucketMb || firstBucketMb || gradReduce || deterministic || deterministicChunks ||
           separateScalarReductions;
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
  /// --attention: auto (the default: kiln-raise-attention forms
  /// kiln.attention over 128 keys or more), fused (every attention it
  /// finds) or unfused (attention stays the primitives it is written in).
  std::optional<std::string> attention;

  CompileOutput output = CompileOutput::Program;
  bool fusion = true;                 ///< false: one op per kernel
  bool printKernelIRAfterAll = false; ///< the CPU lowering, to stderr
  /// The training pipeline and kernel formation, after every pass, to stderr.
  bool printIRAfterAll = false;
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
  /// Receives notes, one line each: the CUDA assembler's (per
  /// architecture), prepareReference()'s ("note: ...").
  std::function<void(const std::string &)> note;
};

/// Where a driver step stopped: ok, or a status whose message says why (its
/// kind gives the exit code).
struct Outcome {
  Status status;
  /// On failure: the context's diagnostics (collected by DiagnosticText) say
  /// why too, and come before the status's message.
  bool diagnosticsFirst = false;

  explicit operator bool() const { return status.isOk(); }
};

/// Collects the context's diagnostics as text while it lives, each rendered
/// as the frontend renders its own: "file:line:col: error: message", the
/// model line and a caret when the location (through names, call sites and
/// fused locations) is in `source`; "kilnc: error: message" when it names
/// no file. Notes follow their diagnostic. The context stops printing the
/// op with a diagnostic (the model line says where, not the IR).
class DiagnosticText : public mlir::ScopedDiagnosticHandler {
public:
  DiagnosticText(mlir::MLIRContext &context, const frontend::SourceFile &source);

  std::string text; ///< what was collected (callers clear it once printed)
};

struct LoadResult : Outcome {
  mlir::OwningOpRef<mlir::ModuleOp> module;
  /// The frontend's or the MLIR parser's diagnostics, rendered: with a
  /// module, warnings (compilation goes on); without, they come before the
  /// status's message (which may be empty: the diagnostics say it all).
  std::string diagnostics;
};

/// Reads the model in `source` into a module: a name ending in .mlir is a
/// kiln-dialect module with func.func @forward (as --emit=mlir prints it)
/// or a hand-written training program (@train_step, compiled as it is);
/// anything else is a model file the frontend builds with `options` (--dim,
/// --param, --batch).
LoadResult load(mlir::MLIRContext &context, const frontend::SourceFile &source,
                const frontend::FrontendOptions &options);

/// Applies `options`' layout and precision overrides to `module` (the
/// kiln.train and kiln.mesh attributes), checks the layout rules and
/// verifies the module. Fails with a user error naming the flag, or an
/// internal one when the module does not verify (the reasons are then in
/// the context's diagnostics).
Status configure(mlir::ModuleOp module, const CompileOptions &options);

/// deterministic = "devices" (docs/parallel.md "The same bits on any
/// device count"): a step's global batch G is cut into C chunks
/// (deterministic_chunks, default 8) and every compiled micro-step takes
/// exactly one, so each chunk's gradient is computed by the same kernels on
/// any device count and the chunks are added in one pairwise tree.
struct Chunking {
  int64_t chunks = 0;     ///< C, a power of two
  int64_t rows = 0;       ///< rows per chunk (G / C): the micro-step's batch
  int64_t microSteps = 0; ///< chunks per device and step: the compiled grad_accum
  int64_t modelBatch = 0; ///< the model's per-device batch before chunking
  int64_t gradAccum = 0;  ///< the train section's grad_accum before chunking
};

/// The chunking of a configured `module`: nullopt when it is not
/// deterministic over devices, a user error (saying what to change) when
/// its layout cannot be chunked (tp or pp, ZeRO-2, a bf16 gradient reduce,
/// a device count or grad_accum that is not a power of two, chunks that do
/// not divide over devices x grad_accum or the batch).
Expected<std::optional<Chunking>> deterministicChunking(mlir::ModuleOp module);

/// load() and configure() together, and for deterministic = "devices" the
/// model built again at the chunk's batch and its grad_accum set to the
/// chunks per device (a kiln-dialect .mlir module cannot be rebuilt: it
/// must already take one chunk per micro-step).
LoadResult loadConfigured(mlir::MLIRContext &context, const frontend::SourceFile &source,
                          frontend::FrontendOptions frontendOptions,
                          const CompileOptions &options);

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

/// Builds `module`'s training program (@train_step from @forward and the
/// train section; with `gradOnly`, the @grad that --gradcheck runs). Fails
/// with "cannot build the training program", the diagnostics first.
Outcome buildTraining(mlir::ModuleOp module, const CompileOptions &options,
                      bool gradOnly = false);

/// The precision report of `module` (configured): every rounding point of
/// the mixed-precision program and, in a precision other than fp32, the
/// train step's activation memory against the same model in fp32. Builds
/// the training program (where the module has none).
Outcome precisionReport(mlir::ModuleOp module, const CompileOptions &options,
                        PrecisionReport &report);

/// For --gradcheck, which checks @grad, one device's gradients (data
/// parallelism leaves them as they are): fails on a tensor- or
/// pipeline-parallel layout, else converts the model to float64.
Status prepareGradCheck(mlir::ModuleOp module);

/// For --export-reference, which the interpreter runs on one device: sets
/// `module` to the one-device layout of the same model, and notes through
/// options.note what was set aside.
void prepareReference(mlir::ModuleOp module, const CompileOptions &options);

struct CompileResult : Outcome {
  std::optional<CompiledProgram> compiled;
  std::optional<CudaProgram> cuda;                ///< with options.cuda
  std::vector<artifact::Section> package;         ///< with CompileOutput::Package
};

/// Compiles `module`, on which configure() ran: builds its training program
/// unless it has one (@train_step), then the kernels and plan, the CUDA C++
/// and the artifact's sections as `options` ask.
CompileResult compile(mlir::ModuleOp module, const CompileOptions &options);

} // namespace kiln

#endif // KILN_COMPILER_DRIVER_H
