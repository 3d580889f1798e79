//===- NcclTest.cpp - The NCCL communicator with a world of one -----------===//
//
// NCCL refuses two ranks on one GPU, so these tests use one rank: every
// collective is then a copy through NCCL's kernels, which still checks the
// wiring: element types, reductions (a mean of one is the value), in-place
// offsets, streams and events, groups and abort. They run where a CUDA
// device answers and skip, saying why, where none does.
//
//===----------------------------------------------------------------------===//

#include "runtime/comm/Nccl.h"
#include "runtime/comm/InProcess.h"
#include "test/unit/comm/CommTestUtil.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

using namespace kiln;
using namespace kiln::comm;
using namespace kiln::comm::test;

namespace {

/// Device memory holding `bytes`, freed at the end of the scope.
struct DeviceBuffer {
  explicit DeviceBuffer(size_t bytes) : bytes(bytes) {
    EXPECT_EQ(cudaMalloc(&ptr, bytes), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  // cudaMemcpy from pageable memory returns once the bytes are staged, not
  // written: the DMA may still run. The communicator's stream is
  // non-blocking (no implicit sync with the legacy stream), so without this
  // it could read a half-uploaded buffer (seen on the H200: f64 max).
  void upload(const Bytes &b) {
    ASSERT_EQ(cudaMemcpy(ptr, b.data(), b.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  Bytes download() const {
    Bytes b(bytes);
    EXPECT_EQ(cudaMemcpy(b.data(), ptr, bytes, cudaMemcpyDeviceToHost),
              cudaSuccess);
    return b;
  }
  char *at(size_t offset) { return static_cast<char *>(ptr) + offset; }
  void *ptr = nullptr;
  size_t bytes;
};

class Nccl : public ::testing::Test {
protected:
  void SetUp() override {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess)
      GTEST_SKIP() << "no CUDA device: " << cudaGetErrorName(e) << " ("
                   << cudaGetErrorString(e) << ")";
    if (n == 0)
      GTEST_SKIP() << "no CUDA device: cudaGetDeviceCount found none";
    auto comms = NcclCommunicator::createLocal({0});
    ASSERT_TRUE(comms.isOk()) << comms.status().message();
    comm = std::move((*comms)[0]);
    comm->setTimeout(60);
  }
  std::unique_ptr<NcclCommunicator> comm;
};

TEST(NcclHost, BadDeviceListsAreErrors) {
  auto dup = NcclCommunicator::createLocal({0, 0});
  ASSERT_FALSE(dup.isOk());
  EXPECT_NE(dup.status().message().find("Duplicate GPU"), std::string::npos)
      << dup.status().message();
  EXPECT_FALSE(NcclCommunicator::createLocal({}).isOk());
}

// One process per GPU: the unique id travels over a host communicator (MPI
// in a real run; a one-rank in-process world here).
TEST(NcclBootstrap, OneRankThroughAHostCommunicator) {
  auto host = makeInProcessCommunicators(1);
  host[0]->setTimeout(60);
  auto c = NcclCommunicator::createWithBootstrap(*host[0], 0);
  if (!c.isOk()) {
    const std::string &m = c.status().message();
    ASSERT_NE(m.find("no CUDA device"), std::string::npos) << m;
    GTEST_SKIP() << m;
  }
  EXPECT_EQ((*c)->rank(), 0);
  EXPECT_EQ((*c)->size(), 1);
  EXPECT_EQ((*c)->device(), 0);
  Bytes in = makeInput(ElementType::F16, 640, 0, 3);
  DeviceBuffer buf(in.size());
  buf.upload(in);
  ASSERT_TRUE(
      (*c)->allReduce(buf.ptr, buf.ptr, 640, ElementType::F16, Reduction::Mean)
          .isOk());
  EXPECT_EQ(buf.download(), in);
}

TEST_F(Nccl, OneRankEveryTypeAndReduction) {
  ASSERT_EQ(comm->size(), 1);
  ASSERT_EQ(comm->rank(), 0);
  int64_t count = 1000;
  for (ElementType t : kCommTypes)
    for (Reduction r : kReductions) {
      Bytes in = makeInput(t, count, 0, int(r));
      DeviceBuffer send(in.size()), recv(in.size());
      send.upload(in);
      ASSERT_TRUE(comm->allReduce(send.ptr, recv.ptr, count, t, r).isOk());
      // One member: the sum, mean, max and min of x alone are x, exactly.
      EXPECT_EQ(recv.download(), in) << dtypeName(t) << " " << reductionName(r);
    }
  DeviceBuffer b(4);
  Status s = comm->allReduce(b.ptr, b.ptr, 4, ElementType::I1, Reduction::Sum);
  EXPECT_FALSE(s.isOk());
}

TEST_F(Nccl, InPlaceAtOffsetsLeavesTheNeighboursAlone) {
  int64_t count = 333, es = 4, bytes = count * es;
  Bytes a = makeInput(ElementType::F32, 3 * count, 0, 1);
  DeviceBuffer buf(a.size());
  buf.upload(a);
  // The middle third, in place, by each op.
  ASSERT_TRUE(comm->allReduce(buf.at(bytes), buf.at(bytes), count,
                              ElementType::F32, Reduction::Mean)
                  .isOk());
  ASSERT_TRUE(comm->reduceScatter(buf.at(bytes), buf.at(bytes), count,
                                  ElementType::F32, Reduction::Sum)
                  .isOk());
  ASSERT_TRUE(
      comm->allGather(buf.at(bytes), buf.at(bytes), count, ElementType::F32)
          .isOk());
  ASSERT_TRUE(
      comm->broadcast(buf.at(bytes), count, ElementType::F32, 0).isOk());
  EXPECT_EQ(buf.download(), a);
  // Out of place into the last third.
  ASSERT_TRUE(
      comm->allGather(buf.at(0), buf.at(2 * bytes), count, ElementType::F32)
          .isOk());
  Bytes want = a;
  std::memcpy(want.data() + 2 * bytes, a.data(), bytes);
  EXPECT_EQ(buf.download(), want);
}

TEST_F(Nccl, StreamsEventsAndGroups) {
  cudaStream_t compute;
  ASSERT_EQ(cudaStreamCreate(&compute), cudaSuccess);
  ASSERT_TRUE(comm->setStreams(compute, nullptr).isOk());
  comm->setBlocking(false);
  ASSERT_TRUE(comm->prepareGroups({{0}}).isOk());
  Bytes in = makeInput(ElementType::BF16, 4096, 0, 2);
  DeviceBuffer send(in.size()), recv(in.size());
  // Upload on the compute stream: the collective must run after it.
  ASSERT_EQ(cudaMemcpyAsync(send.ptr, in.data(), in.size(),
                            cudaMemcpyHostToDevice, compute),
            cudaSuccess);
  ASSERT_TRUE(comm->allReduce(send.ptr, recv.ptr, 4096, ElementType::BF16,
                              Reduction::Sum, {0})
                  .isOk());
  ASSERT_TRUE(comm->computeWaits().isOk());
  Bytes out(in.size());
  ASSERT_EQ(cudaMemcpyAsync(out.data(), recv.ptr, out.size(),
                            cudaMemcpyDeviceToHost, compute),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
  ASSERT_TRUE(comm->synchronize().isOk());
  EXPECT_EQ(out, in);
  comm.reset();
  cudaStreamDestroy(compute);
}

TEST_F(Nccl, AbortFailsLaterCalls) {
  comm->setContext("step 4");
  comm->abort("loss is NaN");
  DeviceBuffer b(64);
  Status s =
      comm->allReduce(b.ptr, b.ptr, 16, ElementType::F32, Reduction::Sum);
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("rank 0 aborted: loss is NaN"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("step 4"), std::string::npos) << s.message();
}

} // namespace
