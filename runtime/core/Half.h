//===- Half.h - float16 and bfloat16 to and from float32 --------*- C++ -*-===//
//
// The runtime's one conversion between the 16-bit float types and float32:
// widening is exact; narrowing rounds to nearest even (overflow to
// infinity, float16 subnormals kept, NaN stays NaN).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CORE_HALF_H
#define KILN_RUNTIME_CORE_HALF_H

#include "runtime/core/Program.h"

#include <cmath>
#include <cstdint>
#include <cstring>

namespace kiln {

/// `h` (DType::BF16 or DType::F16 bits) as float32, exactly.
inline float halfToFloat(program::DType t, uint16_t h) {
  uint32_t u;
  if (t == program::DType::BF16) {
    u = uint32_t(h) << 16;
  } else { // IEEE half
    uint32_t sign = uint32_t(h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 1023u;
    if (e == 31)
      u = sign | 0x7f800000u | (m << 13);
    else if (e != 0)
      u = sign | ((e + 112) << 23) | (m << 13);
    else if (m == 0)
      u = sign;
    else { // subnormal: normalise
      int shift = 0;
      while (!(m & 1024u)) {
        m <<= 1;
        ++shift;
      }
      u = sign | (uint32_t(113 - shift) << 23) | ((m & 1023u) << 13);
    }
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// `f` rounded to nearest even in DType::BF16 or DType::F16 (the bits).
inline uint16_t floatToHalf(program::DType t, float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (t == program::DType::BF16) {
    if ((u & 0x7fffffffu) > 0x7f800000u)
      return uint16_t((u >> 16) | 0x40u); // quiet NaN
    return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
  uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u)
    return uint16_t(sign | 0x7e00u);
  if (a >= 0x477ff000u) // rounds to >= 65520: infinity
    return uint16_t(sign | 0x7c00u);
  if (a < 0x38800000u) { // below 2^-14: a subnormal half (or zero)
    float mag;
    std::memcpy(&mag, &a, 4);
    // In units of 2^-24, rounded to nearest even by the FPU.
    return uint16_t(sign | uint32_t(std::nearbyint(double(mag) * 16777216.0)));
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u); // nearest even at 13 dropped bits
  return uint16_t(sign | ((r - (112u << 23)) >> 13));
}

/// f32 to TF32 (1 sign, 8 exponent, 10 mantissa bits, still stored as a
/// float): to nearest, ties away from zero, as PTX's cvt.rna.tf32.f32 for
/// tensor-core operands; infinities and NaNs are kept. A finite value near
/// FLT_MAX may round to infinity, as on the GPU.
inline float roundToTf32(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  if ((bits & 0x7f800000u) != 0x7f800000u) {
    bits += 0x1000u; // half a unit of the 13 dropped bits
    bits &= ~0x1fffu;
  }
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

} // namespace kiln

#endif // KILN_RUNTIME_CORE_HALF_H
