//===- DataTest.cpp - The data pipeline -----------------------------------===//
#include "runtime/core/Data.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <set>

using namespace kiln;
using namespace kiln::data;

namespace {

std::string tempDir() {
  std::string d = testing::TempDir() + "kiln-data-" +
                  testing::UnitTest::GetInstance()->current_test_info()->name();
  std::string cmd = "rm -rf '" + d + "' && mkdir -p '" + d + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  return d;
}

void writeFile(const std::string &path, const std::string &bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

TEST(Data, PrepareCharDatasetRoundTrips) {
  std::string d = tempDir();
  std::string text = "hello world\nthe quick \"brown\" fox\\\n";
  writeFile(d + "/in.txt", text);
  auto info = prepareCharDataset(d + "/in.txt", d + "/out", 0.25);
  ASSERT_TRUE(info) << info.status().message();
  std::set<char> unique(text.begin(), text.end());
  EXPECT_EQ(info->vocab.size(), unique.size());
  EXPECT_TRUE(std::is_sorted(info->vocab.begin(), info->vocab.end()));
  EXPECT_EQ(info->trainTokens + info->valTokens, int64_t(text.size()));
  EXPECT_EQ(info->trainTokens, int64_t(text.size() * 0.75));
  auto vocab = readVocab(d + "/out/vocab.json");
  ASSERT_TRUE(vocab) << vocab.status().message();
  EXPECT_EQ(*vocab, info->vocab);
  auto train = TokenFile::open(d + "/out/train.bin", TokenFile::Width::U16, 4,
                               int64_t(vocab->size()));
  ASSERT_TRUE(train) << train.status().message();
  std::string decoded;
  for (int64_t i = 0; i < train->size(); ++i)
    decoded += (*vocab)[(*train)[i]];
  EXPECT_EQ(decoded, text.substr(0, size_t(info->trainTokens)));
}

TEST(Data, WindowsAreShiftedAndDeterministic) {
  std::string d = tempDir();
  std::string bytes;
  for (int t = 0; t < 1000; ++t) { // token value = position (mod 65536)
    bytes.push_back(char(t & 0xff));
    bytes.push_back(char(t >> 8));
  }
  writeFile(d + "/t.bin", bytes);
  auto f = TokenFile::open(d + "/t.bin", TokenFile::Width::U16, 16, 0);
  ASSERT_TRUE(f);
  std::vector<int32_t> x, y, x2, y2;
  f->sampleWindows(7, 3, 4, 16, x, y);
  ASSERT_EQ(x.size(), 64u);
  for (int b = 0; b < 4; ++b)
    for (int t = 0; t < 16; ++t) {
      EXPECT_EQ(y[b * 16 + t], x[b * 16 + t] + 1);
      if (t) {
        EXPECT_EQ(x[b * 16 + t], x[b * 16 + t - 1] + 1); // contiguous window
      }
    }
  f->sampleWindows(7, 3, 4, 16, x2, y2);
  EXPECT_EQ(x, x2); // same (seed, step): same batch
  f->sampleWindows(7, 4, 4, 16, x2, y2);
  EXPECT_NE(x, x2); // next step: another batch
}

TEST(Data, BadTokenFilesNameTheFileAndTheProblem) {
  std::string d = tempDir();
  writeFile(d + "/odd.bin", std::string(7, 'a'));
  auto odd = TokenFile::open(d + "/odd.bin", TokenFile::Width::U16, 2, 0);
  ASSERT_FALSE(odd);
  EXPECT_NE(odd.status().message().find("odd.bin' has 7 bytes, not a multiple of 2"),
            std::string::npos) << odd.status().message();
  writeFile(d + "/short.bin", std::string(8, '\0'));
  auto shrt = TokenFile::open(d + "/short.bin", TokenFile::Width::U16, 64, 0);
  ASSERT_FALSE(shrt);
  EXPECT_NE(shrt.status().message().find("holds 4 tokens but one training window needs 65"),
            std::string::npos) << shrt.status().message();
  std::string big;
  for (int k = 0; k < 100; ++k)
    big += std::string("\x00\x01", 2); // token 256
  writeFile(d + "/vocab.bin", big);
  auto vocab = TokenFile::open(d + "/vocab.bin", TokenFile::Width::U16, 8, 65);
  ASSERT_FALSE(vocab);
  EXPECT_NE(vocab.status().message().find("token 256 at position 0 is outside the model's vocabulary of 65"),
            std::string::npos) << vocab.status().message();
  auto missing = TokenFile::open(d + "/nope.bin", TokenFile::Width::U16, 8, 0);
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.status().message().find("cannot open"), std::string::npos);
  EXPECT_EQ(missing.status().exitCode(), 1);
}

TEST(Data, NpyRoundTripAndValidation) {
  std::string d = tempDir();
  NpyArray a;
  a.descr = "<f4";
  a.shape = {3, 2};
  a.f = {1.5, -2, 3, 4.25, 0, 1e-3};
  ASSERT_TRUE(writeNpy(d + "/a.npy", a));
  auto b = readNpy(d + "/a.npy");
  ASSERT_TRUE(b) << b.status().message();
  EXPECT_EQ(b->shape, a.shape);
  for (size_t k = 0; k < a.f.size(); ++k)
    EXPECT_FLOAT_EQ(float(b->f[k]), float(a.f[k]));
  NpyArray labels;
  labels.descr = "<i8";
  labels.shape = {4};
  labels.i = {0, 9, 3, 7};
  ASSERT_TRUE(writeNpy(d + "/l.npy", labels));
  auto l = readNpy(d + "/l.npy");
  ASSERT_TRUE(l);
  EXPECT_EQ(l->i, labels.i);

  // Truncated data, bad magic, unsupported dtype, Fortran order.
  std::ifstream in(d + "/a.npy", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  writeFile(d + "/trunc.npy", bytes.substr(0, bytes.size() - 3));
  auto t = readNpy(d + "/trunc.npy");
  ASSERT_FALSE(t);
  EXPECT_NE(t.status().message().find("promises 24 bytes of data but the file has 21"),
            std::string::npos) << t.status().message();
  writeFile(d + "/magic.npy", "PK\x03\x04 not numpy at all");
  EXPECT_NE(readNpy(d + "/magic.npy").status().message().find("magic"), std::string::npos);
  std::string c = bytes;
  c.replace(c.find("<f4"), 3, ">c8");
  writeFile(d + "/dtype.npy", c);
  EXPECT_NE(readNpy(d + "/dtype.npy").status().message().find("dtype '>c8' is not supported"),
            std::string::npos);
  std::string huge = bytes;
  huge.replace(huge.find("(3,2)"), 5, "(4611686018427387904,4)");
  writeFile(d + "/huge.npy", huge);
  EXPECT_NE(readNpy(d + "/huge.npy").status().message().find("more than 2^48 elements"),
            std::string::npos) << readNpy(d + "/huge.npy").status().message();
  std::string fo = bytes;
  fo.replace(fo.find("False"), 5, "True ");
  writeFile(d + "/fortran.npy", fo);
  EXPECT_NE(readNpy(d + "/fortran.npy").status().message().find("Fortran"),
            std::string::npos);
}

TEST(Data, PrefetcherDeliversStepsInOrder) {
  std::atomic<int> produced{0};
  {
    Prefetcher<uint64_t> p([&](uint64_t step) { ++produced; return step * 10; }, 5, 3);
    for (uint64_t s = 5; s < 25; ++s)
      EXPECT_EQ(p.next(), s * 10);
  }
  EXPECT_GE(produced.load(), 20);
  EXPECT_LE(produced.load(), 24); // at most `depth` + 1 ahead
}

} // namespace
