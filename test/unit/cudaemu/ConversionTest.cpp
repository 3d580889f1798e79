//===- ConversionTest.cpp - half / bfloat16 conversions, bit for bit ------===//
//
// The prelude's __float2half_rn, __half2float, __float2bfloat16_rn and
// __bfloat162float run inside emulated kernels and must give exact bits:
// hand-checked edge cases (ties to even, overflow, subnormals, NaN, inf,
// signed zero), every 16-bit pattern, every tie between neighbouring halves
// and the floats next to it, and random floats, against a reference that
// rounds in double arithmetic (written independently of the prelude).
//
//===----------------------------------------------------------------------===//
#include "test/unit/cudaemu/EmuTest.h"

#include <cmath>
#include <cstring>
#include <map>

namespace kiln::cuda::emu::test {
namespace {

float fromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
uint32_t toBits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

/// The value of a finite binary16 pattern, exactly.
double halfValue(uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -v : v;
}

/// Rounds `f` to `bits` significant bits with exponent floor `minExp` (the
/// format's smallest normal exponent), to nearest even, in double.
double roundToFormat(double f, int bits, int minExp) {
  int e = std::ilogb(f);
  double ulp = std::ldexp(1.0, std::max(e, minExp) - (bits - 1));
  return std::nearbyint(f / ulp) * ulp; // default rounding: nearest even
}

uint16_t refFloatToHalf(float f) {
  if (std::isnan(f))
    return 0x7fff;
  uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  double a = std::fabs(double(f));
  if (std::isinf(f) || a >= 65520.0)
    return sign | 0x7c00;
  if (a == 0)
    return sign;
  double r = roundToFormat(a, 11, -14);
  if (r == 0)
    return sign;
  static const std::map<double, uint16_t> codes = [] {
    std::map<double, uint16_t> m;
    for (uint32_t h = 0; h < 0x7c00; ++h)
      m[halfValue(uint16_t(h))] = uint16_t(h);
    return m;
  }();
  auto it = codes.find(r);
  EXPECT_NE(it, codes.end()) << f;
  return sign | (it == codes.end() ? 0 : it->second);
}

uint16_t refFloatToBf16(float f) {
  if (std::isnan(f))
    return 0x7fff;
  uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  double a = std::fabs(double(f));
  if (std::isinf(f) || a >= std::ldexp(2.0 - std::ldexp(1.0, -8), 127))
    return sign | 0x7f80;
  if (a == 0)
    return sign;
  double r = roundToFormat(a, 8, -126);
  return sign | uint16_t(toBits(float(r)) >> 16);
}

std::vector<uint16_t> runToHalf(const char *kernel,
                                const std::vector<float> &in) {
  std::vector<uint16_t> out(in.size(), 0x1234);
  int n = int(in.size());
  uint16_t *po = out.data();
  const float *pi = in.data();
  void *params[] = {&po, &pi, &n};
  Status s = kernels("convert").launch(kernel, {unsigned((n + 255) / 256)},
                                       {256}, 0, params);
  EXPECT_TRUE(s) << s.message();
  return out;
}

std::vector<float> runFromHalf(const char *kernel,
                               const std::vector<uint16_t> &in) {
  std::vector<float> out(in.size(), -1.0f);
  int n = int(in.size());
  float *po = out.data();
  const uint16_t *pi = in.data();
  void *params[] = {&po, &pi, &n};
  Status s = kernels("convert").launch(kernel, {unsigned((n + 255) / 256)},
                                       {256}, 0, params);
  EXPECT_TRUE(s) << s.message();
  return out;
}

/// Floats that stress a 16-bit format: every tie between neighbouring
/// values of the format (decode(h) and decode(h+1)), the floats either side
/// of each tie, and random floats of every exponent.
std::vector<float> stressInputs(double (*decode)(uint16_t), uint16_t limit,
                                uint32_t seed) {
  std::vector<float> v;
  for (uint32_t h = 0; h + 1 < limit; ++h) {
    float tie = float((decode(uint16_t(h)) + decode(uint16_t(h + 1))) / 2);
    for (float f :
         {tie, std::nextafter(tie, 0.0f), std::nextafter(tie, INFINITY),
          float(decode(uint16_t(h)))}) {
      v.push_back(f);
      v.push_back(-f);
    }
  }
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 50000; ++i)
    v.push_back(fromBits(bits(rng)));
  return v;
}

double bf16Value(uint16_t b) { return fromBits(uint32_t(b) << 16); }

TEST(CudaEmuConversions, FloatToHalfEdgeCases) {
  const std::pair<uint32_t, uint16_t> cases[] = {
      {0x3f800000, 0x3c00}, // 1
      {0xbf800000, 0xbc00}, // -1
      {0x00000000, 0x0000}, // +0
      {0x80000000, 0x8000}, // -0
      {0x477fe000, 0x7bff}, // 65504, the largest half
      {0x477fefff, 0x7bff}, // just below the tie with 65536
      {0x477ff000, 0x7c00}, // 65520: the tie rounds to even, i.e. to inf
      {0xc77ff000, 0xfc00}, // -65520
      {0x7f800000, 0x7c00}, // inf
      {0xff800000, 0xfc00}, // -inf
      {0x3f801000, 0x3c00}, // 1 + 2^-11: tie, rounds to even (down)
      {0x3f803000, 0x3c02}, // 1 + 3*2^-11: tie, rounds to even (up)
      {0x3f801001, 0x3c01}, // just above the tie
      {0x38800000, 0x0400}, // 2^-14, the smallest normal
      {0x387fe000, 0x0400}, // 1023.5 * 2^-24: tie between 0x3ff and 0x400
      {0x387fc000, 0x03ff}, // 1023 * 2^-24, the largest subnormal
      {0x387f8000, 0x03fe}, // 1022 * 2^-24
      {0x33800000, 0x0001}, // 2^-24, the smallest subnormal
      {0x33000000, 0x0000}, // 2^-25: tie between 0 and 2^-24 -> 0
      {0x33000001, 0x0001}, // just above that tie
      {0x33c00000, 0x0002}, // 1.5 * 2^-24: tie between 1 and 2 -> 2
      {0x33400000, 0x0001}, // 0.75 * 2^-24 -> 1
      {0x2edbe6ff, 0x0000}, // 1e-10
      {0xaedbe6ff, 0x8000}, // -1e-10
      {0x00000001, 0x0000}, // the smallest float subnormal
      {0x7fc00000, 0x7fff}, // quiet NaN -> canonical
      {0xffc00001, 0x7fff}, // negative NaN -> canonical
      {0x7f800001, 0x7fff}, // signalling NaN -> canonical
  };
  std::vector<float> in;
  for (auto [f, h] : cases)
    in.push_back(fromBits(f));
  std::vector<uint16_t> out = runToHalf("float_to_half", in);
  for (size_t i = 0; i < in.size(); ++i)
    EXPECT_EQ(out[i], cases[i].second)
        << std::hex << "float 0x" << cases[i].first << " gave 0x" << out[i];
}

TEST(CudaEmuConversions, FloatToHalfAgainstReference) {
  const uint32_t seed = freshSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::vector<float> in = stressInputs(halfValue, 0x7c00, seed);
  std::vector<uint16_t> out = runToHalf("float_to_half", in);
  int bad = 0;
  for (size_t i = 0; i < in.size() && bad < 10; ++i)
    if (out[i] != refFloatToHalf(in[i])) {
      ++bad;
      ADD_FAILURE() << std::hex << "float 0x" << toBits(in[i]) << " gave 0x"
                    << out[i] << ", expected 0x" << refFloatToHalf(in[i]);
    }
}

TEST(CudaEmuConversions, EveryHalfToFloat) {
  std::vector<uint16_t> in(65536);
  for (uint32_t h = 0; h < 65536; ++h)
    in[h] = uint16_t(h);
  std::vector<float> out = runFromHalf("half_to_float", in);
  for (uint32_t h = 0; h < 65536; ++h) {
    bool nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
    bool inf = (h & 0x7fff) == 0x7c00;
    if (nan)
      ASSERT_EQ(toBits(out[h]), 0x7fffffffu) << std::hex << h;
    else if (inf)
      ASSERT_EQ(out[h], (h & 0x8000) ? -INFINITY : INFINITY) << std::hex << h;
    else {
      ASSERT_EQ(double(out[h]), halfValue(uint16_t(h))) << std::hex << h;
      ASSERT_EQ(std::signbit(out[h]), bool(h & 0x8000)) << std::hex << h;
    }
  }
}

TEST(CudaEmuConversions, FloatToBfloat16EdgeCases) {
  const std::pair<uint32_t, uint16_t> cases[] = {
      {0x3f800000, 0x3f80}, // 1
      {0x80000000, 0x8000}, // -0
      {0x3f808000, 0x3f80}, // tie, rounds to even (down)
      {0x3f818000, 0x3f82}, // tie, rounds to even (up)
      {0x3f808001, 0x3f81}, // just above the tie
      {0x7f7f7fff, 0x7f7f}, // below the tie with inf
      {0x7f7f8000, 0x7f80}, // tie above the largest bfloat16 -> inf
      {0x7f7fffff, 0x7f80}, // FLT_MAX -> inf
      {0xff7fffff, 0xff80}, // -FLT_MAX -> -inf
      {0x7f800000, 0x7f80}, // inf
      {0xff800000, 0xff80}, // -inf
      {0x00000001, 0x0000}, // float subnormals round within bfloat16's
      {0x00008000, 0x0000}, // tie -> even (0)
      {0x00018000, 0x0002}, // tie -> even (2)
      {0x00008001, 0x0001},
      {0x807fffff, 0x8080}, // -largest float subnormal -> -2^-126
      {0x7fc00000, 0x7fff}, // NaN -> canonical
      {0xff800001, 0x7fff}, // negative signalling NaN -> canonical
  };
  std::vector<float> in;
  for (auto [f, b] : cases)
    in.push_back(fromBits(f));
  std::vector<uint16_t> out = runToHalf("float_to_bf16", in);
  for (size_t i = 0; i < in.size(); ++i)
    EXPECT_EQ(out[i], cases[i].second)
        << std::hex << "float 0x" << cases[i].first << " gave 0x" << out[i];
}

TEST(CudaEmuConversions, FloatToBfloat16AgainstReference) {
  const uint32_t seed = freshSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::vector<float> in = stressInputs(bf16Value, 0x7f80, seed);
  std::vector<uint16_t> out = runToHalf("float_to_bf16", in);
  int bad = 0;
  for (size_t i = 0; i < in.size() && bad < 10; ++i)
    if (out[i] != refFloatToBf16(in[i])) {
      ++bad;
      ADD_FAILURE() << std::hex << "float 0x" << toBits(in[i]) << " gave 0x"
                    << out[i] << ", expected 0x" << refFloatToBf16(in[i]);
    }
}

TEST(CudaEmuConversions, EveryBfloat16ToFloat) {
  std::vector<uint16_t> in(65536);
  for (uint32_t b = 0; b < 65536; ++b)
    in[b] = uint16_t(b);
  std::vector<float> out = runFromHalf("bf16_to_float", in);
  for (uint32_t b = 0; b < 65536; ++b) // exact, NaN payloads included
    ASSERT_EQ(toBits(out[b]), b << 16) << std::hex << b;
}

} // namespace
} // namespace kiln::cuda::emu::test
