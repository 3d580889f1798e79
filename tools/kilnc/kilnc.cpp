//===- kilnc.cpp - The Kiln compiler driver -------------------------------===//
//
//   kilnc MODEL.kiln                 summary: ops, parameters, counts
//   kilnc MODEL.kiln --emit=mlir     the verified kiln module
//   kilnc MODEL.kiln --emit=plan     schedule and memory plan
//   kilnc MODEL.kiln --emit=counters per-call counters (JSON) for the perf
//   guard kilnc MODEL.kiln -o MODEL.kpack  the artifact kiln-run executes kilnc
//   MODEL.kiln --parallel=auto --devices N [--memory-per-device SIZE]
//                                    choose dp x tp x ZeRO (compiler/planner)
//
// Exit codes: 0 success, 1 user error (bad model file or flags), 2 internal
// error (a bug in Kiln).
//
//===----------------------------------------------------------------------===//
#include "compiler/Codegen.h"
#include "compiler/Driver.h"
#include "compiler/PrecisionReport.h"
#include "compiler/Summary.h"
#include "compiler/Training.h"
#include "compiler/planner/Planner.h"
#include "frontend/Frontend.h"
#include "runtime/core/Artifact.h"
#include "runtime/core/Counters.h"
#include "runtime/core/GpuCost.h"
#include "runtime/core/Log.h"
#include "runtime/train/Calibrate.h"

#include "dialects/kiln/KilnDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OperationSupport.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Signals.h"
#include "llvm/Support/ToolOutputFile.h"

#include <cstdio>

using namespace llvm;

namespace {
cl::OptionCategory kilncCategory("kilnc options");

cl::opt<std::string> inputFile(cl::Positional, cl::desc("<model.kiln>"),
                               cl::Required, cl::cat(kilncCategory));

enum class Emit { Summary, Mlir, Train, Fused, Plan, Kernels, LLVM, Cuda, Package, Counters };
cl::opt<Emit> emit(
    "emit", cl::desc("What to print"), cl::init(Emit::Summary),
    cl::values(clEnumValN(Emit::Summary, "summary",
                          "ops, parameters, parameter count (default)"),
               clEnumValN(Emit::Mlir, "mlir",
                          "the verified kiln-dialect module (@forward)"),
               clEnumValN(Emit::Train, "train",
                          "the training program: @init, @grad, @train_step, "
                          "@eval_step, @predict"),
               clEnumValN(Emit::Fused, "fused",
                          "the training program after kiln-fuse: every kernel a "
                          "kiln.fusion"),
               clEnumValN(Emit::Plan, "plan",
                          "the schedule and buffer plan (peak bytes)"),
               clEnumValN(Emit::Kernels, "kernels",
                          "the kernel module: one func per kernel, on memrefs"),
               clEnumValN(Emit::LLVM, "llvm", "the CPU kernels as LLVM IR"),
               clEnumValN(Emit::Cuda, "cuda",
                          "the CUDA C++ of every kernel (with --target=cuda)"),
               clEnumValN(Emit::Package, "kpack",
                          "the .kpack artifact (the default when -o ends in .kpack)"),
               clEnumValN(Emit::Counters, "counters",
                          "per-call counters of each entry point as JSON (kernels, "
                          "GEMMs, FLOPs, bytes, collectives, peak memory; CUDA "
                          "launches with --target=cuda): scripts/perf-guard.py's input")),
    cl::cat(kilncCategory));

cl::opt<bool> gradcheck(
    "gradcheck",
    cl::desc("Check every parameter gradient against float64 finite "
             "differences on the reference interpreter (batch 2 unless "
             "--batch is given); exit 1 above the tolerance"),
    cl::init(false), cl::cat(kilncCategory));
cl::opt<double> gradcheckTolerance("gradcheck-tolerance",
                                   cl::desc("Worst relative error allowed (default 1e-5)"),
                                   cl::init(1e-5), cl::cat(kilncCategory));
cl::opt<int> gradcheckSamples("gradcheck-samples",
                              cl::desc("Coordinates checked per large tensor (default 3)"),
                              cl::init(3), cl::cat(kilncCategory));
cl::opt<double> gradcheckInject(
    "gradcheck-inject-error",
    cl::desc("Testing aid: scale the first parameter's gradient by (1 + x) "
             "before the check"),
    cl::init(0.0), cl::Hidden, cl::cat(kilncCategory));
cl::opt<uint64_t> seedOpt("seed", cl::desc("Seed of the artifact's initial parameters and of "
                                           "--export-reference (default: the train section's "
                                           "seed, 0 without one), and of --gradcheck's inputs "
                                           "(default 1)"),
                          cl::init(1), cl::cat(kilncCategory));
cl::opt<std::string> exportReference(
    "export-reference",
    cl::desc("Run the interpreter (float32) and write initial parameters, a "
             "batch, the loss, gradients and the parameters after "
             "--reference-steps train steps as .npy files into <dir>"),
    cl::value_desc("dir"), cl::init(""), cl::cat(kilncCategory));
cl::opt<int> referenceSteps("reference-steps",
                            cl::desc("Train steps for --export-reference (default 3)"),
                            cl::init(3), cl::cat(kilncCategory));

cl::opt<std::string> outputFile("o", cl::desc("Write output to <file>"),
                                cl::value_desc("file"), cl::init("-"),
                                cl::cat(kilncCategory));

cl::opt<bool> noFusion("no-fusion",
                       cl::desc("One op per kernel (for comparison and debugging)"),
                       cl::init(false), cl::cat(kilncCategory));
cl::opt<bool> printKernelIR(
    "print-kernel-ir-after-all",
    cl::desc("Print the CPU kernel module after every pass of its lowering (kiln -> linalg -> "
             "bufferized memrefs -> loops -> LLVM dialect) to stderr"),
    cl::init(false), cl::cat(kilncCategory));
cl::opt<bool> printIR(
    "print-ir-after-all",
    cl::desc("Print the module after every pass of the training pipeline (kiln-train-step, "
             "the parallel passes, ...) and of kernel formation (kiln-split-losses, "
             "kiln-mark-forward, kiln-fuse) to stderr"),
    cl::init(false), cl::cat(kilncCategory));
cl::opt<std::string> gpuCost(
    "gpu-cost", cl::value_desc("DEVICE"),
    cl::desc("With --target=cuda: print the GPU cost model's prediction of one train step on "
             "DEVICE (H100-SXM, H200, A100-SXM): its GEMM and kernel time and the most "
             "expensive steps (docs/cuda.md \"The GPU cost model\")"),
    cl::cat(kilncCategory));
cl::opt<std::string> cudaColumns(
    "cuda-columns", cl::value_desc("tiles|block"), cl::init("tiles"),
    cl::desc("Column reductions in CUDA: tiles (coalesced, split over blocks; the default) or "
             "block (the older block-per-column form, kept to time one against the other)"),
    cl::cat(kilncCategory));
cl::opt<std::string> cudaScatter(
    "cuda-scatter", cl::value_desc("chunks|walk"), cl::init("chunks"),
    cl::desc("scatter_add in CUDA: chunks (the indices split over blocks, per-row sums in "
             "shared memory, then the chunks summed in order; the default where it applies) or "
             "walk (the older forms where each thread reads every index, kept to time one "
             "against the other)"),
    cl::cat(kilncCategory));
cl::opt<std::string> cudaHalfVectors(
    "cuda-half-vectors", cl::value_desc("on|off"), cl::init("on"),
    cl::desc("Elementwise kernels over f16/bf16 buffers in CUDA: on (8 elements a thread, "
             "16-byte loads and stores: elementwise(vec8); the default) or off (the scalar "
             "elementwise form, kept to time one against the other)"),
    cl::cat(kilncCategory));
cl::opt<unsigned> gpuCostTop("gpu-cost-top", cl::init(15),
                              cl::desc("With --gpu-cost: how many of the most expensive steps "
                                       "to list (default 15)"),
                              cl::cat(kilncCategory));
cl::opt<bool> gpuCostTf32("gpu-cost-tf32",
                          cl::desc("With --gpu-cost: f32 GEMMs on TF32 tensor cores"),
                          cl::init(false), cl::cat(kilncCategory));
cl::opt<bool> gpuCostGraphs("gpu-cost-graphs",
                            cl::desc("With --gpu-cost: the step replayed as one CUDA graph"),
                            cl::init(false), cl::cat(kilncCategory));
cl::opt<bool> fusionReport("fusion-report",
                           cl::desc("Print every kernel of the train step (kind, ops, "
                                    "model lines, FLOPs, bytes) and every refused "
                                    "fusion with its rule"),
                           cl::init(false), cl::cat(kilncCategory));

cl::opt<std::string> precisionReport(
    "precision-report",
    cl::desc("Print every rounding point of the mixed-precision program (op, model line, "
             "from and to type, rule), the ops kept in fp32 and why, the user's casts, and "
             "the activation memory against fp32; =json for tools"),
    cl::value_desc("text|json"), cl::ValueOptional, cl::init(""), cl::cat(kilncCategory));

cl::opt<std::string> target("target",
                            cl::desc("Code generation targets: cpu (default), cuda, or "
                                     "cpu,cuda (one artifact for both)"),
                            cl::init("cpu"), cl::cat(kilncCategory));
cl::opt<int> cudaMaxRegisters(
    "cuda-maxrregcount",
    cl::desc("Registers per thread the CUDA kernels may use (__maxnreg__ on every kernel; "
             "default: the launch bounds decide); kernels that then spill are flagged"),
    cl::init(0), cl::cat(kilncCategory));
cl::opt<bool> omitZeroInitializers(
    "omit-zero-initializers",
    cl::desc("Leave all-zero initial values (optimizer moments, zero biases) out of the "
             "artifact: the manifest lists them and kiln-run re-creates them (an Adam "
             "model's artifact shrinks by about two thirds)"),
    cl::init(false), cl::cat(kilncCategory));
cl::list<std::string> cudaArchs(
    "cuda-arch",
    cl::desc("GPU architectures compiled ahead of time with NVRTC (PTX and CUBIN; "
             "default sm_80 and sm_90); others are compiled when loaded"),
    cl::value_desc("sm_XY"), cl::CommaSeparated, cl::cat(kilncCategory));

cl::list<std::string> dims("dim",
                           cl::desc("Size of a free dimension, e.g. --dim B=12"),
                           cl::value_desc("NAME=SIZE"), cl::cat(kilncCategory));

cl::opt<int64_t> batch("batch",
                       cl::desc("Batch size (overrides the train section)"),
                       cl::init(0), cl::cat(kilncCategory));

cl::opt<int64_t> devicesOpt(
    "devices",
    cl::desc("Devices (the dp mesh axis, times --tp; overrides the train "
             "section's devices; the per-device batch stays the model's)"),
    cl::init(0), cl::cat(kilncCategory));
cl::opt<int64_t> tpOpt("tp",
                       cl::desc("Tensor-parallel devices per replica (Megatron: the tp "
                                "mesh axis; --devices counts all devices, dp = devices / "
                                "tp; overrides the train section's tp)"),
                       cl::init(0), cl::cat(kilncCategory));
cl::opt<int64_t> ppOpt("pp",
                       cl::desc("Pipeline stages (the pp mesh axis; --devices counts all "
                                "devices, dp = devices / (pp x tp); overrides the train "
                                "section's pp)"),
                       cl::init(0), cl::cat(kilncCategory));
cl::opt<int64_t> microBatchesOpt(
    "micro-batches",
    cl::desc("Micro-batches per step for the pipeline (each of the model's batch; "
             "overrides the train section's micro_batches / grad_accum)"),
    cl::init(0), cl::cat(kilncCategory));
cl::opt<std::string> pipelineOpt(
    "pipeline",
    cl::desc("Pipeline schedule: 1f1b (default), gpipe, or interleaved (1F1B over "
             "--virtual-stages model chunks per device)"),
    cl::init(""), cl::cat(kilncCategory));
cl::opt<int64_t> virtualStagesOpt(
    "virtual-stages",
    cl::desc("Model chunks per pipeline device with --pipeline interleaved (default 2)"),
    cl::init(0), cl::cat(kilncCategory));
cl::opt<int> zeroOpt("zero",
                     cl::desc("ZeRO stage 0, 1 or 2 with --devices > 1 (overrides "
                              "the train section's zero)"),
                     cl::init(0), cl::cat(kilncCategory));
cl::opt<double> bucketMb("bucket-mb",
                         cl::desc("Gradient bucket size in MiB after the first "
                                  "(overrides bucket_mb; default 25)"),
                         cl::init(0), cl::cat(kilncCategory));
cl::opt<double> firstBucketMb("first-bucket-mb",
                              cl::desc("First gradient bucket's size in MiB "
                                       "(overrides first_bucket_mb; default 1)"),
                              cl::init(0), cl::cat(kilncCategory));

cl::opt<std::string> parallelOpt(
    "parallel",
    cl::desc("auto: the planner compiles every pp x dp x tp layout (ZeRO "
             "stages, pipeline micro-batches) of --devices N, predicts "
             "each one's memory and step time on this machine, prints the "
             "ranked table and "
             "compiles the best that fits (docs/parallel.md \"The planner\")"),
    cl::value_desc("auto"), cl::init(""), cl::cat(kilncCategory));
cl::opt<std::string> memoryPerDevice(
    "memory-per-device",
    cl::desc("With --parallel=auto: the memory each device has, in bytes or "
             "with KiB, MiB, "
             "GiB (e.g. 64MiB); layouts whose plan needs more are not chosen"),
    cl::value_desc("SIZE"), cl::init(""), cl::cat(kilncCategory));

cl::opt<double> plannerMargin(
    "planner-margin",
    cl::desc(
        "With --parallel=auto: a layout with a larger pp x tp (then tp) is "
        "chosen over a smaller one only when predicted faster per row by more "
        "than this fraction (default 0.10)"),
    cl::init(0.10), cl::cat(kilncCategory));
cl::opt<std::string> machineFile(
    "machine", cl::value_desc("FILE"),
    cl::desc("With --parallel=auto: the machine as kiln-run devices --calibrate --devices N "
             "measured it, instead of measuring it now (the GEMM shapes are still timed)"),
    cl::init(""), cl::cat(kilncCategory));
cl::opt<std::string> plannerMachine(
    "planner-machine",
    cl::desc(
        "Testing aid: the planner's machine constants instead of measuring "
        "them, "
        "cores=C,gflops=G,gbps=B,latency-us=L,busbw-gbps=W (machine totals)"),
    cl::init(""), cl::Hidden, cl::cat(kilncCategory));

cl::opt<std::string> gradReduce(
    "grad-reduce",
    cl::desc("Element type of the data-parallel gradient all-reduce: fp32 (default) or "
             "bf16 (half the bytes; overrides the train section's grad_reduce)"),
    cl::value_desc("fp32|bf16"), cl::init(""), cl::cat(kilncCategory));
cl::opt<std::string> deterministicOpt(
    "deterministic",
    cl::desc("none (default) or devices: the same bits on 1, 2, 4, ... data-parallel "
             "devices for the same global batch (overrides the train section's "
             "deterministic; docs/parallel.md)"),
    cl::value_desc("none|devices"), cl::init(""), cl::cat(kilncCategory));
cl::opt<int64_t> deterministicChunksOpt(
    "deterministic-chunks",
    cl::desc("With --deterministic devices: the chunks each global batch is cut into (a "
             "power of two, default 8; the same in every run compared)"),
    cl::value_desc("C"), cl::cat(kilncCategory));
cl::opt<bool> separateScalarReductions(
    "separate-scalar-reductions",
    cl::desc("Measuring aid: the loss and the gradient norm in an all-reduce each, and the "
             "stop flag agreed by kiln-run after the step (instead of one all-reduce of the "
             "step's scalars)"),
    cl::init(false), cl::Hidden, cl::cat(kilncCategory));
cl::opt<std::string> precisionOpt(
    "precision",
    cl::desc("fp32, tf32, bf16 or fp16: the training step's precision (overrides the "
             "train section's precision; tf32: float32 everywhere, matmuls on TF32 tensor "
             "cores on CUDA; docs/training.md \"Mixed precision\")"),
    cl::value_desc("fp32|tf32|bf16|fp16"), cl::cat(kilncCategory));
cl::opt<std::string> precisionModeOpt(
    "precision-mode",
    cl::desc("kiln (default: Kiln's policy) or autocast (rounding points where "
             "PyTorch autocast puts them) for --precision bf16/fp16"),
    cl::value_desc("kiln|autocast"), cl::cat(kilncCategory));
cl::opt<std::string> attentionOpt(
    "attention",
    cl::desc("auto (default: attention over 128 keys or more becomes one kiln.attention "
             "step, no T x T tensors), fused (every attention the compiler finds) or unfused "
             "(overrides the train section's attention; docs/training.md \"Fused attention\")"),
    cl::value_desc("auto|fused|unfused"), cl::cat(kilncCategory));

cl::list<std::string> params(
    "param", cl::desc("Override a model parameter, e.g. --param layers=2"),
    cl::value_desc("NAME=VALUE"), cl::cat(kilncCategory));

cl::opt<bool> debugInfo("debuginfo",
                        cl::desc("Print source locations (file:line:col) on "
                                 "every op with --emit=mlir"),
                        cl::init(false), cl::cat(kilncCategory));

cl::opt<std::string> logLevel("log-level",
                              cl::desc("error, warn, info or debug "
                                       "(default: $KILN_LOG or info)"),
                              cl::init(""), cl::cat(kilncCategory));

int userError(const std::string &message) {
  std::fprintf(stderr, "kilnc: error: %s\n", message.c_str());
  return 1;
}

/// A driver step's failure: "kilnc: error: ..." (exit 1) or "kilnc: internal
/// error: ..." (exit 2), the context's diagnostics first where they say why.
int fail(const kiln::Status &status, const std::string &diagnostics = "") {
  std::fputs(diagnostics.c_str(), stderr);
  std::fprintf(stderr, "kilnc: %s: %s\n", status.exitCode() == 2 ? "internal error" : "error",
               status.message().c_str());
  return status.exitCode();
}
int fail(const kiln::Outcome &o, const std::string &diagnostics) {
  return fail(o.status, o.diagnosticsFirst ? diagnostics : "");
}

bool splitAssign(const std::string &s, std::string &name, std::string &value) {
  size_t eq = s.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == s.size())
    return false;
  name = s.substr(0, eq);
  value = s.substr(eq + 1);
  return true;
}
/// Sets `to` to the flag's value where the flag was given.
template <typename To, typename T> void given(To &to, const cl::opt<T> &flag) {
  if (flag.getNumOccurrences())
    to = flag.getValue();
}

/// The driver's options from the flags (the model's text: `sourceText`).
kiln::CompileOptions compileOptions(const std::string &sourceText) {
  kiln::CompileOptions co;
  co.modelPath = inputFile;
  co.sourceText = sourceText;
  kiln::LayoutOptions &layout = co.layout;
  given(layout.devices, devicesOpt);
  given(layout.tp, tpOpt);
  given(layout.pp, ppOpt);
  given(layout.microBatches, microBatchesOpt);
  given(layout.pipeline, pipelineOpt);
  given(layout.virtualStages, virtualStagesOpt);
  given(layout.zero, zeroOpt);
  given(layout.bucketMb, bucketMb);
  given(layout.firstBucketMb, firstBucketMb);
  given(layout.gradReduce, gradReduce);
  given(layout.deterministic, deterministicOpt);
  given(layout.deterministicChunks, deterministicChunksOpt);
  layout.separateScalarReductions = separateScalarReductions;
  given(co.precision, precisionOpt);
  given(co.precisionMode, precisionModeOpt);
  given(co.attention, attentionOpt);
  given(co.seed, seedOpt);
  co.fusion = !noFusion;
  co.printKernelIRAfterAll = printKernelIR;
  co.printIRAfterAll = printIR;
  co.omitZeroInitializers = omitZeroInitializers;
  co.target = target;
  if (!cudaArchs.empty())
    co.cudaArchs.assign(cudaArchs.begin(), cudaArchs.end());
  co.cudaMaxRegisters = cudaMaxRegisters;
  co.note = [](const std::string &line) { std::fprintf(stderr, "kilnc: %s\n", line.c_str()); };
  return co;
}

/// --parallel=auto: the planner's layout set on `module`, its report
/// printed. Returns the exit code where kilnc stops here (an error, or the
/// report was the output).
std::optional<int> planLayout(mlir::ModuleOp module, std::string &diagnostics) {
  if (parallelOpt != "auto")
    return userError("--parallel=" + parallelOpt + ": the only value is auto");
  if (tpOpt.getNumOccurrences() || zeroOpt.getNumOccurrences() ||
      ppOpt.getNumOccurrences() || microBatchesOpt.getNumOccurrences() ||
      pipelineOpt.getNumOccurrences() || virtualStagesOpt.getNumOccurrences())
    return userError("--parallel=auto chooses tp, zero, pp, micro-batches and the "
                     "pipeline schedule itself; leave out --tp, --zero, --pp, "
                     "--micro-batches, --pipeline and --virtual-stages "
                     "(or leave out --parallel=auto to give them)");
  if (auto c = kiln::deterministicChunking(module); c && *c)
    return userError("--parallel=auto with deterministic = \"devices\": the planner would "
                     "choose tensor and pipeline layouts, which add in their own order; give "
                     "the data-parallel layout with --devices N instead");
  kiln::planner::Options po;
  po.devices = 0; // the train section's
  given(po.devices, devicesOpt);
  if (memoryPerDevice.getNumOccurrences()) {
    int64_t bytes = 0;
    if (!kiln::planner::parseSize(memoryPerDevice, bytes))
      return userError(
          "--memory-per-device=" + memoryPerDevice +
          ": give bytes (e.g. 67108864) or a size with KiB, MiB or GiB (e.g. "
          "64MiB)");
    po.budgetBytes = bytes;
  }
  if (!(plannerMargin >= 0) || plannerMargin > 10)
    return userError("--planner-margin must be a fraction from 0 to 10, e.g. 0.1");
  po.margin = plannerMargin;
  po.fusion = !noFusion;
  po.modelPath = inputFile;
  po.machineFile = machineFile;
  std::optional<std::string> machine;
  given(machine, plannerMachine);
  // The machine measured by the runtime (runtime/train/Calibrate.h).
  kiln::planner::MachineProbe probe{kiln::train::measureMachine, kiln::train::timeGemms};
  if (kiln::Status st =
          kiln::planner::chooseLayout(module, po, machine, probe, diagnostics, llvm::outs());
      !st)
    return userError(st.message());
  if (outputFile == "-" && !emit.getNumOccurrences())
    return 0; // the report was the output
  return std::nullopt;
}

/// The compiled program as --emit asks: the artifact written (-o), or the
/// plan, fusion report, GPU cost prediction (on `costDevice`), kernels,
/// fused module, CUDA C++, counters or LLVM IR printed.
int writeCompiled(kiln::CompileResult &compiled, mlir::ModuleOp module,
                  const kiln::gpu::DeviceSpec *costDevice) {
  const kiln::program::Program &p = compiled.compiled->program;
  if (emit == Emit::Package) {
    kiln::Status st = kiln::artifact::write(outputFile, compiled.package);
    if (!st) {
      std::fprintf(stderr, "kilnc: error: %s\n", st.message().c_str());
      return st.exitCode();
    }
    size_t bytes = 0;
    for (const auto &sec : compiled.package)
      bytes += sec.bytes.size();
    // Pipeline stages differ in arena: the largest is what a device needs.
    int64_t arena = 0;
    for (int d = 0; d < p.numDevices(); ++d)
      arena = std::max(arena, p.plan(d).arenaBytes);
    std::fprintf(stderr, "kilnc: wrote %s (%.1f MiB): %zu kernels, arena %.2f MiB%s\n",
                 outputFile.c_str(), double(bytes) / (1 << 20), p.kernels.size(),
                 double(arena) / (1 << 20),
                 arena != p.arenaBytes ? " (the largest pipeline stage's)" : "");
    return 0;
  }
  std::string error;
  auto output = mlir::openOutputFile(outputFile, &error);
  if (!output)
    return userError(error);
  if (costDevice) {
    auto form = kiln::gpu::gemmPlanFormFromEnv(); // as the devices split GEMMs
    if (!form)
      return userError(form.status().message());
    kiln::gpu::CostOptions o;
    o.tf32 = gpuCostTf32;
    o.cudaGraphs = gpuCostGraphs;
    o.gemmSplit = [f = *form](const kiln::program::GemmParams &g) {
      return kiln::gpu::gemmCalls(g, f);
    };
    for (const auto &f : p.functions)
      if (f.name == "train_step")
        output->os() << "@train_step on "
                     << kiln::gpu::formatReport(
                            kiln::gpu::predict(p, f, compiled.cuda->kernels, *costDevice, o),
                            gpuCostTop);
  } else if (fusionReport)
    kiln::printFusionReport(p, compiled.compiled->refusals, compiled.compiled->attentionRemarks,
                            output->os());
  else if (emit == Emit::Plan)
    kiln::printPlan(p, output->os(), compiled.compiled->activations);
  else if (emit == Emit::Kernels)
    compiled.compiled->kernels->print(output->os());
  else if (emit == Emit::Fused)
    module.print(output->os());
  else if (emit == Emit::Cuda)
    output->os() << compiled.cuda->source;
  else if (emit == Emit::Counters) {
    // GEMM library calls as kiln-run's CUDA devices split them.
    auto form = kiln::gpu::gemmPlanFormFromEnv();
    if (!form)
      return userError(form.status().message());
    output->os() << kiln::program::countPlan(p, compiled.cuda ? &compiled.cuda->kernels : nullptr,
                                             *form)
                        .toJson();
  } else
    output->os() << compiled.compiled->llvmIR;
  output->keep();
  return 0;
}
} // namespace

int main(int argc, char **argv) {
  sys::PrintStackTraceOnErrorSignal(argv[0]);
  cl::HideUnrelatedOptions(kilncCategory);
  cl::SetVersionPrinter([](raw_ostream &os) {
    os << "kilnc (Kiln) 0.1.0, MLIR " << LLVM_VERSION_STRING << "\n";
  });
  cl::ParseCommandLineOptions(
      argc, argv,
      "kilnc: compile a Kiln model file (.kiln)\n\n"
      "  kilnc MODEL.kiln                 print a summary (ops, parameters)\n"
      "  kilnc MODEL.kiln --emit=mlir     print the verified kiln module\n\n"
      "Exit codes: 0 success, 1 user error, 2 internal error.\n");

  if (!logLevel.empty()) {
    kiln::log::Level level;
    if (!kiln::log::parseLevel(logLevel, level))
      return userError("--log-level must be error, warn, info or debug");
    kiln::log::setLevel(level);
  }

  kiln::frontend::FrontendOptions opts;
  for (const std::string &d : dims) {
    std::string name, value;
    char *end = nullptr;
    if (!splitAssign(d, name, value))
      return userError("--dim expects NAME=SIZE, got '" + d + "'");
    long long v = std::strtoll(value.c_str(), &end, 10);
    if (*end != '\0' || v < 1)
      return userError("--dim " + d + ": the size must be a positive integer");
    if (v > kiln::frontend::kMaxDimSize)
      return userError("--dim " + d + ": the size is larger than " +
                       std::to_string(kiln::frontend::kMaxDimSize));
    opts.dims[name] = v;
  }
  for (const std::string &p : params) {
    std::string name, value;
    if (!splitAssign(p, name, value))
      return userError("--param expects NAME=VALUE, got '" + p + "'");
    opts.params[name] = value;
  }
  if (gradcheck && !batch.getNumOccurrences())
    opts.batch = 2; // finite differences on a small batch keep it fast
  if (batch.getNumOccurrences()) {
    if (batch < 1 || batch > kiln::frontend::kMaxDimSize)
      return userError("--batch must be a positive integer");
    opts.batch = batch;
  }

  auto buffer = MemoryBuffer::getFileOrSTDIN(inputFile, /*IsText=*/false,
                                             /*RequiresNullTerminator=*/false);
  if (std::error_code ec = buffer.getError())
    return userError("cannot read '" + inputFile + "': " + ec.message());
  if (sys::fs::is_directory(inputFile))
    return userError("'" + inputFile + "' is a directory, not a model file");

  kiln::frontend::SourceFile source(inputFile, (*buffer)->getBuffer().str());
  mlir::MLIRContext context;
  context.loadDialect<kiln::KilnDialect, mlir::func::FuncDialect>();
  kiln::DiagnosticText mlirDiags(context, source);
  // The layout and precision flags, as the driver's options; the driver
  // writes them into the module and checks the layout rules.
  kiln::CompileOptions co = compileOptions(source.text());
  kiln::LoadResult loaded = kiln::loadConfigured(context, source, opts, co);
  std::fputs(loaded.diagnostics.c_str(), stderr); // with a module, warnings: compilation goes on
  if (!loaded) {
    if (loaded.status.exitCode() == 2) {
      std::fprintf(stderr, "kilnc: internal error: %s\n%s", loaded.status.message().c_str(),
                   mlirDiags.text.c_str());
      return 2;
    }
    return loaded.status.message().empty() ? loaded.status.exitCode()
                                           : userError(loaded.status.message());
  }
  mlir::OwningOpRef<mlir::ModuleOp> module = std::move(loaded.module);
  // The planner: choose the layout, then compile it as if its flags had
  // been given.
  if (parallelOpt.getNumOccurrences()) {
    if (std::optional<int> exit = planLayout(*module, mlirDiags.text))
      return *exit;
  } else if (machineFile.getNumOccurrences()) {
    return userError("--machine FILE goes with --parallel=auto (the planner reads it)");
  }

  if (precisionReport.getNumOccurrences()) {
    if (!precisionReport.empty() && precisionReport != "text" && precisionReport != "json")
      return userError("--precision-report takes text (the default) or json, got '" +
                       precisionReport + "'");
    kiln::PrecisionReport report;
    if (kiln::Outcome o = kiln::precisionReport(*module, co, report); !o)
      return fail(o, mlirDiags.text);
    std::string error;
    auto output = mlir::openOutputFile(outputFile, &error);
    if (!output)
      return userError(error);
    if (precisionReport == "json")
      kiln::printPrecisionReportJson(report, output->os());
    else
      kiln::printPrecisionReport(report, output->os());
    output->keep();
    return 0;
  }

  // --gradcheck runs @grad, one device's gradients in float64;
  // --export-reference the one-device program in the interpreter.
  if (gradcheck)
    if (kiln::Status st = kiln::prepareGradCheck(*module); !st)
      return userError(st.message());
  // The seed of the initial parameters: the artifact's and the reference's
  // are the same, so a reference exported for another framework starts from
  // the weights kiln-run trains.
  uint64_t initSeed = kiln::initSeed(*module, co.seed);
  if (!exportReference.empty())
    kiln::prepareReference(*module, co);
  bool needsTrain = emit == Emit::Train || gradcheck || !exportReference.empty();
  if (needsTrain)
    if (kiln::Outcome o = kiln::buildTraining(*module, co, gradcheck); !o)
      return fail(o, mlirDiags.text);
  if (gradcheck) {
    kiln::GradCheckOptions g;
    g.tolerance = gradcheckTolerance;
    g.samples = gradcheckSamples;
    g.seed = seedOpt;
    g.injectError = gradcheckInject;
    std::string err;
    double worst = kiln::gradCheck(*module, g, llvm::outs(), err);
    if (worst < 0) {
      std::fprintf(stderr, "kilnc: internal error: gradcheck: %s\n", err.c_str());
      return 2;
    }
    return worst <= g.tolerance ? 0 : 1;
  }
  if (!exportReference.empty()) {
    std::string err;
    if (!kiln::exportReference(*module, exportReference, referenceSteps, initSeed,
                               llvm::outs(), err)) {
      std::fprintf(stderr, "kilnc: error: %s\n", err.c_str());
      return 1;
    }
    return 0;
  }

  if (!emit.getNumOccurrences() && StringRef(outputFile).ends_with(".kpack"))
    emit = Emit::Package;
  bool targetCuda = false;
  if (kiln::Status st = kiln::parseTarget(target, targetCuda); !st)
    return userError(st.message());
  co.cuda = targetCuda || emit == Emit::Cuda;
  if (fusionReport || !gpuCost.empty())
    emit = Emit::Plan; // the report replaces the plan's listing below
  const kiln::gpu::DeviceSpec *costDevice = nullptr;
  if (!gpuCost.empty()) {
    costDevice = kiln::gpu::DeviceSpec::find(gpuCost);
    if (!costDevice) {
      std::string known;
      for (const auto &d : kiln::gpu::DeviceSpec::table())
        known += (known.empty() ? "" : ", ") + d.name;
      return userError("--gpu-cost=" + gpuCost + ": no such device in the cost model's table (" +
                       known + ")");
    }
    if (!co.cuda)
      return userError("--gpu-cost predicts the CUDA plan: add --target=cuda");
  }
  if (emit == Emit::Plan || emit == Emit::Kernels || emit == Emit::LLVM ||
      emit == Emit::Package || emit == Emit::Cuda || emit == Emit::Fused ||
      emit == Emit::Counters) {
    if (co.cuda) {
      if (cudaColumns != "tiles" && cudaColumns != "block")
        return userError("--cuda-columns must be tiles or block, got '" + cudaColumns + "'");
      if (cudaScatter != "chunks" && cudaScatter != "walk")
        return userError("--cuda-scatter must be chunks or walk, got '" + cudaScatter + "'");
      if (cudaHalfVectors != "on" && cudaHalfVectors != "off")
        return userError("--cuda-half-vectors must be on or off, got '" + cudaHalfVectors + "'");
      co.cudaEmit.columnTiles = cudaColumns == "tiles";
      co.cudaEmit.scatterChunks = cudaScatter == "chunks";
      co.cudaEmit.halfVectors = cudaHalfVectors == "on";
    }
    if (emit == Emit::Package && outputFile == "-")
      return userError("--emit=kpack needs -o FILE.kpack");
    co.output = emit == Emit::LLVM      ? kiln::CompileOutput::LLVM
                : emit == Emit::Package ? kiln::CompileOutput::Package
                                        : kiln::CompileOutput::Program;
    kiln::CompileResult compiled = kiln::compile(*module, co);
    if (!compiled) { // "kilnc: error:" also where the status is internal (exit 2)
      if (compiled.diagnosticsFirst)
        std::fputs(mlirDiags.text.c_str(), stderr);
      std::fprintf(stderr, "kilnc: error: %s\n", compiled.status.message().c_str());
      return compiled.status.exitCode();
    }
    return writeCompiled(compiled, *module, costDevice);
  }

  std::string error;
  auto output = mlir::openOutputFile(outputFile, &error);
  if (!output)
    return userError(error);
  if (emit == Emit::Mlir || emit == Emit::Train) {
    mlir::OpPrintingFlags flags;
    if (debugInfo)
      flags.enableDebugInfo(/*enable=*/true, /*prettyForm=*/false);
    module->print(output->os(), flags);
    output->os() << "\n";
  } else {
    kiln::ModelSummary summary = kiln::summarize(*module);
    if (mlir::failed(kiln::buildTrainProgram(*module))) {
      std::fputs(mlirDiags.text.c_str(), stderr);
      return 1;
    }
    kiln::addProgram(summary, *module);
    kiln::print(summary, output->os());
  }
  output->keep();
  return 0;
}
