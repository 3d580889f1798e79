//===- DataTest.cpp - The data pipeline -----------------------------------===//
#include "runtime/core/Data.h"
#include "runtime/core/Random.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>
#include <thread>

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
  EXPECT_EQ(info->vocab.size(), unique.size()); // ASCII: one byte per character
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

TEST(Data, PrepareReadsUtf8Characters) {
  // Characters are code points: 'é' (2 bytes), '日' (3), '😀' (4) are one
  // token each, sorted by code point; CR is a character of its own.
  std::string d = tempDir();
  std::string text = "caf\xc3\xa9 \xe6\x97\xa5\xf0\x9f\x98\x80\r\n\"q\"\\";
  writeFile(d + "/u.txt", text);
  auto info = prepareCharDataset(d + "/u.txt", d + "/uo", 0.5);
  ASSERT_TRUE(info) << info.status().message();
  std::vector<std::string> want = {"\n", "\r", " ", "\"", "\\", "a", "c", "f", "q",
                                   "\xc3\xa9", "\xe6\x97\xa5", "\xf0\x9f\x98\x80"};
  EXPECT_EQ(info->vocab, want);
  EXPECT_EQ(info->trainTokens + info->valTokens, 13);
  auto vocab = readVocab(d + "/uo/vocab.json");
  ASSERT_TRUE(vocab) << vocab.status().message();
  EXPECT_EQ(*vocab, want);
  auto train = TokenFile::open(d + "/uo/train.bin", TokenFile::Width::U16, 4,
                               int64_t(vocab->size()));
  auto val = TokenFile::open(d + "/uo/val.bin", TokenFile::Width::U16, 4, int64_t(vocab->size()));
  ASSERT_TRUE(train && val);
  std::string decoded;
  for (int64_t i = 0; i < train->size(); ++i)
    decoded += (*vocab)[(*train)[i]];
  for (int64_t i = 0; i < val->size(); ++i)
    decoded += (*vocab)[(*val)[i]];
  EXPECT_EQ(decoded, text);
  // Not UTF-8 (a Latin-1 'é'): refused, naming the byte and its offset.
  writeFile(d + "/latin1.txt", "caf\xe9 au lait");
  auto bad = prepareCharDataset(d + "/latin1.txt", d + "/lo", 0.5);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.status().message().find("is not UTF-8 text: byte 0xe9 at offset 3"),
            std::string::npos)
      << bad.status().message();
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
  EXPECT_NE(shrt.status().message().find("holds 4 tokens but one window of the model needs 65"),
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
    for (uint64_t s = 5; s < 25; ++s) {
      auto b = p.next();
      ASSERT_TRUE(b) << b.status().message();
      EXPECT_EQ(*b, s * 10);
    }
  }
  EXPECT_GE(produced.load(), 20);
  EXPECT_LE(produced.load(), 23); // at most `depth` ahead of the consumer
}

// --- The input pipeline: workers, depth, errors, deadlines -------------------

/// A batch that is a pure function of the step, made slowly and unevenly so
/// that workers finish out of order.
std::vector<uint64_t> slowBatch(uint64_t step) {
  std::this_thread::sleep_for(std::chrono::microseconds(random::bits(3, 1, step) % 400));
  std::vector<uint64_t> b(16);
  for (size_t k = 0; k < b.size(); ++k)
    b[k] = random::bits(11, step, k);
  return b;
}

TEST(Data, PrefetcherBatchesDoNotDependOnWorkersOrDepth) {
  std::vector<std::vector<uint64_t>> want;
  for (uint64_t s = 3; s < 63; ++s)
    want.push_back(slowBatch(s));
  for (int workers : {1, 2, 4})
    for (size_t depth : {1, 3, 8}) {
      std::atomic<int> inFlight{0}, most{0};
      PrefetchOptions o;
      o.depth = depth;
      o.workers = workers;
      Prefetcher<std::vector<uint64_t>> p(
          [&](uint64_t s) {
            int now = ++inFlight;
            for (int m = most.load(); now > m && !most.compare_exchange_weak(m, now);)
              ;
            auto b = slowBatch(s);
            --inFlight;
            return b;
          },
          3, o);
      for (size_t i = 0; i < want.size(); ++i) {
        auto b = p.next();
        ASSERT_TRUE(b) << b.status().message();
        ASSERT_EQ(*b, want[i]) << workers << " workers, depth " << depth << ", batch " << i;
      }
      // Never more producers at once than workers, nor than the depth.
      EXPECT_LE(most.load(), std::min<int>(workers, int(depth)));
    }
}

TEST(Data, PrefetcherWorkerErrorSurfacesAtItsStep) {
  for (int workers : {1, 3}) {
    PrefetchOptions o;
    o.workers = workers;
    o.depth = 4;
    o.what = "shard-7.bin";
    Prefetcher<uint64_t> p(
        [](uint64_t s) -> uint64_t {
          if (s == 7)
            throw std::runtime_error("short read at byte 1234");
          return s;
        },
        0, o);
    for (uint64_t s = 0; s < 7; ++s) {
      auto b = p.next();
      ASSERT_TRUE(b) << b.status().message();
      EXPECT_EQ(*b, s);
    }
    auto bad = p.next();
    ASSERT_FALSE(bad);
    EXPECT_EQ(bad.status().message(),
              "cannot make batch 7 of shard-7.bin: short read at byte 1234");
    auto after = p.next(); // the run may stop here; the pipeline still works
    ASSERT_TRUE(after);
    EXPECT_EQ(*after, 8u);
  } // destroying it with workers blocked on the window does not hang
}

TEST(Data, PrefetcherWaitsEndAtTheDeadlineOrOnCancel) {
  std::atomic<bool> release{false}, cancel{false};
  auto stuck = [&](uint64_t s) {
    while (!release.load())
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return s;
  };
  {
    PrefetchOptions o;
    o.timeoutSeconds = 0.2;
    o.what = "slow.bin";
    Prefetcher<uint64_t> p(stuck, 0, o);
    auto b = p.next();
    ASSERT_FALSE(b);
    EXPECT_NE(b.status().message().find("batch 0 of slow.bin did not come within"),
              std::string::npos)
        << b.status().message();
    release = true; // the producer returns: the destructor can join
  }
  release = false;
  {
    PrefetchOptions o;
    o.cancel = &cancel;
    o.what = "slow.bin";
    Prefetcher<uint64_t> p(stuck, 0, o);
    std::thread canceller([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      cancel = true;
    });
    auto b = p.next();
    canceller.join();
    ASSERT_FALSE(b);
    EXPECT_NE(b.status().message().find("the run was cancelled"), std::string::npos)
        << b.status().message();
    release = true;
  }
}

TEST(Data, APrefetcherWithAStuckWorkerIsLeftBehindNotWaitedFor) {
  // The producer never returns while the Prefetcher lives: the destructor
  // gives up after shutdownSeconds and leaves the worker, which owns what it
  // touches (the flag here is shared, not the test's stack).
  auto release = std::make_shared<std::atomic<bool>>(false);
  auto finished = std::make_shared<std::atomic<bool>>(false);
  {
    PrefetchOptions o;
    o.timeoutSeconds = 0.1;
    o.shutdownSeconds = 0.1;
    Prefetcher<uint64_t> p(
        [release, finished](uint64_t s) {
          while (!release->load())
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
          *finished = true;
          return s;
        },
        0, o);
    EXPECT_FALSE(p.next());
  } // returns although the worker is still in the producer
  EXPECT_FALSE(finished->load());
  *release = true; // the left worker ends on its own
  for (int k = 0; k < 1000 && !finished->load(); ++k)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_TRUE(finished->load());
}

// --- Memory-mapped token files and shards ---------------------------------

/// The loader before mmap: the whole file read and decoded into a vector.
std::vector<uint32_t> decodeAll(const std::string &bytes, size_t w) {
  std::vector<uint32_t> v(bytes.size() / w);
  const unsigned char *p = reinterpret_cast<const unsigned char *>(bytes.data());
  for (size_t k = 0; k < v.size(); ++k)
    v[k] = w == 2 ? uint32_t(p[2 * k]) | uint32_t(p[2 * k + 1]) << 8
                  : uint32_t(p[4 * k]) | uint32_t(p[4 * k + 1]) << 8 |
                        uint32_t(p[4 * k + 2]) << 16 | uint32_t(p[4 * k + 3]) << 24;
  return v;
}

std::string randomTokens(size_t n, size_t w, uint32_t below, uint64_t seed) {
  std::string bytes;
  for (size_t k = 0; k < n; ++k) {
    uint32_t t = uint32_t(random::bits(seed, 2, k) % below);
    bytes.append(reinterpret_cast<const char *>(&t), w);
  }
  return bytes;
}

TEST(Data, MappedTokenFilesReadWhatTheOldLoaderRead) {
  std::string d = tempDir();
  for (size_t w : {2u, 4u}) {
    uint32_t below = w == 2 ? 60000u : 3000000u; // below + 7 still fits
    std::string bytes = randomTokens(5000, w, below, w);
    std::string path = d + (w == 2 ? "/t.bin" : "/t.u32");
    writeFile(path, bytes);
    auto width = w == 2 ? TokenFile::Width::U16 : TokenFile::Width::U32;
    EXPECT_EQ(tokenWidthOf(path), width);
    auto f = TokenFile::open(path, width, 32, below);
    ASSERT_TRUE(f) << f.status().message();
    std::vector<uint32_t> old = decodeAll(bytes, w);
    ASSERT_EQ(f->size(), int64_t(old.size()));
    for (size_t k = 0; k < old.size(); ++k)
      ASSERT_EQ((*f)[int64_t(k)], old[k]) << "token " << k;
    // The windows of the old sampler (the same draw over the decoded
    // vector), and one shard of TokenShards draws the same.
    std::vector<int32_t> x, y, sx, sy;
    f->sampleWindows(9, 5, 8, 32, x, y);
    for (int64_t b = 0; b < 8; ++b) {
      uint64_t start = random::bits(9, 0x6b696c6e, 5 * 8 + uint64_t(b)) % (old.size() - 32);
      for (int64_t t = 0; t < 32; ++t) {
        ASSERT_EQ(x[size_t(b * 32 + t)], int32_t(old[start + size_t(t)]));
        ASSERT_EQ(y[size_t(b * 32 + t)], int32_t(old[start + size_t(t) + 1]));
      }
    }
    auto one = TokenShards::open({path}, 32, below);
    ASSERT_TRUE(one) << one.status().message();
    for (uint64_t step : {0u, 1u, 77u}) {
      f->sampleWindows(9, step, 8, 32, x, y);
      one->sampleWindows(9, step, 8, 32, sx, sy);
      EXPECT_EQ(x, sx);
      EXPECT_EQ(y, sy);
    }
    // The vocabulary check still names the file, the position and the value.
    std::string bad = bytes;
    uint32_t big = below + 7;
    std::memcpy(&bad[w * 4321], &big, w);
    writeFile(path, bad);
    auto v = TokenFile::open(path, width, 32, below);
    ASSERT_FALSE(v);
    EXPECT_NE(v.status().message().find(
                  fmt::format("'{}': token {} at position 4321 is outside the model's "
                              "vocabulary of {}",
                              path, big, below)),
              std::string::npos)
        << v.status().message();
  }
}

TEST(Data, TokenShardsDrawWindowsAcrossShardsNeverAcrossTheirEnds) {
  std::string d = tempDir();
  // Shard k holds tokens 10000 k + position: a window's shard and its
  // contiguity can be read off its tokens.
  const int64_t sizes[] = {500, 1000, 2000}, context = 16;
  std::vector<std::string> paths;
  for (int k = 0; k < 3; ++k) {
    std::string bytes;
    for (int64_t i = 0; i < sizes[k]; ++i) {
      uint16_t t = uint16_t(10000 * k + i);
      bytes.append(reinterpret_cast<const char *>(&t), 2);
    }
    paths.push_back(d + fmt::format("/train-{}.bin", k));
    writeFile(paths.back(), bytes);
  }
  auto s = TokenShards::open(paths, context, 30000);
  ASSERT_TRUE(s) << s.status().message();
  EXPECT_EQ(s->tokens(), 3500);
  int64_t count[3] = {0, 0, 0}, windows = 0;
  std::vector<int32_t> x, y;
  for (uint64_t step = 0; step < 400; ++step) {
    s->sampleWindows(4, step, 8, context, x, y);
    for (int64_t b = 0; b < 8; ++b) {
      int32_t first = x[size_t(b * context)];
      int k = first / 10000;
      ++count[k];
      ++windows;
      for (int64_t t = 0; t < context; ++t) {
        ASSERT_EQ(x[size_t(b * context + t)], first + t) << "window crosses or skips";
        ASSERT_EQ(y[size_t(b * context + t)], first + t + 1);
      }
      ASSERT_LE(first % 10000 + context, sizes[k] - 1) << "window runs past its shard";
    }
  }
  // Shards in proportion to their windows (size - context): 3200 draws, so a
  // share's standard deviation is below 0.009; 0.04 is over 4 of them.
  for (int k = 0; k < 3; ++k)
    EXPECT_NEAR(double(count[k]) / double(windows),
                double(sizes[k] - context) / double(3500 - 3 * context), 0.04)
        << "shard " << k;
}

TEST(Data, TokenPathsExpandListsGlobsAndDirectories) {
  std::string d = tempDir();
  std::string tokens = randomTokens(100, 2, 50, 1);
  for (const char *name : {"b-1.bin", "b-0.bin", "b-2.bin", "c.u32"})
    writeFile(d + "/" + name, name[0] == 'c' ? randomTokens(100, 4, 50, 1) : tokens);
  auto list = expandTokenPaths(d + "/b-2.bin," + d + "/b-0.bin");
  ASSERT_TRUE(list) << list.status().message();
  EXPECT_EQ(*list, (std::vector<std::string>{d + "/b-2.bin", d + "/b-0.bin"}));
  auto glob = expandTokenPaths(d + "/b-*.bin");
  ASSERT_TRUE(glob) << glob.status().message();
  EXPECT_EQ(*glob, (std::vector<std::string>{d + "/b-0.bin", d + "/b-1.bin", d + "/b-2.bin"}));
  std::filesystem::create_directories(d + "/shards");
  writeFile(d + "/shards/x1.bin", tokens);
  writeFile(d + "/shards/x0.bin", tokens);
  writeFile(d + "/shards/notes.txt", "not a shard");
  auto dir = expandTokenPaths(d + "/shards");
  ASSERT_TRUE(dir) << dir.status().message();
  EXPECT_EQ(*dir, (std::vector<std::string>{d + "/shards/x0.bin", d + "/shards/x1.bin"}));

  auto empty = expandTokenPaths(d + "/train-*.bin");
  ASSERT_FALSE(empty);
  EXPECT_NE(empty.status().message().find("train-*.bin' matches no file"), std::string::npos)
      << empty.status().message();
  auto missing = expandTokenPaths(d + "/b-0.bin," + d + "/b-9.bin");
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.status().message().find("token file '" + d + "/b-9.bin' does not exist"),
            std::string::npos)
      << missing.status().message();
  std::filesystem::create_directories(d + "/none");
  auto none = expandTokenPaths(d + "/none");
  ASSERT_FALSE(none);
  EXPECT_NE(none.status().message().find("holds no token shards"), std::string::npos);
  auto mixed = TokenShards::open({d + "/b-0.bin", d + "/c.u32"}, 8, 0);
  ASSERT_FALSE(mixed);
  EXPECT_NE(mixed.status().message().find("token shards of mixed widths: '" + d +
                                          "/b-0.bin' holds uint16 tokens but '" + d +
                                          "/c.u32' uint32"),
            std::string::npos)
      << mixed.status().message();
  // A bad shard names itself.
  writeFile(d + "/b-1.bin", std::string(7, 'a'));
  auto odd = TokenShards::open(*glob, 8, 0);
  ASSERT_FALSE(odd);
  EXPECT_NE(odd.status().message().find("b-1.bin' has 7 bytes"), std::string::npos)
      << odd.status().message();
}

} // namespace
