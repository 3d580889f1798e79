//===- CheckpointTest.cpp - safetensors checkpoints -----------------------===//
#include "runtime/core/Checkpoint.h"

#include <fmt/format.h>
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
  EXPECT_EQ(c->metadata.count("kiln.file_crc32"), 0u); // consumed by the check
  EXPECT_EQ(c->verified, ckpt::Checkpoint::Verified::File);
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

TEST(Checkpoint, EveryByteFlipIsDetected) {
  // The CRC covers the whole file: the header (names, shapes, offsets, the
  // step and other metadata, even the JSON padding) as well as the data.
  std::string p = tempPath("flip-src.safetensors");
  ASSERT_TRUE(ckpt::write(p, sample()));
  std::string raw = readAll(p);
  std::string q = tempPath("flip.safetensors");
  std::mt19937 rng(7);
  for (size_t pos = 0; pos < raw.size(); ++pos) {
    std::string bad = raw;
    bad[pos] = char(bad[pos] ^ (1 + rng() % 255));
    std::ofstream(q, std::ios::binary) << bad;
    EXPECT_FALSE(ckpt::read(q)) << "a flip at byte " << pos << " was accepted";
  }
  auto c = ckpt::read(p);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->verified, ckpt::Checkpoint::Verified::File);
}

namespace {
/// A safetensors image of `json` (padded) and `data`.
std::string image(std::string json, const std::string &data) {
  while (json.size() % 8)
    json += ' ';
  std::string out(8, '\0');
  for (int k = 0; k < 8; ++k)
    out[k] = char((uint64_t(json.size()) >> (8 * k)) & 0xff);
  return out + json + data;
}
} // namespace

TEST(Checkpoint, OlderAndForeignFilesLoad) {
  std::string data(8, '\0');
  std::string q = tempPath("older.safetensors");
  // An older Kiln's checkpoint: the CRC-32 of the data only.
  std::string crc = fmt::format("{:08x}", ckpt::crc32(data.data(), data.size()));
  std::ofstream(q, std::ios::binary)
      << image(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"step":"3","kiln.crc32":")" +
                   crc + R"("}})",
               data);
  auto older = ckpt::read(q);
  ASSERT_TRUE(older) << older.status().message();
  EXPECT_EQ(older->verified, ckpt::Checkpoint::Verified::Data);
  EXPECT_EQ(older->metadata.at("step"), "3");
  // Another tool's file: no CRC, no Kiln metadata.
  std::ofstream(q, std::ios::binary)
      << image(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"step":"3"}})",
               data);
  auto foreign = ckpt::read(q);
  ASSERT_TRUE(foreign) << foreign.status().message();
  EXPECT_EQ(foreign->verified, ckpt::Checkpoint::Verified::None);
  // Kiln's metadata without a CRC entry (its key damaged): refused.
  std::ofstream(q, std::ios::binary)
      << image(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"kiln.format":"kiln-checkpoint-1","kiln.fhle_crc32":"00000000"}})",
               data);
  auto damaged = ckpt::read(q);
  ASSERT_FALSE(damaged);
  EXPECT_NE(damaged.status().message().find("its metadata has 'kiln.fhle_crc32', one byte from "
                                            "Kiln's CRC-32 entry 'kiln.file_crc32', and no "
                                            "CRC-32 entry"),
            std::string::npos)
      << damaged.status().message();
  // A byte turned into a backslash: two bytes become one escaped character.
  std::ofstream(q, std::ios::binary)
      << image(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"kiln.file_\rc32":"00000000"}})",
               data);
  EXPECT_FALSE(ckpt::read(q));
  // Another tool's keys that merely look alike (kiln.format, a crc of its
  // own) load, unverified.
  std::ofstream(q, std::ios::binary)
      << image(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"kiln.format":"kiln-checkpoint-1","source_crc":"1234"}})",
               data);
  auto alike = ckpt::read(q);
  ASSERT_TRUE(alike) << alike.status().message();
  EXPECT_EQ(alike->verified, ckpt::Checkpoint::Verified::None);
}

TEST(Checkpoint, SwappedNamesAreDetected) {
  // Two tensors of one shape whose names trade places: the data is intact,
  // the header is not.
  ckpt::Checkpoint c;
  c.tensors.push_back({"a", "F32", {2}, std::string(8, '\1')});
  c.tensors.push_back({"b", "F32", {2}, std::string(8, '\2')});
  std::string p = tempPath("swap.safetensors");
  ASSERT_TRUE(ckpt::write(p, c));
  std::string raw = readAll(p);
  size_t a = raw.find("\"a\""), b = raw.find("\"b\"");
  ASSERT_NE(a, std::string::npos);
  ASSERT_NE(b, std::string::npos);
  std::swap(raw[a + 1], raw[b + 1]);
  std::ofstream(p, std::ios::binary) << raw;
  auto r = ckpt::read(p);
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().message().find("does not match its CRC-32"), std::string::npos)
      << r.status().message();
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
