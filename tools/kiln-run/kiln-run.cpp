//===- kiln-run.cpp - Kiln's runtime driver --------------------------------===//
//
//   kiln-run prepare TEXT OUTDIR [--val-fraction F]
//       a text file -> character vocabulary and uint16 token files
//   kiln-run inspect FILE
//       what a checkpoint (.safetensors) or an artifact (.kpack) holds,
//       after verifying it
//   kiln-run train|eval|sample MODEL.kpack [options]
//       run a compiled model on the CPU backend (Commands.cpp, over runtime/train)
//
// The runtime never links MLIR; the CPU backend uses LLVM (ORC) and is left
// out where LLVM is absent. Exit codes: 0 success, 1 user error, 2 internal error.
//
//===----------------------------------------------------------------------===//
#include "runtime/core/Artifact.h"
#include "runtime/core/Checkpoint.h"
#include "runtime/core/Data.h"
#include "runtime/core/Package.h"
#include "tools/kiln-run/Commands.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <unistd.h>
#include <cstring>
#include <string>
#include <vector>

namespace {

const char *kUsage =
    "kiln-run: Kiln's runtime driver\n"
    "\n"
    "usage:\n"
    "  kiln-run prepare TEXT OUTDIR [--val-fraction F]\n"
    "      Turn a UTF-8 text file into a character-level data set:\n"
    "      OUTDIR/vocab.json (the sorted characters, Unicode code points; a\n"
    "      Windows line ending is two, \\r and \\n), OUTDIR/train.bin and\n"
    "      OUTDIR/val.bin (uint16 tokens; the last F of the text, default 0.1,\n"
    "      is validation).\n"
    "  kiln-run inspect FILE\n"
    "      Verify a checkpoint (.safetensors) or artifact (.kpack) and list\n"
    "      what it holds.\n"
    "  kiln-run train MODEL.kpack [--steps N | --epochs N] [--last-batch drop|wrap]\n"
    "          [--data PATH] [--val-data PATH]\n"
    "          [--resume CKPT [--allow-batch-change] | --init FILE [--init-rename FROM=TO]\n"
    "          [--init-ignore NAME]] [--checkpoint CKPT] [--checkpoint-every N]\n"
    "          [--threads N] [--seed S] [--eval-interval N] [--eval-steps N]\n"
    "          [--log-interval N] [--loss-log FILE] [--profile] [--quiet]\n"
    "          [--stats-csv FILE] [--max-skipped-steps N]\n"
    "          [--in-order] [--device cpu:N|cuda:0,1,...] [--collective-timeout S]\n"
    "      Train (on --device, default cpu). Data paths default to the model's train section;\n"
    "      PATH is a token file (uint16, nanoGPT style: random windows) or a\n"
    "      directory with one .npy array per input (DIR/<input>.npy, shuffled\n"
    "      per epoch; --in-order keeps file order). --epochs N trains N epochs of\n"
    "      .npy data (the data line says the steps per epoch; token windows have no\n"
    "      epochs); --last-batch says what happens to the rows an epoch has past its\n"
    "      last whole global batch: wrap (default) runs batches on into the next\n"
    "      epoch, drop leaves them unread (docs/runtime.md \"Epochs\").\n"
    "      Checkpoints (safetensors, atomic) default to\n"
    "      MODEL.ckpt.safetensors every eval interval and at the end; Ctrl-C\n"
    "      saves one and exits (130). --resume continues bit for bit (a checkpoint\n"
    "      of the same model and optimizer; another model's is refused). It keeps\n"
    "      the global batch the checkpoint records: an artifact whose devices x\n"
    "      rows per device differ is refused, saying how to compile one that\n"
    "      keeps it; --allow-batch-change accepts the change.\n"
    "      --init FILE: start from existing weights: every parameter from a\n"
    "      safetensors file by name (kilnc MODEL.kiln lists the names; F64, F16\n"
    "      and BF16 are converted to float32), optimizer state and step fresh; a\n"
    "      missing, extra or wrongly shaped tensor is an error. Not with --resume.\n"
    "      --init-rename FROM=TO (repeatable): file names starting with FROM are\n"
    "      matched as TO + the rest (PyTorch nn.Sequential: --init-rename\n"
    "      0.=dense.linear.); --init-ignore NAME (repeatable; NAME* a prefix):\n"
    "      leave a file tensor out. Linear weights are [out, in], as nn.Linear's.\n"
    "      Loss scaling (fp16): a warning after 10 steps in a row skipped (gradients\n"
    "      not finite); exit 1 after --max-skipped-steps N in a row (default 100)\n"
    "      or when every step of the run was skipped (N = 0: neither fails).\n"
    "      --tensorboard DIR: scalars (loss, lr, grad norm, val loss, tokens/s,\n"
    "      step time) in a TensorBoard event file in DIR (tensorboard --logdir DIR);\n"
    "      with --trace FILE or --trace-steps A:B, the traced steps also in\n"
    "      DIR/plugins/profile/<run>/rank<N>.xplane.pb, one per device, for\n"
    "      TensorBoard's Profile tab (pip install tensorboard-plugin-profile).\n"
    "      Input pipeline: [--prefetch N] batches made ahead (default 3) by\n"
    "      [--data-workers N] threads (default 1; results never depend on either);\n"
    "      --data also takes token shards: a,b.bin, 'train-*.bin' or a directory of\n"
    "      *.bin (windows drawn across them); [--shuffle-buffer N] shuffles .npy rows\n"
    "      through a window of N rows (tf.data) instead of a whole-epoch permutation.\n"
    "      --profile: after training, where a step's time goes (input, host to\n"
    "      device, GEMMs, generated kernels, exposed and overlapped communication,\n"
    "      idle) over every step but the first (with --trace: the traced steps),\n"
    "      one recommendation, and the top kernels against the machine's measured\n"
    "      peak; --stats-csv FILE writes every kernel's row (implies --profile).\n"
    "      --trace FILE [--trace-steps A:B]: a timeline of steps A..B-1 (default:\n"
    "      10 steps after 2 warm-up steps) in the Chrome trace / Perfetto format\n"
    "      (ui.perfetto.dev, chrome://tracing; docs/profiling.md \"Trace\").\n"
    "      --log-placement: first, where each step of @train_step runs (stage and\n"
    "      devices, kernel/GEMM/transfer, model-file line) and a summary per\n"
    "      pipeline stage (docs/runtime.md \"Where steps run\").\n"
    "  kiln-run eval MODEL.kpack [--checkpoint CKPT] [--val-data PATH] [--eval-steps N]\n"
    "      Mean validation loss (and accuracy for classifiers) over N batches;\n"
    "      without --eval-steps, every row of a .npy validation set once (not\n"
    "      the train section's eval_steps, which bounds evaluation during\n"
    "      training), or eval_steps windows of a token file. Without\n"
    "      --checkpoint, the initial parameters. --log-placement\n"
    "      lists @eval_step's steps as train does @train_step's.\n"
    "  kiln-run sample MODEL.kpack [--checkpoint CKPT] [--tokens N] [--prompt TEXT]\n"
    "          [--temperature T] [--top-k K] [--seed S] [--vocab vocab.json]\n"
    "      Generate text from a character-level language model.\n"
    "  Several devices (an artifact from kilnc --devices N): train with\n"
    "      --device cpu:N (N replicas in this process, each with its share of the\n"
    "      CPUs it may use unless --threads says), or one process per device:\n"
    "      mpirun -np N kiln-run train MODEL.kpack (also srun, torchrun-style\n"
    "      RANK/WORLD_SIZE); each replica reads its part of every global batch,\n"
    "      rank 0 prints and writes the checkpoint (logical layout: it resumes on\n"
    "      any device count). --collective-timeout S (default 300): a collective\n"
    "      that waits longer for a dead or stalled rank ends the run, naming it.\n"
    "      GPUs (an artifact from kilnc --target=cpu,cuda; NCCL): --device cuda:0,1,...\n"
    "      (one replica per GPU listed, in this process), or\n"
    "      mpirun -np N kiln-run train MODEL.kpack --device cuda (GPU = local rank).\n"
    "  Common: --device cpu|cpu:N|cuda|cuda:N|cuda-emu (default cpu; cuda needs an\n"
    "      artifact compiled with kilnc --target=cpu,cuda; cuda-emu runs the\n"
    "      CUDA kernels in the CUDA emulator on the CPU, for testing),\n"
    "      --threads N (CPU; default: the CPUs this process may use: its affinity\n"
    "      mask, capped by a cgroup CPU quota), --cache-dir DIR (compiled\n"
    "      kernels; default $KILN_CACHE_DIR or ~/.cache/kiln), --no-cache.\n"
    "      --inter-op-threads N (CPU, default 1): run up to N independent steps of\n"
    "      the plan at once (each device its own); results do not change.\n"
    "  kiln-run check MODEL.kpack [--device cuda|cuda-emu] [--against cpu]\n"
    "          [--tolerance T] [--seed S]\n"
    "      Run every step of @train_step, @eval_step and @predict on both\n"
    "      devices from the same state (inputs copied from the reference, outputs\n"
    "      poisoned with NaN first) and compare every output: relative error to\n"
    "      the tensor's largest value at most T (default 1e-4), integers exact.\n"
    "  kiln-run devices [--calibrate [--devices N] [-o FILE]]\n"
    "      The backends of this kiln-run and the GPUs of this machine. With\n"
    "      --calibrate: measure the machine for N in-process devices (GEMM and\n"
    "      copy rates, all_reduce latency and bandwidth) and write it for\n"
    "      kilnc --parallel=auto --machine FILE (to stdout without -o).\n"
    "  kiln-run --help\n"
    "\n"
    "Exit codes: 0 success, 1 user error, 2 internal error.\n";

int fail(const kiln::Status &s) {
  fmt::print(stderr, "kiln-run: error: {}\n", s.message());
  return s.exitCode();
}

int usageError(const std::string &message) {
  fmt::print(stderr, "kiln-run: error: {}\n\n{}", message, kUsage);
  return 1;
}

int prepare(std::vector<std::string> args) {
  double valFraction = 0.1;
  std::vector<std::string> positional;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--val-fraction") {
      if (i + 1 >= args.size())
        return usageError("--val-fraction needs a value");
      char *end = nullptr;
      valFraction = std::strtod(args[++i].c_str(), &end);
      if (*end != '\0' || !(valFraction > 0 && valFraction < 1))
        return usageError("--val-fraction must be a number in (0, 1)");
    } else if (args[i].rfind("--", 0) == 0) {
      return usageError("unknown option '" + args[i] + "' for prepare");
    } else {
      positional.push_back(args[i]);
    }
  }
  if (positional.size() != 2)
    return usageError("prepare needs TEXT and OUTDIR");
  auto info = kiln::data::prepareCharDataset(positional[0], positional[1], valFraction);
  if (!info)
    return fail(info.status());
  fmt::print("prepared {}: vocabulary of {} characters, {} train tokens, {} "
             "validation tokens\n  {}/vocab.json, {}/train.bin, {}/val.bin\n",
             positional[0], info->vocab.size(), info->trainTokens,
             info->valTokens, positional[1], positional[1], positional[1]);
  return 0;
}

std::string shapeStr(const std::vector<int64_t> &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int inspect(const std::vector<std::string> &args) {
  if (args.size() != 1)
    return usageError("inspect needs one FILE");
  const std::string &path = args[0];
  bool isArtifact = path.size() >= 6 && path.compare(path.size() - 6, 6, ".kpack") == 0;
  if (isArtifact) {
    auto a = kiln::artifact::Artifact::open(path);
    if (!a)
      return fail(a.status());
    fmt::print("{}: Kiln artifact, format version {}, {} sections (verified)\n",
               path, a->version(), a->sections().size());
    for (const auto &s : a->sections())
      fmt::print("  {:<40} kind {:>3} {:>12} bytes\n", s.name,
                 static_cast<uint32_t>(s.kind), s.bytes.size());
    auto pkg = kiln::Package::open(path);
    if (!pkg)
      return fail(pkg.status());
    const auto &p = pkg->program;
    int64_t params = 0, values = 0;
    for (const auto &b : p.buffers)
      if (b.role == kiln::program::Role::Param) {
        ++params;
        // The model's values: a sharded (tensor-parallel) parameter's
        // logical tensor, not this device's block.
        int64_t n = 1;
        for (int64_t d : b.shardAxis.empty() ? b.shape : b.logicalShape)
          n *= d;
        values += n;
      }
    fmt::print("model {} from {} (sha256 {}...)\n", pkg->model, pkg->sourcePath,
               pkg->sourceHash.substr(0, 12));
    // A pipeline's devices each hold one stage: the arena a device needs is
    // the largest stage's (as kilnc reports it), each stage's below.
    int64_t arenaMax = p.arenaBytes, persistentMax = p.persistentBytes;
    for (int d = 0; p.numStages() > 1 && d < p.numDevices(); ++d) {
      arenaMax = std::max(arenaMax, p.plan(d).arenaBytes);
      persistentMax = std::max(persistentMax, p.plan(d).persistentBytes);
    }
    fmt::print("  {} parameter tensors ({} values); arena {} bytes, {} persistent{}\n", params,
               values, arenaMax, persistentMax,
               p.numStages() > 1 ? " (the largest pipeline stage's)" : "");
    for (int st = 0; p.numStages() > 1 && st < p.numStages(); ++st) {
      // Pipeline stages: each device's arena holds its own stage's buffers.
      int64_t arena = 0, persistent = 0;
      for (int d = 0; d < p.numDevices(); ++d)
        if (p.stageOf(d) == st) {
          arena = std::max(arena, p.plan(d).arenaBytes);
          persistent = std::max(persistent, p.plan(d).persistentBytes);
        }
      fmt::print("  stage {}: arena {} bytes, {} persistent\n", st, arena, persistent);
    }
    fmt::print("  {} kernels; entry points:", p.kernels.size());
    for (const auto &f : p.functions)
      fmt::print(" @{} ({} steps)", f.name, f.steps.size());
    fmt::print("\n");
    return 0;
  }
  auto c = kiln::ckpt::read(path);
  if (!c)
    return fail(c.status());
  size_t bytes = 0;
  for (const auto &t : c->tensors)
    bytes += t.bytes.size();
  using V = kiln::ckpt::Checkpoint::Verified;
  fmt::print("{}: checkpoint, {} tensors, {} bytes of data ({})\n", path, c->tensors.size(),
             bytes,
             c->verified == V::File ? "verified"
             : c->verified == V::Data
                 ? "data verified; an older Kiln wrote it, its header has no CRC"
                 : "not verified: no CRC-32 entry, not written by Kiln");
  for (const auto &[k, v] : c->metadata)
    fmt::print("  {} = {}\n", k, v);
  for (const auto &t : c->tensors)
    fmt::print("  {:<40} {:<5} {}\n", t.name, t.dtype, shapeStr(t.shape));
  return 0;
}

} // namespace

#ifdef KILN_HAVE_OPENBLAS
#include "runtime/cpu/Blas.h"
extern "C" char *openblas_get_corename(void);

namespace {
/// Debian's OpenBLAS (0.3.21) picks its kernels by CPU model and does not
/// know recent CPUs: Sapphire Rapids gets the generic "Prescott" kernels, and
/// AMD Zen 4/5 (which have AVX-512) get the AVX2 "Haswell" kernels. Measured
/// on the GPT's GEMMs (docs/runtime.md): Prescott 2.55 s vs SkylakeX 0.81 s on
/// Sapphire Rapids; on Zen 5, Haswell 110 vs SkylakeX 197 GFLOP/s per core
/// (32.7 vs 22.4 ms per train step). So the choice follows the CPU's
/// features: AVX-512 (F, BW, VL, DQ) -> SkylakeX unless OpenBLAS already
/// chose one of its AVX-512 cores, otherwise AVX2 -> Haswell when it chose
/// a pre-AVX2 core. OpenBLAS reads OPENBLAS_CORETYPE only when it loads, so
/// we set it and re-execute once. An OPENBLAS_CORETYPE already in the
/// environment that names a weaker core than the CPU has is overridden too
/// (some machine images export OPENBLAS_CORETYPE=Haswell for all programs);
/// KILN_BLAS_CORETYPE=keep keeps OpenBLAS's own choice, any other value of
/// it is used as the core type.
void tuneBlas(char **argv) {
  auto chosen = kiln::cpu::blas();
  if (chosen && (*chosen)->mkl)
    return; // OpenBLAS serves no GEMM
  const char *kiln = std::getenv("KILN_BLAS_CORETYPE");
  if (kiln && std::string(kiln) == "keep")
    return;
  if (kiln) {
    const char *cur = std::getenv("OPENBLAS_CORETYPE");
    if (cur && std::string(cur) == kiln)
      return; // already re-executed with it
    ::setenv("OPENBLAS_CORETYPE", kiln, 1);
    ::execv("/proc/self/exe", argv);
    return;
  }
  std::string core = openblas_get_corename();
  for (char &c : core)
    c = char(std::tolower(static_cast<unsigned char>(c)));
  __builtin_cpu_init();
  bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  bool has512Core = core == "skylakex" || core == "cooperlake" || core == "sapphirerapids";
  bool generic = core == "prescott" || core == "core2" || core == "nehalem" ||
                 core == "katmai" || core == "sandybridge" || core == "barcelona" ||
                 core == "bulldozer" || core == "piledriver" || core == "steamroller" ||
                 core == "excavator";
  const char *want = nullptr;
  if (avx512 && !has512Core)
    want = "SkylakeX";
  else if (!avx512 && generic && __builtin_cpu_supports("avx2"))
    want = "Haswell";
  if (!want)
    return;
  ::setenv("OPENBLAS_CORETYPE", want, 1);
  ::setenv("KILN_BLAS_CORETYPE", want, 1);
  ::execv("/proc/self/exe", argv); // on failure, carry on with OpenBLAS's choice
}
} // namespace
#endif

int main(int argc, char **argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  kiln::run::setProgram(argc > 0 && argv[0] ? argv[0] : "kiln-run");
#ifdef KILN_HAVE_OPENBLAS
  if (!args.empty() && (args[0] == "train" || args[0] == "eval" || args[0] == "sample" ||
                        args[0] == "check"))
    tuneBlas(argv);
#endif
  if (args.empty())
    return usageError("no command given");
  if (args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    fmt::print("{}", kUsage);
    return 0;
  }
  std::string command = args[0];
  args.erase(args.begin());
  // `kiln-run train --help` (anywhere after the command): the usage, which
  // lists every command's options, rather than "unknown option".
  for (const std::string &a : args)
    if (a == "--help" || a == "-h") {
      fmt::print("{}", kUsage);
      return 0;
    }
  if (command == "prepare")
    return prepare(args);
  if (command == "check")
    return kiln::run::checkCommand(args);
  if (command == "devices")
    return kiln::run::devicesCommand(args);
  if (command == "inspect")
    return inspect(args);
  if (command == "train")
    return kiln::run::trainCommand(args);
  if (command == "eval")
    return kiln::run::evalCommand(args);
  if (command == "sample")
    return kiln::run::sampleCommand(args);
  return usageError("unknown command '" + command + "'");
}
