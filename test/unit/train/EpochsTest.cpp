//===- EpochsTest.cpp - Where a .npy source's epochs end ------------------===//
//
// 100 rows at a global batch of 16 (6 whole batches and 4 rows an epoch),
// read by NpySource in both LastBatch modes:
//   - drop: batch i reads epoch i / 6; an epoch's 6 batches are exactly the
//     first 96 positions of that epoch's order (the order wrap reads too),
//     so each row at most once per epoch and the last 4 not at all; 5
//     epochs are 30 steps;
//   - wrap: the rows are one stream across epochs (a batch may straddle
//     two); 5 epochs are ceil(500 / 16) = 32 steps;
//   - both: a function of (seed, i, replica, count): 2 replicas of 8 read
//     together what one device of 16 reads (each a contiguous block), and a
//     fresh source read from the middle (a resumed run) reads the same.
//
//===----------------------------------------------------------------------===//
#include "runtime/core/Data.h"
#include "runtime/train/DataSource.h"
#include "runtime/train/Model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <set>

using namespace kiln;
using namespace kiln::train;
using program::Buffer;
using program::DType;
using program::Role;

namespace {

constexpr int64_t kRows = 100;

/// A program whose @train_step reads one data input x: f32[rows, 2] (on a
/// dp mesh of `devices`).
Model modelOf(int64_t rows, int devices) {
  Model m;
  m.pkg.path = "epochs.kpack";
  program::Program &p = m.pkg.program;
  if (devices > 1)
    p.mesh.axes.push_back({"dp", devices});
  Buffer x;
  x.name = "x";
  x.role = Role::Input;
  x.dtype = DType::F32;
  x.shape = {rows, 2};
  x.bytes = x.numElements() * 4;
  p.buffers.push_back(x);
  program::Function f;
  f.name = "train_step";
  f.args = {0};
  p.functions = {f};
  return m;
}

/// DIR/x.npy: `rows` rows, row r = (r, -r): a batch says which rows it took.
std::string writeRows(int64_t rows) {
  std::string dir = testing::TempDir() + "kiln-epochs-" +
                    testing::UnitTest::GetInstance()->current_test_info()->name();
  std::string cmd = "rm -rf '" + dir + "' && mkdir -p '" + dir + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  data::NpyArray x;
  x.descr = "<f4";
  x.shape = {rows, 2};
  for (int64_t r = 0; r < rows; ++r) {
    x.f.push_back(double(r));
    x.f.push_back(-double(r));
  }
  EXPECT_TRUE(data::writeNpy(dir + "/x.npy", x));
  return dir;
}

/// The rows batch `i` of `s` took.
std::vector<int64_t> rowsOf(const DataSource &s, uint64_t i) {
  std::string b = s.batch(i).bytes.at(0);
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), b.size());
  std::vector<int64_t> out;
  for (size_t k = 0; k < v.size(); k += 2)
    out.push_back(int64_t(v[k]));
  return out;
}

std::unique_ptr<DataSource> open(const std::string &dir, const Model &m, LastBatch last,
                                 DataShard shard = {}, bool shuffle = true) {
  auto s = openData(dir, m, "train_step", 7, shuffle, "training", shard, 0, last);
  EXPECT_TRUE(s) << s.status().message();
  return s ? std::move(*s) : nullptr;
}

TEST(Epochs, StepsPerEpochAndEpochsInEachMode) {
  std::string dir = writeRows(kRows);
  Model m = modelOf(16, 1);
  auto drop = open(dir, m, LastBatch::Drop), wrap = open(dir, m, LastBatch::Wrap);
  ASSERT_TRUE(drop && wrap);
  EXPECT_EQ(drop->epochBatches(), 6);
  EXPECT_EQ(wrap->epochBatches(), 6);
  EXPECT_EQ(drop->epochSteps(5), 30);
  EXPECT_EQ(wrap->epochSteps(5), 32); // PyTorch's default (a batch of 4 too) takes 35
  EXPECT_EQ(wrap->epochSteps(4), 25); // 400 rows: 25 whole batches
  EXPECT_EQ(drop->epochsDone(5), 0);
  EXPECT_EQ(drop->epochsDone(6), 1);
  EXPECT_EQ(drop->epochsDone(30), 5);
  EXPECT_EQ(wrap->epochsDone(6), 0); // 96 rows read
  EXPECT_EQ(wrap->epochsDone(7), 1); // 112
  EXPECT_EQ(wrap->epochsDone(32), 5);
  EXPECT_EQ(drop->epochNote(), "6 steps per epoch at global batch 16, the last 4 rows of each "
                               "epoch's order not read (last_batch \"drop\")");
  EXPECT_EQ(wrap->epochNote(), "6.25 steps per epoch at global batch 16: a step may take the "
                               "last rows of one epoch and the first of the next "
                               "(last_batch \"wrap\")");
  // A batch that divides the rows: the modes agree.
  Model m20 = modelOf(20, 1);
  auto d20 = open(dir, m20, LastBatch::Drop), w20 = open(dir, m20, LastBatch::Wrap);
  ASSERT_TRUE(d20 && w20);
  EXPECT_EQ(d20->epochNote(), "5 steps per epoch at global batch 20");
  EXPECT_EQ(w20->epochNote(), "5 steps per epoch at global batch 20");
  EXPECT_EQ(d20->epochSteps(3), 15);
  EXPECT_EQ(w20->epochSteps(3), 15);
  for (uint64_t i = 0; i < 15; ++i)
    EXPECT_EQ(rowsOf(*d20, i), rowsOf(*w20, i)) << "batch " << i;
  EXPECT_EQ(parseLastBatch("drop"), LastBatch::Drop);
  EXPECT_EQ(parseLastBatch("wrap"), LastBatch::Wrap);
  EXPECT_FALSE(parseLastBatch("pad"));
}

TEST(Epochs, DropReadsTheFirstWholeBatchesOfEachEpochsOrder) {
  std::string dir = writeRows(kRows);
  Model m = modelOf(16, 1);
  auto drop = open(dir, m, LastBatch::Drop), wrap = open(dir, m, LastBatch::Wrap);
  ASSERT_TRUE(drop && wrap);
  // Each epoch's order, as wrap reads it: positions e * 100 .. e * 100 + 99
  // of its stream (33 batches cover 5 epochs).
  std::vector<int64_t> stream;
  for (uint64_t i = 0; i < 33; ++i)
    for (int64_t r : rowsOf(*wrap, i))
      stream.push_back(r);
  std::vector<int64_t> all(kRows);
  for (int64_t r = 0; r < kRows; ++r)
    all[size_t(r)] = r;
  std::vector<int64_t> previous;
  for (uint64_t e = 0; e < 5; ++e) {
    std::vector<int64_t> order(stream.begin() + long(e * kRows),
                               stream.begin() + long((e + 1) * kRows));
    std::vector<int64_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    ASSERT_EQ(sorted, all) << "wrap's epoch " << e << " is not a permutation";
    std::vector<int64_t> got;
    for (uint64_t i = e * 6; i < e * 6 + 6; ++i)
      for (int64_t r : rowsOf(*drop, i))
        got.push_back(r);
    // Exactly the order's first 96 rows, in its order: each row at most
    // once, the last 4 of the order not read this epoch.
    EXPECT_EQ(got, std::vector<int64_t>(order.begin(), order.begin() + 96)) << "epoch " << e;
    EXPECT_EQ(std::set<int64_t>(got.begin(), got.end()).size(), 96u) << "epoch " << e;
    EXPECT_NE(order, previous) << "epoch " << e << " repeats the last epoch's order";
    previous = order;
  }
  // Wrap's batch 6 straddles epochs 0 and 1; drop's batch 6 is epoch 1's start.
  std::vector<int64_t> b6 = rowsOf(*wrap, 6);
  EXPECT_EQ(std::vector<int64_t>(b6.begin(), b6.begin() + 4),
            std::vector<int64_t>(stream.begin() + 96, stream.begin() + 100));
  EXPECT_EQ(rowsOf(*drop, 6), std::vector<int64_t>(stream.begin() + 100, stream.begin() + 116));
  // In file order (--in-order): epoch e's batches are rows 0..95.
  auto ordered = open(dir, m, LastBatch::Drop, {}, /*shuffle=*/false);
  ASSERT_TRUE(ordered);
  for (uint64_t i : {0, 5, 6, 11, 29}) {
    std::vector<int64_t> want;
    for (int64_t r = 0; r < 16; ++r)
      want.push_back(int64_t(i % 6) * 16 + r);
    EXPECT_EQ(rowsOf(*ordered, i), want) << "batch " << i;
  }
}

TEST(Epochs, ReplicasAndResumeReadWhatOneDeviceReads) {
  std::string dir = writeRows(kRows);
  Model one = modelOf(16, 1), two = modelOf(8, 2);
  for (LastBatch last : {LastBatch::Drop, LastBatch::Wrap}) {
    auto whole = open(dir, one, last);
    auto r0 = open(dir, two, last, DataShard{0, 2}), r1 = open(dir, two, last, DataShard{1, 2});
    ASSERT_TRUE(whole && r0 && r1);
    EXPECT_EQ(r0->epochSteps(5), whole->epochSteps(5)) << lastBatchName(last);
    EXPECT_EQ(r0->epochNote(),
              last == LastBatch::Drop
                  ? "6 steps per epoch at global batch 16 (2 replicas x 8), the last 4 rows "
                    "of each epoch's order not read (last_batch \"drop\")"
                  : "6.25 steps per epoch at global batch 16 (2 replicas x 8): a step may "
                    "take the last rows of one epoch and the first of the next "
                    "(last_batch \"wrap\")");
    for (uint64_t i = 0; i < 32; ++i) {
      // Replica r: rows [8r, 8r + 8) of the global batch.
      std::vector<int64_t> g = rowsOf(*whole, i), a = rowsOf(*r0, i), b = rowsOf(*r1, i);
      ASSERT_EQ(a, std::vector<int64_t>(g.begin(), g.begin() + 8))
          << lastBatchName(last) << " batch " << i;
      ASSERT_EQ(b, std::vector<int64_t>(g.begin() + 8, g.end()))
          << lastBatchName(last) << " batch " << i;
    }
    // A resumed run: a fresh source read first at batch 17 (epoch 2 of drop).
    auto again = open(dir, two, last, DataShard{1, 2});
    ASSERT_TRUE(again);
    EXPECT_EQ(again->batch(17).bytes, r1->batch(17).bytes) << lastBatchName(last);
  }
}

} // namespace
