//===- InProcessTest.cpp - The in-process communicator against the contract
//===//
//
// Every op and element type with 2, 3 and 4 ranks, bitwise against results
// computed here in member order (CommTestUtil.h); groups, in place, the
// deadline naming the missing rank, abort, mismatched calls.
//
//===----------------------------------------------------------------------===//

#include "runtime/comm/InProcess.h"
#include "test/unit/comm/CommTestUtil.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

using namespace kiln;
using namespace kiln::comm;
using namespace kiln::comm::test;

namespace {

/// Runs body(rank, comm) on one thread per rank; returns each rank's status.
std::vector<Status>
runRanks(std::vector<std::unique_ptr<Communicator>> &comms,
         const std::function<Status(int, Communicator &)> &body) {
  std::vector<Status> result(comms.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < comms.size(); ++r)
    threads.emplace_back([&, r] { result[r] = body(int(r), *comms[r]); });
  for (std::thread &t : threads)
    t.join();
  return result;
}

void expectAllOk(const std::vector<Status> &st) {
  for (size_t r = 0; r < st.size(); ++r)
    EXPECT_TRUE(st[r].isOk()) << "rank " << r << ": " << st[r].message();
}

double seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since)
      .count();
}

class InProcessRanks : public ::testing::TestWithParam<int> {};

TEST_P(InProcessRanks, AllReduceEveryTypeAndReductionBitwise) {
  int n = GetParam();
  auto comms = makeInProcessCommunicators(n);
  // Not a multiple of n, and over one chunk of the reduction kernel.
  int64_t count = 2053;
  for (ElementType t : kCommTypes)
    for (Reduction r : kReductions)
      for (bool inPlace : {false, true}) {
        std::vector<Bytes> in(n), out(n);
        for (int k = 0; k < n; ++k)
          in[k] = makeInput(t, count, k, int(r));
        Bytes want = expectAllReduce(t, r, in, count);
        std::vector<Bytes> buf = in;
        auto st = runRanks(comms, [&](int k, Communicator &c) {
          out[k].assign(count * dtypeBytes(t), 0);
          void *recv = inPlace ? buf[k].data() : out[k].data();
          return c.allReduce(buf[k].data(), recv, count, t, r);
        });
        expectAllOk(st);
        for (int k = 0; k < n; ++k)
          EXPECT_EQ(inPlace ? buf[k] : out[k], want)
              << dtypeName(t) << " " << reductionName(r)
              << (inPlace ? " in place" : "") << " rank " << k;
        if (!inPlace) {
          EXPECT_EQ(buf, in) << "the send buffers changed";
        }
      }
}

TEST_P(InProcessRanks, ReduceScatterEveryTypeBitwise) {
  int n = GetParam();
  auto comms = makeInProcessCommunicators(n);
  int64_t block = 517;
  for (ElementType t : kCommTypes)
    for (Reduction r : kReductions)
      for (bool inPlace : {false, true}) {
        int64_t es = dtypeBytes(t);
        std::vector<Bytes> in(n), out(n, Bytes(block * es));
        for (int k = 0; k < n; ++k)
          in[k] = makeInput(t, n * block, k, 10 + int(r));
        Bytes want = expectAllReduce(t, r, in, n * block);
        std::vector<Bytes> buf = in;
        auto st = runRanks(comms, [&](int k, Communicator &c) {
          void *recv = inPlace ? buf[k].data() + k * block * es : out[k].data();
          return c.reduceScatter(buf[k].data(), recv, block, t, r);
        });
        expectAllOk(st);
        for (int k = 0; k < n; ++k) {
          const char *got =
              inPlace ? buf[k].data() + k * block * es : out[k].data();
          EXPECT_EQ(0,
                    std::memcmp(got, want.data() + k * block * es, block * es))
              << dtypeName(t) << " " << reductionName(r)
              << (inPlace ? " in place" : "") << " rank " << k;
        }
      }
}

TEST_P(InProcessRanks, AllGatherAndBroadcast) {
  int n = GetParam();
  auto comms = makeInProcessCommunicators(n);
  int64_t block = 301;
  for (ElementType t : kCommTypes)
    for (bool inPlace : {false, true}) {
      int64_t es = dtypeBytes(t);
      std::vector<Bytes> in(n), out(n, Bytes(n * block * es, 0));
      Bytes want;
      for (int k = 0; k < n; ++k) {
        in[k] = makeInput(t, block, k, 20);
        want.insert(want.end(), in[k].begin(), in[k].end());
      }
      auto st = runRanks(comms, [&](int k, Communicator &c) {
        if (inPlace) {
          std::memcpy(out[k].data() + k * block * es, in[k].data(), block * es);
          return c.allGather(out[k].data() + k * block * es, out[k].data(),
                             block, t);
        }
        return c.allGather(in[k].data(), out[k].data(), block, t);
      });
      expectAllOk(st);
      for (int k = 0; k < n; ++k)
        EXPECT_EQ(out[k], want)
            << dtypeName(t) << (inPlace ? " in place" : "") << " rank " << k;
    }
  // Broadcast from the last member.
  std::vector<Bytes> buf(n);
  for (int k = 0; k < n; ++k)
    buf[k] = makeInput(ElementType::F32, 999, k, 30);
  Bytes want = buf[n - 1];
  expectAllOk(runRanks(comms, [&](int k, Communicator &c) {
    return c.broadcast(buf[k].data(), 999, ElementType::F32, n - 1);
  }));
  for (int k = 0; k < n; ++k)
    EXPECT_EQ(buf[k], want) << "rank " << k;
}

TEST_P(InProcessRanks, RepeatedCallsGiveTheSameBits) {
  int n = GetParam();
  auto comms = makeInProcessCommunicators(n);
  std::vector<Bytes> in(n);
  for (int k = 0; k < n; ++k)
    in[k] = makeInput(ElementType::F32, 10000, k, 40);
  std::vector<Bytes> first;
  for (int rep = 0; rep < 20; ++rep) {
    std::vector<Bytes> out(n, Bytes(in[0].size()));
    expectAllOk(runRanks(comms, [&](int k, Communicator &c) {
      return c.allReduce(in[k].data(), out[k].data(), 10000, ElementType::F32,
                         Reduction::Mean);
    }));
    if (rep == 0)
      first = out;
    ASSERT_EQ(out, first) << "repetition " << rep;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, InProcessRanks, ::testing::Values(2, 3, 4));

TEST(InProcess, GroupsRowsColumnsAndOrder) {
  // A 2x2 mesh: rows {0,1},{2,3}, then columns {0,2},{1,3}.
  auto comms = makeInProcessCommunicators(4);
  int64_t count = 777;
  std::vector<Bytes> in(4);
  for (int k = 0; k < 4; ++k)
    in[k] = makeInput(ElementType::F32, count, k, 50);
  for (bool rows : {true, false}) {
    std::vector<Bytes> out(4, Bytes(count * 4));
    auto groupOf = [&](int k) {
      return rows ? Group{k / 2 * 2, k / 2 * 2 + 1} : Group{k % 2, k % 2 + 2};
    };
    expectAllOk(runRanks(comms, [&](int k, Communicator &c) {
      return c.allReduce(in[k].data(), out[k].data(), count, ElementType::F32,
                         Reduction::Sum, groupOf(k));
    }));
    for (int k = 0; k < 4; ++k) {
      Group g = groupOf(k);
      Bytes want = expectAllReduce(ElementType::F32, Reduction::Sum,
                                   {in[g[0]], in[g[1]]}, count);
      EXPECT_EQ(out[k], want) << (rows ? "row" : "column") << " rank " << k;
    }
  }
  // Group order is member order: {2, 0, 1} sums ((x2 + x0) + x1); rank 3
  // stays out.
  Group g{2, 0, 1};
  std::vector<Bytes> out(4, Bytes(count * 4));
  expectAllOk(runRanks(comms, [&](int k, Communicator &c) {
    if (k == 3)
      return Status::ok();
    return c.allReduce(in[k].data(), out[k].data(), count, ElementType::F32,
                       Reduction::Sum, g);
  }));
  Bytes want = expectAllReduce(ElementType::F32, Reduction::Sum,
                               {in[2], in[0], in[1]}, count);
  Bytes rankOrder = expectAllReduce(ElementType::F32, Reduction::Sum,
                                    {in[0], in[1], in[2]}, count);
  EXPECT_NE(want, rankOrder) << "the inputs do not tell the two orders apart";
  for (int k = 0; k < 3; ++k)
    EXPECT_EQ(out[k], want) << "rank " << k;
  // Member 0 of the group is rank 2: reduce_scatter gives it block 0.
  std::vector<Bytes> rs(4, Bytes(2 * 4));
  std::vector<Bytes> rsIn(4);
  for (int k = 0; k < 4; ++k)
    rsIn[k] = makeInput(ElementType::F32, 6, k, 51);
  expectAllOk(runRanks(comms, [&](int k, Communicator &c) {
    if (k == 3)
      return Status::ok();
    return c.reduceScatter(rsIn[k].data(), rs[k].data(), 2, ElementType::F32,
                           Reduction::Sum, g);
  }));
  Bytes rsWant = expectAllReduce(ElementType::F32, Reduction::Sum,
                                 {rsIn[2], rsIn[0], rsIn[1]}, 6);
  EXPECT_EQ(0, std::memcmp(rs[2].data(), rsWant.data(), 8));
  EXPECT_EQ(0, std::memcmp(rs[0].data(), rsWant.data() + 8, 8));
  EXPECT_EQ(0, std::memcmp(rs[1].data(), rsWant.data() + 16, 8));
}

// The stretch mode: with SumOrder::Tree, devices that hold the tree sums of
// their contiguous share of 8 fixed chunks get the same bits whether there
// are 1, 2, 4 or 8 of them.
template <typename T> void treeAcrossDeviceCounts(ElementType t) {
  int64_t count = 3001;
  int chunks = 8;
  std::vector<std::vector<T>> chunk(chunks, std::vector<T>(count));
  for (int c = 0; c < chunks; ++c) {
    Bytes b = makeInput(t, count, c, 80);
    std::memcpy(chunk[c].data(), b.data(), b.size());
  }
  std::vector<T> want = treeSum<T>(chunk);
  for (int n : {1, 2, 4, 8}) {
    auto comms = makeInProcessCommunicators(n);
    std::vector<std::vector<T>> out(n, std::vector<T>(count));
    expectAllOk(runRanks(comms, [&](int d, Communicator &c) {
      std::vector<std::vector<T>> mine(chunk.begin() + d * chunks / n,
                                       chunk.begin() + (d + 1) * chunks / n);
      std::vector<T> partial = treeSum<T>(mine);
      c.setSumOrder(SumOrder::Tree);
      return c.allReduce(partial.data(), out[d].data(), count, t,
                         Reduction::Sum);
    }));
    for (int d = 0; d < n; ++d)
      EXPECT_EQ(0, std::memcmp(out[d].data(), want.data(), count * sizeof(T)))
          << dtypeName(t) << ": " << n << " devices, device " << d;
  }
  // Member order on 8 devices differs, so the comparison above can fail.
  auto comms = makeInProcessCommunicators(8);
  std::vector<std::vector<T>> out(8, std::vector<T>(count));
  expectAllOk(runRanks(comms, [&](int d, Communicator &c) {
    return c.allReduce(chunk[d].data(), out[d].data(), count, t,
                       Reduction::Sum);
  }));
  EXPECT_NE(0, std::memcmp(out[0].data(), want.data(), count * sizeof(T)));
}

TEST(InProcess, TreeOrderGivesTheSameBitsForAnyPowerOfTwoDeviceCount) {
  treeAcrossDeviceCounts<float>(ElementType::F32);
  treeAcrossDeviceCounts<double>(ElementType::F64);
}

TEST(InProcess, TreeOrderWithAnOddGroupAndMismatchedOrders) {
  // 3 members: (x0 + x1) + x2, which here is also the member order; 5:
  // ((x0 + x1) + (x2 + x3)) + x4, which is not.
  for (int n : {3, 5}) {
    auto comms = makeInProcessCommunicators(n);
    std::vector<std::vector<float>> in(n, std::vector<float>(500));
    for (int k = 0; k < n; ++k) {
      Bytes b = makeInput(ElementType::F32, 500, k, 81);
      std::memcpy(in[k].data(), b.data(), b.size());
    }
    std::vector<float> want = treeSum<float>(in);
    std::vector<std::vector<float>> out(n, std::vector<float>(500));
    expectAllOk(runRanks(comms, [&](int k, Communicator &c) {
      c.setSumOrder(SumOrder::Tree);
      return c.allReduce(in[k].data(), out[k].data(), 500, ElementType::F32,
                         Reduction::Sum);
    }));
    for (int k = 0; k < n; ++k)
      EXPECT_EQ(out[k], want) << n << " members, rank " << k;
  }
  auto comms = makeInProcessCommunicators(2);
  auto st = runRanks(comms, [&](int k, Communicator &c) {
    c.setTimeout(10);
    if (k == 1)
      c.setSumOrder(SumOrder::Tree);
    std::vector<float> x(8, 1.0f);
    return c.allReduce(x.data(), x.data(), 8, ElementType::F32, Reduction::Sum);
  });
  for (int k = 0; k < 2; ++k) {
    ASSERT_FALSE(st[k].isOk());
    EXPECT_NE(st[k].message().find("tree order"), std::string::npos)
        << st[k].message();
  }
}

TEST(InProcess, SendRecv) {
  auto comms = makeInProcessCommunicators(3);
  Bytes msg = makeInput(ElementType::I64, 100, 1, 60), got(800);
  expectAllOk(runRanks(comms, [&](int k, Communicator &c) {
    if (k == 1)
      return c.send(msg.data(), 100, ElementType::I64, 2);
    if (k == 2)
      return c.recv(got.data(), 100, ElementType::I64, 1);
    return Status::ok();
  }));
  EXPECT_EQ(got, msg);
}

TEST(InProcess, TimeoutNamesTheMissingRankOpAndContext) {
  auto comms = makeInProcessCommunicators(3);
  std::vector<float> a(64, 1.5f), b(64);
  auto start = std::chrono::steady_clock::now();
  auto st = runRanks(comms, [&](int k, Communicator &c) {
    if (k == 2)
      return Status::ok(); // rank 2 never calls
    c.setTimeout(0.5);
    c.setContext("step 7, bucket 2");
    std::vector<float> mine = a, out(64);
    return c.allReduce(mine.data(), out.data(), 64, ElementType::F32,
                       Reduction::Mean);
  });
  double took = seconds(start);
  // The deadline is 0.5 s; 3 s leaves room for a loaded 2-core machine.
  EXPECT_LT(took, 3.0);
  EXPECT_GE(took, 0.45);
  for (int k = 0; k < 2; ++k) {
    ASSERT_FALSE(st[k].isOk()) << "rank " << k;
    const std::string &m = st[k].message();
    EXPECT_NE(m.find("all_reduce (mean, 64 x f32)"), std::string::npos) << m;
    EXPECT_NE(m.find("step 7, bucket 2"), std::string::npos) << m;
    EXPECT_NE(m.find("rank(s) 2 did not arrive"), std::string::npos) << m;
  }
  // The world is aborted: rank 2's late call fails at once.
  comms[2]->setTimeout(30);
  start = std::chrono::steady_clock::now();
  Status late = comms[2]->allReduce(a.data(), b.data(), 64, ElementType::F32,
                                    Reduction::Mean);
  EXPECT_FALSE(late.isOk());
  EXPECT_LT(seconds(start), 1.0);
  EXPECT_NE(late.message().find("aborted"), std::string::npos)
      << late.message();
  EXPECT_NE(late.message().find("did not arrive"), std::string::npos)
      << late.message();
}

TEST(InProcess, AbortWakesEveryWaiter) {
  auto comms = makeInProcessCommunicators(3);
  auto start = std::chrono::steady_clock::now();
  auto st = runRanks(comms, [&](int k, Communicator &c) {
    c.setTimeout(60);
    if (k == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      c.abort("loss is NaN at step 3");
      return Status::ok();
    }
    std::vector<double> x(10, 2.0);
    return c.allReduce(x.data(), x.data(), 10, ElementType::F64,
                       Reduction::Sum);
  });
  EXPECT_LT(seconds(start), 5.0); // far below the 60 s deadline
  for (int k = 0; k < 2; ++k) {
    ASSERT_FALSE(st[k].isOk());
    EXPECT_NE(st[k].message().find("rank 2 aborted: loss is NaN at step 3"),
              std::string::npos)
        << st[k].message();
  }
  // Later calls fail too, at once.
  std::vector<float> y(4, 1.0f);
  EXPECT_FALSE(comms[0]->broadcast(y.data(), 4, ElementType::F32, 0).isOk());
}

TEST(InProcess, MismatchedCallsAreAnError) {
  auto comms = makeInProcessCommunicators(2);
  auto st = runRanks(comms, [&](int k, Communicator &c) {
    c.setTimeout(10);
    std::vector<float> x(16, 1.0f);
    return c.allReduce(x.data(), x.data(), 10 + k, ElementType::F32,
                       Reduction::Sum);
  });
  for (int k = 0; k < 2; ++k) {
    ASSERT_FALSE(st[k].isOk());
    EXPECT_NE(st[k].message().find("disagree"), std::string::npos)
        << st[k].message();
  }
}

TEST(InProcess, BadArgumentsAreErrors) {
  auto comms = makeInProcessCommunicators(2);
  std::vector<char> x(4);
  EXPECT_FALSE(
      comms[0]
          ->allReduce(x.data(), x.data(), 4, ElementType::I1, Reduction::Sum)
          .isOk());
  Status s = comms[0]->allReduce(x.data(), x.data(), 1, ElementType::F32,
                                 Reduction::Sum, {1});
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("does not contain this rank"), std::string::npos)
      << s.message();
  EXPECT_FALSE(comms[0]->send(x.data(), 1, ElementType::F32, 0).isOk());
}

TEST(InProcess, OneRankIsACopy) {
  auto comms = makeInProcessCommunicators(1);
  Bytes in = makeInput(ElementType::BF16, 33, 0, 70), out(66);
  ASSERT_TRUE(comms[0]
                  ->allReduce(in.data(), out.data(), 33, ElementType::BF16,
                              Reduction::Mean)
                  .isOk());
  EXPECT_EQ(out, in);
}

} // namespace
