//===- TrainFixtures.h - Shared fixtures of the trainer's tests -*- C++ -*-===//
//
// Test fixtures: a fresh folder per test, and random .npy files for every
// data input of a model's @train_step, so a test can train a real artifact.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_TEST_UNIT_TRAIN_TRAINFIXTURES_H
#define KILN_TEST_UNIT_TRAIN_TRAINFIXTURES_H

#include "runtime/core/Data.h"
#include "runtime/core/Random.h"
#include "runtime/train/Model.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace kiln::train::fixtures {

/// An empty folder for the running test: the test temp dir, `prefix`, and
/// the test's name ("kiln-dist-" + "ShardsJoin"); emptied first.
inline std::string freshDir(const std::string &prefix) {
  std::string d = ::testing::TempDir() + prefix +
                  ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::string cmd = "rm -rf '" + d + "' && mkdir -p '" + d + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  return d;
}

/// DIR/<input>.npy for every data input of @train_step: 512 rows of floats
/// in [-1, 1), or of integers below the number of classes.
inline void writeData(const Model &m, const std::string &dir) {
  int64_t classes = m.vocabSize();
  for (int id : m.dataInputs("train_step")) {
    const program::Buffer &b = m.prog().buffers[size_t(id)];
    data::NpyArray a;
    a.shape = b.shape;
    a.shape[0] = 512;
    int64_t n = 1;
    for (int64_t d : a.shape)
      n *= d;
    bool isFloat = b.dtype == program::DType::F32;
    a.descr = isFloat ? "<f4" : "<i8";
    for (int64_t i = 0; i < n; ++i) {
      uint64_t r = random::bits(11, uint64_t(id), uint64_t(i));
      if (isFloat)
        a.f.push_back(random::uniform(11, uint64_t(id), uint64_t(i)) * 2 - 1);
      else
        a.i.push_back(int64_t(r % uint64_t(classes)));
    }
    ASSERT_TRUE(data::writeNpy(dir + "/" + b.name + ".npy", a));
  }
}

} // namespace kiln::train::fixtures

#endif // KILN_TEST_UNIT_TRAIN_TRAINFIXTURES_H
