//===- FuzzData.cpp - libFuzzer target: token files and .npy arrays --------===//
//
// The loaders `kiln-run train --data` uses for user data. The first input
// byte chooses the reader, the rest is the file:
//   0: a .npy array (readNpy);
//   1: a uint16 token file, 2: a uint32 token file (TokenFile::open with a
//      context of 8 and a vocabulary of 65, then windows are drawn from it).
// Each must return data or an error that names the file; data it accepts
// must be consistent (an array's elements match its shape; tokens are below
// the vocabulary in every window drawn). Seeds: test/fuzz/run.sh.
//
//===----------------------------------------------------------------------===//
#include "runtime/core/Data.h"
#include "test/fuzz/MemFile.h"

#include <cstdio>
#include <cstdlib>

using namespace kiln;
using namespace kiln::data;

namespace {
[[noreturn]] void bug(const char *what, const std::string &detail) {
  std::fprintf(stderr, "kiln data loader bug: %s\n%s\n", what, detail.c_str());
  std::abort();
}
} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0)
    return 0;
  static fuzz::MemFile file;
  int mode = data[0] % 3;
  const std::string &path = file.set(data + 1, size - 1);
  if (mode == 0) {
    Expected<NpyArray> a = readNpy(path);
    if (!a) {
      if (a.status().message().find(path) == std::string::npos)
        bug("an error that does not name the file", a.status().message());
      return 0;
    }
    int64_t stored = a->isFloat() ? int64_t(a->f.size()) : int64_t(a->i.size());
    if (stored != a->numel())
      bug("an array whose elements do not match its shape", a->descr);
    return 0;
  }
  constexpr int64_t kContext = 8, kVocab = 65;
  auto width = mode == 1 ? TokenFile::Width::U16 : TokenFile::Width::U32;
  Expected<TokenFile> t = TokenFile::open(path, width, kContext, kVocab);
  if (!t) {
    if (t.status().message().find(path) == std::string::npos)
      bug("an error that does not name the file", t.status().message());
    return 0;
  }
  std::vector<int32_t> x, y;
  t->sampleWindows(/*seed=*/size, /*step=*/data[0], /*batch=*/3, kContext, x, y);
  for (size_t i = 0; i < x.size(); ++i)
    if (x[i] < 0 || x[i] >= kVocab || y[i] < 0 || y[i] >= kVocab)
      bug("a window with a token outside the vocabulary", std::to_string(x[i]));
  return 0;
}
