//===- CheckpointTest.cpp - safetensors checkpoints -----------------------===//
#include "runtime/core/Checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <random>

using namespace kiln;

namespace {

std::string tempPath(const std::string &name) {
  return testing::TempDir() + "kiln-ckpt-" + name;
}

ckpt::Checkpoint sample() {
  ckpt::Checkpoint c;
  ckpt::Tensor w{"h.0.mlp.fc.weight", "F32", {3, 4}, {}};
  for (int k = 0; k < 12; ++k) {
    float v = 0.25f * float(k) - 1.0f;
    w.bytes.append(reinterpret_cast<const char *>(&v), 4);
  }
  ckpt::Tensor step{"step", "I64", {}, std::string(8, '\0')};
  step.bytes[0] = 42;
  c.tensors = {w, step};
  c.metadata = {{"kiln.step", "42"}, {"kiln.data_seed", "1337"}};
  return c;
}

std::string readAll(const std::string &p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

TEST(Checkpoint, RoundTrip) {
  std::string p = tempPath("roundtrip.safetensors");
  ASSERT_TRUE(ckpt::write(p, sample()));
  auto c = ckpt::read(p);
  ASSERT_TRUE(c) << c.status().message();
  ASSERT_EQ(c->tensors.size(), 2u);
  const ckpt::Tensor *w = c->find("h.0.mlp.fc.weight");
  ASSERT_TRUE(w);
  EXPECT_EQ(w->shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(w->bytes, sample().tensors[0].bytes);
  EXPECT_EQ(c->metadata.at("kiln.step"), "42");
  EXPECT_EQ(c->metadata.count("kiln.crc32"), 0u); // consumed by the check
  // The header is standard safetensors: 8-byte length, then JSON.
  std::string raw = readAll(p);
  EXPECT_EQ(raw[8], '{');
}

TEST(Checkpoint, AtomicReplaceLeavesNoTemporaries) {
  std::string p = tempPath("atomic.safetensors");
  ASSERT_TRUE(ckpt::write(p, sample()));
  ckpt::Checkpoint c2 = sample();
  c2.metadata["kiln.step"] = "43";
  ASSERT_TRUE(ckpt::write(p, c2));
  EXPECT_EQ(ckpt::read(p)->metadata.at("kiln.step"), "43");
  std::string dir = testing::TempDir();
  std::string cmd = "ls '" + dir + "' | grep -c 'kiln-ckpt-atomic.safetensors.tmp' > /dev/null";
  EXPECT_NE(std::system(cmd.c_str()), 0) << "a temporary file was left behind";
}

TEST(Checkpoint, EveryTruncationIsAClearError) {
  std::string p = tempPath("full.safetensors");
  ASSERT_TRUE(ckpt::write(p, sample()));
  std::string raw = readAll(p);
  std::string q = tempPath("cut.safetensors");
  for (size_t n = 0; n < raw.size(); ++n) {
    std::ofstream(q, std::ios::binary) << raw.substr(0, n);
    auto c = ckpt::read(q);
    ASSERT_FALSE(c) << "truncation to " << n << " bytes was accepted";
    EXPECT_NE(c.status().message().find("cut.safetensors"), std::string::npos);
    EXPECT_EQ(c.status().exitCode(), 1);
  }
}

TEST(Checkpoint, EveryByteFlipIsDetectedOrHarmless) {
  std::string p = tempPath("flip-src.safetensors");
  ASSERT_TRUE(ckpt::write(p, sample()));
  std::string raw = readAll(p);
  std::string q = tempPath("flip.safetensors");
  std::mt19937 rng(7);
  int rejected = 0;
  for (size_t pos = 0; pos < raw.size(); ++pos) {
    std::string bad = raw;
    bad[pos] = char(bad[pos] ^ (1 + rng() % 255));
    std::ofstream(q, std::ios::binary) << bad;
    auto c = ckpt::read(q);
    if (!c) {
      ++rejected;
      continue;
    }
    // Accepted only if the flip hit JSON padding or whitespace and every
    // tensor and value is unchanged.
    ASSERT_EQ(c->tensors.size(), 2u) << "flip at " << pos;
    for (size_t k = 0; k < 2; ++k)
      EXPECT_EQ(c->tensors[k].bytes, sample().tensors[k].bytes) << "flip at " << pos;
  }
  EXPECT_GT(rejected, int(raw.size() * 9 / 10));
}

TEST(Checkpoint, WrongShapesAndOffsetsAreRejected) {
  std::string q = tempPath("handmade.safetensors");
  auto make = [&](const std::string &json, const std::string &data) {
    std::string h = json;
    uint64_t len = h.size();
    std::string out(8, '\0');
    for (int k = 0; k < 8; ++k)
      out[k] = char((len >> (8 * k)) & 0xff);
    std::ofstream(q, std::ios::binary) << out + h + data;
    return ckpt::read(q);
  };
  auto shape = make(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, 0));
  ASSERT_FALSE(shape);
  EXPECT_NE(shape.status().message().find("has 8 bytes but its shape needs 12"), std::string::npos);
  auto past = make(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", std::string(8, 0));
  ASSERT_FALSE(past);
  EXPECT_NE(past.status().message().find("truncated file?"), std::string::npos);
  auto dtype = make(R"({"w":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", std::string(1, 0));
  ASSERT_FALSE(dtype);
  EXPECT_NE(dtype.status().message().find("unknown dtype 'Q7'"), std::string::npos);
  auto overlap = make(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
                      std::string(6, 0));
  ASSERT_FALSE(overlap);
  EXPECT_NE(overlap.status().message().find("overlap"), std::string::npos);
  // A file another tool wrote (no CRC) loads.
  auto plain = make(R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", "ab");
  ASSERT_TRUE(plain) << plain.status().message();
  EXPECT_EQ(plain->tensors[0].bytes, "ab");
}

} // namespace
