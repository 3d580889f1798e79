//===- Attention.h - Reference semantics of fused attention ----*- C++ -*-===//
//
// kiln.attention and kiln.attention_grad in plain float64 loops, one query
// row at a time (docs/dialect.md states the semantics; the interpreter calls
// these, the CPU and CUDA kernels are checked against them).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_REFERENCE_ATTENTION_H
#define KILN_REFERENCE_ATTENTION_H

#include "reference/Interpreter.h"

namespace kiln::interp {

struct AttentionAttrs {
  double scale = 1.0;
  bool causal = false;
  double dropout = 0.0;
  uint64_t seed = 0, salt = 0;
};

/// out [B, H, T, Dv] and lse [B, H, T] (allocated by the caller with their
/// types) from q [B, H, T, D], k [B, Hk, S, D], v [B, Hk, S, Dv] and an
/// optional mask ([T, S] or [B|1, H|1, T, S]; i1 keeps, a float one adds).
void attentionForward(const Tensor &q, const Tensor &k, const Tensor &v, const Tensor *mask,
                      const AttentionAttrs &a, Tensor &out, Tensor &lse);

/// dq, dk, dv (allocated by the caller) from the forward's operands, its
/// result `o`, its `lse` and the result's gradient `g`.
void attentionBackward(const Tensor &q, const Tensor &k, const Tensor &v, const Tensor &o,
                       const Tensor &lse, const Tensor &g, const Tensor *mask,
                       const AttentionAttrs &a, Tensor &dq, Tensor &dk, Tensor &dv);

} // namespace kiln::interp

#endif // KILN_REFERENCE_ATTENTION_H
