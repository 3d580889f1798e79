//===- Precision.cpp - The mixed-precision policy, read from the ops -------===//
#include "dialects/kiln/Precision.h"

#include "dialects/kiln/KilnOps.h"

#include "mlir/IR/MLIRContext.h"

#include <cstdio>

namespace kiln {

using C = PrecisionClass;

std::optional<PrecisionPolicy> lookupPrecisionPolicy(mlir::Operation *op) {
  if (auto p = llvm::dyn_cast<PrecisionOpInterface>(op))
    return p.getPrecisionPolicy();
  return std::nullopt;
}

std::vector<NamedPrecisionPolicy> precisionPolicies(mlir::MLIRContext *ctx) {
  std::vector<NamedPrecisionPolicy> out;
  for (mlir::RegisteredOperationName name : ctx->getRegisteredOperations())
    if (auto *p = name.getInterface<PrecisionOpInterface>())
      out.push_back({name.getStringRef().str(), p->getPrecisionPolicy()});
  return out;
}

llvm::StringRef precisionRuleName(PrecisionRule r) {
  switch (r) {
  case PrecisionRule::None: return "";
  case PrecisionRule::Gemm: return "gemm-low";
  case PrecisionRule::Elementwise: return "elementwise-low";
  case PrecisionRule::Activation: return "activation-low";
  case PrecisionRule::ExpLogPow: return "exp-log-pow-fp32";
  case PrecisionRule::Reduction: return "reduction-fp32";
  case PrecisionRule::Accumulate: return "accumulate-fp32";
  case PrecisionRule::Softmax: return "softmax-fp32-stats";
  case PrecisionRule::Attention: return "attention-fp32-stats";
  case PrecisionRule::LayerNorm: return "layer-norm-fp32-stats";
  case PrecisionRule::LogSoftmax: return "log-softmax-fp32";
  case PrecisionRule::Loss: return "loss-fp32";
  case PrecisionRule::UserCast: return "user-cast";
  case PrecisionRule::AutocastLow: return "autocast-lower-precision";
  case PrecisionRule::AutocastFp32: return "autocast-fp32";
  }
  return "";
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
