// The time TokenFile::open takes on a large token file (with the vocabulary
// check), to compare the memory-mapped loader with main's read-and-decode
// one: bench/input/run.sh builds this file against both trees' libraries.
//   open_time FILE.bin VOCAB [REPEATS]
#include "runtime/core/Data.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>

int main(int argc, char **argv) {
  if (argc < 3)
    return 1;
  int repeats = argc > 3 ? std::atoi(argv[3]) : 3;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    auto f = kiln::data::TokenFile::open(
        argv[1], kiln::data::TokenFile::Width::U16, 64, std::atoll(argv[2]));
    double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    if (!f) {
      std::fprintf(stderr, "%s\n", f.status().message().c_str());
      return 1;
    }
    std::printf("  open %lld tokens: %.3f s\n", (long long)f->size(), s);
  }
  return 0;
}
