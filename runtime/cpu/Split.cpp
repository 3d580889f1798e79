//===- Split.cpp - How many threads a step is worth -----------------------===//
#include "runtime/cpu/Split.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace kiln::cpu {

const SplitModel &splitModel() {
  static const SplitModel m = [] {
    SplitModel s;
    if (const char *us = std::getenv("KILN_SPLIT_MIN_US"))
      s.minNanosPerThread = std::max(0.0, std::atof(us)) * 1000;
    return s;
  }();
  return m;
}

double estimateNanos(const SplitModel &m, double flops, double bytes, bool gemm) {
  return flops / (gemm ? m.gemmFlopsPerNs : m.kernelFlopsPerNs) + bytes / m.bytesPerNs;
}

int splitThreads(const SplitModel &m, double nanos, int64_t pieces, int threads) {
  int64_t most = std::min<int64_t>(std::max(threads, 1), std::max<int64_t>(pieces, 1));
  if (most <= 1)
    return 1;
  if (m.minNanosPerThread <= 0)
    return int(most);
  double worth = std::floor(nanos / m.minNanosPerThread);
  return int(std::clamp<double>(worth, 1, double(most)));
}

} // namespace kiln::cpu
