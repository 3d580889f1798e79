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

inline uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline uint64_t bits(uint64_t seed, uint64_t salt, uint64_t index) {
  return mix(mix(seed ^ mix(salt)) + index);
}

inline double uniform(uint64_t seed, uint64_t salt, uint64_t index) {
  return double(bits(seed, salt, index) >> 40) * (1.0 / 16777216.0);
}

inline double normal(uint64_t seed, uint64_t salt, uint64_t index) {
  double u1 = double((bits(seed, salt, 2 * index) >> 40) + 1) * (1.0 / 16777216.0);
  double u2 = uniform(seed, salt, 2 * index + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

} // namespace kiln::random

#endif // KILN_RUNTIME_CORE_RANDOM_H
