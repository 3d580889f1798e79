//===- Reduce.cpp - The communicators' one reduction kernel ---------------===//

#include "runtime/comm/Reduce.h"

#include "runtime/core/Half.h"

#include <algorithm>
#include <fmt/format.h>
#include <type_traits>
#include <vector>

namespace kiln::comm {

const char *reductionName(Reduction r) {
  switch (r) {
  case Reduction::Sum:
    return "sum";
  case Reduction::Mean:
    return "mean";
  case Reduction::Max:
    return "max";
  case Reduction::Min:
    return "min";
  }
  return "?";
}

std::string describeOp(const char *op, int64_t count, ElementType type,
                       const Reduction *r) {
  if (r)
    return fmt::format("{} ({}, {} x {})", op, reductionName(*r), count,
                       dtypeName(type));
  return fmt::format("{} ({} x {})", op, count, dtypeName(type));
}

Status checkReducible(ElementType type, const char *op) {
  if (type == ElementType::I1)
    return Status::error(
        fmt::format("{}: i1 (boolean) buffers cannot be combined; "
                    "communicate them as i32",
                    op));
  return Status::ok();
}

namespace {

// Elements per chunk: the accumulator stays in L1 (1024 x 8 bytes).
constexpr int64_t kChunk = 1024;

template <typename Acc> Acc combine(Acc a, Acc b, Reduction r) {
  switch (r) {
  case Reduction::Sum:
  case Reduction::Mean:
    if constexpr (std::is_integral_v<Acc>) {
      using U = std::make_unsigned_t<Acc>;
      return Acc(U(a) + U(b));
    } else {
      return a + b;
    }
  case Reduction::Max:
    return b > a ? b : a; // a NaN already in `a` stays
  case Reduction::Min:
    return b < a ? b : a;
  }
  return a;
}

// T: the stored type; Acc: the accumulation type; load/store convert.
template <typename T, typename Acc, typename Load, typename Store>
void reduceTyped(void *out, const void *const *inputs, int n, int64_t count,
                 Reduction r, int groupSize, bool tree, Load load,
                 Store store) {
  bool sum = r == Reduction::Sum || r == Reduction::Mean;
  tree = tree && sum && n > 2; // one or two members: both orders agree
  Acc acc[kChunk];
  std::vector<Acc> levels(tree ? size_t(n) * kChunk : 0);
  T *o = static_cast<T *>(out);
  for (int64_t base = 0; base < count; base += kChunk) {
    int64_t len = std::min(kChunk, count - base);
    if (tree) {
      // Row i of `levels` holds node i of the current level.
      for (int i = 0; i < n; ++i) {
        const T *xi = static_cast<const T *>(inputs[i]) + base;
        Acc *row = levels.data() + size_t(i) * kChunk;
        for (int64_t j = 0; j < len; ++j)
          row[j] = load(xi[j]);
      }
      for (int width = n; width > 1; width = (width + 1) / 2) {
        for (int i = 0; i < width / 2; ++i) {
          Acc *dst = levels.data() + size_t(i) * kChunk;
          const Acc *a = levels.data() + size_t(2 * i) * kChunk;
          const Acc *b = a + kChunk;
          for (int64_t j = 0; j < len; ++j)
            dst[j] = combine<Acc>(a[j], b[j], Reduction::Sum);
        }
        if (width % 2) // the odd last node goes up a level unchanged
          std::copy_n(levels.data() + size_t(width - 1) * kChunk, len,
                      levels.data() + size_t(width / 2) * kChunk);
      }
      std::copy_n(levels.data(), len, acc);
    } else {
      const T *x0 = static_cast<const T *>(inputs[0]) + base;
      for (int64_t j = 0; j < len; ++j)
        acc[j] = load(x0[j]);
      for (int i = 1; i < n; ++i) {
        const T *xi = static_cast<const T *>(inputs[i]) + base;
        if (sum) {
          for (int64_t j = 0; j < len; ++j)
            acc[j] = combine<Acc>(acc[j], load(xi[j]), Reduction::Sum);
        } else {
          for (int64_t j = 0; j < len; ++j)
            acc[j] = combine<Acc>(acc[j], load(xi[j]), r);
        }
      }
    }
    if (r == Reduction::Mean) {
      Acc d = Acc(groupSize);
      for (int64_t j = 0; j < len; ++j)
        acc[j] = acc[j] / d;
    }
    for (int64_t j = 0; j < len; ++j)
      o[base + j] = store(acc[j]);
  }
}

template <typename T>
void reducePlain(void *out, const void *const *in, int n, int64_t count,
                 Reduction r, int groupSize, bool tree) {
  reduceTyped<T, T>(
      out, in, n, count, r, groupSize, tree, [](T v) { return v; },
      [](T v) { return v; });
}

void reduceHalf(ElementType t, void *out, const void *const *in, int n,
                int64_t count, Reduction r, int groupSize, bool tree) {
  reduceTyped<uint16_t, float>(
      out, in, n, count, r, groupSize, tree,
      [t](uint16_t h) { return halfToFloat(t, h); },
      [t](float f) { return floatToHalf(t, f); });
}

} // namespace

Status reduceBlocks(void *out, const void *const *inputs, int numInputs,
                    int64_t count, ElementType type, Reduction r, int groupSize,
                    SumOrder order) {
  bool tree = order == SumOrder::Tree;
  if (numInputs < 1 || count < 0)
    return Status::internal(
        fmt::format("reduceBlocks: {} inputs, count {}", numInputs, count));
  if (count == 0)
    return Status::ok();
  switch (type) {
  case ElementType::F32:
    reducePlain<float>(out, inputs, numInputs, count, r, groupSize, tree);
    break;
  case ElementType::F64:
    reducePlain<double>(out, inputs, numInputs, count, r, groupSize, tree);
    break;
  case ElementType::I32:
    reducePlain<int32_t>(out, inputs, numInputs, count, r, groupSize, tree);
    break;
  case ElementType::I64:
    reducePlain<int64_t>(out, inputs, numInputs, count, r, groupSize, tree);
    break;
  case ElementType::F16:
  case ElementType::BF16:
    reduceHalf(type, out, inputs, numInputs, count, r, groupSize, tree);
    break;
  case ElementType::I1:
    return checkReducible(type, "reduce");
  }
  return Status::ok();
}

} // namespace kiln::comm
