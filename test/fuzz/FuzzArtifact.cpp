//===- FuzzArtifact.cpp - libFuzzer target: the .kpack loader --------------===//
//
// Package::open on the input as a file: the container (header, section
// table, CRCs), then every section's content (manifest JSON, plan, CUDA
// launch plan, initializers). It must return a package or an
// error that names the file.
//
// Every section carries a CRC-32, so plain byte mutations almost never get
// past the container. A custom mutator therefore also mutates one section
// of a well-formed artifact and re-serializes it with fresh CRCs: those
// inputs reach the section parsers, which are what a damaged or hand-made
// artifact really exercises. Seeds: artifacts of the examples
// (test/fuzz/run.sh).
//
//===----------------------------------------------------------------------===//
#include "runtime/core/Artifact.h"
#include "runtime/core/Package.h"
#include "test/fuzz/MemFile.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

using namespace kiln;

extern "C" size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t maxSize);

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t maxSize,
                                          unsigned int seed) {
  Expected<artifact::Artifact> a =
      artifact::Artifact::parse(std::string(reinterpret_cast<char *>(data), size), "seed");
  // Half of the time (and whenever the input is not a valid container),
  // mutate the raw bytes.
  if (!a || a->sections().empty() || seed % 2 == 0)
    return LLVMFuzzerMutate(data, size, maxSize);
  std::vector<artifact::Section> sections = a->sections();
  artifact::Section &s = sections[(seed / 2) % sections.size()];
  // Room for the section to grow by up to 1 KiB (bounded by maxSize below).
  std::string bytes = s.bytes;
  size_t room = bytes.size() + 1024;
  bytes.resize(room);
  size_t n = LLVMFuzzerMutate(reinterpret_cast<uint8_t *>(bytes.data()), s.bytes.size(), room);
  bytes.resize(n);
  s.bytes = std::move(bytes);
  Expected<std::string> image = artifact::serialize(sections);
  if (!image || image->size() > maxSize)
    return LLVMFuzzerMutate(data, size, maxSize);
  std::memcpy(data, image->data(), image->size());
  return image->size();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static fuzz::MemFile file;
  const std::string &path = file.set(data, size);
  Expected<Package> p = Package::open(path);
  if (!p && p.status().message().find(path) == std::string::npos) {
    std::fprintf(stderr, "kiln artifact loader bug: an error that does not name the file\n%s\n",
                 p.status().message().c_str());
    std::abort();
  }
  return 0;
}
