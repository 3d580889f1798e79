//===- ArtifactTest.cpp - The .kpack container ----------------------------===//
#include "runtime/core/Artifact.h"
#include "runtime/core/Checkpoint.h"

#include <gtest/gtest.h>

#include <fstream>

using namespace kiln;
using namespace kiln::artifact;

namespace {

uint32_t ckptCrc(const std::string &image) { return ckpt::crc32(image.data(), 60); }

std::vector<Section> sample() {
  return {{SectionKind::Manifest, "manifest", R"({"model": "gpt", "version": 1})"},
          {SectionKind::Kernels, "kernels.cpu", std::string(300, '\x7f')},
          {SectionKind::Other, "empty", ""},
          {SectionKind::Provenance, "provenance", "k0 -> gpt.kiln:12"}};
}

TEST(Artifact, RoundTripThroughAFile) {
  std::string path = testing::TempDir() + "kiln-artifact.kpack";
  ASSERT_TRUE(write(path, sample()));
  auto a = Artifact::open(path);
  ASSERT_TRUE(a) << a.status().message();
  ASSERT_EQ(a->sections().size(), 4u);
  EXPECT_EQ(a->version(), kFormatVersion);
  EXPECT_EQ(a->find("kernels.cpu")->bytes, std::string(300, '\x7f'));
  EXPECT_EQ(a->find("kernels.cpu")->kind, SectionKind::Kernels);
  EXPECT_EQ(a->find("empty")->bytes, "");
  EXPECT_EQ(a->find("nope"), nullptr);
}

TEST(Artifact, EveryTruncationIsRejected) {
  std::string image = *serialize(sample());
  for (size_t n = 0; n < image.size(); ++n) {
    auto a = Artifact::parse(image.substr(0, n), "cut.kpack");
    ASSERT_FALSE(a) << "accepted a truncation to " << n << " bytes";
    EXPECT_NE(a.status().message().find("'cut.kpack'"), std::string::npos);
    EXPECT_EQ(a.status().exitCode(), 1);
  }
}

TEST(Artifact, EveryMeaningfulByteFlipIsRejected) {
  std::string image = *serialize(sample());
  int accepted = 0;
  for (size_t pos = 0; pos < image.size(); ++pos) {
    for (int bit = 0; bit < 8; bit += 3) {
      std::string bad = image;
      bad[pos] = char(bad[pos] ^ (1 << bit));
      auto a = Artifact::parse(bad, "flip.kpack");
      if (a) {
        // Only padding between sections is not covered by a CRC; then the
        // content must be unchanged.
        ++accepted;
        for (const Section &s : sample())
          ASSERT_EQ(a->find(s.name)->bytes, s.bytes) << "flip at " << pos;
      }
    }
  }
  // Everything but alignment padding is covered by a CRC.
  EXPECT_LT(accepted, int(image.size()));
}

TEST(Artifact, VersionAndMagicErrorsSayWhatToDo) {
  std::string image = *serialize(sample());
  auto notKiln = Artifact::parse("PK\x03\x04" + image.substr(4), "zip.kpack");
  ASSERT_FALSE(notKiln);
  EXPECT_NE(notKiln.status().message().find("does not start with KILNPACK"),
            std::string::npos);
  // A newer format: rewrite the version and fix the header CRC.
  std::string newer = image;
  newer[8] = 2;
  uint32_t crc = ckptCrc(newer);
  for (int k = 0; k < 4; ++k)
    newer[60 + k] = char((crc >> (8 * k)) & 0xff);
  auto v = Artifact::parse(newer, "new.kpack");
  ASSERT_FALSE(v);
  EXPECT_NE(v.status().message().find("format version 2 but this Kiln reads version 1"),
            std::string::npos) << v.status().message();
}

TEST(Artifact, WriterRejectsBadSections) {
  EXPECT_FALSE(serialize({{SectionKind::Other, "", "x"}}));
  EXPECT_FALSE(serialize({{SectionKind::Other, std::string(40, 'n'), "x"}}));
  EXPECT_FALSE(serialize({{SectionKind::Other, "a", "x"}, {SectionKind::Other, "a", "y"}}));
}

} // namespace
