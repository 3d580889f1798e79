//===- TensorBoardTest.cpp - TensorBoard's event file encodings -----------===//
//
// The expected bytes come from elsewhere: CRC-32C test vectors (RFC 3720
// B.4 and the "123456789" check value), and records and Events serialized
// by the tensorboard package's own RecordWriter and event_pb2 (Python):
//   RecordWriter(f).write(b"hello")
//   Event(wall_time=1700000000.5, file_version="brain.Event:2")
//   Event(wall_time=1700000000.5, step=300, summary=Summary(value=[
//         Summary.Value(tag="train/loss", simple_value=2.5)]))
// test/tools/tensorboard.test reads a whole file back with TensorBoard.
//
//===----------------------------------------------------------------------===//
#include "runtime/train/TensorBoard.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <unistd.h>

using namespace kiln::train;
namespace fs = std::filesystem;

namespace {

std::string hex(const std::string &bytes) {
  static const char *digits = "0123456789abcdef";
  std::string h;
  for (unsigned char c : bytes) {
    h.push_back(digits[c >> 4]);
    h.push_back(digits[c & 15]);
  }
  return h;
}

std::string readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

} // namespace

TEST(TensorBoard, Crc32cVectors) {
  EXPECT_EQ(tfrecord::crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(tfrecord::crc32c("", 0), 0u);
  unsigned char zeros[32] = {}, ones[32], inc[32];
  for (int i = 0; i < 32; ++i) {
    ones[i] = 0xFF;
    inc[i] = (unsigned char)i;
  }
  EXPECT_EQ(tfrecord::crc32c(zeros, 32), 0x8A9136AAu); // RFC 3720 B.4
  EXPECT_EQ(tfrecord::crc32c(ones, 32), 0x62A8AB43u);
  EXPECT_EQ(tfrecord::crc32c(inc, 32), 0x46DD794Eu);
}

TEST(TensorBoard, MaskedCrc) {
  EXPECT_EQ(tfrecord::masked(0), 0xa282ead8u);
  // tensorboard's masked_crc32c(b"123456789")
  EXPECT_EQ(tfrecord::masked(0xE3069283u), 0xc78ab0e5u);
}

TEST(TensorBoard, WireEncodings) {
  std::string s;
  tfrecord::putVarint(s, 0);
  tfrecord::putVarint(s, 1);
  tfrecord::putVarint(s, 127);
  tfrecord::putVarint(s, 128);
  tfrecord::putVarint(s, 300);
  EXPECT_EQ(hex(s), "00017f8001ac02");
  s.clear();
  tfrecord::putVarint(s, uint64_t(int64_t(-1))); // an int64 -1: ten bytes
  EXPECT_EQ(hex(s), "ffffffffffffffffff01");
  s.clear();
  tfrecord::putFixed32(s, 0x01020304u);
  tfrecord::putFixed64(s, 0x0102030405060708ull);
  EXPECT_EQ(hex(s), "040302010807060504030201");
}

TEST(TensorBoard, RecordFraming) {
  EXPECT_EQ(hex(tfrecord::record("hello")), "0500000000000000eab2043e68656c6c6fbb1f1c19");
}

TEST(TensorBoard, Events) {
  EXPECT_EQ(hex(tfrecord::versionEvent(1700000000.5)),
            "0900002040fc54d9411a0d627261696e2e4576656e743a32");
  EXPECT_EQ(hex(tfrecord::scalarEvent(1700000000.5, 300, "train/loss", 2.5f)),
            "0900002040fc54d94110ac022a130a110a0a747261696e2f6c6f73731500002040");
}

TEST(TensorBoard, WritesAFileOfWholeRecords) {
  fs::path dir = fs::temp_directory_path() / ("kiln-tb-test-" + std::to_string(getpid())) / "a";
  fs::remove_all(dir.parent_path());
  auto w = TensorBoardWriter::open(dir.string());
  ASSERT_TRUE(w) << w.status().message();
  std::string path = (*w)->path();
  EXPECT_EQ(fs::path(path).parent_path(), dir);
  EXPECT_NE(fs::path(path).filename().string().find("events.out.tfevents."), std::string::npos);
  ASSERT_TRUE((*w)->write(10, {{"train/loss", 2.5f}, {"train/lr", 1e-3f}}));
  ASSERT_TRUE((*w)->close());
  // A second writer in the same second gets a file of its own.
  auto w2 = TensorBoardWriter::open(dir.string());
  ASSERT_TRUE(w2) << w2.status().message();
  EXPECT_NE((*w2)->path(), path);
  std::string bytes = readFile(path);
  // Walk the records: lengths and both CRCs.
  size_t at = 0, records = 0;
  while (at < bytes.size()) {
    ASSERT_LE(at + 12, bytes.size());
    uint64_t len = 0;
    for (int i = 0; i < 8; ++i)
      len |= uint64_t((unsigned char)bytes[at + size_t(i)]) << (8 * i);
    auto u32 = [&](size_t p) {
      uint32_t v = 0;
      for (int i = 0; i < 4; ++i)
        v |= uint32_t((unsigned char)bytes[p + size_t(i)]) << (8 * i);
      return v;
    };
    EXPECT_EQ(u32(at + 8), tfrecord::masked(tfrecord::crc32c(bytes.data() + at, 8)));
    ASSERT_LE(at + 12 + len + 4, bytes.size());
    EXPECT_EQ(u32(at + 12 + len),
              tfrecord::masked(tfrecord::crc32c(bytes.data() + at + 12, size_t(len))));
    at += 12 + len + 4;
    ++records;
  }
  EXPECT_EQ(records, 3u); // the version, two scalars
  fs::remove_all(dir.parent_path());
}

TEST(TensorBoard, DirectoryErrorsNameTheDirectory) {
  fs::path base = fs::temp_directory_path() / ("kiln-tb-test-file-" + std::to_string(getpid()));
  { std::ofstream(base.string()) << "x"; }
  std::string dir = (base / "runs").string(); // under a regular file
  auto w = TensorBoardWriter::open(dir);
  ASSERT_FALSE(w);
  EXPECT_NE(w.status().message().find("cannot create the TensorBoard directory '" + dir + "'"),
            std::string::npos)
      << w.status().message();
  fs::remove(base);
}
