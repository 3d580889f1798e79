//===- Random.h - Kiln's counter-based random numbers -----------*- C++ -*-===//
//
// kiln.random and kiln.dropout are pure functions of (seed, salt, element
// index). Every backend and the reference interpreter use these functions, so
// a step replays bit for bit anywhere:
//
//   mix(x)          = splitmix64 finaliser of x + 0x9E3779B97F4A7C15
//   bits(s, t, i)   = mix(mix(s ^ mix(t)) + i)                (wrapping)
//   uniform(s,t,i)  = (bits >> 40) * 2^-24                    in [0, 1)
//   normal(s,t,i)   = sqrt(-2 ln u1) cos(2 pi u2),
//                     u1 = ((bits(s,t,2i) >> 40) + 1) * 2^-24 in (0, 1],
//                     u2 = uniform(s, t, 2i + 1)
//   dropout keeps element i iff uniform(s, t, i) >= rate, scaling by 1/(1-rate)
//
// No MLIR or LLVM here: the runtime includes it.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CORE_RANDOM_H
#define KILN_RUNTIME_CORE_RANDOM_H

#include <cmath>
#include <cstdint>

namespace kiln::random {

// The hash as data. The CPU lowering (passes/LowerToLinalg.cpp, arith ops)
// and the CUDA emitter (compiler/cuda/Emitter.cpp, the kiln_mix helper) build
// their forms from these constants; test/unit/compiler/RandomFormsTest.cpp
// runs both against the functions below.

/// mix(x): x += kMixIncrement; then per round x = (x ^ (x >> shift)) *
/// multiplier; then x ^ (x >> kMixFinalShift). All wrapping.
inline constexpr uint64_t kMixIncrement = 0x9E3779B97F4A7C15ull;
struct MixRound {
  unsigned shift;
  uint64_t multiplier;
};
inline constexpr MixRound kMixRounds[] = {{30, 0xBF58476D1CE4E5B9ull},
                                          {27, 0x94D049BB133111EBull}};
inline constexpr unsigned kMixFinalShift = 31;
/// Uniforms use the top 64 - kUnitShift = 24 bits, times kUnitScale = 2^-24.
inline constexpr unsigned kUnitShift = 40;
inline constexpr double kUnitScale = 1.0 / 16777216.0;
/// Box-Muller's 2 pi, as written in every form.
inline constexpr double kTwoPi = 6.283185307179586;

constexpr uint64_t mix(uint64_t x) {
  x += kMixIncrement;
  for (const MixRound &r : kMixRounds)
    x = (x ^ (x >> r.shift)) * r.multiplier;
  return x ^ (x >> kMixFinalShift);
}

constexpr uint64_t bits(uint64_t seed, uint64_t salt, uint64_t index) {
  return mix(mix(seed ^ mix(salt)) + index);
}

constexpr double uniform(uint64_t seed, uint64_t salt, uint64_t index) {
  return double(bits(seed, salt, index) >> kUnitShift) * kUnitScale;
}

inline double normal(uint64_t seed, uint64_t salt, uint64_t index) {
  double u1 = double((bits(seed, salt, 2 * index) >> kUnitShift) + 1) * kUnitScale;
  double u2 = uniform(seed, salt, 2 * index + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
}

// splitmix64's first output for state 0 (the increment is inside mix).
static_assert(mix(0) == 0xE220A8397B1DCDAFull);

} // namespace kiln::random

#endif // KILN_RUNTIME_CORE_RANDOM_H
