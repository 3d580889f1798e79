//===- Attention.h - Fused attention on the CPU -----------------*- C++ -*-===//
//
// The CPU's kernels for Step::Attention (runtime/core/Attention.h), in
// FlashAttention-2's scheme: no T x S tensor is stored.
//
//   forward   one job per (batch, head, block of 64 queries, 32 causal): per block of
//             keys, s = scale q kᵀ (a GEMM), the causal rule and the mask,
//             an online softmax (running maximum and sum, the accumulator
//             rescaled), dropout as kiln.dropout draws it, o += p v (a
//             GEMM); out = o / sum, lse = max + log(sum). Causal blocks
//             above the diagonal are skipped.
//   backward  one job per (batch, key/value head): for each query head of
//             its group and each query block, Δ = rowsum(grad ∘ out), and
//             per key block p = exp(s - lse), dp = grad vᵀ, ds = p (dp - Δ)
//             (dropped as the forward dropped), dv += pᵀ grad, dk += scale
//             dsᵀ q, dq += scale ds k (GEMMs). A job owns its key/value
//             gradients and its queries' gradients: no atomics, and the
//             bits do not depend on the number of threads.
//
// Products run on the single-threaded BLAS (runtime/cpu/Blas.h) in float32;
// bf16/f16 operands are widened to float32 per job, results rounded once.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CPU_ATTENTION_H
#define KILN_RUNTIME_CPU_ATTENTION_H

#include "runtime/core/Program.h"
#include "runtime/core/Status.h"
#include "runtime/cpu/Gemm.h"

namespace kiln::cpu {

/// The forward (a.backward false): `args` are the step's buffers' addresses
/// in step.args order, `seed` the seed buffer's value (0 without dropout).
Status attentionForward(const program::AttentionParams &a, const std::vector<void *> &args,
                        uint64_t seed, const RunParts &run);

/// The backward (a.backward true), as above.
Status attentionBackward(const program::AttentionParams &a, const std::vector<void *> &args,
                         uint64_t seed, const RunParts &run);

/// Query rows per block (a forward job's): 32 when causal, so that the
/// blocks on the diagonal compute fewer of the pairs the mask drops; 64
/// otherwise.
inline int64_t attentionQueryBlock(const program::AttentionParams &a) {
  return a.causal ? 32 : 64;
}

} // namespace kiln::cpu

#endif // KILN_RUNTIME_CPU_ATTENTION_H
