//===- FuzzCheckpoint.cpp - libFuzzer target: the checkpoint loader --------===//
//
// ckpt::read on the input as a file (what `kiln-run train --resume` and
// `kiln-run inspect` call). It must return a checkpoint or an error that
// names the file; a checkpoint it accepts must be self-consistent (every
// tensor's bytes match its dtype and shape) and survive a serialize/parse
// round trip unchanged. Seeds: checkpoints of the examples (test/fuzz/run.sh).
//
//===----------------------------------------------------------------------===//
#include "runtime/core/Checkpoint.h"
#include "test/fuzz/MemFile.h"

#include <cstdio>
#include <cstdlib>

using namespace kiln;

namespace {
[[noreturn]] void bug(const char *what, const std::string &detail) {
  std::fprintf(stderr, "kiln checkpoint loader bug: %s\n%s\n", what, detail.c_str());
  std::abort();
}
} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static fuzz::MemFile file;
  const std::string &path = file.set(data, size);
  Expected<ckpt::Checkpoint> c = ckpt::read(path);
  if (!c) {
    if (c.status().message().find(path) == std::string::npos)
      bug("an error that does not name the file", c.status().message());
    return 0;
  }
  for (const ckpt::Tensor &t : c->tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape)
      n *= d;
    if (int64_t(t.bytes.size()) != n * ckpt::dtypeWidth(t.dtype))
      bug("an accepted tensor whose bytes do not match its shape", t.name);
  }
  Expected<std::string> image = ckpt::serialize(*c);
  if (!image)
    bug("an accepted checkpoint that does not serialize", image.status().message());
  Expected<ckpt::Checkpoint> again = ckpt::parse(*image, "round trip");
  if (!again)
    bug("a serialized checkpoint that does not parse", again.status().message());
  if (again->tensors.size() != c->tensors.size())
    bug("a round trip that lost tensors", "");
  for (size_t i = 0; i < c->tensors.size(); ++i)
    if (again->tensors[i].name != c->tensors[i].name ||
        again->tensors[i].bytes != c->tensors[i].bytes)
      bug("a round trip that changed a tensor", c->tensors[i].name);
  return 0;
}
