//===- ConcurrentGemmTest.cpp - GEMMs from several threads at once ---------===//
//
// Inter-op threads run independent GEMM steps at once, each splitting its
// parts over whatever threads it gets. The results must not depend on that:
// every part is one call of single-threaded BLAS (blas() pins OpenBLAS to
// one thread, MKL to its sequential layer), so a product computed while
// three others run on other threads, with its parts on any threads, has
// the bits of the same product computed alone.
//
//===----------------------------------------------------------------------===//
#include "runtime/cpu/Blas.h"
#include "runtime/cpu/Gemm.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>
#include <vector>

namespace {

using namespace kiln::cpu;

TEST(ConcurrentGemm, SameBitsAsAloneWhateverRunsBeside) {
  ASSERT_TRUE(blas()) << "no BLAS";
  // Shapes the GPT uses: one split by rows, one by columns, one batched.
  std::vector<MatmulShape> shapes(3);
  shapes[0].m = 768, shapes[0].n = 384, shapes[0].k = 128;
  shapes[1].m = 64, shapes[1].n = 512, shapes[1].k = 768, shapes[1].transposeLhs = true;
  shapes[2].batch = 12, shapes[2].m = 64, shapes[2].n = 64, shapes[2].k = 128;
  shapes[2].lhsBatched = shapes[2].rhsBatched = true;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1, 1);
  struct Case {
    MatmulShape s;
    std::vector<float> a, b, alone;
  };
  std::vector<Case> cases;
  for (const MatmulShape &s : shapes) {
    Case c{s, {}, {}, {}};
    c.a.resize(size_t(s.batch * s.m * s.k));
    c.b.resize(size_t(s.batch * s.k * s.n));
    for (float &x : c.a)
      x = u(rng);
    for (float &x : c.b)
      x = u(rng);
    c.alone.resize(size_t(s.batch * s.m * s.n));
    int64_t parts = gemmParts(s);
    for (int64_t p = 0; p < parts; ++p)
      matmulPart(s, c.a.data(), c.b.data(), c.alone.data(), p, parts);
    cases.push_back(std::move(c));
  }
  // Four threads, each computing every product's parts in its own order,
  // all at once, several times.
  for (int round = 0; round < 5; ++round) {
    std::vector<std::vector<std::vector<float>>> out(4);
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t)
      ts.emplace_back([&, t] {
        for (size_t i = 0; i < cases.size(); ++i) {
          const Case &c = cases[(i + size_t(t)) % cases.size()];
          std::vector<float> o(c.alone.size(), 0.0f);
          int64_t parts = gemmParts(c.s);
          for (int64_t q = 0; q < parts; ++q) {
            int64_t p = (q + t) % parts; // another order of parts per thread
            matmulPart(c.s, c.a.data(), c.b.data(), o.data(), p, parts);
          }
          out[size_t(t)].push_back(std::move(o));
        }
      });
    for (std::thread &x : ts)
      x.join();
    for (int t = 0; t < 4; ++t)
      for (size_t i = 0; i < cases.size(); ++i) {
        const Case &c = cases[(i + size_t(t)) % cases.size()];
        ASSERT_EQ(std::memcmp(out[size_t(t)][i].data(), c.alone.data(),
                              c.alone.size() * sizeof(float)),
                  0)
            << "product " << (i + size_t(t)) % cases.size() << " on thread " << t;
      }
  }
}

} // namespace
