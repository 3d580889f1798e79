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
  // A model file given where the artifact goes (`kiln-run train x.kiln`):
  // compile it first, with the command.
  auto model = Artifact::parse("// a comment\nmodel mlp(d = 4) {\n}\n", "dir/x.kiln");
  ASSERT_FALSE(model);
  EXPECT_NE(model.status().message().find(
                "'dir/x.kiln' is a model file, not a compiled artifact: compile it first "
                "with `kilnc dir/x.kiln -o dir/x.kpack`, then give dir/x.kpack"),
            std::string::npos)
      << model.status().message();
  // Shorter than the header, too (an empty model file, a one-line one).
  auto tiny = Artifact::parse("model m() {}", "m.txt");
  ASSERT_FALSE(tiny);
  EXPECT_NE(tiny.status().message().find("is a model file"), std::string::npos)
      << tiny.status().message();
  // A checkpoint: say where it goes.
  std::string ckpt(8, '\0');
  ckpt += "{\"__metadata__\":{\"kiln.format\":\"kiln-checkpoint-1\"}}";
  ckpt.resize(200, ' ');
  auto checkpoint = Artifact::parse(ckpt, "run.ckpt");
  ASSERT_FALSE(checkpoint);
  EXPECT_NE(checkpoint.status().message().find("is a checkpoint, not a compiled artifact"),
            std::string::npos)
      << checkpoint.status().message();
  // Another format: rewrite the version and fix the header CRC.
  auto withVersion = [&](uint32_t version) {
    std::string other = image;
    other[8] = char(version);
    uint32_t crc = ckptCrc(other);
    for (int k = 0; k < 4; ++k)
      other[60 + k] = char((crc >> (8 * k)) & 0xff);
    return other;
  };
  static_assert(kFormatVersion == 2, "update the version cases below");
  auto v = Artifact::parse(withVersion(3), "new.kpack");
  ASSERT_FALSE(v);
  EXPECT_NE(v.status().message().find("format version 3 but this Kiln reads version 2"),
            std::string::npos) << v.status().message();
  // An older one (plan v1: one arena, no mesh, queues or dependencies) is
  // refused with the model file to recompile, from its manifest.
  std::vector<Section> old = sample();
  old[0].bytes = R"({"format": "kiln-package", "source": {"path": "models/mlp.kiln"}})";
  std::string oldImage = *serialize(old);
  oldImage[8] = 1;
  uint32_t crc = ckptCrc(oldImage);
  for (int k = 0; k < 4; ++k)
    oldImage[60 + k] = char((crc >> (8 * k)) & 0xff);
  auto o = Artifact::parse(oldImage, "old.kpack");
  ASSERT_FALSE(o);
  EXPECT_NE(o.status().message().find("'old.kpack' has artifact format version 1 but this Kiln "
                                      "reads version 2"),
            std::string::npos) << o.status().message();
  EXPECT_NE(o.status().message().find("recompile models/mlp.kiln with this kilnc"),
            std::string::npos) << o.status().message();
  // Without a readable manifest it still says what to do.
  auto o2 = Artifact::parse(withVersion(1), "old2.kpack");
  ASSERT_FALSE(o2);
  EXPECT_NE(o2.status().message().find("recompile the model's .kiln file with this kilnc"),
            std::string::npos) << o2.status().message();
  EXPECT_FALSE(Artifact::parse(withVersion(0), "zero.kpack"));
}

TEST(Artifact, WriterRejectsBadSections) {
  EXPECT_FALSE(serialize({{SectionKind::Other, "", "x"}}));
  EXPECT_FALSE(serialize({{SectionKind::Other, std::string(40, 'n'), "x"}}));
  EXPECT_FALSE(serialize({{SectionKind::Other, "a", "x"}, {SectionKind::Other, "a", "y"}}));
}

} // namespace
