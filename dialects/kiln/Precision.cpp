//===- Precision.cpp - The mixed-precision policy table -------------------===//
//
// One line per kiln op that can carry floats (KilnOps.td's order). "kiln":
// GEMMs and elementwise arithmetic/activations in the low type; softmax and
// layer_norm low in/out with fp32 statistics; exp, log, pow, log_softmax,
// sums/means and the loss in fp32; data movement follows its input.
// "autocast": PyTorch's CUDA autocast lists (lower-precision: matmul;
// fp32: exp, log, pow, rsqrt, softmax, log_softmax, layer_norm,
// cross_entropy, sum; everything else runs in the widest input type).
//
//===----------------------------------------------------------------------===//
#include "dialects/kiln/Precision.h"

#include "llvm/ADT/STLExtras.h"

#include <cstdio>

namespace kiln {

namespace {

using C = PrecisionClass;

// Rule names (kiln.precision.rule).
constexpr llvm::StringLiteral kGemm = "gemm-low";
constexpr llvm::StringLiteral kElementwise = "elementwise-low";
constexpr llvm::StringLiteral kActivation = "activation-low";
constexpr llvm::StringLiteral kExpLogPow = "exp-log-pow-fp32";
constexpr llvm::StringLiteral kReduction = "reduction-fp32";
constexpr llvm::StringLiteral kAccumulate = "accumulate-fp32";
constexpr llvm::StringLiteral kSoftmax = "softmax-fp32-stats";
constexpr llvm::StringLiteral kLayerNorm = "layer-norm-fp32-stats";
constexpr llvm::StringLiteral kLogSoftmax = "log-softmax-fp32";
constexpr llvm::StringLiteral kLoss = "loss-fp32";
constexpr llvm::StringLiteral kUserCast = "user-cast";
constexpr llvm::StringLiteral kAcLow = "autocast-lower-precision";
constexpr llvm::StringLiteral kAcFp32 = "autocast-fp32";
constexpr llvm::StringLiteral kNone = "";

// clang-format off
const PrecisionPolicy kTable[] = {
  // op                        kiln          rule         autocast      rule
  {"kiln.constant",            C::Follow,    kNone,       C::Follow,    kNone},
  {"kiln.iota",                C::Follow,    kNone,       C::Follow,    kNone},
  {"kiln.neg",                 C::Low,       kElementwise, C::Promote,  kNone},
  {"kiln.abs",                 C::Low,       kElementwise, C::Promote,  kNone},
  {"kiln.exp",                 C::Fp32,      kExpLogPow,  C::Fp32,      kAcFp32},
  {"kiln.log",                 C::Fp32,      kExpLogPow,  C::Fp32,      kAcFp32},
  {"kiln.sqrt",                C::Low,       kElementwise, C::Promote,  kNone},
  {"kiln.rsqrt",               C::Low,       kElementwise, C::Fp32,     kAcFp32},
  {"kiln.tanh",                C::Low,       kActivation, C::Promote,   kNone},
  {"kiln.sigmoid",             C::Low,       kActivation, C::Promote,   kNone},
  {"kiln.silu",                C::Low,       kActivation, C::Promote,   kNone},
  {"kiln.relu",                C::Low,       kActivation, C::Promote,   kNone},
  {"kiln.erf",                 C::Low,       kActivation, C::Promote,   kNone},
  {"kiln.cos",                 C::Low,       kActivation, C::Promote,   kNone},
  {"kiln.sin",                 C::Low,       kActivation, C::Promote,   kNone},
  {"kiln.gelu",                C::Low,       kActivation, C::Promote,   kNone},
  {"kiln.cast",                C::Keep,      kUserCast,   C::Keep,      kUserCast},
  {"kiln.add",                 C::Low,       kElementwise, C::Promote,  kNone},
  {"kiln.sub",                 C::Low,       kElementwise, C::Promote,  kNone},
  {"kiln.mul",                 C::Low,       kElementwise, C::Promote,  kNone},
  {"kiln.div",                 C::Low,       kElementwise, C::Promote,  kNone},
  {"kiln.pow",                 C::Fp32,      kExpLogPow,  C::Fp32,      kAcFp32},
  {"kiln.max",                 C::Low,       kElementwise, C::Promote,  kNone},
  {"kiln.min",                 C::Low,       kElementwise, C::Promote,  kNone},
  {"kiln.compare",             C::Promote,   kNone,       C::Promote,   kNone},
  {"kiln.select",              C::Low,       kElementwise, C::Promote,  kNone},
  {"kiln.broadcast_in_dim",    C::Follow,    kNone,       C::Follow,    kNone},
  {"kiln.reduce_sum",          C::Fp32,      kReduction,  C::Fp32,      kAcFp32},
  {"kiln.reduce_mean",         C::Fp32,      kReduction,  C::Promote,   kNone},
  {"kiln.reduce_max",          C::Follow,    kNone,       C::Promote,   kNone},
  {"kiln.matmul",              C::Low,       kGemm,       C::Low,       kAcLow},
  {"kiln.reshape",             C::Follow,    kNone,       C::Follow,    kNone},
  {"kiln.transpose",           C::Follow,    kNone,       C::Follow,    kNone},
  {"kiln.slice",               C::Follow,    kNone,       C::Follow,    kNone},
  {"kiln.concat",              C::Follow,    kNone,       C::Promote,   kNone},
  {"kiln.gather",              C::Follow,    kNone,       C::Follow,    kNone},
  {"kiln.pad",                 C::Follow,    kNone,       C::Follow,    kNone},
  {"kiln.scatter_add",         C::Fp32,      kAccumulate, C::Fp32,      kAccumulate},
  {"kiln.all_reduce",          C::Follow,    kNone,       C::Follow,    kNone},
  {"kiln.reduce_scatter",      C::Follow,    kNone,       C::Follow,    kNone},
  {"kiln.all_gather",          C::Follow,    kNone,       C::Follow,    kNone},
  {"kiln.transfer",            C::Follow,    kNone,       C::Follow,    kNone},
  {"kiln.collective_broadcast", C::Follow,   kNone,       C::Follow,    kNone},
  {"kiln.random",              C::Follow,    kNone,       C::Follow,    kNone},
  {"kiln.optimization_barrier", C::Follow,   kNone,       C::Follow,    kNone},
  {"kiln.softmax",             C::Fp32Stats, kSoftmax,    C::Fp32,      kAcFp32},
  {"kiln.log_softmax",         C::Fp32,      kLogSoftmax, C::Fp32,      kAcFp32},
  {"kiln.layer_norm",          C::Fp32Stats, kLayerNorm,  C::Fp32,      kAcFp32},
  {"kiln.cross_entropy",       C::Fp32,      kLoss,       C::Fp32,      kAcFp32},
  {"kiln.dropout",             C::Follow,    kNone,       C::Follow,    kNone},
  // kiln.fusion and kiln.yield are kernel-level (after kiln-fuse): no entry.
};
// clang-format on

} // namespace

llvm::ArrayRef<PrecisionPolicy> precisionPolicies() { return kTable; }

const PrecisionPolicy *lookupPrecisionPolicy(llvm::StringRef opName) {
  for (const PrecisionPolicy &p : kTable)
    if (p.op == opName)
      return &p;
  return nullptr;
}

llvm::StringRef precisionClassName(PrecisionClass c) {
  switch (c) {
  case C::Low: return "low";
  case C::Fp32: return "fp32";
  case C::Fp32Stats: return "fp32-stats";
  case C::Follow: return "follow";
  case C::Promote: return "promote";
  case C::Keep: return "keep";
  }
  return "?";
}

std::string lossScaleInitError(llvm::StringRef precision, double init) {
  double max = maxInitialLossScale(precision);
  if (!(init > max) || precision != "fp16")
    return "";
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "loss_scale init %.10g is too large for fp16: the gradients it scales are "
                "stored in float16 (largest 65504), and at this scale even a gradient of "
                "2^-14 (float16's smallest normal number) overflows, so the first steps "
                "are all skipped; use at most 65504 * 2^14 = %.0f (the default, 65536, "
                "is GradScaler's), or precision = bf16",
                init, max);
  return buf;
}

} // namespace kiln
