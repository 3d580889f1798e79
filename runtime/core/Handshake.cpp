//===- Handshake.cpp - Ranks agree on the program before they run it
//-------===//
#include "runtime/core/Handshake.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace kiln {

namespace {

uint64_t fnv1a(const void *bytes, size_t size) {
  const auto *b = static_cast<const unsigned char *>(bytes);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < size; ++i) {
    h ^= b[i];
    h *= 1099511628211ull;
  }
  return h;
}

/// What each rank contributes: the hash's first 64 characters (zero
/// padded), then the mesh's device count, the number of collectives and
/// their digest.
constexpr int kHashWords = 8;
constexpr int kWords = kHashWords + 3;
/// On a sequence mismatch: the collectives compared one by one, and the
/// length of the description exchanged for the first difference.
constexpr int64_t kFirst = 256;
constexpr int kTextWords = 24;

std::string hashText(const int64_t *words) {
  char text[kHashWords * 8 + 1] = {};
  std::memcpy(text, words, kHashWords * 8);
  return text;
}

std::string rankList(const std::vector<int> &ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i)
    s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

} // namespace

std::vector<std::string> collectiveLines(const program::Program &p) {
  std::vector<std::string> out;
  for (const program::Function &f : p.functions)
    for (size_t i = 0; i < f.steps.size(); ++i) {
      const program::Step &s = f.steps[i];
      if (s.kind != program::Step::Collective)
        continue;
      const program::Collective &c = s.collective;
      std::string where = c.axis.empty() ? "group=" : "axis=" + c.axis;
      for (size_t g = 0; c.axis.empty() && g < c.group.size(); ++g)
        where += (g ? "," : "") + std::to_string(c.group[g]);
      out.push_back(fmt::format(
          "@{} {}: {} {} {} {} {} bytes peer={} send={} recv={} queue={}",
          f.name, i, program::collectiveOpName(c.op), where,
          program::dtypeName(c.dtype), program::reductionName(c.reduction),
          c.bytes, c.peer, c.sendOffset, c.recvOffset, s.queue));
      if (s.stage >= 0) // a pipeline stage's devices alone make it
        out.back() += fmt::format(" stage={}", s.stage);
    }
  return out;
}

std::string collectiveSequence(const program::Program &p) {
  std::string out;
  for (const std::string &line : collectiveLines(p))
    out += line + "\n";
  return out;
}

uint64_t collectiveDigest(const program::Program &p) {
  std::string s = collectiveSequence(p);
  return fnv1a(s.data(), s.size());
}

int64_t collectiveCount(const program::Program &p) {
  int64_t n = 0;
  for (const program::Function &f : p.functions)
    for (const program::Step &s : f.steps)
      n += s.kind == program::Step::Collective;
  return n;
}

std::string contentHash(const void *bytes, size_t size) {
  return fmt::format("{:016x}", fnv1a(bytes, size));
}

Status checkSameProgram(comm::Communicator &comm, const program::Program &p,
                        const std::string &artifactHash) {
  int64_t mine[kWords] = {};
  std::memcpy(mine, artifactHash.data(),
              std::min<size_t>(artifactHash.size(), kHashWords * 8));
  mine[kHashWords] = p.numDevices();
  mine[kHashWords + 1] = collectiveCount(p);
  mine[kHashWords + 2] = int64_t(collectiveDigest(p));
  int n = comm.size();
  std::vector<int64_t> all(size_t(n) * kWords);
  comm.setContext("start-up handshake");
  if (Status s = comm.allGather(mine, all.data(), kWords, ElementType::I64); !s)
    return Status::error(
        fmt::format("rank {}: the start-up handshake (an all_gather of the "
                    "artifact hash and collective sequence) failed: {}",
                    comm.rank(), s.message()),
        s.kind());
  const int64_t *first = all.data();
  std::vector<int> hashes, meshes, sequences;
  for (int r = 1; r < n; ++r) {
    const int64_t *w = all.data() + size_t(r) * kWords;
    if (std::memcmp(w, first, kHashWords * 8) != 0)
      hashes.push_back(r);
    else if (w[kHashWords] != first[kHashWords])
      meshes.push_back(r);
    else if (w[kHashWords + 1] != first[kHashWords + 1] ||
             w[kHashWords + 2] != first[kHashWords + 2])
      sequences.push_back(r);
  }
  const char *todo =
      "every rank must load the same artifact: recompile with the same kilnc "
      "and model file, and give every rank that one .kpack";
  if (!hashes.empty()) {
    const int64_t *w = all.data() + size_t(hashes[0]) * kWords;
    return Status::error(
        fmt::format("rank {}: {} loaded a different artifact than rank 0 (hash "
                    "{} on rank {}, {} on rank "
                    "0); {}",
                    comm.rank(), rankList(hashes), hashText(w), hashes[0],
                    hashText(first), todo));
  }
  if (!meshes.empty()) {
    const int64_t *w = all.data() + size_t(meshes[0]) * kWords;
    return Status::error(fmt::format("rank {}: {} runs a program over a mesh "
                                     "of {} devices, rank 0 over {}; {}",
                                     comm.rank(), rankList(meshes),
                                     w[kHashWords], first[kHashWords], todo));
  }
  if (!sequences.empty()) {
    // Every rank saw the same words, so every rank takes these two extra
    // rounds: the first collective where the first differing rank departs
    // from rank 0, then both ranks' descriptions of it.
    int other = sequences[0];
    std::vector<std::string> lines = collectiveLines(p);
    std::vector<int64_t> hashes(kFirst, 0), allHashes(size_t(n) * kFirst);
    for (size_t i = 0; i < lines.size() && i < size_t(kFirst); ++i)
      hashes[i] = int64_t(fnv1a(lines[i].data(), lines[i].size()));
    if (Status s = comm.allGather(hashes.data(), allHashes.data(), kFirst,
                                  ElementType::I64);
        !s)
      return Status::error(
          fmt::format("rank {}: the start-up handshake failed: {}", comm.rank(),
                      s.message()),
          s.kind());
    int64_t at = 0;
    while (at < kFirst && allHashes[size_t(at)] ==
                              allHashes[size_t(other) * kFirst + size_t(at)])
      ++at;
    int64_t text[kTextWords] = {};
    std::string mineText =
        at < int64_t(lines.size()) ? lines[size_t(at)] : "no such collective";
    std::memcpy(text, mineText.data(),
                std::min<size_t>(mineText.size(), kTextWords * 8 - 1));
    std::vector<int64_t> allText(size_t(n) * kTextWords);
    if (Status s =
            comm.allGather(text, allText.data(), kTextWords, ElementType::I64);
        !s)
      return Status::error(
          fmt::format("rank {}: the start-up handshake failed: {}", comm.rank(),
                      s.message()),
          s.kind());
    auto textOf = [&](int r) {
      char buf[kTextWords * 8 + 1] = {};
      std::memcpy(buf, allText.data() + size_t(r) * kTextWords, kTextWords * 8);
      return std::string(buf);
    };
    const int64_t *w = all.data() + size_t(other) * kWords;
    return Status::error(
        fmt::format("rank {}: the compiled collective sequence of {} differs "
                    "from rank 0's ({} collectives, "
                    "digest {:016x} on rank {}; {} collectives, digest {:016x} "
                    "on rank 0), so the ranks "
                    "would wait for different collectives; the first "
                    "difference is collective {}: rank 0 "
                    "runs '{}', rank {} '{}'; {}",
                    comm.rank(), rankList(sequences), w[kHashWords + 1],
                    uint64_t(w[kHashWords + 2]), other, first[kHashWords + 1],
                    uint64_t(first[kHashWords + 2]), at, textOf(0), other,
                    textOf(other), todo));
  }
  if (n != p.numDevices())
    return Status::error(fmt::format(
        "rank {}: the program was compiled for a mesh of {} devices but the "
        "run has {} "
        "ranks; launch {} ranks, or recompile the model for {} devices",
        comm.rank(), p.numDevices(), n, p.numDevices(), n));
  return Status::ok();
}

} // namespace kiln
