//===- Attention.cpp - A fused attention step's parameters ----------------===//
#include "runtime/core/Attention.h"

#include "runtime/core/Program.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace kiln::program {

using json = nlohmann::ordered_json;

int AttentionParams::seedArg() const {
  if (!hasSeed())
    return -1;
  return (backward ? 6 : 3) + (mask != Mask::None ? 1 : 0);
}

int AttentionParams::firstOutput() const {
  return (backward ? 6 : 3) + (mask != Mask::None ? 1 : 0) + (hasSeed() ? 1 : 0);
}

std::string attentionLabel(const AttentionParams &a) {
  std::string kv = a.kvHeads != a.heads ? fmt::format(" kv{}", a.kvHeads) : "";
  return fmt::format("{} {}x{}x{}x{}x{}{}{}{}{}", a.backward ? "attention_grad" : "attention",
                     a.batch, a.heads, a.queries, a.keys, a.headSize, kv,
                     a.causal ? " causal" : "", a.mask != AttentionParams::Mask::None ? " mask" : "",
                     a.dropout > 0 ? " dropout" : "");
}

double attentionFlops(const AttentionParams &a) {
  double t = double(a.queries), s = double(a.keys);
  double pairs = double(a.batch) * double(a.heads) * (a.causal ? t * (t + 1) / 2 : t * s);
  double d = double(a.headSize), dv = double(a.valueSize);
  // forward: q kᵀ, p v; backward: q kᵀ, grad vᵀ, dv, dk, dq
  return pairs * 2.0 * (a.backward ? 3.0 * d + 2.0 * dv : d + dv);
}

namespace {
const char *maskName(AttentionParams::Mask m) {
  switch (m) {
  case AttentionParams::Mask::None: return "none";
  case AttentionParams::Mask::Keep: return "keep";
  case AttentionParams::Mask::Add: return "add";
  }
  return "none";
}
} // namespace

void attentionToJson(const AttentionParams &a, json &out) {
  out = {{"backward", a.backward}, {"batch", a.batch},       {"heads", a.heads},
         {"kv_heads", a.kvHeads},  {"queries", a.queries},   {"keys", a.keys},
         {"head_size", a.headSize}, {"value_size", a.valueSize},
         {"dtype", dtypeName(a.dtype)}, {"lse_dtype", dtypeName(a.lseType)},
         {"causal", a.causal},     {"scale", a.scale},       {"dropout", a.dropout},
         {"salt", a.salt},         {"mask", maskName(a.mask)}};
  if (a.mask != AttentionParams::Mask::None) {
    out["mask_batch"] = a.maskBatch;
    out["mask_heads"] = a.maskHeads;
  }
  if (a.seqMajor) // absent: every tensor [B, H, N, D]
    out["seq_major"] = a.seqMajor;
}

std::string attentionFromJson(const json &in, const std::vector<int> &args,
                              const std::vector<Buffer> &buffers, AttentionParams &a) {
  if (!in.is_object())
    return "an attention step has no \"attention\" object";
  constexpr int64_t kMax = int64_t(1) << 31;
  auto num = [&](const char *key, int64_t &v, int64_t lo) -> bool {
    if (!in.contains(key) || !in[key].is_number_integer())
      return false;
    v = in[key].get<int64_t>();
    return v >= lo && v < kMax;
  };
  auto flag = [&](const char *key, bool &v) {
    if (!in.contains(key) || !in[key].is_boolean())
      return false;
    v = in[key].get<bool>();
    return true;
  };
  auto real = [&](const char *key, double &v) {
    if (!in.contains(key) || !in[key].is_number())
      return false;
    v = in[key].get<double>();
    return std::isfinite(v);
  };
  int64_t salt = 0;
  if (!flag("backward", a.backward) || !num("batch", a.batch, 1) || !num("heads", a.heads, 1) ||
      !num("kv_heads", a.kvHeads, 1) || !num("queries", a.queries, 1) ||
      !num("keys", a.keys, 1) || !num("head_size", a.headSize, 1) ||
      !num("value_size", a.valueSize, 1) || !flag("causal", a.causal) ||
      !real("scale", a.scale) || !real("dropout", a.dropout) || !num("salt", salt, 0))
    return "an attention step's shape or attributes are missing or out of range";
  a.salt = uint64_t(salt);
  if (in.contains("seq_major")) {
    if (!in["seq_major"].is_number_unsigned() || in["seq_major"].get<uint64_t>() > 255)
      return "an attention step's seq_major is not a set of tensor bits (0 to 255)";
    a.seqMajor = uint32_t(in["seq_major"].get<uint64_t>());
  }
  std::string dt, lt, mk;
  if (!in.contains("dtype") || !in["dtype"].is_string() || !in.contains("lse_dtype") ||
      !in["lse_dtype"].is_string() || !in.contains("mask") || !in["mask"].is_string())
    return "an attention step has no dtype, lse_dtype or mask";
  if (!parseDType(in["dtype"].get<std::string>(), a.dtype) || !isFloat(a.dtype) ||
      !parseDType(in["lse_dtype"].get<std::string>(), a.lseType) || !isFloat(a.lseType))
    return "an attention step's dtype or lse_dtype is not a float type";
  mk = in["mask"].get<std::string>();
  a.mask = mk == "keep" ? AttentionParams::Mask::Keep
           : mk == "add" ? AttentionParams::Mask::Add
                         : AttentionParams::Mask::None;
  if (mk != "none" && a.mask == AttentionParams::Mask::None)
    return "an attention step's mask is not none, keep or add";
  if (a.mask != AttentionParams::Mask::None &&
      (!num("mask_batch", a.maskBatch, 1) || !num("mask_heads", a.maskHeads, 1) ||
       (a.maskBatch != 1 && a.maskBatch != a.batch) || (a.maskHeads != 1 && a.maskHeads != a.heads)))
    return "an attention step's mask_batch and mask_heads must be 1 or the batch and heads";
  if (a.heads % a.kvHeads != 0)
    return "an attention step's kv_heads do not divide its heads";
  if (a.causal && a.queries != a.keys)
    return "a causal attention step needs as many queries as keys";
  if (!(a.dropout >= 0 && a.dropout < 1))
    return "an attention step's dropout is not in [0, 1)";
  if (int(args.size()) != a.numArgs())
    return fmt::format("an attention step takes {} buffers, it passes {}", a.numArgs(),
                       args.size());
  // Each buffer's type and element count.
  int64_t B = a.batch, H = a.heads, Hk = a.kvHeads, T = a.queries, S = a.keys;
  auto check = [&](int pos, DType t, int64_t n, const char *what) -> std::string {
    const Buffer &b = buffers[size_t(args[size_t(pos)])];
    if (b.dtype != t || b.numElements() != n)
      return fmt::format("an attention step's {} buffer '{}' is {} x {}, it needs {} x {}", what,
                         b.name, dtypeName(b.dtype), b.numElements(), dtypeName(t), n);
    return "";
  };
  std::vector<std::tuple<int, DType, int64_t, const char *>> expect = {
      {0, a.dtype, B * H * T * a.headSize, "query"},
      {1, a.dtype, B * Hk * S * a.headSize, "key"},
      {2, a.dtype, B * Hk * S * a.valueSize, "value"}};
  int o = a.firstOutput();
  if (a.backward) {
    expect.push_back({3, a.dtype, B * H * T * a.valueSize, "out"});
    expect.push_back({4, a.lseType, B * H * T, "lse"});
    expect.push_back({5, a.dtype, B * H * T * a.valueSize, "grad"});
    expect.push_back({o, a.dtype, B * H * T * a.headSize, "query gradient"});
    expect.push_back({o + 1, a.dtype, B * Hk * S * a.headSize, "key gradient"});
    expect.push_back({o + 2, a.dtype, B * Hk * S * a.valueSize, "value gradient"});
  } else {
    expect.push_back({o, a.dtype, B * H * T * a.valueSize, "out"});
    expect.push_back({o + 1, a.lseType, B * H * T, "lse"});
  }
  if (a.mask != AttentionParams::Mask::None)
    expect.push_back({a.maskArg(), a.mask == AttentionParams::Mask::Keep ? DType::I1 : a.dtype,
                      a.maskBatch * a.maskHeads * T * S, "mask"});
  if (a.hasSeed())
    expect.push_back({a.seedArg(), DType::I64, 1, "seed"});
  for (auto &[pos, t, n, what] : expect)
    if (std::string e = check(pos, t, n, what); !e.empty())
      return e;
  return "";
}

} // namespace kiln::program
