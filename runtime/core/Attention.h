//===- Attention.h - A fused attention step's parameters -------*- C++ -*-===//
//
// Step::Attention runs kiln.attention (forward) or kiln.attention_grad
// (backward) as one library-style call, as Step::Gemm runs a matmul: the
// backend's kernel (runtime/cpu/Attention.h on the CPU) reads q, k and v
// and never stores a T x S tensor. The buffers, in step.args:
//
//   forward:  q, k, v, [mask], [seed], out, lse
//   backward: q, k, v, out, lse, grad, [mask], [seed], dq, dk, dv
//
// with q [B, H, T, D], k [B, Hk, S, D], v [B, Hk, S, Dv], out and grad
// [B, H, T, Dv], lse [B, H, T] (docs/artifact.md "Attention steps").
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CORE_ATTENTION_H
#define KILN_RUNTIME_CORE_ATTENTION_H

#include "runtime/core/ElementType.h"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::program {

using DType = ElementType;
struct Buffer;

struct AttentionParams {
  bool backward = false;
  int64_t batch = 0, heads = 0, kvHeads = 0; ///< B, H, Hk (Hk divides H)
  int64_t queries = 0, keys = 0;             ///< T, S
  int64_t headSize = 0, valueSize = 0;       ///< D, Dv
  DType dtype = DType::F32;   ///< q, k, v, out, grad and the gradients
  DType lseType = DType::F32; ///< the log-sum-exp: f32 (f64 for f64 inputs)
  bool causal = false;
  double scale = 1.0;
  /// Dropout of the probabilities, as kiln.dropout with `salt` drops a
  /// [B, H, T, S] tensor; > 0 needs the seed buffer.
  double dropout = 0.0;
  uint64_t salt = 0;
  enum class Mask { None, Keep, Add };
  /// Keep: an i1 mask, true keeps; Add: a float mask (of dtype) added to
  /// the scaled scores. Its shape is [maskBatch, maskHeads, T, S], each of
  /// the two 1 (broadcast) or B, H.
  Mask mask = Mask::None;
  int64_t maskBatch = 1, maskHeads = 1;
  /// The tensors stored sequence-major, [B, N, H, D] rather than [B, H, N,
  /// D] (a head-split transpose folded into the step, as GEMM steps fold
  /// them): bits of Tensor. The row stride is then H * D.
  enum Tensor : uint32_t {
    kQuery = 1, kKey = 2, kValue = 4, kOut = 8, kGrad = 16,
    kQueryGrad = 32, kKeyGrad = 64, kValueGrad = 128,
  };
  uint32_t seqMajor = 0;

  bool hasSeed() const { return dropout > 0; }
  /// Positions in step.args (-1: absent).
  int maskArg() const { return mask == Mask::None ? -1 : backward ? 6 : 3; }
  int seedArg() const;
  int firstOutput() const; ///< out (forward) or dq (backward)
  int numArgs() const { return firstOutput() + (backward ? 3 : 2); }
};

/// "attention 12x4x64x64x32 causal" / "attention_grad ...": the name a
/// profile gives the step (B x H x T x S x D).
std::string attentionLabel(const AttentionParams &a);
/// Floating-point operations of one call (the products, 2 per multiply-add;
/// about half the pairs when causal).
double attentionFlops(const AttentionParams &a);

/// The step's "attention" object of the plan JSON.
void attentionToJson(const AttentionParams &a, nlohmann::ordered_json &out);
/// Reads it back and checks it against the step's buffers; the error ("" on
/// success) says what is wrong.
std::string attentionFromJson(const nlohmann::ordered_json &in, const std::vector<int> &args,
                              const std::vector<Buffer> &buffers, AttentionParams &a);

} // namespace kiln::program

#endif // KILN_RUNTIME_CORE_ATTENTION_H
