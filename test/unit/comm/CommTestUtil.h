//===- CommTestUtil.h - Inputs and expected results for communicator tests
//-===//
//
// Seeded, never-zero inputs per rank, and the contract's results computed
// here in member order, independently of runtime/comm/Reduce.cpp:
// f16/bf16 accumulate in f32 and round once; a mean divides the sum by the
// group size; integer sums wrap.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_TEST_UNIT_COMM_COMMTESTUTIL_H
#define KILN_TEST_UNIT_COMM_COMMTESTUTIL_H

#include "runtime/comm/Communicator.h"
#include "runtime/core/Half.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

namespace kiln::comm::test {

using Bytes = std::vector<char>;

inline const ElementType kCommTypes[] = {ElementType::F32, ElementType::F64,
                                         ElementType::F16, ElementType::BF16,
                                         ElementType::I32, ElementType::I64};
inline const Reduction kReductions[] = {Reduction::Sum, Reduction::Mean,
                                        Reduction::Max, Reduction::Min};

/// `count` elements for (rank, salt): floats in +-[0.1, 10) with varied
/// exponents (so the order of a sum matters), integers in +-[1, 1000].
inline Bytes makeInput(ElementType t, int64_t count, int rank, int salt) {
  std::mt19937_64 rng(uint64_t(rank) * 7919 + uint64_t(salt) * 104729 +
                      uint64_t(t) + 1);
  std::uniform_real_distribution<double> mag(0.1, 10.0);
  std::uniform_int_distribution<int> ival(1, 1000), sign(0, 1), scale(0, 6);
  Bytes out(count * dtypeBytes(t));
  for (int64_t i = 0; i < count; ++i) {
    double v =
        mag(rng) * (sign(rng) ? -1 : 1) * std::ldexp(1.0, scale(rng) - 3);
    int64_t iv = ival(rng) * (sign(rng) ? -1 : 1);
    char *p = out.data() + i * dtypeBytes(t);
    switch (t) {
    case ElementType::F32: {
      float f = float(v);
      std::memcpy(p, &f, 4);
      break;
    }
    case ElementType::F64:
      std::memcpy(p, &v, 8);
      break;
    case ElementType::F16:
    case ElementType::BF16: {
      uint16_t h = floatToHalf(t, float(v));
      std::memcpy(p, &h, 2);
      break;
    }
    case ElementType::I32: {
      int32_t x = int32_t(iv);
      std::memcpy(p, &x, 4);
      break;
    }
    case ElementType::I64:
      std::memcpy(p, &iv, 8);
      break;
    case ElementType::I1:
      break;
    }
  }
  return out;
}

template <typename T> T load(const char *p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <typename T> void store(char *p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

template <typename Acc> Acc fold(Acc a, Acc b, Reduction r) {
  switch (r) {
  case Reduction::Sum:
  case Reduction::Mean:
    if constexpr (std::is_integral_v<Acc>)
      return Acc(std::make_unsigned_t<Acc>(a) + std::make_unsigned_t<Acc>(b));
    else
      return a + b;
  case Reduction::Max:
    return b > a ? b : a;
  case Reduction::Min:
    return b < a ? b : a;
  }
  return a;
}

/// Element e of the combination of `inputs` (member order) at byte offset
/// `offset` elements, for a group of `n`.
inline void expectElement(ElementType t, Reduction r,
                          const std::vector<const char *> &inputs, int64_t e,
                          int n, char *out) {
  int64_t es = dtypeBytes(t);
  auto run = [&](auto tag, auto toAcc, auto fromAcc) {
    using Acc = decltype(tag);
    Acc acc = toAcc(inputs[0] + e * es);
    for (size_t i = 1; i < inputs.size(); ++i)
      acc = fold<Acc>(acc, toAcc(inputs[i] + e * es), r);
    if (r == Reduction::Mean)
      acc = acc / Acc(n);
    fromAcc(out, acc);
  };
  switch (t) {
  case ElementType::F32:
    run(float(), load<float>, store<float>);
    break;
  case ElementType::F64:
    run(double(), load<double>, store<double>);
    break;
  case ElementType::I32:
    run(int32_t(), load<int32_t>, store<int32_t>);
    break;
  case ElementType::I64:
    run(int64_t(), load<int64_t>, store<int64_t>);
    break;
  case ElementType::F16:
  case ElementType::BF16:
    run(
        float(),
        [t](const char *p) { return halfToFloat(t, load<uint16_t>(p)); },
        [t](char *p, float f) { store<uint16_t>(p, floatToHalf(t, f)); });
    break;
  case ElementType::I1:
    break;
  }
}

/// The all_reduce of per-member inputs (member order).
inline Bytes expectAllReduce(ElementType t, Reduction r,
                             const std::vector<Bytes> &in, int64_t count) {
  Bytes out(count * dtypeBytes(t));
  std::vector<const char *> ptrs;
  for (const Bytes &b : in)
    ptrs.push_back(b.data());
  for (int64_t e = 0; e < count; ++e)
    expectElement(t, r, ptrs, e, int(in.size()),
                  out.data() + e * dtypeBytes(t));
  return out;
}

/// The pairwise-tree sum of `in` (f32 or f64), written recursively: each
/// level adds neighbours (0+1, 2+3, ...), an odd last one goes up as is.
template <typename T>
std::vector<T> treeSum(std::vector<std::vector<T>> level) {
  while (level.size() > 1) {
    std::vector<std::vector<T>> next;
    for (size_t i = 0; i + 1 < level.size(); i += 2) {
      std::vector<T> s(level[i].size());
      for (size_t e = 0; e < s.size(); ++e)
        s[e] = level[i][e] + level[i + 1][e];
      next.push_back(std::move(s));
    }
    if (level.size() % 2)
      next.push_back(level.back());
    level = std::move(next);
  }
  return level[0];
}

/// FNV-1a over bytes, to print and compare results across processes.
inline uint64_t fnv1a(const void *data, size_t n,
                      uint64_t h = 1469598103934665603ull) {
  const unsigned char *p = static_cast<const unsigned char *>(data);
  for (size_t i = 0; i < n; ++i)
    h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

} // namespace kiln::comm::test

#endif // KILN_TEST_UNIT_COMM_COMMTESTUTIL_H
