//===- CommSequence.h - One fixed sequence of collectives, checked --------===//
//
// Every op, element type and reduction on seeded inputs, each result checked
// bitwise against CommTestUtil.h's member-order values, and hashed. Run by
// every rank of any communicator; the in-process and MPI runs of the same
// world size must print the same hashes (kiln-comm-mpi-test).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_TEST_UNIT_COMM_COMMSEQUENCE_H
#define KILN_TEST_UNIT_COMM_COMMSEQUENCE_H

#include "test/unit/comm/CommTestUtil.h"

#include <fmt/format.h>

namespace kiln::comm::test {

/// Runs the sequence on `c`; `hash` accumulates this rank's results. An
/// error names the first op whose result is wrong.
inline Status runSequence(Communicator &c, uint64_t &hash) {
  int n = c.size(), me = c.rank();
  auto check = [&](const char *op, ElementType t, const char *got,
                   const char *want, int64_t bytes) -> Status {
    hash = fnv1a(got, bytes, hash);
    if (std::memcmp(got, want, bytes) != 0)
      return Status::error(
          fmt::format("rank {}: {} {} differs from the member-order values", me,
                      op, dtypeName(t)));
    return Status::ok();
  };
  int salt = 0;
  for (ElementType t : kCommTypes) {
    int64_t es = dtypeBytes(t);
    for (Reduction r : kReductions) {
      ++salt;
      // A multiple of none of 2, 3, 4; every other one over 1 MiB, so the
      // MPI all_reduce's two ways (one exchange of whole buffers up to
      // 1 MiB, reduce-scatter + all-gather above) both run for every type.
      int64_t count = salt % 2 ? 1031 : (int64_t(1) << 20) / es + 1031;
      std::vector<Bytes> in(n);
      for (int k = 0; k < n; ++k)
        in[k] = makeInput(t, count, k, salt);
      Bytes want = expectAllReduce(t, r, in, count), out(count * es),
            buf = in[me];
      if (Status s = c.allReduce(in[me].data(), out.data(), count, t, r); !s)
        return s;
      if (Status s =
              check("all_reduce", t, out.data(), want.data(), count * es);
          !s)
        return s;
      if (Status s = c.allReduce(buf.data(), buf.data(), count, t, r); !s)
        return s;
      if (Status s = check("in-place all_reduce", t, buf.data(), want.data(),
                           count * es);
          !s)
        return s;
      // reduce_scatter, in place: this member's block of the send buffer.
      int64_t block = 257;
      for (int k = 0; k < n; ++k)
        in[k] = makeInput(t, n * block, k, 1000 + salt);
      want = expectAllReduce(t, r, in, n * block);
      buf = in[me];
      char *mine = buf.data() + me * block * es;
      if (Status s = c.reduceScatter(buf.data(), mine, block, t, r); !s)
        return s;
      if (Status s = check("reduce_scatter", t, mine,
                           want.data() + me * block * es, block * es);
          !s)
        return s;
    }
    int64_t block = 129;
    Bytes gathered(n * block * es), want;
    for (int k = 0; k < n; ++k) {
      Bytes x = makeInput(t, block, k, 2000 + int(t));
      want.insert(want.end(), x.begin(), x.end());
    }
    Bytes mineIn(want.begin() + me * block * es,
                 want.begin() + (me + 1) * block * es);
    if (Status s = c.allGather(mineIn.data(), gathered.data(), block, t); !s)
      return s;
    if (Status s =
            check("all_gather", t, gathered.data(), want.data(), want.size());
        !s)
      return s;
    Bytes b = makeInput(t, 77, me, 3000), root = makeInput(t, 77, n - 1, 3000);
    if (Status s = c.broadcast(b.data(), 77, t, n - 1); !s)
      return s;
    if (Status s = check("broadcast", t, b.data(), root.data(), root.size());
        !s)
      return s;
  }
  // A group in reverse rank order sums ((x_{n-1} + ...) + x_0).
  Group reversed;
  std::vector<Bytes> in(n), ordered;
  for (int k = n - 1; k >= 0; --k)
    reversed.push_back(k);
  for (int k = 0; k < n; ++k)
    in[k] = makeInput(ElementType::F32, 500, k, 4000);
  for (int k : reversed)
    ordered.push_back(in[k]);
  Bytes want = expectAllReduce(ElementType::F32, Reduction::Sum, ordered, 500),
        out(2000);
  if (Status s = c.allReduce(in[me].data(), out.data(), 500, ElementType::F32,
                             Reduction::Sum, reversed);
      !s)
    return s;
  if (Status s = check("reversed-group all_reduce", ElementType::F32,
                       out.data(), want.data(), 2000);
      !s)
    return s;
  // Pairs {0,1}, {2,3}, ...; an odd last rank stays out.
  if (me / 2 * 2 + 1 < n) {
    Group pair{me / 2 * 2, me / 2 * 2 + 1};
    want = expectAllReduce(ElementType::F64, Reduction::Max,
                           {in[pair[0]], in[pair[1]]}, 250);
    if (Status s = c.allReduce(in[me].data(), out.data(), 250, ElementType::F64,
                               Reduction::Max, pair);
        !s)
      return s;
    if (Status s = check("pair all_reduce", ElementType::F64, out.data(),
                         want.data(), 2000);
        !s)
      return s;
  }
  // The tree order (SumOrder::Tree), f64.
  {
    std::vector<std::vector<double>> x(n, std::vector<double>(300));
    for (int k = 0; k < n; ++k) {
      Bytes b = makeInput(ElementType::F64, 300, k, 4500);
      std::memcpy(x[k].data(), b.data(), b.size());
    }
    std::vector<double> treeWant = treeSum<double>(x), got(300);
    c.setSumOrder(SumOrder::Tree);
    Status s = c.allReduce(x[me].data(), got.data(), 300, ElementType::F64,
                           Reduction::Sum);
    c.setSumOrder(SumOrder::Members);
    if (!s)
      return s;
    if (Status s =
            check("tree-order all_reduce", ElementType::F64,
                  reinterpret_cast<const char *>(got.data()),
                  reinterpret_cast<const char *>(treeWant.data()), 300 * 8);
        !s)
      return s;
  }
  // Point to point: rank 0 to the last rank.
  Bytes msg = makeInput(ElementType::I64, 64, 0, 5000), got(512);
  if (me == 0)
    return c.send(msg.data(), 64, ElementType::I64, n - 1);
  if (me == n - 1) {
    if (Status s = c.recv(got.data(), 64, ElementType::I64, 0); !s)
      return s;
    return check("recv", ElementType::I64, got.data(), msg.data(), 512);
  }
  return Status::ok();
}

} // namespace kiln::comm::test

#endif // KILN_TEST_UNIT_COMM_COMMSEQUENCE_H
